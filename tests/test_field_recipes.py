"""The field's recipes: label smoothing, class-balanced loss, random resized crop, mixup, cutmix and heatmaps."""
import json

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from tf_harness.data import losses
from tf_harness.data.errors import DatasetError
from tf_harness.data.preprocessing import Preprocessing, random_resized_crop
from tf_harness.experiments.config import schema
from tf_harness.experiments.config.settings import Settings
from tf_harness.experiments.evaluation import heatmaps
from tf_harness.experiments.training import class_weights
from tests.conftest import compose, event_tags, run_cli, task_of
from tests.refusals import assert_config_error, raises_naming

STEP = tf.constant(7, tf.int64)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# Losses ---------------------------------------------------------------------------------------------------------
def test_label_smoothing_is_keras_categorical_cross_entropy_with_smoothing():
    logits = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 4, 0])
    ours = losses.per_example_loss("multiclass", tf.constant(labels), tf.constant(logits), label_smoothing=0.2)
    keras_loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.2, reduction=None)
    np.testing.assert_allclose(ours.numpy(), keras_loss(np.eye(5)[labels], logits), rtol=1e-5)
    plain = losses.per_example_loss("multiclass", tf.constant(labels), tf.constant(logits)).numpy()
    assert not np.allclose(ours.numpy(), plain)


def test_class_distributions_as_labels_give_the_loss_of_their_classes():
    logits = tf.constant(np.random.default_rng(1).normal(size=(4, 3)), tf.float32)
    labels = tf.constant([2, 0, 1, 1])
    dense = losses.per_example_loss("multiclass", tf.one_hot(labels, 3), logits)
    np.testing.assert_allclose(dense.numpy(), losses.per_example_loss("multiclass", labels, logits).numpy(),
                               rtol=1e-6)


def test_positive_weights_weigh_each_labels_positives():
    rng = np.random.default_rng(2)
    logits, labels = rng.normal(size=(8, 3)), rng.integers(0, 2, (8, 3))
    weights = [4.0, 1.0, 0.5]
    ours = losses.per_example_loss("multilabel", tf.constant(labels), tf.constant(logits, tf.float32),
                                   positive_weights=weights).numpy()
    p = _sigmoid(logits)
    expected = -(np.array(weights) * labels * np.log(p) + (1 - labels) * np.log(1 - p)).mean(axis=1)
    np.testing.assert_allclose(ours, expected, rtol=1e-5)


def test_balanced_weights_are_negatives_over_positives_and_one_where_undefined():
    labels = [[1, 0, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]]
    assert losses.balanced_positive_weights(labels) == [1.0, 3.0, 1.0]


def test_the_task_loss_takes_the_settings_label_smoothing():
    task = Settings.from_config(compose("dataset=imagenet_det", "trainer.label_smoothing=0.1")).task()
    assert task.label_smoothing == 0.1
    labels, logits = tf.constant([1, 2]), tf.constant([[5.0, 0, 0] + [0] * 198, [0, 0, 5.0] + [0] * 198])
    smoothed = task.loss(labels, logits, tf.ones([2]))
    task.label_smoothing = 0.0
    assert float(smoothed) > float(task.loss(labels, logits, tf.ones([2])))


# Class weights in the run directory -----------------------------------------------------------------------------
def test_class_weights_are_written_once_and_read_back_on_reentry(tmp_path):
    settings = Settings.from_config(compose("dataset=chest_xray", "trainer.class_weights=balanced"))
    task = settings.task()
    names = task.SPEC.class_names
    first = np.zeros((10, len(names)), int)
    first[:2, 0] = 1  # 2 positives, 8 negatives: 4
    class_weights.prepare(settings.trainer.class_weights, task, {"train": pd.DataFrame({"label": list(first)})}, tmp_path)
    saved = json.loads((tmp_path / class_weights.FILE).read_text())
    assert saved["positive_weights"][names[0]] == 4.0 and task.positive_weights[0] == 4.0
    again = settings.task()  # a resume whose training split changed: the saved weights hold
    class_weights.prepare(settings.trainer.class_weights, again, {"train": pd.DataFrame({"label": list(np.ones_like(first))})}, tmp_path)
    assert again.positive_weights == task.positive_weights
    (tmp_path / class_weights.FILE).write_text('{"positive_weights": {"Other": 1}}')
    with pytest.raises(DatasetError, match="class_weights.json"):
        class_weights.prepare(settings.trainer.class_weights, settings.task(), {}, tmp_path)


