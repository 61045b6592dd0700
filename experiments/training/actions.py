"""The training loop's extras, as actions the controller calls (Orbit's `train_actions` and `eval_actions`).

An action is a small object that overrides the hooks it needs; the controller (experiments/runner.py) calls every
action's hook, in the list's order, at these points of a training run:

- `start(step)`: training starts (or resumes) at global `step`;
- `loop_length(step, length)`: before a train loop; returns its length, at most `length`;
- `after_loop(step, loop)`: after each train loop (`loop`: its trainer.LoopStats), in the loop's unit: a signal
  waits until every action has run, so a loop is never trained without its summary or saved half-logged;
- `between_loops(step)`: after that unit, where a signal may stop the run;
- `after_evaluation(step, values)`: after each evaluation, with its metrics;
- `finish(step, stopped)`: training reached its end, or with `stopped` an action's `stop` ended it;
- `interrupted(step)`: a signal stopped training between loops, at global `step` > 0 (`saving_on_interrupt`);
- `close()`: always, however the run ends.

An action whose `stop` is true ends training after the current loop (early stopping). `standard` lists what every
training run does; `runner.run(..., actions=[...])` appends actions of one's own, with no change to the controller.
"""
import contextlib
import logging

from tqdm import tqdm

from tf_harness.experiments.evaluation import metrics, review

from tf_harness.experiments.run_dir import blocking
from tf_harness.experiments.training import xla_cache
from tf_harness.experiments.training.trainer import LoopStats, NonFiniteLossError

log = logging.getLogger(__name__)


class Action:
    """The hooks, each a no-op here (the module's docstring)."""

    stop = False

    def start(self, step) -> None:
        pass

    def loop_length(self, step, length) -> int:
        return length

    def after_loop(self, step, loop) -> None:
        pass

    def between_loops(self, step) -> None:
        pass

    def after_evaluation(self, step, values) -> None:
        pass

    def finish(self, step, stopped) -> None:
        pass

    def interrupted(self, step) -> None:
        pass

    def close(self) -> None:
        pass


def due(step, every, target) -> bool:
    """Whether `step` falls on an `every` interval or is the last step, `target`."""
    return step % every == 0 or step == target


class Profile(Action):
    """trainer.profile_steps: a profiler trace of those global steps, one step per loop inside them."""

    def __init__(self, steps, logdir):
        self.profiler, self.marker = review.Profiler(steps, logdir), contextlib.ExitStack()

    def loop_length(self, step, length):
        self.profiler.update(step)
        self.marker.enter_context(self.profiler.step(step))  # the loop's step marker in the trace
        return self.profiler.loop_length(step, length)

    def after_loop(self, step, loop):
        self.marker.close()

    def close(self):
        self.marker.close()
        self.profiler.close()


class StartupLine(Action):
    """The start-up clock's line after the first loop; the train step's compiled program published for the next
    run (experiments/training/xla_cache.py)."""

    def __init__(self, clock):
        self.clock = clock

    def after_loop(self, step, loop):
        if not self.clock.logged:
            self.clock.first_step(loop.steps)
            xla_cache.publish()


class CheckFinite(Action):
    """Warns of skipped non-finite steps; stops the run once trainer.max_nonfinite_steps came in a row."""

    def __init__(self, trainer, run_dir):
        self.trainer, self.run_dir = trainer, run_dir

    def after_loop(self, step, loop):
        if loop.nonfinite:
            log.warning("Skipped %d training step(s) with a non-finite loss or gradient norm, up to global step %d",
                        loop.nonfinite, step)
        in_a_row = loop.nonfinite_in_a_row
        if in_a_row >= self.trainer.max_nonfinite_steps:
            what = (f"{in_a_row} training steps in a row had a non-finite loss or gradient norm, the last at global "
                    f"step {step}; none was applied" if in_a_row > 1 else
                    f"training step {step} had a non-finite loss or gradient norm and was not applied")
            raise NonFiniteLossError(f"{what}; stopping ({self.run_dir.last_checkpoint_text()})")


