"""How each job ended, for TensorBoard and for the user: under any launcher, the job's session status and exit
status in its HParams record, and at a sweep's end one summary line (with each failed job named before it, and a
nonzero exit status when one failed).

Nothing here reads a config: experiments/cli.py's SweepCallback, the Hydra callback, hands each job's and the
sweep's settings over as plain values (Job, Sweep).

A job's outcome is what run.py's job function returns (experiments/cli.py's Outcome: the headline validation
metric, with the exit status and error line). Launchers such as joblib or submitit run jobs in other processes, so
each job writes its outcome into its own run directory (on_job_end runs in the job's process), and the launching
process reads them all back when the sweep ends (on_multirun_end). Nothing here imports TensorFlow (a job that
reported a metric, or succeeded in a mode that evaluates, has, and only then is its task looked up).

Hydra tells the callbacks neither how many jobs a sweep has nor which, so the sweep's own are the outcomes written
while it ran: those there when it started (a stale folder of an earlier sweep into the same directory) are left
out unless a job of this sweep writes them again. An outcome that cannot be read counts as a failure, and so does
a folder a job ran in during the sweep (it saved its config there) that holds no outcome of its own (its job could
not write it), so neither can turn a failed sweep into a success.

A job's outcome also holds its value's bootstrap interval, read where the job ends from the evaluation record
that holds the value (interval_of: evaluation.bootstrap puts `<metric>/ci95` in every evaluation's record), or why
it has none; the summary line gives the best job's.

A job reports its run's metric even where it did not evaluate in this process (a re-entered run with nothing left
to train, a sidecar that found every checkpoint evaluated): the one its run's last evaluation wrote to metrics.json.
A job without a metric hands a sweeper that optimises (hydra.sweeper.direction, such as Optuna's) the worst value
for its direction rather than NaN, which Optuna's sweeper cannot take: the study goes on and never picks it. A
sweep that a signal or an error stops before its end still prints its report (experiments/cli.py's exit_code),
each job it stopped named as such.
"""
import json
import logging
import math
import os
import sys
from pathlib import Path

from dataclasses import dataclass

import yaml
from hydra.core.utils import JobStatus

from tf_harness.data.integrity import reading
from tf_harness.data.integrity.writing import check_place, replacing
from tf_harness.experiments.config.schema import EVALUATING_MODES
from tf_harness.experiments.evaluation import metrics_history
from tf_harness.experiments.sweeps import hparams
from tf_harness.experiments.sweeps.sweep_folder import SweepFolder

log = logging.getLogger(__name__)
OUTCOME = "job_outcome.json"
# What a job_outcome.json holds: key -> the types its value may have.
FIELDS = {"status": (int,), "error": (str, type(None)), "job": (int,), "overrides": (list,), "run_dir": (str,),
          "metric": (str, type(None)), "value": (int, float, type(None))}
# What a job_outcome.json may hold besides: the value's bootstrap interval and how it was drawn, or why it has none.
OPTIONAL = {"ci95": (list, type(None)), "interval": (str, type(None))}
# The records an evaluation writes (experiments/evaluator.py), where a job's reported value is looked up.
RECORDS = ("metrics.json", "metrics_validation.json", "metrics_test.json")


@dataclass(frozen=True)
class Job:
    """What the report needs of one job, as plain values (experiments/cli.py reads them from its config)."""

    run_dir: Path
    multirun: bool  # a job of a sweep
    num: int | None  # hydra.job.num
    overrides: tuple  # its command line overrides
    mode: str | None
    dataset: str | None  # dataset.name
    objective: str = "last"  # trainer.objective
    best_metric: str | None = None  # trainer.best_metric
    direction: str | None = None  # hydra.sweeper.direction, where the sweeper optimises one


