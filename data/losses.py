"""The training losses per task, in the graph, per example, so the step can weight and sum them.

Two options change them, each neutral by default (docs/training-loop.md#recipes-of-the-field):
- `label_smoothing` (``trainer.label_smoothing``, multiclass only): the target puts 1 - ε on the true class and
  spreads ε evenly over all of them;
- `positive_weights` (``trainer.class_weights: balanced``, multilabel only): each label's positive examples count
  that many times in the sigmoid cross-entropy (`balanced_positive_weights`).
"""
import numpy as np
import tensorflow as tf


def per_example_loss(task, labels, logits, label_smoothing=0.0, positive_weights=None):
    """Cross-entropy of each example: sigmoid per label, or softmax over classes.

    Multiclass `labels` are class indices [batch], or distributions over the classes [batch, classes] (what mixup
    and cutmix make of them, data/preprocessing.py).
    """
    logits = tf.cast(logits, tf.float32)
    if task == "multiclass":
        if labels.shape.rank == logits.shape.rank:
            targets = tf.cast(labels, tf.float32)
        elif not label_smoothing:
            return tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(labels, tf.int32), logits)
        else:
            targets = tf.one_hot(tf.cast(labels, tf.int32), tf.shape(logits)[-1])
        if label_smoothing:
            classes = tf.cast(tf.shape(logits)[-1], tf.float32)
            targets = targets * (1.0 - label_smoothing) + label_smoothing / classes
        return tf.nn.softmax_cross_entropy_with_logits(targets, logits)
    labels = tf.reshape(tf.cast(labels, tf.float32), tf.shape(logits))
    if positive_weights is None:
        losses = tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)
    else:
        losses = tf.nn.weighted_cross_entropy_with_logits(labels, logits, tf.constant(positive_weights, tf.float32))
    return tf.reduce_mean(losses, axis=-1)


def batch_loss(task, labels, logits, weights, label_smoothing=0.0, positive_weights=None):
    """The batch's weighted sum of `per_example_loss`, a float32 scalar."""
    losses = per_example_loss(task, labels, logits, label_smoothing, positive_weights)
    return tf.reduce_sum(losses * tf.cast(weights, tf.float32))


def balanced_positive_weights(labels) -> list:
    """Each label's negatives ÷ positives among multi-hot `labels` [examples, labels] (a training split's): what
    makes a label's positives weigh as much as its negatives in the loss. A label without positives, or without
    negatives, gets 1: there is nothing to balance."""
    labels = np.asarray(labels, np.float64).reshape(len(labels), -1)
    positives = labels.sum(axis=0)
    negatives = len(labels) - positives
    defined = (positives > 0) & (negatives > 0)
    return [float(n / p) if ok else 1.0 for n, p, ok in zip(negatives, positives, defined)]