@pytest.mark.parametrize("weight", [-2.0, 0.0, "NaN", "Infinity"])
def test_a_class_weight_that_is_not_a_finite_positive_number_is_refused_naming_the_file(tmp_path, weight):
    """A negative weight in class_weights.json was used silently; a NaN one surfaced only as a non-finite loss."""
    settings = Settings.from_config(compose("dataset=chest_xray", "trainer.class_weights=balanced"))
    names = settings.task().SPEC.class_names
    weights = ", ".join(f'"{name}": {weight if i == 3 else 1.0}' for i, name in enumerate(names))
    (tmp_path / class_weights.FILE).write_text(f'{{"positive_weights": {{{weights}}}}}')
    with raises_naming(DatasetError, tmp_path / class_weights.FILE, names[3]):
        class_weights.prepare(settings.trainer.class_weights, settings.task(), {}, tmp_path)


def test_without_class_weights_nothing_is_written(tmp_path):
    settings = Settings.from_config(compose("dataset=chest_xray"))
    task = settings.task()
    class_weights.prepare(settings.trainer.class_weights, task, {}, tmp_path)
    assert task.positive_weights is None and not (tmp_path / class_weights.FILE).exists()


# The config check -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, named", [
    (("pipeline.mixup_alpha=-0.1",), "pipeline.mixup_alpha=-0.1"),
    (("pipeline.cutmix_alpha=-1",), "pipeline.cutmix_alpha=-1"),
    (("pipeline.random_resized_crop={scale:[0,1]}",), "pipeline.random_resized_crop="),
    (("pipeline.random_resized_crop={scale:[0.5,1.5]}",), "pipeline.random_resized_crop="),
    (("pipeline.random_resized_crop={scale:[0.6,0.5]}",), "pipeline.random_resized_crop="),
    (("pipeline.random_resized_crop={ratio:[2,1]}",), "pipeline.random_resized_crop="),
    (("pipeline.random_resized_crop={size:[2,1]}",), "pipeline.random_resized_crop="),
    (("pipeline.random_resized_crop={}",), "pipeline.random_resized_crop={}"),  # it turned the default crop on
    (("pipeline.random_resized_crop={scale:null}",), "pipeline.random_resized_crop="),
    (("trainer.label_smoothing=1",), "trainer.label_smoothing=1"),
    (("trainer.class_weights=inverse",), "trainer.class_weights=inverse"),
    (("dataset=imagenet_det", "trainer.class_weights=balanced"), "trainer.class_weights=balanced"),
    (("dataset=chest_xray", "trainer.label_smoothing=0.1"), "trainer.label_smoothing=0.1"),
    (("dataset=lfw_pairs", "trainer.label_smoothing=0.1"), "trainer.label_smoothing=0.1"),
    (("dataset=lfw_pairs", "pipeline.mixup_alpha=0.2"), "pipeline.mixup_alpha=0.2"),
    (("dataset=chest_xray", "pipeline.cutmix_alpha=1"), "pipeline.cutmix_alpha=1"),
    (("heatmaps=-1",), "heatmaps=-1"),
    (("heatmaps=4",), "heatmaps=4 is for mode=predict"),
    (("dataset=lfw_pairs", "mode=predict", "heatmaps=4"), "heatmaps=4 is for datasets of single images"),
])
def test_bad_recipe_values_are_refused_naming_the_key(overrides, named):
    problem = schema.first_problem(compose(*overrides), {})
    assert problem is not None and problem.startswith(named), problem


