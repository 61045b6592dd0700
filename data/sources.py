"""Record sources: where a split's unbatched records come from, interchangeably for input_fn.

A source gives the cheap records of this input pipeline's share of a split
(`records`), and turns one record into ``(features, label)`` (`load`), the
expensive part that input_fn runs in a parallel map. Three sources:

- `TableRecords`: the index table's rows (paths and labels), ``pipeline.source=files``;
- `SampledRecords`: an endless stream the task draws in the graph (LFW's training pairs);
- `data.tfrecords.reader.TFRecordRecords`: TFRecord shards, ``pipeline.source=tfrecord``.
"""
import numpy as np
import tensorflow as tf

from data.tables import path_columns


class TableRecords:
    """The rows of an index table: image paths and labels, one tensor per column."""

    endless = False

    def __init__(self, task, table):
        self.task, self.table = task, table
        self.count = len(table)
        columns = path_columns(table)
        # A record holds its paths and its label; the mean size bounds a shuffle buffer in MB.
        path_bytes = sum(table[column].str.len().sum() for column in columns) / max(len(table), 1)
        self.record_bytes = path_bytes + 8 * (np.size(table.label.iloc[0]) if len(table) else 1)

    def records(self, seed, context=None) -> tf.data.Dataset:
        columns = path_columns(self.table) + ["label"]
        data = tf.data.Dataset.from_tensor_slices({column: np.asarray(self.table[column].tolist())
                                                   for column in columns})
        if context is not None and context.num_input_pipelines > 1:
            # Before any shuffle: the workers' rows are disjoint and together whole.
            data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        return data

    def load(self, record):
        return self.task.load(record)


class SampledRecords:
    """Training records the task draws afresh in the graph, endlessly (LFW's balanced pairs)."""

    endless = True

    def __init__(self, task, table):
        self.task, self.table = task, table

    def records(self, seed, context=None) -> tf.data.Dataset:
        worker = context.input_pipeline_id if context is not None else 0
        # Every worker draws its own pairs.
        return self.task.train_records(self.table, seed + 7919 * worker)

    def load(self, record):
        return self.task.load(record)

