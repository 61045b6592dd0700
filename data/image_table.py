"""Drawn training records from images decoded once: the image table (LFW's training pairs).

LFW's training pairs are drawn afresh in the graph (`LfwPairs.train_records`), so the file pipeline
decodes two JPEGs for every pair of every step, and no cache applies: the draws have no epoch. The
image table decodes each training image once instead, when input_fn builds the pipeline: a parallel
tf.data map over the training paths in `training_images` order, with the task's own `read_image` (the
decode, crop and resize `load` uses), into one uint8 [N, height, width, channels] tensor held in
memory. Training pairs are then drawn by row (`train_draws`: the same seed, pairs and labels as the
file pipeline's, a whole batch per element) and their faces gathered from the table in the graph.

When (`image_table`): for training a task that draws its records (``DRAWS_TRAINING_RECORDS`` and a
`train_draws`) without a tf.data service, with ``pipeline.cache=memory`` whatever the table's size, and
otherwise when N x height x width x channels bytes fit ``pipeline.image_table_mb`` (default 1024 MB;
0: never). A table over the budget is one log line, and the pairs decode their files as before.

What fails to decode: the decode of every image at the start is the guarded pass that the file
pipeline runs before its first draw (data/integrity/unreadable.py): a file that fails is written to the run's
report folder, which the runner lists in skipped.csv with the reason found on the host, and is left out
of the table; the pairs are drawn over the images that decoded. A pass that fails on
MAX_FAILED_IN_A_ROW images in a row (or on all of fewer) gives the file pipeline back, which ends the
run with its one line.

The table is a non-trainable tf.Variable on the CPU, filled a batch at a time by scatter updates, so it
is held once (a slice assignment would copy the whole variable each time), and the pipeline captures
it by reference: it is in no GraphDef (a constant of 2 GB or more could not be serialised; a captured
eager tensor is copied into the graph that tf.data rewrites when an iterator starts), and nothing
tracks it, so no checkpoint holds it. An iterator checkpoint holds the counter of batches and the
batches prefetched, as the file pipeline's does.

The two pipelines' iterators do not restore into each other, so a run that started before the table
existed (its saved .hydra/config.yaml has no pipeline.image_table_mb) and has checkpoints goes on reading
the files. Within one run the choice holds as long as the table keeps fitting the budget (the key cannot
change on re-entry); a change of pipeline.cache on re-entry starts the input stream over anyway.
"""
import logging
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
import yaml

from tf_harness.data.integrity import reading, unreadable
from tf_harness.data.iterators import make_iterator

log = logging.getLogger(__name__)
AUTOTUNE = tf.data.AUTOTUNE
_MB = 1_000_000
# Images per batch of the decode pass, and per scatter into the table.
DECODE_BATCH = 256

# Philox-4x32-10, as TensorFlow's stateless random ops run it on a CPU (core/lib/random/philox_random.h).
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
# The key that scrambles a stateless op's seed into its own key and counter (random_ops_util._philox_scramble_seed).
_SCRAMBLE_KEY = (0x3EC8F720, 0x02461E29)


def _words(value):
    """The low and high uint32 words of int64 `value` (as uint64)."""
    value = tf.bitcast(value, tf.uint64)
    return tf.cast(value, tf.uint32), tf.cast(tf.bitwise.right_shift(value, tf.constant(32, tf.uint64)), tf.uint32)


