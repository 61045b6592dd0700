"""Bootstrap intervals of an evaluation's metrics, and paired differences between two runs on the same examples.

A resample draws the units the data is drawn in (a patient's images together; a pair; an image), with
replacement, as many as there are: `resampled_weights` gives each example's count in each resample, and every
metric is computed as a weighted one, so that a resample is never copied out. The metrics are the declarations of
experiments/evaluation/metrics.py, the same functions that score the evaluation, vectorised over the resamples. The
intervals are percentile intervals, seeded, so the same evaluation gives the same interval.
"""
import numpy as np
import pandas as pd
from scipy import stats

from tf_harness.experiments.evaluation import metrics

LEVEL = 0.95
# Resamples computed at once: bounds the memory of a [chunk, examples] weight matrix.
CHUNK = 100


def resampled_weights(units, resamples, seed):
    """Yields [b, n] arrays, `resamples` rows in all: how many times each of the n examples is drawn in each
    resample, when the units (`units[i]`: the unit of example i, e.g. its patient) are drawn with replacement,
    as many as there are."""
    codes = pd.factorize(pd.Series(np.asarray(units)))[0]
    count = int(codes.max()) + 1
    rng = np.random.default_rng(seed)
    for start in range(0, resamples, CHUNK):
        drawn = rng.multinomial(count, np.full(count, 1.0 / count), size=min(CHUNK, resamples - start))
        yield drawn[:, codes]


def _all_replicates(task, class_names, labels, scores, units, resamples, seed, folds) -> dict:
    functions = metrics.functions(task, class_names, labels, scores, folds)
    parts = [metrics.values_under(task, functions, weights) for weights in resampled_weights(units, resamples, seed)]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def percentile_interval(values):
    """The central LEVEL interval of bootstrap `values`, the undefined ones left out: [low, high] or None."""
    values = np.asarray(values, np.float64)
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return [float(low), float(high)]


def intervals(task, class_names, labels, scores, units, resamples, seed, folds=None) -> dict:
    """`<metric>/ci95: [low, high]` for each of `scored`'s metrics (the protocol's too, with a whole split's
    `folds`), from `resamples` resamples of the `units` seeded with `seed`; {} with no resamples or no examples."""
    if not resamples or not len(units):
        return {}
    drawn = _all_replicates(task, class_names, labels, scores, units, resamples, seed, folds)
    return {f"{name}/ci95": percentile_interval(values) for name, values in drawn.items()}


def paired(task, class_names, labels, scores_a, scores_b, units, resamples, seed, folds=None) -> dict:
    """Run B against run A on the same examples: {metric: (difference B - A's interval, p-value)}, each from
    the same resamples of both, the p-value two-sided: twice the smaller share of resampled differences on
    either side of 0 (counting the observed one), at most 1."""
    a = _all_replicates(task, class_names, labels, scores_a, units, resamples, seed, folds)
    b = _all_replicates(task, class_names, labels, scores_b, units, resamples, seed, folds)
    found = {}
    for name in a:
        difference = b[name] - a[name]
        difference = difference[~np.isnan(difference)]
        if not len(difference):
            found[name] = (None, float("nan"))
            continue
        below = (np.sum(difference <= 0) + 1) / (len(difference) + 1)
        above = (np.sum(difference >= 0) + 1) / (len(difference) + 1)
        found[name] = (percentile_interval(difference), float(min(1.0, 2 * min(below, above))))
    return found


def delong(labels, scores_a, scores_b):
    """DeLong's test of two correlated ROC AUCs on the same examples (DeLong et al. 1988, in the fast form of
    Sun and Xu 2014): (AUC B - AUC A, its interval at LEVEL, the two-sided p-value)."""
    labels = np.asarray(labels).reshape(-1).astype(bool)
    positives, negatives = labels.sum(), (~labels).sum()
    if not positives or not negatives:
        return float("nan"), None, float("nan")
    aucs, v10, v01 = [], [], []
    for scores in (np.asarray(scores_a, np.float64).reshape(-1), np.asarray(scores_b, np.float64).reshape(-1)):
        pos, neg = scores[labels], scores[~labels]
        # Midranks: rank of each positive among positives, among negatives, and among all.
        all_ranks = stats.rankdata(np.r_[pos, neg])
        pos_ranks, neg_ranks = stats.rankdata(pos), stats.rankdata(neg)
        placements_pos = (all_ranks[:positives] - pos_ranks) / negatives  # share of negatives below each positive
        placements_neg = 1 - (all_ranks[positives:] - neg_ranks) / positives
        aucs.append(placements_pos.mean())
        v10.append(placements_pos)
        v01.append(placements_neg)
    s10, s01 = np.cov(np.stack(v10)), np.cov(np.stack(v01))
    variance = (s10[0, 0] + s10[1, 1] - 2 * s10[0, 1]) / positives + (s01[0, 0] + s01[1, 1] - 2 * s01[0, 1]) / negatives
    difference = aucs[1] - aucs[0]
    if variance <= 0:
        return float(difference), [float(difference)] * 2, 1.0 if difference == 0 else 0.0
    z = difference / np.sqrt(variance)
    half = stats.norm.ppf(0.5 + LEVEL / 2) * np.sqrt(variance)
    return float(difference), [float(difference - half), float(difference + half)], float(2 * stats.norm.sf(abs(z)))
