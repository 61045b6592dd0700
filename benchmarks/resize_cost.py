#!/usr/bin/env python
"""What the project's shrink (tf_harness.data.images.resize) costs beside the least TensorFlow can do, per
CPU-second, PNG decode included, in paired, interleaved rounds in one process:

    python benchmarks/resize_cost.py [--files GLOB] [--size 224] [--rounds 5]

Rows, each read, decode_png (one channel), resize, uint8, in the same parallel map:

    ceiling   a plain bilinear resize (no antialiasing), written here
    previous  the shrink before area: a bilinear pre-shrink to twice the size for images 4x the size or
              more, then TensorFlow's antialiased bilinear resize, written here
    project   tf_harness.data.images.resize

The default files are the real NIH fixtures (tests/fixtures/real/nih/images); the embedded sample's
PNGs are under ~/.cache/tf-harness/samples/chest_xray-v2/images. Ratios are medians of per-round ratios
to the ceiling, with their min–max.
"""
import argparse
import glob
import os
import time
from pathlib import Path

import data_api  # noqa: F401  (puts the project on sys.path)
import numpy as np
import tensorflow as tf

REAL_NIH = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "real" / "nih" / "images" / "*.png"


def to_uint8(image):
    return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)


def ceiling(image, size):
    return tf.cast(tf.image.resize(image, size), tf.uint8)


def previous(image, size):
    shape = tf.shape(image)
    ratio = tf.minimum(shape[0] // size[0], shape[1] // size[1])
    image = tf.cond(ratio >= 4, lambda: tf.image.resize(image, [2 * size[0], 2 * size[1]]),
                    lambda: tf.cast(image, tf.float32))
    return to_uint8(tf.image.resize(image, size, antialias=True))


def images_per_cpu_second(paths, resize, size, batches=12, batch_size=8) -> float:
    data = tf.data.Dataset.from_tensor_slices(paths).repeat().map(
        lambda path: resize(tf.io.decode_png(tf.io.read_file(path), channels=1), size),
        num_parallel_calls=tf.data.AUTOTUNE).batch(batch_size).prefetch(2)
    iterator = iter(data)
    next(iterator)
    started = time.process_time()
    for _ in range(batches):
        next(iterator)
    return batches * batch_size / (time.process_time() - started)


def main():
    from tf_harness.data.images import resize

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default=str(REAL_NIH))
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.expanduser(args.files)))
    if not paths:
        raise SystemExit(f"no files match {args.files}")
    size = (args.size, args.size)
    rows = {"ceiling": ceiling, "previous": previous, "project": resize}
    rates = {name: [] for name in rows}
    print(f"{len(paths)} files from {args.files}, to {args.size}x{args.size}; load average {os.getloadavg()[0]:.2f}")
    for round_number in range(args.rounds):
        names = list(rows)[round_number % len(rows):] + list(rows)[:round_number % len(rows)]
        for name in names:
            rates[name].append(images_per_cpu_second(paths, rows[name], size))
    for name in rows:
        ratios = np.array(rates[name]) / np.array(rates["ceiling"])
        print(f"{name:9s} {np.median(rates[name]):6.0f} images per CPU-s; ÷ ceiling {np.median(ratios):.2f} "
              f"({ratios.min():.2f}–{ratios.max():.2f})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
