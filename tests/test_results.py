"""The numbers a paper reports: test-split evaluation (split=test, metrics_test.json), bootstrap intervals,
the paired comparison of two runs (python -m tf_harness.compare) and LFW's verification rates.

Intervals and comparisons are checked against scikit-learn's metrics on the same resamples, written out as
explicit index arrays, never against the vectorised code itself.
"""
import contextlib
import json
import shutil
import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq
from sklearn.metrics import accuracy_score, roc_auc_score, roc_curve, top_k_accuracy_score

from tests.conftest import compose, run_cli, task_of
from tests.refusals import assert_config_error, assert_names
from tf_harness.experiments import compare
from tf_harness.experiments.config import schema
from tf_harness.experiments.evaluation import intervals, metrics


def _sklearn_metrics(task, labels, scores):
    """experiments/evaluation/metrics.py's metrics, written again from scikit-learn, for one resample."""
    if task == "multilabel":
        aucs = [roc_auc_score(labels[:, k], scores[:, k]) if 0 < labels[:, k].sum() < len(labels) else np.nan
                for k in range(labels.shape[1])]
        return {**{f"auc/c{k}": value for k, value in enumerate(aucs)}, "auc/mean": np.nanmean(aucs)}
    if task == "binary":
        return {"accuracy": accuracy_score(labels, scores > 0.5), "auc": roc_auc_score(labels, scores)}
    return {"accuracy": accuracy_score(labels, scores.argmax(-1)),
            "top5_accuracy": top_k_accuracy_score(labels, scores, k=5, labels=np.arange(scores.shape[1]))}


def _resamples(units, resamples, seed):
    """The resamples `intervals` draws, as explicit example indices."""
    return [np.repeat(np.arange(len(units)), counts)
            for chunk in intervals.resampled_weights(units, resamples, seed) for counts in chunk]


def _example(task, rng, n=240):
    patients = rng.integers(0, 60, n)
    if task == "multilabel":
        labels = (rng.random((n, 3)) < [0.3, 0.1, 0.5]).astype(int)
        return labels, np.clip(0.3 * labels + rng.random((n, 3)) * 0.7, 0, 1).round(2), patients
    if task == "binary":
        labels = rng.integers(0, 2, n)
        return labels, np.clip(0.3 * labels + rng.random(n) * 0.7, 0, 1).round(2), patients
    labels = rng.integers(0, 8, n)
    scores = rng.random((n, 8)) + 0.5 * np.eye(8)[labels]
    return labels, scores / scores.sum(axis=1, keepdims=True), patients


@pytest.mark.parametrize("task", ["multilabel", "binary", "multiclass"])
def test_intervals_are_sklearns_percentiles_over_resampled_units(task):
    rng = np.random.default_rng(1)
    labels, scores, patients = _example(task, rng)
    names = [f"c{k}" for k in range(scores.shape[1])] if task == "multilabel" else ["same"]
    found = intervals.intervals(task, names, labels, scores, patients, 200, seed=7)

    drawn = [_sklearn_metrics(task, labels[rows], scores[rows]) for rows in _resamples(patients, 200, 7)]
    expected = {f"{name}/ci95": list(np.nanpercentile([d[name] for d in drawn], [2.5, 97.5])) for name in drawn[0]}
    assert set(found) == set(expected)
    for name, interval in expected.items():
        assert found[name] == pytest.approx(interval, abs=1e-9), name
    assert found == intervals.intervals(task, names, labels, scores, patients, 200, seed=7)  # the same seed
    assert intervals.intervals(task, names, labels, scores, patients, 0, seed=7) == {}  # evaluation.bootstrap=0


@pytest.mark.parametrize("task", ["multilabel", "binary", "multiclass"])
def test_an_evaluations_metrics_are_sklearns_from_the_functions_its_intervals_resample(task):
    """Each metric is declared once (experiments/evaluation/metrics.py): the evaluation's value is its function under
    weights of one, the one the bootstrap resamples."""
    from tf_harness.experiments.evaluation import metrics
    labels, scores, _ = _example(task, np.random.default_rng(3))
    names = [f"c{k}" for k in range(scores.shape[1])] if task == "multilabel" else ["same"]
    found = metrics.scored(task, names, labels, scores)
    expected = _sklearn_metrics(task, labels, scores)
    assert list(found) == list(expected)
    assert found == pytest.approx(expected, abs=1e-12)


