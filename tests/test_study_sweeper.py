"""The harness's Optuna sweeper, in-process over a SQLite study and a launcher that stands in for Hydra's: an
interrupted trial is asked again in its own folder with its parameters, a finished job the study was not told of
is told on the next run, processes sharing a study draw their own points, and a study that does not fit the
sweep, or a storage that cannot hold one, is one line that names the real problem."""
import contextlib
import datetime
import json
import os
import sqlite3
import threading
import time

import pytest
from omegaconf import OmegaConf

from tests.refusals import assert_names

SPACE = {"trainer.learning_rate": "tag(log, interval(0.0001, 0.01))", "pipeline.batch_size": "choice(8, 16, 32)"}


def settings(n_trials=2, storage=None, sampler="optuna.samplers.TPESampler", seed=1, params=None):
    return dict(sampler=OmegaConf.create({"_target_": sampler, "seed": seed}), direction="maximize", storage=storage,
                study_name="s", n_trials=n_trials, n_jobs=1, params=OmegaConf.create(params or SPACE))


def config(sweep_dir, storage):
    return OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}, "sweeper": {"storage": storage}}})


class Launcher:
    """Runs each job at once as `job(num, overrides, run_dir)` says; records what it launched."""

    def __init__(self, sweep_dir, job=None):
        self.sweep_dir, self.job, self.launched = sweep_dir, job, []

    def launch(self, job_overrides, initial_job_idx):
        from hydra.core.utils import JobReturn, JobStatus
        returns = []
        for num, overrides in enumerate(job_overrides, initial_job_idx):
            subdir = dict(o.split("=", 1) for o in overrides).get("hydra.sweep.subdir", str(num))
            self.launched.append((num, subdir, [o for o in overrides if not o.startswith("hydra.")]))
            value = self.job(num, overrides, self.sweep_dir / subdir) if self.job else 0.5
            returns.append(JobReturn(_return_value=value, status=JobStatus.COMPLETED))
        return returns


def trials(storage):
    import optuna
    return optuna.load_study(study_name="s", storage=storage).get_trials(deepcopy=False)


def test_an_interrupted_trial_is_asked_again_in_its_own_folder_with_its_parameters(tmp_path):
    from optuna.trial import TrialState

    from tf_harness.experiments.sweeps.study_sweeper import sweep
    storage = f"sqlite:///{tmp_path}/optuna.db"

    def killed(num, overrides, run_dir):
        run_dir.mkdir(parents=True)
        raise KeyboardInterrupt  # the sweep stopped mid-trial: nothing told the study

    first = Launcher(tmp_path, killed)
    with pytest.raises(KeyboardInterrupt):
        sweep(config(tmp_path, storage), first, settings(storage=storage), [])
    assert [t.state for t in trials(storage)] == [TrialState.RUNNING]
    again = Launcher(tmp_path)
    sweep(config(tmp_path, storage), again, settings(storage=storage), [])
    (_, _, interrupted), = first.launched
    assert again.launched[0][1:] == ("0", interrupted)  # its own folder, its parameters
    assert [t.state for t in trials(storage)] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert trials(storage)[1].params == trials(storage)[0].params


def test_a_trial_of_a_process_whose_heartbeat_stopped_is_retried_afresh_in_this_sweep_folder(tmp_path, monkeypatch):
    """Another machine's sweep shares the study and dies mid-trial: once its heartbeat is older than the grace
    period, the next sweep to start fails the trial and asks it again, in its own folder."""
    from optuna.trial import TrialState

    from tf_harness.experiments.sweeps import study_sweeper
    monkeypatch.setattr(study_sweeper, "HEARTBEAT_S", 1)
    monkeypatch.setattr(study_sweeper, "GRACE_S", 4)
    storage = f"sqlite:///{tmp_path}/optuna.db"

    def killed(num, overrides, run_dir):
        time.sleep(1.5)  # a heartbeat or two recorded meanwhile
        raise KeyboardInterrupt

    first = Launcher(tmp_path / "a", killed)
    with pytest.raises(KeyboardInterrupt):
        study_sweeper.sweep(config(tmp_path / "a", storage), first, settings(n_trials=1, storage=storage), [])
    alive = Launcher(tmp_path / "b")
    study_sweeper.sweep(config(tmp_path / "b", storage), alive, settings(n_trials=1, storage=storage), [])
    assert [t.state for t in trials(storage)] == [TrialState.RUNNING, TrialState.COMPLETE]  # not stale yet
    _age_heartbeats(tmp_path / "optuna.db", study_sweeper.GRACE_S + 1)  # as that long a wait would
    later = Launcher(tmp_path / "c")
    study_sweeper.sweep(config(tmp_path / "c", storage), later, settings(n_trials=1, storage=storage), [])
    assert [t.state for t in trials(storage)] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert later.launched[0][1:] == ("2", first.launched[0][2])  # its parameters, in this folder, afresh
    assert trials(storage)[2].user_attrs["run_dir"] == str(tmp_path / "c" / "2")