class ProgressBar(Action):
    """The terminal's progress bar, with the last loop's loss and pace."""

    def __init__(self, trainer, start, target):
        self.trainer = trainer
        self.bar = tqdm(total=target, initial=start, desc="train", unit="step", dynamic_ncols=True)

    def after_loop(self, step, loop):
        self.bar.update(loop.steps)
        self.bar.set_postfix(loss=f"{loop.loss:.4f}",
                             examples_per_sec=f"{self.trainer.examples_per_step * loop.steps / loop.seconds:.0f}")

    def close(self):
        self.bar.close()


class Log(Action):
    """The train scalars and log line every trainer.log_every steps and at the last, over the loops since the last
    (`flush` writes them at any step: an interrupt's): the loss and every scalar the step measured, averaged over
    the window's applied steps, then the pace. `logged(step, means)` gets the measured ones."""

    def __init__(self, trainer, trainer_settings, summaries, note_unreadable, logged):
        self.trainer, self.trainer_settings, self.summaries = trainer, trainer_settings, summaries
        self.note_unreadable, self.logged, self.window = note_unreadable, logged, []

    def after_loop(self, step, loop):
        self.window.append(loop)
        if due(step, self.trainer_settings.log_every, self.trainer_settings.train_steps):
            self.flush(step)

    def interrupted(self, step):
        self.flush(step)

    def flush(self, step):
        if not self.window:
            return
        loops = LoopStats.merge(self.window)
        self.window.clear()
        means = {"loss": loops.loss, **loops.means}  # the loss, then what `Trainer.train_step` measured
        values = {**means,
                  "learning_rate": self.trainer.learning_rate,
                  "examples_per_sec": self.trainer.examples_per_step * loops.steps / loops.seconds,
                  # The share of train time spent waiting for batches (experiments/training/trainer.py defines it per
                  # loop).
                  "input_wait_fraction": loops.input_wait_fraction,
                  "nonfinite_steps": loops.nonfinite}
        self.summaries.scalars("train", values, step)
        self.note_unreadable()
        # The window's pace (the first one includes the trace) over the steps still to go.
        target = self.trainer_settings.train_steps
        measured = "".join(f", {name} {value:.4f}" for name, value in means.items())
        log.info("step %d/%d: %s, %.1f examples/s, input_wait_fraction %.3f, ETA %s", step, target, measured[2:],
                 values["examples_per_sec"], values["input_wait_fraction"],
                 _duration(loops.seconds / loops.steps * max(target - step, 0)))
        self.logged(step, means)


class Save(Action):
    """A checkpoint every trainer.checkpoint_every steps and at the last, once the weights are checked finite
    (`save` saves at any step: an interrupt's or an early stop's)."""

    def __init__(self, trainer, trainer_settings, run_dir, manager):
        self.trainer, self.trainer_settings, self.run_dir, self.manager = trainer, trainer_settings, run_dir, manager

    def after_loop(self, step, loop):
        if due(step, self.trainer_settings.checkpoint_every, self.trainer_settings.train_steps):
            self.save(self.manager, step)

    def interrupted(self, step):
        if self.manager.latest_checkpoint != self.run_dir.checkpoint_path(step):
            self.save(self.manager, step)

    def save(self, manager, step):
        # Skipped updates keep the weights finite; this guards the checkpoint against anything else.
        if not self.trainer.all_finite():
            raise NonFiniteLossError(f"the model or optimizer holds non-finite values at global step {step}; not "
                                     f"saving ({self.run_dir.last_checkpoint_text()})")
        self.run_dir.save(manager, step)


