"""The sections every role's main takes, in order, each one named call: TensorFlow's state, the precision
policy, the start's log lines, the worker's share of the run directory, the data indexed once, the Trainer built,
the run's first files, its summaries, its evaluator, and the close.

The mains are experiments/runner.py `train` (mode=train_and_evaluate and train), experiments/checkpoint_modes.py
`main` (evaluate, predict and export) and experiments/sidecar.py `main` (continuous_eval). What differs between
the roles (the strategy, the claim, the restore, the loop) stays in the mains; what they share is here.
"""
import logging

import keras
import tensorflow as tf

from tf_harness.data import TASKS
from tf_harness.data.errors import ConfigError
from tf_harness.data.input_fn import input_fn
from tf_harness.data.integrity import unreadable
from tf_harness.data.integrity.skipped import SkipLog
from tf_harness.data.tables import check_skipped, dataset_root, drop_undecodable
from tf_harness.data.tfrecords.reader import check_shards
from tf_harness.experiments.config import strategies
from tf_harness.experiments.evaluator import Evaluator
from tf_harness.experiments.summaries import Summaries
from tf_harness.experiments.training import class_weights
from tf_harness.experiments.training.trainer import Trainer

log = logging.getLogger(__name__)
_POLICIES = {"float32": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}


def fresh_state(settings) -> None:
    """Keras and TensorFlow as a job starts: a clean Keras state (a sweep's jobs share this process), the seed,
    and op determinism with `deterministic`. Comes before the strategy, which comes before any TensorFlow op runs:
    MultiWorkerMirrored configures collective ops, and a mirrored CPU is split into devices, only before the
    runtime starts."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(settings.seed)
    if settings.deterministic:
        tf.config.experimental.enable_op_determinism()


def precision(settings, strategy) -> str:
    """Checks that pipeline.batch_size divides across `strategy`'s replicas (ConfigError), and sets the Keras
    policy of pipeline.dtype (float32 variables, logits and loss: experiments/training/trainer.py); returns the
    policy."""
    replicas = strategy.num_replicas_in_sync
    if settings.pipeline.batch_size % replicas:
        raise ConfigError(f"pipeline.batch_size={settings.pipeline.batch_size} does not divide across {replicas} "
                          f"replicas; use a multiple of {replicas}")
    policy = _POLICIES[settings.pipeline.dtype]
    keras.mixed_precision.set_global_policy(policy)
    return policy


def log_start(settings, strategy, policy, run_dir_line) -> None:
    """The start's lines: the config, the strategy, the precision policy and `run_dir_line`. Logged once the run
    directory is claimed: a start refused there writes nothing to a live run's log."""
    log.info("Config:\n%s", settings.yaml())
    log.info("Strategy %s with %d replica(s)", type(strategy).__name__, strategy.num_replicas_in_sync)
    if policy != "float32":
        log.info("pipeline.dtype=%s: Keras policy %s, float32 variables, logits and loss", settings.pipeline.dtype,
                 policy)
    log.info("%s", run_dir_line)


def share(run_dir, strategy) -> bool:
    """This worker's share of the run directory: under multi_worker only the chief writes its files (the others
    would clash), and the others save into a scratch folder. Returns whether this process is the chief."""
    chief = strategies.is_chief(strategy)
    _, worker = strategies.workers()
    run_dir.set_worker(None if chief else worker)
    return chief


def index(settings, task, pipeline, mode, clock):
    """The data indexed once, in Python (everything per example happens in tf.data): the tables of `task`'s
    splits, their images verified with pipeline.verify_images, and the records of damaged shards of the splits
    `mode` reads. Returns (tables, the run's SkipLog)."""
    skipped = SkipLog()
    tables = task.index(dataset_root(task, settings.dataset.root), skipped)
    clock.lap("index")
    if settings.pipeline.verify_images:
        tables = drop_undecodable(tables, skipped)
        clock.lap("verify")
    check_shards(task, tables, pipeline.tfrecord, mode, skipped)
    return tables, skipped


def build(settings, task, strategy, clock) -> Trainer:
    """The network, optimizer and global step. Built before the run directory holds anything of this run but
    Hydra's files and the lock, so that a model this config cannot build is a config error leaving no folder."""
    trainer = Trainer(settings, task.SPEC, strategy, task.decode.size, loss=task.loss)
    clock.lap("build")
    return trainer


def first_files(settings, task, tables, skipped, model_dir, writes) -> None:
    """The run's first files, once the model is built, where this process `writes` them: skipped.csv (its line
    says how many rows were skipped, and why), then trainer.class_weights' record. Raises DatasetError when too
    many examples were skipped, after skipped.csv, which its error points at."""
    if writes:
        skipped.write(model_dir / "skipped.csv")
    check_skipped(tables, skipped, settings.dataset.max_skipped_fraction)
    class_weights.prepare(settings.trainer.class_weights, task, tables, model_dir, write=writes)


def summaries(settings, task, job, model_dir, splits, writes) -> Summaries:
    """Event writers for `splits` alone, so that a process with no events to write leaves the folder as it was;
    where this process `writes` the run's files, the HParams record, after skipped.csv."""
    opened = Summaries(str(model_dir), splits)
    if writes:
        opened.hparams(settings, task.SPEC, job)
    return opened


class UnreadableFiles:
    """Calling it lists in skipped.csv the image files that the pipelines reported unreadable since the last call
    (data/integrity/unreadable.py), where this process `writes` skipped.csv; the first call lists what an earlier
    life of the run found."""

    def __init__(self, skipped, model_dir, writes):
        self.skipped, self.model_dir, self.writes = skipped, model_dir, writes
        self.reported = {path for path, _ in skipped.rows}  # the unreadable files skipped.csv lists already

    def __call__(self):
        rows = unreadable.collect(unreadable.report_folder(self.model_dir), self.reported)
        if rows and self.writes:
            self.skipped.extend(rows)
            self.skipped.write(self.model_dir / "skipped.csv")


def evaluator(settings, task, trainer, tables, pipeline, summaries, run_dir, note_unreadable,
              beside=False) -> Evaluator:
    """The run's Evaluator, reading each split's evaluation pipeline through data/input_fn.py; `beside`: this is
    the sidecar evaluator (experiments/evaluator.py says what each writes)."""
    def eval_input(split, rows=None):
        return input_fn(task, tables[split], pipeline, split=split, training=False, model_dir=run_dir.model_dir,
                        rows=rows)

    return Evaluator(task, trainer, tables, summaries, run_dir.model_dir, batch_size=settings.pipeline.batch_size,
                     eval_steps=settings.trainer.eval_steps, seed=pipeline.seed, input_fn=eval_input,
                     note_unreadable=note_unreadable, write=run_dir.chief, beside=beside,
                     chosen=settings.checkpoint if settings.mode == "evaluate" else None,
                     bootstrap=settings.evaluation.bootstrap, unit=TASKS.entries[task.SPEC.name].unit)


def close(summaries, evaluator, recipes, trainer):
    """The summaries closed; returns (the job's objective: trainer.objective, last or best, a sweeper optimises;
    the final metrics: the last evaluation's, with the global step reached)."""
    summaries.close()
    last = evaluator.last_values
    return recipes.objective(last), {**last, "global_step": trainer.step}
