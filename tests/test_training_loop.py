"""Train loops of trainer.steps_per_loop steps: boundaries, input wait, same weights, non-finite steps."""
import json
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_harness.data.iterators import make_iterator
from tf_harness.data.spec import DatasetSpec
from tf_harness.data.task import Task
from tf_harness.experiments.config.settings import Settings
from tf_harness.experiments.training import trainer as trainer_module
from tf_harness.experiments.training.trainer import NonFiniteLossError, Trainer, loop_length, resolve_fetch_ahead
from tests.conftest import PROJECT, compose, event_tags, run_cli, wait_for_checkpoint
from tests.refusals import assert_error, raises_naming

PAIRS = DatasetSpec(name="lfw_pairs", task="binary", class_names=("same",), channels=3, paired=True)
SIZE, BATCH = 48, 4
# A tiny LFW run: small faces and batches, a narrow siamese CNN.
TINY_LFW = ("dataset=lfw_pairs", "pipeline.image_size=24", "pipeline.batch_size=8", "model.widths=[8,16]",
            "model.embedding_size=16", "model.head_units=8", "trainer.eval_steps=2")


def test_loop_length_lands_on_every_boundary():
    intervals = [3, 5, 6]  # log, checkpoint, eval
    step, ends = 0, []
    while step < 8:
        step += loop_length(step, 4, 8, intervals)
        ends.append(step)
    assert ends == [3, 5, 6, 8]
    assert loop_length(0, 50, 1000, [100, 100, 500]) == 50
    assert loop_length(90, 50, 1000, [100, 100, 500]) == 10


@pytest.fixture(scope="module")
def trainer():
    return make_trainer()


def make_trainer(*overrides, loss=None):
    cfg = compose("dataset=lfw_pairs", f"pipeline.image_size={SIZE}", f"pipeline.batch_size={BATCH}",
                  "model.widths=[16,32]", "model.embedding_size=4", "model.head_units=4",
                  "trainer.max_nonfinite_steps=3", *overrides)
    return Trainer(Settings.from_config(cfg), PAIRS, tf.distribute.get_strategy(), (SIZE, SIZE), loss=loss)


def pairs(weight=1.0):
    """Unbatched LFW-like examples: a pair of uint8 faces, a float label and an example weight."""
    image = tf.cast(tf.random.stateless_uniform([SIZE, SIZE, 3], [1, 2], maxval=255), tf.uint8)
    return tf.data.Dataset.from_tensors(((image, image), tf.ones([1]), tf.constant(weight)))


def slow_and_cached():
    """Two batch iterators: one whose every example takes 50 ms to read, one cached in memory."""
    def sleep(x):
        time.sleep(0.05)
        return x

    slow = pairs().repeat().map(lambda features, label, weight: (
        features, tf.ensure_shape(tf.numpy_function(sleep, [label], tf.float32, stateful=True), [1]), weight))
    cached = pairs().repeat(8).cache().repeat().batch(BATCH).prefetch(tf.data.AUTOTUNE)
    return make_iterator(slow.batch(BATCH).prefetch(1)), make_iterator(cached)


def while_loop_function(trainer, iterator, part):
    """The traced train loop's While op, its `part` function ("cond" or "body") and, by that function's
    argument names, the While op's input that feeds each."""
    graph = trainer._loop.get_concrete_function(iterator, tf.constant(2)).graph.as_graph_def()
    (loop,) = [node for node in graph.node if node.op == "While"]
    function = {function.signature.name: function for function in graph.library.function}[loop.attr[part].func.name]
    return loop, function, dict(zip((argument.name for argument in function.signature.input_arg), loop.input))


def test_slow_input_reads_as_waiting_and_cached_input_does_not(trainer):
    slow, cached = slow_and_cached()
    trainer.train_loop(cached, 2)  # the traces, out of the timings
    trainer.train_loop(cached, 1)  # on CPU, steps_per_loop defaults to 1: one step is traced on its own
    for steps in (1, 4):
        assert trainer.train_loop(slow, steps).input_wait_fraction >= 0.5
    fractions = [trainer.train_loop(cached, steps).input_wait_fraction for steps in (1, 20, 20)]
    # One step's fraction is noisy on a shared machine; a loop of 20 averages it.
    assert min(fractions[1:]) <= 0.05, fractions
    assert trainer._loop.experimental_get_tracing_count() == 1  # one trace serves every loop length
    assert trainer._one.experimental_get_tracing_count() == 1