@dataclass(frozen=True)
class Sweep:
    """What the report needs of a sweep, as plain values (experiments/cli.py reads them from its config)."""

    dir: Path  # hydra.sweep.dir, absolute
    overrides: tuple  # its command line overrides
    study: "StoredStudy | None" = None  # the stored Optuna study it adds to
    sweeper: dict | None = None  # sweep_folder.sweeper_of its config


def outcome_of(job_return) -> dict:
    """{'status': exit status, 'error': its line or None, 'value': the headline metric or None, 'ran': False for a
    job refused before it changed anything in its run directory (Outcome.ran)} of one job."""
    if job_return.status == JobStatus.FAILED:  # an exception the job did not handle
        error = job_return._return_value
        return {"status": 1, "error": f"error: {type(error).__name__}: {error}".splitlines()[0], "value": None,
                "ran": True}
    value = job_return.return_value  # tf_harness.experiments.cli.Outcome
    number = float(value) if isinstance(value, (int, float)) else math.nan
    return {"status": getattr(value, "status", 0), "error": getattr(value, "error", None),
            "value": None if math.isnan(number) else number, "ran": getattr(value, "ran", True) is not False}


def headline_of(job: Job, value):
    """The name of the metric the job reported: its headline metric (experiments/evaluation/metrics.py), or with
    trainer.objective=best trainer.best_metric's; None when it reported none. A job that reported one has imported
    TensorFlow and its Task already."""
    return None if value is None else _headline(job)


def _reports_best(job: Job) -> bool:
    """Whether the job reports the best value of trainer.best_metric (trainer.objective=best) in a training mode."""
    return job.objective == "best" and job.mode in ("train_and_evaluate", "train")


def _headline(job: Job):
    from tf_harness.data import TASKS
    from tf_harness.experiments.evaluation import metrics
    if _reports_best(job) and job.best_metric:
        return job.best_metric
    return metrics.headline(TASKS[job.dataset].SPEC.task)


def with_recorded_metric(job: Job, run_dir: Path, outcome) -> dict:
    """`outcome`, its value the headline metric in the run's metrics.json (with trainer.objective=best, the value in
    its best.json) where the job succeeded in a mode that evaluates without returning one: its run's last evaluation
    was done before it (a re-entry with nothing left to train resumes past it, a sidecar finds every checkpoint
    evaluated), so the job reports that evaluation's."""
    if outcome["value"] is not None or outcome["status"] or job.mode not in EVALUATING_MODES:
        return outcome
    best = _reports_best(job)  # best.json, experiments/training/recipes.py: the best evaluation of the run
    values = _read_record(run_dir / ("best.json" if best else "metrics.json"))  # None, or damaged: no metric
    value = (values.get("value") if best else values.get(_headline(job))) if values else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return outcome
    return {**outcome, "value": float(value)}


def interval_of(job: Job, run_dir: Path, metric, value) -> tuple:
    """(`[low, high]`, how it was drawn: `<level> bootstrap over patients`) of the job's reported `value` of `metric`:
    the interval the evaluation that computed the value wrote beside it (experiments/evaluator.py), or
    (None, `no interval: <why>`) where there is none. The evaluation is the record that holds the value: with
    trainer.objective=best, metrics.jsonl's line of best.json's global step; else metrics.json (or a mode=evaluate's
    record beside it)."""
    if value is None:
        return None, None
    record = next((r for r in _evaluation_records(job, run_dir) if r.get(metric) == value), None)
    if record is None:
        return None, "no interval: no evaluation record in its run directory holds this value"
    how = record.get("bootstrap") if isinstance(record.get("bootstrap"), dict) else {}
    if not _number(how.get("resamples")):
        return None, "no interval: its evaluation computed none"
    if not how["resamples"]:
        return None, "no interval: evaluation.bootstrap=0"
    bounds = record.get(f"{metric}/ci95", ...)
    if bounds is ...:
        return None, f"no interval: {metric} has none"
    if not (isinstance(bounds, list) and len(bounds) == 2 and all(_number(b) for b in bounds)):
        return None, f"no interval: {metric} is undefined in every resample"
    over = how.get("over") if isinstance(how.get("over"), str) else "examples"
    split = record.get("split", "validation")
    return [float(b) for b in bounds], f"95% bootstrap over {over}" + (
        "" if split in ("validation", None) else f" of the {split} split")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _evaluation_records(job: Job, run_dir: Path):
    """The evaluation records of the run in `run_dir` that may hold the value its job reported (interval_of)."""
    if _reports_best(job):
        best = _read_record(run_dir / "best.json")
        step = best.get("global_step") if best else None
        yield from reversed([r for r in metrics_history.read(run_dir) if r.get("global_step") == step])
        return
    for name in RECORDS:
        record = _read_record(run_dir / name)
        if record:
            yield record


