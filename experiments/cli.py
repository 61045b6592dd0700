"""What the command lines (run.py, the TFRecord converter) share around their Hydra mains: the exit statuses,
0 success, 2 bad config or usage, 130/143 interrupted by SIGINT/SIGTERM, 1 anything else, and one line per failure.

Nothing here imports TensorFlow: a config is checked against experiments/schema.py first, so a bad
one is reported in about a second, before TensorFlow's start-up messages.
"""
import logging
import os
import sys
import time
import uuid
import warnings
from pathlib import Path

# First of the project: its clock times the start-up from here, within milliseconds of the interpreter's start.
from tf_harness.experiments import startup  # isort: skip

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tf_harness.experiments import schema, xla_cache
from tf_harness.experiments.run_dir import interrupts, os_errors, reentry

log = logging.getLogger(__name__)


def setup() -> None:
    """The process's environment, warnings, log levels and config resolvers, set once by an entry point before
    TensorFlow or Hydra starts. Importing this module changes none of them."""
    # Keep TensorFlow's C++ start-up chatter out of the user's terminal. The mark tells experiments/startup.py
    # (here and in a launcher's job processes) that the user left the level unset.
    if "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        os.environ[startup.DEFAULT_LEVEL_MARK] = "1"
    # conf/hydra/launcher/ sets the launcher plugins' values under their own names, so Hydra checks them against
    # the plugins' schemas, as wanted, but warns on every composition that this matching is deprecated.
    warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name")
    # Hydra prints composition errors itself, over several lines, then exits 1. Asking it to raise instead lets
    # this module print one line and exit 2.
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)  # e.g. 'Sharding callback duration' at every checkpoint
    # On a full disk run.log cannot be written either: without this, each log line would print a traceback.
    logging.raiseExceptions = False
    register_resolvers()


def register_resolvers() -> None:
    """The config's own resolvers: `run_id`, a short random id in run directory names that keeps runs started in
    the same second apart, and `run_dir_subdir`, hydra.output_subdir (.hydra for a new run, .hydra/reentry-<time>
    when re-entering a recorded one)."""
    if not OmegaConf.has_resolver("run_id"):
        OmegaConf.register_new_resolver("run_id", lambda: uuid.uuid4().hex[:6], use_cache=True)
    if not OmegaConf.has_resolver("run_dir_subdir"):
        OmegaConf.register_new_resolver("run_dir_subdir", reentry.subdir)


def _one_line(error) -> str:
    parts = [str(error)]
    if error.__cause__ is not None and str(error.__cause__) not in parts[0]:
        parts.append(str(error.__cause__))
    lines = [line.strip() for part in parts for line in part.splitlines() if line.strip()]
    # OmegaConf appends 'full_key: ...' / 'object_type=...' detail lines; the key is already named.
    lines = [line for line in lines if not line.startswith(("full_key:", "object_type=", "reference_type="))]
    if any(line.startswith("Config search path") for line in lines):
        lines = lines[:next(i for i, line in enumerate(lines) if line.startswith("Config search path"))]
    return " ".join(lines)


def _to_run_log(*lines, level=logging.ERROR) -> None:
    """Writes `lines` to the job's log file (Hydra's run.log) alone: the terminal gets its one line from print."""
    for line in lines:
        record = log.makeRecord(log.name, level, __file__, 0, line, (), None)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler):
                handler.handle(record)


def _append_run_log(run_dir, *lines) -> None:
    """Appends `lines` to an existing run.log in `run_dir` as Hydra's job logging writes them, before Hydra starts."""
    path = os.path.join(run_dir, "run.log")
    if not os.path.isfile(path):
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f",{int(time.time() * 1000) % 1000:03d}"
    try:
        with open(path, "a") as f:
            f.writelines(f"[{stamp}][{log.name}][ERROR] - {line}\n" for line in lines)
    except OSError:  # the one line on stderr stands
        pass


def _report(error, prefix, status=None) -> None:
    line = f"{prefix}: {schema.unknown_override(_one_line(error)) or _one_line(error)}"
    print(line, file=sys.stderr)
    _to_run_log(line, *([_closing(status, "stopped by a config error")] if status is not None else []))


