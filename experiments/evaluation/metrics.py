"""Evaluation metrics, each declared once (the losses are the Task's: data/losses.py).

A `Metric` is a name, a direction, and one function of (labels, scores) that gives the metric under each row of
example weights ([b, n] -> [b]). The same function scores an evaluation (one row of ones) and the bootstrap's
resamples (each example's count in each resample: experiments/evaluation/intervals.py), so an interval is always of the
number it brackets; tests/test_results.py checks every one against scikit-learn. `TASK_METRICS` lists what each
kind of task writes at every evaluation, its headline first; everything else derives from it: the evaluation
record, the `/ci95` intervals, compare's rows, trainer.best_metric's allowed values and best_mode's default, the
HParams columns and a sweep's summary line.

A dataset's protocol (its line's `protocol` in data/__init__.py) adds the metrics `PROTOCOLS` declares for it
(LFW's `eer` and `tar_at_far_*`): each is measured on every fold of a whole split (`Folds`) and averaged over
them, with `<metric>/std` over the folds beside the average; the same functions give their intervals and
compare's rows.
"""
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tf_harness.data import TASKS


@dataclass(frozen=True)
class Metric:
    """One metric: `measure(labels, scores)` returns a function of example weights [b, n] to its value under each
    row [b]; `per_class`: measured on each class's column (a multi-label task's `auc/<class>`), with the mean of
    the defined ones as `name`."""

    name: str
    measure: Callable
    lower_is_better: bool = False
    per_class: bool = False
    far: float = None  # a TAR's false accept rate: null where a fold has fewer than 1 / far impostor pairs


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


def _verification_curve(labels, scores):
    """A function from example weights ([b, n]) to the ROC curve under each row, as roc_curve(drop_intermediate=
    False) draws it: (false accept rates, true accept rates) [b, thresholds + 1] from (0, 0), one point per
    distinct score, and the weighted different- and same-person pairs [b]; the scores are sorted once, here."""
    same = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, np.float64).reshape(-1)
    order = np.argsort(-scores, kind="stable")
    ends = np.flatnonzero(np.r_[scores[order][1:] != scores[order][:-1], True])  # each distinct score's last
    same = same[order]

    def curve(weights):
        weights = np.asarray(weights, np.float64)[:, order]
        accepted_same = np.cumsum(weights * same, axis=1)[:, ends]
        accepted_different = np.cumsum(weights * ~same, axis=1)[:, ends]
        same_total, different_total = accepted_same[:, -1], accepted_different[:, -1]
        start = np.zeros((len(weights), 1))
        with np.errstate(invalid="ignore", divide="ignore"):
            return (np.hstack([start, accepted_different / different_total[:, None]]),
                    np.hstack([start, accepted_same / same_total[:, None]]), different_total, same_total)

    return curve


def eer_function(labels, scores):
    """A function from example weights ([b, n]) to the equal error rate under each row: the false accept rate
    where it equals the false reject rate on the ROC curve interpolated linearly (NaN where a row weighs no
    same- or no different-person pair)."""
    curve = _verification_curve(labels, scores)

    def eer(weights):
        false_accept, true_accept, different, same = curve(weights)
        gap = 1 - false_accept - true_accept  # the false reject rate less the false accept rate: 1 at (0, 0)
        k = np.argmax(gap <= 0, axis=1)  # the first point at or past the crossing
        rows = np.arange(len(k))
        before, after = false_accept[rows, k - 1], false_accept[rows, k]
        with np.errstate(invalid="ignore", divide="ignore"):
            crossing = before + gap[rows, k - 1] * (after - before) / (gap[rows, k - 1] - gap[rows, k])
        return np.where((different > 0) & (same > 0), np.where(after > before, crossing, after), np.nan)

    return eer


def _resolves(different, far) -> bool:
    """Whether a fold of `different` different-person pairs resolves a false accept rate of `far`: below
    1 / `different` the only false accept rate it can measure at or under `far` is 0."""
    return different * far >= 1


def tar_function(far):
    """The measure of the true accept rate at a false accept rate of at most `far`: the highest on the ROC curve
    (NaN where a row weighs no same- or no different-person pair, and where the fold holds fewer than 1 / `far`
    different-person pairs, whose only false accept rate at most `far` is 0)."""
    def measure(labels, scores):
        curve = _verification_curve(labels, scores)
        resolved = _resolves(int((np.asarray(labels).reshape(-1) == 0).sum()), far)

        def tar(weights):
            false_accept, true_accept, different, same = curve(weights)
            best = np.where(false_accept <= far, true_accept, -np.inf).max(axis=1)
            return np.where((different > 0) & (same > 0) & resolved, best, np.nan)

        return tar

    return measure


def _tar(name, far) -> Metric:
    """The metric `name`: the true accept rate at a false accept rate of at most `far` (`tar_function`)."""
    return Metric(name, tar_function(far), far=far)


