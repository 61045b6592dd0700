#!/usr/bin/env python
"""What the trainer's traced train step costs over a minimal Keras train step on the same model and batches.

    python benchmarks/step_cost.py [--dataset chest_xray] [--steps 10] [--rounds 3] [--loops 1,10]
    python benchmarks/step_cost.py --first-calls 3 [--dataset chest_xray] [--loops 1]

Rows, each timed after its trace and warm-up (start-up and tracing left out):
- keras: the yardstick, written here independently of experiments/: one plain tf.function
  (cast and scale the images, forward, cross-entropy, gradients, Adam's apply), called once
  per batch, on its own instance of the dataset's default model.
- step: the Trainer's one-step tf.function (`Trainer.train_step`): its augmentation, the
  non-finite checks and skip, the batch-norm statistics kept for a skip, the global step.
- loop N: `Trainer.train_loop(iterator, N)`, what the runner calls: the same step inside a
  tf.while_loop with its clock ops and the results read back once per loop. On CPU alone, where
  trainer.steps_per_loop defaults to 1, loop 1 is that body traced once without the while loop.

Every row reads the same few batches of the project's training pipeline, cached in memory
and repeated, so the input costs next to nothing and only the step is compared. Rows run in
paired rounds, the order rotated every round, so drift and other processes' load fall on
every row alike. Reported per row (medians over rounds): steps/s, images per CPU-second of
this process (os.times: every thread of TensorFlow's pools), and the median per-round ratio
of the row's time per step to the yardstick's, with its spread (min–max over rounds). The
1-minute load average is printed before and after.

With --first-calls N, it times start-up instead: each row's first call of one step (loop
rows: one loop), trace and graph optimization included, each in a fresh process of its own,
so no row inherits another's warm caches; N paired rounds, the order rotated every round.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import data_api  # noqa: E402
from tf_harness.experiments import strategies  # noqa: E402
from tf_harness.experiments.trainer import Trainer  # noqa: E402
from tf_harness.models import BUILDERS  # noqa: E402

CACHED_BATCHES = 4


def keras_step(cfg, spec, image_size):
    """The yardstick: a plain traced train step on a fresh instance of the default model, with Adam;
    returns (loss, logits)."""
    model = BUILDERS[cfg.model.name](cfg.model, spec, image_size)
    optimizer = keras.optimizers.Adam(cfg.trainer.learning_rate)
    if spec.task == "multiclass":
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
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

    return step


def build(dataset):
    """The dataset's default config, a Trainer, the yardstick's step, and an iterator over a few cached
    batches of the training pipeline; and images per example."""
    cfg = data_api.compose_defaults(dataset)
    tf.keras.utils.set_random_seed(cfg.seed)
    info = data_api.describe(cfg)
    trainer = Trainer(cfg, info.spec, strategies.make_strategy(cfg.strategy), info.size)
    batches = data_api.train_input(cfg, info.table, workdir=None, seed=cfg.seed).take(CACHED_BATCHES).cache()
    iterator = iter(batches.repeat())
    for _ in range(CACHED_BATCHES):  # fills the cache, so no row pays for the pipeline's start
        next(iterator)
    return cfg, trainer, keras_step(cfg, info.spec, info.size), iterator, 2 if info.spec.paired else 1


def rows(trainer, yardstick, iterator, loops):
    """Each row as a function that runs `steps` steps and waits for their results."""
    def keras_row(steps):
        for _ in range(steps):
            loss = yardstick(*next(iterator))[0]
        float(loss)

    def step_row(steps):
        for _ in range(steps):
            loss = trainer.train_step(*next(iterator))[0]
        float(loss)

    return {"keras": keras_row, "step": step_row, **{f"loop {n}": loop_row(trainer, iterator, n) for n in loops}}


def loop_row(trainer, iterator, per_loop):
    """The trainer's loops of `per_loop` steps, as the runner calls them; a run returns its steps' input
    wait in seconds."""
    def run(steps):
        return sum(trainer.train_loop(iterator, per_loop).wait for _ in range(steps // per_loop))
    return run


class Timing(NamedTuple):
    seconds: float  # wall
    cpu: float  # this process, every thread (os.times)
    value: Any  # what the row returned (host_loss.py, loop_overhead.py: its input wait)


def measure(run, steps) -> Timing:
    """The wall and CPU seconds of `steps` steps of `run`."""
    times, started = os.times(), time.perf_counter()
    value = run(steps)
    seconds, after = time.perf_counter() - started, os.times()
    return Timing(seconds, (after.user - times.user) + (after.system - times.system), value)


def rotated_rounds(timed, steps, rounds):
    """Each row's Timings over `rounds` paired rounds, the order rotated every round, so drift and other
    processes' load fall on every row alike."""
    names = list(timed)
    results = {name: [] for name in names}
    for number in range(rounds):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(measure(timed[name], steps))
    return results


def first_call(dataset, name, loops):
    """In this process: the first call of one step (loop rows: one loop of N) of row `name`."""
    _, trainer, yardstick, iterator, _ = build(dataset)
    run = rows(trainer, yardstick, iterator, loops)[name]
    timing = measure(run, int(name.split()[1]) if name.startswith("loop") else 1)
    print(json.dumps({"seconds": timing.seconds, "cpu": timing.cpu}))


