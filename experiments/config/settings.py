"""The run's settings: the composed config, once experiments/config/schema.py has checked it, read into typed values.

`Settings.from_config` is where a run reads its config, and `Job.from_hydra` what Hydra says about the job; every
module below the entry points takes these values instead. `Settings` is experiments/config/config_keys.py's `Config`:
each group a frozen dataclass (`settings.trainer.train_steps` is an int), built from the keys' declarations. The
objects the data side needs (the dataset's Task, the input pipeline's settings, the preprocessing, the TFRecord
settings) are built here from them, so no data module sees the config. Nothing here imports TensorFlow until one
of those objects is asked for.
"""
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from tf_harness.experiments.config import config_keys


@dataclass(frozen=True, kw_only=True)
class Settings(config_keys.Config):
    """Every setting of one run, typed as experiments/config/config_keys.py declares each key (conf/ documents them)."""

    @classmethod
    def from_config(cls, cfg) -> "Settings":
        """Reads the composed, checked config once, resolving its interpolations."""
        return config_keys.build(cls, OmegaConf.to_container(cfg, resolve=True))

    def value(self, key, default=None):
        """The value at a dotted `key` (``pipeline.cache``; a group, ``strategy``, as a dict) as the config writes
        it, or `default` when the config has none."""
        node = self
        for part in key.split("."):
            if not (config_keys.is_group(node) and config_keys.has(node, part)):
                return default
            node = getattr(node, part)
        return config_keys.plain(node)

    def to_dict(self) -> dict:
        """Every key of the config, as plain dicts and lists: for the log and the HParams record."""
        return config_keys.plain(self)

    def yaml(self) -> str:
        """The config as the run log shows it."""
        return OmegaConf.to_yaml(OmegaConf.create(self.to_dict()))

    def task(self):
        """The dataset's Task, with its decode settings, options and loss options (trainer.label_smoothing; the
        positive weights of trainer.class_weights come from the training split:
        experiments/training/class_weights.py)."""
        from tf_harness.data import TASKS
        from tf_harness.data.images import Decode, image_size

        settings = self
        task_class = TASKS[settings.dataset.name]
        decode = Decode(image_size(settings.pipeline.image_size), settings.dataset.resize,
                        settings.dataset.crop_fraction)
        task = task_class(decode, settings.seed, **{key: getattr(settings.dataset, key) for key in task_class.OPTIONS})
        task.label_smoothing = settings.trainer.label_smoothing
        return task

    def tfrecords(self):
        """Where TFRecord shards are written and read (tfrecord.*)."""
        from tf_harness.data.tfrecords.layout import TFRecordSettings

        settings = self
        return TFRecordSettings(Path(settings.tfrecord.dir).expanduser(), settings.tfrecord.encoding,
                                settings.tfrecord.shard_mb, settings.tfrecord.min_shards_per_worker,
                                settings.tfrecord.cycle_length, settings.dataset.root)

    def input_pipeline(self):
        """What input_fn reads (pipeline.*, seed, deterministic)."""
        from tf_harness.data.input_fn import Pipeline

        settings = self
        return Pipeline(settings.pipeline.batch_size, settings.pipeline.cache, settings.pipeline.shuffle_buffer,
                        settings.pipeline.shuffle_mb, settings.seed, settings.deterministic,
                        self.tfrecords() if settings.pipeline.source == "tfrecord" else None,
                        settings.pipeline.service, settings.pipeline.image_table_mb)

    def preprocessing(self):
        """The augmentation and normalisation of a batch (pipeline.augment, random_resized_crop, mixup_alpha and
        cutmix_alpha, dataset.flip and normalize, seed)."""
        from tf_harness.data import TASKS
        from tf_harness.data.preprocessing import Preprocessing

        settings = self
        mixup, cutmix = settings.pipeline.mixup_alpha, settings.pipeline.cutmix_alpha
        return Preprocessing(settings.pipeline.augment, settings.dataset.flip, settings.dataset.normalize,
                             settings.seed, crop=settings.pipeline.random_resized_crop, mixup_alpha=mixup,
                             cutmix_alpha=cutmix,
                             classes=TASKS[settings.dataset.name].SPEC.num_outputs if mixup or cutmix else None)


@dataclass(frozen=True)
class Job:
    """What Hydra says about the job a run is, read once as plain values: where it runs and, in a sweep, what the
    sweep varies. The runner and the HParams record take this, never Hydra's own config."""

    run_dir: Path  # the run directory (hydra.runtime.output_dir): the model_dir
    choices: Mapping  # each config group's chosen option (dataset, model, ...)
    sweep_dir: Path | None = None  # the sweep's folder; None for a single run
    sweep_overrides: tuple = ()  # the sweep's own command line and its sweeper's params, as `key=value` strings
    trial: tuple | None = None  # a job of the harness's sweeper with a stored study: (storage, study, trial number)

    @property
    def single(self) -> bool:
        """Whether the job is a single run (`python run.py`, api.run), not one job of a sweep."""
        return self.sweep_dir is None

    @classmethod
    def from_hydra(cls, hydra=None) -> "Job":
        """The job Hydra runs now (its HydraConfig), or the one `hydra`, Hydra's own settings, describe."""
        from hydra.types import RunMode

        from tf_harness.data.integrity import reading

        if hydra is None:
            from hydra.core.hydra_config import HydraConfig
            hydra = HydraConfig.get()
        job = cls(Path(hydra.runtime.output_dir), dict(hydra.runtime.choices))
        if hydra.mode != RunMode.MULTIRUN:
            return job
        # A job's own overrides hold its values alone: the sweep's command line is in the sweep's multirun.yaml.
        overrides = [f"{key}={value}" for key, value in (hydra.sweeper.get("params") or {}).items()]
        multirun = Path(hydra.sweep.dir) / "multirun.yaml"
        if multirun.is_file():
            overrides += list(OmegaConf.create(reading.read_text(multirun)).hydra.overrides.task)
        # The harness's sweeper with a stored study numbers its trials as the jobs: experiments/sweeps/study.py.
        sweeper = hydra.sweeper
        storage = sweeper.get("storage") if "storage" in sweeper else None
        stored = str(sweeper.get("_target_", "")).endswith(".StudySweeper") and isinstance(storage, str) and storage
        trial = (storage, str(sweeper.get("study_name")), int(hydra.job.num)) if stored else None
        return cls(job.run_dir, job.choices, Path(hydra.sweep.dir), tuple(overrides), trial)
