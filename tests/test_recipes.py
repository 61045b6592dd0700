"""The training recipes (docs/training-loop.md#training-recipes): the metrics history, gradient clipping, EMA
weights, gradient accumulation, the best checkpoint, early stopping and fine-tuning controls."""
import json
import logging

import numpy as np
import pytest
import tensorflow as tf

from tf_harness.data.iterators import make_iterator
from tf_harness.experiments.evaluation import metrics_history
from tests.conftest import run_cli
from tests.refusals import assert_names, raises_naming
from tests.test_training_loop import BATCH, make_trainer, pairs

# A tiny LFW run: 4 steps, evaluations at 2 and 4.
SMOKE = ("dataset=lfw_pairs", "experiment=smoke")


# The metrics history ----------------------------------------------------------------------------------------------

def test_the_history_appends_each_evaluation_and_skips_a_damaged_line(tmp_path, caplog):
    metrics_history.append(tmp_path, {"accuracy": 0.5, "global_step": 2, "loss": float("nan")}, now=lambda: 10.0)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"accuracy": 0.7, "glo')  # a line cut short by a kill
    metrics_history.append(tmp_path, {"accuracy": 0.75, "global_step": 4}, now=lambda: 20.0)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("[1, 2]\n\xff\n")
    with caplog.at_level(logging.WARNING):
        records = metrics_history.read(tmp_path)
    assert records == [{"accuracy": 0.5, "global_step": 2, "loss": None, "time": 10.0},
                       {"accuracy": 0.75, "global_step": 4, "time": 20.0}]
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "skipped 3 damaged line(s) (line 2, 4, 5)" in warning
    assert metrics_history.read(tmp_path / "none") == []