@pytest.mark.parametrize("overrides", [
    ("dataset=imagenet_det", "pipeline.mixup_alpha=0.2", "pipeline.cutmix_alpha=1.0", "trainer.label_smoothing=0.1",
     "pipeline.random_resized_crop={scale:[0.25,1]}"),
    ("dataset=chest_xray", "trainer.class_weights=balanced", "pipeline.random_resized_crop={ratio:[0.9,1.1]}"),
    ("dataset=lfw_pairs", "pipeline.random_resized_crop={ratio:null,scale:[0.5,1]}"),
    ("dataset=imagenet_det", "mode=predict", "heatmaps=8"),
])
def test_recipes_where_they_fit_pass_the_check(overrides):
    assert schema.first_problem(compose(*overrides), {}) is None


def test_a_bad_alpha_exits_2_in_one_line_before_tensorflow(tmp_path):
    result = run_cli("dataset=imagenet_det", "pipeline.mixup_alpha=-1", f"hydra.run.dir={tmp_path / 'run'}",
                     timeout=120)
    assert_config_error(result, "pipeline.mixup_alpha=-1")
    assert "tensorflow" not in result.stderr.lower()


# Random resized crop --------------------------------------------------------------------------------------------
def _ramp(batch=16, size=64):
    """Images whose pixel value is its column: a crop shows which columns it took."""
    return tf.tile(tf.range(size, dtype=tf.float32)[None, None, :, None], [batch, size, 1, 1])


def test_a_crop_of_the_whole_image_is_the_image():
    images = tf.random.stateless_uniform([4, 16, 16, 3], [1, 2], 0, 255)
    out = random_resized_crop(images, tf.constant([3, 4], tf.int64), scale=(1.0, 1.0), ratio=(1.0, 1.0))
    np.testing.assert_allclose(out.numpy(), images.numpy(), atol=1e-3)


def test_the_crop_takes_the_share_of_the_area_it_draws():
    out = random_resized_crop(_ramp(), tf.constant([5, 6], tf.int64), scale=(0.25, 0.25), ratio=(1.0, 1.0)).numpy()
    spans = out[:, 0, -1, 0] - out[:, 0, 0, 0]  # a quarter of the area, square: half the columns
    np.testing.assert_allclose(spans, 31, atol=0.6)
    lefts = out[:, 0, 0, 0]
    assert lefts.min() >= 0 and lefts.max() <= 32 and np.ptp(lefts) > 4  # placed at random


def test_the_crop_in_the_train_step_is_seeded_by_the_step_and_off_in_evaluation():
    images = tf.cast(_ramp(8), tf.uint8)
    preprocess = Preprocessing(False, False, "unit_range", 0, crop={"scale": [0.1, 0.5]})
    same = [preprocess(images, training=True, step=tf.constant(s, tf.int64)).numpy() for s in (3, 3, 4)]
    np.testing.assert_array_equal(same[0], same[1])
    assert not np.array_equal(same[0], same[2])
    plain = Preprocessing(False, False, "unit_range", 0)
    assert not np.allclose(same[0], plain(images, training=True, step=tf.constant(3, tf.int64)).numpy())
    np.testing.assert_array_equal(preprocess(images, training=False).numpy(), plain(images, training=False).numpy())


def test_flips_draw_the_same_with_the_crop_on_or_off():
    images = tf.cast(tf.ones([16, 8, 8, 3]) * _ramp(16, 8), tf.uint8)
    kwargs = dict(augment=True, flip=True, normalize="unit_range", seed=3)
    plain = Preprocessing(**kwargs)(images, training=True, step=STEP).numpy()
    cropped = Preprocessing(**kwargs, crop={"scale": [1, 1], "ratio": [1, 1]})(images, training=True, step=STEP)
    np.testing.assert_allclose(cropped.numpy(), plain, atol=1e-4)


