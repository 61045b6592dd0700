"""Two of the one-place edits docs/architecture.md shows, made in a copy of the project and seen everywhere they
reach: a metric is one declaration in experiments/evaluation/metrics.py, a logged training number one entry in the dict
`Trainer.train_step` returns. (The third, a loss, is a Task's `loss`: tests/test_training_loop.py.)"""
import json
import math
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.conftest import event_tags
from tests.test_adding_a_dataset import _copy_project

# The metric: LFW's error rate, lower is better, declared beside the binary task's accuracy and AUC.
DECLARED = 'Metric("auc", auc_function)),'
METRIC = ('Metric("auc", auc_function), Metric("error_rate", lambda labels, scores: '
          '(lambda weights: 1 - _binary_accuracy(labels, scores)(weights)), lower_is_better=True)),')
# The logged number: the mean norm of the logits over the batch.
MEASURED = "        measured = _accuracy(self.spec.task, own, logits, weights)\n"
LOGGED = '        measured["logit_norm"] = tf.reduce_mean(tf.norm(tf.cast(logits, tf.float32), axis=-1))\n'

# Run in the copy, in one process: train with the new metric as trainer.best_metric, predict the test split, and
# compare the run with a copy of itself on it.
PROBE = """
import json, shutil, sys
from pathlib import Path
from tf_harness.experiments import api, compare

run, twin = Path(sys.argv[1]), Path(sys.argv[2])
api.run(["dataset=lfw_pairs", "experiment=smoke", "trainer.best_metric=error_rate", "trainer.keep_best=true",
         "evaluation.bootstrap=50"], run_dir=run)
api.run(["mode=predict", "split=test"], run_dir=run)
shutil.copytree(run, twin)
_, rows = compare.compare(run, twin, "test", 50, 42)
print(json.dumps([row["metric"] for row in rows]))
"""


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    """The copy with both edits, its probe's output and its run directory."""
    base = tmp_path_factory.mktemp("edits")
    copy = _copy_project(base / "tf_harness")
    for path, anchor, added in [("experiments/evaluation/metrics.py", DECLARED, METRIC),
                                ("experiments/training/trainer.py", MEASURED, MEASURED + LOGGED)]:
        text = (copy / path).read_text()
        assert text.count(anchor) == 1, f"{path} no longer holds the line this test edits: {anchor.strip()}"
        (copy / path).write_text(text.replace(anchor, added))
    # The copy's modules come first on the path (tests/test_adding_a_dataset.py says why).
    env = dict(os.environ, PYTHONPATH=str(base))
    probe = subprocess.run([sys.executable, "-c", PROBE, str(base / "run"), str(base / "twin")], cwd=copy, env=env,
                           capture_output=True, text=True, timeout=600, check=False)
    assert probe.returncode == 0, probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1]), base / "run"


def _history(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # a training process
def test_a_metric_declared_once_is_evaluated_with_its_interval_compared_kept_best_and_a_column(edited):
    compared, run_dir = edited
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["error_rate"] == pytest.approx(1 - record["accuracy"], abs=1e-12)
    low, high = record["error_rate/ci95"]
    assert low <= record["error_rate"] <= high and low < high
    assert "error_rate" in compared
    best = json.loads((run_dir / "best.json").read_text())
    assert (best["metric"], best["mode"]) == ("error_rate", "min")  # best_mode's default follows the declaration
    assert best["value"] == min(line["error_rate"] for line in _history(run_dir))
    from tensorboard.plugins.hparams import metadata
    accumulator, _ = event_tags(run_dir)
    experiment = metadata.parse_experiment_plugin_data(
        accumulator.SummaryMetadata(metadata.EXPERIMENT_TAG).plugin_data.content)
    assert "error_rate" in [info.name.tag for info in experiment.metric_infos]


@pytest.mark.slow  # a training process
def test_a_number_the_step_measures_is_logged_in_tensorboard_the_log_and_metrics_jsonl(edited):
    _, run_dir = edited
    accumulator, tags = event_tags(run_dir / "train")
    assert "logit_norm" in tags
    logged = {event.step: float(tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors("logit_norm")}
    assert sorted(logged) == [1, 2, 3, 4]  # every log_every=1 step of the 4
    assert all(math.isfinite(value) and value > 0 for value in logged.values())
    lines = [line for line in (run_dir / "run.log").read_text().splitlines() if re.search(r"step \d/4: loss", line)]
    assert len(lines) == 4 and all(re.search(r", logit_norm \d+\.\d{4}, ", line) for line in lines), lines
    evaluations = [line for line in _history(run_dir) if "train/logit_norm" in line]
    assert [line["global_step"] for line in evaluations] == [2, 4]  # each evaluation, at eval_every=2
    for line in evaluations:
        assert line["train/logit_norm"] == pytest.approx(logged[line["global_step"]], rel=1e-6)
