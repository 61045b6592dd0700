"""The run directory as the main uses it: claimed once, then asked for its resume point, its checkpoints and
what it has evaluated. Each call here is one durability mechanism of this package, named for the main.
"""
import logging
import shutil
from pathlib import Path

from tf_harness.data.errors import ConfigError
from tf_harness.experiments.config.schema import EVALUATION_MODES
from tf_harness.experiments.run_dir import checkpoints, input_record, leftovers, reentry, run_lock

log = logging.getLogger(__name__)


def no_checkpoint(mode, checkpoint_dir) -> ConfigError:
    """The refusal of a mode that reads a checkpoint where there is none."""
    return ConfigError(f"mode={mode} needs a checkpoint in {checkpoint_dir}; train into that run directory first "
                       f"(hydra.run.dir=...)")


def claim(settings, model_dir, evaluator=False) -> "RunDirectory":
    """Claims `model_dir` for this process before anything is written there.

    A trainer (or evaluate, predict, export) takes the run lock (exit 2 naming its holder), removes what a killed
    run left behind, and refuses a start that could not go on: an evaluation without a checkpoint, checkpoints
    none of which can be restored or one that training would overwrite. The sidecar evaluator has taken its own
    lock already (experiments/sidecar.py `start`) and only reads.
    """
    model_dir = Path(model_dir)
    if not evaluator:
        if run_lock.hold(model_dir):  # only the holder may clean up
            leftovers.remove(model_dir)
        if settings.mode in EVALUATION_MODES and not checkpoints.on_disk(model_dir / "checkpoints"):
            # A directory with no checkpoint must not become a recorded run of this mode.
            raise no_checkpoint(settings.mode, model_dir / "checkpoints")
        checkpoints.check_before_start(model_dir / "checkpoints", settings.mode, settings.trainer.train_steps,
                                       reentry.has_hparams(model_dir))
    return RunDirectory(model_dir)


class RunDirectory:
    """A claimed run directory: `model_dir`, its `checkpoints/`, and where this process saves (`save_dir`).

    Every worker of a multi_worker run takes part in saving (the variables are synchronised), but only the
    chief's copy is kept; the others save into a scratch folder and delete it.
    """

    def __init__(self, model_dir):
        self.model_dir = Path(model_dir)
        self.checkpoint_dir = self.model_dir / "checkpoints"
        self.save_dir = self.checkpoint_dir
        self.chief = True

    def set_worker(self, worker) -> None:
        """`worker`: None on the chief, else a non-chief worker's index, whose checkpoints go to a scratch folder."""
        self.chief = worker is None
        self.save_dir = self.checkpoint_dir if self.chief else self.model_dir / f".worker-{worker}-checkpoints"

    def checkpoint_path(self, step) -> str:
        return str(self.save_dir / f"{checkpoints.PREFIX}-{step}")

    def latest(self, whole=False):
        """The newest checkpoint in the run directory (the chief's, for every worker) whose files are all there
        and whose tensors are all finite, found from its files; None when none. `whole`: every tensor reads back,
        the input iterator's included, as a training run restores them all."""
        return checkpoints.newest_finite(self.checkpoint_dir, whole)

    def last_checkpoint_text(self) -> str:
        """Where a stopped run can be resumed from, for its error line."""
        latest = self.latest()
        return "no checkpoint to resume from" if latest is None else f"last checkpoint: {latest}"

    def evaluated(self, step) -> bool:
        """Whether metrics.json holds an evaluation at `step`, so an interrupted one is redone and a done one not."""
        from tf_harness.experiments.evaluation.metrics_history import evaluated_step
        return evaluated_step(self.model_dir) == step

    def saves_input(self, settings, task, context) -> bool:
        """Whether checkpoints hold the training input iterator: trainer.checkpoint_input, unless the pipeline's
        iterator cannot be saved or restored whole (logged)."""
        from tf_harness.data import caching

        if not settings.trainer.checkpoint_input:
            log.info("trainer.checkpoint_input=false: checkpoints leave out the input iterator; a resumed run starts "
                     "its input stream over, from the start of an epoch")
            return False
        if not caching.checkpointable(settings.pipeline.cache, task):
            log.info("pipeline.cache=%s: checkpoints leave out the input iterator (see data/caching.py); a resumed "
                     "run starts its input stream over", settings.pipeline.cache)
            return False
        if context.num_input_pipelines > 1:
            # The chief's checkpoint would hand its own input position and shuffle buffer to every worker.
            log.info("strategy=multi_worker: checkpoints leave out the workers' input iterators; a resumed run "
                     "starts each worker's input stream over")
            return False
        if settings.pipeline.service:
            # The service's workers hold the stream's position and shuffle buffers; no iterator here can save them.
            log.info("pipeline.service: checkpoints leave out the input iterator, whose stream the service's workers "
                     "make; a resumed run starts its input stream over")
            return False
        return True

    def restore(self, latest, trainer, checkpoint, settings, save_input) -> bool:
        """Restores the training state of checkpoint `latest` into `checkpoint` (the trainer's, with the input
        iterator when `save_input`). Returns True when the saved iterator turned out not to fit this pipeline:
        everything else is restored then, and the caller starts the input stream over with a fresh iterator."""
        import tensorflow as tf

        signature = input_record.input_signature(settings, trainer.replicas, save_input)
        known, saved = input_record.saved_input(self.checkpoint_dir, int(latest.rpartition("-")[2]))
        fresh_stream = False
        if known and save_input and saved != signature:
            # A re-entry changed the input pipeline (source, cache, data root or strategy): the saved iterator
            # does not fit it, so everything else is restored and the input stream starts over.
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
                trainer.checkpoint().restore(latest).expect_partial()
                fresh_stream = True
        log.info("Resumed from %s at global step %d", latest, trainer.step)
        if not save_input:
            log.warning("The checkpoint holds no input iterator: the input stream starts over at global step %d",
                        trainer.step)
        return fresh_stream

    def manager(self, checkpoint, restored, trainer, settings, save_input):
        """The checkpoint manager of a training run that resumed from `restored` (None: from scratch). Created once
        the state is restored: it deletes and rewrites none of the checkpoints already there, and refuses to
        start when one of them lies ahead of the restored step (experiments/run_dir/checkpoints.py)."""
        manager = checkpoints.Manager(checkpoint, self.save_dir, max_to_keep=settings.trainer.keep_checkpoints,
                                      step_counter=trainer.global_step, restored=restored,
                                      train_steps=settings.trainer.train_steps, run_checkpoints=self.checkpoint_dir)
        if self.chief:
            input_record.note_input(self.checkpoint_dir, trainer.step,
                                    input_record.input_signature(settings, trainer.replicas, save_input))
        return manager

    def save(self, manager, step) -> None:
        manager.save(checkpoint_number=step)
        if not self.chief:
            shutil.rmtree(self.save_dir, ignore_errors=True)
