"""How each job ended, for TensorBoard and for the user: under any launcher, the job's session status and exit
status in its HParams record, and at a sweep's end one summary line (with each failed job named before it, and a
nonzero exit status when one failed).

A job's outcome is what run.py's job function returns (experiments/cli.py's Outcome: the headline validation
metric, with the exit status and error line). Launchers such as joblib or submitit run jobs in other processes, so
each job writes its outcome into its own run directory (on_job_end runs in the job's process), and the launching
process reads them all back when the sweep ends (on_multirun_end). Nothing here imports TensorFlow (a job that
reported a metric has, and only then is its task looked up).

Hydra tells the callbacks neither how many jobs a sweep has nor which, so the sweep's own are the outcomes written
while it ran: those there when it started (a stale folder of an earlier sweep into the same directory) are left
out unless a job of this sweep writes them again. An outcome that cannot be read counts as a failure, and so does
a folder a job ran in during the sweep (it saved its config there) that holds no outcome of its own (its job could
not write it), so neither can turn a failed sweep into a success.
"""
import json
import logging
import math
import os
import sys
from pathlib import Path

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from tf_harness.data.integrity.atomic_file import replacing
from tf_harness.experiments import hparams

log = logging.getLogger(__name__)
OUTCOME = "job_outcome.json"
# What a job_outcome.json holds: key -> the types its value may have.
FIELDS = {"status": (int,), "error": (str, type(None)), "job": (int,), "overrides": (list,), "run_dir": (str,),
          "metric": (str, type(None)), "value": (int, float, type(None))}


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


def headline_of(config, value):
    """The name of the job's headline metric (experiments/metrics.py), None when it reported none. A job that
    reported one has imported TensorFlow and its Task already."""
    if value is None:
        return None
    from tf_harness.data import TASKS
    from tf_harness.experiments import metrics
    return metrics.headline(TASKS[config.dataset.name].SPEC.task)


