"""train_and_evaluate: the main behind `python run.py`, and the controller that runs its mode.

`run` reads top to bottom, in sections: settings, run directory (claim it), data, model, restore (the resume
point), loop, close. What it builds goes into one `Controller`, whose methods are the modes:
train_and_evaluate, train, evaluate, predict, export and continuous_eval (the sidecar evaluator, which the
same set-up serves on one device). Durability enters as named calls into experiments/run_dir/.
"""
import contextlib
import logging
import re
from pathlib import Path

import keras
import tensorflow as tf
from tqdm.contrib.logging import logging_redirect_tqdm

from tf_harness.data import TASKS, service
from tf_harness.data.errors import ConfigError
from tf_harness.data.input_fn import input_fn
from tf_harness.data.integrity import unreadable
from tf_harness.data.integrity.skipped import SkipLog
from tf_harness.data.tables import check_skipped, dataset_root, drop_undecodable
from tf_harness.data.tfrecords.reader import check_shards
from tf_harness.experiments import (actions, class_weights, export, heatmaps, pruning, recipes, review, sidecar,
                                    strategies, warm_start, xla_cache)
from tf_harness.experiments.evaluation import Evaluator
from tf_harness.experiments.run_dir import blocking, interrupts
from tf_harness.experiments.run_dir.directory import RunDirectory, claim, no_checkpoint
from tf_harness.experiments.schema import EVALUATING_MODES, EVALUATION_MODES, TRAINING_MODES
from tf_harness.experiments.settings import Job, Settings
from tf_harness.experiments.startup import StartupClock
from tf_harness.experiments.summaries import Summaries
from tf_harness.experiments.trainer import Trainer, loop_length

log = logging.getLogger(__name__)
_POLICIES = {"float32": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}