_status = 0


class Outcome(float):
    """A job's outcome as `main` returns it: the headline validation metric (what a sweeper
    such as Optuna maximises; NaN when there is none, a failure included), with the job's exit status and
    error line (experiments/sweep_report.py)."""

    def __new__(cls, metric=None, status=0, error=None, ran=True):
        outcome = super().__new__(cls, float("nan") if metric is None else metric)
        # ran: False for a job refused before it changed anything in its run directory, whose record stays as it was.
        outcome.status, outcome.error, outcome.ran = status, error, ran
        return outcome

    def __reduce__(self):  # launchers pickle it back from their job processes
        return Outcome, (float(self), self.status, self.error, self.ran)


def note_status(status) -> None:
    """The process exits with the worst status noted (experiments/sweep_report.py notes a sweep's)."""
    global _status
    _status = max(_status, status)


# What prints the report of the sweep under way (experiments/sweep_report.py), given the interrupt's line or None.
_sweep_report = None


def sweep_running(report) -> None:
    """Notes the report of the sweep that has started (None: it ended), which exit_code prints if a signal or an
    error stops the sweep before its end: Hydra reports only a sweep that reaches it."""
    global _sweep_report
    _sweep_report = report


def _closing(status, outcome) -> str:
    """run.log's last line: how the run ended and its exit status."""
    return f"run {outcome}, exit status {status}"


# The folder that already existed on the path of the command line's hydra.run.dir, read before Hydra made it.
_existing_run_dir = None


def _failed(line, status, ran=True, discard=None) -> Outcome:
    """One job failed: one line on stderr; run.log gets it and its closing line. A config error (or, with
    `discard`, an OS failure) in a run directory this process created, before the run wrote anything of its own
    there, removes it. Returns the job's outcome (`ran`: see Outcome)."""
    interrupts.finished()  # this status is the job's: a signal from here on changes nothing
    print(line, file=sys.stderr)
    _to_run_log(line, _closing(status, "stopped by a config error" if status == 2 else "failed"))
    note_status(status)
    if status == 2 if discard is None else discard:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.RUN:  # a sweep's jobs keep their record
            reentry.discard_failed_start(HydraConfig.get().runtime.output_dir, _existing_run_dir)
    return Outcome(None, status, line, ran)


def _resumable(run_dir) -> bool:
    """Whether `run_dir` holds a checkpoint that the same command resumes from (the advice on a full disk)."""
    return run_dir is not None and any((Path(run_dir) / "checkpoints").glob("ckpt-*.index"))


def guarded(task, cfg, problem) -> Outcome:
    """Checks `cfg` against the schema, then runs one job, turning expected failures into a
    one-line message and an exit status. `cfg` and `problem` are what reentry.resolve_config
    gives: a config error found resolving the config (a re-entry that changes a saved key) is reported first.

    Errors are handled inside the job rather than raised through Hydra, which
    would add its own lines, and so that one failed job of a sweep does not stop
    the others. `task` should import TensorFlow itself, so that it starts only
    once the config has passed, and return the headline validation metric or None. Returns the job's
    Outcome, which Hydra hands to its sweeper and callbacks (experiments/sweep_report.py).
    """
    startup.job_started()
    interrupts.started()  # a signal held since a sweep's previous job ended stops the sweep here
    problem = problem or schema.first_problem(cfg, os.environ)
    if problem:
        return _failed(f"config error: {problem}", 2)
    from tf_harness.experiments.settings import Settings
    settings = Settings.from_config(cfg)  # the one reading of the config: below this, plain values
    if settings.trainer.jit_compile is not False:
        # XLA's compiled programs are kept for the next run of the same shapes; TensorFlow reads where as it starts.
        from tf_harness.data.integrity.cache_folder import cache_home
        xla_cache.enable(cache_home())
    startup.import_tensorflow_quietly()
    # The data package and the trainer import TensorFlow; the config has passed by now.
    from tf_harness.data import caching
    from tf_harness.data.errors import ConfigError, DatasetError
    from tf_harness.data.integrity.resources import OutOfResource
    from tf_harness.experiments.run_dir.blocking import Stalled
    from tf_harness.experiments.run_dir.checkpoints import UnrestorableError
    from tf_harness.experiments.trainer import NonFiniteLossError

    try:
        metric = task(settings)
    except ConfigError as error:
        return _failed(f"config error: {_one_line(error)}", 2)
    except (DatasetError, NonFiniteLossError, UnrestorableError, Stalled, OutOfResource) as error:
        # A re-entry whose checkpoints refuse it before it writes anything (checkpoints.check_before_start).
        return _failed(f"error: {_one_line(error)}", 1, ran=not getattr(error, "before_start", False))
    except Exception as error:
        # A full disk, a read-only folder, a path too long; or a disk cache damaged since it was checked.
        from hydra.core.hydra_config import HydraConfig
        run_dir = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None
        line = (os_errors.describe(error, resumable=_resumable(run_dir))
                or next(filter(None, map(caching.damaged, os_errors.chain(error))), None))
        if line is None:
            raise
        return _failed(f"error: {line}", 1, discard=True)  # a start that wrote nothing of its own leaves no folder
    interrupts.raise_held()  # a signal that landed in a finalizer (tqdm's __del__, say) stops the run here
    interrupts.finished()  # the run has finished: a signal from here on changes nothing (docs/run-directory.md)
    _to_run_log(_closing(0, "finished"), level=logging.INFO)  # an ERROR tag on success would send readers hunting
    return Outcome(metric)