def _read_record(path: Path):
    """The JSON object in `path`; None where it is missing, unreadable or no object."""
    try:
        record = json.loads(reading.read_text(path))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def for_the_sweeper(job: Job, outcome) -> tuple:
    """What the job returns to the sweeper, as cli.Outcome's arguments (metric, status, error, ran): its metric;
    without one, None (NaN), or the worst value for the sweeper's direction where it optimises one (Optuna's
    sweeper cannot take NaN: the sweep would stop with a traceback)."""
    value, direction = outcome["value"], job.direction
    if value is None and direction in ("maximize", "minimize"):
        value = -math.inf if direction == "maximize" else math.inf
    return value, outcome["status"], outcome["error"], outcome["ran"]


def _chief() -> bool:
    """Whether this process writes the run directory's files (experiments/config/strategies.py's is_chief, read from
    TF_CONFIG): under strategy=multi_worker the other workers share the run directory."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster, task = config.get("cluster") or {}, config.get("task") or {}
    if not cluster or task.get("type") in ("chief", None):
        return True
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0 and "chief" not in cluster


def summary_line(outcomes, sweep_dir) -> str:
    """`N jobs ran, F failed; best <metric> <value> <interval> in job <n> (<overrides>): <run directory>`, the
    interval `[low, high] (<level> bootstrap over <units>)` or `(no interval: <why>)`, one `best` per headline metric
    (a sweep over datasets has several), among the jobs that succeeded; the overrides are those that tell the jobs
    apart. Without a metric: `...; no job reported a validation metric: <sweep directory>`.
    A sweep stopped by a signal counts the jobs it stopped after the failed ones: `F failed, I interrupted`."""
    failed = sum(1 for o in outcomes if o["status"] and not o.get("interrupted"))
    stopped = sum(1 for o in outcomes if o.get("interrupted"))
    head = f"{len(outcomes)} job{'' if len(outcomes) == 1 else 's'} ran, {failed} failed"
    head += f", {stopped} interrupted" if stopped else ""
    best = {}
    for o in outcomes:
        if o["status"] == 0 and o.get("metric") and o.get("value") is not None:
            if o["metric"] not in best or o["value"] > best[o["metric"]]["value"]:
                best[o["metric"]] = o
    if not best:
        return f"{head}; no job reported a validation metric: {sweep_dir}"
    known = [set(o["overrides"]) for o in outcomes if o["overrides"] is not None]
    shared = set.intersection(*known) if len(known) > 1 else set()

    def told_apart(o):
        overrides = [item for item in o["overrides"] if item not in shared]
        return f" ({' '.join(overrides)})" if overrides else ""

    return f"{head}; " + "; ".join(f"best {metric} {o['value']:.4f} {with_interval(o)} in job {o['job']}"
                                   f"{told_apart(o)}: {o['run_dir']}" for metric, o in best.items())


def with_interval(outcome) -> str:
    """`[low, high] (<level> bootstrap over <units>)` of a job's value, or `(no interval: <why>)`."""
    bounds = outcome.get("ci95")
    if bounds:
        return f"[{bounds[0]:.4f}, {bounds[1]:.4f}] ({outcome.get('interval')})"
    return f"({outcome.get('interval') or 'no interval: the job recorded none'})"


