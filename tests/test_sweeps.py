"""Sweeps that tell the truth: under every launcher, one failed job leaves the others to finish, and the sweep
exits nonzero with a summary naming each failed job, its overrides, its run directory and its error line; every
sweep ends with one line naming the jobs run and failed and the best job; each job's HParams record says how it
ended."""
import json
import re
import shutil

import pytest
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from tests.conftest import run_cli
from tests.refusals import assert_names, one_naming

SMOKE = ("dataset=lfw_pairs", "experiment=smoke")
# The summary line: `N jobs ran, F failed; best <metric> <value> <interval> in job <n> (<overrides>): <run directory>`.
SUMMARY = re.compile(r"^(\d+) jobs? ran, (\d+) failed; best (\S+) (\d\.\d{4}) (?:\[(\d\.\d{4}), (\d\.\d{4})\] "
                     r"\(95% bootstrap over ([^)]+)\)|\(no interval: [^)]+\)) in job (\d+)(?: \((.*)\))?: (.+)$")
# What the summary says of a job whose outcome holds no interval: written by hand, or one whose run directory holds no
# evaluation record of its value, or an evaluation record written without intervals.
RECORDED_NONE = "(no interval: the job recorded none)"
NO_RECORD = "(no interval: no evaluation record in its run directory holds this value)"
COMPUTED_NONE = "(no interval: its evaluation computed none)"


def interval_text(outcome):
    """The summary's interval of a job, from its job_outcome.json."""
    bounds = outcome["ci95"]
    return f"[{bounds[0]:.4f}, {bounds[1]:.4f}] ({outcome['interval']})" if bounds else f"({outcome['interval']})"


def last_line(stderr):
    return stderr.rstrip().splitlines()[-1]


def failed_job(line, job, run_dir, *named):
    """Checks that a report's `line` is job `job`'s (its overrides free), in `run_dir`, failing with an `error: `
    naming each of `named`; returns the line."""
    assert line.startswith(f"  job {job} ") and f" in {run_dir}: error: " in line, line
    return assert_names(line, *named)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib", "submitit_local"])
