#!/usr/bin/env python
"""How much of a train step is lost to the host: the trainer's loops against a device-bound ceiling.

    python benchmarks/host_loss.py [--datasets lfw_pairs,imagenet_det] [--loops 1,10,50]
                                   [--jit null] [--steps 200] [--rounds 3] [--override pipeline.cache=memory ...]

Rows per dataset, each timed after its trace and warm-up:
- ceiling, N per call: the yardstick of benchmarks/step_cost.py (one plain Keras train step: cast
  and scale, forward, cross-entropy, gradients, Adam's apply, on its own instance of the dataset's
  default model), written independently of experiments/, run N times inside one tf.function over
  one training batch held on the device, for each N of --loops. The host takes part once per call
  and no input is read, so at the longest N this is what a step costs when nothing waits on the
  host, and the shortest against the longest is what looping gains a step with no host work of
  its own (printed after the table, with the time per step it saves).
- ceiling XLA: the longest loop compiled whole with XLA (jit_compile): one launch per loop.
- loop N, jit J: `Trainer.train_loop(iterator, N)` over the run's training pipeline (input_fn,
  as the runner builds it for the dataset's defaults), as the runner calls it, with
  trainer.steps_per_loop N and trainer.jit_compile J (each J of --jit: its own Trainer).

Each --override (a Hydra override, e.g. pipeline.cache=memory, which takes decoding out of DET's rows; LFW's
drawn training pairs are never cached) applies to every row's config.

Host loss of a row = 1 - (the fastest ceiling's time per step / the row's), per round: the share
of the row's step time in which the device could have been computing. The trainer's own extra
device work (augmentation, the non-finite checks) counts as loss too, so the figure bounds the
host's share from above. Rows run in paired rounds, the order rotated every round, so drift and
other processes' load fall on every row alike. Reported per row (medians over rounds): steps/s,
images/s (an LFW example is two images), images per CPU-second of this process (os.times: every
thread, tf.data's included), the input-wait fraction, and the per-round ratio of time per step
to the fastest ceiling's and the host loss, with their spread (min–max over rounds). The devices
TensorFlow sees and the 1-minute load average (before and after) are printed first and last.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import data_api  # noqa: E402
from step_cost import (for_each_dataset, keras_step, loop_row, rotated_rounds, saved_ms, settings,  # noqa: E402
                       spread)
from tf_harness.experiments import strategies  # noqa: E402
from tf_harness.experiments.trainer import Trainer  # noqa: E402


def ceiling_row(cfg, info, batch, per_loop, jit_compile):
    """A ceiling: the yardstick's step `per_loop` times in one traced loop over a device-resident batch."""
    step = keras_step(cfg, info.spec, info.size).python_function
    device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
    with tf.device(device):
        batch = tf.nest.map_structure(tf.identity, batch)
    step(*batch)  # builds the model and Adam's slots outside the loop, as a traced loop needs

    @tf.function(jit_compile=jit_compile)
    def loop():
        if per_loop == 1:  # one step a call, with no while loop, as the trainer's loop of 1
            return step(*batch)[0]
        loss = tf.constant(0.0)
        for _ in tf.range(per_loop):
            loss = step(*batch)[0]
        return loss

    def run(steps):
        for _ in range(steps // per_loop):
            float(loop())  # the read waits for the loop's last step
        return 0.0  # no input read, so no input wait
    return run


def bench(dataset, loops, jits, steps, rounds, overrides):
    cfg = data_api.compose_defaults(dataset, *overrides)
    tf.keras.utils.set_random_seed(cfg.seed)
    info = data_api.describe(cfg)
    strategy = strategies.make_strategy(cfg.strategy)
    iterator = iter(data_api.train_input(cfg, info.table, workdir=None, seed=cfg.seed))
    steps = max(loops) * max(1, steps // max(loops))  # whole loops of every length
    batch = next(iterator)
    # A ceiling per loop length: what looping alone gains for a step with no host work of its own.
    rows = {f"ceiling, {n} per call": ceiling_row(cfg, info, batch, n, False) for n in loops}
    rows[f"ceiling XLA, {max(loops)} per call"] = ceiling_row(cfg, info, batch, max(loops), True)
    for jit in jits:
        trainer = Trainer(data_api.compose_defaults(dataset, *overrides, f"trainer.jit_compile={jit}"), info.spec,
                          strategy, info.size)
        rows.update({f"loop {n}, jit {trainer.jit_compile}": loop_row(trainer, iterator, n) for n in loops})
    started = time.perf_counter()
    for name, run in rows.items():  # traces, then a warm-up that fills the pipeline's buffers and cache
        run(max(loops))
        run(max(loops))
    print(f"{dataset}: {settings(cfg)}, "
          f"{steps} steps per row, {rounds} rounds; traces + warm-up {time.perf_counter() - started:.1f} s", flush=True)
    results = rotated_rounds(rows, steps, rounds)
    images = cfg.pipeline.batch_size * (2 if info.spec.paired else 1) * steps
    print(f"\n| {dataset} row | steps/s | images/s | images/CPU-s | input wait | time per step ÷ fastest ceiling "
          f"(min–max) | host loss (min–max) |\n|---|---|---|---|---|---|---|")
    ceiling_names = [name for name in results if name.startswith("ceiling")]
    ceilings = [min(runs, key=lambda run: run.seconds) for runs in zip(*(results[name] for name in ceiling_names))]
    for name, runs in results.items():
        ratios = [run.seconds / base.seconds for run, base in zip(runs, ceilings)]
        rate = statistics.median(steps / run.seconds for run in runs)
        print(f"| {name} | {rate:.1f} | {rate * images / steps:.0f} | "
              f"{statistics.median(images / run.cpu for run in runs):.0f} | "
              f"{statistics.median(run.value / run.seconds for run in runs):.3f} | "
              f"{spread(ratios)} | {spread([1 - 1 / ratio for ratio in ratios])} |", flush=True)
    shortest, longest = (results[f"ceiling, {n} per call"] for n in (min(loops), max(loops)))
    gains = [short.seconds / long.seconds for short, long in zip(shortest, longest)]
    print(f"{dataset}: looping gains the bare step {spread(gains)}× in steps/s at {max(loops)} vs {min(loops)} per "
          f"call, saving {spread(saved_ms(shortest, longest, steps), 2)} ms per step: the host's cost of a call",
          flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="lfw_pairs,imagenet_det")
    parser.add_argument("--loops", default="1,10,50", help="steps_per_loop values, and the ceilings' steps per call")
    parser.add_argument("--jit", default="null", help="trainer.jit_compile values, e.g. false,true; null: the default")
    parser.add_argument("--steps", type=int, default=200, help="steps per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--override", action="append", default=[], help="a Hydra override for every row, repeatable")
    args = parser.parse_args()
    loops = [int(n) for n in args.loops.split(",")]
    for_each_dataset(args.datasets.split(","),
                     lambda dataset: bench(dataset, loops, args.jit.split(","), args.steps, args.rounds, args.override))


if __name__ == "__main__":
    main()
