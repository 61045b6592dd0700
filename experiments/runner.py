"""train_and_evaluate: the Estimator-style runner behind `python run.py`.

Reads top to bottom: set-up and config checks, input pipeline, model and
optimizer, checkpoint restore, then the mode (train and evaluate, train,
evaluate, predict, export or the sidecar evaluator). The Estimator trains here;
its evaluation and prediction passes are experiments/evaluation.py.
"""
import logging
import re
import shutil
from pathlib import Path

import keras
import tensorflow as tf
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from tqdm import tqdm

from tf_harness.data import caching, evaluation_sample, task_from_config
from tf_harness.data.integrity import unreadable
from tf_harness.data.errors import ConfigError, DatasetError
from tf_harness.data.input_fn import Pipeline, input_fn
from tf_harness.data.integrity.skipped import SkipLog
from tf_harness.data.tables import check_skipped, dataset_root, drop_undecodable
from tf_harness.data.tfrecords.reader import check_shards
from tf_harness.experiments import export, metrics, review, sidecar, strategies, warm_start, xla_cache
from tf_harness.experiments.run_dir import checkpoints, input_record, interrupts, leftovers, reentry, run_lock
from tf_harness.experiments.evaluation import Evaluation
from tf_harness.experiments.progress import logs_above_the_bar
from tf_harness.experiments.startup import StartupClock
from tf_harness.experiments.summaries import Summaries, evaluated_step
from tf_harness.experiments.trainer import LoopStats, NonFiniteLossError, Trainer, loop_length

log = logging.getLogger(__name__)


def _duration(seconds) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"