def test_steps_per_loop_null_means_one_step_calls_on_cpu_alone():
    """No GPU here: null resolves to 1, and a one-step call runs without the while loop."""
    trainer = make_trainer()
    assert trainer.steps_per_loop == 1
    batches = make_iterator(pairs().repeat().batch(BATCH))
    stats = trainer.train_loop(batches, 1)
    assert stats.steps == 1 and stats.nonfinite == 0 and np.isfinite(stats.loss)
    assert trainer._one.experimental_get_tracing_count() == 1 and trainer._loop.experimental_get_tracing_count() == 0
    assert int(trainer.global_step.numpy()) == 1
    assert not trainer.jit_compile  # trainer.jit_compile null: no XLA on CPU alone


@pytest.mark.parametrize("steps_per_loop", [1, 3])
def test_later_loops_run_in_a_waited_thread_on_the_first_loops_trace(steps_per_loop):
    """The runner's first loop trains on the batch fetched on the host, in the main thread; each later loop runs in
    the thread experiments/run_dir/blocking.py waits on, and reuses that trace: Keras keeps settings per thread."""
    from tf_harness.experiments.run_dir import blocking
    trainer = make_trainer(f"trainer.steps_per_loop={steps_per_loop}")
    iterator = make_iterator(pairs().repeat().batch(BATCH, drop_remainder=True))  # as input_fn batches training input
    first = make_iterator(tf.data.Dataset.from_tensors(blocking.call(next, iterator, what="the first batch")))
    assert trainer.train_loop(first, 1).steps == 1
    for _ in range(2):
        stats = blocking.call(trainer.train_loop, iterator, steps_per_loop, what="a loop", expected=60.0)
        assert stats.steps == steps_per_loop and np.isfinite(stats.loss)
    assert int(trainer.global_step.numpy()) == 1 + 2 * steps_per_loop
    traced = trainer._one if steps_per_loop == 1 else trainer._loop
    assert traced.experimental_get_tracing_count() == 1


class Pairs(Task):
    SPEC = PAIRS


class TripledLoss(Pairs):
    """A dataset whose loss is three times the default: what a researcher's override of `Task.loss` looks like."""

    def loss(self, labels, logits, weights):
        return 3.0 * super().loss(labels, logits, weights)


def test_the_train_and_eval_steps_take_their_loss_from_the_task():
    batch = next(make_iterator(pairs().repeat().batch(BATCH)))
    results = []
    for task in (Pairs(decode=None, seed=0), TripledLoss(decode=None, seed=0)):
        keras.utils.set_random_seed(7)  # the same initial weights for both
        trainer = make_trainer(loss=task.loss)
        eval_loss, _ = trainer.eval_step(*batch)
        results.append((float(eval_loss), float(trainer.one_step(*batch)["loss"])))
    (eval_default, train_default), (eval_tripled, train_tripled) = results
    assert train_default > 0 and eval_default > 0
    assert train_tripled == pytest.approx(3 * train_default, rel=1e-5)
    assert eval_tripled == pytest.approx(3 * eval_default, rel=1e-5)


def variables(trainer):
    return [v.numpy().copy() for v in trainer.model.variables + trainer.optimizer.variables]


def test_a_non_finite_step_is_skipped_and_max_in_a_row_stops_the_loop(trainer):
    good, bad = (make_iterator(pairs(weight).repeat().batch(BATCH)) for weight in (1.0, float("nan")))
    trainer.train_loop(good, 1)
    before, step = variables(trainer), trainer.step
    loop = trainer.train_loop(bad, 2)
    assert (loop.steps, loop.nonfinite, loop.nonfinite_in_a_row) == (2, 2, 2)
    assert np.isnan(loop.loss) and loop.means == {}  # no step applied: nothing has a mean
    assert trainer.step == step + 2  # the batches were used up, but nothing was applied
    for old, new in zip(before, variables(trainer)):  # weights, batch-norm statistics and optimizer state
        np.testing.assert_array_equal(old, new)
    loop = trainer.train_loop(bad, 10)
    assert (loop.steps, loop.nonfinite_in_a_row) == (1, 3)  # stops at the third in a row
    assert trainer.all_finite()
    loop = trainer.train_loop(good, 2)
    assert (loop.nonfinite, loop.nonfinite_in_a_row) == (0, 0) and np.isfinite(loop.loss)