def report_lines(outcomes, sweep_dir) -> list:
    """The sweep's report: each failed job, then each job a signal stopped, then the summary line."""
    lines = []
    for what, jobs in (("failed", [o for o in outcomes if o["status"] and not o.get("interrupted")]),
                       ("were interrupted", [o for o in outcomes if o.get("interrupted")])):
        if jobs:
            lines.append(f"{len(jobs)} of {len(outcomes)} jobs {what}:")
            lines += [f"  {job_name(o)} in {o['run_dir']}: {o['error']}" for o in jobs]
    return lines + [summary_line(outcomes, sweep_dir)]


class SweepReport:
    """The report of one process's jobs and sweep; experiments/cli.py's SweepCallback, the Hydra callback, calls it
    with each job's and the sweep's plain values. `sweep_ended` returns the exit status the sweep's jobs call for."""

    def __init__(self):
        self._recorded = {}  # run directory -> whether it held an HParams record when its job started
        self._before = None  # outcome_files of the sweep directory when the sweep started
        self._folder = None  # the SweepFolder this sweep holds

    def job_started(self, job: Job) -> None:
        self._recorded[str(job.run_dir)] = hparams.has_record(job.run_dir)

    def _marks(self, job: Job, outcome) -> bool:
        """Whether the job marks the run's session: where it holds an HParams record, from the chief, unless it was
        refused before it changed anything (its record stays as it was); on re-entry (the record was there before)
        not for a config error (the job did not run) nor for mode=predict or continuous_eval (the row stays as the
        training left it: a prediction has no metric, and a sidecar's exit is not the training's)."""
        if not outcome["ran"] or not hparams.has_record(job.run_dir) or not _chief():
            return False
        if not self._recorded.get(str(job.run_dir), False):
            return True
        return outcome["status"] != 2 and job.mode not in ("predict", "continuous_eval")

    def job_ended(self, job: Job, job_return):
        """Marks the job's session, and in a sweep writes its outcome; returns what the job of a sweep returns to
        the sweeper (for_the_sweeper), None where it raised or is no sweep's."""
        run_dir = Path(job.run_dir)
        outcome = outcome_of(job_return)
        if self._marks(job, outcome):
            try:
                hparams.mark_session(run_dir, outcome["status"])
            except OSError as error:  # a full disk, a read-only run directory: the job's own status stands
                log.warning("could not record the job's status for TensorBoard in %s: %s", run_dir, error)
        if not job.multirun:
            return None
        outcome = with_recorded_metric(job, run_dir, outcome)
        metric = headline_of(job, outcome["value"])
        ci95, interval = interval_of(job, run_dir, metric, outcome["value"])
        record = {"status": outcome["status"], "error": outcome["error"], "job": int(job.num),
                  "overrides": list(job.overrides), "run_dir": str(run_dir), "metric": metric,
                  "value": outcome["value"], "ci95": ci95, "interval": interval}
        try:
            write_outcome(run_dir / OUTCOME, record)
        except OSError as error:  # the sweep's report counts a job folder without an outcome as failed
            log.warning("could not write the job's outcome to %s: %s", run_dir / OUTCOME, error)
        return None if job_return.status == JobStatus.FAILED else for_the_sweeper(job, outcome)

    def sweep_started(self, sweep: Sweep) -> None:
        """Claims the sweep folder (experiments/sweeps/sweep_folder.py: SystemExit(2) where another sweep owns it) and
        notes what it held."""
        self._folder = SweepFolder.claim(sweep.dir, list(sweep.overrides), sweep.sweeper)
        self._before = outcome_files(sweep.dir)

    def sweep_ended(self, sweep: Sweep) -> int:
        """Prints the sweep's report; returns the worst exit status of its jobs."""
        outcomes = self.outcomes(sweep)
        lines = report_lines(outcomes, sweep.dir)
        if sweep.study is not None:
            lines.append(sweep.study.summary())
        print("\n".join(lines), file=sys.stderr)
        if self._folder is not None:
            self._folder.release()
        return max((o["status"] for o in outcomes if o["status"]), default=0)

    def sweep_stopped(self, sweep: Sweep, interrupt) -> None:
        """The sweep stopped before its end: `interrupt`, the line of the signal that stopped it, or None for an
        error (whose own line and exit status stand). Reports the jobs that ran, if any did."""
        outcomes = self.outcomes(sweep, interrupt)
        if outcomes:
            print("\n".join(report_lines(outcomes, sweep.dir)), file=sys.stderr)
        if self._folder is not None:
            self._folder.release(ran=bool(outcomes))

    def outcomes(self, sweep: Sweep, interrupt=None) -> list:
        """The outcomes of the sweep's jobs, in job order. `interrupt`: the line of the signal that stopped the
        sweep ('interrupted by SIGINT'), which stopped each job that ran without writing its outcome."""
        return sorted(sweep_outcomes(sweep.dir, self._before, interrupt),
                      key=lambda o: (o["job"] is None, o["job"] or 0, o["run_dir"]))