def run(cfg):
    """Runs one Hydra job; the run directory is the model_dir. Returns the last evaluation's headline metric
    (None when the mode does not evaluate), which a sweeper such as Optuna optimises."""
    clock = StartupClock()
    model_dir = Path(HydraConfig.get().runtime.output_dir)
    interrupts.install()  # SIGINT/SIGTERM: save a checkpoint, then exit 130/143
    if sidecar.wanted(cfg):  # mode=continuous_eval or TF_CONFIG's evaluator: beside the trainer, its own lock and log
        return sidecar.run(cfg, model_dir, Estimator)
    _claim_run_directory(cfg, model_dir)
    xla_cache.report()
    log.info("Config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))
    log.info("Run directory: %s", model_dir)
    # Multirun jobs share this process: start each from a clean Keras state.
    keras.backend.clear_session()
    keras.utils.set_random_seed(cfg.seed)
    if cfg.deterministic:
        tf.config.experimental.enable_op_determinism()
    task = task_from_config(cfg)
    spec = task.SPEC
    pipeline = Pipeline.from_config(cfg)
    # TF_CONFIG, and the batch's split across its workers, were checked with the config (experiments/schema.py).
    _, worker = strategies.workers()
    strategy = strategies.make_strategy(cfg.strategy)
    replicas = strategy.num_replicas_in_sync
    if cfg.pipeline.batch_size % replicas:
        raise ConfigError(f"pipeline.batch_size={cfg.pipeline.batch_size} does not divide across {replicas} "
                          f"replicas; use a multiple of {replicas}")
    _set_precision(cfg.pipeline.dtype)
    # Under multi_worker only the chief writes the run directory's files; the others would clash.
    chief = strategies.is_chief(strategy)

    # Input pipeline: index once, in Python; everything per example happens in tf.data.
    skipped = SkipLog()
    tables = _index(cfg, task, pipeline, skipped, clock)
    if chief:
        skipped.write(model_dir / "skipped.csv")  # also logs how many rows were skipped, and why
    check_skipped(tables, skipped, cfg.dataset.max_skipped_fraction)  # after: its error points at skipped.csv

    # Model, optimizer and global step.
    trainer = Trainer(cfg, spec, strategy, task.decode.size)
    clock.lap("build")
    summaries = Summaries(str(model_dir), enabled=chief)
    summaries.hparams(cfg, spec.task, HydraConfig.get())
    estimator = Estimator(cfg, task, pipeline, trainer, summaries, model_dir, tables, skipped,
                          context=strategies.input_context(strategy), worker=None if chief else worker, clock=clock)
    if cfg.mode == "predict":
        estimator.predict()
    elif cfg.mode == "export":
        export.export(estimator)
    elif cfg.mode == "evaluate":
        estimator.evaluate(restore=True)
    else:
        estimator.train(evaluate=cfg.mode == "train_and_evaluate")
    return estimator.last_values.get(metrics.headline(spec.task))


def _claim_run_directory(cfg, model_dir):
    """Takes the run directory's lock, then refuses, before anything is written there, a start that could not go on:
    an evaluation without a checkpoint, checkpoints none of which can be restored or one that training would
    overwrite, a trainer.init_checkpoint that cannot be restored."""
    if run_lock.hold(model_dir):  # exit 2 if another process runs here; only the holder may clean up
        leftovers.remove(model_dir)
    if cfg.mode in reentry.EVALUATION_MODES and not any((model_dir / "checkpoints").glob("ckpt-*.index")):
        # A directory with no checkpoint must not become a recorded run of this mode.
        raise ConfigError(f"mode={cfg.mode} needs a checkpoint in {model_dir / 'checkpoints'}; train into that run "
                          f"directory first (hydra.run.dir=...)")
    checkpoints.check_before_start(model_dir / "checkpoints", cfg.mode, cfg.trainer.train_steps,
                                   reentry.has_hparams(model_dir))
    warm_start.check(cfg, model_dir / "checkpoints")


def _set_precision(dtype):
    """Keras's global policy for pipeline.dtype. Mixed precision keeps variables, logits and the loss in float32
    (experiments/trainer.py casts the logits)."""
    policy = {"float32": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}[dtype]
    keras.mixed_precision.set_global_policy(policy)
    if policy != "float32":
        log.info("pipeline.dtype=%s: Keras policy %s, float32 variables, logits and loss", dtype, policy)


def _index(cfg, task, pipeline, skipped, clock):
    """The dataset's index tables, with the image files that do not decode and the records damaged TFRecord
    shards lost listed in `skipped`."""
    tables = task.index(dataset_root(task, cfg.dataset.root), skipped)
    clock.lap("index")
    if cfg.pipeline.verify_images:
        tables = drop_undecodable(tables, skipped)
        clock.lap("verify")
    check_shards(task, tables, pipeline.tfrecord, cfg.mode, skipped)
    return tables


class Estimator(Evaluation):
    """Trains to a step budget, evaluates on an interval (experiments/evaluation.py), checkpoints and resumes."""

    def __init__(self, cfg, task, pipeline, trainer, summaries, model_dir, tables, skipped, context=None, worker=None,
                 clock=None):
        """`skipped`: the run's SkipLog, which grows by the image files that fail to decode mid-run;
        `context`: this worker's tf.distribute.InputContext for training input; `worker`: None on the
        chief, a non-chief worker's index, whose files go to a scratch folder; `clock`: the start-up
        clock, whose line train() logs after its first step."""
        self.cfg = cfg
        self.task = task
        self.spec = task.SPEC
        self.pipeline = pipeline
        self.trainer = trainer
        self.summaries = summaries
        self.model_dir = model_dir
        self.tables = tables
        self.context = context
        self.skipped = skipped
        self.reported = {path for path, _ in skipped.rows}  # the unreadable files skipped.csv lists already
        self.chief = worker is None
        self.clock = clock or StartupClock()
        # Every worker takes part in saving (the variables are synchronised), but only the chief's
        # copy is kept; the others save into a scratch folder and delete it.
        self.checkpoint_dir = model_dir / "checkpoints"
        self.save_dir = self.checkpoint_dir if self.chief else model_dir / f".worker-{worker}-checkpoints"
        self.eval_split = "validation"
        # trainer.eval_steps: the same seeded, stratified rows at every evaluation (None: the whole split).
        self.eval_rows = evaluation_sample.sample_rows(tables[self.eval_split], cfg.trainer.eval_steps, pipeline.seed)
        self.eval_data = self._input_fn(self.eval_split, training=False, rows=self.eval_rows)
        self.last_values = {}  # the last evaluation's metrics
        self._note_unreadable()  # what an earlier life of this run found

    def _note_unreadable(self):
        """Lists in skipped.csv the image files that the pipelines reported since the last call (data/integrity/unreadable.py)."""
        rows = unreadable.collect(unreadable.report_folder(self.model_dir), self.reported)
        if rows and self.chief:
            self.skipped.extend(rows)
            self.skipped.write(self.model_dir / "skipped.csv")

    def _input_fn(self, split, training, rows=None):
        return input_fn(self.task, self.tables[split], self.pipeline, split=split, training=training,
                        context=self.context if training else None, model_dir=self.model_dir, rows=rows)

    def _manager(self, checkpoint, restored):
        # Created once `restored` is: it deletes and rewrites none of the checkpoints already there, and refuses to
        # start when one of them lies ahead of the restored step (experiments/run_dir/checkpoints.py).
        return checkpoints.Manager(checkpoint, self.save_dir, max_to_keep=self.cfg.trainer.keep_checkpoints,
                                   step_counter=self.trainer.global_step, restored=restored,
                                   train_steps=self.cfg.trainer.train_steps, run_checkpoints=self.checkpoint_dir)

    def _save(self, manager, step):
        manager.save(checkpoint_number=step)
        if not self.chief:
            shutil.rmtree(self.save_dir, ignore_errors=True)

    def _latest_checkpoint(self):
        """The newest checkpoint in the run directory (the chief's, for every worker) whose files are all there
        and whose tensors are all finite, found from its files (experiments/run_dir/checkpoints.py); None when none."""
        return checkpoints.newest_finite(self.checkpoint_dir)

    def _last_checkpoint_text(self):
        """Where a stopped run can be resumed from, for its error line."""
        latest = self._latest_checkpoint()
        return "no checkpoint to resume from" if latest is None else f"last checkpoint: {latest}"

    def _restore_model(self):
        latest = self._latest_checkpoint()
        if latest is None:
            raise ConfigError(f"mode={self.cfg.mode} needs a checkpoint in {self.checkpoint_dir}; "
                              f"train into that run directory first (hydra.run.dir=...)")
        self.trainer.checkpoint().restore(latest).expect_partial()
        log.info("Restored %s (global step %d)", latest, self.trainer.step)

    def _resume_training(self):
        """The training iterator and checkpoint manager, restored from the run directory's latest checkpoint."""
        cfg, trainer = self.cfg, self.trainer
        iterator = iter(self._input_fn("train", training=True))
        save_input = cfg.trainer.checkpoint_input and caching.checkpointable(cfg.pipeline.cache, self.task)
        if cfg.trainer.checkpoint_input and not save_input:
            log.info("pipeline.cache=%s: checkpoints leave out the input iterator (see data/caching.py); a resumed "
                     "run starts its input stream over", cfg.pipeline.cache)
        elif save_input and self.context.num_input_pipelines > 1:
            # The chief's checkpoint would hand its own input position and shuffle buffer to every worker.
            save_input = False
            log.info("strategy=multi_worker: checkpoints leave out the workers' input iterators; a resumed run "
                     "starts each worker's input stream over")
        elif save_input and cfg.pipeline.service:
            # The service's workers hold the stream's position and shuffle buffers; no iterator here can save them.
            save_input = False
            log.info("pipeline.service: checkpoints leave out the input iterator, whose stream the service's workers "
                     "make; a resumed run starts its input stream over")
        checkpoint = trainer.checkpoint(iterator if save_input else None)
        signature = input_record.input_signature(cfg, trainer.replicas, save_input)
        # Resume policy (experiments/warm_start.py):
        # 1. the run's own checkpoint, its newest restorable one: all it holds is restored;
        # 2. else trainer.init_checkpoint: the model variables matching by name and shape; optimizer fresh, step 0;
        # 3. else scratch: the model as built (model.pretrained's weights where set).
        # Once the run has its own checkpoint, trainer.init_checkpoint is ignored (logged).
        latest = self._latest_checkpoint()
        warm_start.start(cfg, trainer.model, latest)
        if latest:
            known, saved = input_record.saved_input(self.checkpoint_dir, int(latest.rpartition("-")[2]))
            if known and save_input and saved != signature:
                # A re-entry changed the input pipeline (source, cache, data root or strategy): the saved
                # iterator does not fit it, so everything else is restored and the input stream starts over.
                changed = sorted(key for key in signature if (saved or {}).get(key) != signature[key])
                log.warning("The input pipeline differs from the one checkpointed (%s); restoring %s without its "
                            "input iterator: the input stream starts over", ", ".join(changed) or "no iterator saved",
                            latest)
                trainer.checkpoint().restore(latest).expect_partial()
            else:
                try:
                    checkpoint.restore(latest).assert_existing_objects_matched()
                except tf.errors.OpError as error:
                    if "DeserializeIterator" not in str(error):
                        raise
                    # The saved iterator is another pipeline's, though no record says so (one lost or damaged).
                    log.warning("The input iterator in %s does not fit this input pipeline (TensorFlow's "
                                "DeserializeIterator refused it); restoring it without the iterator: the input stream "
                                "starts over", latest)
                    iterator = iter(self._input_fn("train", training=True))
                    checkpoint = trainer.checkpoint(iterator)
                    trainer.checkpoint().restore(latest).expect_partial()
            log.info("Resumed from %s at global step %d", latest, trainer.step)
            if not save_input:
                log.warning("The checkpoint holds no input iterator: the input stream starts over at global step %d",
                            trainer.step)
        manager = self._manager(checkpoint, latest)
        if self.chief:
            input_record.note_input(self.checkpoint_dir, trainer.step, signature)
        return iterator, manager

    @logs_above_the_bar
    def train(self, evaluate=True):
        cfg, trainer = self.cfg, self.trainer
        iterator, manager = self._resume_training()
        self.clock.lap("input_fn")
        start = step = trainer.step
        target = cfg.trainer.train_steps
        if step >= target:
            log.info("Global step %d already reaches trainer.train_steps=%d; nothing to train", step, target)
        profiler = review.Profiler(cfg.trainer.profile_steps if self.chief else None, self.model_dir / "train")
        # Loops end on every log, checkpoint and evaluation step, so these land as they would step by step.
        intervals = [cfg.trainer.log_every, cfg.trainer.checkpoint_every]
        intervals += [cfg.trainer.eval_every] if evaluate else []
        window = []
        progress = tqdm(total=target, initial=step, desc="train", unit="step", dynamic_ncols=True)
        try:
            # The first batch this run trains on, read from the training iterator itself, which stays where it was.
            if step < target and self.summaries.enabled:
                shown = review.training_batch(iterator, trainer.preprocess, step)
                if shown is not None:
                    self.summaries.inputs(*shown, self.spec, step)
            if evaluate and 0 < step < target and step % cfg.trainer.eval_every == 0 and not self._evaluated(step):
                log.info("Redoing the evaluation at global step %d, which was interrupted", step)
                self.evaluate()
            while step < target:
                profiler.update(step)
                length = profiler.loop_length(step, loop_length(step, trainer.steps_per_loop, target, intervals))
                # A signal waits for the loop's end (experiments/run_dir/interrupts.py): the loop, its summary and its
                # checkpoint are one unit, so no step is trained without its summary or saved half-logged.
                with interrupts.deferred():
                    with profiler.step(step):
                        loop = trainer.train_loop(iterator, length)
                    step = self._after_loop(loop, window, manager, progress)
                if evaluate and step % cfg.trainer.eval_every == 0 and step < target:
                    self.evaluate()
        except KeyboardInterrupt:
            # Nothing is lost on Ctrl-C or SIGTERM (experiments/run_dir/interrupts.py): the step reached so far is saved.
            # A signal is handled between loops, and every batch a loop took was trained on, so the global
            # step, the weights and the iterator position agree.
            step = trainer.step
            if step > 0:
                self._log_train(window, step)
                if manager.latest_checkpoint != self._checkpoint_path(step):
                    self._save_finite(manager, step)
                log.warning("Interrupted at global step %d; saved a checkpoint to resume from", step)
            raise
        except tf.errors.InvalidArgumentError as error:
            failed = re.search(rf"(\d+ {unreadable.FAILED_IN_A_ROW})", error.message)
            if failed is None:
                raise
            self._note_unreadable()
            raise DatasetError(f"{failed.group(1)} in training, at global step {trainer.step}: the image files "
                               f"are not what dataset={self.spec.name} reads (listed in skipped.csv)") from None
        finally:
            profiler.close()
            progress.close()
        if evaluate and (step > start or not self._evaluated(step)):  # done already if interrupted after it
            self.evaluate()

    def _after_loop(self, loop, window, manager, progress):
        """Logs, checks and saves what a train loop did; returns the global step it reached."""
        cfg, step = self.cfg, self.trainer.step
        if not self.clock.logged:
            self.clock.first_step(loop.steps)
            xla_cache.publish()  # the train step's compiled program is whole now: the next run may load it
        window.append(loop)
        self._check_finite(loop, step)
        progress.update(loop.steps)
        progress.set_postfix(loss=f"{loop.loss:.4f}",
                             examples_per_sec=f"{cfg.pipeline.batch_size * loop.steps / loop.seconds:.0f}")
        if step % cfg.trainer.log_every == 0 or step == cfg.trainer.train_steps:
            self._log_train(window, step)
        if step % cfg.trainer.checkpoint_every == 0 or step == cfg.trainer.train_steps:
            self._save_finite(manager, step)
        return step

    def _checkpoint_path(self, step):
        return str(self.save_dir / f"ckpt-{step}")

    def _evaluated(self, step):
        """Whether metrics.json holds an evaluation at `step`, so an interrupted one is redone and a done one not."""
        return evaluated_step(self.model_dir) == step

    def _check_finite(self, loop, step):
        if loop.nonfinite:
            log.warning("Skipped %d training step(s) with a non-finite loss or gradient norm, up to global step %d",
                        loop.nonfinite, step)
        in_a_row = loop.nonfinite_in_a_row
        if in_a_row >= self.trainer.max_nonfinite_steps:
            what = (f"{in_a_row} training steps in a row had a non-finite loss or gradient norm, the last at global "
                    f"step {step}; none was applied" if in_a_row > 1 else
                    f"training step {step} had a non-finite loss or gradient norm and was not applied")
            raise NonFiniteLossError(f"{what}; stopping ({self._last_checkpoint_text()})")

    def _save_finite(self, manager, step):
        # Skipped updates keep the weights finite; this guards the checkpoint against anything else.
        if not self.trainer.all_finite():
            raise NonFiniteLossError(f"the model or optimizer holds non-finite values at global step {step}; not "
                                     f"saving ({self._last_checkpoint_text()})")
        self._save(manager, step)

    def _log_train(self, window, step):
        if not window:
            return
        loops = LoopStats.merge(window)
        window.clear()
        values = {"loss": loops.loss,
                  "learning_rate": self.trainer.learning_rate,
                  "examples_per_sec": self.cfg.pipeline.batch_size * loops.steps / loops.seconds,
                  # The share of train time spent waiting for batches (experiments/trainer.py defines it per loop).
                  "input_wait_fraction": loops.input_wait_fraction,
                  "nonfinite_steps": loops.nonfinite}
        if len(loops.logits):
            values.update(metrics.evaluate(self.spec.task, self.spec.class_names, loops.labels, loops.logits))
        self.summaries.scalars("train", values, step)
        self._note_unreadable()
        # The window's pace (the first one includes the trace) over the steps still to go.
        target = self.cfg.trainer.train_steps
        log.info("step %d/%d: loss %.4f, %.1f examples/s, input_wait_fraction %.3f, ETA %s", step, target,
                 values["loss"], values["examples_per_sec"], values["input_wait_fraction"],
                 _duration(loops.seconds / loops.steps * max(target - step, 0)))
