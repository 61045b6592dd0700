"""mode=continuous_eval: a sidecar evaluator beside the process that trains a run directory, as Estimator's
evaluator task was.

`python run.py hydra.run.dir=<run> mode=continuous_eval` (or, under strategy=multi_worker, the process whose
TF_CONFIG task is `evaluator`) evaluates each new checkpoint of the run while another process trains it:

- it takes no run lock (`.lock`, the trainer's) but the evaluator lock, `.eval-lock`: a second evaluator on the
  run directory exits 2 with one line naming the holder (experiments/run_dir/run_lock.py);
- it logs to `<run>/eval.log`, never into the trainer's `run.log`: it lets go of Hydra's handle on run.log first;
- it reads checkpoints from their files (experiments/run_dir/checkpoints.py `on_disk`), every poll (`POLL_SECONDS`), and
  evaluates the newest one after the last it evaluated whose index and data files are all there and read back
  whole with finite tensors (`problem`); older new ones are superseded and passed over. A checkpoint whose files
  are still being written, or that cannot be restored, is looked at again once its files change;
- each evaluation writes the validation summaries (validation/, PR curves or confusion matrix) and metrics.json
  (replaced atomically), and logs its step and headline metric; nothing else in the run directory is written:
  no skipped.csv, no train/ events, no HParams record, no checkpoint;
- it stops, exit 0, with one line saying why: after evaluating the final step (`trainer.train_steps`, the
  saved config's unless its command line names one), when metrics.json already holds that step, once it has
  evaluated the step at which metrics.json says the trainer stopped early (`trainer.early_stopping`), or after
  `trainer.eval_timeout` seconds without a new checkpoint to evaluate (null: never).

It evaluates on one device (the first GPU, or the CPU), whatever strategy the run trains with: an evaluator
task never joins the cluster's MultiWorkerMirroredStrategy. Only a recorded run directory is evaluated from the
command line (its saved config is what the checkpoints hold); the evaluator task of a cluster runs the workers'
own command line and may start before the chief has recorded anything.

`main` is the sidecar's own main, read top to bottom: the run assembled (experiments/assembly.py, as `Sidecar`
says: its lock and log before the run directory), the loop over new checkpoints, close. experiments/runner.py `run` picks it (`wanted`); `Watch` decides which checkpoint
to evaluate and when to stop.
"""
import logging
import time
from pathlib import Path

from tf_harness.data.errors import ConfigError
from tf_harness.data.integrity import writing
from tf_harness.experiments import assembly
from tf_harness.experiments.config import strategies
from tf_harness.experiments.config.schema import SIDECAR_MODE
from tf_harness.experiments.config.settings import Job, Settings
from tf_harness.experiments.run_dir import reentry, run_lock
from tf_harness.experiments.run_dir.directory import RunDirectory, claim

log = logging.getLogger(__name__)
MODE = SIDECAR_MODE
LOG_NAME = "eval.log"
POLL_SECONDS = 1.0  # how often the checkpoint folder is listed while there is nothing new to evaluate


def wanted(settings) -> bool:
    """Whether this job is the sidecar evaluator: mode=continuous_eval, or TF_CONFIG's evaluator task."""
    return settings.mode == MODE or strategies.is_evaluator()


class Sidecar(assembly.Role):
    """The sidecar's role (experiments/assembly.py): one device whatever the run trains with, its own lock and
    eval.log before it claims the run directory for reading, validation/ events and metrics.json alone."""
    beside = True

    def strategy(self, settings: Settings):
        return strategies.one_device()  # TF_CONFIG was checked with the config

    def claim(self, settings: Settings, model_dir: Path) -> RunDirectory:
        start(settings, model_dir)
        return claim(settings, model_dir, evaluator=True)  # reads only: the trainer holds the run lock

    def start_line(self, model_dir: Path) -> str:
        return f"Run directory: {model_dir}; mode={MODE} logs to {LOG_NAME}, run.log is the trainer's"

    def share(self, run_dir: RunDirectory, strategy) -> bool:
        return False  # skipped.csv, train/ and the HParams record are the trainer's

    def reads(self, mode: str) -> str:
        return "evaluate"

    def events(self, mode: str, writes: bool) -> tuple:
        return ("validation",)


def main(settings: Settings, job: Job, actions=()):
    """Evaluates each new checkpoint of the run directory `job.run_dir` on one device, until the final step or
    trainer.eval_timeout; writes validation/, metrics.json and eval.log alone. `actions` are not called: the
    sidecar counts no evaluation for the training run. Returns what experiments/runner.py `run` says."""
    # Assembly: one device, its lock and eval.log, data, model, validation summaries, evaluator -------------------
    run = assembly.assemble(settings, job, Sidecar())

    # Loop: each new checkpoint, restored and evaluated ------------------------------------------------------------
    evaluate_each(settings, run.run_dir.checkpoint_dir, run.trainer, run.evaluator)

    # Close ------------------------------------------------------------------------------------------------------
    return run.close()


