"""ResNet-v2 from scratch or from pretrained weights (model.pretrained): a weights file is loaded into the backbone,
grayscale is repeated to the weights' three channels, and ImageNet weights that cannot be downloaded are one line."""
import re
import shutil
import time
import warnings

import keras
import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.conftest import compose, run_cli
from tests.refusals import assert_config_error, assert_names, raises_naming
from tf_harness.data import chest_xray, imagenet_det
from tf_harness.data.errors import ConfigError
from tf_harness.data.preprocessing import Preprocessing
from tf_harness.experiments.config import schema
from tf_harness.models import BUILDERS, resnet_v2

SIZE = (32, 32)  # the smallest keras.applications allows with pretrained weights


def _config(pretrained=None):
    return OmegaConf.create({"name": "resnet_v2_50", "inputs": "single", "batch_norm_momentum": 0.9,
                             "pretrained": pretrained})


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    """A ResNet-v2-50 backbone's weights, written as keras.applications builds it (3 channels, no top), and its
    values by variable name."""
    keras.utils.set_random_seed(1)
    backbone = keras.applications.ResNet50V2(include_top=False, weights=None, input_shape=(*SIZE, 3), pooling="avg")
    path = tmp_path_factory.mktemp("weights") / "backbone.weights.h5"
    backbone.save_weights(str(path))
    return path, {variable.path: variable.numpy() for variable in backbone.variables}


def _backbone(model):
    return next(layer for layer in model.layers if isinstance(layer, keras.Model))


@pytest.mark.parametrize("spec", [chest_xray.SPEC, imagenet_det.SPEC], ids=["grayscale", "rgb"])
def test_a_weights_file_is_loaded_into_the_backbone(weights_file, spec):
    path, saved = weights_file
    keras.utils.set_random_seed(2)  # other initial values than the file's
    model = BUILDERS["resnet_v2_50"](_config(str(path)), spec, SIZE)
    assert model.input_shape == (None, *SIZE, spec.channels) and model.output_shape == (None, spec.num_outputs)
    # A grayscale image goes to the backbone as three equal channels; an RGB one as it is.
    assert ("gray_to_rgb" in [layer.name for layer in model.layers]) == (spec.channels == 1)
    loaded = {variable.path: variable.numpy() for variable in _backbone(model).variables}
    assert loaded.keys() == saved.keys()
    different = [name for name in saved if not np.array_equal(saved[name], loaded[name])]
    assert not different, different[:5]
    images = np.random.default_rng(0).uniform(-1, 1, (2, *SIZE, spec.channels)).astype("float32")
    assert model(images).shape == (2, spec.num_outputs)


def test_from_scratch_the_model_is_as_before(weights_file):
    model = BUILDERS["resnet_v2_50"](_config(None), chest_xray.SPEC, SIZE)
    assert model.input_shape == (None, *SIZE, 1) and not any(isinstance(layer, keras.Model) for layer in model.layers)
    assert model.get_layer("conv1_conv").kernel.shape == (7, 7, 1, 64)


def test_weights_for_other_channels_are_a_config_error(tmp_path):
    backbone = keras.applications.ResNet50V2(include_top=False, weights=None, input_shape=(*SIZE, 1), pooling="avg")
    backbone.save_weights(str(tmp_path / "gray.weights.h5"))
    assert resnet_v2.weights_channels(tmp_path / "gray.weights.h5") == 1
    with raises_naming(ConfigError, f"model.pretrained={tmp_path / 'gray.weights.h5'} ", "1-channel", "have 3"):
        resnet_v2.build(_config(str(tmp_path / "gray.weights.h5")), imagenet_det.SPEC, SIZE)


def test_unit_range_is_the_normalisation_the_weights_expect():
    """keras.applications.resnet_v2.preprocess_input scales to [-1, 1]: dataset.normalize=unit_range does the same."""
    images = np.arange(256, dtype="uint8").reshape(1, 16, 16, 1).repeat(3, axis=-1)
    ours = Preprocessing(augment=False, flip=False, normalize="unit_range", seed=0)(images, training=False)
    theirs = keras.applications.resnet_v2.preprocess_input(images.astype("float32"))
    np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-6)


def test_the_key_is_typed_and_a_missing_file_fails_before_tensorflow_starts(tmp_path):
    assert "model.pretrained" in schema.model_keys("resnet_v2_152") and \
        "model.pretrained" not in schema.model_keys("semi_alexnet")
    assert schema.first_problem(compose("dataset=chest_xray", "model.pretrained=imagenet"), {}) is None
    problem = schema.first_problem(compose("dataset=chest_xray", f"model.pretrained={tmp_path}/none.weights.h5"), {})
    assert_names(problem, f"model.pretrained={tmp_path}/none.weights.h5 ", "imagenet", ".h5 file", "null")


