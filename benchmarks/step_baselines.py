"""The independent train steps and loops the trainer is measured against, written here without
experiments/: a yardstick or a ceiling is never the code under test.

- `keras_step`: the yardstick, one plain traced Keras train step (cast and scale the images, forward,
  cross-entropy, gradients, Adam's apply) on its own instance of the dataset's default model.
- `ceiling_loop`: that step N times inside one tf.function over one batch held on the device: the host
  takes part once per call and reads no input, so it is what a step costs when nothing waits on the host.
- `bare_loop`: a tf.while_loop around the step with the trainer loop's parts switched on one at a time
  (`PARTS`): the iterator, the input-wait clocks, the results read back, and the run's own pipeline; and
  beside them (`ASIDES`) what the trainer's loop does not do: a loop condition that reads a count kept on
  the device every step, and an iterator that copies its batches to the device ahead of the step.
"""
from typing import NamedTuple

import keras
import tensorflow as tf

from tf_harness.models import BUILDERS

MAX_NONFINITE = 3  # the trainer's default trainer.max_nonfinite_steps


def keras_step(cfg, spec, image_size, jit_compile=False):
    """The yardstick: a plain traced train step on a fresh instance of the default model, with Adam;
    returns (loss, logits). With `jit_compile`, compiled with XLA as the trainer's step is then."""
    model = BUILDERS[cfg.model.name](cfg.model, spec, image_size)
    optimizer = keras.optimizers.Adam(cfg.trainer.learning_rate)
    if spec.task == "multiclass":
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def step(features, labels, weights):
        features = tf.nest.map_structure(lambda images: tf.cast(images, tf.float32) / 127.5 - 1.0, features)
        if spec.task != "multiclass":  # multi-label or binary targets, shaped as the logits
            labels = tf.reshape(tf.cast(labels, tf.float32), [tf.shape(labels)[0], -1])
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = loss_fn(labels, logits, sample_weight=weights)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(gradients, model.trainable_variables)
        return loss, logits

    return tf.function(step, jit_compile=jit_compile or None)


def first_device():
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


def on_device(batch):
    """`batch` copied to the first GPU, or kept on the CPU where there is none."""
    with tf.device(first_device()):
        return tf.nest.map_structure(tf.identity, batch)


def prefetched(batches, buffer_size=2):
    """An iterator over the dataset `batches` that tf.data copies to the first GPU (or CPU) ahead of its use."""
    return iter(batches.apply(tf.data.experimental.prefetch_to_device(first_device(), buffer_size)))


def ceiling_loop(cfg, info, batch, per_call, jit_compile):
    """A ceiling: the yardstick's step `per_call` times in one traced call over a device-resident batch; a
    run of it returns None (no input is read, so no input wait)."""
    step = keras_step(cfg, info.spec, info.size).python_function
    batch = on_device(batch)
    step(*batch)  # builds the model and Adam's slots outside the loop, as a traced loop needs

    @tf.function(jit_compile=jit_compile)
    def loop():
        if per_call == 1:  # one step a call, with no while loop, as the trainer's loop of 1
            return step(*batch)[0]
        loss = tf.constant(0.0)
        for _ in tf.range(per_call):
            loss = step(*batch)[0]
        return loss

    def run(steps):
        for _ in range(steps // per_call):
            float(loop())  # the read waits for the loop's last step
        return None
    return run


class Parts(NamedTuple):
    """What a bare loop does besides the step."""

    source: str  # "resident": the batch held on the device; "repeated": it, from memory; "prefetched": it, from
    # memory through tf.data's prefetch_to_device; "pipeline": input_fn's
    clocks: bool = False
    device_condition: bool = False
    results: bool = False


PARTS = {
    "1. resident": Parts("resident"),
    "2. + iterator": Parts("repeated"),
    "3. + clocks": Parts("repeated", clocks=True),
    "4. + results": Parts("repeated", clocks=True, results=True),
    "5. + pipeline": Parts("pipeline", clocks=True, results=True),
}
# Not the trainer's parts, each beside the row it adds to: {name: (that row, parts)}.
# - The loop's condition reading the non-finite count, kept on the device, every step. On a GPU that read waits
#   for each step to finish before the host may fetch and launch the next one; the trainer's loop keeps its
#   stop on the device instead.
# - The batches copied to the device by tf.data ahead of the step (`prefetch_to_device`), where the trainer's
#   step takes host batches and TensorFlow copies each as the step starts, after the steps queued before it.
#   Such an iterator cannot be saved in a checkpoint (TensorFlow 2.21). benchmarks/steps.py adds the trainer
#   over the run's pipeline so prefetched, beside the trainer's row.
ASIDES = {"3. + device condition": ("3. + clocks", Parts("repeated", clocks=True, device_condition=True)),
          "2. + iterator, prefetched to the device": ("1. resident", Parts("prefetched"))}


def bare_loop(step, fetch, per_call, parts, labels_dtype):
    """A traced call of `per_call` steps of `step` on the batches `fetch()` gives, with `parts`; a run of it
    returns the input wait of its steps in seconds (None without clocks)."""
    nonfinite = tf.Variable(0, dtype=tf.int64, trainable=False)  # on the device, as the trainer's counter

    def keep_going(i, in_a_row, *_):
        going = i < per_call
        if parts.device_condition:
            going = tf.logical_and(going, tf.logical_or(i == 0, in_a_row < MAX_NONFINITE))
        return going

    def body(i, in_a_row, ready_at, wait, loss_sum, logits, labels):
        if parts.clocks:  # as experiments/training/trainer.py: ask once the step is done, start it after the fetch
            with tf.control_dependencies([ready_at]):
                asked_at = tf.timestamp()
            with tf.control_dependencies([asked_at]):
                batch = fetch()
            with tf.control_dependencies(tf.nest.flatten(batch)):
                fetched_at = tf.timestamp()
            with tf.control_dependencies([fetched_at]):
                batch = tf.nest.map_structure(tf.identity, batch)
            wait += fetched_at - asked_at
        else:
            batch = fetch()
        loss, step_logits = step(*batch)
        if parts.device_condition:
            in_a_row = nonfinite.assign(tf.where(tf.math.is_finite(loss), tf.constant(0, tf.int64), nonfinite + 1))
        if parts.clocks:
            with tf.control_dependencies([loss, step_logits, in_a_row]):
                ready_at = tf.timestamp()
        if parts.results:
            logits, labels = logits.write(i, tf.cast(step_logits, tf.float32)), labels.write(i, batch[1])
        return i + 1, in_a_row, ready_at, wait, loss_sum + loss, logits, labels

    @tf.function
    def call():
        start = (tf.constant(0), nonfinite.read_value(), tf.timestamp(), tf.constant(0.0, tf.float64),
                 tf.constant(0.0), tf.TensorArray(tf.float32, size=0, dynamic_size=True),
                 tf.TensorArray(labels_dtype, size=0, dynamic_size=True))
        _, _, _, wait, loss_sum, logits, labels = tf.while_loop(keep_going, body, start)
        out = {"loss_sum": loss_sum, "wait": wait}
        if parts.results:
            out.update(logits=logits.stack(), labels=labels.stack())
        return out

    def run(steps):
        calls = [{key: value.numpy() for key, value in call().items()} for _ in range(steps // per_call)]
        return sum(float(out["wait"]) for out in calls) if parts.clocks else None
    return run
