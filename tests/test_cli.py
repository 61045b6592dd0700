"""`python run.py` end to end, asserting on what a user looks at: exit code, run directory, events."""
import csv
import json
import math
import re
import signal
import subprocess
import sys

import pytest

from tests.conftest import PROJECT, event_tags, run_cli, wait_for_checkpoint
from tests.refusals import assert_config_error

# A narrow semi-AlexNet: these tests are of the command line, and the ResNet cells of the matrix train that family.
TINY = ("dataset=chest_xray", "model=semi_alexnet", "model.filters=[8,16,16,16,16]", "model.dense_units=32",
        "pipeline.image_size=32", "pipeline.batch_size=8",
        "trainer.eval_every=3", "trainer.checkpoint_every=3", "trainer.log_every=1", "trainer.eval_steps=null")


@pytest.fixture(scope="module")
def trained(shared_runs, tmp_path_factory):
    """A copy of the session's run of TINY to step 6, trained in-process (the command line's own path below
    Hydra's start: tests/shared_runs.py), and its run.log, which holds every line the run logged."""
    run_dir = shared_runs.copy(*TINY, "trainer.train_steps=6", to=tmp_path_factory.mktemp("cli") / "run")
    return run_dir, (run_dir / "run.log").read_text()


def test_run_directory_holds_config_checkpoints_metrics_and_skips(trained):
    run_dir, logged = trained
    assert (run_dir / ".hydra" / "config.yaml").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.index")) == ["ckpt-3.index", "ckpt-6.index"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_step"] == 6
    assert 0.0 <= metrics["auc/mean"] <= 1.0 and metrics["loss"] > 0
    assert metrics["examples"] == 59  # the whole validation split of the sample, padding excluded
    with open(run_dir / "skipped.csv") as f:
        assert next(csv.reader(f)) == ["path", "reason"]
    assert "embedded chest_xray sample" in logged


def test_the_log_says_where_the_time_to_the_first_step_went(trained):
    _, logged = trained
    lines = [line for line in logged.splitlines() if "Time to the first step:" in line]
    assert len(lines) == 1, logged[-3000:]
    match = re.search(r"Time to the first step: ([\d.]+) s \((.*)\)", lines[0])
    laps = dict(re.fullmatch(r"(.+) ([\d.]+) s", lap).groups() for lap in match.group(2).split(", "))
    assert list(laps)[:6] == ["imports", "index", "verify", "build", "input_fn",
                              "first loop of 1 step with its trace"]
    assert float(match.group(1)) == pytest.approx(sum(map(float, laps.values())), abs=0.1 * len(laps))


def test_tensorboard_reads_back_train_and_validation_scalars(trained):
    run_dir, _ = trained
    train, train_tags = event_tags(run_dir / "train")
    assert {"loss", "learning_rate", "examples_per_sec", "input_wait_fraction"} <= train_tags
    assert "auc/mean" not in train_tags  # an AUC needs a whole split's scores: the validation evaluations log it
    assert [event.step for event in train.Tensors("loss")] == [1, 2, 3, 4, 5, 6]
    from tensorboard.util import tensor_util
    waits = [float(tensor_util.make_ndarray(event.tensor_proto)) for event in train.Tensors("input_wait_fraction")]
    assert all(0.0 <= wait <= 1.0 for wait in waits)
    validation, validation_tags = event_tags(run_dir / "validation")
    assert {"loss", "auc/mean", "auc/Atelectasis", "auc/Hernia"} <= validation_tags
    assert [event.step for event in validation.Tensors("loss")] == [3, 6]


