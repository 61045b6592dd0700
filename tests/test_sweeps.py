"""Sweeps that tell the truth: under every launcher, one failed job leaves the others to finish, and the sweep
exits nonzero with a summary naming each failed job, its overrides, its run directory and its error line; every
sweep ends with one line naming the jobs run and failed and the best job; each job's HParams record says how it
ended."""
import json
import re

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from tests.conftest import run_cli

SMOKE = ("dataset=lfw_pairs", "experiment=smoke")
# The summary line: `N jobs ran, F failed; best <metric> <value> in job <n> (<overrides>): <run directory>`.
SUMMARY = re.compile(r"^(\d+) jobs? ran, (\d+) failed; best (\S+) (\d\.\d{4}) in job (\d+)(?: \((.*)\))?: (.+)$")


def last_line(stderr):
    return stderr.rstrip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib", "submitit_local"])
def test_a_sweep_with_a_failed_job_finishes_the_others_then_names_it(tmp_path, launcher):
    result = run_cli("-m", f"hydra/launcher={launcher}", *SMOKE, "dataset.root=/nonexistent/root,null",
                     f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert json.loads((tmp_path / "1" / "metrics.json").read_text())["global_step"] == 4
    summary = result.stderr[result.stderr.index("1 of 2 jobs failed:"):].splitlines()
    error = "config error: dataset.root=/nonexistent/root is not an existing directory"
    assert summary[1].startswith(f"  job 0 (dataset=lfw_pairs experiment=smoke dataset.root=/nonexistent/root) "
                                 f"in {tmp_path / '0'}: {error}"), summary
    assert len(summary) == 3
    found = SUMMARY.match(summary[2])
    assert found, summary
    assert found.groups()[:3] + found.groups()[4:] == ("2", "1", "accuracy", "1", "dataset.root=null",
                                                       str(tmp_path / "1"))


@pytest.mark.slow
def test_a_sweep_whose_jobs_all_succeed_exits_0_under_joblib_and_says_nothing_of_failures(tmp_path):
    result = run_cli("-m", "hydra/launcher=joblib", *SMOKE, "trainer.train_steps=1", "trainer.eval_steps=1",
                     "seed=1,2", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "jobs failed" not in result.stderr
    outcomes = [json.loads((tmp_path / job / "job_outcome.json").read_text()) for job in ("0", "1")]
    assert [(o["status"], o["metric"]) for o in outcomes] == [(0, "accuracy"), (0, "accuracy")]
    best = max(outcomes, key=lambda o: o["value"])  # the first of equals
    assert last_line(result.stderr) == (f"2 jobs ran, 0 failed; best accuracy {best['value']:.4f} in job {best['job']} "
                                        f"(seed={best['job'] + 1}): {tmp_path / str(best['job'])}")


def test_a_failed_joblib_job_is_not_exit_0(tmp_path):
    """The joblib launcher used to exit 0 when a job failed: its jobs ran in other processes."""
    result = run_cli("-m", "hydra/launcher=joblib", *SMOKE, "dataset.root=/nonexistent/a,/nonexistent/b",
                     f"hydra.sweep.dir={tmp_path}", timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "2 of 2 jobs failed:" in result.stderr
    job = f"job 1 (dataset=lfw_pairs experiment=smoke dataset.root=/nonexistent/b) in {tmp_path / '1'}: config error:"
    assert job in result.stderr
    assert last_line(result.stderr) == f"2 jobs ran, 2 failed; no job reported a validation metric: {tmp_path}"


@pytest.mark.slow
def test_an_optuna_sweep_names_its_best_trial_and_its_value(tmp_path):
    """3 TPE trials (seeded) on tiny LFW, each maximising the validation accuracy its job returns."""
    import yaml
    result = run_cli("-m", "hparams_search=optuna", *SMOKE, "trainer.train_steps=2", "trainer.eval_steps=2",
                     "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == {"trainer.learning_rate", "pipeline.batch_size"}
    trials = {}
    for job in ("0", "1", "2"):
        listed = yaml.safe_load((tmp_path / job / ".hydra" / "overrides.yaml").read_text())
        overrides = dict(override.split("=", 1) for override in listed)
        trials[job] = ({key: yaml.safe_load(overrides[key]) for key in best["best_params"]},
                       json.loads((tmp_path / job / "metrics.json").read_text())["accuracy"])
    matching = [accuracy for params, accuracy in trials.values() if params == best["best_params"]]
    assert matching and matching[0] == best["best_value"]
    assert best["best_value"] == max(accuracy for _, accuracy in trials.values())


# The sweep report's parts, without a launcher ---------------------------------------------------------------------

def job_config(run_dir, num=0, overrides=("seed=1",), mode="train_and_evaluate", hydra_mode=RunMode.MULTIRUN):
    """The config a job's callbacks get: the run's keys it reads and Hydra's."""
    return OmegaConf.create({"mode": mode, "dataset": {"name": "lfw_pairs"}, "hydra": {
        "mode": hydra_mode, "runtime": {"output_dir": str(run_dir)}, "job": {"num": num},
        "overrides": {"task": list(overrides)}, "sweep": {"dir": str(run_dir.parent)}}})


def job_return(metric=None, status=0, error=None, **kwargs):
    from tf_harness.experiments.cli import Outcome
    ret = JobReturn(status=JobStatus.COMPLETED)
    ret.return_value = Outcome(metric, status, error, **kwargs)
    return ret


def recorded_run(run_dir):
    """A run directory with its HParams record, as a job writes it when it starts training."""
    from tests.test_hparams import hydra_config, record
    from tests.conftest import compose
    record(run_dir, "binary", compose(*SMOKE), hydra_config(run_dir.parent, {"dataset": "lfw_pairs"}, ["seed=1,2"]))
    return run_dir


def session_end(run_dir):
    """(status, exit status) of the run's session as TensorBoard reads them; None without an end record."""
    from tensorboard.plugins.hparams import metadata
    from tests.conftest import event_tags
    accumulator, tags = event_tags(run_dir)
    if metadata.SESSION_END_INFO_TAG not in tags:
        return None
    end = metadata.parse_session_end_info_plugin_data(
        accumulator.SummaryMetadata(metadata.SESSION_END_INFO_TAG).plugin_data.content)
    return end.status, accumulator.Scalars("exit_status")[-1].value


def end_job(report, config, ret):
    report.on_job_start(config=config, task_function=None)
    report.on_job_end(config=config, job_return=ret)


@pytest.mark.parametrize("ret, expected", [
    (lambda: job_return(None, 1, "error: 3 training steps in a row had a non-finite loss"), ("STATUS_FAILURE", 1)),
    (lambda: JobReturn(status=JobStatus.FAILED, _return_value=RuntimeError("a bug")), ("STATUS_FAILURE", 1)),
    (lambda: job_return(0.75), ("STATUS_SUCCESS", 0))], ids=["failed", "raised", "succeeded"])
def test_each_job_marks_its_session_with_its_status_and_exit_status(tmp_path, ret, expected):
    """TensorBoard showed a failed job (lr=1e30) as an ordinary row."""
    from tensorboard.plugins.hparams import api_pb2
    from tf_harness.experiments.sweep_report import SweepReport
    run_dir = recorded_run(tmp_path / "sweep" / "1")
    end_job(SweepReport(), job_config(run_dir, 1), ret())
    assert session_end(run_dir) == (api_pb2.Status.Value(expected[0]), expected[1])
    outcome = json.loads((run_dir / "job_outcome.json").read_text())
    assert (outcome["status"], outcome["metric"], outcome["value"]) == (
        (0, "accuracy", 0.75) if expected[1] == 0 else (1, None, None))


def test_a_job_that_never_recorded_itself_and_a_re_entry_s_config_error_leave_no_mark(tmp_path):
    from tensorboard.plugins.hparams import api_pb2
    from tf_harness.experiments.sweep_report import SweepReport
    fresh = tmp_path / "sweep" / "0"
    fresh.mkdir(parents=True)
    end_job(SweepReport(), job_config(fresh), job_return(None, 2, "config error: dataset.root=/x is not ..."))
    assert not list(fresh.glob("events.out.tfevents.*"))  # still no HParams record, so no row
    run_dir = recorded_run(tmp_path / "run")
    end_job(SweepReport(), job_config(run_dir, hydra_mode=RunMode.RUN), job_return(0.5))
    success = (api_pb2.STATUS_SUCCESS, 0)
    assert session_end(run_dir) == success and not (run_dir / "job_outcome.json").exists()
    # Re-entering it: a second process refused (in use, a typo), checkpoints that refuse it before it starts and a
    # prediction leave it as it was...
    end_job(SweepReport(), job_config(run_dir, hydra_mode=RunMode.RUN), job_return(None, 2, "config error: in use"))
    end_job(SweepReport(), job_config(run_dir, hydra_mode=RunMode.RUN),
            job_return(None, 1, "error: ckpt-6 is ahead of global step 4", ran=False))
    end_job(SweepReport(), job_config(run_dir, mode="predict", hydra_mode=RunMode.RUN), job_return(None, 1, "e"))
    # ... and so does a sidecar evaluator's exit, which is not the training's.
    end_job(SweepReport(), job_config(run_dir, mode="continuous_eval", hydra_mode=RunMode.RUN), job_return(None, 1, "e"))
    assert session_end(run_dir) == success
    # ... a resumed training that fails marks it failed.
    end_job(SweepReport(), job_config(run_dir, hydra_mode=RunMode.RUN), job_return(None, 1, "error: no checkpoint"))
    assert session_end(run_dir) == (api_pb2.STATUS_FAILURE, 1)


def outcome(job, status=0, metric="accuracy", value=None, overrides=("dataset=lfw_pairs",), sweep="/s"):
    return {"status": status, "error": None if status == 0 else "error: it broke", "job": job,
            "overrides": list(overrides), "run_dir": f"{sweep}/{job}", "metric": metric if value is not None else None,
            "value": value}


def test_the_summary_line_names_the_jobs_run_and_failed_and_the_best_job():
    from tf_harness.experiments.sweep_report import summary_line
    jobs = [outcome(0, value=0.5, overrides=("dataset=lfw_pairs", "trainer.learning_rate=0.001")),
            outcome(1, value=0.9123, overrides=("dataset=lfw_pairs", "trainer.learning_rate=0.01")),
            outcome(2, status=1, overrides=("dataset=lfw_pairs", "trainer.learning_rate=1e+30"))]
    assert summary_line(jobs, "/s") == ("3 jobs ran, 1 failed; best accuracy 0.9123 in job 1 "
                                        "(trainer.learning_rate=0.01): /s/1")
    assert summary_line(jobs[:1], "/s") == ("1 job ran, 0 failed; best accuracy 0.5000 in job 0 "
                                            "(dataset=lfw_pairs trainer.learning_rate=0.001): /s/0")
    # A sweep over datasets: the best of each headline metric.
    mixed = [outcome(0, metric="auc/mean", value=0.8, overrides=("dataset=chest_xray",)),
             outcome(1, value=0.7, overrides=("dataset=lfw_pairs",))]
    assert summary_line(mixed, "/s") == ("2 jobs ran, 0 failed; best auc/mean 0.8000 in job 0 (dataset=chest_xray): "
                                         "/s/0; best accuracy 0.7000 in job 1 (dataset=lfw_pairs): /s/1")
    assert summary_line([outcome(0, status=2)], "/s") == "1 job ran, 1 failed; no job reported a validation metric: /s"


@pytest.mark.parametrize("failed", [False, True])
def test_every_sweep_ends_with_its_summary_line_after_the_failed_jobs(tmp_path, capsys, monkeypatch, failed):
    """A sweep that succeeded ended without a word."""
    from tf_harness.experiments import cli
    from tf_harness.experiments.sweep_report import OUTCOME, SweepReport
    monkeypatch.setattr(cli, "_status", 0)
    jobs = [outcome(0, value=0.75, overrides=("seed=1",), sweep=str(tmp_path)),
            outcome(1, status=int(failed), value=None if failed else 0.5, overrides=("seed=2",), sweep=str(tmp_path))]
    for job in jobs:
        (tmp_path / str(job["job"])).mkdir()
        (tmp_path / str(job["job"]) / OUTCOME).write_text(json.dumps(job))
    SweepReport().on_multirun_end(config=OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    lines = capsys.readouterr().err.splitlines()
    best = f"best accuracy 0.7500 in job 0 (seed=1): {tmp_path / '0'}"
    if failed:
        assert lines == ["1 of 2 jobs failed:", f"  job 1 (seed=2) in {tmp_path / '1'}: error: it broke",
                         f"2 jobs ran, 1 failed; {best}"]
    else:
        assert lines == [f"2 jobs ran, 0 failed; {best}"]
    assert cli._status == int(failed)


def started_sweep(sweep_dir):
    """A sweep's report, started over `sweep_dir` as it is now; returns what ends it: capsys -> its stderr lines."""
    from tf_harness.experiments.sweep_report import SweepReport
    config, report = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}}), SweepReport()
    report.on_multirun_start(config=config)

    def end(capsys):
        report.on_multirun_end(config=config)
        return capsys.readouterr().err.splitlines()
    return end


def test_a_damaged_job_outcome_is_a_failure_and_an_earlier_sweeps_folders_are_left_out(tmp_path, capsys, monkeypatch):
    """An empty job_outcome.json made a failed sweep exit 0, without its report: reading it raised, and Hydra
    turned that into a warning."""
    from tf_harness.experiments import cli
    from tf_harness.experiments.sweep_report import OUTCOME, SweepReport
    monkeypatch.setattr(cli, "_status", 0)
    # An earlier sweep's, into the same directory:
    stale = {"2": "", "3": json.dumps(outcome(3, status=2, sweep=str(tmp_path)))}
    for job, text in stale.items():
        (tmp_path / job).mkdir()
        (tmp_path / job / OUTCOME).write_text(text)
    report_at_end = started_sweep(tmp_path)
    for job, metric in ((0, 0.75), (1, 0.5)):
        (tmp_path / str(job)).mkdir()
        end_job(SweepReport(), job_config(tmp_path / str(job), job, (f"seed={job + 1}",)), job_return(metric))
    damaged = {"4": b'{"status": 0, "err', "5": b"[1, 2]", "6": b'{"status": 0}', "8": b"\xff", "10": b""}
    for job, content in damaged.items():  # cut short, not an outcome, keys missing, not text, empty
        (tmp_path / job).mkdir()
        (tmp_path / job / OUTCOME).write_bytes(content)
    (tmp_path / "7" / OUTCOME).mkdir(parents=True)  # a folder in its place
    (tmp_path / "9").mkdir()  # a job that could not write its outcome
    lines = report_at_end(capsys)
    unknown = "error: the job's outcome is unknown: job_outcome.json"
    assert lines == ["7 of 9 jobs failed:",
                     f"  job 4 in {tmp_path / '4'}: {unknown} is not JSON",
                     f"  job 5 in {tmp_path / '5'}: {unknown} is not a job outcome "
                     f"(no valid status, error, job, overrides, run_dir, metric, value)",
                     f"  job 6 in {tmp_path / '6'}: {unknown} is not a job outcome "
                     f"(no valid error, job, overrides, run_dir, metric, value)",
                     f"  job 7 in {tmp_path / '7'}: {unknown} cannot be read (Is a directory)",
                     f"  job 8 in {tmp_path / '8'}: {unknown} is not JSON",
                     f"  job 9 in {tmp_path / '9'}: error: the job's outcome is unknown: no job_outcome.json: "
                     f"the job could not write it",
                     f"  job 10 in {tmp_path / '10'}: {unknown} is not JSON (it is empty)",
                     f"9 jobs ran, 7 failed; best accuracy 0.7500 in job 0 (seed=1): {tmp_path / '0'}"]
    assert cli._status == 1
    assert (tmp_path / "2" / OUTCOME).read_text() == "" and (tmp_path / "3" / OUTCOME).read_text() == stale["3"]


def test_a_job_that_ran_in_an_earlier_sweeps_folder_and_wrote_no_outcome_is_a_failure(tmp_path, capsys, monkeypatch):
    """A job re-entering an earlier sweep's folder that could not write its outcome was not reported: the folder's
    outcome (an earlier job's, or none) was as it had been when the sweep started."""
    from tf_harness.experiments import cli
    from tf_harness.experiments.sweep_report import OUTCOME, SweepReport
    monkeypatch.setattr(cli, "_status", 0)
    for job in ("0", "1", "2"):  # an earlier sweep's folders, each with the config its job saved
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "config.yaml").write_text("seed: 1\n")
    for job in ("1", "2"):
        (tmp_path / job / OUTCOME).write_text(json.dumps(outcome(int(job), value=0.9, sweep=str(tmp_path))))
    report_at_end = started_sweep(tmp_path)
    for job in ("0", "1", "2"):  # this sweep's jobs re-enter them, saving their configs beside the first
        (tmp_path / job / ".hydra" / "reentry-1").mkdir()
        (tmp_path / job / ".hydra" / "reentry-1" / "config.yaml").write_text("seed: 2\n")
    end_job(SweepReport(), job_config(tmp_path / "2", 2, ("seed=2",)), job_return(0.5))  # job 2 alone writes its own
    lines = report_at_end(capsys)
    unknown = "error: the job's outcome is unknown:"
    assert lines == ["2 of 3 jobs failed:",
                     f"  job 0 in {tmp_path / '0'}: {unknown} no job_outcome.json: the job could not write it",
                     f"  job 1 in {tmp_path / '1'}: {unknown} the job_outcome.json there is an earlier job's: this job "
                     "could not write its own",
                     f"3 jobs ran, 2 failed; best accuracy 0.5000 in job 2 (seed=2): {tmp_path / '2'}"]
    assert cli._status == 1


def test_a_job_outcome_is_written_whole_or_not_at_all(tmp_path, monkeypatch, caplog):
    """A full disk mid-write left a cut-short job_outcome.json."""
    import errno
    from tf_harness.data.integrity import atomic_file
    from tf_harness.experiments.sweep_report import OUTCOME, SweepReport
    run_dir = tmp_path / "0"
    run_dir.mkdir()
    (run_dir / OUTCOME).write_text("an earlier outcome\n")

    class FullDisk:
        """A file on a disk that fills after its first 10 characters."""

        def __init__(self, path, *args, **kwargs):
            self.file = open(path, *args, **kwargs)

        def write(self, text):
            self.file.write(text[:10])
            self.file.flush()
            raise OSError(errno.ENOSPC, "No space left on device", self.file.name)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.file.close()

    monkeypatch.setattr(atomic_file, "open", FullDisk, raising=False)
    end_job(SweepReport(), job_config(run_dir), job_return(0.5))
    monkeypatch.undo()
    assert sorted(path.name for path in run_dir.iterdir()) == [OUTCOME]
    assert (run_dir / OUTCOME).read_text() == "an earlier outcome\n"
    assert f"could not write the job's outcome to {run_dir / OUTCOME}" in caplog.text
    end_job(SweepReport(), job_config(run_dir), job_return(0.5))
    assert json.loads((run_dir / OUTCOME).read_text())["value"] == 0.5


def test_a_sweep_into_a_directory_of_an_earlier_sweep_reports_its_own_jobs_alone(tmp_path):
    """The joblib sweep exited 0 with its failed job unreported: an earlier sweep's folder 2 held an empty outcome."""
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "job_outcome.json").write_text("")
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "job_outcome.json").write_text(json.dumps(outcome(3, value=0.99, sweep=str(tmp_path))))
    result = run_cli("-m", "hydra/launcher=joblib", *SMOKE, "dataset.root=/nonexistent/a,/nonexistent/b",
                     f"hydra.sweep.dir={tmp_path}", timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "raised" not in result.stderr
    assert "2 of 2 jobs failed:" in result.stderr
    assert last_line(result.stderr) == f"2 jobs ran, 2 failed; no job reported a validation metric: {tmp_path}"