def test_steps_after_the_stop_within_a_loop_change_nothing():
    """The loop's later steps after `max_nonfinite_steps` in a row take their batches but apply, count and
    step nothing, so the runner stops on weights as they were at the third skipped step."""
    trainer = make_trainer()
    good = pairs().repeat().batch(BATCH)
    trainer.train_loop(make_iterator(good), 1)
    before, step = variables(trainer), trainer.step
    three_bad_then_good = make_iterator(pairs(float("nan")).repeat().batch(BATCH).take(3).concatenate(good))
    loop = trainer.train_loop(three_bad_then_good, 10)
    assert (loop.steps, loop.nonfinite, loop.nonfinite_in_a_row) == (3, 3, 3)
    assert trainer.step == step + 3 and np.isnan(loop.loss)
    for old, new in zip(before, variables(trainer)):  # the 7 good batches after the stop were not applied
        np.testing.assert_array_equal(old, new)


def test_the_loop_condition_reads_only_the_step_count():
    """The while loop's condition must not read a device value: on a GPU that read waits for every step to
    finish before the host may fetch and launch the next, and the device idles meanwhile."""
    trainer = make_trainer("trainer.steps_per_loop=2")
    batches = make_iterator(pairs().repeat().batch(BATCH))
    trainer.train_loop(batches, 2)
    loop, cond, fed_by = while_loop_function(trainer, batches, "cond")
    read = {fed_by[name.split(":")[0]] for node in cond.node_def for name in node.input if name in fed_by}
    # The While op's inputs: its own two counters, then the loop variables (the step index first), then
    # what the loop captures, here the loop function's own `steps` argument.
    assert read == {loop.input[2], "steps"}, sorted(read)


def numbered(count):
    """`count` batches whose examples carry the batch's number (from 1) as their weight, then repeated."""
    return pairs().repeat(BATCH).batch(BATCH).take(1).repeat(count).enumerate().map(
        lambda number, batch: (batch[0], batch[1], tf.fill([BATCH], tf.cast(number, tf.float32) + 1.0))).repeat()


def test_fetching_ahead_trains_the_same_steps_and_leaves_the_iterator_at_them():
    """trainer.fetch_ahead: the same batches in the same order, so the same weights, and no batch fetched past a
    loop's last step, so the iterator (what a checkpoint saves) stands where the one that fetches in turn does."""
    trainers, iterators = [], []
    for ahead in ("false", "true"):
        tf.keras.utils.set_random_seed(0)
        trainers.append(make_trainer("trainer.steps_per_loop=4", f"trainer.fetch_ahead={ahead}"))
        iterators.append(make_iterator(numbered(100)))
        for steps in (4, 1, 3):
            loop = trainers[-1].train_loop(iterators[-1], steps)
            assert loop.steps == steps and loop.nonfinite == 0
    in_turn, ahead = trainers
    assert ahead.fetch_ahead and not in_turn.fetch_ahead and ahead.step == in_turn.step == 8
    for old, new in zip(variables(in_turn), variables(ahead)):
        # Equal here, run after run; float noise allowed, as CPU kernels may sum in another order. A batch
        # trained out of turn moves the weights by about the learning rate, 1e-3.
        np.testing.assert_allclose(new, old, rtol=1e-6, atol=1e-7)
    assert [float(next(iterator)[2][0]) for iterator in iterators] == [9.0, 9.0]  # the ninth batch is next

    before = variables(ahead)  # the stop after max_nonfinite_steps in a row, fetching ahead
    three_bad = make_iterator(pairs(float("nan")).repeat().batch(BATCH).take(3).concatenate(numbered(100)))
    loop = ahead.train_loop(three_bad, 6)
    assert (loop.steps, loop.nonfinite, loop.nonfinite_in_a_row) == (3, 3, 3) and ahead.step == 11
    for old, new in zip(before, variables(ahead)):
        np.testing.assert_array_equal(old, new)
    assert float(next(three_bad)[2][0]) == 4.0  # the loop took its 6 batches, no more


def test_fetching_ahead_is_on_by_default_only_with_an_accelerator_and_one_replica(monkeypatch):
    """trainer.fetch_ahead: null is on where a GPU or TPU runs the step on one replica, where it measured faster;
    off on CPU alone (this machine); true and false are kept as given."""
    assert not make_trainer("trainer.steps_per_loop=4").fetch_ahead  # the config's default, on this CPU
    assert make_trainer("trainer.steps_per_loop=4", "trainer.fetch_ahead=true").fetch_ahead
    monkeypatch.setattr(trainer_module, "accelerated", lambda: True)
    assert resolve_fetch_ahead(None, replicas=1, input_device=None)
    assert not resolve_fetch_ahead(None, replicas=2, input_device=None)
    assert not resolve_fetch_ahead(False, replicas=1, input_device=None)
    # Batches already copied to the GPU by tf.data (trainer.checkpoint_input=false) need no fetching ahead.
    assert not resolve_fetch_ahead(None, replicas=1, input_device="/device:GPU:0")
    assert resolve_fetch_ahead(True, replicas=1, input_device="/device:GPU:0")