def test_a_resample_draws_a_patients_images_together():
    patients = np.array([5, 5, 5, 9, 9, 1])
    for counts in next(intervals.resampled_weights(patients, 50, seed=0)):
        assert counts[0] == counts[1] == counts[2] and counts[3] == counts[4]
        assert counts[[0, 3, 5]].sum() == 3  # three patients drawn, with replacement


def test_the_paired_bootstrap_is_sklearns_difference_on_the_same_resamples():
    rng = np.random.default_rng(2)
    labels, scores_a, patients = _example("binary", rng)
    scores_b = np.clip(scores_a + rng.normal(0.05 * (2 * labels - 1), 0.1), 0, 1)
    found = intervals.paired("binary", ["same"], labels, scores_a, scores_b, patients, 300, seed=3)
    for name in ("accuracy", "auc"):
        differences = np.array([_sklearn_metrics("binary", labels[rows], scores_b[rows])[name]
                                - _sklearn_metrics("binary", labels[rows], scores_a[rows])[name]
                                for rows in _resamples(patients, 300, 3)])
        interval, p = found[name]
        assert interval == pytest.approx(list(np.percentile(differences, [2.5, 97.5])), abs=1e-9)
        below, above = (np.sum(differences <= 0) + 1) / 301, (np.sum(differences >= 0) + 1) / 301
        assert p == pytest.approx(min(1.0, 2 * min(below, above)))


def test_delongs_difference_is_sklearns_and_its_p_value_agrees_with_the_bootstrap():
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, 400)
    scores_a = rng.normal(labels * 0.8, 1.0)
    scores_b = scores_a + rng.normal(labels * 0.4, 0.5)
    difference, interval, p = intervals.delong(labels, scores_a, scores_b)
    assert difference == pytest.approx(roc_auc_score(labels, scores_b) - roc_auc_score(labels, scores_a))
    assert interval[0] < difference < interval[1] and 0 <= p < 0.05
    bootstrap_interval, bootstrap_p = intervals.paired("binary", ["same"], labels, 1 / (1 + np.exp(-scores_a)),
                                                       1 / (1 + np.exp(-scores_b)), np.arange(400), 1000, 0)["auc"]
    assert interval == pytest.approx(bootstrap_interval, abs=0.01)  # two estimates of one difference's spread
    assert bootstrap_p < 0.05
    assert intervals.delong(labels, scores_a, scores_a)[2] == 1.0  # a run against itself


# LFW's verification rates -------------------------------------------------------------------------------------

def _verification_reference(labels, scores) -> dict:
    """A fold's EER by root-finding on roc_curve interpolated linearly, and its TARs from roc_curve's points."""
    false_accept, true_accept, _ = roc_curve(labels, scores, drop_intermediate=False)
    gap = lambda rate: 1 - rate - np.interp(rate, false_accept, true_accept)  # noqa: E731
    eer = 0.0 if gap(0.0) <= 0 else brentq(gap, 0.0, 1.0, xtol=1e-13)
    return {"eer": eer, **{name: true_accept[false_accept <= far].max() if (labels == 0).sum() * far >= 1 else np.nan
                           for name, far in (("tar_at_far_1e-2", 1e-2), ("tar_at_far_1e-3", 1e-3))}}


def test_lfw_verification_rates_per_fold_follow_their_definitions():
    rng = np.random.default_rng(5)
    labels = np.tile(np.repeat([1, 0], 150), 10)
    table = pd.DataFrame({"label": labels, "fold": np.repeat(np.arange(10), 300)})
    scores = rng.normal(labels * 2.0, 1.0)
    folds = metrics.folds_of("lfw_pairs", table)
    found = {**metrics.scored("binary", ["same"], labels, scores, folds), **folds.spread(labels, scores)}
    rates = {"eer": [], "tar_at_far_1e-2": [], "tar_at_far_1e-3": []}
    for fold in range(10):
        y, s = labels[table.fold == fold], scores[table.fold == fold]
        thresholds = np.sort(np.unique(s))
        accept = np.array([(s[y == 0] >= t).mean() for t in thresholds])  # false accept rate at each threshold
        true = np.array([(s[y == 1] >= t).mean() for t in thresholds])
        for name, far in (("tar_at_far_1e-2", 1e-2), ("tar_at_far_1e-3", 1e-3)):
            rates[name].append(true[accept <= far].max())
        closest = np.argmin(np.abs(accept - (1 - true)))  # where false accepts and false rejects cross
        rates["eer"].append((accept[closest] + 1 - true[closest]) / 2)
    for name, values in rates.items():
        if name == "tar_at_far_1e-3":  # 150 different pairs a fold resolve false accept rates down to 1/150 alone
            assert math.isnan(found[name]) and math.isnan(found[f"{name}/std"])
            continue
        tolerance = 1 / 150 if name == "eer" else 1e-12  # the EER is interpolated between two thresholds
        assert found[name] == pytest.approx(np.mean(values), abs=tolerance), name
        assert found[f"{name}/std"] == pytest.approx(np.std(values, ddof=1), abs=tolerance), name


