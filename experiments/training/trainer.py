"""The model, optimizer, global step, checkpoints and the traced train loop and eval step.

`Trainer.train_step` is the step a researcher edits: augmentation, forward pass, the Task's loss, gradients.
Everything else here wraps it and is the same for any step.

Training runs in loops: one call of a traced function runs up to `trainer.steps_per_loop`
steps over the input iterator (Orbit's `steps_per_loop`), and the host reads the loop's
results once, so it does not stop the device every step. Nothing else in the loop reads a
device value on the host either: the loop's condition counts steps on the host, and the
non-finite stop is kept on the device (`_step`'s `live`), so the host can fetch, copy and
launch the next step while the device still runs the last. How a step gets its batch, and how its
wait for it is timed (input_wait_fraction): experiments/training/loop_input.py.
"""
import contextlib
import dataclasses
import functools
import logging
import re
import time

import keras
import numpy as np
import tensorflow as tf

from tf_harness.data import losses
from tf_harness.data.errors import ConfigError
from tf_harness.data.iterators import make_iterator
from tf_harness.experiments.config import graph_optimizer
from tf_harness.experiments.training import fine_tuning, optimizers, recipes
from tf_harness.experiments.training.loop_input import LoopInput
from tf_harness.models import BUILDERS

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The training or evaluation loss, or the weights, became NaN or infinite."""


@dataclasses.dataclass
class LoopStats:
    """What the host reads back from one or more train loops."""

    steps: int  # steps run, skipped non-finite ones included (not those after a stop: see `Trainer._step`)
    nonfinite: int  # steps skipped for a non-finite loss or gradient norm
    nonfinite_in_a_row: int  # consecutive skipped steps up to the loop's end
    wait: float  # seconds the steps waited for their batches (module docstring)
    seconds: float  # wall time on the host
    sums: dict  # each scalar the applied steps measured (`Trainer.train_step`'s, and the loss), summed over them
    counts: dict  # for each scalar, the applied steps whose value was finite: those `sums` adds up

    @classmethod
    def merge(cls, loops):
        return cls(steps=sum(s.steps for s in loops), nonfinite=sum(s.nonfinite for s in loops),
                   nonfinite_in_a_row=loops[-1].nonfinite_in_a_row, wait=sum(s.wait for s in loops),
                   seconds=sum(s.seconds for s in loops),
                   sums={name: sum(s.sums[name] for s in loops) for name in loops[0].sums},
                   counts={name: sum(s.counts[name] for s in loops) for name in loops[0].counts})

    @property
    def means(self) -> dict:
        """Each measured scalar's mean over the applied steps where it was finite: what the train scalars show. A
        value that is not finite is left out of its mean: under float16, the gradient norm of a step whose scaled
        gradients overflowed, which the loss-scale optimizer skips as it lowers its scale. A scalar with no finite
        value in these loops has no mean."""
        return {name: total / self.counts[name] for name, total in self.sums.items() if self.counts[name]}

    @property
    def loss(self) -> float:
        """The mean loss; NaN when no step was applied."""
        return self.means.get("loss", float("nan"))

    @property
    def input_wait_fraction(self) -> float:
        return min(self.wait / self.seconds, 1.0) if self.seconds > 0 else 0.0


def loop_length(step, steps_per_loop, target, intervals) -> int:
    """Steps in the next loop: `steps_per_loop`, clipped so that the global step lands exactly on
    `target` and on the next multiple of each interval (logging, checkpoints, evaluation)."""
    return min([steps_per_loop, target - step] + [every - step % every for every in intervals])


def accelerated() -> bool:
    """Whether TensorFlow sees a GPU or TPU: what the device-dependent defaults (steps per loop, Grappler) ask."""
    return bool(tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU"))


def default_steps_per_loop() -> int:
    """``trainer.steps_per_loop: null``: 10 where a GPU or TPU can idle while the host works between steps;
    1 on CPU alone, where a step dwarfs the host's per-step cost and a one-step call, traced without a while
    loop, reaches the first step sooner (docs/benchmarks.md)."""
    return 10 if accelerated() else 1


def resolve_jit_compile(jit_compile, replicas, deterministic) -> bool:
    """``trainer.jit_compile: null``: XLA where a GPU is present, the step runs on one replica and
    results need not repeat bit for bit. There TensorFlow's executor dispatches a step's hundreds of
    small kernels (thousands for ResNet-v2-152 and Adam) one by one from the host, and waits on the
    host for the non-finite check's branch, so the GPU idles between them; one compiled step is one
    launch. On CPU alone it is slower (docs/benchmarks.md)."""
    if jit_compile is not None:
        return jit_compile
    return bool(tf.config.list_physical_devices("GPU")) and replicas == 1 and not deterministic


def resolve_fetch_ahead(fetch_ahead, replicas, input_device) -> bool:
    """``trainer.fetch_ahead: null``: on where a GPU or TPU is present, the step runs on one replica and its batches
    come from the host (`input_device` None). There the host's fetch of each batch otherwise sits between one step's
    launch and the next (docs/benchmarks.md). On a CPU it changes nothing, and with one step per loop, CPU's default,
    there is nothing to fetch ahead of."""
    if fetch_ahead is not None:
        return fetch_ahead
    return accelerated() and replicas == 1 and input_device is None


def input_device(checkpoint_input, replicas):
    """The GPU that tf.data copies the training batches to ahead of the step, or None to keep them on the host: the
    first GPU where the step runs on one replica and checkpoints leave the input iterator out
    (``trainer.checkpoint_input=false``). TensorFlow cannot checkpoint an iterator that prefetches to a device, so
    exact input resume and this copy exclude each other; the user chooses."""
    if checkpoint_input or replicas != 1:
        return None
    gpus = tf.config.list_logical_devices("GPU")
    return gpus[0].name if gpus else None


def build_model(settings, spec, image_size) -> keras.Model:
    """The network of model=<name> for `image_size` (height, width) images of `spec`. Raises ConfigError, naming the
    model's keys and pipeline.image_size, when Keras or TensorFlow cannot build it so: experiments/config/schema.py
    refuses the sizes it can state without TensorFlow, and this refuses the rest before the run writes anything."""
    try:
        return BUILDERS[settings.model.name](settings.model, spec, image_size)
    except (ValueError, MemoryError, tf.errors.ResourceExhaustedError) as error:
        from tf_harness.experiments.config.config_keys import plain
        from tf_harness.experiments.config.schema import show

        model = plain(settings.model)  # the keys its config holds
        keys = ", ".join(f"model.{key}={show(model[key])}" for key in BUILDERS.options(model["name"]) if key in model)
        shape = "x".join(map(str, (*image_size, spec.channels)))
        raise ConfigError(f"model={model['name']}{f' ({keys})' if keys else ''} cannot be built for "
                          f"pipeline.image_size={show(plain(settings.pipeline.image_size))} ({shape} images): "
                          f"{keras_reason(error)}") from None


# Keras wraps a layer's error in lines of its own: which layer was called, with which arguments, in ANSI bold.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CALLING = re.compile(r"Exception encountered when calling (?:layer )?['\"]?(\w+)")
_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}")


def keras_reason(error) -> str:
    """The one line of what Keras or TensorFlow says went wrong: the layer it names, then its reason, without the
    arguments it dumps."""
    if isinstance(error, (MemoryError, tf.errors.ResourceExhaustedError)):
        # TensorFlow's: `{{function_node ...}} OOM when allocating tensor with shape[...] and type float on /job:...`
        text = _FUNCTION_NODE.sub("", (str(error).strip().splitlines() or [""])[0]).split(" on /job:")[0].strip()
        return f"out of memory ({text or type(error).__name__})"
    lines = [_ANSI.sub("", line).strip() for line in str(error).splitlines()]
    layer = next((match[1] for line in lines if (match := _CALLING.search(line))), None)
    reason = []
    for line in lines:
        if line.startswith("Arguments received by"):
            break
        if line and not _CALLING.search(line):
            reason.append(line)
    text = " ".join(reason) or type(error).__name__
    return f"{layer}: {text}" if layer else text


def _traced(function, **options):
    """`function` traced by tf.function as written, without AutoGraph: a choice on a tensor in the step and
    around it is tf.cond, tf.where or tf.while_loop, never a Python `if` or loop. Why: AutoGraph rewrites every
    function the step calls, in every new process, before the trace begins (docs/training-loop.md)."""
    return tf.function(function, autograph=False, **options)


def _is_float(variable):
    return tf.as_dtype(variable.dtype).is_floating


class Trainer:
    """Owns what a checkpoint holds, the traced train loop and the traced eval step.

    Batches of uint8 images arrive whole (global batches; under multi_worker a
    training batch is the worker's share) and are split evenly across replicas
    inside the step, so the input iterator stays a plain, checkpointable
    iterator under every strategy. Each replica then augments and
    normalises its share on its own device (data/preprocessing.py).

    With `trainer.accumulate_steps` N > 1, a step is one update over N batches: the loop fetches them in turn and
    stacks them, the step runs each through the model in a `tf.while_loop` (its augmentation seeded by the batch's
    number, global step × N + i) and applies the mean of their gradients once, the mean loss of one batch N
    times larger. The global step, and every count of steps, counts updates, and a checkpoint always falls
    between two updates, so there is no partial sum to save. The non-finite skip takes the update whole.

    With `trainer.clip_global_norm`, the gradients are scaled down so that their global norm (the norm of their
    sum over the replicas) is at most that; the norm before clipping is a train scalar, `gradient_norm`.

    A step whose loss, or gradients' global norm, is NaN or infinite is not applied:
    the weights, the optimizer and the batch-norm statistics stay as they were, and
    `nonfinite_in_a_row` counts it. Under float16 only the loss is checked, since the
    loss-scale optimizer skips overflowing scaled gradients itself, as it should.
    """

    def __init__(self, settings, spec, strategy, image_size, loss=None):
        """`loss`: the Task's `loss` (data/task.py), which the train and eval steps call; None: spec.task's default
        (data/losses.py)."""
        self.spec, self.strategy = spec, strategy
        self.loss = loss or functools.partial(losses.batch_loss, spec.task)
        self.replicas = strategy.num_replicas_in_sync
        self.global_batch_size = settings.pipeline.batch_size
        self.accumulate_steps = settings.trainer.accumulate_steps
        self.examples_per_step = self.global_batch_size * self.accumulate_steps  # batches of an update, together
        self.steps_per_loop = settings.trainer.steps_per_loop or default_steps_per_loop()
        if settings.trainer.steps_per_loop is None:
            log.info("trainer.steps_per_loop=null: %d step(s) per loop (%s)", self.steps_per_loop,
                     "a GPU or TPU is present" if self.steps_per_loop > 1 else "CPU alone")
        jit_compile = settings.trainer.jit_compile
        self.jit_compile = resolve_jit_compile(jit_compile, self.replicas, settings.deterministic)
        if self.jit_compile and self.replicas > 1:
            raise ConfigError(f"trainer.jit_compile=true needs one replica, and strategy={settings.strategy.name} "
                              f"runs {self.replicas}; set trainer.jit_compile=false or null")
        if jit_compile is None:
            log.info("trainer.jit_compile=null: %s", "each train step compiled with XLA (a GPU, one replica)"
                     if self.jit_compile else "no XLA (CPU alone, several replicas or deterministic)")
        # Before anything is traced: Grappler optimizes each function as it is first called.
        options = graph_optimizer.resolve(settings.trainer.graph_optimizer, accelerated())
        graph_optimizer.apply(options)
        if settings.trainer.graph_optimizer is None and options:  # null resolves to options on CPU alone, {} elsewhere
            log.info("trainer.graph_optimizer=null: %s (CPU alone)", options)
        self.max_nonfinite_steps = settings.trainer.max_nonfinite_steps
        self.clip_global_norm = settings.trainer.clip_global_norm
        self.input_device = input_device(settings.trainer.checkpoint_input, self.replicas)
        if self.input_device:
            log.info("trainer.checkpoint_input=false: training batches are copied to %s ahead of the step",
                     self.input_device)
        self.fetch_ahead = resolve_fetch_ahead(settings.trainer.fetch_ahead, self.replicas, self.input_device)
        if settings.trainer.fetch_ahead is None:
            log.info("trainer.fetch_ahead=null: %s", "each batch fetched while the step before it runs (a GPU or "
                     "TPU, one replica, batches from the host)" if self.fetch_ahead
                     else "each batch fetched after the step before it")
        self.mixed_precision = settings.pipeline.dtype == "float16"
        self.preprocess = settings.preprocessing()
        with strategy.scope():
            self.model = build_model(settings, spec, image_size)
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            # trainer.freeze and lr_multipliers (experiments/training/fine_tuning.py): what trains, at what rate.
            self.trained = fine_tuning.trained_variables(self.model, settings.trainer.freeze)
            factors = fine_tuning.multipliers(self.trained, settings.trainer.lr_multipliers)
            self.optimizer = _optimizer(settings.trainer, self.global_step, factors)
            if self.mixed_precision:
                self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
            # Keras 3 optimizers must create their slots before the first distributed step (keras#19246).
            self.optimizer.build(self.trained)
            # The best evaluation so far, with trainer.keep_best, early stopping or objective=best.
            self.progress = recipes.Progress() if recipes.tracks(settings.trainer) else None
            # Not checkpointed: a resumed run counts afresh.
            self.nonfinite_in_a_row = tf.Variable(0, dtype=tf.int64, trainable=False, name="nonfinite_in_a_row")
        self.input = LoopInput(settings.deterministic)
        self._swapped = self._said_averaged = False  # `averaged`
        self._before_loop = []  # `before_loop`
        # One traced step, called at both of the loop's call sites (`_train_loop`). With XLA the whole step, its
        # non-finite check, skip and counters included, is one cluster; the loop around it (iterator, clocks,
        # results) stays in the graph.
        self._step = _traced(self._step, jit_compile=True if self.jit_compile else None)
        self._batch_step = _traced(self.train_step)  # `_accumulated`'s, at its two call sites
        self.one_step = _traced(self._one_step)
        self._loop = _traced(self._train_loop)
        self._one = _traced(self._train_one)
        self.eval_step = _CheckedEvalStep(_traced(self._eval_step), self)

    def _per_replica(self, batch, axis=0):
        """`batch` split across the replicas along `axis` (1 for an update's stacked batches)."""
        if self.replicas == 1:
            return batch
        share = self.global_batch_size // self.replicas

        def split(context, tensor):
            # A training batch under multi_worker is the worker's share, split across its own replicas
            # (replica ids run worker by worker); any other batch is global, split across all of them.
            parts = tensor.shape[axis] // share
            return tf.split(tensor, parts, axis=axis)[context.replica_id_in_sync_group % parts]

        return self.strategy.experimental_distribute_values_from_function(
            lambda context: tf.nest.map_structure(lambda tensor: split(context, tensor), batch))

    def _gather(self, value):
        return self.strategy.gather(value, axis=0) if self.replicas > 1 else value

    # The step a researcher edits -------------------------------------------------------------------------------
    def train_step(self, step, features, labels, weights):
        """One batch, one replica's share of it: augment, forward, loss, gradients. Returns the loss (this replica's
        part of the mean over the global batch), the gradients of the trained variables, and a dict of the scalars
        it measured: each is averaged over the replicas and the loop's applied steps, and written as a train
        scalar (TensorBoard's train/, the log line, and `train/<name>` beside each evaluation in metrics.jsonl).
        Logging one more number is one more entry.

        This is the place to change what is trained; everything around it is the same for any step. `step` is
        the batch's number (with trainer.accumulate_steps, global step × N + i), which seeds its augmentation.
        Around it, from outside (`_replica_step`, `_step`, `_train_loop`): the split across replicas, gradient
        accumulation, clipping, the skip of a non-finite update, the update itself, the loop and its fetches.
        It is traced as written, without AutoGraph (`_traced`): a choice on a tensor is tf.cond or tf.where.
        """
        own = labels  # the examples' own labels, which the train accuracy scores, mixed or not
        # Augmentation and normalisation: the dataset's Preprocessing stage (data/preprocessing.py).
        features = self.preprocess(features, training=True, step=step)
        features, labels = self.preprocess.mix(features, labels, step)  # mixup, cutmix (off: as they were)
        with tf.GradientTape() as tape:
            logits = self.model(features, training=True)
            # The Task's loss (data/task.py `Task.loss`), summed over the batch. Divided by the global batch, not the
            # replica's: the all-reduce sums the replicas' gradients.
            loss = self.loss(labels, logits, weights) / self.global_batch_size
            if self.model.losses:  # the layers' regularisation terms, once over the replicas
                loss += tf.add_n(self.model.losses) / self.replicas
            scaled = self.optimizer.scale_loss(loss)  # float16: the loss-scale optimizer's scaling
        measured = _accuracy(self.spec.task, own, logits, weights)
        return loss, tape.gradient(scaled, self.trained), measured

    # What wraps the step -----------------------------------------------------------------------------------------
    def _replica_step(self, step, live, features, labels, weights):
        if self.accumulate_steps == 1:
            loss, gradients, measured = self.train_step(step, features, labels, weights)
        else:
            loss, gradients, measured = self._accumulated(step, features, labels, weights)
        gradients, norm = self._clipped(gradients)
        finite = self._finite(loss, gradients)
        applied = tf.logical_and(finite, live)
        self._apply_if(applied, gradients)
        measured = {name: tf.reshape(tf.cast(value, tf.float32), []) for name, value in measured.items()}
        if self.clip_global_norm is not None:  # the norm before clipping
            measured["gradient_norm"] = norm
        return loss, measured, applied

    def _accumulated(self, step, features, labels, weights):
        """`train_step` over an update's trainer.accumulate_steps batches, stacked on a first axis: the mean loss,
        the mean gradients and each measured scalar's mean. The first batch runs before a while loop over the
        rest, which so learns the measured dict's names; both call one traced step (`_batch_step`), so the step's
        graph holds the model once whatever the count."""
        count = self.accumulate_steps

        def batch(i):
            parts = tf.nest.map_structure(lambda tensor: tensor[i], (features, labels, weights))
            return self._batch_step(step * count + tf.cast(i, tf.int64), *parts)

        def added(sums, gradients):
            return [total if gradient is None else total + gradient for total, gradient in zip(sums, gradients)]

        def body(i, loss_sum, sums, measured_sums):
            loss, gradients, measured = batch(i)
            return (i + 1, loss_sum + loss, added(sums, gradients),
                    {name: total + measured[name] for name, total in measured_sums.items()})

        loss, gradients, measured = batch(0)
        start = (tf.constant(1), loss, added([tf.zeros(v.shape, v.dtype) for v in self.trained], gradients), measured)
        _, loss_sum, sums, measured = tf.while_loop(lambda i, *_: i < count, body, start)
        return loss_sum / count, [total / count for total in sums], {name: total / count
                                                                       for name, total in measured.items()}

    def _clipped(self, gradients):
        """`gradients` scaled to a global norm of at most trainer.clip_global_norm, and their global norm before
        (0 with clipping off). The norm is that of the gradients summed over the replicas, what the update
        applies, so with several replicas it costs one more all-reduce; each replica scales its own share by the
        same factor. A non-finite norm leaves the gradients as they are, for the non-finite skip."""
        if self.clip_global_norm is None:
            return gradients, tf.constant(0.0)
        summed = gradients
        if self.replicas > 1:
            summed = tf.distribute.get_replica_context().all_reduce("SUM", gradients)
        norm = tf.linalg.global_norm(summed)
        if self.mixed_precision:  # the gradients of the scaled loss: their norm over the loss scale
            norm = norm / tf.cast(self.optimizer.dynamic_scale, norm.dtype)
        limit = tf.constant(self.clip_global_norm, norm.dtype)
        factor = tf.where(tf.math.is_finite(norm), limit / tf.maximum(norm, limit), 1.0)
        return [None if gradient is None else gradient * tf.cast(factor, gradient.dtype)
                for gradient in gradients], norm

    def _finite(self, loss, gradients):
        """Whether every replica's loss (and, outside float16, gradient norm) is finite; the same on all."""
        finite = tf.math.is_finite(loss)
        if not self.mixed_precision:
            finite = tf.logical_and(finite, tf.math.is_finite(tf.linalg.global_norm(gradients)))
        # Every replica must take the same branch below: the update all-reduces across them.
        failed = tf.distribute.get_replica_context().all_reduce("SUM", tf.cast(tf.logical_not(finite), tf.float32))
        return failed == 0

    def _apply_if(self, finite, gradients):
        variables = self.trained

        def apply():
            self.optimizer.apply(gradients, variables)
            return tf.constant(True)

        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            return tf.cond(finite, apply, lambda: tf.constant(False))

        # A cond whose branch calls merge_call (the optimizer's all-reduce) must sit in the cross-replica
        # context, as Keras' LossScaleOptimizer does it.
        def cross_replica(strategy, finite):
            def apply_on_every_replica():
                strategy.extended.call_for_each_replica(apply)
                return tf.constant(True)

            finite = strategy.experimental_local_results(finite)[0]
            return tf.cond(finite, apply_on_every_replica, lambda: tf.constant(False))

        return tf.distribute.get_replica_context().merge_call(cross_replica, args=(finite,))

    def _step(self, live, features, labels, weights):
        """One train step in the cross-replica context; returns (measured, applied, in_a_row): `measured` is the
        step's loss, summed over the replicas, and each scalar `train_step` measured, averaged over them.

        `live` false (a device bool): the loop has stopped on `max_nonfinite_steps` in a row, and the step
        changes nothing: no update, no global step, no count. Deciding that on the device lets the loop
        run on without the host reading the count every step.
        """
        step = self.global_step.read_value()
        # The forward pass updates batch-norm statistics even when the step is then skipped: keep a copy.
        statistics = [v for v in self.model.non_trainable_variables if _is_float(v)]
        kept = [tf.identity(v.value) for v in statistics]
        stacked = 0 if self.accumulate_steps == 1 else 1  # the batch axis: an update's batches come stacked
        loss, measured, applied = self.strategy.run(
            self._replica_step, args=(step, live, *self._per_replica((features, labels, weights), stacked)))
        applied = self.strategy.experimental_local_results(applied)[0]  # the same on every replica
        for variable, value in zip(statistics, kept):
            variable.assign(tf.where(applied, variable.value, value))
        counted = tf.where(applied, tf.constant(0, tf.int64), self.nonfinite_in_a_row + 1)
        in_a_row = self.nonfinite_in_a_row.assign(tf.where(live, counted, self.nonfinite_in_a_row))
        self.global_step.assign_add(tf.cast(live, tf.int64))
        measured = {"loss": self.strategy.reduce("SUM", loss, axis=None),
                    **{name: self.strategy.reduce("MEAN", value, axis=None) for name, value in measured.items()}}
        return measured, applied, in_a_row

    def _one_step(self, features, labels, weights):
        """One whole traced step (split, accumulation, skip, update) on one batch (with trainer.accumulate_steps, the
        update's batches stacked): what it measured, the loss included. The runner trains with `train_loop`."""
        return self._step(tf.constant(True), features, labels, weights)[0]

    def _train_loop(self, iterator, steps):
        """Runs `steps` steps, or with `steps` None one step and no loop; returns the loop's results as
        tensors. The first step runs before the while loop, which so learns the names of what a step measures;
        both call the one traced `_step`. Once `max_nonfinite_steps` in a row were skipped, the loop's later
        steps take their batches but are not live (`_step`): the runner stops on the count, and a loop's first
        step is always live. How each step takes its batch (`ahead`: `trainer.fetch_ahead`):
        experiments/training/loop_input.py."""
        ahead = self.fetch_ahead and steps is not None

        def keep_going(i, *_):
            return i < steps  # on the host: the condition never waits for the device

        def body(i, in_a_row, ready_at, wait, sums, counts, applied, live_steps, fetched):
            batch = fetched  # fetched ahead, or () when each step fetches its own
            if not ahead:
                batch, waited = self._fetch(iterator, after=ready_at)
                wait += waited
            step_live = tf.logical_or(i == 0, in_a_row < self.max_nonfinite_steps)
            measured, step_applied, in_a_row = self._step(step_live, *batch)
            with tf.control_dependencies([*measured.values(), step_applied, in_a_row]):
                done_at = self.input.clock()
            if ahead:  # the next step's batch, while this one runs; none after the last, so the iterator
                # stands exactly at the steps taken (its checkpoint and the resume stay exact). Neither branch
                # takes anything of this step: a cond's branches wait for all its inputs.
                more = i + 1 < steps
                fetched, fetched_at = tf.cond(more, lambda: self._fetch_early(iterator),
                                              lambda: (batch, tf.constant(0.0, tf.float64)))
                wait += tf.where(more, tf.maximum(fetched_at - done_at, 0.0), 0.0)
            counted = {name: tf.logical_and(step_applied, tf.math.is_finite(value)) for name, value in measured.items()}
            sums = {name: (0.0 if sums is None else sums[name]) + tf.where(counted[name], value, 0.0)
                    for name, value in measured.items()}
            counts = {name: (0 if counts is None else counts[name]) + tf.cast(finite, tf.int32)
                      for name, finite in counted.items()}
            return (i + 1, in_a_row, done_at, wait, sums, counts, applied + tf.cast(step_applied, tf.int32),
                    live_steps + tf.cast(step_live, tf.int32), fetched)

        started_at, batch, wait = self.input.clock(), (), tf.constant(0.0, tf.float64)
        if ahead:  # the first batch before the loop, so every step in it finds its batch fetched
            batch, wait = self._fetch(iterator, after=started_at)
        start = (tf.constant(0), self.nonfinite_in_a_row.read_value(), started_at, wait, None, None, tf.constant(0),
                 tf.constant(0), batch)
        end = body(*start)
        # `_train_one` (steps None): the body once, with no loop for the graph optimizer to work through.
        if steps is not None:
            end = tf.while_loop(keep_going, body, end)
        _, in_a_row, _, wait, sums, counts, applied, live_steps, _ = end
        return {"steps": live_steps, "in_a_row": in_a_row, "wait": wait, "applied": applied, "sums": sums,
                "counts": counts}

    def _fetch(self, iterator, after):
        """A step's batch, fetched once `after` has run, and its wait; with trainer.accumulate_steps, its update's
        batches, fetched in turn and stacked, and their summed wait."""
        if self.accumulate_steps == 1:
            return self.input.fetch(iterator, after=after)
        batches, wait = [], tf.constant(0.0, tf.float64)
        for _ in range(self.accumulate_steps):
            batch, waited = self.input.fetch(iterator, after=after)
            batches.append(batch)
            wait, after = wait + waited, waited
        return _stacked(batches), wait

    def _fetch_early(self, iterator):
        """`LoopInput.fetch_early` of a step's batch, or of its update's batches, stacked."""
        if self.accumulate_steps == 1:
            return self.input.fetch_early(iterator)
        batches = [self.input.fetch_early(iterator) for _ in range(self.accumulate_steps)]
        return _stacked([batch for batch, _ in batches]), batches[-1][1]

    def input_iterator(self, data):
        """An iterator over the training input `data`, its batches copied to `input_device` ahead of the step where
        that is set."""
        if self.input_device is None:
            return make_iterator(data)
        return make_iterator(data.apply(tf.data.experimental.prefetch_to_device(self.input_device, buffer_size=2)))

    def first_update(self, first, iterator):
        """The iterator of the first train loop, one step: `first`, a one-batch iterator (the batch TensorBoard
        shows), and with trainer.accumulate_steps the rest of its update's batches, taken from `iterator` now, so
        that `iterator` moves by exactly the batches trained."""
        if self.accumulate_steps == 1:
            return first
        data = tf.data.Dataset.from_tensors(next(first))
        for _ in range(self.accumulate_steps - 1):
            data = data.concatenate(tf.data.Dataset.from_tensors(next(iterator)))
        return make_iterator(data)

    def _train_one(self, iterator):
        """One train step over `iterator`, with `_train_loop`'s results."""
        return self._train_loop(iterator, None)

    def before_loop(self, work) -> None:
        """Runs `work()` once, on the host, as the next train loop starts: what must be in every checkpoint saved
        after that loop but in none saved before it (the best evaluation's state, experiments/training/recipes.py)."""
        if work not in self._before_loop:
            self._before_loop.append(work)

    def train_loop(self, iterator, steps) -> LoopStats:
        """Runs up to `steps` train steps over `iterator` in one traced call (one trace serves
        every count) and reads the results back once. With steps_per_loop 1, every call is one step,
        traced without a while loop."""
        while self._before_loop:
            self._before_loop.pop(0)()
        started = time.perf_counter()
        if steps == 1 and self.steps_per_loop == 1:
            out = self._one(iterator)
        else:
            out = self._loop(iterator, tf.constant(steps, tf.int32))
        out = tf.nest.map_structure(lambda value: value.numpy(), out)  # the first read waits for the loop
        seconds = time.perf_counter() - started
        ran = int(out["steps"])  # only a step that ran (a live one) is ever applied
        return LoopStats(steps=ran, nonfinite=ran - int(out["applied"]), nonfinite_in_a_row=int(out["in_a_row"]),
                         wait=float(out["wait"]), seconds=seconds,
                         sums={name: float(value) for name, value in out["sums"].items()},
                         counts={name: int(value) for name, value in out["counts"].items()})

    def _eval_step(self, features, labels, weights):
        def replica_step(features, labels, weights):
            logits = self.model(self.preprocess(features, training=False), training=False)
            return self.loss(labels, logits, weights), tf.cast(logits, tf.float32)

        loss, logits = self.strategy.run(replica_step, args=self._per_replica((features, labels, weights)))
        return self.strategy.reduce("SUM", loss, axis=None), self._gather(logits)

    def all_finite(self) -> bool:
        """Whether every float variable of the model and the optimizer is finite.

        Checked on the host, as a checkpoint save reads them anyway: cheaper than tracing a check at the first
        save (docs/training-loop.md).
        """
        variables = [v for v in self.model.variables + self.optimizer.variables if _is_float(v)]
        return all(np.isfinite(v.numpy()).all() for v in variables)

    def checkpoint(self, iterator=None) -> tf.train.Checkpoint:
        """What a checkpoint holds: model, optimizer (with trainer.ema_decay, the moving averages), global step, random
        state, the best evaluation so far where the run tracks it (experiments/training/recipes.py) and, when given, the
        input iterator.

        Keras 3 leaves a Dropout layer's seed-generator state out of the model's checkpoint
        (checked: a restored model drew other masks), so a resumed run would diverge; it is saved
        beside the model. The step's augmentation draws are seeded by the global step.
        """
        random_state = [variable for variable in self.model.non_trainable_variables
                        if variable.path.endswith("seed_generator_state")]
        parts = dict(model=self.model, optimizer=self.optimizer, global_step=self.global_step,
                     random_state=random_state)
        if self.progress is not None:
            parts["progress"] = self.progress
        if iterator is not None:
            parts["input_iterator"] = iterator
        return tf.train.Checkpoint(**parts)

    @contextlib.contextmanager
    def averaged(self):
        """Inside the block the model holds the exponential moving average of its trained weights
        (trainer.ema_decay), and after it its own weights again, bit for bit, however the block ends (an interrupt
        during an evaluation included, so a checkpoint saved then holds the trained weights). Yields whether it
        swapped: not without EMA, nor before the first applied update, when there is no average yet. Evaluation,
        prediction, export and the sidecar evaluator run inside it. The swap is done here, not by Keras'
        `finalize_variable_values`, which overwrites the weights for good."""
        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)  # the loss-scale optimizer's
        if self._swapped or not optimizer.use_ema or int(optimizer._iterations.numpy()) == 0:
            yield False
            return
        pairs = list(zip(optimizer._trainable_variables, optimizer._model_variables_moving_average))
        kept = [tf.identity(variable) for variable, _ in pairs]
        if not self._said_averaged:
            log.info("trainer.ema_decay=%s: evaluation, prediction and export use the averaged weights",
                     optimizer.ema_momentum)
            self._said_averaged = True
        self._swapped = True
        try:
            for variable, average in pairs:
                variable.assign(average)
            yield True
        finally:
            for (variable, _), value in zip(pairs, kept):
                variable.assign(value)
            self._swapped = False

    @property
    def step(self) -> int:
        """The global step as a Python int (under any strategy)."""
        return int(self.global_step.read_value().numpy())

    @property
    def learning_rate(self) -> float:
        """The rate the next step applies: the schedule at the current global step (see `_optimizer`)."""
        return float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))