def write_outcome(path: Path, record) -> None:
    """Writes `record` to `path` whole or not at all: a full disk or a kill leaves the previous file, or none."""
    with replacing(path) as f:
        f.write(json.dumps(record, indent=1) + "\n")


def outcome_files(sweep_dir: Path) -> dict:
    """{job folder: (what identifies its job_outcome.json, None without one; what identifies its config record)}
    of the folders in `sweep_dir`. A rewrite replaces the outcome (write_outcome), so its inode changes
    even where the clock is coarse; every job that starts in a folder writes its config there (.hydra/, or
    .hydra/reentry-<time>/ on re-entry), which tells a job that ran in an earlier sweep's folder."""
    found = {}
    for folder in (sorted(sweep_dir.iterdir()) if sweep_dir.is_dir() else ()):
        if folder.is_dir() and not folder.name.startswith("."):  # .submitit/ holds the launcher's logs
            try:
                stat = (folder / OUTCOME).stat()
                written = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            except OSError:
                written = None
            found[folder] = (written, _config_record(folder))
    return found


def _config_record(folder: Path):
    """The names and modification times of what the jobs run in `folder` saved of their configs (none: empty);
    None where they cannot be listed."""
    try:
        saved = (folder / ".hydra").rglob("*")
        return sorted((str(path.relative_to(folder)), path.stat().st_mtime_ns) for path in saved)
    except OSError:
        return None


def sweep_outcomes(sweep_dir: Path, before, interrupt=None) -> list:
    """The outcomes of the sweep's jobs: each folder's job_outcome.json written since `before` (outcome_files at the
    sweep's start; None: every one), read or reported unreadable; a folder a job ran in since then without writing
    its own, failed, or, given the line of the signal that stopped the sweep (`interrupt`), interrupted."""
    outcomes, earlier = [], before or {}
    for folder, now in outcome_files(sweep_dir).items():
        written = now[0]
        if earlier.get(folder) == now:
            continue  # an earlier sweep's, or a folder none of this sweep's jobs ran in
        if interrupt and (written is None or written == earlier.get(folder, (None,))[0]):
            outcomes.append(interrupted_outcome(folder, interrupt))
        elif before is not None and written is None:  # a job ran here, but its outcome could not be written
            outcomes.append(unknown_outcome(folder, f"no {OUTCOME}: the job could not write it"))
        elif folder in earlier and written == earlier[folder][0]:  # it ran where an earlier sweep's job had
            outcomes.append(unknown_outcome(folder, _not_written(folder / OUTCOME)))
        elif written is not None:
            outcomes.append(read_outcome(folder / OUTCOME))
    return outcomes


