"""The default loss of each task type, per example, in the graph; a Task's `loss` (data/task.py) sums it.

Single-label (multiclass) labels come as class ids, or as dense float distributions over the classes (what
batch mixing and label smoothing give); multi-label and binary labels as 0/1 (or soft) floats per label.
"""
import tensorflow as tf


def per_example_loss(task_type, labels, logits):
    """Cross-entropy of each example: softmax over classes for ``multiclass``, sigmoid per label otherwise."""
    logits = tf.cast(logits, tf.float32)
    if task_type == "multiclass":
        if labels.shape.rank == logits.shape.rank and labels.dtype.is_floating:  # a distribution over classes
            return tf.nn.softmax_cross_entropy_with_logits(tf.cast(labels, tf.float32), logits)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(labels, tf.int32), logits)
    labels = tf.reshape(tf.cast(labels, tf.float32), tf.shape(logits))
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits), axis=-1)


def weighted_sum(task_type, labels, logits, weights):
    """The batch's weighted sum of `per_example_loss`: a float32 scalar."""
    return tf.reduce_sum(per_example_loss(task_type, labels, logits) * tf.cast(weights, tf.float32))
