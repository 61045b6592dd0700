"""One assembly for every role: `assemble` builds a run from its settings, in the order a run takes them (the
strategy and precision, the run directory claimed, the data indexed once, the Trainer, the run's first files, its
summaries, evaluator and recipes), and each role's main differs only in what it does with the `Run` it gets.

The mains are experiments/runner.py `train` (mode=train_and_evaluate and train), experiments/checkpoint_modes.py
`main` (evaluate, predict and export) and experiments/sidecar.py `main` (continuous_eval). What differs between
the roles as a run is assembled (the strategy, the claim, the checks of a built model, the event files, whether
the process writes the run's files) is its `Role`, declared beside its main.
"""
import dataclasses
import logging
from pathlib import Path

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
from tf_harness.experiments.config.config_keys import TRAINING_MODES
from tf_harness.experiments.config.settings import Job, Settings
from tf_harness.experiments.evaluator import Evaluator
from tf_harness.experiments.run_dir import interrupts
from tf_harness.experiments.run_dir.directory import RunDirectory, claim
from tf_harness.experiments.startup import StartupClock
from tf_harness.experiments.summaries import Summaries
from tf_harness.experiments.training import class_weights, recipes, xla_cache
from tf_harness.experiments.training.trainer import Trainer, accelerated, resolve_jit_compile

log = logging.getLogger(__name__)
_POLICIES = {"float32": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}


class Role:
    """How a role's run is assembled. The defaults are a process in the run's strategy that holds the run lock and
    reads its splits as its mode does; experiments/runner.py, checkpoint_modes.py and sidecar.py each declare the
    role of their main."""
    beside = False  # the sidecar evaluator, beside the process that trains the run (experiments/evaluator.py)

    def strategy(self, settings: Settings) -> tf.distribute.Strategy:
        """The tf.distribute strategy this process runs in: settings.strategy's."""
        return strategies.make_strategy(settings.strategy)

    def claim(self, settings: Settings, model_dir: Path) -> RunDirectory:
        """The run directory, claimed before anything is written (experiments/run_dir/directory.py `claim`: the
        run lock, a killed run's leftovers, the refusals of a start that could not go on)."""
        return claim(settings, model_dir)

    def start_line(self, model_dir: Path) -> str:
        """The start's last log line, which names the run directory."""
        return f"Run directory: {model_dir}"

    def share(self, run_dir: RunDirectory, strategy) -> bool:
        """Whether this process writes the run's files: under multi_worker the chief alone (`share`)."""
        return share(run_dir, strategy)

    def reads(self, mode: str) -> str:
        """The mode whose splits' damaged shards are counted as the data is indexed."""
        return mode

    def check_model(self, settings: Settings, run_dir: RunDirectory, trainer: Trainer) -> None:
        """What makes the start a config error once the model is built, before the run's first files."""

    def events(self, mode: str, writes: bool) -> tuple:
        """The splits whose event files this process writes in `mode` (`writes`: whether it writes the run's)."""
        raise NotImplementedError


@dataclasses.dataclass
class Run:
    """A run as `assemble` builds it, for its role's main to use."""
    settings: Settings
    clock: StartupClock  # the start-up clock, whose line the training main logs after its first loop
    strategy: tf.distribute.Strategy
    run_dir: RunDirectory
    writes: bool  # whether this process writes the run's files (skipped.csv, train/, the HParams record)
    task: object  # the dataset's Task (data/task.py)
    pipeline: object  # its InputPipeline settings
    tables: dict  # each split's table, indexed once
    trainer: Trainer
    summaries: Summaries
    note_unreadable: "UnreadableFiles"
    evaluator: Evaluator
    recipes: recipes.Recipes  # the best checkpoint, early stopping, and trainer.objective: last or best

    @property
    def model_dir(self) -> Path:
        return self.run_dir.model_dir

    def close(self):
        """The summaries closed; returns (the job's objective: trainer.objective, last or best, a sweeper
        optimises; the final metrics: the last evaluation's, with the global step reached)."""
        self.summaries.close()
        last = self.evaluator.last_values
        return self.recipes.objective(last), {**last, "global_step": self.trainer.step}


def assemble(settings: Settings, job: Job, role: Role) -> Run:
    """The run of `job` with `settings`, as `role` assembles it: nothing is written before the run directory is
    claimed, and a model this config cannot build is a config error that leaves no file of the run."""
    # Settings ---------------------------------------------------------------------------------------------------
    clock = StartupClock()
    fresh_state(settings)
    strategy = role.strategy(settings)
    policy = precision(settings, strategy)

    # Run directory: claim it ------------------------------------------------------------------------------------
    # From here on SIGINT and SIGTERM end the run once what it did is saved (exit 130/143).
    interrupts.install()
    run_dir = role.claim(settings, Path(job.run_dir))
    xla_cache.report()
    log_start(settings, strategy, policy, role.start_line(run_dir.model_dir))
    writes = role.share(run_dir, strategy)

    # Data: index once, in Python; everything per example happens in tf.data -----------------------------------
    task, pipeline = settings.task(), settings.input_pipeline()
    tables, skipped = index(settings, task, pipeline, role.reads(settings.mode), clock)

    # Model: network, optimizer and global step ---------------------------------------------------------------
    trainer = build(settings, task, strategy, clock)
    role.check_model(settings, run_dir, trainer)

    # Outputs: the first files, the summaries, the evaluator, the recipes ----------------------------------------
    first_files(settings, task, tables, skipped, run_dir.model_dir, writes)
    summaries = open_summaries(settings, task, job, run_dir.model_dir, role.events(settings.mode, writes), writes)
    note_unreadable = UnreadableFiles(skipped, run_dir.model_dir, writes)
    note_unreadable()  # what an earlier life of this run found
    evaluator = make_evaluator(settings, task, trainer, tables, pipeline, summaries, run_dir, note_unreadable,
                               beside=role.beside)
    made = recipes.Recipes(settings.trainer, task.SPEC, trainer, run_dir)
    return Run(settings, clock, strategy, run_dir, writes, task, pipeline, tables, trainer, summaries, note_unreadable,
               evaluator, made)


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
    # XLA's own float16 kernels, not TensorFlow's, where the step is compiled as the trainer will resolve it.
    compiled = resolve_jit_compile(settings.trainer.jit_compile, strategy.num_replicas_in_sync, settings.deterministic)
    if policy == "mixed_float16" and settings.mode in TRAINING_MODES and not accelerated() and not compiled:
        log.warning("pipeline.dtype=float16 trains on CPU alone here: TensorFlow's CPU kernel for float16 "
                    "convolution filter gradients is far slower than float32's; bfloat16 trains at float32's "
                    "pace on a CPU, and so does float16 with trainer.jit_compile=true, after a longer first step "
                    "(docs/scaling.md#mixed-precision-on-a-cpu)")
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


def open_summaries(settings, task, job, model_dir, splits, writes) -> Summaries:
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


def make_evaluator(settings, task, trainer, tables, pipeline, summaries, run_dir, note_unreadable,
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
