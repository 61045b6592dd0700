"""Stored Optuna studies: a storage opens or is one line and leaves nothing behind; the study is made once; a
re-run adds trials; a shared PostgreSQL study takes two sweep processes at once; the pruner stops a losing trial;
a submitit job signalled before its time limit saves, is requeued and ends with the weights of an uninterrupted
run."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import PROJECT, run_cli
from tests.refusals import assert_config_error, assert_names

SMOKE = ("dataset=lfw_pairs", "experiment=smoke")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Opening a storage ------------------------------------------------------------------------------------------------

def refusal(url):
    from tf_harness.experiments.sweeps import study
    with pytest.raises(study.StorageError) as refused:
        study.open_storage(url)
    return str(refused.value)


def test_a_file_that_is_not_a_database_is_one_line_and_left_as_it_is(tmp_path):
    garbled = tmp_path / "study.db"
    garbled.write_bytes(bytes(range(256)) * 12)
    line = refusal(f"sqlite:///{garbled}")
    assert_names(line, f"hydra.sweeper.storage=sqlite:///{garbled} ", "DatabaseError", "Optuna study database")
    assert garbled.read_bytes() == bytes(range(256)) * 12


def test_a_refused_connection_hides_the_password_and_says_no_server_answers(tmp_path):
    line = refusal(f"postgresql+psycopg2://alice:s3cret@127.0.0.1:{free_port()}/studies")
    assert "s3cret" not in line
    assert_names(line, "hydra.sweeper.storage=postgresql+psycopg2://alice:***@127.0.0.1", "no database server")


def test_a_missing_driver_is_named_with_how_to_install_one(tmp_path):
    line = refusal("mysql+mysqldb://u:p@127.0.0.1/studies")
    assert_names(line, "hydra.sweeper.storage=mysql+mysqldb://u:***@127.0.0.1", "driver", "tf-harness[postgres]")


def test_a_failed_attempt_leaves_no_half_made_sqlite_database(tmp_path, monkeypatch):
    """A storage whose tables fail after SQLite made the file left the file behind."""
    import optuna
    import sqlalchemy

    from tf_harness.experiments.sweeps import study
    made = optuna.storages.RDBStorage

    def half_made(url, *args, **kwargs):
        sqlalchemy.create_engine(url).connect().exec_driver_sql("CREATE TABLE half (x INTEGER)")
        raise sqlalchemy.exc.OperationalError("CREATE TABLE studies", {}, Exception("disk I/O error"))

    monkeypatch.setattr(optuna.storages, "RDBStorage", half_made)
    with pytest.raises(study.StorageError):
        study.create(f"sqlite:///{tmp_path}/sweep/optuna.db", "s", ["maximize"])
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(optuna.storages, "RDBStorage", made)


def test_a_study_is_made_once_and_a_second_create_adds_to_it(tmp_path, monkeypatch):
    from tf_harness.experiments.sweeps import study
    monkeypatch.chdir(tmp_path)
    url = "sqlite:///sweep/optuna.db"  # relative: made absolute, so job processes elsewhere open the same file
    first, made = study.create(url, "s", ["maximize"])
    assert made
    first.tell(first.ask(), 0.5)
    again, made = study.create(url, "s", ["maximize"])
    assert not made
    again.tell(again.ask(), 0.75)
    assert [t.number for t in again.trials] == [0, 1] and (tmp_path / "sweep" / "optuna.db").is_file()
    assert study.summary_line(again, "maximize") == "study s: 2 trials, 2 complete, 0 pruned, 0 failed; best 0.7500 " \
                                                    "in trial 1 (): ?"


@pytest.mark.parametrize("storage, named", [
    pytest.param(None, ("hydra.sweeper.storage=", "no database server"), id="refused"),
    pytest.param("sqlite:///{tmp}/garbled.db", ("hydra.sweeper.storage=", "garbled.db", "Optuna study database"),
                 id="not a database", marks=pytest.mark.slow),
    pytest.param("null", ("sweep.pruner=median", "stored study"), id="pruner in memory", marks=pytest.mark.slow)])
def test_a_sweep_whose_study_cannot_be_stored_exits_2_in_one_line_and_leaves_nothing(tmp_path, storage, named):
    (tmp_path / "garbled.db").write_bytes(b"not a database" * 100)
    storage = storage.format(tmp=tmp_path) if storage else \
        f"postgresql+psycopg2://u:${{oc.env:STUDY_PASSWORD}}@127.0.0.1:{free_port()}/db"
    quoted = storage if storage == "null" else f"'{storage}'"
    result = run_cli("-m", "hparams_search=optuna", *SMOKE, "sweep.pruner=median", f"hydra.sweeper.storage={quoted}",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", timeout=120, env={"STUDY_PASSWORD": "s3cret"})
    assert "s3cret" not in assert_config_error(result, *named)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["garbled.db"]
    assert (tmp_path / "garbled.db").read_bytes() == b"not a database" * 100


# Pruning ---------------------------------------------------------------------------------------------------------

def test_a_trial_the_pruner_stops_is_pruned_in_the_study_and_in_metrics_json(tmp_path):
    """Hydra's sweeper hands a job no trial: the job finds its own from the storage and its trial number."""
    import optuna

    from tf_harness.experiments.sweeps import study
    from tf_harness.experiments.sweeps.pruning import Pruning
    url = f"sqlite:///{tmp_path}/optuna.db"
    kept, _ = study.create(url, "s", ["maximize"])
    for _ in range(5):  # MedianPruner prunes from the sixth trial on
        trial = kept.ask()
        for step in (1, 2):
            trial.report(0.9, step)
        kept.tell(trial, 0.9)
    number = kept.ask().number
    (tmp_path / "metrics.json").write_text(json.dumps({"accuracy": 0.5, "global_step": 1}))
    pruning = Pruning("median", study.JobTrial(url, "s", number), lambda values: values["accuracy"], tmp_path, True)
    pruning.evaluated({"accuracy": 0.5}, 1)
    assert pruning.stopped
    assert optuna.load_study(study_name="s", storage=url).trials[number].state == optuna.trial.TrialState.PRUNED
    assert json.loads((tmp_path / "metrics.json").read_text())["pruned"] is True
    # A requeued job of the pruned trial has nothing left to train.
    assert Pruning("median", study.JobTrial(url, "s", number), lambda values: 0.0, tmp_path, True).stopped
    # Without a pruner, or outside a stored study, nothing stops.
    assert not Pruning(None, None, None, tmp_path, True).stopped
    assert not Pruning("median", None, None, tmp_path, True).stopped