def test_a_sweep_with_a_failed_job_finishes_the_others_then_names_it(tmp_path, launcher):
    result = run_cli("-m", f"hydra/launcher={launcher}", *SMOKE, "dataset.root=/nonexistent/root,null",
                     f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert json.loads((tmp_path / "1" / "metrics.json").read_text())["global_step"] == 4
    summary = result.stderr[result.stderr.index("1 of 2 jobs failed:"):].splitlines()
    assert summary[1].startswith(f"  job 0 (dataset=lfw_pairs experiment=smoke dataset.root=/nonexistent/root) "
                                 f"in {tmp_path / '0'}: config error: dataset.root=/nonexistent/root "), summary
    assert len(summary) == 3
    found = SUMMARY.match(summary[2])
    assert found, summary
    assert found.groups()[:3] + found.groups()[7:] == ("2", "1", "accuracy", "1", "dataset.root=null",
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
    assert last_line(result.stderr) == (f"2 jobs ran, 0 failed; best accuracy {best['value']:.4f} "
                                        f"{interval_text(best)} in job {best['job']} (seed={best['job'] + 1}): "
                                        f"{tmp_path / str(best['job'])}")


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
    record(run_dir, compose(*SMOKE), hydra_config(run_dir.parent, {"dataset": "lfw_pairs"}, ["seed=1,2"]))
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
    from tf_harness.experiments.cli import SweepCallback
    run_dir = recorded_run(tmp_path / "sweep" / "1")
    end_job(SweepCallback(), job_config(run_dir, 1), ret())
    assert session_end(run_dir) == (api_pb2.Status.Value(expected[0]), expected[1])
    outcome = json.loads((run_dir / "job_outcome.json").read_text())
    assert (outcome["status"], outcome["metric"], outcome["value"]) == (
        (0, "accuracy", 0.75) if expected[1] == 0 else (1, None, None))


def test_a_job_that_never_recorded_itself_and_a_re_entry_s_config_error_leave_no_mark(tmp_path):
    from tensorboard.plugins.hparams import api_pb2
    from tf_harness.experiments.cli import SweepCallback
    fresh = tmp_path / "sweep" / "0"
    fresh.mkdir(parents=True)
    end_job(SweepCallback(), job_config(fresh), job_return(None, 2, "config error: dataset.root=/x is not ..."))
    assert not list(fresh.glob("events.out.tfevents.*"))  # still no HParams record, so no row
    run_dir = recorded_run(tmp_path / "run")
    end_job(SweepCallback(), job_config(run_dir, hydra_mode=RunMode.RUN), job_return(0.5))
    success = (api_pb2.STATUS_SUCCESS, 0)
    assert session_end(run_dir) == success and not (run_dir / "job_outcome.json").exists()
    # Re-entering it: a second process refused (in use, a typo), checkpoints that refuse it before it starts and a
    # prediction leave it as it was...
    end_job(SweepCallback(), job_config(run_dir, hydra_mode=RunMode.RUN), job_return(None, 2, "config error: in use"))
    end_job(SweepCallback(), job_config(run_dir, hydra_mode=RunMode.RUN),
            job_return(None, 1, "error: ckpt-6 is ahead of global step 4", ran=False))
    end_job(SweepCallback(), job_config(run_dir, mode="predict", hydra_mode=RunMode.RUN), job_return(None, 1, "e"))
    # ... and so does a sidecar evaluator's exit, which is not the training's.
    end_job(SweepCallback(), job_config(run_dir, mode="continuous_eval", hydra_mode=RunMode.RUN),
            job_return(None, 1, "e"))
    assert session_end(run_dir) == success
    # ... a resumed training that fails marks it failed.
    end_job(SweepCallback(), job_config(run_dir, hydra_mode=RunMode.RUN), job_return(None, 1, "error: no checkpoint"))
    assert session_end(run_dir) == (api_pb2.STATUS_FAILURE, 1)


def outcome(job, status=0, metric="accuracy", value=None, overrides=("dataset=lfw_pairs",), sweep="/s", **interval):
    """A job_outcome.json's record; `interval`: its ci95 and interval, where it has them."""
    return {"status": status, "error": None if status == 0 else "error: it broke", "job": job,
            "overrides": list(overrides), "run_dir": f"{sweep}/{job}", "metric": metric if value is not None else None,
            "value": value, **interval}


def test_the_summary_line_names_the_jobs_run_and_failed_and_the_best_job():
    from tf_harness.experiments.sweeps.sweep_report import summary_line
    jobs = [outcome(0, value=0.5, overrides=("dataset=lfw_pairs", "trainer.learning_rate=0.001"), ci95=None,
                    interval="no interval: evaluation.bootstrap=0"),
            outcome(1, value=0.9123, overrides=("dataset=lfw_pairs", "trainer.learning_rate=0.01"),
                    ci95=[0.88125, 0.94], interval="95% bootstrap over pairs"),
            outcome(2, status=1, overrides=("dataset=lfw_pairs", "trainer.learning_rate=1e+30"))]
    assert summary_line(jobs, "/s") == ("3 jobs ran, 1 failed; best accuracy 0.9123 [0.8812, 0.9400] (95% bootstrap "
                                        "over pairs) in job 1 (trainer.learning_rate=0.01): /s/1")
    assert summary_line(jobs[:1], "/s") == ("1 job ran, 0 failed; best accuracy 0.5000 (no interval: "
                                            "evaluation.bootstrap=0) in job 0 "
                                            "(dataset=lfw_pairs trainer.learning_rate=0.001): /s/0")
    # A sweep over datasets: the best of each headline metric.
    mixed = [outcome(0, metric="auc/mean", value=0.8, overrides=("dataset=chest_xray",)),
             outcome(1, value=0.7, overrides=("dataset=lfw_pairs",))]
    assert summary_line(mixed, "/s") == (f"2 jobs ran, 0 failed; best auc/mean 0.8000 {RECORDED_NONE} in job 0 "
                                         f"(dataset=chest_xray): /s/0; best accuracy 0.7000 {RECORDED_NONE} in job 1 "
                                         "(dataset=lfw_pairs): /s/1")
    assert summary_line([outcome(0, status=2)], "/s") == "1 job ran, 1 failed; no job reported a validation metric: /s"


@pytest.mark.parametrize("failed", [False, True])
def test_every_sweep_ends_with_its_summary_line_after_the_failed_jobs(tmp_path, capsys, monkeypatch, failed):
    """A sweep that succeeded ended without a word."""
    from tf_harness.experiments import cli
    from tf_harness.experiments.cli import SweepCallback
    from tf_harness.experiments.sweeps.sweep_report import OUTCOME
    monkeypatch.setattr(cli, "_status", 0)
    jobs = [outcome(0, value=0.75, overrides=("seed=1",), sweep=str(tmp_path)),
            outcome(1, status=int(failed), value=None if failed else 0.5, overrides=("seed=2",), sweep=str(tmp_path))]
    for job in jobs:
        (tmp_path / str(job["job"])).mkdir()
        (tmp_path / str(job["job"]) / OUTCOME).write_text(json.dumps(job))
    SweepCallback().on_multirun_end(config=OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    lines = capsys.readouterr().err.splitlines()
    best = f"best accuracy 0.7500 {RECORDED_NONE} in job 0 (seed=1): {tmp_path / '0'}"
    if failed:
        assert lines == ["1 of 2 jobs failed:", f"  job 1 (seed=2) in {tmp_path / '1'}: error: it broke",
                         f"2 jobs ran, 1 failed; {best}"]
    else:
        assert lines == [f"2 jobs ran, 0 failed; {best}"]
    assert cli._status == int(failed)


def started_sweep(sweep_dir):
    """A sweep's report, started over `sweep_dir` as it is now; returns what ends it: capsys -> its stderr lines."""
    from tf_harness.experiments.cli import SweepCallback
    config, report = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}}), SweepCallback()
    report.on_multirun_start(config=config)

    def end(capsys):
        report.on_multirun_end(config=config)
        return capsys.readouterr().err.splitlines()
    return end


