#!/usr/bin/env python
"""Which part of the trainer's loop costs it time over a bare step: the parts added one row at a time.

    python benchmarks/loop_overhead.py [--datasets lfw_pairs,imagenet_det] [--per-call 50] [--jit null]
                                       [--steps 200] [--rounds 3] [--override pipeline.cache=memory ...]

benchmarks/host_loss.py measures how far the trainer's loop is from a bare step; this says where the gap
opens. Every row runs --per-call steps in one traced call. Rows 1 to 6 are a tf.while_loop written here,
independently of experiments/, around the yardstick of benchmarks/step_cost.py (a plain Keras train step
on its own instance of the dataset's default model), and each adds one thing the trainer's loop does per
step to the row above it:

1. resident: the step on one training batch held on the device; the loop counts steps, nothing more.
2. + iterator: that batch taken with next() from an iterator repeating it from memory: the fetch and
   the copy to the device of every step, with no decoding.
3. + clocks: the input-wait timing of experiments/trainer.py: a timestamp on each side of the fetch,
   which is asked for only once the previous step has finished, and the step started after the second.
4. + device condition: the loop also stops on a count of non-finite losses held in a variable on the
   device, as the trainer's does, so the host reads a device value before each step.
5. + results: each step's logits and labels written to TensorArrays, stacked and read back per call.
6. + pipeline: the run's own training pipeline (input_fn, as the runner builds it) in place of the
   repeated batch.
7. trainer: `Trainer.train_loop(iterator, per_call)` over that pipeline, as the runner calls it: the
   trainer's own step (augmentation, non-finite checks and skip, batch-norm statistics kept for a skip,
   the global step) in place of the bare one.

With --jit true the bare step is compiled with XLA and the loop around it is not, as the trainer does
with trainer.jit_compile=true; --jit null takes the trainer's default here (the row names say which).
Each --override (a Hydra override, e.g. pipeline.cache=memory, which takes decoding out of DET's pipeline;
LFW's drawn training pairs are never cached) applies to every row's config, the trainer's included.
Rows run in paired rounds, the order rotated every round, so drift and other processes' load fall on
every row alike. Reported per row (medians over rounds): steps/s, images/s (an LFW example is two
images), images per CPU-second of this process (os.times: every thread, tf.data's included), the input
wait fraction where the row times it, the per-round ratio of time per step to the resident row's, and
the milliseconds per step the row adds to the row above it, with their spread (min–max over rounds).
The devices TensorFlow sees and the 1-minute load average (before and after) are printed first and last.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import data_api  # noqa: E402
from step_cost import (for_each_dataset, keras_step, loop_row, rotated_rounds, saved_ms, settings,  # noqa: E402
                       spread)
from tf_harness.experiments import strategies  # noqa: E402
from tf_harness.experiments.trainer import Trainer, resolve_jit_compile  # noqa: E402


class Parts(NamedTuple):
    """What a bare row's loop does besides the step."""

    source: str  # "resident": the batch held on the device; "repeated": it, from memory; "pipeline": input_fn's
    clocks: bool = False
    device_condition: bool = False
    results: bool = False


ROWS = {
    "1. resident": Parts("resident"),
    "2. + iterator": Parts("repeated"),
    "3. + clocks": Parts("repeated", clocks=True),
    "4. + device condition": Parts("repeated", clocks=True, device_condition=True),
    "5. + results": Parts("repeated", clocks=True, device_condition=True, results=True),
    "6. + pipeline": Parts("pipeline", clocks=True, device_condition=True, results=True),
}
TRAINER = "7. trainer"
MAX_NONFINITE = 3  # the trainer's default trainer.max_nonfinite_steps


def bare_loop(step, fetch, per_call, parts, labels_dtype):
    """A traced call of `per_call` steps of `step` on the batches `fetch()` gives, with `parts`; a run of it
    returns the input wait of its steps in seconds (0 without clocks)."""
    nonfinite = tf.Variable(0, dtype=tf.int64, trainable=False)  # on the device, as the trainer's counter

    def keep_going(i, in_a_row, *_):
        going = i < per_call
        if parts.device_condition:
            going = tf.logical_and(going, tf.logical_or(i == 0, in_a_row < MAX_NONFINITE))
        return going

    def body(i, in_a_row, ready_at, wait, loss_sum, logits, labels):
        if parts.clocks:
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
        return sum(float(out["wait"]) for out in calls)
    return run