def _chief() -> bool:
    """Whether this process writes the run directory's files (experiments/strategies.py's is_chief, read from
    TF_CONFIG): under strategy=multi_worker the other workers share the run directory."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster, task = config.get("cluster") or {}, config.get("task") or {}
    if not cluster or task.get("type") in ("chief", None):
        return True
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0 and "chief" not in cluster


def summary_line(outcomes, sweep_dir) -> str:
    """`N jobs ran, F failed; best <metric> <value> in job <n> (<overrides>): <run directory>`, one `best` per
    headline metric (a sweep over datasets has several), among the jobs that succeeded; the overrides are those
    that tell the jobs apart. Without a metric: `...; no job reported a validation metric: <sweep directory>`."""
    failed = sum(1 for o in outcomes if o["status"])
    head = f"{len(outcomes)} job{'' if len(outcomes) == 1 else 's'} ran, {failed} failed"
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

    return f"{head}; " + "; ".join(f"best {metric} {o['value']:.4f} in job {o['job']}{told_apart(o)}: {o['run_dir']}"
                                   for metric, o in best.items())


class SweepReport(Callback):
    def __init__(self):
        self._recorded = {}  # run directory -> whether it held an HParams record when its job started
        self._before = None  # outcome_files of the sweep directory when the sweep started

    def on_job_start(self, config, **kwargs) -> None:
        run_dir = str(config.hydra.runtime.output_dir)
        self._recorded[run_dir] = hparams.has_record(run_dir)

    def _marks(self, config, run_dir, outcome) -> bool:
        """Whether the job marks the run's session: where it holds an HParams record, from the chief, unless it was
        refused before it changed anything (its record stays as it was); on re-entry (the record was there before)
        not for a config error (the job did not run) nor for mode=predict or continuous_eval (the row stays as the
        training left it: a prediction has no metric, and a sidecar's exit is not the training's)."""
        if not outcome["ran"] or not hparams.has_record(run_dir) or not _chief():
            return False
        if not self._recorded.get(str(run_dir), False):
            return True
        return outcome["status"] != 2 and config.get("mode") not in ("predict", "continuous_eval")

    def on_job_end(self, config, job_return, **kwargs) -> None:
        run_dir = Path(config.hydra.runtime.output_dir)
        outcome = outcome_of(job_return)
        if self._marks(config, run_dir, outcome):
            try:
                hparams.mark_session(run_dir, outcome["status"])
            except OSError as error:  # a full disk, a read-only run directory: the job's own status stands
                log.warning("could not record the job's status for TensorBoard in %s: %s", run_dir, error)
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        record = {"status": outcome["status"], "error": outcome["error"], "job": int(config.hydra.job.num),
                  "overrides": list(config.hydra.overrides.task), "run_dir": str(run_dir),
                  "metric": headline_of(config, outcome["value"]), "value": outcome["value"]}
        try:
            write_outcome(run_dir / OUTCOME, record)
        except OSError as error:  # the sweep's report counts a job folder without an outcome as failed
            log.warning("could not write the job's outcome to %s: %s", run_dir / OUTCOME, error)

    def on_multirun_start(self, config, **kwargs) -> None:
        self._before = outcome_files(Path(os.path.abspath(config.hydra.sweep.dir)))

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(os.path.abspath(config.hydra.sweep.dir))
        outcomes = sorted(sweep_outcomes(sweep_dir, self._before),
                          key=lambda o: (o["job"] is None, o["job"] or 0, o["run_dir"]))
        failed = [o for o in outcomes if o["status"]]
        lines = []
        if failed:
            lines.append(f"{len(failed)} of {len(outcomes)} jobs failed:")
            lines += [f"  {job_name(o)} in {o['run_dir']}: {o['error']}" for o in failed]
        lines.append(summary_line(outcomes, sweep_dir))
        print("\n".join(lines), file=sys.stderr)
        if failed:
            from tf_harness.experiments import cli
            cli.note_status(max(o["status"] for o in failed))


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


def sweep_outcomes(sweep_dir: Path, before) -> list:
    """The outcomes of the sweep's jobs: each folder's job_outcome.json written since `before` (outcome_files at the
    sweep's start; None: every one), read or reported unreadable; a folder a job ran in since then without writing
    its own, failed."""
    outcomes, earlier = [], before or {}
    for folder, now in outcome_files(sweep_dir).items():
        written = now[0]
        if earlier.get(folder) == now:
            continue  # an earlier sweep's, or a folder none of this sweep's jobs ran in
        if before is not None and written is None:  # a job ran here, but its outcome could not be written
            outcomes.append(unknown_outcome(folder, f"no {OUTCOME}: the job could not write it"))
        elif folder in earlier and written == earlier[folder][0]:  # it ran where an earlier sweep's job had
            outcomes.append(unknown_outcome(folder, f"the {OUTCOME} there is an earlier job's: this job could not "
                                                    "write its own"))
        elif written is not None:
            outcomes.append(read_outcome(folder / OUTCOME))
    return outcomes


def read_outcome(path: Path) -> dict:
    """The job outcome in `path`, or, when it cannot be read or lacks what a job writes, a failed one saying so."""
    try:
        record = json.loads(path.read_text())
    except OSError as error:  # a folder in its place, no permission
        return unknown_outcome(path.parent, f"{path.name} cannot be read ({error.strerror})")
    except ValueError:  # empty, cut short, garbled, not text
        empty = " (it is empty)" if not path.stat().st_size else ""
        return unknown_outcome(path.parent, f"{path.name} is not JSON{empty}")
    wrong = [key for key, kinds in FIELDS.items()
             if not isinstance(record, dict) or not isinstance(record.get(key, ...), kinds)]
    if not wrong and not all(isinstance(item, str) for item in record["overrides"]):
        wrong = ["overrides"]
    if wrong:
        return unknown_outcome(path.parent, f"{path.name} is not a job outcome (no valid {', '.join(wrong)})")
    return record


def unknown_outcome(folder: Path, why) -> dict:
    """A failed outcome for the job in `folder` whose outcome is unknown: `why`."""
    return {"status": 1, "error": f"error: the job's outcome is unknown: {why}",
            "job": int(folder.name) if folder.name.isdigit() else None, "overrides": None, "run_dir": str(folder),
            "metric": None, "value": None}


def job_name(outcome) -> str:
    """`job <n> (<overrides>)`, as much of it as is known."""
    name = "job" if outcome["job"] is None else f"job {outcome['job']}"
    return name if outcome["overrides"] is None else f"{name} ({' '.join(outcome['overrides'])})"
