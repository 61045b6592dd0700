"""The best checkpoint and early stopping: what a training run makes of each of its evaluations.

The best evaluation so far is tracked (`tracks`) when `trainer.keep_best`, `trainer.early_stopping.patience` or
`trainer.objective=best` asks for it. Its state, `Progress`, is part of the trainer's checkpoint: the best value of
`trainer.best_metric` and its global step, the evaluations since it without an improvement, and the global step of
the last evaluation counted. An evaluation improves when it beats the best by more than
`trainer.early_stopping.min_delta` in the direction of `trainer.best_mode` (the first finite one always does; an
undefined metric never does).

The checkpoint of global step S holds the state of the evaluations before step S, whenever it was saved: before
the evaluation of step S (the interval save), or after it (on an interrupt, or at an early stop). So an evaluation
is written into the checkpoint's variables only as the next train loop starts (`Trainer.before_loop`), and a run
resumed at step S counts the evaluation of S itself: from metrics.json, which holds what the evaluation computed,
when it was made (`Recipes.resume`), or by the evaluation redone when it was not. A run stopped at any instant then
tracks, keeps and stops exactly as one never stopped, and its checkpoints are the same bit for bit.

- With `trainer.keep_best`, an improving evaluation's checkpoint is written to `<run>/best/ckpt-<step>`, outside
  `checkpoints/`, where `trainer.keep_checkpoints` never deletes, then `<run>/best.json` (the metric, the mode, the
  value, its `global_step` and the checkpoint) is replaced, then the previous best's files go. A kill on the way
  leaves best.json naming a whole checkpoint; what is left of another is removed by the next run.
- With `trainer.early_stopping.patience` P, the run stops after P evaluations in a row without an improvement:
  one log line says why, the step it stopped at is saved (when no checkpoint holds it yet), metrics.json records
  `stopped_early` with the best step and value, and the run exits 0. A resumed run that had stopped stops again
  before training.

`chosen_checkpoint` resolves the run-control key `checkpoint=latest|best|<step>` of mode=evaluate, predict and
export. Nothing here runs in a mode that does not train.
"""
import json
import logging
import math
import re
import shutil

import tensorflow as tf

from tf_harness.data.errors import ConfigError
from tf_harness.data.integrity import reading
from tf_harness.data.integrity.writing import replacing
from tf_harness.experiments.config import schema
from tf_harness.experiments.evaluation import metrics
from tf_harness.experiments.run_dir import checkpoints, interrupts
from tf_harness.experiments.run_dir.directory import no_checkpoint

log = logging.getLogger(__name__)

RECORD = "best.json"  # <run>/best.json
FOLDER = "best"  # <run>/best/ckpt-<step>
_BEST = re.compile(rf"^{checkpoints.PREFIX}-(\d+)(\.|_temp)")


def tracks(trainer_settings) -> bool:
    """Whether a run tracks its best evaluation, and its checkpoint holds `Progress`."""
    return bool(trainer_settings.keep_best or trainer_settings.early_stopping.patience is not None
                or trainer_settings.objective == "best")


class Progress(tf.Module):
    """The best evaluation so far, in the checkpoint (the module's docstring)."""

    def __init__(self):
        super().__init__(name="progress")
        # No best yet: best_step -1 (not a NaN value, which would make the checkpoint unrestorable).
        self.best_value = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="best_value")
        self.best_step = tf.Variable(-1, dtype=tf.int64, trainable=False, name="best_step")
        self.since_best = tf.Variable(0, dtype=tf.int64, trainable=False, name="since_best")
        self.evaluated = tf.Variable(-1, dtype=tf.int64, trainable=False, name="evaluated")


def metric_names(spec) -> tuple:
    """The validation metrics every evaluation of `spec`'s dataset writes: loss and experiments/evaluation/metrics.py's,
    its protocol's included (the config check keeps trainer.eval_steps null for those)."""
    classes = len(spec.class_names)
    labels = [[0] * classes, [1] * classes] if spec.task == "multilabel" else [0, 1]
    written = metrics.evaluate(spec.task, spec.class_names, labels, [[0.0] * classes, [1.0] * classes])
    return ("loss", *written, *metrics.protocol_names(spec.name))


def best_metric(trainer_settings, spec) -> str:
    """trainer.best_metric, null meaning the dataset's headline metric
    (experiments/evaluation/metrics.py `headline`)."""
    return trainer_settings.best_metric or metrics.headline(spec.task)


