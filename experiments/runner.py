"""train_and_evaluate: the main behind `python run.py`, and the controller that runs its mode.

`run` reads top to bottom, in sections: settings, run directory (claim it), data, model, restore (the resume
point), loop, close. What it builds goes into one `Controller`, whose methods are the modes:
train_and_evaluate, train, evaluate, predict, export and continuous_eval (the sidecar evaluator, which the
same set-up serves on one device). Durability enters as named calls into experiments/run_dir/.
"""
import logging
import re
from pathlib import Path

import keras
import tensorflow as tf
from hydra.core.hydra_config import HydraConfig
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from tf_harness.data import service
from tf_harness.data.errors import ConfigError
from tf_harness.data.input_fn import input_fn
from tf_harness.data.integrity import unreadable
from tf_harness.data.integrity.skipped import SkipLog
from tf_harness.data.tables import check_skipped, dataset_root, drop_undecodable
from tf_harness.data.tfrecords.reader import check_shards
from tf_harness.experiments import export, metrics, recipes, review, sidecar, strategies, warm_start, xla_cache
from tf_harness.experiments.evaluation import Evaluator
from tf_harness.experiments.run_dir import blocking, interrupts
from tf_harness.experiments.run_dir.directory import RunDirectory, claim, no_checkpoint
from tf_harness.experiments.schema import EVALUATING_MODES, EVALUATION_MODES, TRAINING_MODES
from tf_harness.experiments.settings import Settings
from tf_harness.experiments.startup import StartupClock
from tf_harness.experiments.summaries import Summaries
from tf_harness.experiments.trainer import LoopStats, NonFiniteLossError, Trainer, loop_length

log = logging.getLogger(__name__)
_POLICIES = {"float32": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}


def run(settings: Settings):
    """Runs one Hydra job with `settings`, the config read once the schema passed it (experiments/cli.py
    `guarded`); the run directory is the model_dir. Returns the last evaluation's headline metric (None when the
    mode does not evaluate), or with trainer.objective=best the best value of trainer.best_metric, which a sweeper
    such as Optuna optimises."""
    # Settings ---------------------------------------------------------------------------------------------------
    clock = StartupClock()
    model_dir = Path(HydraConfig.get().runtime.output_dir)
    evaluator = sidecar.wanted(settings)  # mode=continuous_eval, or TF_CONFIG's evaluator task
    keras.backend.clear_session()  # a sweep's jobs share this process: each starts from a clean Keras state
    keras.utils.set_random_seed(settings.seed)
    if settings.deterministic:
        tf.config.experimental.enable_op_determinism()
    # The strategy comes before any TensorFlow op runs (the claim below reads checkpoints): MultiWorkerMirrored
    # configures collective ops, and a mirrored CPU is split into devices, only before the runtime starts.
    # The evaluator runs on one device, whatever the run trains with; TF_CONFIG was checked with the config.
    strategy = strategies.one_device() if evaluator else strategies.make_strategy(settings.strategy)
    if evaluator:
        log.info("Strategy %s with %d replica(s)", type(strategy).__name__, strategy.num_replicas_in_sync)
    if settings.pipeline.batch_size % strategy.num_replicas_in_sync:
        replicas = strategy.num_replicas_in_sync
        raise ConfigError(f"pipeline.batch_size={settings.pipeline.batch_size} does not divide across {replicas} "
                          f"replicas; use a multiple of {replicas}")
    policy = _POLICIES[settings.pipeline.dtype]  # float32 variables, logits and loss (experiments/trainer.py)
    keras.mixed_precision.set_global_policy(policy)
    if policy != "float32":
        log.info("pipeline.dtype=%s: Keras policy %s, float32 variables, logits and loss", settings.pipeline.dtype,
                 policy)

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
    log.info("Config:\n%s", settings.yaml())
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
    trainer = Trainer(settings, task.SPEC, strategy, task.decode.size)
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
    # Event files where this process has events to write: a refused export or predict leaves the folder as it was.
    splits = ("train", "validation") if settings.mode in TRAINING_MODES else \
        ("validation",) if settings.mode in EVALUATING_MODES else ()
    summaries = Summaries(str(model_dir), splits if writes else ("validation",) if evaluator else ())
    if writes:
        summaries.hparams(settings, task.SPEC.task, HydraConfig.get())
    controller = Controller(settings, task, pipeline, trainer, summaries, run_dir, tables, skipped, clock,
                            context=strategies.input_context(strategy), writes=writes)

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
    return controller.recipes.objective(controller.evaluator.last_values)  # trainer.objective: last or best


