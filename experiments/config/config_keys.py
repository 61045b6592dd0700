"""Every config key, declared once: its check, its re-entry rule and the typed attribute the code reads.

One frozen dataclass per config group (`Dataset`, `Model`, `Pipeline`, `Trainer`, ...), and `Config` for the
run's top-level keys and its groups. A field is a key, declared on one line:

    train_steps: int = key(integer(1), RUN_CONTROL)

- its annotation is the type of the attribute (`settings.trainer.train_steps` is an int);
- its check (a `Key`: ``integer(1)``, ``one_of(...)``, ``_with_null(key, "what null means")``) is what
  experiments/config/schema.py holds the config's value to, before TensorFlow starts;
- its re-entry rule says whether a re-entry (experiments/run_dir/reentry.py) may change it: FIXED (the saved
  config's value holds; the default), RUN_CONTROL (the command line may change it) or EVALUATION (it may change
  for mode=evaluate|predict|export only);
- where the key turns on a training recipe, its `Recipe`: a value that turns it on and the kinds of task it fits.

A key that only some datasets, models or strategies have is an `option`, None where the chosen one lacks it;
which ones have it is their line's options (TASKS in data/__init__.py, BUILDERS in models/__init__.py,
STRATEGIES here). Everything else is derived from these declarations: `KEYS`, `OPTION_KEYS` and `STRATEGY_KEYS`
(the schema's tables), `REENTRY` (re-entry's rules), `RECIPES` (the schema's check of a recipe against the dataset,
and the combination matrix, tests/matrix.py) and `Settings` (experiments/config/settings.py). So adding a key touches
its conf/ YAML file and its field here, nothing else.

Nothing here imports TensorFlow.
"""
import dataclasses
import enum
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tf_harness.data import INPUTS, TASKS
from tf_harness.data.tfrecords.layout import ENCODINGS
from tf_harness.experiments.config import graph_optimizer
from tf_harness.models import BUILDERS, MERGES


# The checks ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Key:
    """One key's declared type and allowed values; `choices`, the values of a key that takes one of a few names."""

    allowed: str  # what the error message says is allowed
    accepts: Callable[[Any], bool]
    choices: tuple = ()


def _with_null(key, null):
    """`key`, also accepting null, which means `null` (a few words)."""
    if null is None:
        return key
    return Key(f"{key.allowed}, or null ({null})", lambda value: value is None or key.accepts(value))


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(low=None, high=None, null=None) -> Key:
    """An int in [low, high]; either bound may be open-ended (None)."""
    allowed = (f"an integer in {low}..{high}" if low is not None and high is not None
               else f"an integer >= {low}" if low is not None else "an integer")
    key = Key(allowed, lambda value: _is_int(value) and (low is None or value >= low)
              and (high is None or value <= high))
    return _with_null(key, null)


def number(low, high=None, low_open=False, high_open=False, null=None) -> Key:
    """A finite int or float between `low` and `high` (inclusive unless open)."""
    if high is None:
        allowed = f"a number {'>' if low_open else '>='} {low}"
    else:
        allowed = f"a number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"

    def accepts(value):
        return (_is_number(value) and (value > low if low_open else value >= low)
                and (high is None or (value < high if high_open else value <= high)))

    return _with_null(Key(allowed, accepts), null)


def one_of(*choices) -> Key:
    return Key(f"one of {'|'.join(choices)}", lambda value: isinstance(value, str) and value in choices, choices)


class Names:
    """A Key taking the names of a registry (TASKS, BUILDERS), read when a value is checked."""

    def __init__(self, registry):
        self.registry = registry

    @property
    def allowed(self) -> str:
        return f"one of {'|'.join(self.registry)}"

    def accepts(self, value) -> bool:
        return isinstance(value, str) and value in self.registry