def _philox(counter, key):
    """Philox-4x32-10 of four uint32 counter words and two key words (tensors of one shape, elementwise)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0 = tf.cast(c0, tf.uint64) * tf.constant(_PHILOX_M[0], tf.uint64)
        p1 = tf.cast(c2, tf.uint64) * tf.constant(_PHILOX_M[1], tf.uint64)
        hi0, lo0 = tf.cast(tf.bitwise.right_shift(p0, tf.constant(32, tf.uint64)), tf.uint32), tf.cast(p0, tf.uint32)
        hi1, lo1 = tf.cast(tf.bitwise.right_shift(p1, tf.constant(32, tf.uint64)), tf.uint32), tf.cast(p1, tf.uint32)
        c0, c1, c2, c3 = (tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi1, c1), k0), lo1,
                          tf.bitwise.bitwise_xor(tf.bitwise.bitwise_xor(hi0, c3), k1), lo0)
        k0, k1 = k0 + tf.constant(_PHILOX_W[0], tf.uint32), k1 + tf.constant(_PHILOX_W[1], tf.uint32)
    return c0, c1, c2, c3


def stateless_uniforms(seed, counters, count):
    """For each int64 `counters[j]`, the `count` float64 numbers that
    ``tf.random.stateless_uniform([count], seed=[seed, counters[j]], dtype=tf.float64)`` draws on a CPU, bit for
    bit: [len(counters), count], in elementwise ops over all of them at once, where that op takes one seed a
    call (tests/test_lfw_pairs.py compares them)."""
    counters = tf.convert_to_tensor(counters, tf.int64)
    seed_words = _words(tf.fill(tf.shape(counters), tf.constant(seed, tf.int64)))
    key = tuple(tf.fill(tf.shape(counters), tf.constant(word, tf.uint32)) for word in _SCRAMBLE_KEY)
    mix = _philox((*seed_words, *_words(counters)), key)  # the op's key and counter, scrambled from its seed
    zero = tf.zeros_like(mix[0])
    numbers = []
    for block in range((count + 1) // 2):  # two float64s per block of four uint32s, the counter's low word + 1
        words = _philox((zero + block, zero, mix[2], mix[3]), (mix[0], mix[1]))
        for high, low in ((words[0], words[1]), (words[2], words[3])):
            # A 52-bit mantissa: 20 bits of one word, 32 of the other, over 2^52, as the op's Uint64ToDouble.
            mantissa = tf.cast(tf.bitwise.bitwise_and(high, tf.constant(0xFFFFF, tf.uint32)), tf.float64) * 2.0 ** 32
            numbers.append((mantissa + tf.cast(low, tf.float64)) * 2.0 ** -52)
    return tf.stack(numbers[:count], axis=-1)


def table_bytes(task, images: int) -> int:
    """The bytes a table of `images` decoded images of `task` takes: images x height x width x channels."""
    height, width = task.decode.size
    return int(images) * height * width * task.SPEC.channels


def _checkpointed_before_the_table(model_dir) -> bool:
    """Whether the run directory holds checkpoints of a run started before the image table existed, whose input
    iterator read the files: its saved config (Hydra's .hydra/config.yaml) has no pipeline.image_table_mb."""
    run_dir = Path(model_dir)
    if not any((run_dir / "checkpoints").glob("ckpt-*.index")):
        return False
    try:
        return "image_table_mb" not in yaml.safe_load(reading.read_text(run_dir / ".hydra" / "config.yaml"))["pipeline"]
    except (OSError, ValueError, LookupError, TypeError, yaml.YAMLError):  # no saved config: the run says so itself
        return False


def image_table(task, table, cache="none", budget_mb=0, model_dir=None):
    """The training source of `task`'s drawn records from a table of its decoded `table` images, or None where
    the file pipeline draws them (see the module's docstring for when)."""
    if not hasattr(task, "train_draws") or (cache != "memory" and budget_mb <= 0):
        return None
    name, size = task.SPEC.name, table_bytes(task, len(table))
    if cache != "memory" and size > budget_mb * _MB:
        log.info("%s: a table of the %d training images would take %s, over pipeline.image_table_mb=%g: "
                 "training pairs decode their image files every step", name, len(table), _megabytes(size), budget_mb)
        return None
    if model_dir is not None and _checkpointed_before_the_table(model_dir):
        log.info("%s: this run started before the image table, and its checkpoints hold the input iterator of "
                 "pairs read from the image files, so it goes on reading them", name)
        return None
    return ImageTableRecords.build(task, table, model_dir)


class ImageTableRecords:
    """A task's drawn training records, whole batches at a time, their images gathered from a table of the
    training images decoded once (`build`).

    Attributes:
        images: the table, a uint8 tf.Variable [N, height, width, channels] on the CPU (rows from `count` on
            are unused: the images that failed to decode).
        table: the training images it holds, in its row order (`task.training_images`).
        count: how many images it holds; shape: [N, height, width, channels].
    """

    endless = True

    def __init__(self, task, table, images, count):
        self.task, self.table, self.images, self.count = task, table, images, count
        self.shape = images.shape.as_list()

    @classmethod
    def build(cls, task, table, model_dir=None):
        """Decodes every image of `table` once, in parallel, into the table; reports those that fail (see
        data/integrity/unreadable.py) and leaves them out. None, after one log line, when MAX_FAILED_IN_A_ROW failed in
        a row (or all of fewer): the file pipeline then ends the run with its line."""
        started = time.perf_counter()
        table = task.training_images(table)
        height, width = task.decode.size
        report_dir = unreadable.report_folder(model_dir) if model_dir is not None else None

        def load(path):
            return task.read_image(path), tf.constant(0.0)

        guard = unreadable.guard(tf.autograph.experimental.do_not_convert(load), lambda path: [path], report_dir)
        decoded = tf.data.Dataset.from_tensor_slices(table.path.to_numpy(dtype=str)).map(
            guard, num_parallel_calls=AUTOTUNE, deterministic=True).batch(DECODE_BATCH).prefetch(1)
        with tf.init_scope(), tf.device("/CPU:0"):
            images = tf.Variable(tf.zeros([len(table), height, width, task.SPEC.channels], tf.uint8),
                                 trainable=False, name="image_table")
        whole, count = [], 0
        for batch, _, weights in make_iterator(decoded):
            loaded = weights.numpy() > 0
            whole.append(loaded)
            if loaded.any():
                kept = batch if loaded.all() else tf.boolean_mask(batch, loaded)
                images.scatter_update(tf.IndexedSlices(kept, tf.range(count, count + len(kept))))
                count += len(kept)
        whole = np.concatenate(whole) if whole else np.zeros([0], bool)
        name, failed = task.SPEC.name, len(table) - count
        if _longest_run(~whole) >= min(unreadable.MAX_FAILED_IN_A_ROW, len(table)):
            log.warning("%s: %d of the %d training images failed to decode, %d in a row: no image table",
                        name, failed, len(table), _longest_run(~whole))
            return None
        log.info("%s: decoded the %d training images once into a table of %s (%dx%dx%d uint8%s) in %.1f s; "
                 "training pairs are drawn from it", name, count, _megabytes(table_bytes(task, count)), height, width,
                 task.SPEC.channels, f"; {failed} left out, undecodable" if failed else "",
                 time.perf_counter() - started)
        return cls(task, table[whole].reset_index(drop=True), images, count)

    def batches(self, seed, context=None, batch_size=32) -> tf.data.Dataset:
        """Endless training batches (features, labels, weights) of this worker's own draws (as SampledRecords
        seeds them), `batch_size` pairs each, in the order drawn."""
        worker = context.input_pipeline_id if context is not None else 0
        draws = self.task.train_draws(self.table, seed + 7919 * worker, batch_size)
        images = self.images

        def load(record):
            features, labels = self.task.load_drawn(record, images)
            return features, labels, tf.ones([batch_size])

        # One sequential map: a gather per batch; nothing in flight for a checkpoint to hold but prefetched batches.
        return draws.map(tf.autograph.experimental.do_not_convert(load))


def _megabytes(size) -> str:
    return f"{size / _MB:,.1f} MB"


def _longest_run(flags) -> int:
    """The length of the longest run of True in `flags`."""
    longest = current = 0
    for flag in flags:
        current = current + 1 if flag else 0
        longest = max(longest, current)
    return longest