# Mixup and cutmix -----------------------------------------------------------------------------------------------
def _mixed(**alphas):
    preprocess = Preprocessing(False, False, "unit_range", 0, classes=4, **alphas)
    features = tf.constant(np.random.default_rng(3).normal(size=(6, 8, 8, 1)), tf.float32)
    labels = tf.constant([0, 1, 2, 3, 0, 1])
    return features, labels, preprocess


def test_mixup_mixes_images_and_labels_by_the_same_share():
    features, labels, preprocess = _mixed(mixup_alpha=0.4)
    shares = []
    for step in range(12):
        images, targets = preprocess.mix(features, labels, tf.constant(step, tf.int64))
        share = float(targets[0, 0])  # example 0 (class 0) is mixed with example 5 (class 1)
        np.testing.assert_allclose(targets.numpy().sum(axis=1), 1, rtol=1e-6)
        np.testing.assert_allclose(images.numpy()[0], share * features[0] + (1 - share) * features[5], atol=1e-5)
        shares.append(share)
    assert np.ptp(shares) > 0.2  # a Beta draw per step
    np.testing.assert_array_equal(preprocess.mix(features, labels, STEP)[0], preprocess.mix(features, labels, STEP)[0])


def test_cutmix_pastes_a_box_and_weighs_the_labels_by_its_area():
    features, labels, preprocess = _mixed(cutmix_alpha=1.0)
    for step in range(8):
        images, targets = preprocess.mix(features, labels, tf.constant(step, tf.int64))
        pasted = np.isclose(images.numpy()[0], features.numpy()[5]) & ~np.isclose(images.numpy()[0], features[0])
        np.testing.assert_allclose(float(targets[0, 1]), pasted.mean(), atol=1e-6)


def test_without_alphas_the_batch_is_left_as_it_is():
    features, labels, preprocess = _mixed()
    images, same = preprocess.mix(features, labels, STEP)
    assert images is features and same is labels


# Heatmaps -------------------------------------------------------------------------------------------------------
def _spot_model():
    """A model whose class 0 is the mean brightness of a 1x1 conv's positive map, and class 1 its opposite."""
    images = keras.Input((8, 8, 1))
    maps = keras.layers.Conv2D(1, 1, use_bias=False, kernel_initializer="ones", name="conv")(images)
    maps = keras.layers.ReLU(name="relu")(maps)
    pooled = keras.layers.GlobalAveragePooling2D()(maps)
    logits = keras.layers.Dense(2, use_bias=False, name="logits")(pooled)
    model = keras.Model(images, logits)
    model.get_layer("logits").set_weights([np.array([[1.0, -1.0]], np.float32)])
    return model


def test_a_heatmap_peaks_where_the_class_evidence_is():
    image = np.zeros((1, 8, 8, 1), np.float32)
    image[0, 2, 5] = 1.0
    cam = heatmaps.LayerCam(_spot_model())
    assert cam.layer.name == "relu"
    hot = cam(image, [0])[0]
    assert hot.shape == (8, 8) and np.unravel_index(hot.argmax(), hot.shape) == (2, 5) and hot.max() == 1.0
    assert cam(image, [1])[0].max() == 0  # nothing raises class 1


def _strided(size):
    """Three stride-2 convolutions, a, b and c, on `size`-pixel images, then a pool and logits."""
    images = keras.Input((size, size, 1))
    x = images
    for name in "abc":
        x = keras.layers.Conv2D(2, 3, strides=2, padding="same", name=name)(x)
    return keras.Model(images, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(x)))


@pytest.mark.parametrize("size, layer", [(64, "b"), (32, "a"), (16, "a")])
def test_the_map_read_is_the_last_of_at_least_min_cells_across_else_the_finest(size, layer):
    """The last map of a ResNet at the chest default's 64 px is 2x2 cells: peaks on it fell on a finding's square
    no more often than chance."""
    assert heatmaps.MIN_CELLS == 16
    assert heatmaps.feature_layer(_strided(size)).name == layer


