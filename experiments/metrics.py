"""Evaluation metrics, each declared once (the losses are the Task's: data/losses.py).

A `Metric` is a name, a direction, and one function of (labels, scores) that gives the metric under each row of
example weights ([b, n] -> [b]). The same function scores an evaluation (one row of ones) and the bootstrap's
resamples (each example's count in each resample: experiments/intervals.py), so an interval is always of the
number it brackets; tests/test_results.py checks every one against scikit-learn. `TASK_METRICS` lists what each
kind of task writes at every evaluation, its headline first; everything else derives from it: the evaluation
record, the `/ci95` intervals, compare's rows, trainer.best_metric's allowed values and best_mode's default, the
HParams columns and a sweep's summary line.

A dataset's protocol metrics (LFW's `eer`, `tar_at_far_*`: data/lfw_pairs.py) are computed by its Task over
whole folds; `PROTOCOL` declares their direction.
"""
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Metric:
    """One metric: `measure(labels, scores)` returns a function of example weights [b, n] to its value under each
    row [b]; `per_class`: measured on each class's column (a multi-label task's `auc/<class>`), with the mean of
    the defined ones as `name`."""

    name: str
    measure: Callable
    lower_is_better: bool = False
    per_class: bool = False


def auc_function(labels, scores):
    """A function from example weights ([b, n]) to the ROC AUC under each row, ties counted as half, as
    roc_auc_score with sample_weight computes it (NaN where a row weighs no positive or no negative: AUC is
    undefined when the evaluated examples hold one class only); the scores are sorted once, here."""
    positive = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, np.float64).reshape(-1)
    negatives = np.flatnonzero(~positive)
    order = np.argsort(scores[negatives], kind="stable")
    sorted_negatives, negatives = scores[negatives][order], negatives[order]
    positives = np.flatnonzero(positive)
    # The negatives scored below each positive, and those scored below or level with it.
    left = np.searchsorted(sorted_negatives, scores[positives], "left")
    right = np.searchsorted(sorted_negatives, scores[positives], "right")

    def auc(weights):
        below = np.zeros((len(weights), len(negatives) + 1), np.int64 if weights.dtype.kind in "iu" else np.float64)
        np.cumsum(weights[:, negatives], axis=1, out=below[:, 1:])
        positive_weights = weights[:, positives]
        total_positive, total_negative = positive_weights.sum(axis=1), below[:, -1]
        with np.errstate(invalid="ignore", divide="ignore"):
            value = (positive_weights * (below[:, left] + below[:, right])).sum(axis=1) / (
                2.0 * total_positive * total_negative)
        return np.where((total_positive > 0) & (total_negative > 0), value, np.nan)

    return auc


def _mean_of(hits):
    """A function from example weights ([b, n]) to the weighted mean of `hits` [n] under each row."""
    hits = np.asarray(hits, np.float64)
    return lambda weights: weights @ hits / weights.sum(axis=1)


def _binary_accuracy(labels, scores):
    return _mean_of((np.asarray(scores).reshape(-1) > 0.5) == np.asarray(labels).reshape(-1))


def _top1(labels, scores):
    return _mean_of(np.asarray(scores).argmax(-1) == np.asarray(labels).reshape(-1))


def _top5(labels, scores):
    scores = np.asarray(scores)
    top = np.argsort(-scores, axis=-1, kind="stable")[:, :min(5, scores.shape[-1])]
    return _mean_of((top == np.asarray(labels).reshape(-1)[:, None]).any(axis=1))


# What each kind of task writes at every evaluation, its headline metric first.
TASK_METRICS = {
    "multilabel": (Metric("auc/mean", auc_function, per_class=True),),
    "binary": (Metric("accuracy", _binary_accuracy), Metric("auc", auc_function)),
    "multiclass": (Metric("accuracy", _top1), Metric("top5_accuracy", _top5)),
}
# The protocol metrics a dataset's Task computes over whole folds (data/lfw_pairs.py), by name.
PROTOCOL = {"eer": Metric("eer", None, lower_is_better=True)}


def names(task) -> tuple:
    """The names of the metrics a task of kind `task` writes at every evaluation, its headline first."""
    return tuple(metric.name for metric in TASK_METRICS[task])


def headline(task) -> str:
    """The metric a progress line, a sweep and an HParams table lead with."""
    return TASK_METRICS[task][0].name


def lower_is_better(name) -> bool:
    """Whether a lower value of the metric `name` is the better one (loss, eer); a higher one for every other."""
    declared = {metric.name: metric for metrics in TASK_METRICS.values() for metric in metrics} | PROTOCOL
    return name == "loss" or (name in declared and declared[name].lower_is_better)


def probabilities(task, logits):
    from scipy.special import expit, softmax
    logits = np.asarray(logits, np.float64)
    return softmax(logits, axis=-1) if task == "multiclass" else expit(logits)


def functions(task, class_names, labels, scores) -> dict:
    """Each declared metric of `task` as a function of example weights, {name: f([b, n]) -> [b]}; a per-class
    metric's mean is left to `values_under`, from its classes'."""
    scores = np.asarray(scores, np.float64)
    found = {}
    for metric in TASK_METRICS[task]:
        if metric.per_class:
            labels = np.asarray(labels).reshape(scores.shape)
            stem = metric.name.rsplit("/", 1)[0]
            found.update({f"{stem}/{name}": metric.measure(labels[:, k], scores[:, k])
                          for k, name in enumerate(class_names)})
        else:
            found[metric.name] = metric.measure(labels, scores)
    return found


def values_under(task, found, weights) -> dict:
    """The metrics of `functions` under each row of example `weights`: {name: [b] values}, a per-class metric's
    mean of the classes defined in each row included."""
    values = {name: function(weights) for name, function in found.items()}
    for metric in TASK_METRICS[task]:
        if metric.per_class:
            stem = metric.name.rsplit("/", 1)[0] + "/"
            stacked = np.stack([value for name, value in values.items() if name.startswith(stem)])
            defined = (~np.isnan(stacked)).sum(axis=0)
            with np.errstate(invalid="ignore", divide="ignore"):
                values[metric.name] = np.where(defined > 0, np.nansum(stacked, axis=0) / defined, np.nan)
    return values


def evaluate(task, class_names, labels, logits) -> dict:
    """Metrics of one evaluation from its logits."""
    return scored(task, class_names, labels, probabilities(task, logits))


def scored(task, class_names, labels, scores) -> dict:
    """`evaluate`'s metrics from probabilities (`scores`, as predictions.csv holds them): each declared metric
    under weights of one."""
    scores = np.asarray(scores, np.float64)
    ones = np.ones((1, len(scores)))
    return {name: float(value[0]) for name, value in
            values_under(task, functions(task, class_names, labels, scores), ones).items()}
