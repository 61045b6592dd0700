"""Review beyond scalars: training inputs, PR curves, a confusion matrix and a profiler trace, read back with
TensorBoard's own reader."""
import json

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.plugins.pr_curve import metadata as pr_metadata

from tf_harness.data.iterators import make_iterator
from tf_harness.data.spec import DatasetSpec
from tf_harness.experiments.config.settings import Settings
from tests.conftest import compose, event_tags, make_input, run_cli, tables_of, task_of

CHEST = DatasetSpec(name="chest_xray", task="multilabel", class_names=("Atelectasis", "Effusion", "Mass"), channels=1)
LFW = DatasetSpec(name="lfw_pairs", task="binary", class_names=("same",), channels=3, paired=True)
DET = DatasetSpec(name="imagenet_det", task="multiclass", class_names=("cat", "dog", "background"), channels=3)


def write(logdir, fn, *args):
    with tf.summary.create_file_writer(str(logdir)).as_default():
        fn(*args)
    return event_tags(logdir)


def image_sizes(accumulator, tag):
    """(width, height, count) of the last image summary under `tag`."""
    values = tf.make_ndarray(accumulator.Tensors(tag)[-1].tensor_proto)
    return int(values[0]), int(values[1]), len(values) - 2


def test_training_inputs_show_both_images_of_a_pair_side_by_side_with_their_labels(tmp_path):
    from tf_harness.experiments.evaluation import review
    pair = (tf.random.uniform([6, 16, 12, 3], -1, 1), tf.random.uniform([6, 16, 12, 3], -1, 1))
    accumulator, tags = write(tmp_path, review.write_inputs, pair, np.array([1, 0, 1, 1, 0, 0]), LFW, 3)
    assert "inputs" in tags
    assert image_sizes(accumulator, "inputs") == (24, 16, 4)  # 2 x 12 wide, the first 4 examples
    assert accumulator.Tensors("inputs")[-1].step == 3
    assert "1: same person; 2: different people" in accumulator.SummaryMetadata("inputs").summary_description


def test_training_inputs_come_augmented_and_normalised_from_the_first_batch_the_run_trains_on():
    from types import SimpleNamespace

    from tf_harness.experiments.runner import Controller
    cfg = compose("dataset=lfw_pairs", "experiment=smoke")
    preprocess = Settings.from_config(cfg).preprocessing()
    iterator = make_iterator(make_input(cfg, tables_of(cfg)["train"], training=True, split="train"))
    next(iterator)  # somewhere in the stream, as after a resume
    expected = make_iterator(make_input(cfg, tables_of(cfg)["train"], training=True, split="train"))
    next(expected)
    (expected_a, _), expected_labels, _ = next(expected)
    shown = []
    trainer = SimpleNamespace(preprocess=preprocess, first_update=lambda first, iterator: first)  # one batch an update
    run = SimpleNamespace(writes=True, trainer=trainer, task=task_of(cfg),
                          summaries=SimpleNamespace(inputs=lambda *args: shown.append(args)))
    controller = SimpleNamespace(run=run, _input_wait=lambda: {})
    trained = Controller._first_batch(controller, iterator, 0)
    ((features, labels, _, step),) = shown
    assert step == 0
    assert len(features) == 2 and features[0].shape == (4, 32, 32, 3) and features[0].dtype == tf.float32
    assert len(labels) == 4
    # unit_range, not uint8: what the model sees.
    assert -1.0 <= float(tf.reduce_min(features[0])) and float(tf.reduce_max(features[0])) <= 1.0
    # The batch shown is the one the first loop trains on, and the run's iterator moved past it alone.
    (images_a, _), trained_labels, _ = next(trained)
    assert next(trained, None) is None
    assert np.array_equal(trained_labels.numpy(), labels) and np.array_equal(labels, expected_labels.numpy())
    assert np.array_equal(images_a.numpy(), expected_a.numpy())
    assert np.array_equal(next(iterator)[1].numpy(), next(expected)[1].numpy())  # the stream goes on after it
    shown_again = preprocess((images_a, images_a), training=True, step=tf.constant(0, tf.int64))[0]
    assert np.allclose(shown_again.numpy(), features[0].numpy())
    # Another step draws another augmentation.
    other_step = preprocess((images_a, images_a), training=True, step=tf.constant(7, tf.int64))[0]
    assert not np.allclose(other_step.numpy(), features[0].numpy())
    # A process that writes no summaries (a multi_worker run's other workers) trains on the same one batch first.
    quiet = SimpleNamespace(run=SimpleNamespace(**{**vars(run), "writes": False}), _input_wait=lambda: {})
    assert len(list(Controller._first_batch(quiet, iterator, 0))) == 1 and len(shown) == 1


def pr_tags(tags, accumulator):
    return {tag for tag in tags
            if accumulator.SummaryMetadata(tag).plugin_data.plugin_name == pr_metadata.PLUGIN_NAME}