def test_a_damaged_job_outcome_is_a_failure_and_an_earlier_sweeps_folders_are_left_out(tmp_path, capsys, monkeypatch):
    """An empty job_outcome.json made a failed sweep exit 0, without its report: reading it raised, and Hydra
    turned that into a warning."""
    from tf_harness.experiments import cli
    from tf_harness.experiments.cli import SweepCallback
    from tf_harness.experiments.sweeps.sweep_report import OUTCOME
    monkeypatch.setattr(cli, "_status", 0)
    # An earlier sweep's, into the same directory:
    stale = {"2": "", "3": json.dumps(outcome(3, status=2, sweep=str(tmp_path)))}
    for job, text in stale.items():
        (tmp_path / job).mkdir()
        (tmp_path / job / OUTCOME).write_text(text)
    report_at_end = started_sweep(tmp_path)
    for job, metric in ((0, 0.75), (1, 0.5)):
        (tmp_path / str(job)).mkdir()
        end_job(SweepCallback(), job_config(tmp_path / str(job), job, (f"seed={job + 1}",)), job_return(metric))
    damaged = {"4": b'{"status": 0, "err', "5": b"[1, 2]", "6": b'{"status": 0}', "8": b"\xff", "10": b""}
    for job, content in damaged.items():  # cut short, not an outcome, keys missing, not text, empty
        (tmp_path / job).mkdir()
        (tmp_path / job / OUTCOME).write_bytes(content)
    (tmp_path / "7" / OUTCOME).mkdir(parents=True)  # a folder in its place
    (tmp_path / "9").mkdir()  # a job that could not write its outcome
    lines = report_at_end(capsys)
    assert lines[0] == "7 of 9 jobs failed:"
    assert lines[-1] == f"9 jobs ran, 7 failed; best accuracy 0.7500 {NO_RECORD} in job 0 (seed=1): {tmp_path / '0'}"
    # What is wrong with each, in a word or the keys missing; job 10's line is docs/sweeps-and-review.md's example.
    named = {4: ("not JSON",), 5: ("status, error, job, overrides, run_dir, metric, value",),
             6: ("error, job, overrides, run_dir, metric, value",), 7: ("Is a directory",), 8: ("not JSON",),
             9: ("no job_outcome.json",)}
    assert len(lines) == 2 + len(named) + 1
    for line, (job, names) in zip(lines[1:], named.items()):
        failed_job(line, job, tmp_path / str(job), OUTCOME, *names)
    assert "(no valid error, job" in lines[3]  # job 6 holds a valid status
    assert lines[-2] == (f"  job 10 in {tmp_path / '10'}: error: the job's outcome is unknown: job_outcome.json is not "
                         "JSON (it is empty)")
    assert cli._status == 1
    assert (tmp_path / "2" / OUTCOME).read_text() == "" and (tmp_path / "3" / OUTCOME).read_text() == stale["3"]


def test_a_job_that_ran_in_an_earlier_sweeps_folder_and_wrote_no_outcome_is_a_failure(tmp_path, capsys, monkeypatch):
    """A job re-entering an earlier sweep's folder that could not write its outcome was not reported: the folder's
    outcome (an earlier job's, or none) was as it had been when the sweep started."""
    from tf_harness.experiments import cli
    from tf_harness.experiments.cli import SweepCallback
    from tf_harness.experiments.sweeps.sweep_report import OUTCOME
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
    end_job(SweepCallback(), job_config(tmp_path / "2", 2, ("seed=2",)), job_return(0.5))  # job 2 alone writes its own
    lines = report_at_end(capsys)
    assert lines[0] == "2 of 3 jobs failed:" and len(lines) == 4
    failed_job(lines[1], 0, tmp_path / "0", "no job_outcome.json")
    failed_job(lines[2], 1, tmp_path / "1", "job_outcome.json", "earlier job's")
    assert lines[3] == f"3 jobs ran, 2 failed; best accuracy 0.5000 {NO_RECORD} in job 2 (seed=2): {tmp_path / '2'}"
    assert cli._status == 1


def test_a_job_outcome_is_written_whole_or_not_at_all(tmp_path, monkeypatch, caplog):
    """A full disk mid-write left a cut-short job_outcome.json."""
    import errno
    from tf_harness.data.integrity import writing
    from tf_harness.experiments.cli import SweepCallback
    from tf_harness.experiments.sweeps.sweep_report import OUTCOME
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

    monkeypatch.setattr(writing, "open", FullDisk, raising=False)
    end_job(SweepCallback(), job_config(run_dir), job_return(0.5))
    monkeypatch.undo()
    assert sorted(path.name for path in run_dir.iterdir()) == [OUTCOME]
    assert (run_dir / OUTCOME).read_text() == "an earlier outcome\n"
    one_naming(caplog.messages, run_dir / OUTCOME, "No space left on device")
    end_job(SweepCallback(), job_config(run_dir), job_return(0.5))
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


# Re-running a sweep into its folder, and stopping one: each job reported truthfully -----------------------------

def finished_run(run_dir, accuracy):
    """A run directory whose training and last evaluation are done, as a job of an earlier sweep left it."""
    from tf_harness.experiments.sweeps.sweep_report import OUTCOME
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(f"- seed={int(run_dir.name) + 1}\n")
    (run_dir / "metrics.json").write_text(json.dumps({"accuracy": accuracy, "loss": 0.7, "global_step": 4}))
    (run_dir / OUTCOME).write_text(json.dumps(outcome(int(run_dir.name), value=accuracy, overrides=(
        f"seed={int(run_dir.name) + 1}",), sweep=str(run_dir.parent))))
    return run_dir