def test_a_job_of_the_harness_sweeper_finds_its_trial_by_its_number(tmp_path, monkeypatch):
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from tf_harness.experiments.config.settings import Job
    from tf_harness.experiments.sweeps import study
    hydra = OmegaConf.create({"mode": RunMode.MULTIRUN, "job": {"num": 7}, "sweep": {"dir": str(tmp_path)},
                              "runtime": {"output_dir": str(tmp_path / "7"), "choices": {}}, "sweeper": {
        "_target_": "hydra_plugins.tf_harness_sweeper.StudySweeper", "storage": "sqlite:///o.db",
        "study_name": "lfw_pairs"}})
    monkeypatch.chdir(tmp_path)  # a relative SQLite path is the working directory's
    assert study.job_trial(Job.from_hydra(hydra).trial) == study.JobTrial(f"sqlite:///{tmp_path}/o.db", "lfw_pairs", 7)
    hydra.sweeper.storage = None
    assert Job.from_hydra(hydra).trial is None and study.job_trial(None) is None


# Requeue on SIGUSR2 -------------------------------------------------------------------------------------------------

def test_sigusr2_stops_the_run_then_goes_to_the_launchers_handler(monkeypatch):
    """The harness saved on SIGTERM and SIGINT but not on SIGUSR2, which submitit sends before a job's time limit:
    its handler requeued the job at once, and what the run trained since its last checkpoint was lost."""
    from tf_harness.experiments.run_dir import interrupts
    called = []
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)}
    try:
        signal.signal(signal.SIGUSR2, lambda signum, frame: called.append(signum))  # as submitit's is set
        interrupts.install()
        with pytest.raises(interrupts.Interrupted) as stopped:
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(1)
        assert called == []  # the run saves first
        interrupts.requeue(stopped.value)
        assert called == [signal.SIGUSR2]
        assert interrupts.requeue(interrupts.Interrupted(signal.SIGTERM)) is None  # any other is not handed on
        assert called == [signal.SIGUSR2]

        def refuse(signum, frame):
            raise RuntimeError("Job not requeued because: timed-out too many times.")

        interrupts._requeue = refuse
        line = interrupts.requeue(stopped.value)
        assert_names(line, "SIGUSR2", "not requeued", "(Job not requeued because: timed-out too many times.)")
    finally:
        interrupts._finished, interrupts._requeue = False, None
        interrupts._pending.clear()
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def variables(checkpoint_prefix):
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(checkpoint_prefix))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith("model/")}


