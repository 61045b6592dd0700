"""The training recipes (docs/training-loop.md#training-recipes): the metrics history, gradient clipping, EMA
weights, gradient accumulation, the best checkpoint, early stopping and fine-tuning controls."""
import json
import logging

import numpy as np
import pytest
import tensorflow as tf

from tf_harness.experiments import metrics_history
from tests.conftest import run_cli
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


def test_every_evaluation_is_in_metrics_jsonl_and_a_re_entry_appends(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_cli(*SMOKE, f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = metrics_history.read(run_dir)
    assert [record["global_step"] for record in records] == [2, 4]
    assert all(isinstance(record["time"], float) for record in records) and records[0]["time"] <= records[1]["time"]
    last = json.loads((run_dir / "metrics.json").read_text())
    assert {key: value for key, value in records[-1].items() if key != "time"} == last  # metrics.json: the last

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
    loop = trainer.train_loop(iter(pairs().repeat().batch(BATCH)), steps)
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
        assert loop.norm_sum == 0.0  # not computed without clipping
        return
    assert loop.gradient_norm > 10 * limit  # the norm before clipping...
    np.testing.assert_allclose(moved / 0.5, limit, rtol=1e-3)  # ...and the update's, clipped


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
    batches = iter(pairs().repeat().batch(BATCH))
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
    trainer.train_loop(iter(pairs().repeat().batch(BATCH)), 1)
    trainer.train_loop(iter(pairs(2.0).repeat().batch(BATCH)), 1)
    weights = trainable(trainer)
    with pytest.raises(KeyboardInterrupt):
        with trainer.averaged():
            assert not np.array_equal(trainable(trainer)[0], weights[0])
            raise KeyboardInterrupt
    for before, after in zip(weights, trainable(trainer)):
        np.testing.assert_array_equal(before, after)


def test_evaluation_scores_the_averaged_weights(tmp_path):
    from tf_harness.experiments.evaluation import Evaluator
    from tf_harness.experiments.summaries import Summaries
    from tests.conftest import compose, tables_of, task_of
    from tf_harness.data.input_fn import input_fn
    from tf_harness.experiments.settings import Settings

    trainer = make_trainer("trainer.ema_decay=0.5")
    cfg = compose("dataset=lfw_pairs", "pipeline.image_size=48", f"pipeline.batch_size={BATCH}", "trainer.eval_steps=1")
    task, tables, pipeline = task_of(cfg), tables_of(cfg), Settings.from_config(cfg).input_pipeline()
    trainer.train_loop(iter(pairs().repeat().batch(BATCH)), 1)
    trainer.train_loop(iter(pairs(2.0).repeat().batch(BATCH)), 1)
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
    from tf_harness.experiments import warm_start

    source = make_trainer("trainer.ema_decay=0.5")
    source.train_loop(iter(pairs().repeat().batch(BATCH)), 1)
    source.train_loop(iter(pairs(2.0).repeat().batch(BATCH)), 1)
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


def test_an_export_of_an_ema_run_serves_the_averaged_weights(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_cli(*SMOKE, "trainer.ema_decay=0.5", "mode=train", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    exported = run_cli(f"hydra.run.dir={run_dir}", "mode=export")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "evaluation, prediction and export use the averaged weights" in (run_dir / "run.log").read_text()
    from tf_harness.experiments import warm_start

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
    from tf_harness.experiments import trainer as trainer_module
    monkeypatch.setattr(trainer_module, "BUILDERS", {"siamese_cnn": flat_pair_model})
    tf.keras.utils.set_random_seed(0)
    return make_trainer("pipeline.augment=false", *overrides)


@pytest.mark.parametrize("loop", [(), ("trainer.steps_per_loop=4", "trainer.fetch_ahead=true")])
def test_accumulating_n_batches_trains_as_one_batch_n_times_larger(monkeypatch, loop):
    large = flat_trainer(monkeypatch, f"pipeline.batch_size={2 * BATCH}")
    accumulated = flat_trainer(monkeypatch, "trainer.accumulate_steps=2", *loop)
    assert accumulated.examples_per_step == large.examples_per_step == 2 * BATCH
    large_batches = iter(faces(64).batch(2 * BATCH).repeat())
    small_batches = iter(faces(64).batch(BATCH).repeat())
    for steps in (1, 2):
        wide, accumulating = large.train_loop(large_batches, steps), accumulated.train_loop(small_batches, steps)
        assert accumulating.steps == wide.steps == steps and len(accumulating.logits) == len(wide.logits)
        np.testing.assert_allclose(accumulating.loss, wide.loss, rtol=1e-5)
        np.testing.assert_allclose(accumulating.labels, wide.labels)
    assert accumulated.step == large.step == 3  # the global step counts updates
    assert int(accumulated.optimizer.iterations.numpy()) == 3
    for mine, theirs in zip(trainable(accumulated), trainable(large)):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    # Six batches were taken, no more: the iterator stands at the seventh.
    np.testing.assert_array_equal(next(small_batches)[0][0], next(iter(faces(64).batch(BATCH).skip(6)))[0][0])


def test_a_non_finite_batch_skips_its_whole_update(monkeypatch):
    trainer = make_trainer("trainer.accumulate_steps=2")  # batch norm: its statistics are kept too
    trainer.train_loop(iter(pairs().repeat().batch(BATCH)), 1)
    before = [v.numpy().copy() for v in trainer.model.variables + trainer.optimizer.variables]
    one_bad = iter(pairs().batch(BATCH).concatenate(pairs(float("nan")).batch(BATCH)).repeat())
    loop = trainer.train_loop(one_bad, 1)
    assert (loop.steps, loop.nonfinite, trainer.step) == (1, 1, 2)
    for old, new in zip(before, [v.numpy() for v in trainer.model.variables + trainer.optimizer.variables]):
        np.testing.assert_array_equal(old, new)


def test_accumulation_resumes_exactly_from_a_checkpoint(monkeypatch, tmp_path):
    def batches():
        return iter(faces(64).batch(BATCH).repeat())

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


def test_accumulation_trains_under_several_replicas_and_counts_examples_per_update(tmp_path):
    result = run_cli(*SMOKE, "strategy=mirrored", "strategy.logical_cpus=2", "trainer.accumulate_steps=2",
                     "trainer.clip_global_norm=1.0", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [record["global_step"] for record in metrics_history.read(tmp_path)] == [2, 4]
    reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints" / "ckpt-4"))
    assert reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE") == 4
