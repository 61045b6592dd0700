"""What the command lines (run.py, the TFRecord converter) share around their Hydra mains: the exit statuses,
0 success, 2 bad config or usage, 130/143 interrupted by SIGINT/SIGTERM, 1 anything else, and one line per failure.

Nothing here imports TensorFlow: a config is checked against experiments/config/schema.py first, so a bad
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
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tf_harness.data.integrity import writing
from tf_harness.experiments.config import schema
from tf_harness.experiments.run_dir import interrupts, os_errors, reentry
from tf_harness.experiments.sweeps.study import StudyUnreachable
from tf_harness.experiments.training import xla_cache

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
    # The harness's Optuna sweeper (hparams_search=optuna) is a Hydra plugin, which Hydra finds only in the
    # hydra_plugins namespace: experiments/plugins/hydra_plugins/tf_harness_sweeper.py.
    plugins = str(Path(__file__).resolve().parent / "plugins")
    if plugins not in sys.path:
        sys.path.append(plugins)


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
        with writing.appending(path) as f:
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
    error line (experiments/sweeps/sweep_report.py)."""

    def __new__(cls, metric=None, status=0, error=None, ran=True, metrics=None):
        outcome = super().__new__(cls, float("nan") if metric is None else metric)
        # ran: False for a job refused before it changed anything in its run directory, whose record stays as it was.
        outcome.status, outcome.error, outcome.ran = status, error, ran
        outcome.metrics = dict(metrics or {})  # the last evaluation's metrics (experiments/api.py returns them)
        return outcome

    def __reduce__(self):  # launchers pickle it back from their job processes
        return Outcome, (float(self), self.status, self.error, self.ran, self.metrics)


def note_status(status) -> None:
    """The process exits with the worst status noted (SweepCallback notes a sweep's)."""
    global _status
    _status = max(_status, status)


# What prints the report of the sweep under way (experiments/sweeps/sweep_report.py), given the interrupt's line or
# None.
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


def _failed(line, status, job, ran=True, discard=None) -> Outcome:
    """One job failed: one line on stderr; run.log gets it and its closing line. A config error (or, with
    `discard`, an OS failure) in a single run's directory that this process created, before the run wrote anything
    of its own there, removes it (a sweep's jobs keep their record). Returns the job's outcome (`ran`: see
    Outcome)."""
    interrupts.finished()  # this status is the job's: a signal from here on changes nothing
    print(line, file=sys.stderr)
    _to_run_log(line, _closing(status, "stopped by a config error" if status == 2 else "failed"))
    note_status(status)
    if (status == 2 if discard is None else discard) and job.single:
        reentry.discard_failed_start(job.run_dir, _existing_run_dir)
    return Outcome(None, status, line, ran)


def _resumable(run_dir) -> bool:
    """Whether `run_dir` holds a checkpoint that the same command resumes from (the advice on a full disk)."""
    try:
        return run_dir is not None and any((Path(run_dir) / "checkpoints").glob("ckpt-*.index"))
    except OSError:  # out of file handles, say: the line for the failure being reported stands
        return False


def job(task, cfg, actions=()) -> Outcome:
    """The one function below Hydra's command line, which `python run.py`, a sweep's jobs, experiments/api.py's
    `run` and the TFRecord converter share: resolves the config the job runs (a re-entered run directory's saved
    one: experiments/run_dir/reentry.py), reads what Hydra says about the job once (settings.Job), and runs
    `task(settings, job, actions)` `guarded`."""
    from tf_harness.experiments.config.settings import Job

    cfg, problem = reentry.resolve_config(cfg)
    return guarded(task, cfg, problem, Job.from_hydra(), actions)