class Evaluate(Action):
    """train_and_evaluate's evaluations: one every trainer.eval_every steps and one at the end; at the start, the
    evaluation an interrupt cut short, redone. `evaluate()` evaluates and calls the actions' `after_evaluation`."""

    def __init__(self, evaluate, trainer_settings, run_dir, start):
        self.evaluate, self.every, self.target = evaluate, trainer_settings.eval_every, trainer_settings.train_steps
        self.run_dir, self.first = run_dir, start

    def start(self, step):
        if 0 < step < self.target and step % self.every == 0 and not self.run_dir.evaluated(step):
            log.info("Redoing the evaluation at global step %d, which was interrupted", step)
            self.evaluate()

    def between_loops(self, step):
        if step % self.every == 0 and step < self.target:
            self.evaluate()

    def finish(self, step, stopped):
        # Not after an early stop, whose step was evaluated; nor when an interrupt came after the last evaluation.
        if not stopped and (step > self.first or not self.run_dir.evaluated(step)):
            self.evaluate()


class BestCheckpoint(Action):
    """trainer.keep_best and best.json: each evaluation counted for the best so far
    (experiments/training/recipes.py)."""

    def __init__(self, recipes):
        self.recipes = recipes

    def after_evaluation(self, step, values):
        self.recipes.evaluated(values, step)


class EarlyStopping(Action):
    """trainer.early_stopping: stops training once the best has not improved for `patience` evaluations, and saves
    the step it stopped at (experiments/training/recipes.py counts the evaluations)."""

    def __init__(self, recipes, save):
        self.recipes, self.save = recipes, save

    @property
    def stop(self):
        return self.recipes.stopped

    def finish(self, step, stopped):
        if self.recipes.stopped:
            self.recipes.save_stop(self.save.manager, self.save.save)


class Prune(Action):
    """sweep.pruner: each evaluation reported to the job's trial of a stored Optuna study; stops training where the
    pruner says the trial loses, and saves the step it stopped at (experiments/sweeps/pruning.py)."""

    def __init__(self, pruning, recipes, save):
        self.pruning, self.recipes, self.save = pruning, recipes, save

    @property
    def stop(self):
        return self.pruning.stopped

    def after_evaluation(self, step, values):
        self.pruning.evaluated(values, step)

    def finish(self, step, stopped):
        if self.pruning.stopped:
            self.recipes.save_stop(self.save.manager, self.save.save)


def standard(controller, manager, evaluate, start) -> list:
    """The actions of a training run of `controller` (experiments/runner.py), saving through `manager`, evaluating
    when `evaluate`, from global step `start`, in the order they run."""
    run = controller.run
    settings, trainer = run.settings.trainer, run.trainer
    save = Save(trainer, settings, run.run_dir, manager)
    actions = [Profile(settings.profile_steps if run.writes else None, run.model_dir / "train"),
               StartupLine(run.clock), CheckFinite(trainer, run.run_dir),
               ProgressBar(trainer, start, settings.train_steps),
               Log(trainer, settings, run.summaries, run.note_unreadable, run.evaluator.logged), save]
    if evaluate:
        actions.append(Evaluate(controller.evaluate, settings, run.run_dir, start))
    return actions + [BestCheckpoint(run.recipes), EarlyStopping(run.recipes, save),
                      Prune(controller.pruning, run.recipes, save)]


@contextlib.contextmanager
def saving_on_interrupt(trainer, run_dir, actions):
    """The guard around the training loop that saves on a signal: Ctrl-C or SIGTERM stops the run between loops
    (experiments/run_dir/interrupts.py), and every batch a loop took was trained on, so the global step, the
    weights and the iterator position agree when `actions` write the window's scalars and save the step
    (`interrupted`). A loop abandoned while it waited for input may have trained part of its steps, so nothing is
    saved then."""
    try:
        yield
    except blocking.Abandoned as interrupt:
        log.warning("Interrupted while waiting for %s; exiting without saving (%s)", interrupt.what,
                    run_dir.last_checkpoint_text())
        raise
    except KeyboardInterrupt:
        step = trainer.step
        if step > 0:
            for action in actions:
                action.interrupted(step)
            log.warning("Interrupted at global step %d; saved a checkpoint to resume from", step)
        raise


def _duration(seconds) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"
