#!/usr/bin/env python
"""What the decode guard (data/unreadable.py) costs: the same records loaded by a plain parallel map and by
the guarded one, in paired, interleaved rounds, in images per CPU-second of this process.

    python benchmarks/guard_cost.py [--datasets chest_xray,lfw_pairs,imagenet_det] [--rounds 4] [--batches 8]

Each round builds both pipelines over the dataset's training table (its embedded sample, default size,
batch 64), the order alternating between rounds, and reads `--batches` batches after one warm-up batch.
The ratio is guarded ÷ plain per CPU-second, the median of the per-round ratios with their min–max.
"""
import argparse
import os
import time

import data_api  # noqa: F401  (puts the project on sys.path)
import numpy as np
import tensorflow as tf
from data_api import compose_cfg, describe

AUTOTUNE = tf.data.AUTOTUNE
BATCH = 64


def records_and_source(cfg, table):
    """The training records (drawn pairs for LFW, else row numbers) and the source they load through."""
    from tf_harness.data import task_from_config
    from tf_harness.data.input_fn import record_source

    task = task_from_config(cfg)
    source = record_source(task, table, "train", training=True)
    return source.records(0).repeat(), source


def pipeline(records, source, guarded):
    from tf_harness.data import unreadable

    load = tf.autograph.experimental.do_not_convert(source.load)
    if guarded:
        data = records.map(unreadable.guard(load, source.paths), num_parallel_calls=AUTOTUNE)
    else:
        data = records.map(load, num_parallel_calls=AUTOTUNE)
    return data.batch(BATCH).prefetch(AUTOTUNE)


def images_per_cpu_second(data, batches, per_example) -> float:
    iterator = iter(data)
    next(iterator)
    started = time.process_time()
    for _ in range(batches):
        next(iterator)
    return batches * BATCH * per_example / (time.process_time() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="chest_xray,lfw_pairs,imagenet_det")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for name in args.datasets.split(","):
        cfg = compose_cfg(name, BATCH, None)
        info = describe(cfg)
        records, source = records_and_source(cfg, info.table)
        per_example = 2 if info.spec.paired else 1
        rates = {False: [], True: []}
        for round_number in range(args.rounds):
            for guarded in (False, True) if round_number % 2 == 0 else (True, False):
                rates[guarded].append(images_per_cpu_second(pipeline(records, source, guarded), args.batches,
                                                            per_example))
        ratios = np.array(rates[True]) / np.array(rates[False])
        print(f"{name}: plain {np.median(rates[False]):.0f}, guarded {np.median(rates[True]):.0f} images per CPU-s; "
              f"guarded ÷ plain {np.median(ratios):.2f} ({ratios.min():.2f}–{ratios.max():.2f}) over {args.rounds} "
              f"rounds; load average now {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