@pytest.mark.slow  # end-to-end runs
def test_every_evaluation_is_in_metrics_jsonl_and_a_re_entry_appends(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_cli(*SMOKE, f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = metrics_history.read(run_dir)
    assert [record["global_step"] for record in records] == [2, 4]
    assert all(isinstance(record["time"], float) for record in records) and records[0]["time"] <= records[1]["time"]
    last = json.loads((run_dir / "metrics.json").read_text())
    evaluation = {key: value for key, value in records[-1].items() if key != "time" and not key.startswith("train/")}
    assert evaluation == last  # metrics.json: the last evaluation; its line adds the train scalars of its step
    assert "train/loss" in records[-1]

    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"global_step": 4, "accur')  # a damaged last line: never fatal
    evaluated = run_cli(f"hydra.run.dir={run_dir}", "mode=evaluate")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert [record["global_step"] for record in metrics_history.read(run_dir)] == [2, 4, 4]


# Gradient clipping ------------------------------------------------------------------------------------------------

def trainable(trainer):
    return [v.numpy().copy() for v in trainer.model.trainable_variables]


def update_norm(trainer, steps=1):
    """The global norm of what `steps` train steps changed the trainable weights by."""
    before = trainable(trainer)
    loop = trainer.train_loop(make_iterator(pairs().repeat().batch(BATCH)), steps)
    change = [after - old for old, after in zip(before, trainable(trainer))]
    return float(np.sqrt(sum(np.sum(np.square(c.astype(np.float64))) for c in change))), loop


@pytest.mark.parametrize("limit", [None, 1e-3])
def test_clipping_scales_the_update_to_the_global_norm_and_logs_the_norm_before(limit):
    """Plain SGD: the update is the learning rate times the gradients, so its norm shows the clipped norm."""
    tf.keras.utils.set_random_seed(0)
    trainer = make_trainer("trainer.optimizer=sgd", "trainer.momentum=0", "trainer.learning_rate=0.5",
                           f"trainer.clip_global_norm={'null' if limit is None else limit}")
    moved, loop = update_norm(trainer)
    if limit is None:
        assert "gradient_norm" not in loop.sums  # not computed without clipping
        return
    assert loop.means["gradient_norm"] > 10 * limit  # the norm before clipping...
    np.testing.assert_allclose(moved / 0.5, limit, rtol=1e-3)  # ...and the update's, clipped


def test_under_float16_a_step_the_loss_scale_skips_leaves_its_infinite_gradient_norm_out_of_the_mean():
    """A step whose scaled float16 gradients overflow is skipped by the loss-scale optimizer, which lowers its
    scale; its gradient norm is infinite. The loop's means leave it out, and a window with such a step still shows
    the mean of the others: an infinite mean hid them."""
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        tf.keras.utils.set_random_seed(0)
        trainer = make_trainer("pipeline.dtype=float16", "trainer.clip_global_norm=1.0")
        batches = make_iterator(pairs().repeat().batch(BATCH))
        trainer.optimizer.dynamic_scale.assign(2.0 ** 100)  # any gradient overflows float16 at this scale
        overflowed = trainer.train_loop(batches, 1)
        trainer.optimizer.dynamic_scale.assign(1.0)
        normal = trainer.train_loop(batches, 2)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert {"loss", "gradient_norm"} <= overflowed.sums.keys() and overflowed.nonfinite == 0  # the loss was finite
    assert "gradient_norm" not in overflowed.means and np.isfinite(overflowed.loss)
    assert normal.counts["gradient_norm"] == 2 and np.isfinite(normal.means["gradient_norm"])
    window = type(normal).merge([overflowed, normal])
    assert window.means["gradient_norm"] == pytest.approx(normal.means["gradient_norm"])
    assert window.counts["loss"] == 3 and np.isfinite(window.loss)


@pytest.mark.slow  # end-to-end runs
def test_the_gradient_norm_is_a_train_scalar_with_clipping_only(tmp_path):
    from tests.conftest import event_tags

    clipped = run_cli(*SMOKE, "trainer.clip_global_norm=0.01", f"hydra.run.dir={tmp_path / 'clipped'}")
    assert clipped.returncode == 0, clipped.stderr[-3000:]
    accumulator, tags = event_tags(tmp_path / "clipped" / "train")
    assert "gradient_norm" in tags
    assert len(accumulator.Tensors("gradient_norm")) == 4  # every log_every=1 step


# EMA weights ------------------------------------------------------------------------------------------------------

def test_the_moving_average_follows_each_update_and_is_in_the_checkpoint(tmp_path):
    tf.keras.utils.set_random_seed(0)
    trainer = make_trainer("trainer.ema_decay=0.75")
    with trainer.averaged() as swapped:
        assert not swapped  # no update yet: no average to swap in
    batches = make_iterator(pairs().repeat().batch(BATCH))
    expected = None
    for _ in range(3):
        trainer.train_loop(batches, 1)
        weights = trainable(trainer)
        expected = weights if expected is None else [0.75 * a + 0.25 * w for a, w in zip(expected, weights)]
    with trainer.averaged() as swapped:
        assert swapped
        for average, variable in zip(expected, trainer.model.trainable_variables):
            np.testing.assert_allclose(variable.numpy(), average, rtol=1e-5, atol=1e-6)
    for before, after in zip(weights, trainable(trainer)):  # the trained weights back, bit for bit
        np.testing.assert_array_equal(before, after)

    path = trainer.checkpoint().save(str(tmp_path / "ckpt"))
    restored = make_trainer("trainer.ema_decay=0.75")
    restored.checkpoint().restore(path).assert_existing_objects_matched()
    with trainer.averaged(), restored.averaged():
        for mine, theirs in zip(trainer.model.trainable_variables, restored.model.trainable_variables):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_an_interrupted_evaluation_leaves_the_trained_weights_in_the_model():
    trainer = make_trainer("trainer.ema_decay=0.5")
    trainer.train_loop(make_iterator(pairs().repeat().batch(BATCH)), 1)
    trainer.train_loop(make_iterator(pairs(2.0).repeat().batch(BATCH)), 1)
    weights = trainable(trainer)
    with pytest.raises(KeyboardInterrupt):
        with trainer.averaged():
            assert not np.array_equal(trainable(trainer)[0], weights[0])
            raise KeyboardInterrupt
    for before, after in zip(weights, trainable(trainer)):
        np.testing.assert_array_equal(before, after)


def test_evaluation_scores_the_averaged_weights(tmp_path):
    from tf_harness.experiments.evaluator import Evaluator
    from tf_harness.experiments.summaries import Summaries
    from tests.conftest import compose, tables_of, task_of
    from tf_harness.data.input_fn import input_fn
    from tf_harness.experiments.config.settings import Settings

    trainer = make_trainer("trainer.ema_decay=0.5")
    cfg = compose("dataset=lfw_pairs", "pipeline.image_size=48", f"pipeline.batch_size={BATCH}", "trainer.eval_steps=1")
    task, tables, pipeline = task_of(cfg), tables_of(cfg), Settings.from_config(cfg).input_pipeline()
    trainer.train_loop(make_iterator(pairs().repeat().batch(BATCH)), 1)
    trainer.train_loop(make_iterator(pairs(2.0).repeat().batch(BATCH)), 1)
    optimizer = trainer.optimizer
    averages = [average.numpy() for average in optimizer._model_variables_moving_average]
    seen = []
    eval_step = trainer.eval_step

    def recording(*batch):
        seen.append([v.numpy().copy() for v in trainer.model.trainable_variables])
        return eval_step(*batch)

    trainer.eval_step = recording
    evaluator = Evaluator(task, trainer, tables, Summaries(str(tmp_path)), tmp_path, batch_size=BATCH, eval_steps=1,
                          seed=0, note_unreadable=lambda: None,
                          input_fn=lambda split, rows=None: input_fn(task, tables[split], pipeline, split=split,
                                                                     training=False, model_dir=tmp_path, rows=rows))
    evaluator.evaluate()
    assert seen and all(np.array_equal(a, b) for weights in seen for a, b in zip(weights, averages))
    assert not np.array_equal(trainable(trainer)[0], averages[0])  # swapped back


def test_a_warm_start_from_an_ema_run_takes_the_averaged_weights_and_says_so(tmp_path, caplog):
    from tf_harness.experiments.training import warm_start

    source = make_trainer("trainer.ema_decay=0.5")
    source.train_loop(make_iterator(pairs().repeat().batch(BATCH)), 1)
    source.train_loop(make_iterator(pairs(2.0).repeat().batch(BATCH)), 1)
    prefix = source.checkpoint().save(str(tmp_path / "ckpt"))
    warm = make_trainer()
    with caplog.at_level(logging.INFO):
        result = warm_start.restore(warm.model, prefix)
    trained = len(source.model.trainable_variables)
    assert result.averaged == trained
    with source.averaged():
        for theirs, mine in zip(source.model.variables, warm.model.variables):
            np.testing.assert_array_equal(theirs.numpy(), mine.numpy())  # averages, and the statistics as they are
    assert f"{trained} of them took their moving average" in caplog.text

    plain = make_trainer()  # a run without EMA: its weights, as before
    assert warm_start.restore(plain.model, make_trainer().checkpoint().save(str(tmp_path / "plain"))).averaged == 0


@pytest.mark.slow  # end-to-end runs
def test_an_export_of_an_ema_run_serves_the_averaged_weights(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_cli(*SMOKE, "trainer.ema_decay=0.5", "mode=train", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    exported = run_cli(f"hydra.run.dir={run_dir}", "mode=export")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "evaluation, prediction and export use the averaged weights" in (run_dir / "run.log").read_text()
    from tf_harness.experiments.training import warm_start

    prefix = str(run_dir / "checkpoints" / "ckpt-4")
    checkpoint, averages = tf.train.load_checkpoint(prefix), warm_start.stored_averages(prefix)
    served = tf.train.load_checkpoint(str(run_dir / "export" / "4" / "variables" / "variables"))
    served = [served.get_tensor(key) for key, dtype in served.get_variable_to_dtype_map().items() if dtype.is_floating]

    def found(key):
        array = checkpoint.get_tensor(key)
        return any(array.shape == other.shape and np.array_equal(array, other) for other in served)

    kernels = [entry for entry in warm_start.stored_variables(prefix) if entry.name.endswith("kernel")]
    assert kernels and len(averages) >= len(kernels)
    assert not any(found(entry.key) for entry in kernels)  # the trained kernels are not served...
    assert all(found(averages[entry.name.replace("/", "_")]) for entry in kernels)  # ...their averages are


# Gradient accumulation --------------------------------------------------------------------------------------------

def flat_pair_model(model_settings, spec, image_size):
    """A pair model without batch statistics: the faces flattened, a hidden layer, one logit."""
    import keras
    faces = [keras.Input((*image_size, 3)) for _ in range(2)]
    merged = keras.layers.Concatenate()([keras.layers.Flatten()(face) for face in faces])
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(merged)
    return keras.Model(faces, keras.layers.Dense(1, name="logits")(hidden))


def faces(count, weight=1.0):
    """`count` examples of distinct random faces, labels alternating, in a fixed order."""
    from tests.test_training_loop import SIZE

    def example(i):
        face = tf.cast(tf.random.stateless_uniform([2, SIZE, SIZE, 3], [7, i], maxval=255), tf.uint8)
        return (face[0], face[1]), tf.reshape(tf.cast(i % 2, tf.float32), [1]), tf.constant(weight)

    return tf.data.Dataset.range(count).map(example)


def flat_trainer(monkeypatch, *overrides):
    from tf_harness.experiments.training import trainer as trainer_module
    monkeypatch.setattr(trainer_module, "BUILDERS", {"siamese_cnn": flat_pair_model})
    tf.keras.utils.set_random_seed(0)
    return make_trainer("pipeline.augment=false", *overrides)


@pytest.mark.parametrize("loop", [(), ("trainer.steps_per_loop=4", "trainer.fetch_ahead=true")])
def test_accumulating_n_batches_trains_as_one_batch_n_times_larger(monkeypatch, loop):
    large = flat_trainer(monkeypatch, f"pipeline.batch_size={2 * BATCH}")
    accumulated = flat_trainer(monkeypatch, "trainer.accumulate_steps=2", *loop)
    assert accumulated.examples_per_step == large.examples_per_step == 2 * BATCH
    large_batches = make_iterator(faces(64).batch(2 * BATCH).repeat())
    small_batches = make_iterator(faces(64).batch(BATCH).repeat())
    for steps in (1, 2):
        wide, accumulating = large.train_loop(large_batches, steps), accumulated.train_loop(small_batches, steps)
        assert accumulating.steps == wide.steps == steps and accumulating.sums.keys() == wide.sums.keys()
        np.testing.assert_allclose(accumulating.loss, wide.loss, rtol=1e-5)
        np.testing.assert_allclose(accumulating.means["accuracy"], wide.means["accuracy"], rtol=1e-6)
    assert accumulated.step == large.step == 3  # the global step counts updates
    assert int(accumulated.optimizer.iterations.numpy()) == 3
    for mine, theirs in zip(trainable(accumulated), trainable(large)):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    # Six batches were taken, no more: the iterator stands at the seventh.
    np.testing.assert_array_equal(next(small_batches)[0][0], next(make_iterator(faces(64).batch(BATCH).skip(6)))[0][0])


def test_a_non_finite_batch_skips_its_whole_update(monkeypatch):
    trainer = make_trainer("trainer.accumulate_steps=2")  # batch norm: its statistics are kept too
    trainer.train_loop(make_iterator(pairs().repeat().batch(BATCH)), 1)
    before = [v.numpy().copy() for v in trainer.model.variables + trainer.optimizer.variables]
    one_bad = make_iterator(pairs().batch(BATCH).concatenate(pairs(float("nan")).batch(BATCH)).repeat())
    loop = trainer.train_loop(one_bad, 1)
    assert (loop.steps, loop.nonfinite, trainer.step) == (1, 1, 2)
    for old, new in zip(before, [v.numpy() for v in trainer.model.variables + trainer.optimizer.variables]):
        np.testing.assert_array_equal(old, new)


def test_accumulation_resumes_exactly_from_a_checkpoint(monkeypatch, tmp_path):
    def batches():
        return make_iterator(faces(64).batch(BATCH).repeat())

    straight = flat_trainer(monkeypatch, "trainer.accumulate_steps=3", "trainer.ema_decay=0.5")
    straight.train_loop(batches(), 3)
    first = flat_trainer(monkeypatch, "trainer.accumulate_steps=3", "trainer.ema_decay=0.5")
    iterator = batches()
    first.train_loop(iterator, 2)
    path = first.checkpoint(iterator).save(str(tmp_path / "ckpt"))
    resumed = flat_trainer(monkeypatch, "trainer.accumulate_steps=3", "trainer.ema_decay=0.5")
    iterator = batches()
    resumed.checkpoint(iterator).restore(path).assert_existing_objects_matched()
    resumed.train_loop(iterator, 1)
    for mine, theirs in zip(resumed.model.variables + resumed.optimizer.variables,
                            straight.model.variables + straight.optimizer.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


@pytest.mark.slow  # end-to-end runs
def test_accumulation_trains_under_several_replicas_and_counts_examples_per_update(tmp_path):
    result = run_cli(*SMOKE, "strategy=mirrored", "strategy.logical_cpus=2", "trainer.accumulate_steps=2",
                     "trainer.clip_global_norm=1.0", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [record["global_step"] for record in metrics_history.read(tmp_path)] == [2, 4]
    reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints" / "ckpt-4"))
    assert reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE") == 4


# The best checkpoint and early stopping ---------------------------------------------------------------------------

def recipes_of(tmp_path, *overrides, trainer=None):
    """A training run's Recipes over a RunDirectory in `tmp_path`, with the tiny trainer of these tests."""
    from tf_harness.experiments.config.settings import Settings
    from tf_harness.experiments.run_dir.directory import RunDirectory
    from tf_harness.experiments.training import recipes
    from tests.conftest import compose
    from tests.test_training_loop import PAIRS, SIZE

    trainer = trainer or make_trainer(*overrides)
    settings = Settings.from_config(compose("dataset=lfw_pairs", f"pipeline.image_size={SIZE}", *overrides))
    made = recipes.Recipes(settings.trainer, PAIRS, trainer, RunDirectory(tmp_path))
    made.resume(trainer.step)
    return made


def evaluate_at(made, tmp_path, step, accuracy):
    """An evaluation of `accuracy` at `step`, as the Evaluator writes it and the Controller counts it."""
    from tf_harness.experiments.evaluation.metrics_history import write_metrics
    made.trainer.global_step.assign(step)
    values = {"accuracy": accuracy, "loss": 1.0 - accuracy}
    write_metrics(tmp_path, {**values, "global_step": step})
    made.evaluated(values, step)


def test_the_best_evaluation_is_kept_with_its_record_and_the_others_go(tmp_path):
    made = recipes_of(tmp_path, "trainer.keep_best=true")
    for step, accuracy in ((2, 0.5), (4, 0.75), (6, 0.75), (8, 0.6)):  # 0.75 again is no improvement
        evaluate_at(made, tmp_path, step, accuracy)
    record = json.loads((tmp_path / "best.json").read_text())
    assert record == {"metric": "accuracy", "mode": "max", "value": 0.75, "global_step": 4, "checkpoint": "best/ckpt-4"}
    assert sorted(path.name for path in (tmp_path / "best").iterdir()) == ["ckpt-4.data-00000-of-00001",
                                                                            "ckpt-4.index"]
    reader = tf.train.load_checkpoint(str(tmp_path / "best" / "ckpt-4"))
    assert reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE") == 4
    assert not made.stopped  # no patience: never stops


def test_the_best_eer_is_the_lowest_and_its_checkpoint_is_kept(tmp_path):
    """LFW's protocol metrics are declared with their direction: trainer.best_metric=eer keeps the lowest."""
    from tf_harness.experiments.evaluation.metrics_history import write_metrics
    made = recipes_of(tmp_path, "trainer.keep_best=true", "trainer.best_metric=eer")
    assert made.mode == "min"
    for step, eer in ((2, 0.4), (4, 0.25), (6, 0.3), (8, 0.25)):
        made.trainer.global_step.assign(step)
        write_metrics(tmp_path, {"eer": eer, "accuracy": 1 - eer, "global_step": step})
        made.evaluated({"eer": eer, "accuracy": 1 - eer, "loss": 1.0}, step)
    record = json.loads((tmp_path / "best.json").read_text())
    assert record == {"metric": "eer", "mode": "min", "value": 0.25, "global_step": 4, "checkpoint": "best/ckpt-4"}


@pytest.mark.parametrize("mode, min_delta, values, stop, best", [
    ("max", 0.0, (0.5, 0.7, 0.6, 0.7, 0.9), 8, (4, 0.7)),  # two in a row without beating 0.7
    ("max", 0.1, (0.5, 0.55, 0.58, 0.9, 0.9), 6, (2, 0.5)),  # 0.55 and 0.58 are within min_delta of 0.5
    ("min", 0.0, (0.5, 0.4, 0.3, 0.35, 0.31), 10, (6, 0.3)),
])
def test_early_stopping_counts_evaluations_without_an_improvement(tmp_path, caplog, mode, min_delta, values, stop,
                                                                  best):
    made = recipes_of(tmp_path, "trainer.early_stopping.patience=2", f"trainer.early_stopping.min_delta={min_delta}",
                      f"trainer.best_mode={mode}")
    steps = []
    with caplog.at_level(logging.INFO):
        for step, value in zip((2, 4, 6, 8, 10), values):
            evaluate_at(made, tmp_path, step, value)
            steps.append(step)
            if made.stopped:
                break
    assert steps[-1] == stop and made.stopped
    assert (made.best_step, made.best_value) == best
    (line,) = [record.getMessage() for record in caplog.records if "early" in record.getMessage()]
    assert line.startswith(f"Stopping early at global step {stop}: trainer.best_metric=accuracy has not improved")
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["stopped_early"] is True and metrics["best_global_step"] == best[0]
    assert not (tmp_path / "best").exists()  # keep_best off: no checkpoint, the record alone
    assert json.loads((tmp_path / "best.json").read_text())["checkpoint"] is None


def test_a_checkpoint_holds_the_evaluations_before_its_step_and_a_resume_counts_its_own(tmp_path):
    """The checkpoint of step 4 holds the state of the evaluations before step 4, whether it was saved before the
    evaluation of step 4 or after it; a run resumed there finds that evaluation in metrics.json and counts it,
    stopping where the unbroken run stopped, with the same state."""
    overrides = ("trainer.early_stopping.patience=1", "trainer.keep_best=true")
    made = recipes_of(tmp_path, *overrides)
    evaluate_at(made, tmp_path, 2, 0.8)
    made.trainer.train_loop(make_iterator(pairs().repeat().batch(BATCH)), 2)  # the evaluation enters the state here
    before = made.trainer.checkpoint().save(str(tmp_path / "before" / "ckpt"))  # ckpt-4, before its evaluation
    evaluate_at(made, tmp_path, 4, 0.7)
    assert made.stopped
    after = made.trainer.checkpoint().save(str(tmp_path / "after" / "ckpt"))  # ckpt-4 saved at the stop
    assert int(made.trainer.progress.evaluated.numpy()) == 2
    for prefix in (before, after):
        reader = tf.train.load_checkpoint(prefix)
        assert [int(reader.get_tensor(f"progress/{name}/.ATTRIBUTES/VARIABLE_VALUE"))
                for name in ("evaluated", "best_step", "since_best")] == [2, 2, 0]

    resumed_trainer = make_trainer(*overrides)
    resumed_trainer.checkpoint().restore(after).assert_existing_objects_matched()
    resumed = recipes_of(tmp_path, *overrides, trainer=resumed_trainer)
    assert resumed.stopped and (resumed.last, resumed.best_step, resumed.since_best) == (4, 2, 1)
    evaluate_at(resumed, tmp_path, 4, 0.7)  # counted once only
    assert resumed.since_best == 1
    resumed_trainer.train_loop(make_iterator(pairs().repeat().batch(BATCH)), 1)
    assert [int(v.numpy()) for v in (resumed_trainer.progress.evaluated, resumed_trainer.progress.since_best)] == [4, 1]


def test_the_objective_is_the_last_headline_value_or_the_best(tmp_path):
    last = recipes_of(tmp_path / "last", "trainer.keep_best=true")
    best = recipes_of(tmp_path / "best", "trainer.objective=best", "trainer.best_metric=loss", "trainer.best_mode=min")
    for made, folder in ((last, tmp_path / "last"), (best, tmp_path / "best")):
        folder.mkdir(exist_ok=True)
        for step, accuracy in ((2, 0.5), (4, 0.75), (6, 0.6)):
            evaluate_at(made, folder, step, accuracy)
    assert last.objective({"accuracy": 0.6}) == 0.6  # the default: the last evaluation's headline metric
    assert best.objective({"accuracy": 0.6}) == pytest.approx(0.25)  # the lowest loss, 1 - 0.75


def test_the_sweep_summary_takes_the_best_value_where_the_job_reports_it(tmp_path):
    import dataclasses
    from tf_harness.experiments.sweeps import sweep_report

    (tmp_path / "best.json").write_text(json.dumps({"metric": "auc", "value": 0.9, "global_step": 4}))
    (tmp_path / "metrics.json").write_text(json.dumps({"accuracy": 0.6, "auc": 0.7, "global_step": 6}))
    outcome = {"status": 0, "error": None, "value": None, "ran": True}
    job = sweep_report.Job(tmp_path, True, 0, (), "train_and_evaluate", "lfw_pairs", "last", "auc")
    assert sweep_report.with_recorded_metric(job, tmp_path, outcome)["value"] == 0.6
    assert sweep_report.headline_of(job, 0.6) == "accuracy"
    job = dataclasses.replace(job, objective="best")
    assert sweep_report.with_recorded_metric(job, tmp_path, outcome)["value"] == 0.9
    assert sweep_report.headline_of(job, 0.9) == "auc"


@pytest.mark.slow  # end-to-end runs
def test_a_run_keeps_its_best_stops_early_stays_stopped_and_evaluates_its_best(tmp_path):
    """The runs in this process (api.run, the command line's path): what they keep and write is under test."""
    from tf_harness.experiments import api
    run_dir = tmp_path / "run"
    args = (*SMOKE, "trainer.train_steps=12", "trainer.keep_best=true", "trainer.keep_checkpoints=1",
            "trainer.early_stopping.patience=1", "trainer.early_stopping.min_delta=0.5")
    api.run(args, run_dir=str(run_dir))
    # The first evaluation is the best; the second cannot beat it by 0.5: the run stops there, at step 4.
    assert [record["global_step"] for record in metrics_history.read(run_dir)] == [2, 4]
    record = json.loads((run_dir / "best.json").read_text())
    assert record["global_step"] == 2 and record["checkpoint"] == "best/ckpt-2"
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("*.index")) == ["ckpt-4.index"]
    assert (run_dir / "best" / "ckpt-2.index").is_file()  # keep_checkpoints=1 never deletes it
    log = (run_dir / "run.log").read_text()
    assert log.count("Stopping early at global step 4") == 1
    assert json.loads((run_dir / "metrics.json").read_text())["stopped_early"] is True

    api.run(args, run_dir=str(run_dir))
    assert "The run stopped early at global step 4" in (run_dir / "run.log").read_text()
    assert len(metrics_history.read(run_dir)) == 2  # nothing trained, nothing evaluated

    api.run(["mode=evaluate", "checkpoint=best"], run_dir=str(run_dir))
    evaluated = json.loads((run_dir / "metrics_validation.json").read_text())  # metrics.json is the run's own
    assert evaluated["global_step"] == 2 and evaluated["accuracy"] == record["value"]  # reproduced exactly
    assert json.loads((run_dir / "metrics.json").read_text())["stopped_early"] is True
    logged = len((run_dir / "run.log").read_text())
    api.run(args, run_dir=str(run_dir))
    assert "Redoing the evaluation" not in (run_dir / "run.log").read_text()[logged:]

    with raises_naming(api.RunConfigError, "checkpoint=3:", f"{run_dir}/checkpoints ", "global step 3;",
                       "global steps 4"):
        api.run(["mode=evaluate", "checkpoint=3"], run_dir=str(run_dir))


# Bad values ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, line", [
    (("trainer.early_stopping.patience=-1",), "trainer.early_stopping.patience=-1 is not an integer >= 0, or null"),
    (("trainer.early_stopping.min_delta=-0.1",), "trainer.early_stopping.min_delta=-0.1 is not a number >= 0"),
    (("trainer.ema_decay=1",), "trainer.ema_decay=1 is not a number in [0, 1), or null"),
    (("trainer.ema_decay=-0.5",), "trainer.ema_decay=-0.5 is not a number in [0, 1), or null"),
    (("trainer.accumulate_steps=0",), "trainer.accumulate_steps=0 is not an integer >= 1"),
    (("trainer.clip_global_norm=0",), "trainer.clip_global_norm=0 is not a number > 0, or null"),
    (("trainer.best_mode=up",), "trainer.best_mode=up is not one of max|min"),
    (("trainer.objective=first",), "trainer.objective=first is not one of last|best"),
    (("trainer.best_metric=loss", "trainer.best_mode=max"),
     "trainer.best_mode=max contradicts trainer.best_metric=loss, of which a lower value is better; leave "
     "trainer.best_mode unset (null), which follows the metric, or set it to min"),
    (("trainer.best_mode=min",),
     "trainer.best_mode=min contradicts the headline metric (trainer.best_metric=null), of which a higher value"),
    (("dataset=lfw_pairs", "trainer.best_metric=auc/mean"),
     "trainer.best_metric=auc/mean is not a metric dataset=lfw_pairs writes at every evaluation; it writes "
     "loss|accuracy|auc|eer|tar_at_far_1e-2|tar_at_far_1e-3"),
    (("dataset=lfw_pairs", "trainer.best_metric=eer", "trainer.eval_steps=2"),
     "trainer.best_metric=eer is a protocol metric of dataset=lfw_pairs, measured on the whole validation split "
     "only, and trainer.eval_steps=2 evaluates a sample; leave trainer.eval_steps null"),
    (("dataset=chest_xray", "trainer.best_metric=eer"),
     "trainer.best_metric=eer is not a metric dataset=chest_xray writes at every evaluation"),
    (("dataset=imagenet_det", "trainer.best_metric=auc"),
     "trainer.best_metric=auc is not a metric dataset=imagenet_det writes at every evaluation; it writes "
     "loss|accuracy|top5_accuracy"),
    (("checkpoint=best",), "checkpoint=best is for mode=evaluate|predict|export; mode=train_and_evaluate resumes"),
    (("mode=evaluate", "checkpoint=-2"), "checkpoint=-2 is not latest, best or a global step >= 0"),
    (("mode=export", "checkpoint=81"), "checkpoint=81 is not a global step the run reaches: it takes latest, best or "
                                       "a step in 0..80 (trainer.train_steps)"),
])
def test_a_bad_recipe_value_is_one_line(overrides, line):
    from tf_harness.experiments.config import schema
    from tests.conftest import compose

    problem = schema.first_problem(compose(*overrides), {})
    assert problem.startswith(line) and "\n" not in problem, problem


def test_good_recipe_values_pass():
    from tf_harness.experiments.config import schema
    from tests.conftest import compose

    for overrides in [("trainer.keep_best=true", "trainer.best_metric=auc/Mass", "trainer.early_stopping.patience=0",
                       "trainer.ema_decay=0", "trainer.accumulate_steps=4", "trainer.clip_global_norm=1"),
                      ("dataset=lfw_pairs", "trainer.best_metric=loss", "trainer.best_mode=min",
                       "trainer.objective=best"),
                      ("dataset=lfw_pairs", "trainer.best_metric=eer", "trainer.keep_best=true",
                       "trainer.best_mode=min"),
                      ("mode=predict", "checkpoint=best"), ("mode=evaluate", "checkpoint=40")]:
        assert schema.problems(compose(*overrides), {}) == [], overrides


def test_best_mode_follows_the_metric_by_default(tmp_path):
    """A lower loss is the better one: unset, best_mode follows the metric, so "New best loss" is the lowest."""
    assert recipes_of(tmp_path / "loss", "trainer.best_metric=loss").mode == "min"
    assert recipes_of(tmp_path / "headline").mode == "max"


def test_the_schemas_metrics_are_those_an_evaluation_writes():
    from tf_harness.data import TASKS
    from tf_harness.experiments.evaluation import metrics
    from tf_harness.experiments.training import recipes

    for name in TASKS:
        spec = TASKS[name].SPEC
        written = recipes.metric_names(spec)
        assert TASKS.entries[name].task == spec.task
        assert set(written) - {f"auc/{c}" for c in spec.class_names if spec.task == "multilabel"} == \
            {"loss", *metrics.names(spec.task), *metrics.protocol_names(name)}, name
    assert metrics.protocol_names("lfw_pairs") == ("eer", "tar_at_far_1e-2", "tar_at_far_1e-3")


def test_python_run_py_refuses_a_bad_recipe_value_in_one_line_before_tensorflow_starts(tmp_path):
    import subprocess
    import sys
    from tests.conftest import PROJECT

    code = ("import runpy, sys\n"
            "sys.argv = ['run.py', 'trainer.early_stopping.patience=-1', 'hydra.run.dir=' + sys.argv[1]]\n"
            "try:\n"
            "    runpy.run_path('run.py', run_name='__main__')\n"
            "except SystemExit as exit:\n"
            "    print(exit.code, 'tensorflow' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], cwd=PROJECT, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.split() == ["2", "False"], result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("config error: ")
    assert_names(line, "trainer.early_stopping.patience=-1 ", ">= 0", "null")


# Fine-tuning controls ---------------------------------------------------------------------------------------------

def by_path(trainer):
    return {variable.path: variable.numpy().copy() for variable in trainer.model.variables}


def test_frozen_variables_and_their_batch_norm_statistics_stay_as_they_were(caplog):
    with caplog.at_level(logging.INFO):
        trainer = make_trainer("trainer.freeze='^tower/'", "trainer.ema_decay=0.5")
    before = by_path(trainer)
    trainer.train_loop(make_iterator(pairs().repeat().batch(BATCH)), 2)
    after = by_path(trainer)
    tower = [path for path in before if path.startswith("tower/")]
    assert any("moving_mean" in path for path in tower)  # the batch-norm statistics, in inference mode
    assert all(np.array_equal(before[path], after[path]) for path in tower)
    assert not np.array_equal(before["logits/kernel"], after["logits/kernel"])  # the head trains
    assert [v.path for v in trainer.trained] == ["embedding/kernel", "embedding/bias", "head/kernel", "head/bias",
                                                 "logits/kernel", "logits/bias"]
    assert len(trainer.optimizer._model_variables_moving_average) == 6  # slots and averages for the trained alone
    assert "trainer.freeze=^tower/: 6 of 12 trainable variables frozen, 6 trained; 2 batch-normalization layer(s) " \
           "in inference mode" in caplog.text


def test_a_learning_rate_multiplier_scales_the_update_of_the_variables_it_matches(caplog):
    def change(*overrides):
        tf.keras.utils.set_random_seed(0)
        trainer = make_trainer("trainer.optimizer=sgd", "trainer.momentum=0.0", "trainer.learning_rate=0.1",
                               *overrides)
        before = by_path(trainer)
        trainer.train_loop(make_iterator(pairs().repeat().batch(BATCH)), 1)
        return {path: value - before[path] for path, value in by_path(trainer).items()}

    plain = change()
    with caplog.at_level(logging.INFO):
        scaled = change("trainer.lr_multipliers={logits: 3.0, head: 0.5, /kernel: 2.0}")
    def same(actual, expected):  # a weight's change, read as the difference of two weights: float noise
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
        assert np.abs(expected).max() > 1e-4

    same(scaled["logits/kernel"], 3.0 * plain["logits/kernel"])  # the first rule that matches
    same(scaled["head/kernel"], 0.5 * plain["head/kernel"])
    same(scaled["embedding/kernel"], 2.0 * plain["embedding/kernel"])
    same(scaled["tower/bn0/gamma"], plain["tower/bn0/gamma"])  # no rule: the learning rate
    assert "trainer.lr_multipliers: 'logits' x3 matched 2, 'head' x0.5 matched 2, '/kernel' x2 matched 5; 7 of 12 " \
           "trained variables take a factor" in caplog.text


@pytest.mark.parametrize("override, line", [
    ("trainer.freeze='^backbone/'", "trainer.freeze=^backbone/ matches none of the model's 12 trainable variables"),
    ("trainer.lr_multipliers={logits: 2, backbone: 0.1}",
     "trainer.lr_multipliers: 'backbone' matches none of the 12 trained variables"),
    ("trainer.freeze=.", "trainer.freeze=. matches every one of the model's 12 trainable variables, so nothing would "
                         "train"),
])
def test_a_rule_that_matches_nothing_is_a_config_error_in_one_line(override, line):
    from tf_harness.data.errors import ConfigError
    with pytest.raises(ConfigError) as error:
        make_trainer(override)
    assert str(error.value).startswith(line) and "\n" not in str(error.value)


@pytest.mark.parametrize("key, value, line", [
    ("trainer.freeze", "tower(", "trainer.freeze=tower( is not a regular expression, or null"),
    ("trainer.lr_multipliers", {"tower(": 0.1},
     'trainer.lr_multipliers={"tower(":0.1} is not a mapping of regular expressions to factors > 0'),
    ("trainer.lr_multipliers", {"tower": 0}, 'trainer.lr_multipliers={"tower":0} is not a mapping'),
    ("trainer.lr_multipliers", {"tower": "fast"}, 'trainer.lr_multipliers={"tower":"fast"} is not a mapping'),
])
def test_an_invalid_rule_is_refused_before_tensorflow_starts(key, value, line):
    """Set as a YAML file would set it: Hydra's command line takes neither `(` nor `^` in a mapping's key."""
    from omegaconf import OmegaConf
    from tf_harness.experiments.config import schema
    from tests.conftest import compose

    cfg = compose()
    OmegaConf.update(cfg, key, value, merge=False)
    problem = schema.first_problem(cfg, {})
    assert problem.startswith(line) and "\n" not in problem, problem


def test_the_recipes_compile_with_xla_as_a_gpu_runs_them(monkeypatch):
    """A GPU's default compiles the step with XLA and fetches ahead: the accumulation loop, the clipping and the
    moving average train there as without XLA, to float tolerance (no augmentation: XLA draws other numbers)."""
    recipe = ("trainer.accumulate_steps=2", "trainer.clip_global_norm=0.01", "trainer.ema_decay=0.5",
              "trainer.steps_per_loop=2", "trainer.fetch_ahead=true")
    compiled = flat_trainer(monkeypatch, "trainer.jit_compile=true", *recipe)
    plain = flat_trainer(monkeypatch, "trainer.jit_compile=false", *recipe)
    assert compiled.jit_compile and not plain.jit_compile
    for trainer in (compiled, plain):
        batches = make_iterator(faces(64).batch(BATCH).repeat())
        loop = trainer.train_loop(batches, 2)
        assert loop.steps == 2 and loop.means["gradient_norm"] > 0.01 and trainer.step == 2
    for mine, theirs in zip(compiled.model.variables + compiled.optimizer.variables,
                            plain.model.variables + plain.optimizer.variables):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # end-to-end runs
def test_the_recipes_train_under_float16_loss_scaling(tmp_path):
    """The loss-scale optimizer wraps the one that keeps the averages; the clipped norm is the unscaled one."""
    result = run_cli(*SMOKE, "pipeline.dtype=float16", "trainer.clip_global_norm=1.0", "trainer.ema_decay=0.9",
                     "trainer.accumulate_steps=2", "trainer.keep_best=true", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "best.json").is_file() and len(metrics_history.read(tmp_path)) == 2
    from tests.conftest import event_tags
    accumulator, _ = event_tags(tmp_path / "train")
    norms = [float(tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors("gradient_norm")]
    assert norms and all(0 < norm < 1e3 for norm in norms), norms  # unscaled: not times the loss scale (2 ** 15)


@pytest.mark.parametrize("damage", ['{"checkpoint": "best/ckpt-2", "global_st', '{"global_step": "2"}', "[2]"])
def test_a_resume_keeps_the_best_checkpoint_when_best_json_is_damaged(tmp_path, caplog, damage):
    """A record that names no step cannot say which best checkpoint is kept: none is removed."""
    evaluate_at(recipes_of(tmp_path, "trainer.keep_best=true"), tmp_path, 2, 0.5)
    kept = sorted(path.name for path in (tmp_path / "best").iterdir())
    (tmp_path / "best.json").write_text(damage)
    with caplog.at_level(logging.WARNING):
        recipes_of(tmp_path, "trainer.keep_best=true")
    assert sorted(path.name for path in (tmp_path / "best").iterdir()) == kept == ["ckpt-2.data-00000-of-00001",
                                                                                 "ckpt-2.index"]
    assert any("best.json cannot be read" in record.getMessage() for record in caplog.records)
