"""The run's settings: the composed config, once experiments/schema.py has checked it, read into plain values.

`Settings.from_config` is where a run reads its config, and `Job.from_hydra` what Hydra says about the job; every module below the entry points takes these
values instead. The objects the data side needs (the dataset's Task, the input pipeline's settings, the
preprocessing, the TFRecord settings) are built here from them, so no data module sees the config.
Nothing here imports TensorFlow until one of those objects is asked for.
"""
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

_ABSENT = object()


def _plain(value):
    if isinstance(value, dict):
        return Section(value)
    if isinstance(value, list):
        return tuple(_plain(item) for item in value)
    return value


class Section(Mapping):
    """One config group as read-only attributes of plain values: nested groups are Sections, lists tuples."""

    def __init__(self, values: dict):
        object.__setattr__(self, "_values", {key: _plain(value) for key, value in values.items()})

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no setting {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError("settings are read-only")

    def __getitem__(self, key):
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        return f"Section({self.to_dict()!r})"

    def to_dict(self) -> dict:
        """The group as plain dicts and lists, as the config wrote it."""
        def unwrap(value):
            if isinstance(value, Section):
                return value.to_dict()
            if isinstance(value, tuple):
                return [unwrap(item) for item in value]
            return value
        return {key: unwrap(value) for key, value in self._values.items()}


@dataclass(frozen=True)
class Settings:
    """Every setting of one run, as plain values (conf/ documents each key; experiments/schema.py its type)."""

    mode: str
    seed: int
    deterministic: bool
    dataset: Section
    model: Section
    pipeline: Section
    trainer: Section
    strategy: Section
    tfrecord: Section
    values: Section  # the whole config, resolved: for the log, the HParams record and the input record
    checkpoint: str | int = "latest"  # which checkpoint mode=evaluate, predict and export restore
    heatmaps: int = 0  # mode=predict: Grad-CAM overlays of this many highest scores (experiments/heatmaps.py)
    split: str | None = None  # which split mode=evaluate and predict read (None: the mode's own)
    bootstrap: int = 0  # evaluation.bootstrap: resamples behind each interval of metrics_test.json

    @classmethod
    def from_config(cls, cfg) -> "Settings":
        """Reads the composed, checked config once, resolving its interpolations."""
        values = Section(OmegaConf.to_container(cfg, resolve=True))
        return cls(mode=values.mode, seed=int(values.seed), deterministic=bool(values.deterministic),
                   dataset=values.dataset, model=values.model, pipeline=values.pipeline, trainer=values.trainer,
                   strategy=values.strategy, tfrecord=values.get("tfrecord", Section({})), values=values,
                   checkpoint=values.get("checkpoint", "latest"), heatmaps=int(values.get("heatmaps", 0)),
                   split=values.get("split"), bootstrap=int(values.get("evaluation", Section({})).get("bootstrap", 0)))

    def select(self, key, default=_ABSENT):
        """The value at a dotted `key` (``pipeline.cache``, ``strategy``), or `default` when there is none."""
        node = self.values
        for part in key.split("."):
            if not isinstance(node, Section) or part not in node:
                return default
            node = node[part]
        return node.to_dict() if isinstance(node, Section) else node

    def yaml(self) -> str:
        """The config as the run log shows it."""
        return OmegaConf.to_yaml(OmegaConf.create(self.values.to_dict()))

    def task(self):
        """The dataset's Task, with its decode settings, options and loss options (trainer.label_smoothing; the
        positive weights of trainer.class_weights come from the training split: experiments/class_weights.py)."""
        from tf_harness.data import TASKS
        from tf_harness.data.images import Decode, image_size

        settings = self
        task_class = TASKS[settings.dataset.name]
        decode = Decode(image_size(settings.pipeline.image_size), settings.dataset.resize,
                        settings.dataset.crop_fraction)
        task = task_class(decode, settings.seed, **{key: settings.dataset[key] for key in task_class.OPTIONS})
        task.label_smoothing = float(settings.trainer.label_smoothing)
        return task

    def tfrecords(self):
        """Where TFRecord shards are written and read (tfrecord.*)."""
        from tf_harness.data.tfrecords.layout import TFRecordSettings

        settings = self
        return TFRecordSettings(Path(settings.tfrecord.dir).expanduser(), settings.tfrecord.encoding,
                                float(settings.tfrecord.shard_mb), int(settings.tfrecord.min_shards_per_worker),
                                int(settings.tfrecord.cycle_length), settings.dataset.root)

    def input_pipeline(self):
        """What input_fn reads (pipeline.*, seed, deterministic)."""
        from tf_harness.data.input_fn import Pipeline

        settings = self
        return Pipeline(int(settings.pipeline.batch_size), settings.pipeline.cache, settings.pipeline.shuffle_buffer,
                        float(settings.pipeline.shuffle_mb), settings.seed, settings.deterministic,
                        self.tfrecords() if settings.pipeline.source == "tfrecord" else None,
                        settings.pipeline.service, float(settings.pipeline.image_table_mb))

    def preprocessing(self):
        """The augmentation and normalisation of a batch (pipeline.augment, random_resized_crop, mixup_alpha and
        cutmix_alpha, dataset.flip and normalize, seed)."""
        from tf_harness.data import TASKS
        from tf_harness.data.preprocessing import Preprocessing

        settings = self
        crop, mixup, cutmix = (settings.pipeline.random_resized_crop, settings.pipeline.mixup_alpha,
                               settings.pipeline.cutmix_alpha)
        return Preprocessing(bool(settings.pipeline.augment), bool(settings.dataset.flip), settings.dataset.normalize,
                             settings.seed, crop=None if crop is None else crop.to_dict(), mixup_alpha=mixup,
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
    trial: object = None  # a job of a stored Optuna study: its experiments/study.py JobTrial (sweep.pruner)

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
        from tf_harness.experiments import study

        return cls(job.run_dir, job.choices, Path(hydra.sweep.dir), tuple(overrides), study.job_trial(hydra))