@pytest.mark.slow  # three more runs; tests/test_run_directory_truth.py re-enters in the fast suite
def test_rerunning_into_the_run_directory_resumes_then_evaluates_and_predicts(trained):
    run_dir, _ = trained
    result = run_cli(*TINY, "trainer.train_steps=9", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "at global step 6" in result.stdout
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 9

    result = run_cli(*TINY, "mode=predict", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(run_dir / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 54  # the sample's test split
    # path, patient, scores, labels, step, split
    assert rows[0]["path"].endswith(".png") and len(rows[0]) == 1 + 1 + 14 + 14 + 1 + 1
    assert rows[0]["split"] == "test" and rows[0]["patient_id"].isdigit()
    assert rows[0]["global_step"] == "9" and rows[0]["label/Hernia"] in ("0", "1")
    assert all(0.0 <= float(rows[0][name]) <= 1.0 for name in ("Atelectasis", "Hernia"))

    (run_dir / "metrics.json").unlink()
    result = run_cli(*TINY, "mode=evaluate", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 9


@pytest.mark.parametrize("override, named", [
    ("trainer.no_such_key=1", "trainer.no_such_key"),
    ("dataset.root=/nonexistent/root", "/nonexistent/root"),
    ("mode=fit", "mode=fit"),
])
def test_config_errors_exit_2_with_one_line(tmp_path, override, named):
    result = run_cli("dataset=chest_xray", override, f"hydra.run.dir={tmp_path}")
    assert_config_error(result, named, alone=False)


def test_an_image_size_the_model_cannot_take_exits_2_in_one_line_and_leaves_no_folder(tmp_path):
    result = run_cli("dataset=lfw_pairs", "experiment=smoke", "pipeline.image_size=4",
                     f"hydra.run.dir={tmp_path / 'run'}")
    assert_config_error(result, "pipeline.image_size=4 ", "model=siamese_cnn", "model.widths=[16,32,64]", "8x8")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.train_steps=200", "trainer.checkpoint_every=2", "trainer.eval_every=1000",
            f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen([sys.executable, "run.py", *args], cwd=PROJECT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_for_checkpoint(process, run_dir / "checkpoints", 4)
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = max(int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("ckpt-*.index"))
    assert 4 <= saved < 200
    result = run_cli(*[a for a in args if "train_steps" not in a], f"trainer.train_steps={saved + 4}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"at global step {saved}" in result.stdout
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == saved + 4


@pytest.mark.slow
def test_mirrored_strategy_on_two_logical_cpus(tmp_path):
    result = run_cli(*TINY, "strategy=mirrored", "trainer.train_steps=3", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "with 2 replica(s)" in result.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 3


@pytest.mark.slow
def test_multirun_sweep_writes_one_run_per_value(tmp_path):
    result = run_cli("-m", *TINY, "trainer.train_steps=2", "trainer.learning_rate=0.001,0.01",
                     f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        assert json.loads((tmp_path / job / "metrics.json").read_text())["global_step"] == 2


def free_ports(count):
    import socket
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_two_workers(*args):
    """`python run.py args...` as both workers of a localhost cluster; returns their (stdout, stderr)."""
    import os
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    workers = [subprocess.Popen([sys.executable, "run.py", *args], cwd=PROJECT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                         TF_CONFIG=json.dumps({"cluster": cluster,
                                                               "task": {"type": "worker", "index": index}})))
               for index in range(2)]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-3000:]
        assert "with 2 replica(s)" in out, out[-3000:]
    return outputs


@pytest.mark.slow
def test_multi_worker_strategy_with_two_local_workers(tmp_path):
    """One TF_CONFIG cluster of two processes: each reads its half of the split, the chief alone keeps
    the run directory's files, and a second launch resumes from the chief's checkpoint."""
    args = [*TINY, "strategy=multi_worker", "trainer.eval_every=4", "trainer.checkpoint_every=2",
            f"hydra.run.dir={tmp_path}"]
    outputs = run_two_workers(*args, "trainer.train_steps=4")
    for index, (out, _) in enumerate(outputs):
        assert f"Worker {index} of 2: its 1/2 of the train split, 4 examples of every global batch of 8" in out
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 4
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("ckpt-*.index")) == ["ckpt-2.index", "ckpt-4.index"]
    assert not list(tmp_path.glob(".worker-*"))  # the other worker's scratch checkpoints are gone

    for out, _ in run_two_workers(*args, "trainer.train_steps=6"):
        assert "ckpt-4 at global step 4" in out
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 6


def test_tf_config_with_several_workers_needs_the_multi_worker_strategy(tmp_path):
    config = {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 0}}
    result = run_cli(*TINY, f"hydra.run.dir={tmp_path}", env={"TF_CONFIG": json.dumps(config)})
    assert_config_error(result, "TF_CONFIG", "2 workers", "strategy=auto", "strategy=multi_worker", alone=False)


@pytest.mark.slow  # two training processes
def test_bfloat16_trains_in_mixed_precision_on_cpu_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    args = ("dataset=lfw_pairs", "experiment=smoke", "pipeline.dtype=bfloat16", "trainer.eval_every=2",
            f"hydra.run.dir={run_dir}")
    result = run_cli(*args, "trainer.train_steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Keras policy mixed_bfloat16" in result.stdout
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints" / "ckpt-2"))
    dtypes = reader.get_variable_to_dtype_map()
    weights = [name for name in dtypes if name.startswith(("model/", "optimizer/_trainable_variables/"))]
    assert len(weights) > 10 and all(dtypes[name] == tf.float32 for name in weights)  # float32 variables
    result = run_cli(*args, "trainer.train_steps=4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "at global step 2" in result.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_step"] == 4 and math.isfinite(metrics["loss"])