def rows(cfg, info, per_call, jit_compile, overrides):
    """Each row as a function that runs `steps` steps, waits for their results and returns their input wait."""
    pipeline = iter(data_api.train_input(cfg, info.table, workdir=None, seed=cfg.seed))
    host_batch = next(pipeline)
    device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
    with tf.device(device):
        resident = tf.nest.map_structure(tf.identity, host_batch)
    repeated = iter(tf.data.Dataset.from_tensors(host_batch).repeat())
    sources = {"resident": lambda: resident, "repeated": lambda: next(repeated), "pipeline": lambda: next(pipeline)}
    yardstick = keras_step(cfg, info.spec, info.size)
    yardstick(*resident)  # builds the model and Adam's slots outside the loops, as a traced loop needs
    # As the trainer's trainer.jit_compile: the step one XLA cluster, the loop around it in the graph.
    step = tf.function(yardstick.python_function, jit_compile=True) if jit_compile else yardstick.python_function
    timed = {name: bare_loop(step, sources[parts.source], per_call, parts, host_batch[1].dtype)
             for name, parts in ROWS.items()}
    trainer = Trainer(data_api.compose_defaults(cfg.dataset.name, *overrides,
                                                f"trainer.jit_compile={str(jit_compile).lower()}"),
                      info.spec, strategies.make_strategy(cfg.strategy), info.size)
    timed[TRAINER] = loop_row(trainer, pipeline, per_call)
    return timed


def bench(dataset, per_call, jit, steps, rounds, overrides):
    cfg = data_api.compose_defaults(dataset, *overrides)
    tf.keras.utils.set_random_seed(cfg.seed)
    info = data_api.describe(cfg)
    jit_compile = resolve_jit_compile(None if jit == "null" else jit == "true", replicas=1, deterministic=False)
    steps = per_call * max(1, steps // per_call)  # whole calls
    timed = rows(cfg, info, per_call, jit_compile, overrides)
    started = time.perf_counter()
    for run in timed.values():  # traces, then a warm-up that fills the pipeline's buffers
        run(per_call)
        run(per_call)
    print(f"{dataset}: {settings(cfg)}, "
          f"step jit_compile={jit_compile}, {per_call} steps per call, {steps} steps per row, {rounds} rounds; "
          f"traces + warm-up {time.perf_counter() - started:.1f} s", flush=True)
    results = rotated_rounds(timed, steps, rounds)
    images = cfg.pipeline.batch_size * (2 if info.spec.paired else 1) * steps
    print(f"\n| {dataset} row | steps/s | images/s | images/CPU-s | input wait | time per step ÷ resident (min–max) "
          f"| ms per step added to the row above (min–max) |\n|---|---|---|---|---|---|---|")
    names = list(results)
    for above, name in zip([None] + names, names):
        runs = results[name]
        rate = statistics.median(steps / run.seconds for run in runs)
        clocked = name == TRAINER or ROWS[name].clocks
        wait = f"{statistics.median(run.value / run.seconds for run in runs):.3f}" if clocked else "—"
        added = "—" if above is None else spread(saved_ms(runs, results[above], steps), 2)
        print(f"| {name} | {rate:.1f} | {rate * images / steps:.0f} | "
              f"{statistics.median(images / run.cpu for run in runs):.0f} | {wait} | "
              f"{spread([run.seconds / base.seconds for run, base in zip(runs, results[names[0]])])} | {added} |",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="lfw_pairs,imagenet_det")
    parser.add_argument("--per-call", type=int, default=50, help="steps per traced call (trainer.steps_per_loop)")
    parser.add_argument("--jit", default="null", choices=("null", "true", "false"),
                        help="XLA for the step, as trainer.jit_compile; null: the trainer's default here")
    parser.add_argument("--steps", type=int, default=200, help="steps per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--override", action="append", default=[], help="a Hydra override for every row, repeatable")
    args = parser.parse_args()
    for_each_dataset(args.datasets.split(","),
                     lambda dataset: bench(dataset, args.per_call, args.jit, args.steps, args.rounds, args.override))


if __name__ == "__main__":
    main()