def test_batches_go_to_the_gpu_ahead_only_where_checkpoints_leave_the_input_out(monkeypatch):
    """trainer.checkpoint_input=false on one replica with a GPU: tf.data copies the batches to it ahead of the step;
    an input checkpoint, several replicas or no GPU keep them on the host. On this CPU the trainer's iterator is the
    plain one."""
    from types import SimpleNamespace

    gpu = [SimpleNamespace(name="/device:GPU:0")]
    monkeypatch.setattr(trainer_module.tf.config, "list_logical_devices", lambda kind=None: gpu if kind == "GPU" else [])
    assert trainer_module.input_device(checkpoint_input=False, replicas=1) == "/device:GPU:0"
    assert trainer_module.input_device(checkpoint_input=True, replicas=1) is None
    assert trainer_module.input_device(checkpoint_input=False, replicas=2) is None
    monkeypatch.undo()
    assert trainer_module.input_device(checkpoint_input=False, replicas=1) is None
    trainer = make_trainer("trainer.steps_per_loop=4", "trainer.checkpoint_input=false")
    assert trainer.input_device is None
    assert int(next(trainer.input_iterator(tf.data.Dataset.range(3)))) == 0


def test_fetching_ahead_waits_on_nothing_of_the_step():
    """The fetch of the next batch takes only the step count, the iterator and the loop's batch: nothing the
    step computes, no control input, so the executor may run it beside the step. Slow input still reads as
    waiting, and cached input not."""
    trainer = make_trainer("trainer.steps_per_loop=4", "trainer.fetch_ahead=true")
    slow, cached = slow_and_cached()
    trainer.train_loop(cached, 2)
    _, body, fed_by = while_loop_function(trainer, cached, "body")
    nodes = {node.name: node for node in body.node_def}
    (fetch,) = [node for node in body.node_def if node.op in ("If", "StatelessIf")  # the cond around the fetch
                and any(fed_by.get(name) == "iterator" for name in node.input)]
    assert not [name for name in fetch.input if name.startswith("^")]
    upstream, todo = set(), [name.split(":")[0] for name in fetch.input]
    while todo:
        name = todo.pop()
        if name in nodes and name not in upstream:
            upstream.add(name)
            todo += [source.lstrip("^").split(":")[0] for source in nodes[name].input]
    assert {nodes[name].op for name in upstream} <= {"Less", "AddV2", "Const", "Identity"}, upstream
    assert trainer.train_loop(slow, 4).input_wait_fraction >= 0.5
    fractions = [trainer.train_loop(cached, 20).input_wait_fraction for _ in range(2)]
    assert min(fractions) <= 0.05, fractions


def test_an_xla_step_trains_as_the_graph_step_and_skips_non_finite_steps_exactly():
    """trainer.jit_compile=true, a GPU's default, here on CPU: the step, its non-finite check and skip in one
    XLA cluster train the same weights as the uncompiled step, to float tolerance. Without augmentation: XLA
    draws other stateless random numbers than TensorFlow's kernels from the same seed, whatever the algorithm."""
    trainers = []
    for jit_compile in ("false", "true"):
        tf.keras.utils.set_random_seed(0)
        trainers.append(make_trainer(f"trainer.jit_compile={jit_compile}", "pipeline.augment=false"))
        trainers[-1].train_loop(make_iterator(pairs().repeat().batch(BATCH)), 3)
    graph, xla = trainers
    assert xla.jit_compile and not graph.jit_compile and xla.step == graph.step == 3
    # Float noise only (on an H100 the two differed by up to 3e-5 here after 3 steps): a step applied, lost or
    # applied twice moves every weight by about the learning rate, 1e-3.
    for old, new in zip(variables(graph), variables(xla)):
        np.testing.assert_allclose(new, old, rtol=1e-3, atol=1e-4)
    before = variables(xla)
    loop = xla.train_loop(make_iterator(pairs(float("nan")).repeat().batch(BATCH)), 10)
    assert (loop.steps, loop.nonfinite, loop.nonfinite_in_a_row) == (3, 3, 3)  # stops at the third in a row
    for old, new in zip(before, variables(xla)):  # weights, batch-norm statistics and optimizer state
        np.testing.assert_array_equal(old, new)


def test_non_finite_evaluation_loss_raises(trainer):
    batch = next(make_iterator(pairs().batch(BATCH)))
    trainer.eval_step(*batch)
    bias = trainer.model.get_layer("logits").bias
    kept = bias.numpy()
    bias.assign(np.full(kept.shape, np.nan, kept.dtype))
    try:
        assert not trainer.all_finite()
        with raises_naming(NonFiniteLossError, "evaluation loss", "nan", "global step "):
            trainer.eval_step(*batch)
    finally:
        bias.assign(kept)