def single_run(args, task, actions=()) -> Outcome:
    """One run of the overrides `args`, as typed, composed with Hydra's compose API and run as Hydra's command line
    runs a single one (the run directory, its .hydra/ record and run.log, hydra.callbacks), through `job` with `task`
    and `actions`; returns the job's Outcome. The command lines (run.py, the TFRecord converter) and experiments/
    api.py `run` all start a single run here; a sweep (-m) and Hydra's own flags take Hydra's main.

    On re-entry of a recorded run directory, the run's saved dataset=, model= and experiment= choices join `args`
    where they name none (experiments/run_dir/reentry.py `with_saved_choices`): Hydra refuses a key of a group it
    did not compose (LFW's model.merge, say), and an override of one is to be compared with the saved config
    (`job`), not refused by Hydra."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode

    overrides = [*reentry.with_saved_choices(args), f"hydra.mode={RunMode.RUN.name}"]  # a single run's mode
    with initialize_config_module(config_module="tf_harness.conf", version_base="1.3", job_name="run"):
        composed = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        callbacks = _Callbacks(composed)
        callbacks.notify("on_run_start", config=composed, config_name="config")
        returned = run_job(hydra_context=HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                                                      callbacks=callbacks),
                           task_function=lambda job_cfg: job(task, job_cfg, actions), config=composed,
                           job_dir_key="hydra.run.dir", job_subdir_key=None, configure_logging=True)
        callbacks.notify("on_run_end", config=composed, config_name="config", job_return=returned)
        return returned.return_value  # raises what the job raised


class _Callbacks:
    """The composed config's hydra.callbacks, instantiated and called as Hydra's main calls them: in order at a
    start, the last first at an end, and a callback that raises is a warning, not the run's failure."""

    def __init__(self, config):
        from hydra.utils import instantiate

        declared = OmegaConf.select(config, "hydra.callbacks") or {}
        self.callbacks = [instantiate(params) for params in declared.values()]

    def notify(self, hook, **kwargs) -> None:
        for callback in reversed(self.callbacks) if hook.endswith("_end") else self.callbacks:
            try:
                getattr(callback, hook)(**kwargs)
            except Exception as error:  # noqa: BLE001  as Hydra's own Callbacks do
                warnings.warn(f"Callback {type(callback).__name__}.{hook} raised {type(error).__name__}: {error}")

    def on_job_start(self, **kwargs) -> None:  # what run_job calls
        self.notify("on_job_start", **kwargs)

    def on_job_end(self, **kwargs) -> None:
        self.notify("on_job_end", **kwargs)


def hydra_main_needed(args) -> bool:
    """Whether the command line `args` is a sweep (-m) or uses Hydra's own flags (--cfg, --help, ...), which Hydra's
    main runs; a single run's overrides go to `single_run`."""
    return any(arg.startswith("-") for arg in args)


def train_and_evaluate(settings, job, actions=()):
    """A run's task: experiments/runner.py's `run`, which runs the role's main (TensorFlow starts here, once
    `guarded` has passed the config)."""
    from tf_harness.experiments import runner

    return runner.run(settings, job, actions)


def guarded(task, cfg, problem, job, actions=()) -> Outcome:
    """Checks `cfg` against the schema, then runs one job, turning expected failures into a
    one-line message and an exit status. `cfg` and `problem` are what reentry.resolve_config
    gives: a config error found resolving the config (a re-entry that changes a saved key) is reported first;
    `job`: settings.Job, what Hydra says about the job; `actions`: passed on to `task`.

    Errors are handled inside the job rather than raised through Hydra, which
    would add its own lines, and so that one failed job of a sweep does not stop
    the others. `task` should import TensorFlow itself, so that it starts only
    once the config has passed, and return None or (the headline validation metric or None, the final metrics as a
    dict). Returns the job's Outcome, which Hydra hands to its sweeper and callbacks
    (experiments/sweeps/sweep_report.py).
    """
    startup.job_started()
    interrupts.started()  # a signal held since a sweep's previous job ended stops the sweep here
    problem = problem or schema.first_problem(cfg, os.environ)
    if problem:
        return _failed(f"config error: {problem}", 2, job)
    from tf_harness.experiments.config.settings import Settings
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
    from tf_harness.experiments.training.trainer import NonFiniteLossError

    try:
        result = task(settings, job, actions)
    except KeyboardInterrupt as interrupt:
        not_requeued = interrupts.requeue(interrupt)  # SIGUSR2 under submitit: saved; requeued (and exits)
        if not_requeued is None:
            raise
        return _failed(f"error: {not_requeued}", 1, job)
    except ConfigError as error:
        return _failed(f"config error: {_one_line(error)}", 2, job)
    except (DatasetError, NonFiniteLossError, UnrestorableError, Stalled, OutOfResource) as error:
        # A re-entry whose checkpoints refuse it before it writes anything (checkpoints.check_before_start).
        return _failed(f"error: {_one_line(error)}", 1, job, ran=not getattr(error, "before_start", False))
    except Exception as error:
        # A full disk, a read-only folder, a path too long; or a disk cache damaged since it was checked.
        line = (os_errors.describe(error, resumable=_resumable(job.run_dir))
                or next(filter(None, map(caching.damaged, os_errors.chain(error))), None))
        if line is None:
            raise
        return _failed(f"error: {line}", 1, job, discard=True)  # a start that wrote nothing of its own leaves no folder
    interrupts.raise_held()  # a signal that landed in a finalizer (tqdm's __del__, say) stops the run here
    interrupts.finished()  # the run has finished: a signal from here on changes nothing (docs/run-directory.md)
    _to_run_log(_closing(0, "finished"), level=logging.INFO)  # an ERROR tag on success would send readers hunting
    metric, metrics = result if result is not None else (None, {})
    return Outcome(metric, metrics=metrics)


def _interrupted(error: KeyboardInterrupt, line: str) -> int:
    """Reports a run that a signal stopped, on stderr and in run.log; returns its exit status (130 or 143)."""
    interrupts.finished()  # a second Ctrl-C does not cut this short
    status = interrupts.exit_status(error)
    print(line, file=sys.stderr)
    _to_run_log(line, _closing(status, line))
    return status