class Recipes:
    """The best evaluation, the best checkpoint and early stopping of one run (the module's docstring)."""

    def __init__(self, trainer_settings, spec, trainer, run_dir):
        """`trainer_settings`: settings.trainer; `trainer`: its `progress` is the state, None when the run tracks
        nothing; `run_dir`: the RunDirectory."""
        self.trainer, self.run_dir, self.state = trainer, run_dir, trainer.progress
        self.metric = best_metric(trainer_settings, spec)
        self.mode = trainer_settings.best_mode or schema.best_mode(self.metric)  # the config check refused a contradiction
        written = metric_names(spec)
        if self.state is not None and self.metric not in written:  # the config check knows the kind of metric
            raise ConfigError(f"trainer.best_metric={self.metric} is not a metric dataset={spec.name} writes at "
                              f"every evaluation; it writes {'|'.join(written)}")
        self.keep, self.reports = trainer_settings.keep_best, trainer_settings.objective
        self.patience = trainer_settings.early_stopping.patience
        self.min_delta = trainer_settings.early_stopping.min_delta
        self.headline = metrics.headline(spec.task)
        self.training = False  # set by `resume`: only a training run's evaluations are counted
        self.stopped = False
        # The state as the evaluations so far left it; the checkpoint's variables take it before the next loop.
        self.best_value, self.best_step, self.since_best, self.last = math.nan, -1, 0, -1

    # Training ------------------------------------------------------------------------------------------------
    def resume(self, step) -> None:
        """A training run restored at global `step`: counts the evaluation of `step` if it was made (metrics.json)
        after the checkpoint was saved, clears what a killed best-checkpoint save left, and says when the run had
        stopped early."""
        self.training = True
        if self.state is None:
            return
        self.best_step, self.since_best = int(self.state.best_step.numpy()), int(self.state.since_best.numpy())
        self.best_value = float(self.state.best_value.numpy()) if self.best_step >= 0 else math.nan
        self.last = int(self.state.evaluated.numpy())
        if self.run_dir.chief:
            recorded = self._recorded_step()
            if recorded is None and (self.run_dir.model_dir / RECORD).exists():
                # A damaged record names no step: which best checkpoint it kept is unknown, so none is removed.
                model_dir = self.run_dir.model_dir
                log.warning("%s cannot be read: the checkpoints in %s are left as they are, until the next best "
                            "evaluation replaces both", model_dir / RECORD, model_dir / FOLDER)
            else:
                self._clear(keep=recorded)
        if self.last < step and self.run_dir.evaluated(step):
            self.evaluated(_read_json(self.run_dir.model_dir / "metrics.json") or {}, step, caught_up=True)

    def _commit(self) -> None:
        """The checkpoint's variables take the state the evaluations so far left (the module's docstring)."""
        self.state.best_value.assign(0.0 if self.best_step < 0 else self.best_value)
        self.state.best_step.assign(self.best_step)
        self.state.since_best.assign(self.since_best)
        self.state.evaluated.assign(self.last)

    def evaluated(self, values, step, caught_up=False) -> None:
        """Counts the training run's evaluation at `step` (its `values`): keeps its checkpoint when it is the
        best, and decides whether to stop early. Each step is counted once; outside training nothing happens."""
        if not self.training or self.state is None or step <= self.last:
            return
        value, best = values.get(self.metric), self.best_value
        improved = isinstance(value, (int, float)) and math.isfinite(value) and (
            math.isnan(best) or (value - best if self.mode == "max" else best - value) > self.min_delta)
        with interrupts.deferred():  # the state, the best checkpoint and its record, together
            self.last = step
            if improved:
                self.best_value, self.best_step, self.since_best = float(value), step, 0
                self._record(step, float(value), best)
            else:
                self.since_best += 1
            self.trainer.before_loop(self._commit)
            if self._stop_due():
                self.stopped = True
                if caught_up:  # its evaluation was made before the run was stopped, and is counted now
                    log.info("%s; nothing to train", self._stop_line(step, "The run stopped early"))
                else:
                    log.info("%s", self._stop_line(step, "Stopping early"))
                self._note_stop(step)

    def _stop_due(self) -> bool:
        """Whether `patience` evaluations in a row, at least one, did not improve."""
        return self.patience is not None and self.since_best >= max(self.patience, 1)

    def _stop_line(self, step, what) -> str:
        best_text = (f"the best, {self.best_value:.4f}, was at global step {self.best_step}" if self.best_step >= 0
                     else "none was defined")
        return (f"{what} at global step {step}: trainer.best_metric={self.metric} has not improved by more than "
                f"min_delta={self.min_delta:g} in the last {self.since_best} evaluation(s) "
                f"(trainer.early_stopping.patience={self.patience}); {best_text}")

    def _note_stop(self, step) -> None:
        """metrics.json, holding the evaluation at `step`, records that the run stopped there."""
        if not self.run_dir.chief:
            return
        path = self.run_dir.model_dir / "metrics.json"
        values = _read_json(path)
        if not isinstance(values, dict) or values.get("global_step") != step:
            return
        defined = self.best_step >= 0
        values.update(stopped_early=True, best_global_step=self.best_step if defined else None,
                      best_value=self.best_value if defined else None)
        with replacing(path) as f:
            json.dump(values, f, indent=2, sort_keys=True)

    def save_stop(self, manager, save) -> None:
        """Once stopped early: saves the step it stopped at with `save(manager, step)` unless `manager`'s newest
        checkpoint holds it already; either way it holds the state before that step's evaluation, which a resumed
        run counts again (the module's docstring)."""
        step = self.trainer.step
        with interrupts.deferred():  # a signal waits for the save: the stop is whole, or resumed from ckpt-<step>
            if manager.latest_checkpoint != self.run_dir.checkpoint_path(step):
                save(manager, step)

    # The best checkpoint ---------------------------------------------------------------------------------------
    def _record(self, step, value, previous) -> None:
        """A new best at `step`: its checkpoint (trainer.keep_best) and best.json."""
        kept = None
        if self.keep:
            folder = self.run_dir.model_dir / FOLDER if self.run_dir.chief else \
                self.run_dir.save_dir / FOLDER  # every worker writes (the variables are synchronised); one keeps
            self.trainer.checkpoint().write(str(folder / f"{checkpoints.PREFIX}-{step}"))
            if not self.run_dir.chief:
                shutil.rmtree(self.run_dir.save_dir, ignore_errors=True)
                return
            kept = f"{FOLDER}/{checkpoints.PREFIX}-{step}"
        if not self.run_dir.chief:
            return
        record = {"metric": self.metric, "mode": self.mode, "value": value, "global_step": step, "checkpoint": kept}
        with replacing(self.run_dir.model_dir / RECORD) as f:
            json.dump(record, f, indent=2, sort_keys=True)
        self._clear(keep=step)
        was = "none before" if math.isnan(previous) else f"was {previous:.4f}"
        log.info("New best %s %.4f at global step %d (%s)%s", self.metric, value, step, was,
                 f": kept as {self.run_dir.model_dir / kept}" if kept else "")

    def _recorded_step(self):
        record = _read_json(self.run_dir.model_dir / RECORD)
        step = record.get("global_step") if isinstance(record, dict) else None
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    def _clear(self, keep) -> None:
        """Removes the files of every best checkpoint in best/ but the one of global step `keep`."""
        folder = self.run_dir.model_dir / FOLDER
        for path in sorted(folder.iterdir()) if folder.is_dir() else ():
            match = _BEST.match(path.name)
            if match and int(match.group(1)) != keep:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)

    # What a job reports -----------------------------------------------------------------------------------------
    def objective(self, last_values):
        """The job's value for a sweep: the last evaluation's headline metric, or with trainer.objective=best in a
        training run the best value of trainer.best_metric (None when no evaluation defined it)."""
        if self.reports == "best" and self.training and self.state is not None:
            return None if self.best_step < 0 else self.best_value
        return last_values.get(self.headline)