def _age_heartbeats(database, seconds):
    """Moves every heartbeat in a SQLite study `seconds` into the past, in the format Optuna's storage writes."""
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        for row, beat in connection.execute("SELECT trial_heartbeat_id, heartbeat FROM trial_heartbeats").fetchall():
            aged = datetime.datetime.fromisoformat(beat) - datetime.timedelta(seconds=seconds)
            connection.execute("UPDATE trial_heartbeats SET heartbeat = ? WHERE trial_heartbeat_id = ?",
                               (aged.strftime("%Y-%m-%d %H:%M:%S.%f"), row))


def test_a_finished_job_the_study_could_not_be_told_of_ends_in_one_line_and_is_told_on_the_next_run(
        tmp_path, monkeypatch):
    import optuna
    import sqlalchemy.exc
    from optuna.trial import TrialState

    from tf_harness.experiments.sweeps import study as studies
    from tf_harness.experiments.sweeps.study_sweeper import sweep
    from tf_harness.experiments.sweeps.sweep_report import write_outcome
    storage = f"sqlite:///{tmp_path}/optuna.db"

    def finished(num, overrides, run_dir):
        run_dir.mkdir(parents=True)
        write_outcome(run_dir / "job_outcome.json", {"status": 0, "error": None, "job": num, "overrides": overrides,
                                                     "run_dir": str(run_dir), "metric": "accuracy", "value": 0.75,
                                                     "ci95": None, "interval": None})
        return 0.75

    def gone(self, *args, **kwargs):
        raise sqlalchemy.exc.OperationalError("UPDATE trials", {}, Exception("server closed the connection"))

    with monkeypatch.context() as patched:
        patched.setattr(optuna.study.Study, "tell", gone)
        with pytest.raises(studies.StudyUnreachable) as unreachable:
            sweep(config(tmp_path, storage), Launcher(tmp_path, finished), settings(n_trials=1, storage=storage), [])
    assert_names(str(unreachable.value), "study s could not be told how trial 0 ended", "server closed",
                 str(tmp_path / "0"), "run the same command again")
    assert "\n" not in str(unreachable.value)
    again = Launcher(tmp_path)
    sweep(config(tmp_path, storage), again, settings(n_trials=1, storage=storage), [])
    assert [(t.state, t.value) for t in trials(storage)] == [(TrialState.COMPLETE, 0.75), (TrialState.COMPLETE, 0.5)]
    assert [subdir for _, subdir, _ in again.launched] == ["1"]  # the finished trial is not run again