def before_hydra(args):
    """What the command line and experiments/api.py do with the overrides `args` before Hydra composes them: notes
    the folder that already exists on the run directory's path (a config error's cleanup keeps it), and refuses a
    run directory that holds a run without a readable saved config, before Hydra writes anything. Returns the
    refusal's line (`error: ...`, exit status 1, also appended to the run's run.log) or None."""
    global _existing_run_dir
    _existing_run_dir = reentry.existing_ancestor(args)
    damaged = reentry.unreadable_record(args)
    if not damaged:
        return None
    _append_run_log(reentry.run_dir_argument(args), f"error: {damaged}", _closing(1, "failed"))
    return f"error: {damaged}"


def config_error_line(error) -> str:
    """The one line the command line prints for a config error Hydra or OmegaConf raised (exit status 2)."""
    return f"config error: {_one_line(error)}"


def exit_code(main) -> int:
    """Runs `main`, which runs the command line's overrides (sys.argv), and returns the documented exit status."""
    stopped_by = None  # the interrupt's line, for the report of a sweep it stopped
    interrupts.install()  # from here on, a signal at any instant exits 130/143 (the runner saves first)
    try:
        refused = before_hydra(sys.argv[1:])
        if refused:
            print(refused, file=sys.stderr)
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
        if isinstance(error, StudyUnreachable):  # the jobs' folders keep their results; a re-run tells the study
            print(f"error: {error}", file=sys.stderr)
            return 1
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


class SweepCallback(Callback):
    """The Hydra callback of every run and sweep (conf/hydra/default.yaml): reads what the sweep report
    (experiments/sweeps/sweep_report.py) needs of each job's and the sweep's config, hands it over as plain values, and
    notes the sweep's exit status."""

    def __init__(self):
        from tf_harness.experiments.sweeps.sweep_report import SweepReport
        self.report = SweepReport()

    def on_job_start(self, config, **kwargs) -> None:
        self.report.job_started(_job_of(config))

    def on_job_end(self, config, job_return, **kwargs) -> None:
        returned = self.report.job_ended(_job_of(config), job_return)
        if returned is not None:  # what the sweeper gets of the job (a sweeper such as Optuna's takes no NaN)
            job_return.return_value = Outcome(*returned)

    def on_multirun_start(self, config, **kwargs) -> None:
        sweep = _sweep_of(config)
        self.report.sweep_started(sweep)
        # Hydra calls on_multirun_end only for a sweep that reaches its end; exit_code reports one stopped before.
        sweep_running(lambda interrupt: self._stopped(sweep, interrupt))

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_running(None)
        note_status(self.report.sweep_ended(_sweep_of(config)))

    def _stopped(self, sweep, interrupt) -> None:
        sweep_running(None)
        self.report.sweep_stopped(sweep, interrupt)


def _job_of(config):
    """The sweep report's Job of a job's config."""
    from hydra.types import RunMode

    from tf_harness.experiments.sweeps.sweep_report import Job
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    return Job(run_dir=Path(config.hydra.runtime.output_dir), multirun=config.hydra.mode == RunMode.MULTIRUN,
               num=OmegaConf.select(config, "hydra.job.num", default=None),
               overrides=tuple(OmegaConf.select(config, "hydra.overrides.task", default=None) or ()),
               mode=config.get("mode"), dataset=OmegaConf.select(config, "dataset.name", default=None),
               objective=OmegaConf.select(config, "trainer.objective", default="last"),
               best_metric=OmegaConf.select(config, "trainer.best_metric", default=None),
               direction=getattr(direction, "name", direction))  # a plugin's Direction enum, or its name


def _sweep_of(config):
    """The sweep report's Sweep of a sweep's config: with the stored study of the harness's Optuna sweeper
    (hparams_search=optuna) where it has a storage."""
    from tf_harness.experiments.sweeps.sweep_report import StoredStudy, Sweep
    storage = OmegaConf.select(config, "hydra.sweeper.storage", default=None)
    study = None
    if str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith(".StudySweeper") \
            and isinstance(storage, str) and storage:
        direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
        study = StoredStudy(storage, str(OmegaConf.select(config, "hydra.sweeper.study_name")),
                            str(getattr(direction, "name", direction)))
    from tf_harness.experiments.sweeps.sweep_folder import sweeper_of
    sweeper = OmegaConf.select(config, "hydra.sweeper", default=None)
    return Sweep(dir=Path(os.path.abspath(config.hydra.sweep.dir)),
                 overrides=tuple(OmegaConf.select(config, "hydra.overrides.task", default=None) or ()), study=study,
                 sweeper=None if sweeper is None else sweeper_of(OmegaConf.to_container(sweeper, resolve=False)))
