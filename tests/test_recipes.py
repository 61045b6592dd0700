"""The training recipes (docs/training-loop.md#training-recipes): the metrics history, gradient clipping, EMA
weights, gradient accumulation, the best checkpoint, early stopping and fine-tuning controls."""
import json
import logging

from tf_harness.experiments import metrics_history
from tests.conftest import run_cli

# A tiny LFW run: 4 steps, evaluations at 2 and 4.
SMOKE = ("dataset=lfw_pairs", "experiment=smoke")


# The metrics history ----------------------------------------------------------------------------------------------

def test_the_history_appends_each_evaluation_and_skips_a_damaged_line(tmp_path, caplog):
    metrics_history.append(tmp_path, {"accuracy": 0.5, "global_step": 2, "loss": float("nan")}, now=lambda: 10.0)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"accuracy": 0.7, "glo')  # a line cut short by a kill
    metrics_history.append(tmp_path, {"accuracy": 0.75, "global_step": 4}, now=lambda: 20.0)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("[1, 2]\n\xff\n")
    with caplog.at_level(logging.WARNING):
        records = metrics_history.read(tmp_path)
    assert records == [{"accuracy": 0.5, "global_step": 2, "loss": None, "time": 10.0},
                       {"accuracy": 0.75, "global_step": 4, "time": 20.0}]
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "skipped 3 damaged line(s) (line 2, 4, 5)" in warning
    assert metrics_history.read(tmp_path / "none") == []


def test_every_evaluation_is_in_metrics_jsonl_and_a_re_entry_appends(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_cli(*SMOKE, f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = metrics_history.read(run_dir)
    assert [record["global_step"] for record in records] == [2, 4]
    assert all(isinstance(record["time"], float) for record in records) and records[0]["time"] <= records[1]["time"]
    last = json.loads((run_dir / "metrics.json").read_text())
    assert {key: value for key, value in records[-1].items() if key != "time"} == last  # metrics.json: the last

    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"global_step": 4, "accur')  # a damaged last line: never fatal
    evaluated = run_cli(f"hydra.run.dir={run_dir}", "mode=evaluate")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert [record["global_step"] for record in metrics_history.read(run_dir)] == [2, 4, 4]