def test_chest_xray_evaluation_writes_a_pr_curve_per_finding(tmp_path):
    from tf_harness.experiments.evaluation import review
    labels = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]])
    scores = np.array([[0.9, 0.2, 0.6], [0.1, 0.7, 0.3], [0.8, 0.6, 0.2], [0.3, 0.1, 0.9]])
    accumulator, tags = write(tmp_path, review.write_evaluation, CHEST, labels, scores, 5)
    assert pr_tags(tags, accumulator) == {"pr/Atelectasis", "pr/Effusion", "pr/Mass"}
    curve = tf.make_ndarray(accumulator.Tensors("pr/Mass")[-1].tensor_proto)  # rows: TP, FP, TN, FN, P, R
    assert curve.shape == (6, review.PR_THRESHOLDS)
    assert curve[0, 0] == 2 and curve[1, 0] == 2  # at threshold 0: both positives and both negatives called
    assert accumulator.Tensors("pr/Mass")[-1].step == 5
    assert "confusion_matrix" not in tags


def test_lfw_evaluation_writes_pr_curves_for_same_and_different(tmp_path):
    from tf_harness.experiments.evaluation import review
    accumulator, tags = write(tmp_path, review.write_evaluation, LFW, np.array([1, 0, 1, 0]),
                              np.array([[0.9], [0.2], [0.4], [0.6]]), 2)
    assert pr_tags(tags, accumulator) == {"pr/same", "pr/different"}
    same = tf.make_ndarray(accumulator.Tensors("pr/same")[-1].tensor_proto)
    different = tf.make_ndarray(accumulator.Tensors("pr/different")[-1].tensor_proto)
    assert same[0, 50] == 1 and different[0, 50] == 1  # over 0.5: one true pair and one true non-pair


def test_imagenet_det_evaluation_writes_a_confusion_matrix_image(tmp_path):
    from tf_harness.experiments.evaluation import review
    labels = np.array([0, 1, 2, 1])
    right = np.eye(3)[labels]
    wrong = np.eye(3)[[1, 1, 0, 0]]
    accumulator, tags = write(tmp_path, review.write_evaluation, DET, labels, right, 1)
    assert "confusion_matrix" in tags and not pr_tags(tags, accumulator)
    width, height, count = image_sizes(accumulator, "confusion_matrix")
    assert count == 1 and width > 100 and height > 100
    assert not np.array_equal(review.confusion_image(DET.class_names, labels, right),
                              review.confusion_image(DET.class_names, labels, wrong))


def test_the_profiler_traces_its_steps_and_cuts_loops_at_them(tmp_path):
    from tf_harness.experiments.evaluation import review
    profiler = review.Profiler([2, 4], tmp_path / "train")
    assert [profiler.loop_length(step, 10) for step in (0, 1, 4)] == [2, 1, 10]
    step_fn = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, x)))
    for step in range(6):
        profiler.update(step)
        assert profiler.active == (2 <= step < 4)
        assert profiler.loop_length(step, 10) == (1 if profiler.active else 2 - step if step < 2 else 10)
        with profiler.step(step):
            step_fn(tf.ones([8, 8]))
    profiler.close()
    traces = list((tmp_path / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1
    # The marked steps are in the trace, by name and number, for the Profile tab's step-time breakdown.
    assert b"train" in traces[0].read_bytes() and b"step_num" in traces[0].read_bytes()
    nothing = review.Profiler(None, tmp_path / "none")
    nothing.update(0)
    assert not nothing.active and nothing.loop_length(0, 10) == 10


@pytest.mark.slow
def test_a_run_leaves_inputs_pr_curves_and_a_profile_for_tensorboard(tmp_path):
    result = run_cli("dataset=lfw_pairs", "experiment=smoke", "trainer.profile_steps=[1,3]",
                     f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    _, train = event_tags(tmp_path / "train")
    accumulator, validation = event_tags(tmp_path / "validation")
    assert "inputs" in train
    assert {"pr/same", "pr/different"} <= validation
    assert [event.step for event in accumulator.Tensors("pr/same")] == [2, 4]  # at each evaluation
    assert list((tmp_path / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert "Profiling global steps 1 to 3" in (tmp_path / "run.log").read_text()
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 4


@pytest.mark.slow
def test_an_imagenet_det_run_leaves_a_confusion_matrix_at_each_evaluation(tmp_path):
    result = run_cli("dataset=imagenet_det", "experiment=smoke", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    accumulator, validation = event_tags(tmp_path / "validation")
    assert [event.step for event in accumulator.Tensors("confusion_matrix")] == [2, 4]
    assert "inputs" in event_tags(tmp_path / "train")[1]


def test_profile_steps_may_change_when_a_run_directory_is_re_entered():
    from tf_harness.experiments.run_dir import reentry
    assert reentry._allowed("trainer.profile_steps", "train_and_evaluate")
    assert "profile_steps" in reentry.ALLOWED