def first_calls(args, loops):
    """Paired rounds of first calls, one fresh process per row and round; the table of CPU-seconds."""
    names = ["keras", "step", *(f"loop {n}" for n in loops)]
    results = {name: [] for name in names}
    for number in range(args.first_calls):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            out = subprocess.run([sys.executable, __file__, "--dataset", args.dataset, "--loops", args.loops,
                                  "--first-of", name], check=True, capture_output=True, text=True).stdout
            results[name].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {number + 1}, {name}: {results[name][-1]['cpu']:.1f} CPU-s", flush=True)
    print(f"\n{args.dataset}: first calls, {args.first_calls} rounds\n"
          "| row | seconds | CPU-s (min–max) | CPU-s ÷ keras (min–max) |\n|---|---|---|---|")
    for name in names:
        cpu = [run["cpu"] for run in results[name]]
        ratios = [run["cpu"] / base["cpu"] for run, base in zip(results[name], results["keras"])]
        print(f"| {name} | {statistics.median(run['seconds'] for run in results[name]):.1f} | "
              f"{spread(cpu, 1)} | {spread(ratios)} |")


def for_each_dataset(datasets, bench):
    """Runs `bench(dataset)` for each of `datasets` between the lines a loop benchmark's output starts and
    ends with: its command, the devices TensorFlow sees, and the 1-minute load average before and after."""
    print(f"command: python benchmarks/{Path(sys.argv[0]).name} " + shlex.join(sys.argv[1:]))
    devices = [device.name for device in tf.config.list_logical_devices()]
    details = [tf.config.experimental.get_device_details(gpu).get("device_name", "?")
               for gpu in tf.config.list_physical_devices("GPU")]
    print(f"devices: {devices} {details}; TensorFlow {tf.__version__}")
    print(f"load average (1 min) before: {os.getloadavg()[0]:.2f}; cores: {len(os.sched_getaffinity(0))}")
    for dataset in datasets:
        bench(dataset)
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")


def settings(cfg) -> str:
    """The run settings a benchmark's rows share, as its header names them."""
    return (f"model={cfg.model.name} batch={cfg.pipeline.batch_size} image_size={cfg.pipeline.image_size} "
            f"cache={cfg.pipeline.cache}")


def spread(values, digits=3):
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def saved_ms(base_runs, runs, steps):
    """Per round, the milliseconds per step that `runs` took less than `base_runs`."""
    return [1000 * (base.seconds - run.seconds) / steps for base, run in zip(base_runs, runs)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="chest_xray")
    parser.add_argument("--steps", type=int, default=10, help="steps per row and round")
    parser.add_argument("--rounds", type=int, default=3, help="0: only the first calls (the traces)")
    parser.add_argument("--loops", default="1,10", help="train_loop lengths to time")
    parser.add_argument("--first-calls", type=int, default=0, help="rounds of start-up timing instead")
    parser.add_argument("--first-of", help=argparse.SUPPRESS)  # a --first-calls child: the row to time
    args = parser.parse_args()
    loops = [int(n) for n in args.loops.split(",")]
    if args.first_of:
        return first_call(args.dataset, args.first_of, loops)
    steps = max(loops) * max(1, args.steps // max(loops))  # whole loops of every length
    print("command: python benchmarks/step_cost.py " + shlex.join(sys.argv[1:]))
    print(f"load average (1 min) before: {os.getloadavg()[0]:.2f}; cores: {len(os.sched_getaffinity(0))}")
    if args.first_calls:
        first_calls(args, loops)
        print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")
        return None
    cfg, trainer, yardstick, iterator, images_per_example = build(args.dataset)
    timed = rows(trainer, yardstick, iterator, loops)
    for name, run in timed.items():
        # The first call traces (the loop rows share one trace: the first of them pays it); the second warms up.
        count = int(name.split()[1]) if name.startswith("loop") else 1
        first, second = measure(run, count), measure(run, count)
        print(f"{name}: first call of {count} step(s) {first.seconds:.1f} s ({first.cpu:.1f} CPU-s), "
              f"the second {second.seconds:.1f} s ({second.cpu:.1f} CPU-s)", flush=True)
    results = rotated_rounds(timed, steps, args.rounds)
    if args.rounds:
        report(args, cfg, results, steps, cfg.pipeline.batch_size * images_per_example * steps)
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")


def report(args, cfg, results, steps, images):
    """The table: medians over rounds, and per-round ratios to the yardstick with their spread."""
    print(f"\n{args.dataset}: {settings(cfg)}, {steps} steps per row, {args.rounds} rounds")
    print("| row | steps/s | images/CPU-s | time per step ÷ keras (min–max) | CPU per step ÷ keras (min–max) |\n"
          "|---|---|---|---|---|")
    for name in results:
        ratios = [run.seconds / base.seconds for run, base in zip(results[name], results["keras"])]
        cpu_ratios = [run.cpu / base.cpu for run, base in zip(results[name], results["keras"])]
        rate = statistics.median(steps / run.seconds for run in results[name])
        per_cpu = statistics.median(images / run.cpu for run in results[name])
        print(f"| {name} | {rate:.3f} | {per_cpu:.1f} | "
              f"{spread(ratios)} | {spread(cpu_ratios)} |")


if __name__ == "__main__":
    main()
