"""Record sources: where a split's unbatched records come from, interchangeably for input_fn.

A source gives the cheap records of this input pipeline's share of a split
(`records`), and turns one record into ``(features, label)`` (`load`), the
expensive part that input_fn runs in a parallel map. Three sources:

- `TableRecords`: the index table's rows (paths and labels), ``pipeline.source=files``;
- `SampledRecords`: an endless stream the task draws in the graph (LFW's training pairs);
- `tf_harness.data.tfrecords.reader.TFRecordRecords`: TFRecord shards, ``pipeline.source=tfrecord``.

Drawn records whose images fit in memory come instead from `tf_harness.data.image_table.ImageTableRecords`:
whole batches of the same draws, their images gathered from the training images decoded once.
"""
import numpy as np
import tensorflow as tf

from tf_harness.data.tables import path_columns


class TableRecords:
    """The rows of an index table: a record is a row number, loaded through constant columns of paths and labels.

    Training shuffles each epoch as one permutation of the row numbers (`epochs`), not through a
    shuffle buffer: an iterator checkpoint saves each buffered element as an entry of its own, so a
    buffer of NIH's rows makes a large, slow save, where the permutation is one small tensor
    (docs/input-pipeline.md).
    """

    endless = False
    record_bytes = 8

    def __init__(self, task, table):
        self.task, self.table = task, table
        self.count = len(table)
        self.columns = {column: tf.constant(np.asarray(table[column].tolist()))
                        for column in path_columns(table) + ["label"]}

    def records(self, seed, context=None) -> tf.data.Dataset:
        data = tf.data.Dataset.range(self.count)
        if context is not None and context.num_input_pipelines > 1:
            # Before any shuffle: the workers' rows are disjoint and together whole.
            data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        return data

    def epochs(self, seed, context=None) -> tf.data.Dataset:
        """This worker's row numbers, endlessly, each epoch in a fresh order drawn from (seed, epoch)."""
        rows = np.arange(self.count, dtype=np.int64)
        if context is not None and context.num_input_pipelines > 1:
            rows = rows[context.input_pipeline_id::context.num_input_pipelines]  # as `records` shards them
        rows = tf.constant(rows)
        return tf.data.Dataset.counter().map(lambda epoch: tf.random.experimental.stateless_shuffle(
            rows, seed=tf.stack([tf.constant(seed, tf.int64), epoch]))).unbatch()

    def epoch_length(self, context=None) -> int:
        """How many rows one of `epochs`' epochs holds."""
        if context is not None and context.num_input_pipelines > 1:
            return len(range(context.input_pipeline_id, self.count, context.num_input_pipelines))
        return self.count

    def row(self, index) -> dict:
        """The table's row `index` as a dict of scalar tensors (a list-valued label as a vector)."""
        return {column: tf.gather(values, index) for column, values in self.columns.items()}

    def load(self, index):
        return self.task.load(self.row(index))

    def paths(self, index) -> list:
        """The image paths of row `index`."""
        return [tf.gather(self.columns[column], index) for column in path_columns(self.table)]


def _path_keys(record) -> list:
    """A drawn record's image path fields, in order (as tables.path_columns names a table's)."""
    return sorted(key for key in record if key.startswith("path"))


class SampledRecords:
    """Training records the task draws afresh in the graph, endlessly (LFW's balanced pairs), each loaded from
    its image files: where there is no image table (data/image_table.py)."""

    endless = True

    def __init__(self, task, table):
        self.task, self.table = task, table

    def records(self, seed, context=None) -> tf.data.Dataset:
        worker = context.input_pipeline_id if context is not None else 0
        # Every worker draws its own pairs.
        return self.task.train_records(self.table, seed + 7919 * worker)

    def load(self, record):
        return self.task.load(record)

    def paths(self, record) -> list:
        """The image paths of a drawn record."""
        return [record[key] for key in _path_keys(record)]

    def every_file(self, context=None) -> tf.data.Dataset:
        """Records shaped as the draws that hold each of the table's images once, this worker's share of
        them: a record of k paths takes the next k images (the last one wraps round to the first); other
        fields are zeros. Their labels mean nothing: they are for decoding every file once."""
        spec = self.records(0).element_spec
        keys = _path_keys(spec)
        paths = self.table.path.to_numpy(dtype=str)
        count = -(-len(paths) // len(keys))
        paths = np.resize(paths, count * len(keys)).reshape(count, len(keys))  # np.resize repeats from the start
        records = {key: paths[:, keys.index(key)] if key in keys else
                   np.zeros([count, *spec[key].shape], spec[key].dtype.as_numpy_dtype) for key in spec}
        data = tf.data.Dataset.from_tensor_slices(records)
        if context is not None and context.num_input_pipelines > 1:
            data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        return data