def assert_requeued_and_uninterrupted(sweep_dir, tmp_path, steps, last, *logged):
    """Job 0 of `sweep_dir`, whose submitit logs hold each of `logged`, was interrupted, resumed, and ended at global
    step `last` with the variables of a single run of `steps` that nothing interrupted."""
    import numpy as np
    logs = "".join(path.read_text() for path in (sweep_dir / ".submitit").rglob("*_log.*"))
    assert all(line in logs for line in logged), logs[-3000:]
    run_log = (sweep_dir / "0" / "run.log").read_text()
    assert "Interrupted at global step" in run_log and "Resumed from" in run_log, run_log[-3000:]
    assert json.loads((sweep_dir / "0" / "metrics.json").read_text())["global_step"] == last
    single = run_cli(*SMOKE, *steps, f"hydra.run.dir={tmp_path / 'single'}")
    assert single.returncode == 0, single.stderr[-3000:]
    requeued = variables(sweep_dir / "0" / "checkpoints" / f"ckpt-{last}")
    uninterrupted = variables(tmp_path / "single" / "checkpoints" / f"ckpt-{last}")
    assert requeued.keys() == uninterrupted.keys() and requeued
    assert all(np.array_equal(requeued[name], uninterrupted[name]) for name in requeued)


@pytest.mark.slow
def test_a_submitit_job_signalled_before_its_time_limit_saves_is_requeued_and_ends_as_an_uninterrupted_one(
        tmp_path):
    """SIGUSR2, as submitit sends it before a job's time limit, sent to a submitit_local job while it trains (a
    time limit of a minute, the shortest Hydra's launcher takes, is mostly start-up on 2 busy cores)."""
    steps = ("trainer.train_steps=1200", "trainer.eval_every=1200", "trainer.eval_steps=1",
             "trainer.checkpoint_every=1200",
             "trainer.log_every=20", "trainer.steps_per_loop=1", "pipeline.batch_size=4", "deterministic=true")
    sweep_dir = tmp_path / "sweep"
    process = subprocess.Popen([sys.executable, "run.py", "-m", "hydra/launcher=submitit_local", *SMOKE, *steps,
                                f"hydra.sweep.dir={sweep_dir}"], cwd=PROJECT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    deadline = time.time() + 600
    run_log = sweep_dir / "0" / "run.log"
    while not (run_log.exists() and "step 200/1200" in run_log.read_text()) and time.time() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.1)
    os.kill(json.loads((sweep_dir / "0" / ".lock").read_text())["pid"], signal.SIGUSR2)
    stderr = process.communicate(timeout=900)[1]
    assert process.returncode == 0, stderr[-3000:]
    assert_requeued_and_uninterrupted(sweep_dir, tmp_path, steps, 1200, "Requeued job")


def steps_per_second(tmp_path, settings) -> float:
    """Training steps per second of a single run of `settings` cut to 1500 steps, on this machine now: from its
    run.log's timestamps of the first and last progress lines, so start-up is left out."""
    run_dir = tmp_path / "calibration"
    calibration = run_cli(*SMOKE, *settings, "trainer.train_steps=1500", f"hydra.run.dir={run_dir}")
    assert calibration.returncode == 0, calibration.stderr[-3000:]
    lines = re.findall(r"^\[([\d-]+ [\d:,]+)\].* - step (\d+)/1500:", (run_dir / "run.log").read_text(), re.M)
    (start, first), (end, last) = lines[0], lines[-1]
    seconds = (datetime.strptime(end, "%Y-%m-%d %H:%M:%S,%f") - datetime.strptime(start, "%Y-%m-%d %H:%M:%S,%f"))
    return (int(last) - int(first)) / seconds.total_seconds()