def test_a_job_re_entering_a_finished_run_reports_the_metric_its_last_evaluation_recorded(tmp_path, capsys):
    """Re-running a finished sweep into its folder reported no metric for its jobs, which had nothing left to train
    and so evaluated nothing: `no job reported a validation metric`, or the best named among the jobs that trained."""
    from tf_harness.experiments.cli import SweepCallback
    from tf_harness.experiments.sweeps.sweep_report import OUTCOME
    for job, accuracy in (("0", 0.5), ("1", 0.875)):
        finished_run(tmp_path / job, accuracy)
    report_at_end = started_sweep(tmp_path)
    returns = {}
    for job in (0, 1):  # the sweep again: each job resumes past its last evaluation and returns no metric
        (tmp_path / str(job) / ".hydra" / "reentry-1").mkdir()
        returns[job] = job_return(None)
        end_job(SweepCallback(), job_config(tmp_path / str(job), job, (f"seed={job + 1}",)), returns[job])
    assert report_at_end(capsys) == [f"2 jobs ran, 0 failed; best accuracy 0.8750 {COMPUTED_NONE} in job 1 (seed=2): "
                                     f"{tmp_path / '1'}"]
    assert float(returns[1].return_value) == 0.875  # what a sweeper such as Optuna maximises
    assert json.loads((tmp_path / "1" / OUTCOME).read_text())["metric"] == "accuracy"


@pytest.mark.parametrize("mode, ret, metrics_json", [
    ("train", lambda: job_return(None), '{"accuracy": 0.9, "global_step": 4}'),
    ("train_and_evaluate", lambda: job_return(None, 1, "error: no checkpoint"), '{"accuracy": 0.9, "global_step": 4}'),
    ("train_and_evaluate", lambda: job_return(None), '{"accuracy": 0.9, "glo'),
    ("train_and_evaluate", lambda: job_return(None), '{"accuracy": NaN, "global_step": 4}'),
    ("train_and_evaluate", lambda: job_return(None), '{"loss": 0.7, "global_step": 4}')],
    ids=["a mode that does not evaluate", "failed", "metrics.json cut short", "NaN", "no headline metric"])
def test_a_job_reports_no_recorded_metric_that_is_not_its_runs_evaluation(tmp_path, mode, ret, metrics_json):
    from tf_harness.experiments.cli import SweepCallback
    from tf_harness.experiments.sweeps.sweep_report import OUTCOME
    run_dir = tmp_path / "0"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(metrics_json)
    end_job(SweepCallback(), job_config(run_dir, mode=mode), ret())
    written = json.loads((run_dir / OUTCOME).read_text())
    assert (written["metric"], written["value"]) == (None, None)


def optuna_job_config(run_dir, num, overrides, direction):
    config = job_config(run_dir, num, overrides)
    OmegaConf.update(config, "hydra.sweeper.direction", direction, force_add=True)
    return config


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_optunas_sweeper_takes_a_job_without_a_metric_as_its_worst_trial_and_goes_on(tmp_path, direction):
    """An Optuna sweep stopped with a traceback at the first job that returned no metric (NaN): a failed job, or
    a re-entered finished one. Runs the plugin's own sweep loop over jobs that end through the report."""
    import yaml
    from tf_harness.experiments.cli import SweepCallback
    from tf_harness.experiments.sweeps.study_sweeper import sweep

    class Launcher:
        """Runs each trial's job at once: job 1's config is refused, the others report 0.5 + job / 10."""

        def launch(self, job_overrides, initial_job_idx):
            returns = []
            for num, overrides in enumerate(job_overrides, initial_job_idx):
                run_dir = tmp_path / str(num)
                run_dir.mkdir()
                ret = job_return(None, 2, "config error: it broke") if num == 1 else job_return(0.5 + num / 10)
                end_job(SweepCallback(), optuna_job_config(run_dir, num, overrides, direction), ret)
                returns.append(ret)
            return returns

    settings = dict(sampler=OmegaConf.create({"_target_": "optuna.samplers.TPESampler", "seed": 1}),
                    direction=direction, storage=None, study_name="s", n_trials=3, n_jobs=1,
                    params=OmegaConf.create({"trainer.learning_rate": "tag(log, interval(0.0001, 0.01))"}))
    sweep(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}), Launcher(), settings, [])
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert best["best_value"] == (0.7 if direction == "maximize" else 0.5)
    assert json.loads((tmp_path / "1" / "job_outcome.json").read_text())["value"] is None


def test_a_job_without_a_metric_returns_nan_to_a_sweeper_that_optimises_nothing(tmp_path):
    import math
    from tf_harness.experiments.cli import SweepCallback
    (tmp_path / "0").mkdir()
    ret = job_return(None, 2, "config error: it broke")
    end_job(SweepCallback(), job_config(tmp_path / "0"), ret)
    assert math.isnan(ret.return_value) and ret.return_value.status == 2