FLAG = Key("true or false", lambda value: isinstance(value, bool))
PATH = Key("a path", lambda value: isinstance(value, str) and bool(value))
# Checked here so that a typo in dataset.root fails in a second, not after TensorFlow starts.
DATA_ROOT = _with_null(Key("an existing directory",
                           lambda value: isinstance(value, str) and Path(value).expanduser().is_dir()),
                       "the embedded sample")


def integers(low=1, length=None) -> Key:
    """A non-empty list of ints >= `low`, of exactly `length` items when given."""
    allowed = f"a list of {length or 'one or more'} integers >= {low}"

    def accepts(value):
        return (isinstance(value, list) and len(value) == (length or len(value)) and len(value) > 0
                and all(_is_int(item) and item >= low for item in value))

    return Key(allowed, accepts)


# The fewest bootstrap resamples that leave one beyond each bound of a percentile interval of 95 in 100 (one in
# 40 on each side): with fewer, a bound is the most extreme resample, and the interval may miss the estimate.
MIN_RESAMPLES = 40
BOOTSTRAP = Key(f"0 (no intervals) or an integer >= {MIN_RESAMPLES} (a 95% interval needs a resample beyond each "
                f"bound)", lambda value: _is_int(value) and (value == 0 or value >= MIN_RESAMPLES))

PROFILE_STEPS = _with_null(Key("[start, stop]: two integers with 0 <= start < stop",
                               lambda value: integers(0, length=2).accepts(value) and value[0] < value[1]),
                           "no profile")