def _accuracy(task, labels, logits, weights) -> dict:
    """{"accuracy": the batch's weighted accuracy} for a binary or multiclass task (`labels`: the examples' own, a
    class index or 0/1 each); {} for a multi-label one, whose headline, the AUC, needs a whole split's scores."""
    if task == "multilabel":
        return {}
    logits = tf.cast(logits, tf.float32)
    if task == "multiclass":
        hits = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), tf.cast(tf.reshape(labels, [-1]), tf.int32))
    else:
        hits = tf.equal(tf.reshape(logits, [-1]) > 0, tf.reshape(labels, [-1]) > 0.5)
    weights = tf.cast(tf.reshape(weights, [-1]), tf.float32)
    return {"accuracy": tf.math.divide_no_nan(tf.reduce_sum(tf.cast(hits, tf.float32) * weights),
                                              tf.reduce_sum(weights))}


def _stacked(batches):
    """Batches of the same structure as one, each tensor stacked on a new first axis."""
    return tf.nest.map_structure(lambda *tensors: tf.stack(tensors), *batches)


def _optimizer(trainer_settings, global_step, multipliers=()):
    """The optimizer the trainer settings name, its schedule evaluated at `global_step`.

    Keras would evaluate a schedule at `optimizer.iterations`, which counts applied updates only, so
    each skipped non-finite step would shift the schedule one step later. The global step counts every
    step, as train_steps, warmup_steps, decay_steps and the TensorBoard x-axis do, so the schedule
    follows it: a cosine decay ends at train_steps, and the logged learning_rate at step S is the
    schedule's value at S. The constant default stays a plain float, so the optimizer keeps its
    `learning_rate` variable and checkpoints written before schedules existed still restore.
    """
    rate = optimizers.schedule(trainer_settings.schedule, trainer_settings.learning_rate, trainer_settings.train_steps,
                               warmup_steps=trainer_settings.warmup_steps, decay_steps=trainer_settings.decay_steps,
                               decay_rate=trainer_settings.decay_rate)
    return optimizers.optimizer(trainer_settings.optimizer, rate, step=global_step, momentum=trainer_settings.momentum,
                                weight_decay=trainer_settings.weight_decay, ema_decay=trainer_settings.ema_decay,
                                multipliers=multipliers)


class _CheckedEvalStep:
    """The traced eval step, with its summed loss checked on the host, which reads it anyway."""

    def __init__(self, traced, trainer):
        self.traced, self.trainer = traced, trainer

    def __call__(self, features, labels, weights):
        loss, logits = self.traced(features, labels, weights)
        if not np.isfinite(float(loss)):
            raise NonFiniteLossError(f"evaluation loss is {float(loss)} at global step {self.trainer.step}")
        return loss, logits

    def experimental_get_tracing_count(self):
        return self.traced.experimental_get_tracing_count()