@pytest.fixture
def command_line(monkeypatch):
    """cli.exit_code run in this process, on a sweep's command line: its signal handlers and state put back after."""
    import signal
    import sys
    from tf_harness.experiments import cli
    from tf_harness.experiments.run_dir import interrupts
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(sys, "argv", ["run.py", "-m", "seed=1,2,3"])
    monkeypatch.setattr(cli, "_status", 0)
    monkeypatch.setattr(cli, "_sweep_report", None, raising=False)
    yield cli
    interrupts._pending.clear()
    interrupts._finished = False
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("stop, status", [("SIGINT", 130), ("SIGTERM", 143), ("config error", 2)])
def test_a_sweep_that_a_signal_or_an_error_stops_reports_the_jobs_that_ran(tmp_path, capsys, command_line, stop,
                                                                          status):
    """Ctrl-C during a sweep exited 130 without a word on the jobs that had finished: Hydra reports a sweep only
    when it reaches its end."""
    import signal
    from hydra.errors import ConfigCompositionException
    from tf_harness.experiments.cli import SweepCallback
    from tf_harness.experiments.run_dir import interrupts
    config, report = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}), SweepCallback()

    def sweep():  # what Hydra's multirun does, up to the third job's start
        report.on_multirun_start(config=config)
        for job, ret in ((0, job_return(0.75)), (1, job_return(None, 1, "error: it broke"))):
            (tmp_path / str(job)).mkdir()
            end_job(SweepCallback(), job_config(tmp_path / str(job), job, (f"seed={job + 1}",)), ret)
        (tmp_path / "2" / ".hydra").mkdir(parents=True)  # the third job has saved its config
        (tmp_path / "2" / ".hydra" / "overrides.yaml").write_text("- seed=3\n")
        if stop == "config error":
            raise ConfigCompositionException("seed=x is not an int")
        raise interrupts.Interrupted(getattr(signal, stop))

    assert command_line.exit_code(sweep) == status
    lines = capsys.readouterr().err.splitlines()
    failed = f"  job 1 (seed=2) in {tmp_path / '1'}: error: it broke"
    best = f"best accuracy 0.7500 {NO_RECORD} in job 0 (seed=1): {tmp_path / '0'}"
    if stop == "config error":
        assert lines[1:3] == ["2 of 3 jobs failed:", failed] and lines[4:] == [f"3 jobs ran, 2 failed; {best}"]
        failed_job(lines[3], "2 (seed=3)", tmp_path / "2", "no job_outcome.json")
    else:
        assert lines == [f"interrupted by {stop}", "1 of 3 jobs failed:", failed, "1 of 3 jobs were interrupted:",
                         f"  job 2 (seed=3) in {tmp_path / '2'}: interrupted by {stop}",
                         f"3 jobs ran, 1 failed, 1 interrupted; {best}"]
    assert command_line._sweep_report is None