def test_the_eer_and_tar_of_any_weights_are_those_of_the_rows_repeated():
    """The declared EER and TARs under example weights (a resample's counts) are roc_curve's of the examples
    repeated that many times: the interval brackets the number the evaluation reports."""
    rng = np.random.default_rng(12)
    for _ in range(200):
        n = int(rng.integers(4, 120))
        labels = rng.integers(0, 2, n)
        scores = np.round(rng.normal(labels * rng.uniform(0, 3), 1.0), int(rng.integers(0, 3)))  # ties too
        counts = rng.integers(0, 3, n)
        for weights, rows in ((np.ones(n, int), np.arange(n)), (counts, np.repeat(np.arange(n), counts))):
            if labels[rows].min() == labels[rows].max():
                continue
            expected = _verification_reference(labels[rows], scores[rows])
            for metric in metrics.PROTOCOLS["verification"]:
                got = metric.measure(labels, scores)(weights[None, :])[0]
                if metric.far is not None and (labels == 0).sum() * metric.far < 1:
                    assert math.isnan(got)
                    continue
                assert got == pytest.approx(expected[metric.name], abs=1e-10), metric.name


def test_lfw_test_intervals_of_the_eer_are_percentiles_of_its_resamples():
    rng = np.random.default_rng(13)
    labels = np.tile(np.repeat([1, 0], 120), 10)
    table = pd.DataFrame({"label": labels, "fold": np.repeat(np.arange(10), 240)})
    scores = 1 / (1 + np.exp(-rng.normal(labels * 1.5, 1.0)))
    folds = metrics.folds_of("lfw_pairs", table)
    bounds = intervals.intervals("binary", ["same"], labels, scores, np.arange(len(labels)), 100, 3, folds)
    assert {"eer/ci95", "tar_at_far_1e-2/ci95", "tar_at_far_1e-3/ci95"} <= set(bounds)
    assert bounds["tar_at_far_1e-3/ci95"] is None  # null where the value is: 120 impostor pairs a fold
    resampled = []
    for rows in _resamples(np.arange(len(labels)), 100, 3):
        per_fold = [_verification_reference(labels[rows][table.fold.to_numpy()[rows] == fold],
                                            scores[rows][table.fold.to_numpy()[rows] == fold])["eer"]
                    for fold in range(10)]
        resampled.append(np.mean(per_fold))
    assert bounds["eer/ci95"] == pytest.approx(list(np.percentile(resampled, [2.5, 97.5])), abs=1e-9)
    value = metrics.scored("binary", ["same"], labels, scores, folds)["eer"]
    assert bounds["eer/ci95"][0] < value < bounds["eer/ci95"][1]


@pytest.mark.parametrize("different, unresolved", [(150, ["tar_at_far_1e-3"]), (30, ["tar_at_far_1e-2",
                                                   "tar_at_far_1e-3"]), (1000, [])])
def test_a_tar_at_a_far_the_folds_cannot_resolve_is_null_with_its_reason(different, unresolved):
    """On folds of 30 different pairs, tar_at_far_1e-3 was the same number as tar_at_far_1e-2: both the TAR at a
    FAR of 0, and nothing said so."""
    rng = np.random.default_rng(11)
    labels = np.tile(np.repeat([1, 0], different), 3)
    table = pd.DataFrame({"label": labels, "fold": np.repeat(np.arange(3), 2 * different)})
    folds = metrics.folds_of("lfw_pairs", table)
    found = metrics.scored("binary", ["same"], labels, rng.normal(labels * 2.0, 1.0), folds)
    notes = folds.notes(labels)
    assert sorted(name for name in ("tar_at_far_1e-2", "tar_at_far_1e-3") if math.isnan(found[name])) == unresolved
    assert sorted(notes) == [f"{name}/null_because" for name in unresolved]
    for name in unresolved:
        assert_names(notes[f"{name}/null_because"], f"{different} different-person pairs", f"1/{different}")


