"""The end of a sweep: a summary of its failed jobs, and a nonzero exit status, under any launcher.

A job's outcome is what run.py's job function returns (experiments/cli.py's Outcome). Launchers
such as joblib or submitit run jobs in other processes, so each job writes its outcome into its own
run directory (on_job_end runs in the job's process), and the launching process reads them all back
when the sweep ends (on_multirun_end). Nothing here imports TensorFlow.
"""
import json
import sys
from pathlib import Path

from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode

OUTCOME = "job_outcome.json"


def outcome_of(job_return) -> dict:
    """{'status': exit status, 'error': its line or None} of one finished job."""
    if job_return.status == JobStatus.FAILED:  # an exception the job did not handle
        error = job_return._return_value
        return {"status": 1, "error": f"error: {type(error).__name__}: {error}".splitlines()[0]}
    value = job_return.return_value  # tf_harness.experiments.cli.Outcome
    return {"status": getattr(value, "status", 0), "error": getattr(value, "error", None)}


class SweepReport(Callback):
    def on_job_end(self, config, job_return, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        run_dir = Path(config.hydra.runtime.output_dir)
        record = {**outcome_of(job_return), "job": int(config.hydra.job.num),
                  "overrides": list(config.hydra.overrides.task), "run_dir": str(run_dir)}
        (run_dir / OUTCOME).write_text(json.dumps(record, indent=1) + "\n")

    def on_multirun_end(self, config, **kwargs) -> None:
        outcomes = [json.loads(path.read_text()) for path in Path(config.hydra.sweep.dir).glob(f"*/{OUTCOME}")]
        failed = sorted((o for o in outcomes if o["status"]), key=lambda o: o["job"])
        if not failed:
            return
        lines = [f"{len(failed)} of {len(outcomes)} jobs failed:"]
        lines += [f"  job {o['job']} ({' '.join(o['overrides'])}) in {o['run_dir']}: {o['error']}" for o in failed]
        print("\n".join(lines), file=sys.stderr)
        from tf_harness.experiments import cli
        cli.note_status(max(o["status"] for o in failed))