def test_each_position_is_weighed_by_its_own_gradient_not_the_maps_mean():
    """One map, read by a logit that rises with its left half and falls with its right: Grad-CAM's mean gradient
    (zero) left no heatmap at all; LayerCAM's per-position weights keep the left half."""
    images = keras.Input((16, 16, 1))
    maps = keras.layers.Conv2D(1, 1, use_bias=False, kernel_initializer="ones", name="maps")(images)
    weights = np.concatenate([np.ones((16, 8)), -np.ones((16, 8))], axis=1).reshape(1, 16 * 16).astype(np.float32)
    logits = keras.layers.Dense(1, use_bias=False, name="logits")(keras.layers.Flatten()(maps))
    model = keras.Model(images, logits)
    model.get_layer("logits").set_weights([weights.T])
    hot = heatmaps.LayerCam(model)(np.ones((1, 16, 16, 1), np.float32), [0])[0]
    assert hot[:, :8].min() == 1.0 and hot[:, 8:].max() == 0.0


def test_the_top_pairs_are_the_highest_scores_across_classes():
    predictions = pd.DataFrame({"path": ["a", "b", "c"], "x": [0.9, np.nan, 0.1], "y": [0.2, 0.95, 0.8]})
    assert heatmaps.top_pairs(predictions, ["x", "y"], 3) == [(1, 1), (0, 0), (2, 1)]


def test_an_overlay_is_rgb_of_the_image_size():
    out = heatmaps.overlay(np.zeros((6, 5, 1), np.uint8), np.ones((6, 5)))
    assert out.shape == (6, 5, 3) and out.dtype == np.uint8 and out[..., 2].max() < out[..., 0].max()


# End to end -----------------------------------------------------------------------------------------------------
SMALL_ALEXNET = ("model.filters=[8,16,16,16,16]", "model.dense_units=32")