# The config --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, named", [
    (("split=test",), ("split=test ", "mode=evaluate|predict")),
    (("mode=export", "split=validation"), ("split=validation ", "mode=evaluate|predict")),
    (("mode=evaluate", "dataset=imagenet_det", "split=test"), ("split=test:", "dataset=imagenet_det", "no test split")),
    (("mode=evaluate", "split=train"), ("split=train ", "validation|test")),
    (("evaluation.bootstrap=-1",), ("evaluation.bootstrap=-1 ", ">= 40")),
])
def test_a_bad_split_or_bootstrap_is_one_config_line(overrides, named):
    assert_names(schema.first_problem(compose(*overrides)), *named)


def test_split_test_in_a_training_run_exits_2_before_tensorflow(tmp_path):
    result = run_cli("split=test", f"hydra.run.dir={tmp_path / 'run'}", timeout=120)
    assert_config_error(result, "split=test ", "mode=evaluate", alone=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_good_split_values_pass():
    for overrides in [("mode=evaluate", "split=test"), ("mode=predict", "split=validation"),
                      ("mode=evaluate", "dataset=lfw_pairs", "split=test"), ("evaluation.bootstrap=0",)]:
        assert schema.first_problem(compose(*overrides)) is None, overrides


# The evaluator: what it writes where ---------------------------------------------------------------------------

class _Trainer:
    """Stands in for experiments/training/trainer.py's Trainer: fixed logits per example, at a settable global step."""

    def __init__(self, logits, step):
        self.logits, self.step = logits, step

    def averaged(self):
        return contextlib.nullcontext()

    def eval_step(self, features, labels, weights):
        import tensorflow as tf
        return tf.constant(0.5 * len(features)), tf.constant(self.logits[features])


class _Summaries:
    def scalars(self, *args):
        pass

    def evaluation(self, *args):
        pass

    def heatmaps(self, *args):
        pass


def _evaluator(tmp_path, step, chosen=None, bootstrap=0):
    import tensorflow as tf
    from tf_harness.experiments.evaluator import Evaluator

    rng = np.random.default_rng(0)
    task = task_of(compose("dataset=lfw_pairs"))
    labels = np.tile([1, 0], 20)
    table = pd.DataFrame({"path_a": [f"a{k}.jpg" for k in range(40)], "path_b": [f"b{k}.jpg" for k in range(40)],
                          "label": labels, "fold": np.repeat(np.arange(2), 20)})
    logits = rng.normal(labels * 1.5 - 0.75, 1.0).reshape(-1, 1).astype(np.float32)

    def input_fn(split, rows=None):
        return [(tf.range(k, min(k + 8, 40)), None, tf.ones([min(8, 40 - k)])) for k in range(0, 40, 8)]

    evaluator = Evaluator(task, _Trainer(logits, step), {"validation": table, "test": table}, _Summaries(), tmp_path,
                          batch_size=8, eval_steps=None, seed=42, input_fn=input_fn, note_unreadable=lambda: None,
                          chosen=chosen, bootstrap=bootstrap)
    return evaluator, labels, logits


def test_evaluating_an_older_checkpoint_leaves_the_training_runs_record_and_re_entry_alone(tmp_path):
    """`mode=evaluate checkpoint=best` used to replace metrics.json with the best step's record, dropping
    `stopped_early`; the next training re-entry then redid the last evaluation as if it had been interrupted."""
    from tf_harness.experiments.run_dir.directory import RunDirectory

    last = {"accuracy": 0.5, "global_step": 4, "stopped_early": True, "best_global_step": 2, "best_value": 0.9}
    (tmp_path / "metrics.json").write_text(json.dumps(last))
    before = (tmp_path / "metrics.json").read_bytes()
    evaluator, _, _ = _evaluator(tmp_path, step=2, chosen="best")
    evaluator.evaluate()
    assert (tmp_path / "metrics.json").read_bytes() == before
    assert RunDirectory(tmp_path).evaluated(4)  # a re-entry finds its last evaluation made
    beside = json.loads((tmp_path / "metrics_validation.json").read_text())
    assert beside["global_step"] == 2 and beside["checkpoint"] == "best"
    assert not (tmp_path / "metrics.jsonl").exists()  # the training run's history has no step 2 after step 4

    evaluator, _, _ = _evaluator(tmp_path, step=4, chosen="latest")  # the step metrics.json holds: rewritten
    evaluator.evaluate()
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["global_step"] == 4 and record["stopped_early"] is True and record["best_global_step"] == 2


def test_a_test_evaluation_writes_metrics_test_json_with_sklearns_intervals_and_leaves_metrics_json(tmp_path):
    (tmp_path / "metrics.json").write_text('{"global_step": 4}')
    evaluator, labels, logits = _evaluator(tmp_path, step=4, chosen="latest", bootstrap=300)
    evaluator.evaluate("test")
    assert (tmp_path / "metrics.json").read_text() == '{"global_step": 4}'
    record = json.loads((tmp_path / "metrics_test.json").read_text())
    assert record["split"] == "test" and record["examples"] == 40 and record["bootstrap"]["resamples"] == 300
    scores = 1 / (1 + np.exp(-logits.reshape(-1).astype(np.float64)))
    assert record["auc"] == pytest.approx(roc_auc_score(labels, scores))
    drawn = [roc_auc_score(labels[rows], scores[rows]) for rows in _resamples(np.arange(40), 300, 42)]
    assert record["auc/ci95"] == pytest.approx(list(np.percentile(drawn, [2.5, 97.5])), abs=1e-6)
    assert {"accuracy/ci95", "eer", "eer/std", "tar_at_far_1e-2/std"} <= set(record)


def test_a_test_evaluation_of_another_checkpoint_keeps_the_earlier_ones_record(tmp_path):
    """`mode=evaluate split=test checkpoint=2`, then `split=test` of the latest, silently replaced the first test
    record."""
    (tmp_path / "metrics.json").write_text('{"global_step": 4}')
    for step, chosen in ((2, 2), (4, "latest")):
        evaluator, _, _ = _evaluator(tmp_path, step=step, chosen=chosen)
        evaluator.evaluate("test")
    assert json.loads((tmp_path / "metrics_test.json").read_text())["global_step"] == 4
    history = [json.loads(line) for line in (tmp_path / "metrics_test.jsonl").read_text().splitlines()]
    assert [(record["global_step"], record["checkpoint"]) for record in history] == [(2, 2), (4, "latest")]
    assert history[0]["auc"] == pytest.approx(json.loads((tmp_path / "metrics_test.json").read_text())["auc"])


def test_a_test_record_says_how_many_of_its_people_or_patients_were_in_training():
    """A default LFW run's test record did not say that 44 of View 2's 66 people were seen in training."""
    lfw = task_of(compose("dataset=lfw_pairs"))
    tables = {"train": pd.DataFrame({"person": ["Ann", "Bob", "Cy"]}),
              "test": pd.DataFrame({"name_a": ["Ann", "Dee", "Eve"], "name_b": ["Ann", "Bob", "Fay"]})}
    assert lfw.seen_in_training(tables, "test") == {"unit": "person", "seen": 2, "of": 5}
    chest = task_of(compose("dataset=chest_xray"))
    tables = {"train": pd.DataFrame({"patient_id": [1, 2]}), "test": pd.DataFrame({"patient_id": [3, 3, 4]})}
    assert chest.seen_in_training(tables, "test") == {"unit": "patient", "seen": 0, "of": 2}
    assert task_of(compose("dataset=imagenet_det")).seen_in_training(tables, "test") is None


def test_predictions_of_the_validation_split_leave_the_test_splits_predictions_csv(tmp_path):
    """`mode=predict split=validation` silently replaced the test predictions.csv that compare --split test needs."""
    evaluator, _, _ = _evaluator(tmp_path, step=4)
    evaluator.predict()
    evaluator.predict("validation")
    assert set(pd.read_csv(tmp_path / "predictions.csv").split) == {"test"}
    assert set(pd.read_csv(tmp_path / "predictions_validation.csv").split) == {"validation"}
    run_dir = tmp_path / "run"
    shutil.copytree(tmp_path, run_dir)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("dataset:\n  name: lfw_pairs\n")
    for split in ("test", "validation"):
        assert compare.read_run(run_dir, split)[1].split.eq(split).all()


def test_lfw_predictions_name_each_pairs_fold_and_the_split(tmp_path):
    evaluator, _, _ = _evaluator(tmp_path, step=4)
    evaluator.predict("test")
    predictions = pd.read_csv(tmp_path / "predictions.csv")
    assert list(predictions.fold) == [0] * 20 + [1] * 20 and set(predictions.split) == {"test"}


def test_each_lfw_evaluation_shows_its_roc_curve_in_tensorboard(tmp_path):
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tf_harness.experiments.evaluation import review

    spec = task_of(compose("dataset=lfw_pairs")).SPEC
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        review.write_evaluation(spec, np.tile([1, 0], 10), np.linspace(0, 1, 20), step=3)
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0}).Reload()
    assert "roc" in events.Tags()["tensors"]
    assert [event.step for event in events.Tensors("roc")] == [3]


