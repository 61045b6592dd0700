"""The input_fn factory: one tf.data pipeline shape for every dataset and record source.

Every element is ``(features, labels, weights)`` with a static batch dimension;
features are uint8 images, which the traced steps augment and normalise on the
device (data/preprocessing.py). Training batches drop the remainder; evaluation
pads its last batch and gives the padding weight 0, so evaluation sees every
example exactly once (every example of its sample, for a partial evaluation:
data/evaluation_sample.py), train and validation share one ``element_spec``, and
each step function is traced once.
"""
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from tf_harness.data import caching, service
from tf_harness.data.image_table import ImageTableRecords, image_table
from tf_harness.data.integrity import unreadable
from tf_harness.data.sources import SampledRecords, TableRecords
from tf_harness.data.tfrecords import TFRecordSettings
from tf_harness.data.tfrecords.reader import TFRecordRecords

log = logging.getLogger(__name__)
AUTOTUNE = tf.data.AUTOTUNE
_MB = 1_000_000
# An input checkpoint saves each buffered element as an entry of its own, so the count bounds the save's
# time (docs/input-pipeline.md).
MAX_SHUFFLE_ELEMENTS = 20_000


@dataclass(frozen=True)
class Pipeline:
    """The settings input_fn reads, as plain values (``pipeline.*``, ``seed``, ``deterministic``).

    Attributes:
        batch_size: the global batch size; each of several input pipelines makes its share.
        cache: ``none``, ``memory`` or ``disk``: decoded images cached before shuffling.
        shuffle_buffer: records per shuffle buffer, or None to size it by `shuffle_mb`.
        shuffle_mb: the memory a shuffle buffer may take, in MB.
        seed: the shuffle and sampling seed.
        deterministic: keep element order in training too (evaluation always keeps it).
        tfrecord: where to read TFRecord shards, or None to read the dataset's own files.
        service: grpc://host:port of a tf.data service dispatcher whose workers make the training
            batches (data/service.py), or None to make them here.
        image_table_mb: the memory a table of drawn training records' decoded images may take, in MB
            (data/image_table.py); 0: none unless `cache` is ``memory``.
    """

    batch_size: int
    cache: str
    shuffle_buffer: int
    shuffle_mb: float
    seed: int
    deterministic: bool
    tfrecord: TFRecordSettings = None
    service: str = None
    image_table_mb: float = 0

    def buffer(self, count, element_bytes) -> int:
        """A shuffle buffer for `count` elements of about `element_bytes` each: the whole split, up to shuffle_mb
        and MAX_SHUFFLE_ELEMENTS."""
        budget = self.shuffle_buffer or min(int(self.shuffle_mb * _MB // max(element_bytes, 1)), MAX_SHUFFLE_ELEMENTS)
        return max(1, min(count, budget))


def pad_batch(batch_size):
    """Pads a final short batch to `batch_size`, with weight 0 on the padding (weights default to 1)."""

    def pad(features, labels, weights=None):
        size = tf.shape(labels)[0]

        def pad_one(tensor):
            padding = [[0, batch_size - size]] + [[0, 0]] * (tensor.shape.rank - 1)
            padded = tf.pad(tensor, padding)
            padded.set_shape([batch_size] + tensor.shape[1:])
            return padded

        weights = tf.ones([size]) if weights is None else weights
        return tf.nest.map_structure(pad_one, features), pad_one(labels), pad_one(weights)

    return tf.autograph.experimental.do_not_convert(pad)


def record_source(task, table, split, training, tfrecord=None, cache="none", image_table_mb=0, model_dir=None):
    """The source of a split's records: drawn by the task when it draws its training records (from a table of
    its decoded images where `image_table_mb` or a memory `cache` lets it, data/image_table.py; else from the
    files), else TFRecord shards when `tfrecord` (tf_harness.data.tfrecords.TFRecordSettings) is given, else
    the table's rows. `cache` is pipeline.cache, which input_fn applies to every source but drawn ones."""
    if training and task.DRAWS_TRAINING_RECORDS:
        drawn = image_table(task, table, cache, image_table_mb, model_dir)
        unused = [setting for setting, given in (("pipeline.source=tfrecord", tfrecord is not None),
                                                 (f"pipeline.cache={cache}", cache not in ("none", "memory"))) if given]
        if unused:
            log.info("%s draws its training examples afresh; %s serves its evaluation only", task.SPEC.name,
                     " and ".join(unused))
        return drawn or SampledRecords(task, table)
    if tfrecord is not None:
        return TFRecordRecords(task, table, split, training, tfrecord)
    return TableRecords(task, table)


def _element_bytes(element_spec) -> int:
    return sum(spec.shape.num_elements() * spec.dtype.size for spec in tf.nest.flatten(element_spec))


def _shuffled_records(source, data, pipeline, context):
    """The source's records endlessly, each epoch whole and in a fresh order; and how many records the
    first epoch holds: this input pipeline's share of the split."""
    if isinstance(source, TableRecords) and not pipeline.service:
        # Row numbers, each epoch one permutation: a perfect shuffle whose checkpoint is one small tensor.
        # Not under a tf.data service: its distributed_epoch mode splits the rows between workers, and would
        # hand each worker a whole epoch of permutations instead (a service-fed iterator is never saved).
        return source.epochs(pipeline.seed, context), source.epoch_length(context)
    # Shuffle records, not decoded images, so the buffer is small; repeat after shuffle, so
    # each epoch is seen whole and reshuffled.
    return data.shuffle(pipeline.buffer(source.count, source.record_bytes), pipeline.seed,
                        reshuffle_each_iteration=True).repeat(), source.epoch_length(context)


def _loaded(source, data, model_dir, training, cached, first_epoch, first_decodes=None, service=None):
    """The expensive part: read, decode and resize each record, in parallel.

    Where every record must be decoded without fail, an image file that fails to read or decode gives
    weight 0 instead of ending the iterator, and is reported for skipped.csv (data/integrity/unreadable.py):
    evaluation keeps its row, counting for nothing, and training leaves it out. That guard costs CPU per
    image (`python -m benchmarks input guard`, docs/benchmarks.md), so training pays it only while each file is
    decoded the first time: for the first `first_epoch` records of an endless stream of epochs (what
    fails there is reported, and later epochs just leave it out), or in the one pass that fills a cache.
    Drawn records (LFW's pairs) have no epochs: a guarded pass over records that hold each file once
    runs before the draws, reports what fails and yields nothing (`first_decodes`).
    """
    # A load is graph ops with Python control flow only on settings, so AutoGraph has nothing to
    # convert, and converting it would only lengthen the start.
    load = tf.autograph.experimental.do_not_convert(source.load)
    guard = unreadable.guard(load, source.paths, unreadable.report_folder(model_dir) if model_dir is not None else None)

    def unguarded(records):
        return records.map(load, num_parallel_calls=AUTOTUNE).ignore_errors(log_warning=True)

    if isinstance(source, TFRecordRecords) and source.raw:
        return data.map(load, num_parallel_calls=AUTOTUNE)  # pixels, nothing to decode
    if not training:
        return data.map(guard, num_parallel_calls=AUTOTUNE)
    if cached:
        return unreadable.drop_failed(data.map(guard, num_parallel_calls=AUTOTUNE), source.count)
    if source.endless:
        checks = unreadable.drop_failed(first_decodes.map(guard, num_parallel_calls=AUTOTUNE),
                                        int(first_decodes.cardinality()))
        return checks.filter(tf.autograph.experimental.do_not_convert(lambda *element: False)).concatenate(
            unguarded(data))
    if isinstance(source, TableRecords) and not service:
        # Row numbers skip at no cost: the first epoch guarded, the rest as they are.
        first = unreadable.drop_failed(data.take(first_epoch).map(guard, num_parallel_calls=AUTOTUNE), first_epoch)
        return first.concatenate(unguarded(data.skip(first_epoch)))
    return _numbered_first_epoch_guarded(data, load, guard, first_epoch)


def _numbered_first_epoch_guarded(data, load, guard, first_epoch):
    """Guards the first `first_epoch` records by their number, for sources that cannot skip an epoch cheaply:
    TFRecord shards would be read again, and a tf.data service splits each source of a pipeline between
    its workers. Every record then passes a number, a tf.cond and drop_failed, which cost some CPU per image
    after the first epoch (docs/benchmarks.md).

    Records are numbered by a scan, not zipped with a counter, which a service would split too. There
    each worker guards its own first `first_epoch` records, which hold all it gets of the first epoch.
    """
    def number(count, *record):
        return count + 1, (count, *record)

    def load_once_guarded(count, *record):
        plain = lambda: (*load(*record), tf.constant(1.0))  # noqa: E731; a failure raises, for ignore_errors
        return tf.cond(count < first_epoch, lambda: guard(*record), plain)

    numbered = data.scan(tf.constant(0, tf.int64), tf.autograph.experimental.do_not_convert(number))
    loaded = numbered.map(tf.autograph.experimental.do_not_convert(load_once_guarded), num_parallel_calls=AUTOTUNE)
    return unreadable.drop_failed(loaded.ignore_errors(log_warning=True), first_epoch)


def _sampled(records, rows, count):
    """Of `count` records in table order, those of the table rows `rows`, picked in the graph by their position
    before anything is decoded; the same for every source (row numbers, TFRecord shards)."""
    keep = tf.constant(np.isin(np.arange(count), rows))
    picked = records.enumerate().filter(
        tf.autograph.experimental.do_not_convert(lambda position, record: tf.gather(keep, position)))
    return picked.map(tf.autograph.experimental.do_not_convert(lambda position, record: record))


def _batches(task, table, source, pipeline, split, training, context, model_dir, batch_size, rows=None):
    """The records of `source` loaded and batched: this worker's share (in evaluation, only `rows` where given),
    shuffled for training, decoded and resized, cached where `pipeline.cache` applies, in batches of `batch_size`."""
    cached = caching.applies(pipeline.cache, drawn=source.endless)

    # This worker's share of the cheap records (paths and labels, or serialized examples).
    data = source.records(pipeline.seed, context)
    if rows is not None:
        data = _sampled(data, rows, len(table))
        table = table.iloc[rows]  # the rows read: what a cache of them holds
    first_epoch = None
    if training and not source.endless and not cached:
        data, first_epoch = _shuffled_records(source, data, pipeline, context)
    first_decodes = source.every_file(context) if training and source.endless else None
    data = _loaded(source, data, model_dir, training, cached, first_epoch, first_decodes, pipeline.service)
    if cached:
        # Cache decoded, resized images once; shuffle after (and augment in the step), so every pass differs.
        data = caching.cache(data, pipeline.cache, Path(model_dir or "."), split, (task, table, source, training))
        if training:
            data = data.shuffle(pipeline.buffer(source.count, _element_bytes(data.element_spec)), pipeline.seed,
                                reshuffle_each_iteration=True).repeat()
    if training:
        data = data.batch(batch_size, drop_remainder=True)
        return data.map(lambda features, labels: (features, labels, tf.ones([batch_size])))
    return data.batch(batch_size).map(pad_batch(batch_size))


def input_fn(task, table, pipeline: Pipeline, *, split, training, context=None, model_dir=None,
             rows=None) -> tf.data.Dataset:
    """Builds the pipeline of one split, in this order: source, shard, shuffle, load, cache, batch, prefetch.

    Args:
        task: the dataset's Task (data/task.py).
        table: the split's index table (tf_harness.data.tables.load_tables).
        pipeline: the pipeline settings.
        split: the split's name, which names its disk cache and its TFRecord shards.
        training: shuffle, repeat forever and drop the last partial batch (the train step augments).
        context: a tf.distribute.InputContext when several workers each read their share of the
            training split; evaluation is not split.
        model_dir: the run directory, where ``pipeline.cache=disk`` keeps its files and image files that
            fail to decode are reported (data/integrity/unreadable.py).
        rows: evaluation only: the row numbers of `table` to read, ascending, a partial evaluation's sample
            (data/evaluation_sample.py); None: every row.
    """
    # No image table under a tf.data service: its workers run the pipeline, and the table lives in this process.
    source = record_source(task, table, split, training, pipeline.tfrecord, pipeline.cache,
                           0 if pipeline.service else pipeline.image_table_mb, model_dir)
    batch_size = pipeline.batch_size
    if context is not None and context.num_input_pipelines > 1:
        # Each worker feeds its own replicas their share of the global batch, from its own examples.
        workers = context.num_input_pipelines
        batch_size //= workers
        log.info("Worker %d of %d: %s, %d examples of every global batch of %d", context.input_pipeline_id, workers,
                 "its own pair draws" if source.endless else f"its 1/{workers} of the {split} split", batch_size,
                 pipeline.batch_size)
    if isinstance(source, ImageTableRecords):
        # Whole batches of drawn pairs, their images gathered from the training images decoded once.
        data = source.batches(pipeline.seed, context, batch_size)
    else:
        data = _batches(task, table, source, pipeline, split, training, context, model_dir, batch_size, rows)
    options = tf.data.Options()
    # Training may take whichever image decodes first; evaluation keeps table order, which
    # predictions.csv and the protocol metrics rely on.
    options.deterministic = pipeline.deterministic or not training
    # An input checkpoint saves the elements in flight; unreadable.guard's one-element dataset and report
    # file are done within each call, so they hold no state for a checkpoint to miss.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    # Fused into the batch, unreadable.drop_failed's last map hung instead of raising its stop (TF 2.21,
    # tests/test_verification.py); there is nothing else to fuse but raw TFRecords' pass-through map.
    options.experimental_optimization.map_and_batch_fusion = False
    data = data.with_options(options)
    if training and pipeline.service:
        # Everything above, the decode included, runs on the service's workers; only batches come here.
        # Evaluation stays local: the service neither keeps table order nor promises every example once.
        data = service.distribute(data, pipeline.service)
    order = ("pairs drawn from the image table" if isinstance(source, ImageTableRecords) else
             "shuffled and repeated" if training else "each example once, in table order" if rows is None else
             f"a sample of {len(rows)} of its {len(table)} examples, each once, in table order")
    log.info("Built the %s input pipeline: batches of %d, %s, cache %s", split, batch_size, order, pipeline.cache)
    # Overlap input with the model step.
    return data.prefetch(AUTOTUNE)