def start(settings, model_dir) -> None:
    """Before anything is written: leaves the trainer's run.log, refuses a directory no run has recorded (from the
    command line), takes the evaluator lock (ConfigError naming its holder) and logs to eval.log from then on."""
    model_dir = Path(model_dir)
    if run_lock.held(model_dir, run_lock.EVAL_LOCK_NAME):  # this job started already
        return
    left = run_lock.leave_job_log(model_dir)  # Hydra opened run.log for this job: the trainer's log
    if not strategies.is_evaluator() and reentry.subdir(model_dir) == ".hydra":
        raise ConfigError(f"mode={MODE} evaluates a run that a training process has recorded, and {model_dir} "
                          f"holds none (no saved config with an HParams record or checkpoint); start it once the "
                          f"trainer has written its first checkpoint, with hydra.run.dir=<the trainer's run directory>")
    run_lock.hold_evaluator(model_dir)
    if left:  # where Hydra's job logging writes a file, the sidecar's goes to eval.log, formatted alike
        handler = writing.LogFile(model_dir / LOG_NAME)
        handler.setFormatter(left[0].formatter)
        handler.setLevel(left[0].level)
        logging.getLogger().addHandler(handler)


def evaluate_each(settings, checkpoint_dir, trainer, evaluator) -> None:
    """Restores each new checkpoint in `checkpoint_dir` into `trainer` and evaluates it with `evaluator`, until
    the final step or trainer.eval_timeout (the module's docstring); logs why it stopped."""
    from tf_harness.experiments.evaluation.metrics_history import evaluated_step

    if settings.mode != MODE:
        log.info("TF_CONFIG's task is the evaluator: mode=%s, beside the cluster's workers", MODE)
    watch = Watch(checkpoint_dir, settings.trainer.train_steps, settings.trainer.eval_timeout,
                  evaluated=evaluated_step(Path(checkpoint_dir).parent), stopped=StoppedEarly(checkpoint_dir))
    log.info("%s", watch.run(lambda path, step: _evaluate(trainer, evaluator, path, step)))


SUPERSEDED = "superseded"  # what `_evaluate` gives for a checkpoint the trainer removed before it was read


def _evaluate(trainer, evaluator, path, step):
    """Restores the checkpoint at `path` (global `step`) and evaluates it; None, SUPERSEDED when its files went
    while it was read (the trainer's keep_checkpoints removed it), or why it could not be restored."""
    import tensorflow as tf

    try:
        with _quiet_tensorflow():  # a restore cut short by the trainer's delete is no news: said once, below
            checkpoint = trainer.checkpoint()
            checkpoint.restore(str(path)).expect_partial()
    except (tf.errors.OpError, ValueError) as error:
        if not Path(f"{path}.index").exists():
            return SUPERSEDED
        return f"it could not be restored ({type(error).__name__}: {(str(error).splitlines() or [''])[0]})"
    finally:
        with _quiet_tensorflow():
            checkpoint = None  # a restore that failed part-way warns of its unrestored values as it goes
    if trainer.step != step:
        return f"it holds global step {trainer.step}, not {step}"
    log.info("Restored %s (global step %d)", path, step)
    evaluator.evaluate()
    return None


class _quiet_tensorflow:
    """TensorFlow's Python warnings held back inside the block."""

    def __enter__(self):
        self.logger = logging.getLogger("tensorflow")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        import gc
        gc.collect()
        self.logger.setLevel(self.level)
        return False