def chosen_checkpoint(choice, run_dir, mode) -> str:
    """The checkpoint prefix that `checkpoint=<choice>` names in `run_dir` (a RunDirectory) for mode=evaluate,
    predict and export: `latest`, the newest restorable one; `best`, the one best.json names; a global step, that
    step's. Raises ConfigError in one line when there is none to restore."""
    if choice == "latest":
        latest = run_dir.latest()
        if latest is None:
            raise no_checkpoint(mode, run_dir.checkpoint_dir)
        return latest
    if choice == "best":
        path = run_dir.model_dir / RECORD
        record = _read_json(path)
        kept = record.get("checkpoint") if isinstance(record, dict) else None
        if not isinstance(kept, str):
            why = "is missing or unreadable" if record is None else "names no checkpoint (trainer.keep_best was off)"
            raise ConfigError(f"checkpoint=best: {path} {why}; train with trainer.keep_best=true, or choose "
                              f"checkpoint=latest or a global step")
        prefix = run_dir.model_dir / kept
    else:
        prefix = run_dir.checkpoint_dir / f"{checkpoints.PREFIX}-{choice}"
    held = ", ".join(str(step) for step in checkpoints.on_disk(run_dir.checkpoint_dir)) or "none"
    if choice not in ("latest", "best") and not any(run_dir.checkpoint_dir.glob(f"{prefix.name}.*")):
        raise ConfigError(f"checkpoint={choice}: {run_dir.checkpoint_dir} holds no checkpoint of global step "
                          f"{choice}; it holds those of global steps {held}")
    reason = checkpoints.problem(prefix)
    if reason:
        raise ConfigError(f"checkpoint={choice}: {prefix} cannot be restored ({reason}); {run_dir.checkpoint_dir} "
                          f"holds the checkpoints of global steps {held}")
    return str(prefix)


def _read_json(path):
    """The JSON in `path`, or None when it is missing or unreadable."""
    try:
        return json.loads(reading.read_text(path))
    except (OSError, ValueError):
        return None