def test_a_sweep_stopped_before_any_job_ran_adds_nothing_to_the_error(tmp_path, capsys, command_line):
    from hydra.errors import ConfigCompositionException
    from tf_harness.experiments.cli import SweepCallback

    def sweep():
        SweepCallback().on_multirun_start(config=OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
        raise ConfigCompositionException("Could not find 'model/nope'")

    assert command_line.exit_code(sweep) == 2
    line, = capsys.readouterr().err.splitlines()
    assert line.startswith("config error: ") and "'model/nope'" in line, line


def test_a_sweep_that_ends_leaves_no_report_for_the_exit(tmp_path, capsys, command_line):
    end = started_sweep(tmp_path)
    end(capsys)
    assert command_line.exit_code(lambda: None) == 0 and capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_finished_sweep_run_again_into_its_folder_reports_each_job_as_the_first_time(tmp_path):
    args = ("-m", *SMOKE, "trainer.train_steps=2", "trainer.eval_steps=1", "seed=1,2", f"hydra.sweep.dir={tmp_path}")
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to train" in (tmp_path / "1" / "run.log").read_text()
    assert last_line(again.stderr) == last_line(first.stderr)
    assert SUMMARY.match(last_line(again.stderr)), again.stderr[-3000:]


@pytest.mark.slow
def test_an_optuna_sweep_run_again_into_its_folder_names_the_same_best_trial(tmp_path):
    """It stopped with a traceback: its re-entered trials returned no metric, which Optuna's sweeper cannot take.
    A study kept in memory numbers its jobs from 0 on every run, so the re-run re-enters the first run's jobs."""
    args = ("-m", "hparams_search=optuna", *SMOKE, "trainer.train_steps=2", "trainer.eval_steps=1",
            "hydra.sweeper.n_trials=2", "hydra.sweeper.storage=null", f"hydra.sweep.dir={tmp_path}")
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    best = (tmp_path / "optimization_results.yaml").read_text()
    again = run_cli(*args)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert last_line(again.stderr) == last_line(first.stderr)
    assert (tmp_path / "optimization_results.yaml").read_text() == best


def test_an_optuna_sweep_whose_trials_fail_reports_them_without_a_traceback(tmp_path):
    result = run_cli("-m", "hparams_search=optuna", *SMOKE, "dataset.root=/nonexistent/root", "hydra.sweeper.n_trials=2",
                     f"hydra.sweep.dir={tmp_path}", timeout=180)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "2 of 2 jobs failed:" in result.stderr
    lines = result.stderr.rstrip().splitlines()
    assert lines[-2] == f"2 jobs ran, 2 failed; no job reported a validation metric: {tmp_path}"
    assert lines[-1] == "study lfw_pairs: 2 trials, 0 complete, 0 pruned, 2 failed; no trial completed with a value"
    assert sorted(path.name for path in tmp_path.iterdir()) == [".sweep-lock", "0", "1", "multirun.yaml", "optuna.db"]


@pytest.mark.slow
def test_ctrl_c_during_a_sweep_reports_the_jobs_that_ran_and_exits_130(tmp_path):
    """It exited 130 with no word on the job that had finished."""
    import os
    import signal
    import subprocess
    import sys
    from tests.conftest import PROJECT, wait_for_checkpoint
    process = subprocess.Popen([sys.executable, "run.py", "-m", *SMOKE, "trainer.eval_steps=1",
                                "trainer.train_steps=2,100000", f"hydra.sweep.dir={tmp_path}"], cwd=PROJECT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    wait_for_checkpoint(process, tmp_path / "1" / "checkpoints", 2)
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=120)[1]
    assert process.returncode == 130, stderr[-3000:]
    first = json.loads((tmp_path / "0" / "job_outcome.json").read_text())
    lines = stderr.rstrip().splitlines()[-4:]
    assert lines == ["interrupted by SIGINT", "1 of 2 jobs were interrupted:",
                     f"  job 1 (dataset=lfw_pairs experiment=smoke trainer.eval_steps=1 trainer.train_steps=100000) "
                     f"in {tmp_path / '1'}: interrupted by SIGINT",
                     f"2 jobs ran, 0 failed, 1 interrupted; best accuracy {first['value']:.4f} "
                     f"{interval_text(first)} in job 0 "
                     f"(trainer.train_steps=2): {tmp_path / '0'}"], stderr[-3000:]


def test_a_folder_holding_a_run_without_its_saved_config_is_a_re_entry_for_hydra(tmp_path):
    from tf_harness.experiments.run_dir import reentry

    (tmp_path / "job" / "checkpoints").mkdir(parents=True)
    (tmp_path / "job" / "checkpoints" / "ckpt-4.index").write_bytes(b"index")
    (tmp_path / "new").mkdir()
    assert reentry.subdir(tmp_path / "job").startswith(".hydra/reentry-")  # its .hydra/ is not written afresh
    assert reentry.subdir(tmp_path / "new") == ".hydra"


@pytest.mark.slow
def test_a_sweep_job_whose_saved_config_is_gone_is_refused_not_run_over_its_checkpoints(tmp_path):
    args = ("-m", *SMOKE, "trainer.eval_steps=1", "seed=1,2", f"hydra.sweep.dir={tmp_path}")
    first = run_cli(*args, "trainer.train_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(tmp_path / "0" / ".hydra")
    checkpoints = sorted(path.name for path in (tmp_path / "0" / "checkpoints").iterdir())
    again = run_cli(*args, "trainer.train_steps=4")
    assert again.returncode == 2, again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    refused = [line for line in again.stderr.splitlines() if line.startswith("  job 0 ")]
    assert len(refused) == 1, again.stderr[-3000:]
    assert f" in {tmp_path / '0'}: config error: {tmp_path / '0' / '.hydra' / 'config.yaml'} " in refused[0], refused
    assert_names(refused[0], "checkpoints")
    assert sorted(path.name for path in (tmp_path / "0" / "checkpoints").iterdir()) == checkpoints
    assert not (tmp_path / "0" / ".hydra" / "config.yaml").exists()
    assert json.loads((tmp_path / "1" / "metrics.json").read_text())["global_step"] == 4  # the other job resumed


# A sweep folder is written only by the sweep that owns it -----------------------------------------------------------

def multirun_record(sweep_dir, overrides):
    """The multirun.yaml a finished sweep with the command line `overrides` left in `sweep_dir`."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"task": list(overrides)}}}), sweep_dir / "multirun.yaml")


def test_a_second_sweep_into_a_folder_in_use_is_refused_before_any_job_runs(tmp_path, capsys):
    """It ran: its job 0 was refused ("in use by pid ..."), yet its summary named job 0's result, the first's."""
    from tf_harness.experiments.sweeps.sweep_folder import SweepFolder
    first = SweepFolder.claim(tmp_path, ["seed=1,2"])
    with pytest.raises(SystemExit) as refused:
        SweepFolder.claim(tmp_path, ["seed=1,2"])
    assert refused.value.code == 2
    line, = capsys.readouterr().err.splitlines()
    assert line.startswith(f"config error: hydra.sweep.dir={tmp_path} is in use by the sweep of pid ")
    first.release()
    SweepFolder.claim(tmp_path, ["seed=1,2"]).release()  # once the first has ended, the same sweep may run again


@pytest.mark.parametrize("again, refused", [
    (["seed=1,2"], False),
    (["seed=1,2", "trainer.train_steps=8"], False),  # a run-control key: the same sweep, with a larger budget
    (["seed=3,4"], True),
    (["seed=1,2", "trainer.learning_rate=0.1"], True)])
def test_a_sweep_with_other_values_is_refused_as_a_whole_in_a_finished_sweeps_folder(tmp_path, capsys, again,
                                                                                      refused):
    """Refused job by job, it rewrote the finished jobs' job_outcome.json (status 0 became 2) and multirun.yaml."""
    from tf_harness.experiments.sweeps.sweep_folder import SweepFolder
    multirun_record(tmp_path, ["seed=1,2"])
    record = (tmp_path / "multirun.yaml").read_bytes()
    if not refused:
        SweepFolder.claim(tmp_path, again).release()
        return
    with pytest.raises(SystemExit) as stopped:
        SweepFolder.claim(tmp_path, again)
    assert stopped.value.code == 2
    line, = capsys.readouterr().err.splitlines()
    assert line.startswith(f"config error: hydra.sweep.dir={tmp_path} holds another sweep (")
    assert (tmp_path / "multirun.yaml").read_bytes() == record


def test_a_folder_whose_multirun_record_is_unreadable_leaves_each_job_to_its_own_check(tmp_path):
    from tf_harness.experiments.sweeps.sweep_folder import SweepFolder
    tmp_path.joinpath("multirun.yaml").write_bytes(bytes(range(256)))
    SweepFolder.claim(tmp_path, ["seed=3"]).release()


def test_a_sweep_that_made_its_folder_and_ran_no_job_leaves_no_folder(tmp_path):
    from tf_harness.experiments.sweeps.sweep_folder import SweepFolder
    SweepFolder.claim(tmp_path / "sweep", ["seed=1"]).release(ran=False)
    assert not (tmp_path / "sweep").exists()
    SweepFolder.claim(tmp_path, ["seed=1"]).release(ran=False)  # one it did not make stays
    assert tmp_path.is_dir()


@pytest.mark.slow
def test_a_sweep_with_other_values_into_a_finished_sweeps_folder_rewrites_none_of_its_records(tmp_path):
    args = ("-m", *SMOKE, "trainer.train_steps=2", "trainer.eval_steps=1", f"hydra.sweep.dir={tmp_path}")
    first = run_cli(*args, "seed=1,2")
    assert first.returncode == 0, first.stderr[-3000:]
    records = {path: path.read_bytes() for path in [tmp_path / "multirun.yaml", *tmp_path.glob("*/job_outcome.json")]}
    other = run_cli(*args, "seed=3,4", timeout=120)
    assert other.returncode == 2, other.stderr[-3000:]
    assert other.stderr.strip().splitlines()[-1].startswith(f"config error: hydra.sweep.dir={tmp_path} holds another "
                                                             "sweep (seed=1,2 there, 3,4 here)")
    assert {path: path.read_bytes() for path in records} == records


# The best job's interval -----------------------------------------------------------------------------------------

def _job(run_dir, **settings):
    from tf_harness.experiments.sweeps.sweep_report import Job
    return Job(run_dir=run_dir, multirun=True, num=0, overrides=("seed=1",), mode=settings.pop("mode", "train"),
               dataset="lfw_pairs", **settings)


def _write(path, record):
    path.write_text(json.dumps(record))


DRAWN = {"resamples": 200, "unit": "example", "over": "pairs", "seed": 1}


def test_a_jobs_interval_is_the_one_its_evaluation_wrote_beside_the_value_it_reports(tmp_path):
    from tf_harness.experiments.sweeps.sweep_report import interval_of
    job = _job(tmp_path)
    last = {"accuracy": 0.75, "accuracy/ci95": [0.625, 0.875], "loss": 0.5, "auc": 0.8, "auc/ci95": None,
            "global_step": 4, "bootstrap": DRAWN}
    _write(tmp_path / "metrics.json", last)
    assert interval_of(job, tmp_path, "accuracy", 0.75) == ([0.625, 0.875], "95% bootstrap over pairs")
    assert interval_of(job, tmp_path, "accuracy", None) == (None, None)  # no value, nothing to say
    # A value no evaluation record holds, a metric without an interval, one undefined in every resample:
    assert interval_of(job, tmp_path, "accuracy", 0.5)[1] == "no interval: no evaluation record in its run " \
                                                             "directory holds this value"
    assert interval_of(job, tmp_path, "loss", 0.5) == (None, "no interval: loss has none")
    assert interval_of(job, tmp_path, "auc", 0.8) == (None, "no interval: auc is undefined in every resample")
    # mode=evaluate split=test: its record is metrics_test.json, and the line says which split.
    _write(tmp_path / "metrics_test.json", {"accuracy": 0.625, "accuracy/ci95": [0.5, 0.75], "split": "test",
                                            "bootstrap": DRAWN})
    assert interval_of(_job(tmp_path, mode="evaluate"), tmp_path, "accuracy", 0.625) == (
        [0.5, 0.75], "95% bootstrap over pairs of the test split")
    # evaluation.bootstrap=0, and a record written before evaluations computed intervals:
    _write(tmp_path / "metrics.json", {**last, "bootstrap": {**DRAWN, "resamples": 0}})
    assert interval_of(job, tmp_path, "accuracy", 0.75) == (None, "no interval: evaluation.bootstrap=0")
    _write(tmp_path / "metrics.json", {"accuracy": 0.75, "global_step": 4})
    assert interval_of(job, tmp_path, "accuracy", 0.75) == (None, "no interval: its evaluation computed none")
    (tmp_path / "metrics.json").write_text('{"accuracy": 0.75, "glo')  # cut short
    assert interval_of(job, tmp_path, "accuracy", 0.75)[0] is None


def test_with_objective_best_the_interval_is_the_best_evaluations(tmp_path):
    """trainer.objective=best reports best.json's value: its interval is metrics.jsonl's line of that step, not
    metrics.json's (the last evaluation)."""
    from tf_harness.experiments.evaluation import metrics_history
    from tf_harness.experiments.sweeps.sweep_report import interval_of
    for step, auc, bounds in ((2, 0.9, [0.85, 0.95]), (4, 0.8, [0.7, 0.9])):
        metrics_history.append(tmp_path, {"auc": auc, "auc/ci95": bounds, "global_step": step, "bootstrap": DRAWN})
    _write(tmp_path / "metrics.json", {"auc": 0.8, "auc/ci95": [0.7, 0.9], "global_step": 4, "bootstrap": DRAWN})
    _write(tmp_path / "best.json", {"metric": "auc", "mode": "max", "value": 0.9, "global_step": 2})
    job = _job(tmp_path, objective="best", best_metric="auc")
    assert interval_of(job, tmp_path, "auc", 0.9) == ([0.85, 0.95], "95% bootstrap over pairs")


def test_a_job_outcome_carries_its_interval_to_the_summary_line(tmp_path, capsys):
    from tf_harness.experiments.cli import SweepCallback
    from tf_harness.experiments.sweeps.sweep_report import OUTCOME
    report_at_end = started_sweep(tmp_path)
    for job, (accuracy, bounds) in enumerate(((0.75, [0.625, 0.8125]), (0.5, [0.375, 0.625]))):
        run_dir = tmp_path / str(job)
        run_dir.mkdir()
        _write(run_dir / "metrics.json", {"accuracy": accuracy, "accuracy/ci95": bounds, "global_step": 4,
                                          "bootstrap": DRAWN})
        end_job(SweepCallback(), job_config(run_dir, job, (f"seed={job + 1}",)), job_return(accuracy))
    assert json.loads((tmp_path / "0" / OUTCOME).read_text())["ci95"] == [0.625, 0.8125]
    assert report_at_end(capsys) == [f"2 jobs ran, 0 failed; best accuracy 0.7500 [0.6250, 0.8125] (95% bootstrap "
                                     f"over pairs) in job 0 (seed=1): {tmp_path / '0'}"]
    # An outcome whose interval is not two numbers is not a job outcome.
    report_at_end = started_sweep(tmp_path)
    outcome_path = tmp_path / "1" / OUTCOME
    _write(outcome_path, {**json.loads(outcome_path.read_text()), "ci95": ["low", "high"]})
    failed_job(report_at_end(capsys)[1], 1, tmp_path / "1", OUTCOME, "ci95")


@pytest.mark.slow  # a chest sweep of two jobs and a prediction, about 80 s on 2 cores
def test_the_summary_gives_the_best_jobs_interval_over_patients_as_sklearn_computes_it(tmp_path):
    import numpy as np
    import pandas as pd
    from sklearn.metrics import roc_auc_score

    from tests.test_evaluation_intervals import numpy_resamples
    result = run_cli("-m", "dataset=chest_xray", "model=semi_alexnet", "experiment=smoke", "trainer.eval_steps=null",
                     "evaluation.bootstrap=200", "seed=1,2", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    found = SUMMARY.match(last_line(result.stderr))
    assert found, result.stderr[-3000:]
    metric, value, low, high, over, job = found.group(3, 4, 5, 6, 7, 8)
    assert (metric, over) == ("auc/mean", "patients")
    run_dir = tmp_path / job
    # The best job's predictions on the validation split its evaluation scored, from the same checkpoint.
    predicted = run_cli(f"hydra.run.dir={run_dir}", "mode=predict", "split=validation")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    predictions = pd.read_csv(run_dir / "predictions_validation.csv")  # predict's other split (docs/results)
    classes = [column.removeprefix("label/") for column in predictions if column.startswith("label/")]
    labels = predictions[[f"label/{name}" for name in classes]].to_numpy()
    scores = predictions[classes].to_numpy()

    def mean_auc(rows):
        aucs = [roc_auc_score(labels[rows, k], scores[rows, k]) if 0 < labels[rows, k].sum() < len(rows) else np.nan
                for k in range(len(classes))]
        return np.nanmean(aucs)

    assert float(value) == pytest.approx(mean_auc(np.arange(len(predictions))), abs=5e-5)
    drawn = [mean_auc(rows) for rows in numpy_resamples(predictions.patient_id, 200, seed=int(job) + 1)]
    expected = np.percentile(drawn, [2.5, 97.5])
    assert [float(low), float(high)] == pytest.approx(expected, abs=5e-5)
    recorded = json.loads((run_dir / "metrics.json").read_text())
    assert recorded["auc/mean/ci95"] == pytest.approx(expected, abs=1e-6)
