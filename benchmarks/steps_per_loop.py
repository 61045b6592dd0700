#!/usr/bin/env python
"""Train steps/s at trainer.steps_per_loop 1 vs 50, on each dataset's default model and input.

    python benchmarks/steps_per_loop.py [--datasets lfw_pairs,imagenet_det] [--loops 1,50]
                                        [--rounds lfw_pairs=3,imagenet_det=1]
                                        [--steps lfw_pairs=100,imagenet_det=50]

For each dataset it builds the run's default Trainer (experiments/trainer.py) and the default
training pipeline on the embedded sample (input_fn, source=files), warms both up (the one
trace, the pipeline's buffers), then runs the same number of steps once per loop length in
paired rounds, the order rotated every round (benchmarks/step_cost.py's rounds and rows), so
drift and other processes' load fall on every row alike. Each row calls Trainer.train_loop as
the runner does, which leaves out only the runner's per-loop logging; on CPU alone, where
trainer.steps_per_loop defaults to 1, a loop of 1 is the one-step call traced without a while
loop, as the runner runs it there. Reported per row (medians over rounds): steps/s, images/s
(an LFW example is two images), images per CPU-second of this process (os.times, tf.data's
threads included), and the input-wait fraction; per dataset, the median ratio of steps/s to the
first loop length, with its spread (min–max over rounds). The devices TensorFlow sees are printed
first, and the 1-minute load average before and after: on a shared machine it says how much the
figures can be trusted.
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
from step_cost import for_each_dataset, loop_row, rotated_rounds, saved_ms, settings, spread  # noqa: E402
from tf_harness.experiments import strategies  # noqa: E402
from tf_harness.experiments.trainer import Trainer  # noqa: E402

# About 5 minutes in all on 2 busy cores, where a semi-AlexNet step on 415x482 images takes 1-1.5 s.
DEFAULT_STEPS = {"lfw_pairs": 100, "imagenet_det": 50}
DEFAULT_ROUNDS = {"lfw_pairs": 3, "imagenet_det": 1}


def per_dataset(text, defaults):
    """`lfw_pairs=100,imagenet_det=50` over `defaults`."""
    return {**defaults, **{key: int(value) for key, value in (item.split("=") for item in text.split(",") if item)}}


def build(dataset):
    """The dataset's default config, Trainer and training iterator; and images per example."""
    cfg = data_api.compose_defaults(dataset)
    tf.keras.utils.set_random_seed(cfg.seed)
    info = data_api.describe(cfg)
    trainer = Trainer(cfg, info.spec, strategies.make_strategy(cfg.strategy), info.size)
    iterator = iter(data_api.train_input(cfg, info.table, workdir=None, seed=cfg.seed))
    return cfg, trainer, iterator, 2 if info.spec.paired else 1


def bench(dataset, loops, rounds, steps):
    cfg, trainer, iterator, images_per_example = build(dataset)
    steps = max(loops) * max(1, steps // max(loops))  # whole loops of every length
    started = time.perf_counter()
    trainer.train_loop(iterator, 3)  # the loop's one trace, which serves every loop length, and the pipeline's warm-up
    trainer.train_loop(iterator, 1)  # and the one-step call's, which loops of 1 use with steps_per_loop 1 (CPU's default)
    print(f"{dataset}: {settings(cfg)}, "
          f"{steps} steps per row; trace + warm-up {time.perf_counter() - started:.1f} s", flush=True)
    rows = rotated_rounds({per_loop: loop_row(trainer, iterator, per_loop) for per_loop in loops}, steps, rounds)
    batch_images = cfg.pipeline.batch_size * images_per_example
    print(f"\n| {dataset} steps_per_loop | steps/s | images/s | images/CPU-s | input wait | ratio to {loops[0]} "
          f"(min–max) |\n|---|---|---|---|---|---|")
    for per_loop, runs in rows.items():
        ratios = [base.seconds / run.seconds for base, run in zip(rows[loops[0]], runs)]
        rate = statistics.median(steps / run.seconds for run in runs)
        per_cpu = statistics.median(steps * batch_images / run.cpu for run in runs)
        wait = statistics.median(run.value / run.seconds for run in runs)
        print(f"| {per_loop} | {rate:.2f} | {rate * batch_images:.0f} | {per_cpu:.0f} | {wait:.3f} | "
              f"{spread(ratios)} |")
    # What the longest loop saved per step: the host's per-call cost (dispatch, read-back, Python) that a loop
    # spreads over its steps. No loop length can save more than all of it, which bounds the ratio.
    base, longest = loops[0], loops[-1]
    step_ms = [1000 * run.seconds / steps for run in rows[longest]]
    saved = saved_ms(rows[base], rows[longest], steps)
    print(f"{dataset}: a step at {longest} per loop takes {statistics.median(step_ms):.1f} ms; "
          f"{longest} vs {base} per loop saved {statistics.median(saved):.2f} ms per step "
          f"({min(saved):.2f} to {max(saved):.2f} over rounds)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="lfw_pairs,imagenet_det")
    parser.add_argument("--loops", default="1,50", help="loop lengths to compare; the first is the baseline")
    parser.add_argument("--rounds", default="", help="paired rounds per dataset, e.g. lfw_pairs=3,imagenet_det=1")
    parser.add_argument("--steps", default="", help="steps per row, e.g. lfw_pairs=100,imagenet_det=50")
    args = parser.parse_args()
    steps, rounds = per_dataset(args.steps, DEFAULT_STEPS), per_dataset(args.rounds, DEFAULT_ROUNDS)
    loops = [int(n) for n in args.loops.split(",")]
    for_each_dataset(args.datasets.split(","),
                     lambda dataset: bench(dataset, loops, rounds[dataset], steps[dataset]))


if __name__ == "__main__":
    main()