class Controller:
    """Runs a mode over the objects the main built: trains to the step budget, evaluating on an interval and
    checkpointing; evaluates, predicts or exports a restored checkpoint; or evaluates each new checkpoint."""

    def __init__(self, settings, task, pipeline, trainer, summaries, run_dir: RunDirectory, tables, skipped, clock,
                 context=None, writes=True):
        """`skipped`: the run's SkipLog, which grows by the image files that fail to decode mid-run;
        `context`: this worker's tf.distribute.InputContext for training input; `clock`: the start-up clock,
        whose line `train` logs after its first loop; `writes`: whether this process writes the trainer's files
        (skipped.csv, train/): the chief of a training run, never the sidecar evaluator."""
        self.settings, self.trainer_settings = settings, settings.trainer
        self.task, self.spec, self.pipeline, self.trainer = task, task.SPEC, pipeline, trainer
        self.summaries, self.run_dir, self.tables, self.skipped = summaries, run_dir, tables, skipped
        self.clock, self.context, self.writes = clock, context, writes
        self.model_dir = run_dir.model_dir
        self.reported = {path for path, _ in skipped.rows}  # the unreadable files skipped.csv lists already
        self.evaluator = Evaluator(task, trainer, tables, summaries, self.model_dir,
                                   batch_size=settings.pipeline.batch_size, eval_steps=settings.trainer.eval_steps,
                                   seed=pipeline.seed, input_fn=self._eval_input, note_unreadable=self.note_unreadable,
                                   write=run_dir.chief, beside=sidecar.wanted(settings))
        self.note_unreadable()  # what an earlier life of this run found
        self.recipes = recipes.Recipes(settings, task.SPEC, trainer, run_dir)  # best checkpoint, early stopping

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
        self.restored = recipes.chosen_checkpoint(self.settings.checkpoint, self.run_dir, self.settings.mode)
        self.trainer.checkpoint().restore(self.restored).expect_partial()
        log.info("Restored %s (global step %d)", self.restored, self.trainer.step)

    def evaluate(self):
        """Evaluates the trainer's weights; in a training run, also counts the evaluation for the best checkpoint
        and early stopping (experiments/recipes.py)."""
        values = self.evaluator.evaluate()
        self.recipes.evaluated(values, self.trainer.step)
        return values

    def predict(self):
        self.evaluator.predict()

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
        trainer, trainer_settings = self.trainer, self.trainer_settings
        start = step = trainer.step
        target = trainer_settings.train_steps
        if step >= target:
            log.info("Global step %d already reaches trainer.train_steps=%d; nothing to train", step, target)
        profiler = review.Profiler(trainer_settings.profile_steps if self.writes else None, self.model_dir / "train")
        # Loops end on every log, checkpoint and evaluation step, so these land as they would step by step.
        intervals = [trainer_settings.log_every, trainer_settings.checkpoint_every]
        intervals += [trainer_settings.eval_every] if evaluate else []
        window, first, longest = [], True, 0.0  # longest: the longest train loop yet, in seconds
        progress = tqdm(total=target, initial=step, desc="train", unit="step", dynamic_ncols=True)
        try:
            if evaluate and 0 < step < target and step % trainer_settings.eval_every == 0 \
                    and not self.run_dir.evaluated(step):
                log.info("Redoing the evaluation at global step %d, which was interrupted", step)
                self.evaluate()
            while step < target and not self.recipes.stopped:  # trainer.early_stopping
                profiler.update(step)
                length = profiler.loop_length(step, loop_length(step, trainer.steps_per_loop, target, intervals))
                # A signal waits for the loop's end (experiments/run_dir/interrupts.py): the loop, its summary and
                # its checkpoint are one unit, so no step is trained without its summary or saved half-logged. A
                # loop that does not end within a grace is abandoned, unsaved (experiments/run_dir/blocking.py).
                with interrupts.deferred():
                    source = iterator
                    if first:  # the first batch trains alone, and TensorBoard shows it as the model sees it
                        source, length = self._first_batch(iterator, step), 1
                    with profiler.step(step):
                        loop = self._train_loop(source, length, step, longest, first)
                    first, longest = False, max(longest, loop.seconds)
                    step = self._after_loop(loop, window, manager, progress)
                if evaluate and step % trainer_settings.eval_every == 0 and step < target:
                    self.evaluate()
        except blocking.Abandoned as interrupt:
            # The loop may have trained part of its steps: a save now would hold a state no step ended in.
            log.warning("Interrupted while waiting for %s; exiting without saving (%s)", interrupt.what,
                        self.run_dir.last_checkpoint_text())
            raise
        except KeyboardInterrupt:
            # Nothing is lost on Ctrl-C or SIGTERM: a signal is handled between loops, and every batch a loop took
            # was trained on, so the global step, the weights and the iterator position agree when saved.
            step = trainer.step
            if step > 0:
                self._log_train(window, step)
                if manager.latest_checkpoint != self.run_dir.checkpoint_path(step):
                    self._save_finite(manager, step)
                log.warning("Interrupted at global step %d; saved a checkpoint to resume from", step)
            raise
        except tf.errors.InvalidArgumentError as error:
            failed = re.search(rf"(\d+ {unreadable.FAILED_IN_A_ROW})", error.message)
            if failed is None:
                raise
            self.note_unreadable()
            raise unreadable.in_a_row_error(failed.group(1), f"in training, at global step {trainer.step}",
                                            self.spec.name) from None
        finally:
            profiler.close()
            progress.close()
        if self.recipes.stopped:  # the step it stopped at is evaluated; it is saved too
            return self.recipes.save_stop(manager, self._save_finite)
        if evaluate and (step > start or not self.run_dir.evaluated(step)):  # done already if interrupted after it
            self.evaluate()

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

    def _after_loop(self, loop, window, manager, progress):
        """Logs, checks and saves what a train loop did; returns the global step it reached."""
        trainer_settings, step = self.trainer_settings, self.trainer.step
        if not self.clock.logged:
            self.clock.first_step(loop.steps)
            xla_cache.publish()  # the train step's compiled program is whole now: the next run may load it
        window.append(loop)
        self._check_finite(loop, step)
        progress.update(loop.steps)
        progress.set_postfix(loss=f"{loop.loss:.4f}",
                             examples_per_sec=f"{self.trainer.examples_per_step * loop.steps / loop.seconds:.0f}")
        if step % trainer_settings.log_every == 0 or step == trainer_settings.train_steps:
            self._log_train(window, step)
        if step % trainer_settings.checkpoint_every == 0 or step == trainer_settings.train_steps:
            self._save_finite(manager, step)
        return step

    def _check_finite(self, loop, step):
        if loop.nonfinite:
            log.warning("Skipped %d training step(s) with a non-finite loss or gradient norm, up to global step %d",
                        loop.nonfinite, step)
        in_a_row = loop.nonfinite_in_a_row
        if in_a_row >= self.trainer.max_nonfinite_steps:
            what = (f"{in_a_row} training steps in a row had a non-finite loss or gradient norm, the last at global "
                    f"step {step}; none was applied" if in_a_row > 1 else
                    f"training step {step} had a non-finite loss or gradient norm and was not applied")
            raise NonFiniteLossError(f"{what}; stopping ({self.run_dir.last_checkpoint_text()})")

    def _save_finite(self, manager, step):
        # Skipped updates keep the weights finite; this guards the checkpoint against anything else.
        if not self.trainer.all_finite():
            raise NonFiniteLossError(f"the model or optimizer holds non-finite values at global step {step}; not "
                                     f"saving ({self.run_dir.last_checkpoint_text()})")
        self.run_dir.save(manager, step)

    def _log_train(self, window, step):
        if not window:
            return
        loops = LoopStats.merge(window)
        window.clear()
        values = {"loss": loops.loss,
                  "learning_rate": self.trainer.learning_rate,
                  "examples_per_sec": self.trainer.examples_per_step * loops.steps / loops.seconds,
                  # The share of train time spent waiting for batches (experiments/trainer.py defines it per loop).
                  "input_wait_fraction": loops.input_wait_fraction,
                  "nonfinite_steps": loops.nonfinite}
        if self.trainer.clip_global_norm is not None:  # the norm before clipping
            values["gradient_norm"] = loops.gradient_norm
        if len(loops.logits):
            values.update(metrics.evaluate(self.spec.task, self.spec.class_names, loops.labels, loops.logits))
        self.summaries.scalars("train", values, step)
        self.note_unreadable()
        # The window's pace (the first one includes the trace) over the steps still to go.
        target = self.trainer_settings.train_steps
        log.info("step %d/%d: loss %.4f, %.1f examples/s, input_wait_fraction %.3f, ETA %s", step, target,
                 values["loss"], values["examples_per_sec"], values["input_wait_fraction"],
                 _duration(loops.seconds / loops.steps * max(target - step, 0)))


def _duration(seconds) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"
