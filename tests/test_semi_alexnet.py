"""The semi-AlexNet builds from its config, gives 201 float32 logits and can learn."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from omegaconf import OmegaConf

from tf_harness.data import imagenet_det
from tf_harness.models import BUILDERS, semi_alexnet
from tests.refusals import raises_naming

CONFIG = OmegaConf.create({"name": "semi_alexnet", "inputs": "single", "filters": [48, 128, 192, 192, 128],
                           "dense_units": 512, "dropout": 0.5})


def test_registered_and_matches_its_config_file():
    assert BUILDERS["semi_alexnet"] is semi_alexnet.build
    on_disk = OmegaConf.load("conf/model/semi_alexnet.yaml")
    assert on_disk.name == "semi_alexnet" and on_disk.inputs == "single"
    assert len(on_disk.filters) == 5


def test_default_image_size_gives_201_float32_logits():
    model = semi_alexnet.build(CONFIG, imagenet_det.SPEC, (415, 482))
    assert model.input_shape == (None, 415, 482, 3)
    assert model.output_shape == (None, 201)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert [layer.filters for layer in convs] == [48, 128, 192, 192, 128]
    assert [layer.kernel_size for layer in convs] == [(11, 11), (5, 5), (3, 3), (3, 3), (3, 3)]
    assert sum(isinstance(layer, keras.layers.Dense) for layer in model.layers) == 3
    assert sum(isinstance(layer, keras.layers.Dropout) for layer in model.layers) == 2
    # Small enough for a CPU: AlexNet itself has about 60 million parameters.
    assert model.count_params() < 3_000_000


def test_mixed_precision_keeps_the_logits_float32():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = semi_alexnet.build(CONFIG, imagenet_det.SPEC, (64, 80))
        logits = model(np.zeros((2, 64, 80, 3), np.float32), training=False)
        assert model.get_layer("conv1").compute_dtype == "float16"
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert logits.dtype == tf.float32 and logits.shape == (2, 201)


@pytest.mark.parametrize("image_size", [(32, 32), (415, 482)])
def test_any_image_size_builds(image_size):
    model = semi_alexnet.build(CONFIG, imagenet_det.SPEC, image_size)
    assert model(np.zeros((1, *image_size, 3), np.float32)).shape == (1, 201)


def test_wrong_number_of_widths_is_refused():
    with pytest.raises(ValueError, match="five|5"):
        semi_alexnet.build(OmegaConf.merge(CONFIG, {"filters": [8, 8]}), imagenet_det.SPEC, (64, 64))


def test_learns_colour_classes():
    """A few dozen steps separate three colours, the kind of signal the embedded sample carries."""
    keras.utils.set_random_seed(0)
    small = OmegaConf.merge(CONFIG, {"filters": [8, 16, 16, 16, 16], "dense_units": 32, "dropout": 0.0})
    model = semi_alexnet.build(small, imagenet_det.SPEC, (32, 32))
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 64)
    colours = np.eye(3, dtype=np.float32)[labels] * 2 - 1
    images = colours[:, None, None, :] + rng.normal(0, 0.3, (64, 32, 32, 3)).astype(np.float32)
    model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(images, labels, batch_size=16, epochs=10, verbose=0)
    assert history.history["accuracy"][-1] > 0.9


def test_a_model_too_large_for_memory_is_a_config_error_naming_its_keys(monkeypatch):
    """What TensorFlow refuses to allocate while building is one line, without its function-node and device names."""
    from tf_harness.data.errors import ConfigError
    from tf_harness.experiments.config.settings import Settings
    from tf_harness.experiments.training import trainer
    from tests.conftest import compose

    message = ("{{function_node __wrapped__StatelessRandomUniformV2_device_/job:localhost/replica:0/task:0/device:CPU:0}} "
               "OOM when allocating tensor with shape[4,1000000000000] and type float on "
               "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu [Op:StatelessRandomUniformV2]")

    def build(*args):
        raise tf.errors.ResourceExhaustedError(None, None, message)

    monkeypatch.setitem(BUILDERS._objects, "semi_alexnet", (BUILDERS.entries["semi_alexnet"].path, build))
    settings = Settings.from_config(compose("dataset=imagenet_det", "model.dense_units=1000000000000"))
    with raises_naming(ConfigError, "model=semi_alexnet", "model.filters=[48,128,192,192,128]",
                       "model.dense_units=1000000000000", "model.dropout=0.5", "pipeline.image_size=[415,482]",
                       "8x8x3", "out of memory", "shape[4,1000000000000]") as raised:
        trainer.build_model(settings, imagenet_det.SPEC, (8, 8))
    line = str(raised.value)
    assert not [noise for noise in ("\n", "function_node", "/job:", "allocator", "[Op:") if noise in line], line