def read_outcome(path: Path) -> dict:
    """The job outcome in `path`, or, when it cannot be read or lacks what a job writes, a failed one saying so."""
    try:
        record = json.loads(reading.read_text(path))
    except OSError as error:  # a folder in its place, no permission
        return unknown_outcome(path.parent, f"{path.name} cannot be read ({error.strerror})")
    except ValueError:  # empty, cut short, garbled, not text
        empty = " (it is empty)" if not path.stat().st_size else ""
        return unknown_outcome(path.parent, f"{path.name} is not JSON{empty}")
    wrong = [key for key, kinds in FIELDS.items()
             if not isinstance(record, dict) or not isinstance(record.get(key, ...), kinds)]
    wrong += [key for key, kinds in OPTIONAL.items()
              if isinstance(record, dict) and key in record and not isinstance(record[key], kinds)]
    if not wrong and not all(isinstance(item, str) for item in record["overrides"]):
        wrong = ["overrides"]
    if not wrong and record.get("ci95") is not None and not (
            len(record["ci95"]) == 2 and all(_number(b) for b in record["ci95"])):
        wrong = ["ci95"]
    if wrong:
        return unknown_outcome(path.parent, f"{path.name} is not a job outcome (no valid {', '.join(wrong)})")
    return record


def _not_written(path: Path) -> str:
    """Why a job left the earlier job's outcome at `path`: what stands there where a write refuses it (a named
    pipe, a folder: data/integrity/writing.py), or that the job could not write its own."""
    try:
        check_place(path)
    except OSError as refused:
        return f"{refused}; move it away"
    return f"the {OUTCOME} there is an earlier job's: this job could not write its own"


def unknown_outcome(folder: Path, why) -> dict:
    """A failed outcome for the job in `folder` whose outcome is unknown: `why`."""
    return {"status": 1, "error": f"error: the job's outcome is unknown: {why}",
            "job": int(folder.name) if folder.name.isdigit() else None, "overrides": saved_overrides(folder),
            "run_dir": str(folder), "metric": None, "value": None}


def interrupted_outcome(folder: Path, interrupt) -> dict:
    """The outcome of the job in `folder` that the signal `interrupt` ('interrupted by SIGINT') stopped: neither a
    success nor a failure."""
    return {**unknown_outcome(folder, interrupt), "error": interrupt, "interrupted": True}


def saved_overrides(folder: Path):
    """The command line overrides the last job run in `folder` saved with its config (.hydra/overrides.yaml, or its
    re-entry's under .hydra/reentry-<time>/), None where there are none or they cannot be read."""
    saved = sorted((folder / ".hydra").glob("reentry-*/overrides.yaml")) or [folder / ".hydra" / "overrides.yaml"]
    try:
        overrides = yaml.safe_load(reading.read_text(saved[-1]))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return overrides if isinstance(overrides, list) and all(isinstance(o, str) for o in overrides) else None


def job_name(outcome) -> str:
    """`job <n> (<overrides>)`, as much of it as is known."""
    name = "job" if outcome["job"] is None else f"job {outcome['job']}"
    return name if outcome["overrides"] is None else f"{name} ({' '.join(outcome['overrides'])})"


class StoredStudy:
    """The Optuna study a sweep adds to (hydra.sweeper.storage), as plain values: its summary line is the sweep
    report's last (experiments/sweeps/study.py), counting every trial of the study, whichever process ran it."""

    def __init__(self, storage: str, name: str, direction: str):
        self.storage, self.name, self.direction = storage, name, direction

    def summary(self) -> str:
        import optuna

        from tf_harness.experiments.sweeps import study
        try:
            return study.summary_line(optuna.load_study(study_name=self.name, storage=study.open_storage(self.storage)),
                                      self.direction)
        except Exception as error:  # noqa: BLE001  the server went away since: said, not a traceback
            return f"study {self.name}: cannot be read back ({' '.join(str(error).split())[:200]})"