def run(settings: Settings, job: Job, actions=()):
    """Runs one job with `settings`, the config read once the schema passed it (experiments/cli.py `guarded`);
    `job.run_dir`, the run directory, is the model_dir; `actions` (experiments/actions.py) are called after the
    mode's own. Returns (the job's objective, the last evaluation's metrics; empty when the mode does not evaluate).
    The objective is the last evaluation's headline metric (None when the mode does not evaluate), or with
    trainer.objective=best the best value of trainer.best_metric, which a sweeper such as Optuna optimises."""
    # Settings ---------------------------------------------------------------------------------------------------
    clock = StartupClock()
    model_dir = Path(job.run_dir)
    evaluator = sidecar.wanted(settings)  # mode=continuous_eval, or TF_CONFIG's evaluator task
    keras.backend.clear_session()  # a sweep's jobs share this process: each starts from a clean Keras state
    keras.utils.set_random_seed(settings.seed)
    if settings.deterministic:
        tf.config.experimental.enable_op_determinism()
    # The strategy comes before any TensorFlow op runs (the claim below reads checkpoints): MultiWorkerMirrored
    # configures collective ops, and a mirrored CPU is split into devices, only before the runtime starts.
    # The evaluator runs on one device, whatever the run trains with; TF_CONFIG was checked with the config.
    strategy = strategies.one_device() if evaluator else strategies.make_strategy(settings.strategy)
    if settings.pipeline.batch_size % strategy.num_replicas_in_sync:
        replicas = strategy.num_replicas_in_sync
        raise ConfigError(f"pipeline.batch_size={settings.pipeline.batch_size} does not divide across {replicas} "
                          f"replicas; use a multiple of {replicas}")
    policy = _POLICIES[settings.pipeline.dtype]  # float32 variables, logits and loss (experiments/trainer.py)
    keras.mixed_precision.set_global_policy(policy)

    # Run directory: claim it ------------------------------------------------------------------------------------
    # The trainer takes the run lock and clears a killed run's leftovers; the sidecar its own lock and eval.log.
    # A start that could not go on is refused here, before anything is written. From here on SIGINT and SIGTERM
    # end the run once what it did is saved (exit 130/143).
    interrupts.install()
    if evaluator:
        sidecar.start(settings, model_dir)
    run_dir = claim(settings, model_dir, evaluator)
    if not evaluator:
        warm_start.check(settings, run_dir.checkpoint_dir)
        xla_cache.report()
    # Logged once the run directory is claimed: a start refused here writes nothing to a live run's log.
    log.info("Config:\n%s", settings.yaml())
    log.info("Strategy %s with %d replica(s)", type(strategy).__name__, strategy.num_replicas_in_sync)
    if policy != "float32":
        log.info("pipeline.dtype=%s: Keras policy %s, float32 variables, logits and loss", settings.pipeline.dtype,
                 policy)
    if evaluator:
        log.info("Run directory: %s; mode=%s logs to %s, run.log is the trainer's", model_dir, sidecar.MODE,
                 sidecar.LOG_NAME)
    else:
        log.info("Run directory: %s", model_dir)
    # Under multi_worker only the chief writes the run directory's files; the others would clash.
    chief = strategies.is_chief(strategy)
    _, worker = strategies.workers()
    run_dir.set_worker(None if chief else worker)

    # Data: index once, in Python; everything per example happens in tf.data -----------------------------------
    task = settings.task()
    pipeline = settings.input_pipeline()
    skipped = SkipLog()
    tables = task.index(dataset_root(task, settings.dataset.root), skipped)
    clock.lap("index")
    if settings.pipeline.verify_images:
        tables = drop_undecodable(tables, skipped)
        clock.lap("verify")
    check_shards(task, tables, pipeline.tfrecord, "evaluate" if evaluator else settings.mode, skipped)

    # Model: network, optimizer and global step ---------------------------------------------------------------
    # Built before the run directory holds anything of this run but Hydra's files and the lock, so that a model
    # this config cannot build, or a warm start none of whose variables fit it, is a config error leaving no folder.
    trainer = Trainer(settings, task.SPEC, strategy, task.decode.size, loss=task.loss)
    clock.lap("build")
    if not evaluator:
        warm_start.check_fit(settings, run_dir.checkpoint_dir, trainer.model)
    if settings.pipeline.service and not evaluator and settings.mode in TRAINING_MODES:
        service.check_dispatcher(settings.pipeline.service)  # a config error too, so it leaves no folder
    # The run's first files, once the model is built: skipped.csv, then the HParams record.
    writes = chief and not evaluator  # skipped.csv and train/ are the trainer's; the sidecar writes validation/
    if writes:
        skipped.write(model_dir / "skipped.csv")  # also logs how many rows were skipped, and why
    check_skipped(tables, skipped, settings.dataset.max_skipped_fraction)  # after: its error points at skipped.csv
    class_weights.prepare(settings, task, tables, model_dir, write=writes)  # trainer.class_weights
    # Event files where this process has events to write: a refused export or predict leaves the folder as it was.
    splits = ("train", "validation") if settings.mode in TRAINING_MODES else \
        ("validation",) if settings.mode in EVALUATING_MODES else ()
    summaries = Summaries(str(model_dir), splits if writes else ("validation",) if evaluator else ())
    if writes:
        summaries.hparams(settings, task.SPEC.task, job)
    controller = Controller(settings, task, pipeline, trainer, summaries, run_dir, tables, skipped, clock,
                            context=strategies.input_context(strategy), writes=writes, extra_actions=actions,
                            trial=job.trial)

    # Restore: 1. the run's own newest restorable checkpoint, 2. trainer.init_checkpoint, 3. scratch ------------
    # Training restores its input iterator too; evaluate, predict and export the checkpoint `checkpoint=` names;
    # the sidecar each new checkpoint as it comes.
    training = not evaluator and settings.mode in TRAINING_MODES
    if training:
        iterator, manager = controller.resume()
    elif settings.mode in EVALUATION_MODES:
        controller.restore()

    # Loop: the mode ----------------------------------------------------------------------------------------------
    if evaluator:
        controller.continuous_eval()
    elif training:
        controller.train(iterator, manager, evaluate=settings.mode == "train_and_evaluate")
    else:
        {"evaluate": controller.evaluate, "predict": controller.predict, "export": controller.export}[settings.mode]()

    # Close ------------------------------------------------------------------------------------------------------
    summaries.close()
    last = controller.evaluator.last_values
    # trainer.objective (last or best), and the final metrics: the last evaluation's, with the global step reached.
    return controller.recipes.objective(last), {**last, "global_step": trainer.step}