# The comparison -----------------------------------------------------------------------------------------------

def _run(folder, dataset, predictions):
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(f"dataset:\n  name: {dataset}\n")
    predictions.to_csv(folder / "predictions.csv", index=False)
    return folder


def _chest_predictions(rng, scores=None, split="test"):
    findings = ["Atelectasis", "Cardiomegaly", "Effusion"]
    labels = (rng.random((300, 3)) < 0.3).astype(int)
    scores = np.clip(0.25 * labels + rng.random((300, 3)) * 0.75, 0, 1) if scores is None else scores
    table = pd.DataFrame({"path": [f"/data/images/{k:08d}_000.png" for k in range(300)],
                          "patient_id": np.repeat(np.arange(100), 3)})
    table[findings] = scores
    table[[f"label/{name}" for name in findings]] = labels
    table["global_step"], table["split"] = 9, split
    return table


def test_compare_scores_two_runs_as_sklearn_does_resampling_patients(tmp_path, capsys):
    rng = np.random.default_rng(6)
    a = _chest_predictions(rng)
    b = a.copy()
    b[["Atelectasis", "Cardiomegaly", "Effusion"]] = np.clip(a[["Atelectasis", "Cardiomegaly", "Effusion"]]
                                                             + rng.normal(0, 0.1, (300, 3)), 0, 1)
    run_a, run_b = _run(tmp_path / "a", "chest_xray", a), _run(tmp_path / "b", "chest_xray", b)
    assert compare.main([str(run_a), str(run_b), "--resamples", "200"]) == 0
    printed = capsys.readouterr().out
    assert "300 examples (100 patient_ids)" in printed

    _, rows = compare.compare(run_a, run_b, "test", 200, 42)
    rows = {row["metric"]: row for row in rows}
    labels = a[[c for c in a if c.startswith("label/")]].to_numpy()
    scores_a, scores_b = a[["Atelectasis", "Cardiomegaly", "Effusion"]].to_numpy(), \
        b[["Atelectasis", "Cardiomegaly", "Effusion"]].to_numpy()
    auc = lambda y, s: np.mean([roc_auc_score(y[:, k], s[:, k]) for k in range(3)])  # noqa: E731
    assert rows["auc/mean"]["a"] == pytest.approx(auc(labels, scores_a))
    assert rows["auc/mean"]["difference"] == pytest.approx(auc(labels, scores_b) - auc(labels, scores_a))
    differences = [auc(labels[r], scores_b[r]) - auc(labels[r], scores_a[r])
                   for r in _resamples(a.patient_id.to_numpy(), 200, 42)]
    assert rows["auc/mean"]["interval"] == pytest.approx(list(np.percentile(differences, [2.5, 97.5])), abs=1e-9)
    assert rows["auc/mean"]["test"].startswith("paired bootstrap")
    assert f"{rows['auc/mean']['p']:7.4f}" in printed