def final_tensors(run_dir, step):
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints" / f"ckpt-{step}"))
    # The input iterator's state is a variant tensor, which numpy cannot hold; the object graph is a
    # serialized proto whose bytes need not repeat (its map fields have no fixed order).
    return {name: reader.get_tensor(name) for name, dtype in reader.get_variable_to_dtype_map().items()
            if dtype != tf.variant and name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def scalar_steps(logdir, tag):
    accumulator, _ = event_tags(logdir)
    return [event.step for event in accumulator.Tensors(tag)]


@pytest.mark.slow
def test_loops_train_the_same_weights_and_land_on_the_same_steps(tmp_path):
    common = (*TINY_LFW, "deterministic=true", "trainer.train_steps=8", "trainer.log_every=3",
              "trainer.checkpoint_every=5", "trainer.eval_every=6")
    for loop in (1, 4):
        result = run_cli(*common, f"trainer.steps_per_loop={loop}", f"hydra.run.dir={tmp_path / str(loop)}")
        assert result.returncode == 0, result.stderr[-3000:]
    one, four = tmp_path / "1", tmp_path / "4"
    assert sorted(p.name for p in (four / "checkpoints").glob("*.index")) == ["ckpt-5.index", "ckpt-8.index"]
    assert scalar_steps(four / "train", "loss") == scalar_steps(one / "train", "loss") == [3, 6, 8]
    assert scalar_steps(four / "train", "nonfinite_steps") == [3, 6, 8]
    assert scalar_steps(four / "validation", "loss") == [6, 8]
    assert json.loads((four / "metrics.json").read_text()) == json.loads((one / "metrics.json").read_text())
    for step in (5, 8):
        expected, actual = final_tensors(one, step), final_tensors(four, step)
        assert expected.keys() == actual.keys()
        for name, value in expected.items():
            assert np.array_equal(value, actual[name]), name


@pytest.mark.slow  # end-to-end runs
def test_huge_learning_rate_exits_1_without_a_non_finite_checkpoint(tmp_path):
    result = run_cli(*TINY_LFW, "trainer.learning_rate=1e30", "trainer.train_steps=40", "trainer.steps_per_loop=4",
                     "trainer.checkpoint_every=1", "trainer.log_every=1", "trainer.eval_every=1000",
                     f"hydra.run.dir={tmp_path}")
    last = assert_error(result, 1, "non-finite", "last checkpoint: ")
    assert last.startswith("error: 3 training steps"), last
    checkpoints = sorted((tmp_path / "checkpoints").glob("ckpt-*.index"))
    assert checkpoints
    for index in checkpoints:
        reader = tf.train.load_checkpoint(str(index.with_suffix("")))
        for name, dtype in reader.get_variable_to_dtype_map().items():
            if dtype.is_floating:
                assert np.isfinite(reader.get_tensor(name)).all(), (index.name, name)
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.slow  # end-to-end runs
def test_one_non_finite_step_stops_a_run_that_allows_one(tmp_path):
    result = run_cli(*TINY_LFW, "trainer.learning_rate=1e30", "trainer.max_nonfinite_steps=1",
                     "trainer.train_steps=10", f"hydra.run.dir={tmp_path}")
    # Step 1 trains on the initial weights; its 1e30-sized update makes step 2's loss non-finite.
    assert_error(result, 1, "training step 2 ", "non-finite", "no checkpoint")


@pytest.mark.slow
def test_sigterm_saves_the_step_its_weights_hold_and_resumes(tmp_path):
    args = [*TINY_LFW, "trainer.train_steps=100000", "trainer.steps_per_loop=7", "trainer.checkpoint_every=20",
            "trainer.eval_every=100000", "trainer.log_every=1000", f"hydra.run.dir={tmp_path}"]
    process = subprocess.Popen([sys.executable, "run.py", *args], cwd=PROJECT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_for_checkpoint(process, tmp_path / "checkpoints", 20)
    time.sleep(1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 143  # 128 + SIGTERM
    saved = max(int(p.stem.split("-")[1]) for p in (tmp_path / "checkpoints").glob("ckpt-*.index"))
    assert saved >= 20
    assert final_tensors(tmp_path, saved)["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == saved
    resumed = run_cli(*[a for a in args if "train_steps" not in a], f"trainer.train_steps={saved + 3}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at global step {saved}" in resumed.stdout