@pytest.mark.slow
def test_a_submitit_job_past_its_time_limit_is_requeued_and_ends_as_an_uninterrupted_one(tmp_path):
    """A real time limit: submitit_local's job, given two minutes, is sent SIGUSR2 30 s before them while it still
    trains; it saves, is requeued, resumes and ends at trainer.train_steps with an uninterrupted run's weights."""
    def settings(steps):
        return (f"trainer.train_steps={steps}", f"trainer.eval_every={steps}", f"trainer.checkpoint_every={steps}",
                "trainer.eval_steps=1", "trainer.log_every=100", "trainer.steps_per_loop=1", "pipeline.batch_size=4",
                "deterministic=true")

    # 150 s of training at this machine's pace: more than a window trains before its signal, start-up included,
    # and well within the four windows that the local launcher's three requeues give.
    train_steps = max(100, round(steps_per_second(tmp_path, settings(1500)[1:]) * 150 / 100) * 100)
    steps = settings(train_steps)
    sweep_dir = tmp_path / "sweep"
    swept = subprocess.run([sys.executable, "run.py", "-m", "hydra/launcher=submitit_local",
                            "hydra.launcher.timeout_min=2", *SMOKE, *steps, f"hydra.sweep.dir={sweep_dir}"],
                           cwd=PROJECT, capture_output=True, text=True, timeout=1800,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert swept.returncode == 0, swept.stderr[-3000:]
    assert_requeued_and_uninterrupted(sweep_dir, tmp_path, steps, train_steps, "this job is timed-out",
                                      "Requeued job")


# Stored studies end to end -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_stored_study_run_again_adds_trials_in_new_folders_and_its_summary_counts_both_runs(tmp_path):
    """A re-run numbered its jobs from 0 again, re-entered the first run's folders with other parameters, was
    refused there, and the study recorded the trials failed."""
    import optuna
    args = ("-m", "hparams_search=optuna", *SMOKE, "trainer.train_steps=2", "trainer.eval_steps=1",
            "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={tmp_path}")
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["0", "1", "2", "3"]
    kept = optuna.load_study(study_name="lfw_pairs", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert [t.state for t in kept.trials] == [optuna.trial.TrialState.COMPLETE] * 4
    for trial in kept.trials:  # each trial ran in its own folder, with its own parameters
        saved = (tmp_path / str(trial.number) / ".hydra" / "overrides.yaml").read_text()
        assert f"trainer.learning_rate={trial.params['trainer.learning_rate']}" in saved
    best = kept.best_trial
    assert again.stderr.rstrip().splitlines()[-1].startswith(
        f"study lfw_pairs: 4 trials, 4 complete, 0 pruned, 0 failed; best {best.value:.4f} in trial {best.number} ")
    assert again.stderr.rstrip().endswith(f": {tmp_path / str(best.number)}")


@pytest.mark.slow
def test_a_sweep_killed_mid_trial_run_again_resumes_the_trial_in_its_own_folder(tmp_path):
    """The trial stayed RUNNING for ever, and the same command again drew a new trial in a new folder."""
    import optuna
    from optuna.trial import TrialState
    args = ["-m", "hparams_search=optuna", *SMOKE, "trainer.checkpoint_every=2", "trainer.eval_every=1000",
            "hydra.sweeper.n_trials=1", f"hydra.sweep.dir={tmp_path}"]
    process = subprocess.Popen([sys.executable, "run.py", *args, "trainer.train_steps=400"], cwd=PROJECT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def saved_steps():  # the newest checkpoints only are kept: ckpt-4 itself may be gone between two looks
        return [int(p.stem.split("-")[1]) for p in (tmp_path / "0" / "checkpoints").glob("ckpt-*.index")]

    deadline = time.time() + 300
    while max(saved_steps(), default=0) < 4 and time.time() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = max(saved_steps())
    assert 4 <= saved < 400
    again = run_cli(*args, f"trainer.train_steps={saved + 2}")  # a run-control key: the same sweep
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"Resumed from {tmp_path / '0' / 'checkpoints'}" in (tmp_path / "0" / "run.log").read_text()
    assert json.loads((tmp_path / "0" / "metrics.json").read_text())["global_step"] == saved + 2
    kept = optuna.load_study(study_name="lfw_pairs", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert [t.state for t in kept.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert kept.trials[1].params == kept.trials[0].params
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["0"]
    assert again.stderr.rstrip().splitlines()[-1].startswith("study lfw_pairs: 2 trials, 1 complete, 0 pruned, 1 failed")


@pytest.mark.slow
def test_a_trial_the_median_pruner_stops_exits_0_saved_and_pruned(tmp_path):
    import optuna
    kept = optuna.create_study(study_name="lfw_pairs", storage=f"sqlite:///{tmp_path}/optuna.db", direction="maximize")
    for _ in range(5):  # five trials that did better at every evaluation
        trial = kept.ask()
        for step in (1, 2, 3, 4):
            trial.report(1.0, step)
        kept.tell(trial, 1.0)
    result = run_cli("-m", "hparams_search=optuna", *SMOKE, "sweep.pruner=median", "trainer.train_steps=4",
                     "trainer.eval_every=1", "trainer.eval_steps=1", "hydra.sweeper.n_trials=1",
                     f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "5" / "metrics.json").read_text())
    assert metrics["pruned"] is True and metrics["global_step"] == 1
    assert (tmp_path / "5" / "checkpoints" / "ckpt-1.index").exists()
    assert kept.trials[5].state == optuna.trial.TrialState.PRUNED
    assert result.stderr.rstrip().splitlines()[-1].startswith("study lfw_pairs: 6 trials, 5 complete, 1 pruned")


# A shared PostgreSQL study -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of Debian's packages (initdb, pg_ctl) in a temporary folder, run by an unprivileged user
    on a free loopback port: its SQLAlchemy URL. Skips where PostgreSQL is not installed."""
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not binaries:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    bin_dir, user = binaries[-1].parent, "nobody"
    # Not under pytest's own temporary folder, which only its owner may enter.
    folder = Path(tempfile.mkdtemp(prefix="harness-postgres-"))
    os.chmod(folder, 0o777)
    data, port = folder / "data", free_port()
    as_user = ["runuser", "-u", user, "--"] if os.geteuid() == 0 else []
    subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "harness", "--auth=trust"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w",
                    "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"], check=True,
                   capture_output=True)
    try:
        subprocess.run([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "harness", "studies"],
                       check=True, capture_output=True)
        yield f"postgresql+psycopg2://harness@127.0.0.1:{port}/studies"
    finally:
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_a_new_postgresql_study_opened_by_several_processes_at_once_is_made_once(postgres):
    """Two processes that opened a fresh PostgreSQL study at once both created its tables; one died of a unique
    violation."""
    code = ("import sys; from tf_harness.experiments.sweeps import study; "
            "s, _ = study.create(sys.argv[1], 'race', ['maximize']); print(s.study_name)")
    processes = [subprocess.Popen([sys.executable, "-c", code, postgres], cwd=PROJECT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0] * 4, [err[-2000:] for _, err in results]
    assert [out.strip() for out, _ in results] == ["race"] * 4


@pytest.mark.slow
def test_two_sweep_processes_share_one_postgresql_study(postgres, tmp_path):
    """The documented command on each machine: the same seed, the password from the environment. Both processes
    drew the same points pair by pair, and the password was written into every job's .hydra/hydra.yaml."""
    import optuna
    storage = postgres
    written = storage.replace("harness@", "harness:${oc.env:STUDY_PASSWORD}@")
    args = ["-m", "hparams_search=optuna", *SMOKE, "trainer.train_steps=2", "trainer.eval_steps=1",
            "hydra.sweeper.n_trials=2", "hydra.sweeper.study_name=shared", f"hydra.sweeper.storage='{written}'"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", STUDY_PASSWORD="pg-s3cret")
    processes = [subprocess.Popen([sys.executable, "run.py", *args, f"hydra.sweep.dir={tmp_path / name}"],
                                  cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
                 for name in ("a", "b")]
    errors = [process.communicate(timeout=900)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], [error[-3000:] for error in errors]
    kept = optuna.load_study(study_name="shared", storage=storage)
    assert len(kept.trials) == 4
    assert all(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in kept.trials)
    folders = sorted(int(p.name) for name in ("a", "b") for p in (tmp_path / name).iterdir() if p.is_dir())
    assert folders == [0, 1, 2, 3]  # each trial ran in the folder of its number, in one process or the other
    assert all(error.rstrip().splitlines()[-1].startswith("study shared: ") for error in errors)
    drawn = [tuple(sorted(t.params.items())) for t in kept.trials]
    assert len(set(drawn)) == 4, drawn  # no process repeated another's point
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and b"pg-s3cret" in path.read_bytes()]
    assert not any("pg-s3cret" in error for error in errors)