class Watch:
    """Which checkpoint to evaluate next, and when to stop (the module's docstring)."""

    def __init__(self, checkpoint_dir, final_step, timeout, evaluated=None, poll=POLL_SECONDS, clock=time.monotonic,
                 sleep=time.sleep, stopped=lambda: None):
        """`final_step`: trainer.train_steps; `timeout`: trainer.eval_timeout (None: none); `evaluated`: the global
        step already evaluated (metrics.json's), None for none; `stopped()`: the global step at which the trainer
        stopped early (trainer.early_stopping), None while it has not."""
        self.checkpoint_dir, self.final_step, self.timeout = Path(checkpoint_dir), final_step, timeout
        self.stopped = stopped
        self.last, self.poll, self.clock, self.sleep = evaluated, poll, clock, sleep
        self._verdicts = {}  # step: (its files' names, sizes and mtimes, why it may not be evaluated, or None)

    def run(self, evaluate) -> str:
        """Evaluates with `evaluate(path, step)` (None, or why it failed) until it stops; returns why it stopped."""
        since = self.clock()
        while True:
            chosen = self._newest()
            if chosen is None and self.last is not None and self.last >= self.final_step:  # so it started
                return (f"The final step {self.last} (trainer.train_steps={self.final_step}) is evaluated already "
                        f"(metrics.json); stopping")
            stop = self.stopped() if chosen is None else None
            if stop is not None and self.last is not None and self.last >= stop:
                return (f"The trainer stopped early at global step {stop} (trainer.early_stopping), which is "
                        f"evaluated; stopping")
            if chosen is not None:
                step, path = chosen
                failed = evaluate(path, step)
                if failed is None:
                    self.last, since = step, self.clock()
                    if step >= self.final_step:
                        return f"Evaluated the final step {step} (trainer.train_steps={self.final_step}); stopping"
                elif failed == SUPERSEDED:
                    log.info("Passing over %s: the trainer removed it (trainer.keep_checkpoints) while it was read",
                             path)
                    self._verdicts[step] = (_files(path), failed)
                else:
                    self._refuse(step, path, failed)
                continue
            waited = self.clock() - since
            if self.timeout is not None and waited >= self.timeout:
                return self._timed_out()
            self.sleep(self.poll if self.timeout is None else min(self.poll, self.timeout - waited))

    def _newest(self):
        """(step, path) of the newest checkpoint after the last evaluated one that may be evaluated; None if none."""
        from tf_harness.experiments.run_dir import checkpoints

        found = checkpoints.on_disk(self.checkpoint_dir)
        newer = [step for step in found if self.last is None or step > self.last]
        for step in reversed(newer):
            if self._verdict(step, found[step]) is None:
                passed = [f"ckpt-{n}" for n in newer if n < step and self._verdicts.get(n, (None, None))[1] is None]
                if passed:
                    log.info("Passing over %s, superseded by ckpt-%d", ", ".join(passed), step)
                return step, found[step]
        return None

    def _verdict(self, step, path):
        """Why the checkpoint may not be evaluated (checkpoints.problem), or None; read again when its files change."""
        from tf_harness.experiments.run_dir import checkpoints

        files = _files(path)
        known = self._verdicts.get(step)
        if known is not None and known[0] == files:
            return known[1]
        missing = checkpoints.missing_files(path)  # files still missing: a save in progress, nothing to say yet
        reason = missing or checkpoints.problem(path)
        if reason is not None and missing is None:
            log.warning("Not evaluating %s: %s; looked at again if its files change", path, reason)
        self._verdicts[step] = (files, reason)
        return reason

    def _refuse(self, step, path, reason):
        log.warning("Not evaluating %s: %s; looked at again if its files change", path, reason)
        self._verdicts[step] = (_files(path), reason)

    def _timed_out(self) -> str:
        last = "none yet" if self.last is None else f"global step {self.last}"
        pending = [f"ckpt-{step}: {reason}" for step, (_, reason) in sorted(self._verdicts.items())
                   if reason not in (None, SUPERSEDED) and (self.last is None or step > self.last)]
        return (f"No new checkpoint to evaluate in {self.checkpoint_dir} for {self.timeout:g} s "
                f"(trainer.eval_timeout); evaluated last: {last} of trainer.train_steps={self.final_step}"
                f"{' (not evaluable: ' + '; '.join(pending) + ')' if pending else ''}; stopping")


class StoppedEarly:
    """Called, the global step at which the run in `checkpoint_dir`'s folder stopped early, as its metrics.json
    records it (`stopped_early`); None while it has not. The file is read again only when it changes."""

    def __init__(self, checkpoint_dir):
        self.path, self.seen, self.step = Path(checkpoint_dir).parent / "metrics.json", None, None

    def __call__(self):
        from tf_harness.experiments.evaluation.metrics_history import evaluated_record

        try:
            stat = self.path.stat()
        except OSError:
            return None
        if (stat.st_mtime_ns, stat.st_size) != self.seen:
            self.seen = stat.st_mtime_ns, stat.st_size
            record = evaluated_record(self.path.parent)
            self.step = record["global_step"] if record and record.get("stopped_early") is True else None
        return self.step


def _files(path) -> tuple:
    """The names, sizes and modification times of the checkpoint files at `path` (a prefix such as .../ckpt-6)."""
    path, files = Path(path), []
    for file in sorted(path.parent.glob(f"{path.name}.*")):
        try:
            stat = file.stat()
        except OSError:  # deleted meanwhile
            continue
        files.append((file.name, stat.st_size, stat.st_mtime_ns))
    return tuple(files)