class Controller:
    """Runs a mode over the objects the main built: trains to the step budget, evaluating on an interval and
    checkpointing; evaluates, predicts or exports a restored checkpoint; or evaluates each new checkpoint."""

    def __init__(self, settings, task, pipeline, trainer, summaries, run_dir: RunDirectory, tables, skipped, clock,
                 context=None, writes=True, extra_actions=(), trial=None):
        """`skipped`: the run's SkipLog, which grows by the image files that fail to decode mid-run;
        `context`: this worker's tf.distribute.InputContext for training input; `clock`: the start-up clock,
        whose line `train` logs after its first loop; `writes`: whether this process writes the trainer's files
        (skipped.csv, train/): the chief of a training run, never the sidecar evaluator; `extra_actions`: actions
        (experiments/actions.py) called after those of the run's mode; `trial`: the job's study.JobTrial, which a
        training run's evaluations are reported to (sweep.pruner)."""
        self.settings, self.trainer_settings = settings, settings.trainer
        self.task, self.spec, self.pipeline, self.trainer = task, task.SPEC, pipeline, trainer
        self.summaries, self.run_dir, self.tables, self.skipped = summaries, run_dir, tables, skipped
        self.clock, self.context, self.writes = clock, context, writes
        self.model_dir = run_dir.model_dir
        self.reported = {path for path, _ in skipped.rows}  # the unreadable files skipped.csv lists already
        self.evaluator = Evaluator(task, trainer, tables, summaries, self.model_dir,
                                   batch_size=settings.pipeline.batch_size, eval_steps=settings.trainer.eval_steps,
                                   seed=pipeline.seed, input_fn=self._eval_input, note_unreadable=self.note_unreadable,
                                   write=run_dir.chief, beside=sidecar.wanted(settings),
                                   chosen=settings.checkpoint if settings.mode == "evaluate" else None,
                                   bootstrap=settings.evaluation.bootstrap, unit=TASKS.entries[task.SPEC.name].unit)
        self.note_unreadable()  # what an earlier life of this run found
        self.recipes = recipes.Recipes(settings, task.SPEC, trainer, run_dir)  # best checkpoint, early stopping
        # The actions of the mode: training sets its own (`_train`); an evaluation outside training counts for nothing.
        self.extra_actions = list(extra_actions)
        self.actions = [actions.BestCheckpoint(self.recipes), *self.extra_actions]
        pruner = settings.sweep.pruner if writes and settings.mode in TRAINING_MODES else None
        self.pruning = pruning.Pruning(pruner, trial, self.recipes.objective, self.model_dir, run_dir.chief)

    # Input ---------------------------------------------------------------------------------------------------
    def _input_fn(self, split, training, rows=None):
        return input_fn(self.task, self.tables[split], self.pipeline, split=split, training=training,
                        context=self.context if training else None, model_dir=self.model_dir, rows=rows)

    def _eval_input(self, split, rows=None):
        return self._input_fn(split, training=False, rows=rows)

    def note_unreadable(self):
        """Lists in skipped.csv the image files that the pipelines reported since the last call
        (data/integrity/unreadable.py)."""
        rows = unreadable.collect(unreadable.report_folder(self.model_dir), self.reported)
        if rows and self.writes:
            self.skipped.extend(rows)
            self.skipped.write(self.model_dir / "skipped.csv")

    # The modes that read a checkpoint ------------------------------------------------------------------------
    def restore(self):
        """Restores the checkpoint that `checkpoint=latest|best|<step>` names (evaluate, predict, export): by
        default the run's newest restorable one."""
        split = self.settings.split
        if split is not None and split not in self.tables:  # the dataset has one, but not in this copy of it
            raise ConfigError(f"split={split}: dataset={self.spec.name} has no {split} split under "
                              f"{self.settings.dataset.root or 'its sample'} (its test split is "
                              f"{TASKS.entries[self.spec.name].test}: docs/datasets.md)")
        self.restored = recipes.chosen_checkpoint(self.settings.checkpoint, self.run_dir, self.settings.mode)
        self.trainer.checkpoint().restore(self.restored).expect_partial()
        log.info("Restored %s (global step %d)", self.restored, self.trainer.step)

    def evaluate(self):
        """Evaluates the trainer's weights, then calls the actions' `after_evaluation` (in a training run, the best
        checkpoint and early stopping count it: experiments/recipes.py). With split=test (mode=evaluate), the test
        split into metrics_test.json, which no action counts."""
        if self.settings.split == "test":
            return self.evaluator.evaluate("test")
        values = self.evaluator.evaluate()
        self._call("after_evaluation", self.trainer.step, values)
        return values

    def predict(self):
        predictions = self.evaluator.predict(self.settings.split)
        if self.settings.heatmaps and predictions is not None:  # heatmaps=N: Grad-CAM of the N highest scores
            with self.trainer.averaged():
                heatmaps.write_top(self.task, self.trainer, predictions, self.settings.heatmaps, self.model_dir)

    def export(self):
        with self.trainer.averaged():  # trainer.ema_decay: the averaged weights are what is served
            return export.export(self.task, self.trainer, self.run_dir, self.restored)

    def continuous_eval(self):
        """The sidecar evaluator: each new checkpoint of the run, until the final step (experiments/sidecar.py)."""
        sidecar.evaluate_each(self.settings, self.run_dir.checkpoint_dir, self.trainer, self.evaluator)

    # Training ------------------------------------------------------------------------------------------------
    def resume(self):
        """The training iterator and checkpoint manager, restored by the resume policy (experiments/warm_start.py):
        1. the run's own checkpoint, its newest restorable one: all it holds is restored;
        2. else trainer.init_checkpoint: the model variables matching by name and shape; optimizer fresh, step 0;
        3. else scratch: the model as built (model.pretrained's weights where set).
        """
        iterator = iter(self._input_fn("train", training=True))
        save_input = self.run_dir.saves_input(self.settings, self.task, self.context)
        checkpoint = self.trainer.checkpoint(iterator if save_input else None)
        latest = self.run_dir.latest(whole=True)
        warm_start.start(self.settings, self.trainer.model, latest)
        if latest:
            if self.run_dir.restore(latest, self.trainer, checkpoint, self.settings, save_input):
                # The saved iterator does not fit this pipeline: everything else was restored, the stream starts over.
                iterator = iter(self._input_fn("train", training=True))
                checkpoint = self.trainer.checkpoint(iterator)
        manager = self.run_dir.manager(checkpoint, latest, self.trainer, self.settings, save_input)
        self.recipes.resume(self.trainer.step)  # counts an evaluation the checkpoint was saved before
        self.clock.lap("input_fn")
        return iterator, manager

    def train(self, iterator, manager, evaluate=True):
        """Trains from the resumed `iterator` to trainer.train_steps, saving through `manager`; evaluates on
        trainer.eval_every and at the end when `evaluate`."""
        with logging_redirect_tqdm():
            self._train(iterator, manager, evaluate)

    def _train(self, iterator, manager, evaluate):
        trainer, target = self.trainer, self.trainer_settings.train_steps
        start = step = trainer.step
        if step >= target:
            log.info("Global step %d already reaches trainer.train_steps=%d; nothing to train", step, target)
        self.actions = actions.standard(self, manager, evaluate, start) + self.extra_actions
        # Loops end on every log, checkpoint and evaluation step, so these land as they would step by step.
        intervals = [self.trainer_settings.log_every, self.trainer_settings.checkpoint_every]
        intervals += [self.trainer_settings.eval_every] if evaluate else []
        first, longest = True, 0.0  # longest: the longest train loop yet, in seconds
        with contextlib.ExitStack() as stack:
            for action in self.actions:
                stack.callback(action.close)
            stack.enter_context(actions.saving_on_interrupt(trainer, self.run_dir, self.actions))
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
            self.note_unreadable()
            raise unreadable.in_a_row_error(failed.group(1), f"in training, at global step {self.trainer.step}",
                                            self.spec.name) from None

    def _first_batch(self, iterator, step):
        """The next training batch, as a one-batch iterator for the first loop, on every training process alike (the
        steps are collective); with trainer.accumulate_steps, the rest of its update's batches follow it. Fetched on
        the host, where the run waits for it in Python (experiments/run_dir/blocking.py): it says so while it waits,
        and a signal stops it. Where this process writes the run's summaries, TensorBoard shows it as the model
        sees it at global `step`. The run's iterator, which checkpoints hold, moves by exactly the batches trained."""
        batch = blocking.call(next, iterator, what="the first training batch", **self._input_wait())
        if self.writes:
            self.summaries.inputs(*review.as_seen(batch, self.trainer.preprocess, step), self.spec, step)
        return self.trainer.first_update(iter(tf.data.Dataset.from_tensors(batch)), iterator)

    def _train_loop(self, iterator, length, step, longest, first):
        """One train loop. The `first` trains on the batch fetched already, so it waits for no input, and runs here,
        in the thread that built the model: its call traces the train step, and Keras keeps settings such as the
        dtype policy per thread. Each later loop runs in a thread the run waits on in Python
        (experiments/run_dir/blocking.py), so that a loop stuck waiting for its batches says so once it runs far
        longer than `longest`, the longest loop before it, and a signal still stops it."""
        if first:
            return self.trainer.train_loop(iterator, length)
        return blocking.call(self.trainer.train_loop, iterator, length, what=f"the train loop at global step {step}",
                             expected=longest, **self._input_wait())

    def _input_wait(self) -> dict:
        """How long the run waits for its training input, and what its waiting line suggests: a tf.data service's
        dispatcher without a worker serves nothing and says nothing, so pipeline.service_timeout bounds the wait;
        without the service the run waits however long."""
        address = self.settings.pipeline.service
        if not address:
            return {}
        seconds = self.settings.pipeline.service_timeout
        bound = (f"the run fails after pipeline.service_timeout={seconds:g} s" if seconds is not None
                 else "pipeline.service_timeout=null: the run waits however long")
        return dict(hint=lambda: f"{service.waiting_hint(address)}; {bound}",
                    timeout=seconds, stalled=lambda: f"{service.stalled(address, seconds)} "
                                                     f"({self.run_dir.last_checkpoint_text()})")