def test_two_processes_that_open_a_new_shared_study_with_one_seed_draw_their_own_points(tmp_path, monkeypatch):
    """Both open the study before either asks a trial: the one that found it made reseeds its sampler."""
    from tf_harness.experiments.sweeps import study_sweeper
    storage = f"sqlite:///{tmp_path}/optuna.db"
    both = threading.Barrier(2, timeout=60)
    record = study_sweeper._record_owner

    def opened(config, sweep_dir):  # after the study is opened, before a trial is asked
        record(config, sweep_dir)
        both.wait()

    monkeypatch.setattr(study_sweeper, "_record_owner", opened)
    launchers = {name: Launcher(tmp_path / name) for name in ("a", "b")}
    errors = []

    def run(name):
        try:
            study_sweeper.sweep(config(tmp_path / name, storage), launchers[name],
                                settings(n_trials=3, storage=storage, sampler="optuna.samplers.RandomSampler"), [])
        except Exception as error:  # noqa: BLE001  shown by the assert below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(name,)) for name in launchers]
    [thread.start() for thread in threads]
    [thread.join(120) for thread in threads]
    assert not errors, errors
    drawn = {name: [tuple(overrides) for _, _, overrides in launcher.launched] for name, launcher in launchers.items()}
    assert len(drawn["a"]) == len(drawn["b"]) == 3 and not set(drawn["a"]) & set(drawn["b"]), drawn


def test_a_study_of_another_direction_or_search_space_is_refused_naming_the_stored_one(tmp_path):
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from tf_harness.experiments.sweeps import study
    url = f"sqlite:///{tmp_path}/optuna.db"
    space = {"trainer.learning_rate": FloatDistribution(1e-4, 1e-2, log=True)}
    study.create(url, "s", ["maximize"], space)
    with pytest.raises(study.StorageError) as refused:
        study.create(url, "s", ["minimize"], space)
    assert_names(str(refused.value), "study s", "was made to maximize, not minimize", "new hydra.sweeper.study_name")
    with pytest.raises(study.StorageError) as refused:
        study.create(url, "s", ["maximize"], {**space, "pipeline.batch_size": CategoricalDistribution([8, 16])})
    assert_names(str(refused.value), "searches another space", "pipeline.batch_size: (unset) there",
                 "new hydra.sweeper.study_name")
    assert study.create(url, "s", ["maximize"], space)[1] is False  # the same sweep again is let in


@pytest.mark.parametrize("damage, named", [
    ("empty", ("is an empty file", "damaged", "move it away")),
    ("folder", ("is a folder, not a database file",)),
    ("garbled", ("not an Optuna study database",))])
def test_a_damaged_database_or_a_folder_in_its_place_is_refused_and_left_as_it_is(tmp_path, damage, named):
    from tf_harness.experiments.sweeps import study
    path = tmp_path / "optuna.db"
    if damage == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"" if damage == "empty" else b"garbage" * 300)
        old = time.time() - 60
        os.utime(path, (old, old))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(study.StorageError) as refused:
        study.create(f"sqlite:///{path}", "s", ["maximize"])
    assert_names(str(refused.value), f"hydra.sweeper.storage=sqlite:///{path}", *named)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert path.is_dir() if damage == "folder" else path.stat().st_size == (0 if damage == "empty" else 2100)


@pytest.mark.parametrize("url", ["postgresql+psycopg2://alice:s3cret@db.example:5432/studies",
                                 "postgresql+psycopg2://alice:s3@cret@db.example:5432/studies"])
def test_a_password_written_in_the_storage_url_is_refused_without_a_character_of_it(url):
    from tf_harness.experiments.sweeps import study
    with pytest.raises(study.StorageError) as refused:
        study.refuse_written_password(url)
    line = str(refused.value)
    assert_names(line, "alice:***@db.example", "${oc.env:", "PGPASSWORD")
    assert not any(part in line for part in ("s3", "cret"))
    study.refuse_written_password("postgresql+psycopg2://alice:${oc.env:STUDY_PASSWORD}@db.example/studies")
    study.refuse_written_password("postgresql+psycopg2://alice@db.example/studies")


def test_a_url_that_does_not_parse_shows_no_part_of_its_password():
    from tf_harness.experiments.sweeps import study
    url = "postgresql+psycopg2://alice:p@ss:w0rd@db.example:notaport/studies"
    line = study.refusal(url, ValueError(f"Could not parse SQLAlchemy URL from string '{url}'"))
    assert "p@ss" not in line and "w0rd" not in line and "alice:***@db.example" in line, line