def _interrupted(error: KeyboardInterrupt, line: str) -> int:
    """Reports a run that a signal stopped, on stderr and in run.log; returns its exit status (130 or 143)."""
    interrupts.finished()  # a second Ctrl-C does not cut this short
    status = interrupts.exit_status(error)
    print(line, file=sys.stderr)
    _to_run_log(line, _closing(status, line))
    return status


def exit_code(main) -> int:
    """Runs `main`, which starts Hydra (it reads sys.argv), and returns the documented exit status."""
    global _existing_run_dir
    stopped_by = None  # the interrupt's line, for the report of a sweep it stopped
    interrupts.install()  # from here on, a signal at any instant exits 130/143 (the runner saves first)
    _existing_run_dir = reentry.existing_ancestor(sys.argv[1:])
    try:
        # A run directory that holds a run without a readable saved config: refused before Hydra writes anything.
        damaged = reentry.unreadable_record(sys.argv[1:])
        if damaged:
            print(f"error: {damaged}", file=sys.stderr)
            _append_run_log(reentry.run_dir_argument(sys.argv[1:]), f"error: {damaged}", _closing(1, "failed"))
            return 1
        main()
    except (HydraException, OmegaConfBaseException) as error:
        _report(error, "config error", 2)
        return 2
    except (KeyboardInterrupt, Exception) as error:
        # Ctrl-C or SIGINT/SIGTERM (interrupts.Interrupted), or the ImportError an extension module raises from one
        interrupt = interrupts.behind(error)
        if interrupt is not None:
            stopped_by = f"interrupted{f' by {interrupt}' if str(interrupt) else ''}"
            return _interrupted(interrupt, stopped_by)
        # Hydra's own writes: the run directory, run.log, .hydra/ (whose failed write names no file).
        run_dir, record = reentry.newest_record_folder()
        line = os_errors.describe(error, where=record, resumable=_resumable(run_dir),
                                  run_dir=reentry.run_dir_argument(sys.argv[1:]))
        if line is not None:
            print(f"error: {line}", file=sys.stderr)
            if run_dir is not None and not any(arg in ("-m", "--multirun") for arg in sys.argv[1:]):
                reentry.discard_failed_start(run_dir, _existing_run_dir)  # nothing of the run is there yet
            return 1
        # A bug: Python prints the traceback; run.log still says what happened.
        _to_run_log(f"error: {type(error).__name__}: {_one_line(error)}", _closing(1, "failed (traceback on stderr)"))
        raise
    finally:
        interrupts.exiting()  # from here to the process's exit a signal changes nothing and prints nothing
        if _sweep_report is not None:  # a sweep stopped before its end: the jobs that ran, and those it stopped
            _sweep_report(stopped_by)
    return _status