@pytest.mark.slow  # end-to-end runs
def test_imagenet_weights_that_cannot_be_downloaded_are_one_line_naming_the_file(tmp_path):
    # No network: a proxy that refuses, so the download fails at once whatever this machine can reach.
    unreachable = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": "",
                   "NO_PROXY": "", "KERAS_HOME": str(tmp_path / "keras")}
    started = time.monotonic()
    result = run_cli("dataset=chest_xray", "model=resnet_v2_50", "model.pretrained=imagenet", "pipeline.image_size=32",
                     "trainer.train_steps=1", f"hydra.run.dir={tmp_path / 'run'}", env=unreachable)
    cached = tmp_path / "keras" / "models" / "resnet50v2_weights_tf_dim_ordering_tf_kernels_notop.h5"
    line = assert_config_error(result, "model.pretrained=imagenet:", f"/{cached.name} ", f" {cached}", alone=False)
    assert re.search(rf"https://\S+/{cached.name} ", line), line
    assert time.monotonic() - started < 120


@pytest.fixture(scope="module")
def other_depth(tmp_path_factory):
    """A ResNet-v2-101 backbone's weights: another model's, for model=resnet_v2_50."""
    backbone = keras.applications.ResNet101V2(include_top=False, weights=None, input_shape=(*SIZE, 3), pooling="avg")
    path = tmp_path_factory.mktemp("weights") / "resnet101v2.weights.h5"
    backbone.save_weights(str(path))
    return path


def _with_nan(source, path):
    """A copy of the weights file `source` at `path` with one value NaN."""
    import h5py
    shutil.copy(source, path)
    with h5py.File(path, "r+") as file:
        datasets = []
        file.visititems(lambda name, item: datasets.append(item) if isinstance(item, h5py.Dataset) else None)
        values = datasets[0][...]
        values.flat[0] = np.nan
        datasets[0][...] = values
    return path


def test_weights_that_do_not_fit_are_one_line_naming_the_file_and_what_is_wrong(weights_file, other_depth, tmp_path):
    path, _ = weights_file
    cut = tmp_path / "cut.weights.h5"
    cut.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    text = tmp_path / "notes.h5"
    text.write_text("not weights")
    cases = [
        (other_depth, ("another model's weights", "/kernel", "model=resnet_v2_50")),
        (cut, ("cut short", f"{cut.stat().st_size} of its {path.stat().st_size} bytes")),
        (text, ("not an HDF5 file",)),
        (_with_nan(path, tmp_path / "nan.weights.h5"), ("NaN",)),
    ]
    for weights, named in cases:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with raises_naming(ConfigError, f"model.pretrained={weights} ", *named) as raised:
                resnet_v2.build(_config(str(weights)), imagenet_det.SPEC, SIZE)
        assert "\n" not in str(raised.value), raised.value
        # Keras warns once per layer it cannot load: none of it reaches the terminal.
        assert not [warning for warning in caught if "keras" in warning.filename], caught[0].message


@pytest.mark.slow  # end-to-end runs
def test_weights_of_another_depth_are_refused_before_the_run_writes_anything(other_depth, tmp_path):
    result = run_cli("dataset=chest_xray", "model=resnet_v2_50", f"model.pretrained={other_depth}",
                     "pipeline.image_size=32", "pipeline.batch_size=4", "trainer.train_steps=2",
                     f"hydra.run.dir={tmp_path / 'run'}")
    assert_config_error(result, f"model.pretrained={other_depth} ", "another model's weights", "model=resnet_v2_50",
                        alone=False)
    *before, _ = result.stderr.strip().splitlines()
    assert not [line for line in before if "keras" in line or "Warning" in line], before  # none of Keras's warnings
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a whole run: before, two steps were trained and then the run failed without naming the file
def test_weights_holding_nan_are_refused_before_training(weights_file, tmp_path):
    weights = _with_nan(weights_file[0], tmp_path / "nan.weights.h5")
    result = run_cli("dataset=chest_xray", "model=resnet_v2_50", f"model.pretrained={weights}",
                     "pipeline.image_size=32", "pipeline.batch_size=4", "trainer.train_steps=2",
                     f"hydra.run.dir={tmp_path / 'run'}")
    assert_config_error(result, f"model.pretrained={weights} ", "NaN", alone=False)
    assert not (tmp_path / "run").exists()