def test_compare_of_two_lfw_runs_reports_the_protocols_rates_with_intervals(tmp_path, capsys):
    """compare reported accuracy and AUC only on LFW, not the EER and TARs its test evaluation headlines."""
    rng = np.random.default_rng(14)
    labels = np.tile(np.repeat([1, 0], 120), 10)
    table = pd.DataFrame({"path_a": [f"/data/lfw/A/A_{k:04d}.jpg" for k in range(2400)],
                          "path_b": [f"/data/lfw/B/B_{k:04d}.jpg" for k in range(2400)],
                          "fold": np.repeat(np.arange(10), 240), "label": labels})
    a, b = table.copy(), table.copy()
    a["same"] = 1 / (1 + np.exp(-rng.normal(labels * 1.0, 1.0)))
    b["same"] = 1 / (1 + np.exp(-rng.normal(labels * 2.0, 1.0)))
    for frame in (a, b):
        frame["global_step"], frame["split"] = 9, "test"
    run_a, run_b = _run(tmp_path / "a", "lfw_pairs", a), _run(tmp_path / "b", "lfw_pairs", b)
    assert compare.main([str(run_a), str(run_b), "--resamples", "100"]) == 0
    printed = capsys.readouterr().out
    _, rows = compare.compare(run_a, run_b, "test", 100, 42)
    rows = {row["metric"]: row for row in rows}
    assert set(rows) == {"accuracy", "auc", "eer", "tar_at_far_1e-2"}
    per_fold = lambda scores: np.mean([_verification_reference(labels[table.fold == k], scores[table.fold == k])["eer"]
                                       for k in range(10)])  # noqa: E731
    assert rows["eer"]["a"] == pytest.approx(per_fold(a.same.to_numpy()), abs=1e-9)
    assert rows["eer"]["difference"] == pytest.approx(per_fold(b.same.to_numpy()) - per_fold(a.same.to_numpy()),
                                                      abs=1e-9)
    low, high = rows["eer"]["interval"]
    assert low < rows["eer"]["difference"] < high < 0 and rows["eer"]["p"] < 0.05  # B's EER is lower
    assert "eer" in printed and "tar_at_far_1e-2" in printed
    assert_names(printed.splitlines()[0], "no row for tar_at_far_1e-3 (a fold of 120 different-person pairs")