# A tf.data service dispatcher's address, in form only (data/service.py uses the same pattern and checks that
# something answers there once TensorFlow runs).
SERVICE_ADDRESS = re.compile(r"grpc://(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def _is_service_address(value):
    match = SERVICE_ADDRESS.fullmatch(value) if isinstance(value, str) else None
    return match is not None and 1 <= int(match["port"]) <= 65535


SERVICE = _with_null(Key("grpc://host:port (a port in 1..65535)", _is_service_address), "decode locally")


def _range(value, low, high, low_open=False) -> bool:
    """`value` is [low', high'] with low' <= high', both finite and within `low`..`high`."""
    return (isinstance(value, list) and len(value) == 2 and all(_is_number(item) for item in value)
            and value[0] <= value[1] and (value[0] > low if low_open else value[0] >= low) and value[1] <= high)


# data/preprocessing.py `random_resized_crop`: a share of the area, and width / height.
CROP = _with_null(Key("{scale: [low, high], ratio: [low, high]} (either may be left out, not both) with "
                      "0 < low <= high <= 1 for scale and 0 < low <= high for ratio",
                      lambda value: isinstance(value, dict) and any(part is not None for part in value.values())
                      and set(value) <= {"scale", "ratio"}
                      and all(value[part] is None or _range(value[part], 0, limit, low_open=True)
                              for part, limit in (("scale", 1), ("ratio", math.inf)) if part in value)),
                  "no crop")

IMAGE_SIZE = Key("an integer >= 1 (a square side) or [height, width]",
                 lambda value: integer(1).accepts(value) or integers(1, length=2).accepts(value))

TRAINING_MODES = ("train_and_evaluate", "train")
EVALUATION_MODES = ("evaluate", "predict", "export")  # read a checkpoint of a recorded run
SIDECAR_MODE = "continuous_eval"  # experiments/sidecar.py
MODES = (*TRAINING_MODES, *EVALUATION_MODES, SIDECAR_MODE)
SPLIT_MODES = ("evaluate", "predict")  # take `split`
EVALUATING_MODES = ("train_and_evaluate", "evaluate", SIDECAR_MODE)  # a job of these reports a validation metric
CHECKPOINT = Key("latest, best or a global step >= 0",
                 lambda value: value in ("latest", "best") or integer(0).accepts(value))
METRIC = _with_null(Key("a metric name", lambda value: isinstance(value, str) and bool(value)),
                    "the dataset's headline metric")


def _compiles(text) -> bool:
    try:
        re.compile(text)
    except re.error:
        return False
    return True


# A regular expression, compiled here: an invalid one is a config error before TensorFlow starts.
REGEX = Key("a regular expression", lambda value: isinstance(value, str) and _compiles(value))
MULTIPLIERS = Key("a mapping of regular expressions to factors > 0, e.g. {tower: 0.1}",
                  lambda value: isinstance(value, dict) and all(
                      REGEX.accepts(rule) and _is_number(factor) and factor > 0 for rule, factor in value.items()))
PRETRAINED = Key("imagenet or an existing .h5 file", lambda value: value == "imagenet" or (
    isinstance(value, str) and value.endswith(".h5") and Path(value).expanduser().is_file()))


# The declarations ------------------------------------------------------------------------------------------------
class Reentry(enum.Enum):
    """Whether a re-entry of a recorded run directory may change a key (docs/run-directory.md)."""

    FIXED = "fixed"  # the saved config's value holds; a change is a config error
    RUN_CONTROL = "run control"  # the command line may change it
    EVALUATION = "evaluation"  # may change for mode=evaluate|predict|export only: training depends on it


FIXED, RUN_CONTROL, EVALUATION = Reentry.FIXED, Reentry.RUN_CONTROL, Reentry.EVALUATION


@dataclass(frozen=True)
class Recipe:
    """A training recipe that a key turns on: `on`, a value that turns it on (tests/matrix.py trains every
    dataset, model family and dtype with every recipe that fits, at this value); `fits`, the kinds of task
    (SPEC.task) it is for where it is not for every one, and `why` (a few words: what it does that only they take).
    Set on a dataset of another kind, it is a config error (experiments/config/schema.py)."""

    on: Any
    fits: tuple = ()
    why: str = ""


def key(check, reentry=FIXED, only_under=None, recipe=None):
    """A key every run has: `check` its value, `reentry` its rule; `only_under`, (another key, its value): the one
    choice under which it acts, so that set away from its default under any other it is a config error;
    `recipe`, the training recipe it turns on (a `Recipe`)."""
    return field(metadata={"check": check, "reentry": reentry, "only_under": only_under, "recipe": recipe})


def option(check, having: Callable[[str], tuple], reentry=FIXED):
    """A key that only some of a group's choices have (`having(name)`: the options of choice `name`): None where
    the chosen one lacks it."""
    return field(default=None, metadata={"check": check, "reentry": reentry, "having": having})


# The strategies (conf/strategy/<name>.yaml, experiments/config/strategies.py), each with the keys only it has.
STRATEGIES = {"auto": (), "one_device": (), "mirrored": ("logical_cpus", "logical_gpus", "logical_gpu_mb"),
              "multi_worker": ()}


_MIXES = "it mixes one-class labels into class distributions"


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """evaluation.*: the bootstrap intervals of each evaluation's record (conf/config.yaml)."""

    bootstrap: int = key(BOOTSTRAP, RUN_CONTROL)


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """pipeline.*: how examples are read and batched (conf/pipeline/default.yaml)."""

    batch_size: int = key(integer(1), EVALUATION)
    image_size: int | tuple = key(IMAGE_SIZE)
    cache: str = key(one_of("none", "memory", "disk"), RUN_CONTROL)
    image_table_mb: float = key(number(0))
    source: str = key(one_of("files", "tfrecord"), RUN_CONTROL)
    dtype: str = key(one_of("float32", "float16", "bfloat16"))
    augment: bool = key(FLAG)
    random_resized_crop: Mapping | None = key(CROP, recipe=Recipe({"scale": [0.25, 1]}))
    mixup_alpha: float = key(number(0), recipe=Recipe(0.2, ("multiclass",), _MIXES))
    cutmix_alpha: float = key(number(0), recipe=Recipe(1.0, ("multiclass",), _MIXES))
    shuffle_buffer: int | None = key(integer(1, null="as many as pipeline.shuffle_mb holds"))
    shuffle_mb: float = key(number(0, low_open=True))
    verify_images: bool = key(FLAG)
    service: str | None = key(SERVICE, RUN_CONTROL)
    service_timeout: float | None = key(number(0, low_open=True, null="wait for the service's batches however long"),
                                        RUN_CONTROL)


@dataclass(frozen=True, kw_only=True)
class EarlyStopping:
    """trainer.early_stopping.*"""

    patience: int | None = key(integer(0, null="no early stopping"), recipe=Recipe(2))
    min_delta: float = key(number(0))


@dataclass(frozen=True, kw_only=True)
class Trainer:
    """trainer.*: the step budget, intervals, optimizer and recipes (conf/trainer/default.yaml)."""

    train_steps: int = key(integer(1), RUN_CONTROL)
    eval_every: int = key(integer(1), RUN_CONTROL)
    eval_steps: int | None = key(integer(1, null="the whole validation split"), RUN_CONTROL)
    eval_timeout: float | None = key(number(0, low_open=True, null="wait for the final step however long"),
                                     RUN_CONTROL)
    checkpoint_every: int = key(integer(1), RUN_CONTROL)
    keep_checkpoints: int = key(integer(1))
    checkpoint_input: bool = key(FLAG)
    log_every: int = key(integer(1), RUN_CONTROL)
    steps_per_loop: int | None = key(integer(1, null="10 with a GPU or TPU, 1 on CPU alone"), RUN_CONTROL)
    fetch_ahead: bool | None = key(_with_null(FLAG, "on with a GPU or TPU and one replica"), RUN_CONTROL)
    jit_compile: bool | None = key(_with_null(FLAG, "XLA with a GPU and one replica, unless deterministic"),
                                   RUN_CONTROL)
    graph_optimizer: Mapping | None = key(_with_null(Key(graph_optimizer.ALLOWED, graph_optimizer.accepts),
                                                     graph_optimizer.NULL), RUN_CONTROL)
    max_nonfinite_steps: int = key(integer(1))
    clip_global_norm: float | None = key(number(0, low_open=True, null="no clipping"), recipe=Recipe(1.0))
    accumulate_steps: int = key(integer(1), recipe=Recipe(2))
    freeze: str | None = key(_with_null(REGEX, "every variable trains"), recipe=Recipe("bias$"))
    lr_multipliers: Mapping | None = key(_with_null(MULTIPLIERS, "all at the learning rate"),
                                         recipe=Recipe({"kernel": 0.5}))
    keep_best: bool = key(FLAG, recipe=Recipe(True))
    best_metric: str | None = key(METRIC)
    best_mode: str | None = key(_with_null(one_of("max", "min"), "follows trainer.best_metric: min for loss, else max"))
    early_stopping: EarlyStopping
    objective: str = key(one_of("last", "best"))
    ema_decay: float | None = key(number(0, 1, high_open=True, null="no moving average"), recipe=Recipe(0.9))
    profile_steps: tuple | None = key(PROFILE_STEPS, RUN_CONTROL)
    label_smoothing: float = key(number(0, 1, high_open=True),
                                 recipe=Recipe(0.1, ("multiclass",), "it smooths a softmax over classes"))
    class_weights: str | None = key(_with_null(one_of("balanced"), "every example weighs 1"),
                                    recipe=Recipe("balanced", ("multilabel",),
                                                  "it weighs each label's positives in a sigmoid loss"))
    optimizer: str = key(one_of("adam", "adamw", "sgd"))
    learning_rate: float = key(number(0, low_open=True))
    momentum: float = key(number(0, 1, high_open=True), only_under=("trainer.optimizer", "sgd"))
    weight_decay: float = key(number(0), only_under=("trainer.optimizer", "adamw"))
    schedule: str = key(one_of("constant", "cosine", "step"))
    warmup_steps: int = key(integer(0), only_under=("trainer.schedule", "cosine"))
    decay_steps: int = key(integer(1), only_under=("trainer.schedule", "step"))
    decay_rate: float = key(number(0, 1, low_open=True), only_under=("trainer.schedule", "step"))
    init_checkpoint: str | None = key(_with_null(PATH, "no warm start"))
    init_exclude: str | None = key(_with_null(Key("a regular expression", lambda value: isinstance(value, str)),
                                              "none"))


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """sweep.*: a stored study's trials (conf/config.yaml)."""

    pruner: str | None = key(_with_null(one_of("median", "hyperband"), "no pruning"))


@dataclass(frozen=True, kw_only=True)
class TFRecord:
    """tfrecord.*: where TFRecord shards are written and read (conf/config.yaml)."""

    dir: str = key(PATH)
    encoding: str = key(one_of(*ENCODINGS))
    shard_mb: float = key(number(0, low_open=True))
    min_shards_per_worker: int = key(integer(1))
    cycle_length: int = key(integer(1))


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """dataset.*: what is read (conf/dataset/<name>.yaml); its options are its line's in TASKS."""

    name: str = key(Names(TASKS))
    root: str | None = key(DATA_ROOT, RUN_CONTROL)
    flip: bool = key(FLAG)
    normalize: str = key(one_of("unit_range", "per_image_standardization"))
    resize: str = key(one_of("resize", "crop_or_pad"))
    crop_fraction: float | None = key(number(0, 1, low_open=True, null="no crop"))
    max_skipped_fraction: float = key(number(0, 1))
    validation_fraction: float | None = option(number(0, 1, low_open=True, high_open=True), TASKS.options)
    test_fraction: float | None = option(number(0, 1, high_open=True), TASKS.options)
    eval_pairs: str | None = option(one_of("dev_test", "pairs"), TASKS.options, EVALUATION)
    fold: int | None = option(integer(0, 9, null="all ten folds"), TASKS.options, EVALUATION)


@dataclass(frozen=True, kw_only=True)
class Model:
    """model.*: the network (conf/model/<name>.yaml); its options are its family's in BUILDERS."""

    name: str = key(Names(BUILDERS))
    inputs: str = key(one_of(*INPUTS))
    batch_norm_momentum: float | None = option(number(0, 1), BUILDERS.options)
    pretrained: str | None = option(_with_null(PRETRAINED, "from scratch"), BUILDERS.options)
    filters: tuple | None = option(integers(1, length=5), BUILDERS.options)
    dense_units: int | None = option(integer(1), BUILDERS.options)
    dropout: float | None = option(number(0, 1, high_open=True), BUILDERS.options)
    merge: str | None = option(one_of(*MERGES), BUILDERS.options)
    widths: tuple | None = option(integers(1), BUILDERS.options)
    embedding_size: int | None = option(integer(1), BUILDERS.options)
    head_units: int | None = option(integer(1), BUILDERS.options)


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """strategy.*: the tf.distribute strategy (conf/strategy/<name>.yaml), which a re-entry may change whole."""

    name: str = key(one_of(*STRATEGIES), RUN_CONTROL)
    logical_cpus: int | None = option(integer(1), lambda name: STRATEGIES.get(name, ()), RUN_CONTROL)
    logical_gpus: int | None = option(integer(1, null="one replica on each GPU"), lambda name: STRATEGIES.get(name, ()),
                                      RUN_CONTROL)
    logical_gpu_mb: int | None = option(integer(1), lambda name: STRATEGIES.get(name, ()), RUN_CONTROL)


@dataclass(frozen=True, kw_only=True)
class Config:
    """The run's top-level keys, and its groups."""

    mode: str = key(one_of(*MODES), RUN_CONTROL)
    checkpoint: str | int = key(CHECKPOINT, RUN_CONTROL)
    heatmaps: int = key(integer(0), RUN_CONTROL)
    split: str | None = key(_with_null(one_of("validation", "test"),
                                       "validation for evaluate, for predict the test split where there is one"),
                            RUN_CONTROL)
    seed: int = key(integer(0, 2**32 - 1))
    deterministic: bool = key(FLAG)
    evaluation: Evaluation
    pipeline: Pipeline
    trainer: Trainer
    sweep: Sweep
    tfrecord: TFRecord
    dataset: Dataset
    model: Model
    strategy: Strategy


# What is derived from them ---------------------------------------------------------------------------------------
def _is_group(kind) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def declarations(group=Config, prefix="") -> dict:
    """{dotted key: its dataclass field} for every key of `group` and of the groups within it, in their order."""
    found = {}
    for declared in dataclasses.fields(group):
        if _is_group(declared.type):
            found.update(declarations(declared.type, f"{prefix}{declared.name}."))
        else:
            found[f"{prefix}{declared.name}"] = declared
    return found


DECLARED = declarations()
# The keys every run has, by full name; the keys only some datasets or models have; each strategy's own keys.
KEYS = {name: declared.metadata["check"] for name, declared in DECLARED.items() if "having" not in declared.metadata}
OPTION_KEYS = {name: declared.metadata["check"] for name, declared in DECLARED.items()
               if "having" in declared.metadata and name.partition(".")[0] in ("dataset", "model")}
STRATEGY_KEYS = {name: {f"strategy.{option}": DECLARED[f"strategy.{option}"].metadata["check"] for option in options}
                 for name, options in STRATEGIES.items()}
# Each key's re-entry rule.
REENTRY = {name: declared.metadata["reentry"] for name, declared in DECLARED.items()}
# The keys that act under one choice of another key alone: {key: (that key, its value)}.
ONLY_UNDER = {name: declared.metadata["only_under"] for name, declared in DECLARED.items()
              if declared.metadata.get("only_under")}
# The training recipes, by the key that turns each on: {key: Recipe}.
RECIPES = {name: declared.metadata["recipe"] for name, declared in DECLARED.items() if declared.metadata.get("recipe")}


def is_group(value) -> bool:
    """Whether `value` is an object of a group declared here."""
    return _is_group(type(value))


def has(group, name) -> bool:
    """Whether the config of `group` (a group's object) holds `name`: each of its keys and groups, but an option
    only where the group's chosen name has it."""
    declared = {declared.name: declared for declared in dataclasses.fields(group)}.get(name)
    if declared is None:
        return False
    having = declared.metadata.get("having")
    return having is None or name in having(group.name)


def _takes_float(kind) -> bool:
    return kind is float or float in typing.get_args(kind)


def _typed(value, kind=None):
    """A config value as its declared attribute holds it: lists as tuples, mappings read-only, a number declared
    float as a float."""
    if isinstance(value, list):
        return tuple(_typed(item) for item in value)
    if isinstance(value, dict):
        return types.MappingProxyType({name: _typed(item) for name, item in value.items()})
    if _takes_float(kind) and _is_number(value):
        return float(value)
    return value


def build(group, values: Mapping):
    """An object of `group` from `values`, the group's keys as the checked config holds them (resolved, plain)."""
    given = {}
    for declared in dataclasses.fields(group):
        if _is_group(declared.type):
            given[declared.name] = build(declared.type, values[declared.name])
        elif declared.name in values:
            given[declared.name] = _typed(values[declared.name], declared.type)
        elif "having" not in declared.metadata:
            raise KeyError(f"the config has no {declared.name}, a key of {group.__name__} "
                           f"(experiments/config/config_keys.py)")
    return group(**given)


def plain(value):
    """An attribute's value as the config writes it: tuples as lists, mappings as dicts, a group as the dict of the
    keys its config holds."""
    if is_group(value):
        return {declared.name: plain(getattr(value, declared.name)) for declared in dataclasses.fields(value)
                if has(value, declared.name)}
    if isinstance(value, tuple):
        return [plain(item) for item in value]
    if isinstance(value, Mapping):
        return {name: plain(item) for name, item in value.items()}
    return value