@pytest.mark.slow  # two runs: about 70 s on 2 busy cores
def test_predict_writes_heatmaps_and_evaluations_show_them(tmp_path):
    run = tmp_path / "run"
    common = ("dataset=imagenet_det", "experiment=smoke", "pipeline.image_size=48", *SMALL_ALEXNET,
              f"hydra.run.dir={run}")
    trained = run_cli(*common, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    accumulator, tags = event_tags(run / "validation")
    assert "heatmaps" in tags
    predicted = run_cli(*common, "mode=predict", "heatmaps=3", timeout=600)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    index = pd.read_csv(run / "heatmaps" / "index.csv")
    assert len(index) == 3 and all((run / "heatmaps" / name).is_file() for name in index.file)
    predictions = pd.read_csv(run / "predictions.csv")
    classes = list(task_of(compose("dataset=imagenet_det")).SPEC.class_names)
    assert index.score.min() >= np.sort(predictions[classes].to_numpy().ravel())[-3] - 1e-9


@pytest.mark.slow  # trains a small semi-AlexNet on the chest sample for 250 steps: about 90 s on 2 cores
def test_a_trained_models_heatmaps_fall_on_the_findings_patches(tmp_path):
    """The sample's finding k brightens one square of the image (data/samples/chest_xray.py); the heatmap's peak of
    a held-out image that has the finding lies on its square at least half the time, where a peak placed at random
    would 3.5% of the time."""
    from tf_harness.data.samples.chest_xray import _GRID, _PATCH, FINDINGS, SIZE

    run, size = tmp_path / "run", 128
    common = ("dataset=chest_xray", "model=semi_alexnet", "model.filters=[16,32,32,32,32]", "model.dense_units=64",
              f"pipeline.image_size={size}", "pipeline.cache=memory", "deterministic=true", f"hydra.run.dir={run}")
    trained = run_cli(*common, "trainer.train_steps=250", "trainer.eval_every=250", "trainer.checkpoint_every=250")
    assert trained.returncode == 0, trained.stderr[-3000:]
    predicted = run_cli(*common, "mode=predict", "heatmaps=30")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    index = pd.read_csv(run / "heatmaps" / "index.csv")
    labels = pd.read_csv(run / "predictions.csv").set_index("path")
    scale, side = size / SIZE, _PATCH * size / SIZE
    on_patch = []
    for row in index.itertuples():
        if labels.loc[row.path, f"label/{row[3]}"] != 1:  # row[3]: the class column
            continue
        top, left = (value * scale for value in _GRID[FINDINGS.index(row[3])])
        on_patch.append(top <= row.peak_row + 0.5 < top + side and left <= row.peak_column + 0.5 < left + side)
    chance = (side / size) ** 2  # a peak placed at random: 0.035
    assert len(on_patch) >= 10
    assert np.mean(on_patch) >= 0.5, (np.mean(on_patch), chance)


def test_the_mixing_share_is_beta_distributed():
    from scipy import stats
    from tf_harness.data.preprocessing import beta

    for alpha in (0.2, 1.0, 4.0):
        draws = beta(alpha, tf.constant([1, int(alpha * 10)], tf.int64), [4000]).numpy()
        assert stats.kstest(draws, stats.beta(alpha, alpha).cdf).statistic < 0.03, alpha


@pytest.mark.slow  # XLA compiles the Beta draw's bisection: about 25 s on 2 busy cores
def test_the_crop_and_the_mixing_compile_with_xla():
    """XLA compiles the train step by default on a GPU: the crop and the mixing are written in ops it has."""
    preprocess = Preprocessing(True, True, "unit_range", 0, crop={}, mixup_alpha=0.2, cutmix_alpha=1.0, classes=4)
    images, labels = tf.cast(_ramp(4, 16), tf.uint8), tf.constant([0, 1, 2, 3])

    def step(number):
        return preprocess.mix(preprocess(images, training=True, step=number), labels, number)

    compiled = tf.function(step, jit_compile=True)
    (images, targets), (again, _) = compiled(STEP), compiled(STEP)
    # XLA draws other random numbers than the uncompiled step from the same seeds, the same each time.
    np.testing.assert_array_equal(images.numpy(), again.numpy())
    np.testing.assert_allclose(targets.numpy().sum(axis=1), 1, rtol=1e-6)
    assert images.shape == (4, 16, 16, 1) and -1 <= images.numpy().min() < images.numpy().max() <= 1


def test_the_crop_samples_as_tensorflows_crop_and_resize():
    from tf_harness.data.preprocessing import crop_and_resize

    images = tf.constant(np.random.default_rng(4).uniform(0, 255, (6, 17, 23, 3)), tf.float32)
    corners = np.sort(np.random.default_rng(5).uniform(0, 1, (6, 2, 2)), axis=1)  # [image, low|high, y|x]
    boxes = tf.constant(corners.reshape(6, 4)[:, [0, 1, 2, 3]], tf.float32)
    expected = tf.image.crop_and_resize(images, boxes, tf.range(6), [17, 23])
    np.testing.assert_allclose(crop_and_resize(images, boxes).numpy(), expected.numpy(), atol=1e-3)


def test_an_evaluation_shows_the_first_validation_images_heatmaps(tmp_path):
    from types import SimpleNamespace

    from tf_harness.experiments.summaries import Summaries

    images = {f"{k}.png": np.full((8, 8, 1), 40 * k, np.uint8) for k in range(5)}
    task = SimpleNamespace(SPEC=SimpleNamespace(class_names=("bright", "dark")),
                           read_image=lambda path: tf.constant(images[path.numpy().decode()]))
    trainer = SimpleNamespace(model=_spot_model(), preprocess=Preprocessing(False, False, "unit_range", 0))
    shown = heatmaps.ValidationHeatmaps(task, trainer, pd.DataFrame({"path": list(images)}))
    summaries = Summaries(str(tmp_path), splits=("validation",))
    summaries.heatmaps(shown.overlays, step=3)
    summaries.close()
    accumulator, tags = event_tags(tmp_path / "validation")
    assert "heatmaps" in tags
    event, = accumulator.Tensors("heatmaps")
    assert event.step == 3 and len(event.tensor_proto.string_val) == 2 + heatmaps.SHOWN  # width, height, images


def test_an_image_that_does_not_decode_is_left_out_of_the_heatmaps(tmp_path):
    """An unverified run whose first validation images held a damaged file ended in a traceback at its first
    evaluation, the heatmaps reading it on the host; predict's heatmaps read their files again the same way."""
    from types import SimpleNamespace

    images = {f"{k}.png": np.full((8, 8, 1), 40 * k, np.uint8) for k in range(5)}

    def read_image(path):
        if path.numpy().decode() == "1.png":
            raise tf.errors.InvalidArgumentError(None, None, "Invalid PNG data, size 3000")
        return tf.constant(images[path.numpy().decode()])

    task = SimpleNamespace(SPEC=SimpleNamespace(class_names=("bright", "dark")), read_image=read_image)
    trainer = SimpleNamespace(model=_spot_model(), preprocess=Preprocessing(False, False, "unit_range", 0))
    overlays, shown = heatmaps.ValidationHeatmaps(task, trainer, pd.DataFrame({"path": list(images)})).overlays()
    assert len(overlays) == heatmaps.SHOWN - 1 and "1.png" not in shown and "2.png" in shown
    predictions = pd.DataFrame({"path": list(images), "bright": np.linspace(0.1, 0.5, 5),
                                "dark": np.linspace(0.9, 0.5, 5)})
    folder = heatmaps.write_top(task, trainer, predictions, 4, tmp_path)
    index = pd.read_csv(folder / heatmaps.INDEX)
    assert len(index) == 3 and "1.png" not in set(index.path)


def test_fewer_heatmaps_after_more_leave_the_folder_holding_what_its_index_lists(tmp_path):
    """heatmaps=3 after heatmaps=12 left the 12 old overlays beside an index of 3."""
    from types import SimpleNamespace

    images = {f"{k}.png": np.full((8, 8, 1), 20 * k, np.uint8) for k in range(6)}
    task = SimpleNamespace(SPEC=SimpleNamespace(class_names=("bright", "dark")),
                           read_image=lambda path: tf.constant(images[path.numpy().decode()]))
    trainer = SimpleNamespace(model=_spot_model(), preprocess=Preprocessing(False, False, "unit_range", 0))
    predictions = pd.DataFrame({"path": list(images), "bright": np.linspace(0.1, 0.6, 6),
                                "dark": np.linspace(0.9, 0.4, 6)})
    folder = heatmaps.write_top(task, trainer, predictions, 8, tmp_path)
    (folder / "mine.png").write_bytes(b"a user's own file")
    assert len(list(folder.glob("*.png"))) == 9
    heatmaps.write_top(task, trainer, predictions, 3, tmp_path)
    index = pd.read_csv(folder / heatmaps.INDEX)
    assert sorted(path.name for path in folder.glob("*.png")) == sorted([*index.file, "mine.png"])
    assert len(index) == 3


def test_a_backbone_nested_as_one_layer_has_no_heatmaps_and_says_so(tmp_path):
    from types import SimpleNamespace

    from tf_harness.data.errors import ConfigError

    inner = _spot_model()
    images = keras.Input((8, 8, 1))
    nested = keras.Model(images, inner(images))  # as a ResNet-v2 with model.pretrained holds its backbone
    with pytest.raises(ValueError, match="no layer with a spatial output"):
        heatmaps.LayerCam(nested)
    trainer = SimpleNamespace(model=nested, preprocess=Preprocessing(False, False, "unit_range", 0))
    task = SimpleNamespace(SPEC=SimpleNamespace(class_names=("bright", "dark")))
    assert heatmaps.ValidationHeatmaps(task, trainer, pd.DataFrame({"path": ["a.png"]})).overlays() is None
    predictions = pd.DataFrame({"path": ["a.png"], "bright": [0.9], "dark": [0.1]})
    with pytest.raises(ConfigError, match="heatmaps=1"):
        heatmaps.write_top(task, trainer, predictions, 1, tmp_path)
