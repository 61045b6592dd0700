"""How each job ended, for TensorBoard and for the user: under any launcher, the job's session status and exit
status in its HParams record, and at a sweep's end one summary line (with each failed job named before it, and a
nonzero exit status when one failed).

A job's outcome is what run.py's job function returns (experiments/cli.py's Outcome: the headline validation
metric, with the exit status and error line). Launchers such as joblib or submitit run jobs in other processes, so
each job writes its outcome into its own run directory (on_job_end runs in the job's process), and the launching
process reads them all back when the sweep ends (on_multirun_end). Nothing here imports TensorFlow (a job that
reported a metric has, and only then is its task looked up).
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

from tf_harness.experiments import hparams

log = logging.getLogger(__name__)
OUTCOME = "job_outcome.json"


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
    shared = set.intersection(*(set(o["overrides"]) for o in outcomes)) if len(outcomes) > 1 else set()

    def told_apart(o):
        overrides = [item for item in o["overrides"] if item not in shared]
        return f" ({' '.join(overrides)})" if overrides else ""

    return f"{head}; " + "; ".join(f"best {metric} {o['value']:.4f} in job {o['job']}{told_apart(o)}: {o['run_dir']}"
                                   for metric, o in best.items())


class SweepReport(Callback):
    def __init__(self):
        self._recorded = {}  # run directory -> whether it held an HParams record when its job started

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
        (run_dir / OUTCOME).write_text(json.dumps(record, indent=1) + "\n")

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(os.path.abspath(config.hydra.sweep.dir))
        outcomes = sorted((json.loads(path.read_text()) for path in sweep_dir.glob(f"*/{OUTCOME}")),
                          key=lambda o: o["job"])
        failed = [o for o in outcomes if o["status"]]
        lines = []
        if failed:
            lines.append(f"{len(failed)} of {len(outcomes)} jobs failed:")
            lines += [f"  job {o['job']} ({' '.join(o['overrides'])}) in {o['run_dir']}: {o['error']}" for o in failed]
        lines.append(summary_line(outcomes, sweep_dir))
        print("\n".join(lines), file=sys.stderr)
        if failed:
            from tf_harness.experiments import cli
            cli.note_status(max(o["status"] for o in failed))
