"""Every evaluation's record holds its metrics' 95% bootstrap intervals (evaluation.bootstrap): metrics.json and
metrics.jsonl of a validation evaluation, as metrics_test.json of a test one, each beside the metrics it already held.

The intervals are checked against scikit-learn's metrics on resamples drawn here with numpy, the units drawn with
replacement as many as there are (experiments/evaluation/intervals.py's scheme, written again), never against the code
itself.
"""
import json

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import accuracy_score, roc_auc_score

from tests.test_results import _evaluator


def numpy_resamples(units, resamples, seed, chunk=100):
    """Example indices of each resample: `resamples` draws of as many units as there are, with replacement, each
    drawn unit bringing all its examples; numpy's generator seeded with `seed`, drawn `chunk` resamples at a time
    as multinomial counts of the units in order of first appearance."""
    codes, found = pd.factorize(pd.Series(np.asarray(units)))
    rng = np.random.default_rng(seed)
    rows = []
    for start in range(0, resamples, chunk):
        counts = rng.multinomial(len(found), np.full(len(found), 1.0 / len(found)), size=min(chunk, resamples - start))
        rows += [np.repeat(np.arange(len(codes)), per_example) for per_example in counts[:, codes]]
    return rows


def percentiles(values):
    return list(np.percentile(values, [2.5, 97.5]))


def test_a_validation_evaluation_records_sklearns_intervals_beside_its_metrics(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    evaluator, _, _ = _evaluator(plain, step=4, bootstrap=0)
    evaluator.evaluate()
    without = json.loads((plain / "metrics.json").read_text())
    assert not [key for key in without if key.endswith("/ci95")] and without["bootstrap"]["resamples"] == 0

    evaluator, labels, logits = _evaluator(tmp_path, step=4, bootstrap=300)
    evaluator.evaluate()
    record = json.loads((tmp_path / "metrics.json").read_text())
    # The keys metrics.json held are there, with the same values; the intervals and how they were drawn are added.
    assert {key: record[key] for key in without if key != "bootstrap"} == {
        key: value for key, value in without.items() if key != "bootstrap"}
    assert record["bootstrap"] == {"resamples": 300, "unit": "example", "over": "pairs", "seed": 42}
    scores = 1 / (1 + np.exp(-logits.reshape(-1).astype(np.float64)))
    drawn = numpy_resamples(np.arange(len(labels)), 300, 42)
    assert record["auc/ci95"] == pytest.approx(percentiles([roc_auc_score(labels[r], scores[r]) for r in drawn]),
                                               abs=1e-9)
    assert record["accuracy/ci95"] == pytest.approx(
        percentiles([accuracy_score(labels[r], scores[r] > 0.5) for r in drawn]), abs=1e-9)
    (line,) = [json.loads(text) for text in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert line["auc/ci95"] == record["auc/ci95"] and line["bootstrap"] == record["bootstrap"]
    # What the run's summaries and final metrics get stays the metrics alone.
    assert not [key for key in evaluator.last_values if key.endswith("/ci95")]

