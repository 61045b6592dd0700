"""The runner: `run` picks the job's role, and each role has its own main, read top to bottom.

- `train` (here): mode=train_and_evaluate and train: the run assembled, restore (the resume point), the loop
  with its actions, close;
- experiments/checkpoint_modes.py `main`: mode=evaluate, predict and export, which read a recorded checkpoint;
- experiments/sidecar.py `main`: the sidecar evaluator (mode=continuous_eval, or TF_CONFIG's evaluator task).

Every main gets its run from experiments/assembly.py `assemble`, told how by its role (`Training` here), and
durability enters as named calls into experiments/run_dir/. The training loop is the `Controller`'s.
"""
import contextlib
import logging
import re
from pathlib import Path

import tensorflow as tf
from tqdm.contrib.logging import logging_redirect_tqdm

from tf_harness.data import service
from tf_harness.data.input_fn import input_fn
from tf_harness.data.integrity import unreadable
from tf_harness.data.iterators import make_iterator
from tf_harness.experiments import assembly, checkpoint_modes, sidecar
from tf_harness.experiments.config import strategies
from tf_harness.experiments.config.settings import Job, Settings
from tf_harness.experiments.evaluation import review
from tf_harness.experiments.run_dir import blocking, interrupts
from tf_harness.experiments.run_dir.directory import RunDirectory
from tf_harness.experiments.sweeps import pruning, study
from tf_harness.experiments.training import actions, warm_start
from tf_harness.experiments.training.trainer import loop_length

log = logging.getLogger(__name__)


def run(settings: Settings, job: Job, actions=()):
    """Runs one job with `settings`, the config read once the schema passed it (experiments/cli.py `guarded`), in
    its role's main. `job.run_dir`, the run directory, is the model_dir; `actions` (experiments/training/actions.py) are
    called after the mode's own. Returns (the job's objective, the last evaluation's metrics with the global step;
    empty but for it when the mode does not evaluate). The objective is the last evaluation's headline metric
    (None when the mode does not evaluate), or with trainer.objective=best the best value of trainer.best_metric,
    which a sweeper such as Optuna optimises."""
    if sidecar.wanted(settings):  # mode=continuous_eval, or TF_CONFIG's evaluator task
        return sidecar.main(settings, job, actions)
    if settings.mode in checkpoint_modes.MODES:
        return checkpoint_modes.main(settings, job, actions)
    return train(settings, job, actions)


class Training(assembly.Role):
    """The training role (experiments/assembly.py): a start whose warm start cannot go on, whose model does not
    fit trainer.init_checkpoint or whose tf.data service has no dispatcher is a config error, before the run's
    first files; the chief writes train/ and validation/ events."""

    def claim(self, settings: Settings, model_dir: Path) -> RunDirectory:
        run_dir = super().claim(settings, model_dir)
        warm_start.check(settings, run_dir.checkpoint_dir)
        return run_dir

    def check_model(self, settings: Settings, run_dir: RunDirectory, trainer) -> None:
        warm_start.check_fit(settings, run_dir.checkpoint_dir, trainer.model)
        if settings.pipeline.service:
            service.check_dispatcher(settings.pipeline.service)

    def events(self, mode: str, writes: bool) -> tuple:
        return ("train", "validation") if writes else ()


def train(settings: Settings, job: Job, actions=()):
    """mode=train_and_evaluate and train: trains to trainer.train_steps from the resume point, evaluating on
    trainer.eval_every with train_and_evaluate; `run` says what it returns."""
    # Assembly: strategy, run directory (claimed), data, model, summaries, evaluator ---------------------------
    run = assembly.assemble(settings, job, Training())
    controller = Controller(run, extra_actions=actions, trial=study.job_trial(job.trial))

    # Restore: 1. the run's own newest restorable checkpoint, 2. trainer.init_checkpoint, 3. scratch ------------
    iterator, manager = controller.resume()

    # Loop: train loops, with the actions after each loop and each evaluation --------------------------------------
    controller.train(iterator, manager, evaluate=settings.mode == "train_and_evaluate")

    # Close ------------------------------------------------------------------------------------------------------
    return run.close()