def test_compare_refuses_runs_of_other_examples_in_one_line(tmp_path, capsys):
    rng = np.random.default_rng(7)
    a = _chest_predictions(rng)
    run_a = _run(tmp_path / "a", "chest_xray", a)
    renamed = a.copy()
    renamed.loc[5, "path"] = "/data/images/99999999_000.png"
    relabelled = a.copy()
    relabelled.loc[7, "label/Effusion"] = 1 - relabelled.loc[7, "label/Effusion"]
    cases = {"another dataset": _run(tmp_path / "lfw", "lfw_pairs", a),
             "another split": _run(tmp_path / "validation", "chest_xray", _chest_predictions(rng, split="validation")),
             "another example": _run(tmp_path / "renamed", "chest_xray", renamed),
             "another label": _run(tmp_path / "relabelled", "chest_xray", relabelled),
             "fewer examples": _run(tmp_path / "fewer", "chest_xray", a.iloc[:-1]),
             "no predictions": tmp_path / "none"}
    for why, run_b in cases.items():
        assert compare.main([str(run_a), str(run_b)]) == 2, why
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("compare: "), why


def test_compare_of_a_dataset_without_a_test_split_points_to_the_validation_split(tmp_path, capsys):
    """imagenet_det has no test split: compare looked for predictions_test.csv and said to write it with a command
    that is a config error."""
    table = pd.DataFrame({"path": ["/data/a.JPEG", "/data/b.JPEG"], "label": [0, 1], "background": [0.9, 0.2],
                          "n01443537": [0.1, 0.8], "global_step": 9, "split": "validation"})
    run_a, run_b = _run(tmp_path / "a", "imagenet_det", table), _run(tmp_path / "b", "imagenet_det", table)
    assert compare.main([str(run_a), str(run_b)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert_names(err, "dataset=imagenet_det", "no test split", "--split validation")
    assert compare.main([str(run_a), str(run_b), "--split", "validation", "--resamples", "40"]) == 0


def test_compare_refuses_a_predictions_file_cut_mid_row_in_one_line(tmp_path, capsys):
    """A predictions.csv cut mid-row, as a kill during a plain write left it, ended compare in a TypeError."""
    a = _chest_predictions(np.random.default_rng(10))
    run_a, run_b = _run(tmp_path / "a", "chest_xray", a), _run(tmp_path / "b", "chest_xray", a)
    text = (run_b / "predictions.csv").read_text()
    (run_b / "predictions.csv").write_text(text[:len(text) // 2])
    assert compare.main([str(run_a), str(run_b)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert_names(err, run_b / "predictions.csv", "damaged")


def test_compare_matches_the_same_examples_under_another_root_and_in_another_order(tmp_path):
    """The same examples predicted under another mount or HARNESS_CACHE, or written in another order, were refused
    as "different examples"."""
    rng = np.random.default_rng(9)
    a = _chest_predictions(rng)
    b = a.copy()
    b[["Atelectasis", "Cardiomegaly", "Effusion"]] = rng.random((300, 3))
    moved = b.copy()
    moved["path"] = moved.path.str.replace("/data/", "/mnt/other-machine/nih/")
    shuffled = moved.sample(frac=1, random_state=3).reset_index(drop=True)
    run_a = _run(tmp_path / "a", "chest_xray", a)
    expected = compare.compare(run_a, _run(tmp_path / "b", "chest_xray", b), "test", 100, 42)[1]
    for name, table in (("moved", moved), ("shuffled", shuffled)):
        got = compare.compare(run_a, _run(tmp_path / name, "chest_xray", table), "test", 100, 42)[1]
        assert got == expected, name


@pytest.mark.parametrize("resamples", ["0", "-5", "1", "39"])
def test_compare_refuses_too_few_resamples_for_a_95_interval_in_one_line(tmp_path, capsys, resamples):
    """--resamples 0 or a negative count ended in an IndexError traceback; 1 gave an interval of one resample."""
    a = _chest_predictions(np.random.default_rng(8))
    run_a, run_b = _run(tmp_path / "a", "chest_xray", a), _run(tmp_path / "b", "chest_xray", a)
    assert compare.main([str(run_a), str(run_b), "--resamples", resamples]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert_names(err, f"--resamples={resamples}", "40")
    assert compare.main([str(run_a), str(run_b), "--resamples", "40"]) == 0


@pytest.mark.parametrize("resamples", [1, 39, -1])
def test_an_evaluation_bootstrap_too_small_for_a_95_interval_is_a_config_error(resamples):
    """evaluation.bootstrap=1 gave a "95% interval" that excluded its own estimate."""
    line = schema.first_problem(compose(f"evaluation.bootstrap={resamples}"))
    assert_names(line, f"evaluation.bootstrap={resamples}", "40")
    assert schema.first_problem(compose("evaluation.bootstrap=40")) is None
    assert schema.first_problem(compose("evaluation.bootstrap=0")) is None


@pytest.mark.slow  # two LFW runs, each evaluated and predicted on its test split
def test_test_split_evaluation_predictions_and_compare_end_to_end(tmp_path):
    """The runs in this process (api.run, the command line's path); the comparison as the command a user types,
    whose start-up is part of what it checks."""
    from tf_harness.experiments import api
    runs = [tmp_path / "a", tmp_path / "b"]
    for run_dir, steps in zip(runs, (4, 8)):
        api.run(["dataset=lfw_pairs", "experiment=smoke", f"trainer.train_steps={steps}"], run_dir=str(run_dir))
        before = (run_dir / "metrics.json").read_bytes()
        api.run(["mode=evaluate", "split=test"], run_dir=str(run_dir))
        assert (run_dir / "metrics.json").read_bytes() == before
        record = json.loads((run_dir / "metrics_test.json").read_text())
        assert record["examples"] == 600 and record["global_step"] == steps  # View 2: the sample's ten folds
        api.run(["mode=predict", "split=test"], run_dir=str(run_dir))
        predictions = pd.read_csv(run_dir / "predictions.csv")
        assert record["auc"] == pytest.approx(roc_auc_score(predictions.label, predictions.same), abs=1e-6)
        assert sorted(predictions.fold.unique()) == list(range(10))
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "tf_harness.compare", *map(str, runs)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = (pd.read_csv(run_dir / "predictions.csv") for run_dir in runs)
    auc_line = next(line for line in result.stdout.splitlines() if line.startswith("auc "))
    assert f"{roc_auc_score(b.label, b.same) - roc_auc_score(a.label, a.same):+8.4f}" in auc_line
    assert auc_line.endswith("DeLong")


def test_predict_refuses_a_named_pipe_at_predictions_csv_in_one_line_without_waiting_on_it(shared_runs, tmp_path):
    """predictions.csv was written in place with a plain to_csv: a named pipe there made mode=predict hang, and a
    kill mid-write left a file cut mid-row. It is written whole through the door now, which refuses the pipe (it
    is nobody's file of the run's) at once, and leaves it there."""
    import os
    import signal

    from tf_harness.experiments import api
    from tests.shared_runs import SMOKE

    run_dir = shared_runs.copy(*SMOKE["lfw_pairs"], to=tmp_path / "run")  # the run test_api.py copies too
    os.mkfifo(run_dir / "predictions.csv")

    def waited(signum, frame):
        raise TimeoutError("mode=predict waited on the named pipe at predictions.csv")

    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(120)
    try:
        with pytest.raises(api.RunFailed) as refused:
            api.run(["mode=predict"], run_dir=str(run_dir))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert_names(str(refused.value), f"{run_dir / 'predictions.csv'} is a named pipe", "move it away")
    assert (run_dir / "predictions.csv").is_fifo()
    assert not [path.name for path in run_dir.iterdir() if path.name.endswith(".tmp")]