def composed(*overrides):
    """The config of `python run.py -m *overrides`, Hydra's node included, and its sweep_folder.sweeper_of."""
    from hydra import compose, initialize_config_dir
    from tf_harness.experiments import cli
    from tf_harness.experiments.sweeps.sweep_folder import sweeper_of
    from tests.conftest import CONF
    cli.register_resolvers()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    return cfg, sweeper_of(OmegaConf.to_container(cfg.hydra.sweeper, resolve=False))


@pytest.mark.parametrize("other, named", [
    (("hydra.sweeper.study_name=another",), "study_name=another"),
    (("hydra.sweeper.storage=sqlite:////elsewhere/optuna.db",), "storage=sqlite:////elsewhere/optuna.db")])
def test_a_sweep_folder_records_its_study_and_refuses_another_study_as_a_whole(tmp_path, other, named):
    from tf_harness.experiments.sweeps.study_sweeper import _record_owner
    from tf_harness.experiments.sweeps.sweep_folder import Refused, SweepFolder
    command = ("hparams_search=optuna", "dataset=lfw_pairs")
    cfg, sweeper = composed(*command)
    _record_owner(cfg, tmp_path)
    assert cfg.hydra.overrides.task == list(command)
    SweepFolder.take(tmp_path, list(command), sweeper).release()  # the same sweep again
    _, another = composed(*command, *other)
    with pytest.raises(Refused) as refused:
        SweepFolder.take(tmp_path, list(command), another)
    assert_names(str(refused.value), f"hydra.sweep.dir={tmp_path} holds another sweep", named,
                 "name another hydra.sweep.dir")
    _, basic = composed("seed=1")  # a job of `-m seed=1,2`: Hydra's basic sweeper
    with pytest.raises(Refused) as refused:  # its command line differs
        SweepFolder.take(tmp_path, ["seed=1,2"], basic)
    assert_names(str(refused.value), "hparams_search=optuna there, (unset) here")


def test_a_job_whose_study_stops_answering_trains_on_unpruned_with_one_warning(tmp_path, monkeypatch, caplog):
    import logging

    import optuna
    import sqlalchemy.exc

    from tf_harness.experiments.sweeps import study
    from tf_harness.experiments.sweeps.pruning import Pruning
    url = f"sqlite:///{tmp_path}/optuna.db"
    kept, _ = study.create(url, "s", ["maximize"])
    number = kept.ask().number
    pruning = Pruning("median", study.JobTrial(url, "s", number), lambda values: values["accuracy"], tmp_path, True)

    def gone(*args, **kwargs):
        raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(optuna.trial.Trial, "report", gone)
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.sweeps.pruning"):
        for step in (1, 2):
            pruning.evaluated({"accuracy": 0.5}, step)
    assert not pruning.stopped
    [warning] = [record.getMessage() for record in caplog.records if record.name.endswith(".pruning")]
    assert_names(warning, f"study of trial {number} cannot be reached", "server closed", "without pruning")


def test_the_sweeper_runs_on_todays_optuna_and_sqlalchemy_and_no_longer_on_hydras_old_plugin():
    from pathlib import Path

    import optuna
    import sqlalchemy
    from packaging.version import Version

    from tests.conftest import PROJECT
    assert Version(optuna.__version__) >= Version("4.9") and Version(sqlalchemy.__version__).major == 2
    sources = [path for folder in ("experiments", "data", "models", "conf") for path in (PROJECT / folder).rglob("*")
               if path.suffix in (".py", ".yaml")]
    assert not [path for path in sources if "hydra_optuna_sweeper" in path.read_text()]
    assert "hydra-optuna-sweeper" not in (PROJECT / "pyproject.toml").read_text()


def test_the_grid_sampler_is_refused_in_one_line_before_a_study_is_made(tmp_path):
    from hydra.errors import HydraException

    from tf_harness.experiments.sweeps.study_sweeper import sweep
    storage = f"sqlite:///{tmp_path}/optuna.db"
    with pytest.raises(HydraException) as refused:
        sweep(config(tmp_path, storage), Launcher(tmp_path), settings(storage=storage,
                                                                      sampler="optuna.samplers.GridSampler"), [])
    assert_names(str(refused.value), "GridSampler is not supported", "-m with listed values")
    assert not list(tmp_path.iterdir())