class Controller:
    """Trains to the step budget from the resume point, evaluating on an interval and checkpointing, with the
    actions (experiments/training/actions.py) after each loop and each evaluation."""

    def __init__(self, run: assembly.Run, extra_actions=(), trial=None):
        """`run`: the training run as experiments/assembly.py assembles it (its evaluator and recipes, its
        `writes`: whether this process writes the trainer's files, skipped.csv and train/); `extra_actions`:
        actions (experiments/training/actions.py) called after the run's own; `trial`: the job's study.JobTrial,
        which the evaluations are reported to (sweep.pruner)."""
        self.run = run
        self.context = strategies.input_context(run.strategy)  # this worker's share of the training input
        self.extra_actions = list(extra_actions)
        self.actions = []  # the run's own and `extra_actions`, set as training starts (`_train`)
        pruner = run.settings.sweep.pruner if run.writes else None
        self.pruning = pruning.Pruning(pruner, trial, run.recipes.objective, run.model_dir, run.run_dir.chief)

    # Training ------------------------------------------------------------------------------------------------
    def _train_input(self):
        """The training pipeline: this worker's share of the train split (`context`)."""
        return input_fn(self.run.task, self.run.tables["train"], self.run.pipeline, split="train", training=True,
                        context=self.context, model_dir=self.run.model_dir)

    def resume(self):
        """The training iterator and checkpoint manager, restored by the resume policy
        (experiments/training/warm_start.py): 1. the run's own checkpoint, its newest restorable one: all it holds is
        restored; 2. else trainer.init_checkpoint: the model variables matching by name and shape; optimizer fresh, step
        0; 3. else scratch: the model as built (model.pretrained's weights where set).
        """
        run = self.run
        save_input = run.run_dir.saves_input(run.settings, run.task, self.context)
        iterator = run.trainer.input_iterator(self._train_input())
        checkpoint = run.trainer.checkpoint(iterator if save_input else None)
        latest = run.run_dir.latest(whole=True)
        warm_start.start(run.settings, run.trainer.model, latest)
        if latest:
            if run.run_dir.restore(latest, run.trainer, checkpoint, run.settings, save_input):
                # The saved iterator does not fit this pipeline: everything else was restored, the stream starts over.
                iterator = run.trainer.input_iterator(self._train_input())
                checkpoint = run.trainer.checkpoint(iterator)
        manager = run.run_dir.manager(checkpoint, latest, run.trainer, run.settings, save_input)
        run.recipes.resume(run.trainer.step)  # counts an evaluation the checkpoint was saved before
        run.clock.lap("input_fn")
        return iterator, manager

    def evaluate(self):
        """Evaluates the trainer's weights, then calls the actions' `after_evaluation` (the best checkpoint, early
        stopping and pruning count it: experiments/training/recipes.py, experiments/sweeps/pruning.py); returns its
        metrics."""
        values = self.run.evaluator.evaluate()
        self._call("after_evaluation", self.run.trainer.step, values)
        return values

    def train(self, iterator, manager, evaluate=True):
        """Trains from the resumed `iterator` to trainer.train_steps, saving through `manager`; evaluates on
        trainer.eval_every and at the end when `evaluate`."""
        with logging_redirect_tqdm():
            self._train(iterator, manager, evaluate)

    def _train(self, iterator, manager, evaluate):
        trainer, schedule = self.run.trainer, self.run.settings.trainer
        target = schedule.train_steps
        start = step = trainer.step
        if step >= target:
            log.info("Global step %d already reaches trainer.train_steps=%d; nothing to train", step, target)
        self.actions = actions.standard(self, manager, evaluate, start) + self.extra_actions
        # Loops end on every log, checkpoint and evaluation step, so these land as they would step by step.
        intervals = [schedule.log_every, schedule.checkpoint_every] + ([schedule.eval_every] if evaluate else [])
        first, longest = True, 0.0  # longest: the longest train loop yet, in seconds
        with contextlib.ExitStack() as stack:
            for action in self.actions:
                stack.callback(action.close)
            stack.enter_context(actions.saving_on_interrupt(trainer, self.run.run_dir, self.actions))
            stack.enter_context(self._unreadable_named())
            self._call("start", step)
            while step < target and not any(action.stop for action in self.actions):
                length = loop_length(step, trainer.steps_per_loop, target, intervals)
                for action in self.actions:
                    length = action.loop_length(step, length)
                # A signal waits for the loop's end (experiments/run_dir/interrupts.py): the loop and its actions'
                # `after_loop` (summary, checkpoint) are one unit. A loop that does not end within a grace is
                # abandoned, unsaved (experiments/run_dir/blocking.py).
                with interrupts.deferred():
                    source = iterator
                    if first:  # the first batch trains alone, and TensorBoard shows it as the model sees it
                        source, length = self._first_batch(iterator, step), 1
                    loop = self._train_loop(source, length, step, longest, first)
                    first, longest, step = False, max(longest, loop.seconds), trainer.step
                    self._call("after_loop", step, loop)
                self._call("between_loops", step)
        self._call("finish", step, any(action.stop for action in self.actions))

    def _call(self, hook, *args):
        for action in self.actions:
            getattr(action, hook)(*args)

    @contextlib.contextmanager
    def _unreadable_named(self):
        """Names the image files behind a training input that failed on too many unreadable files in a row
        (data/integrity/unreadable.py), as a DatasetError."""
        try:
            yield
        except tf.errors.InvalidArgumentError as error:
            failed = re.search(rf"(\d+ {unreadable.FAILED_IN_A_ROW})", error.message)
            if failed is None:
                raise
            self.run.note_unreadable()
            raise unreadable.in_a_row_error(failed.group(1), f"in training, at global step {self.run.trainer.step}",
                                            self.run.task.SPEC.name) from None

    def _first_batch(self, iterator, step):
        """The next training batch, as a one-batch iterator for the first loop, on every training process alike (the
        steps are collective); with trainer.accumulate_steps, the rest of its update's batches follow it. Fetched on
        the host, where the run waits for it in Python (experiments/run_dir/blocking.py): it says so while it waits,
        and a signal stops it. Where this process writes the run's summaries, TensorBoard shows it as the model
        sees it at global `step`. The run's iterator, which checkpoints hold, moves by exactly the batches trained."""
        run = self.run
        batch = blocking.call(next, iterator, what="the first training batch", **self._input_wait())
        if run.writes:
            run.summaries.inputs(*review.as_seen(batch, run.trainer.preprocess, step), run.task.SPEC, step)
        return run.trainer.first_update(make_iterator(tf.data.Dataset.from_tensors(batch)), iterator)

    def _train_loop(self, iterator, length, step, longest, first):
        """One train loop. The `first` trains on the batch fetched already, so it waits for no input, and runs here,
        in the thread that built the model: its call traces the train step, and Keras keeps settings such as the
        dtype policy per thread. Each later loop runs in a thread the run waits on in Python
        (experiments/run_dir/blocking.py), so that a loop stuck waiting for its batches says so once it runs far
        longer than `longest`, the longest loop before it, and a signal still stops it."""
        if first:
            return self.run.trainer.train_loop(iterator, length)
        return blocking.call(self.run.trainer.train_loop, iterator, length,
                             what=f"the train loop at global step {step}", expected=longest, **self._input_wait())

    def _input_wait(self) -> dict:
        """How long the run waits for its training input, and what its waiting line suggests: a tf.data service's
        dispatcher without a worker serves nothing and says nothing, so pipeline.service_timeout bounds the wait;
        without the service the run waits however long."""
        address = self.run.settings.pipeline.service
        if not address:
            return {}
        seconds = self.run.settings.pipeline.service_timeout
        bound = (f"the run fails after pipeline.service_timeout={seconds:g} s" if seconds is not None
                 else "pipeline.service_timeout=null: the run waits however long")
        return dict(hint=lambda: f"{service.waiting_hint(address)}; {bound}",
                    timeout=seconds, stalled=lambda: f"{service.stalled(address, seconds)} "
                                                     f"({self.run.run_dir.last_checkpoint_text()})")