# What each kind of task writes at every evaluation, its headline metric first.
TASK_METRICS = {
    "multilabel": (Metric("auc/mean", auc_function, per_class=True),),
    "binary": (Metric("accuracy", _binary_accuracy), Metric("auc", auc_function)),
    "multiclass": (Metric("accuracy", _top1), Metric("top5_accuracy", _top5)),
}
# The protocol metrics of each protocol a dataset's line names (data/__init__.py), measured on each fold.
PROTOCOLS = {"verification": (Metric("eer", eer_function, lower_is_better=True),
                              _tar("tar_at_far_1e-2", 1e-2), _tar("tar_at_far_1e-3", 1e-3))}


@dataclass(frozen=True)
class Folds:
    """A whole split's folds (`of[i]`: example i's) and the protocol metrics measured on each of them."""

    metrics: tuple
    of: np.ndarray

    def notes(self, labels) -> dict:
        """`<metric>/null_because` for each TAR that the split's smallest fold, of `labels`, cannot resolve."""
        labels = np.asarray(labels).reshape(-1)
        different = min(int((labels[self.of == fold] == 0).sum()) for fold in np.unique(self.of))
        return {f"{metric.name}/null_because": (
                    f"a fold of {different} different-person pairs resolves false accept rates down to "
                    f"1/{different} = {1 / max(different, 1):.2g}, above {metric.far:g}")
                for metric in self.metrics if metric.far is not None and not _resolves(different, metric.far)}

    def per_fold(self, measure, labels, scores):
        """A function from example weights ([b, n]) to `measure` on each fold under each row ([folds, b])."""
        labels, scores = np.asarray(labels).reshape(-1), np.asarray(scores, np.float64).reshape(-1)
        parts = [(np.flatnonzero(self.of == fold), measure(labels[self.of == fold], scores[self.of == fold]))
                 for fold in np.unique(self.of)]
        return lambda weights: np.stack([function(weights[:, rows]) for rows, function in parts])

    def spread(self, labels, scores) -> dict:
        """`<metric>/std` of each protocol metric over the folds (ddof=1, the undefined folds left out), with two
        folds or more."""
        if len(np.unique(self.of)) < 2:
            return {}
        found = {}
        for metric in self.metrics:
            values = self.per_fold(metric.measure, labels, scores)(np.ones((1, len(self.of))))[:, 0]
            values = values[~np.isnan(values)]
            found[f"{metric.name}/std"] = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
        return found


def _protocol(dataset) -> tuple:
    """The protocol metrics of `dataset`'s line (data/__init__.py `protocol`); none for a dataset without one."""
    entry = TASKS.entries.get(dataset)
    return PROTOCOLS.get(entry.protocol, ()) if entry is not None else ()


def folds_of(dataset, table):
    """The `Folds` of `table` (a whole split of `dataset`, its `fold` column) when the dataset's line names a
    protocol; None otherwise."""
    protocol = _protocol(dataset)
    return Folds(protocol, table["fold"].to_numpy()) if protocol and "fold" in table else None


def protocol_names(dataset) -> tuple:
    """The names of the protocol metrics an evaluation of `dataset`'s whole split writes."""
    return tuple(metric.name for metric in _protocol(dataset))


def _fold_mean(per_fold):
    """A function from example weights ([b, n]) to the mean over the folds of `per_fold`'s values ([folds, b]),
    the folds where it is undefined left out."""
    def mean(weights):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a row undefined on every fold is NaN
            return np.nanmean(per_fold(weights), axis=0)

    return mean


def names(task) -> tuple:
    """The names of the metrics a task of kind `task` writes at every evaluation, its headline first."""
    return tuple(metric.name for metric in TASK_METRICS[task])


def headline(task) -> str:
    """The metric a progress line, a sweep and an HParams table lead with."""
    return TASK_METRICS[task][0].name


def lower_is_better(name) -> bool:
    """Whether a lower value of the metric `name` is the better one (loss, eer); a higher one for every other."""
    declared = {metric.name: metric for metrics in (*TASK_METRICS.values(), *PROTOCOLS.values()) for metric in metrics}
    return name == "loss" or (name in declared and declared[name].lower_is_better)


def probabilities(task, logits):
    from scipy.special import expit, softmax
    logits = np.asarray(logits, np.float64)
    return softmax(logits, axis=-1) if task == "multiclass" else expit(logits)


def functions(task, class_names, labels, scores, folds=None) -> dict:
    """Each declared metric of `task` as a function of example weights, {name: f([b, n]) -> [b]}, and with
    `folds` (a whole split's `Folds`) each protocol metric's mean over them; a per-class metric's mean is left to
    `values_under`, from its classes'."""
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
    if folds is not None:
        found.update({metric.name: _fold_mean(folds.per_fold(metric.measure, labels, scores))
                      for metric in folds.metrics})
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


def scored(task, class_names, labels, scores, folds=None) -> dict:
    """`evaluate`'s metrics from probabilities (`scores`, as predictions.csv holds them): each declared metric
    under weights of one, the protocol's with `folds` (`functions`)."""
    scores = np.asarray(scores, np.float64)
    ones = np.ones((1, len(scores)))
    return {name: float(value[0]) for name, value in
            values_under(task, functions(task, class_names, labels, scores, folds), ones).items()}
