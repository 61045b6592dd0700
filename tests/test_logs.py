"""Logs a person can follow: log lines above the bar, progress and failures in run.log, no C++ chatter."""
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import PROJECT, compose

SMOKE = ("dataset=lfw_pairs", "experiment=smoke")
# The loss, then each scalar the step measures (LFW's: accuracy), then the pace.
STEP_LINE = re.compile(r"step (\d+)/(\d+): loss [\d.]+, accuracy [\d.]+, [\d.]+ examples/s, input_wait_fraction [\d.]+, "
                       r"ETA \d+:\d\d:\d\d$")


def run_merged(*args, timeout=600):
    """`python run.py args...` with TF_CPP_MIN_LOG_LEVEL unset, stdout and stderr in one stream as on a terminal."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "HARNESS_DEFAULT_TF_LOG_LEVEL")}
    return subprocess.run([sys.executable, "run.py", *args], cwd=PROJECT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("logs") / "run"
    result = run_merged(*SMOKE, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stdout[-3000:]
    return run_dir, result.stdout


def test_run_log_has_a_progress_line_every_log_every_steps(smoke):
    run_dir, _ = smoke
    lines = (run_dir / "run.log").read_text().splitlines()
    steps = [STEP_LINE.search(line) for line in lines]
    assert [(int(m.group(1)), int(m.group(2))) for m in steps if m] == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_log_lines_start_their_own_line_above_the_bar(smoke):
    _, output = smoke
    # On a terminal '\r' returns to the line's start: a log line that follows a bar without clearing it is garbled.
    segments = [segment for line in output.split("\n") for segment in line.split("\r")]
    logged = [segment for segment in segments
              if re.search(r"\]\[tf_harness\.experiments\.(runner|assembly|training\.actions|evaluator)\]\[INFO\] - ", segment)]
    assert len(logged) >= 6  # 4 step lines and 2 evaluations
    assert all(segment.startswith("[") for segment in logged), logged


def test_evaluation_shows_progress_over_its_batches(smoke):
    _, output = smoke
    # experiment=smoke: trainer.eval_steps=2, 2 x 32 examples in batches of 4
    assert re.search(r"evaluate: +\d+%\|.*\| \d+/16 ", output), output[-3000:]


def test_no_tensorflow_start_up_chatter_by_default(smoke):
    _, output = smoke
    assert "cuInit" not in output and "cudart" not in output and "absl::InitializeLog" not in output


@pytest.mark.slow  # a training process
def test_a_run_that_fails_ends_its_run_log_with_the_error_and_exit_status(tmp_path):
    result = run_merged(*SMOKE, "trainer.learning_rate=1e30", "trainer.train_steps=10", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 1
    error = result.stdout.strip().splitlines()[-1]
    assert error.startswith("error: ")
    last = (tmp_path / "run.log").read_text().strip().splitlines()[-2:]
    assert last[0].endswith(f"[ERROR] - {error}") and last[1].endswith("[ERROR] - run failed, exit status 1"), last


def test_a_config_error_prints_one_line_and_goes_to_run_log(tmp_path):
    result = run_merged(*SMOKE, "dataset.root=/nonexistent/root", f"hydra.run.dir={tmp_path}", timeout=60)
    assert result.returncode == 2
    assert result.stdout.splitlines() == [result.stdout.strip()]  # one line, stdout and stderr together
    last = (tmp_path / "run.log").read_text().strip().splitlines()[-2:]
    assert last[0].endswith(f"[ERROR] - {result.stdout.strip()}")
    assert last[1].endswith("run stopped by a config error, exit status 2"), last


@pytest.mark.parametrize("line, level, harness_default, shown", [
    ("I0000 00:00:1795415444.996474   21734 cudart_stub.cc:31] Could not find cuda drivers", 2, True, False),
    ("E0000 00:00:1795415450.389072   21734 cuda_platform.cc:52] failed call to cuInit: INTERNAL", 2, True, False),
    ("E0000 00:00:1795415450.389072   21734 cuda_platform.cc:52] failed call to cuInit: INTERNAL", 2, False, True),
    ("I0000 00:00:1795415444.996474   21734 cudart_stub.cc:31] Could not find cuda drivers", 0, False, True),
    ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", 0, False, True),
    ("E0000 00:00:1795415450.389072   21734 other.cc:1] a real error", 2, True, True),
    ("a Python warning", 3, True, True),
])
def test_start_up_lines_follow_tf_cpp_min_log_level(line, level, harness_default, shown):
    """TF_CPP_MIN_LOG_LEVEL the user set is honoured, even by lines TensorFlow writes before it reads it."""
    from tf_harness.experiments.startup import _chatter
    assert _chatter(line, level, harness_default) is not shown


def test_the_imports_lap_counts_from_the_interpreter_not_from_a_shell_that_execs_it():
    """A shell that sets up, then `exec`s python, hands on its own start time: the lap must not count it."""
    script = ("from tf_harness.experiments import cli, startup; "
              "print(startup.StartupClock().laps[0][1])")
    result = subprocess.run(["sh", "-c", 'sleep 2; exec "$0" "$@"', sys.executable, "-c", script], cwd=PROJECT,
                            capture_output=True, text=True, timeout=120, check=True)
    assert 0.0 < float(result.stdout) < 2.0, result.stdout


def test_each_job_of_a_process_times_its_imports_from_its_own_start(monkeypatch):
    """The basic launcher runs a sweep's jobs one after another in one process: a later job's imports lap
    starts with that job, not with the process."""
    import time
    from tf_harness.experiments import startup
    monkeypatch.setattr(startup, "_job_start", None)
    monkeypatch.setattr(startup, "_INTERPRETER_READY", time.perf_counter() - 100.0)
    startup.job_started()
    assert startup.StartupClock().laps[0][1] >= 100.0  # the first job: from the interpreter's start
    startup.job_started()
    assert startup.StartupClock().laps[0][1] < 1.0  # the next one: from its own start


def test_run_log_ends_with_the_outcome_and_exit_status(smoke):
    run_dir, _ = smoke
    last = (run_dir / "run.log").read_text().strip().splitlines()[-1]
    assert last.endswith("- run finished, exit status 0"), last
    assert "][INFO] - run finished" in last, last  # a finished run's closing line is no error


def test_a_config_error_leaves_no_run_folder_behind(tmp_path):
    run_dir = tmp_path / "outputs" / "new" / "run"
    result = run_merged(*SMOKE, "dataset.root=/nonexistent/root", f"hydra.run.dir={run_dir}", timeout=60)
    assert result.returncode == 2 and result.stdout.startswith("config error: "), result.stdout
    assert not (tmp_path / "outputs").exists(), sorted(map(str, tmp_path.rglob("*")))


def test_a_config_error_leaves_no_dated_run_folder_behind(tmp_path):
    """conf/'s own pattern, outputs/<date>/<time>_<dataset>_<id>, under the folder the command runs in."""
    (tmp_path / "outputs").mkdir()
    result = subprocess.run([sys.executable, str(PROJECT / "run.py"), *SMOKE, "dataset.root=/nonexistent/root"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.startswith("config error: "), result.stderr
    assert list((tmp_path / "outputs").iterdir()) == [], sorted(map(str, tmp_path.rglob("*")))


def test_a_config_error_in_a_folder_that_existed_leaves_it_and_its_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = run_merged(*SMOKE, "dataset.root=/nonexistent/root", f"hydra.run.dir={tmp_path}", timeout=60)
    assert result.returncode == 2
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "run.log").is_file()


def test_the_train_pipeline_is_built_before_the_first_step_the_validation_one_at_the_first_evaluation(smoke):
    """Training first, validation when the first evaluation needs it: TensorBoard's training inputs come from the
    training iterator itself."""
    run_dir, output = smoke
    before_first_step = output[:output.index("Time to the first step")]
    assert re.findall(r"Built the (\w+) input pipeline", before_first_step) == ["train"], output[-3000:]
    before_evaluation = output[:output.index("Evaluation at global step")]
    assert re.findall(r"Built the (\w+) input pipeline", before_evaluation) == ["train", "validation"], \
        output[-3000:]
    from tests.conftest import event_tags
    _, tags = event_tags(run_dir / "train")
    assert "inputs" in tags


@pytest.mark.slow  # three processes, one training
def test_a_first_evaluate_or_predict_without_a_checkpoint_records_nothing(tmp_path):
    new_dir, empty_dir = tmp_path / "new", tmp_path / "empty"
    empty_dir.mkdir()
    for mode, run_dir in (("evaluate", new_dir), ("predict", empty_dir)):
        result = run_merged(*SMOKE, f"mode={mode}", f"hydra.run.dir={run_dir}", timeout=120)
        assert result.returncode == 2 and "needs a checkpoint" in result.stdout, result.stdout[-2000:]
    assert not new_dir.exists()
    assert not list(empty_dir.glob("events.*")) and not (empty_dir / "checkpoints").exists()
    # The directory is not a recorded run: training into it starts afresh, with another dataset too.
    result = run_merged("dataset=chest_xray", "experiment=smoke", "model=semi_alexnet", "trainer.train_steps=1",
                        f"hydra.run.dir={empty_dir}")
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize("dtype, policy, mode, jit_compile, warned", [
    ("float16", "mixed_float16", "train", "null", True), ("float16", "mixed_float16", "evaluate", "null", False),
    ("float16", "mixed_float16", "train", "false", True), ("float16", "mixed_float16", "train", "true", False),
    ("bfloat16", "mixed_bfloat16", "train_and_evaluate", "null", False),
    ("float32", "float32", "train", "null", False)])
def test_float16_training_on_cpu_alone_is_one_warning_at_the_start(dtype, policy, mode, jit_compile, warned, caplog):
    """TensorFlow's CPU kernel for float16 convolution filter gradients is far slower than float32's
    (docs/scaling.md): a run that would train on it says so, and names bfloat16 and XLA; a step compiled with XLA
    does not run that kernel."""
    import logging

    import tensorflow as tf
    from tf_harness.experiments import assembly
    from tf_harness.experiments.config.settings import Settings

    settings = Settings.from_config(compose("dataset=lfw_pairs", f"pipeline.dtype={dtype}", f"mode={mode}",
                                            f"trainer.jit_compile={jit_compile}"))
    with caplog.at_level(logging.INFO, logger="tf_harness.experiments.assembly"):
        assembly.log_start(settings, tf.distribute.get_strategy(), policy, "the run directory's line")
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    on_cpu_alone = not tf.config.list_logical_devices("GPU")
    assert len(warnings) == (warned and on_cpu_alone), [record.getMessage() for record in warnings]
    if warnings:
        assert all(part in warnings[0].getMessage()
                   for part in ("pipeline.dtype=float16", "bfloat16", "trainer.jit_compile=true", "scaling.md"))
