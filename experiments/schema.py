"""The type and allowed values of every config key, checked before TensorFlow is imported.

Every leaf key of the composed config has its type declared below, once, on one line:

- ``KEYS``: the keys every run has, by full name (``trainer.*``, ``pipeline.*``, ``tfrecord.*``, ...);
- ``OPTION_KEYS``: the keys only some datasets or models have (``dataset.validation_fraction``);
- ``STRATEGY_KEYS``: the keys of one strategy, by its name: the one list of strategy names.

``MODES`` is the one list of modes. The rest is imported from the TensorFlow-free modules that declare it:
the datasets, whether an example is one image or a pair, and their ``dataset.*`` options from ``TASKS``
(data/__init__.py); the models, what each takes, their ``model.*`` options and siamese_cnn's ``MERGES``
from models/__init__.py; the TFRecord ``ENCODINGS`` from data/tfrecords/layout.py. So a dataset or model
added there is known here with no edit; an option key new to the harness needs its type in OPTION_KEYS.

A key in conf/ that is not declared is itself a config error, and so is a declared key missing
from the composed config, so conf/ and the code cannot drift apart (tests/test_config.py walks them).

Why a check over the composed config rather than Hydra structured configs: the dataset files are
``# @package _global_`` overlays that also set pipeline and trainer keys, ``pipeline.image_size`` is
an int or a [height, width] list (OmegaConf 2.3 has no union types), ranges need checking anyway, and
Hydra's own type errors are raised mid-composition over several lines. Checking here gives one line
per error, naming the key, the value and what is allowed.
"""
import difflib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tf_harness.data import INPUTS, TASKS
from tf_harness.data.tfrecords.layout import ENCODINGS
from tf_harness.models import BUILDERS, MERGES, smallest_side
from tf_harness.experiments import graph_optimizer

MISSING = "???"  # how an unset key's value is shown, as in Hydra's own notation
_UNSET = object()


@dataclass(frozen=True)
class Key:
    """One key's declared type and allowed values."""

    allowed: str  # what the error message says is allowed
    accepts: Callable[[Any], bool]


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
    return Key(f"one of {'|'.join(choices)}", lambda value: isinstance(value, str) and value in choices)


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
CROP = _with_null(Key("{scale: [low, high], ratio: [low, high]} (either may be left out) with 0 < low <= high <= 1 "
                      "for scale and 0 < low <= high for ratio",
                      lambda value: isinstance(value, dict) and set(value) <= {"scale", "ratio"}
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
# The metrics experiments/metrics.py `evaluate` writes at every evaluation, per kind of task (SPEC.task), besides
# `loss`; a multi-label task writes auc/<class> per class too, whose names are checked once TensorFlow runs.
TASK_METRICS = {"multilabel": ("auc/mean",), "binary": ("accuracy", "auc"), "multiclass": ("accuracy", "top5_accuracy")}
# A regular expression, compiled here: an invalid one is a config error before TensorFlow starts.
REGEX = Key("a regular expression", lambda value: isinstance(value, str) and _compiles(value))
MULTIPLIERS = Key("a mapping of regular expressions to factors > 0, e.g. {tower: 0.1}",
                  lambda value: isinstance(value, dict) and all(
                      REGEX.accepts(rule) and _is_number(factor) and factor > 0 for rule, factor in value.items()))
# The strategies (conf/strategy/<name>.yaml, experiments/strategies.py), each with the keys only it has.
STRATEGY_KEYS = {"auto": {}, "one_device": {}, "mirrored": {"strategy.logical_cpus": integer(1)}, "multi_worker": {}}

# One line per key. A new key in conf/ gets its line here, in the table of its group.
KEYS = {
    "mode": one_of(*MODES),
    "checkpoint": CHECKPOINT,
    "heatmaps": integer(0),
    "split": _with_null(one_of("validation", "test"), "validation for evaluate, for predict the test split where there is one"),
    "seed": integer(0, 2**32 - 1),
    "deterministic": FLAG,
    "evaluation.bootstrap": integer(0),

    "pipeline.batch_size": integer(1),
    "pipeline.image_size": IMAGE_SIZE,
    "pipeline.cache": one_of("none", "memory", "disk"),
    "pipeline.image_table_mb": number(0),
    "pipeline.source": one_of("files", "tfrecord"),
    "pipeline.dtype": one_of("float32", "float16", "bfloat16"),
    "pipeline.augment": FLAG,
    "pipeline.random_resized_crop": CROP,
    "pipeline.mixup_alpha": number(0),
    "pipeline.cutmix_alpha": number(0),
    "pipeline.shuffle_buffer": integer(1, null="as many as pipeline.shuffle_mb holds"),
    "pipeline.shuffle_mb": number(0, low_open=True),
    "pipeline.verify_images": FLAG,
    "pipeline.service": SERVICE,
    "pipeline.service_timeout": number(0, low_open=True, null="wait for the service's batches however long"),

    "trainer.train_steps": integer(1),
    "trainer.eval_every": integer(1),
    "trainer.eval_steps": integer(1, null="the whole validation split"),
    "trainer.eval_timeout": number(0, low_open=True, null="wait for the final step however long"),
    "trainer.checkpoint_every": integer(1),
    "trainer.keep_checkpoints": integer(1),
    "trainer.checkpoint_input": FLAG,
    "trainer.log_every": integer(1),
    "trainer.steps_per_loop": integer(1, null="10 with a GPU or TPU, 1 on CPU alone"),
    "trainer.fetch_ahead": _with_null(FLAG, "on with a GPU or TPU and one replica"),
    "trainer.jit_compile": _with_null(FLAG, "XLA with a GPU and one replica, unless deterministic"),
    "trainer.graph_optimizer": _with_null(Key(graph_optimizer.ALLOWED, graph_optimizer.accepts), graph_optimizer.NULL),
    "trainer.max_nonfinite_steps": integer(1),
    "trainer.clip_global_norm": number(0, low_open=True, null="no clipping"),
    "trainer.accumulate_steps": integer(1),
    "trainer.freeze": _with_null(REGEX, "every variable trains"),
    "trainer.lr_multipliers": _with_null(MULTIPLIERS, "all at the learning rate"),
    "trainer.keep_best": FLAG,
    "trainer.best_metric": METRIC,
    "trainer.best_mode": _with_null(one_of("max", "min"), "follows trainer.best_metric: min for loss, else max"),
    "trainer.early_stopping.patience": integer(0, null="no early stopping"),
    "trainer.early_stopping.min_delta": number(0),
    "trainer.objective": one_of("last", "best"),
    "sweep.pruner": _with_null(one_of("median", "hyperband"), "no pruning"),
    "trainer.ema_decay": number(0, 1, high_open=True, null="no moving average"),
    "trainer.profile_steps": PROFILE_STEPS,
    "trainer.label_smoothing": number(0, 1, high_open=True),
    "trainer.class_weights": _with_null(one_of("balanced"), "every example weighs 1"),
    "trainer.optimizer": one_of("adam", "adamw", "sgd"),
    "trainer.learning_rate": number(0, low_open=True),
    "trainer.momentum": number(0, 1, high_open=True),
    "trainer.weight_decay": number(0),
    "trainer.schedule": one_of("constant", "cosine", "step"),
    "trainer.warmup_steps": integer(0),
    "trainer.decay_steps": integer(1),
    "trainer.decay_rate": number(0, 1, low_open=True),
    "trainer.init_checkpoint": _with_null(PATH, "no warm start"),
    "trainer.init_exclude": _with_null(Key("a regular expression", lambda value: isinstance(value, str)), "none"),

    "tfrecord.dir": PATH,
    "tfrecord.encoding": one_of(*ENCODINGS),
    "tfrecord.shard_mb": number(0, low_open=True),
    "tfrecord.min_shards_per_worker": integer(1),
    "tfrecord.cycle_length": integer(1),

    "dataset.name": Names(TASKS),
    "dataset.root": DATA_ROOT,
    "dataset.flip": FLAG,
    "dataset.normalize": one_of("unit_range", "per_image_standardization"),
    "dataset.resize": one_of("resize", "crop_or_pad"),
    "dataset.crop_fraction": number(0, 1, low_open=True, null="no crop"),
    "dataset.max_skipped_fraction": number(0, 1),

    "model.name": Names(BUILDERS),
    "model.inputs": one_of(*INPUTS),

    "strategy.name": one_of(*STRATEGY_KEYS),
}

# The type of each key that only some datasets or models have. Which ones have it is their lines' options
# (TASKS in data/__init__.py, BUILDERS in models/__init__.py).
OPTION_KEYS = {
    "dataset.validation_fraction": number(0, 1, low_open=True, high_open=True),
    "dataset.test_fraction": number(0, 1, high_open=True),
    "dataset.eval_pairs": one_of("dev_test", "pairs"),
    "dataset.fold": integer(0, 9, null="all ten folds"),

    "model.batch_norm_momentum": number(0, 1),
    "model.pretrained": _with_null(Key("imagenet or an existing .h5 file", lambda value: value == "imagenet" or (
        isinstance(value, str) and value.endswith(".h5") and Path(value).expanduser().is_file())), "from scratch"),
    "model.filters": integers(1, length=5),
    "model.dense_units": integer(1),
    "model.dropout": number(0, 1, high_open=True),
    "model.merge": one_of(*MERGES),
    "model.widths": integers(1),
    "model.embedding_size": integer(1),
    "model.head_units": integer(1),
}


def _keys(group, options) -> dict:
    return {f"{group}.{option}": OPTION_KEYS.get(f"{group}.{option}", _untyped(f"{group}.{option}"))
            for option in options}


def _untyped(key) -> Key:
    return Key(f"of a known type: experiments/schema.py declares none for {key} (OPTION_KEYS)", lambda value: False)


# ``single`` or ``pair``: what an example of a dataset is, and what a model takes, as their lines declare.
dataset_inputs, model_inputs = TASKS.inputs, BUILDERS.inputs


def dataset_keys(name) -> dict:
    """The keys dataset `name` has beyond KEYS' dataset.*: its line's options in TASKS."""
    return _keys("dataset", TASKS.options(name))


def model_keys(name) -> dict:
    """The keys model `name` has beyond KEYS' model.*: its family's options; ``model.inputs`` takes its inputs."""
    return {"model.inputs": one_of(model_inputs(name)), **_keys("model", BUILDERS.options(name))}


def show(value) -> str:
    """A value as it would be written on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def declared(cfg) -> dict:
    """Every key this config may hold: the general keys and those of its dataset, model and strategy."""
    keys = dict(KEYS)
    for group, options in (("dataset", dataset_keys), ("model", model_keys), ("strategy", STRATEGY_KEYS.get)):
        name = OmegaConf.select(cfg, f"{group}.name", default=None, throw_on_resolution_failure=False)
        if isinstance(name, str) and KEYS[f"{group}.name"].accepts(name):
            keys.update(options(name))
    return keys


def _leaves(node, prefix, keys):
    """(key, value) for each leaf of `node`, resolved; a declared key is a leaf even when it holds a dict."""
    for name in node:
        key = f"{prefix}{name}"
        if OmegaConf.is_missing(node, name):
            yield key, _UNSET
            continue
        try:
            value = node[name]
        except OmegaConfBaseException as error:  # an interpolation that does not resolve
            yield key, _Unresolved(OmegaConf.to_container(node)[name], error)
            continue
        if isinstance(value, DictConfig) and key not in keys:
            yield from _leaves(value, f"{key}.", keys)
        elif isinstance(value, (DictConfig, ListConfig)):
            try:
                yield key, OmegaConf.to_container(value, resolve=True)
            except OmegaConfBaseException as error:
                yield key, _Unresolved(OmegaConf.to_container(value), error)
        else:
            yield key, value


class _Unresolved:
    """A value whose interpolation failed to resolve: its text and why."""

    def __init__(self, text, error):
        # OmegaConf's own message, without the full_key/object_type lines it appends.
        self.text, self.error = text, str(error).strip().splitlines()[0]


def problems(cfg, environ=None) -> list:
    """Every problem with `cfg` (and TF_CONFIG in `environ`), one line each, most basic first."""
    keys = declared(cfg)
    found, lines = {}, []
    for key, value in _leaves(cfg, "", keys):
        found[key] = value
        if isinstance(value, _Unresolved):
            lines.append(f"{key}={show(value.text)} does not resolve: {value.error}")
        elif key not in keys:
            lines.append(_unknown(cfg, key, value, keys))
        elif value is _UNSET:
            lines.append(f"{key}={MISSING} is not set; it takes {keys[key].allowed}")
        elif not keys[key].accepts(value):
            lines.append(f"{key}={show(value)} is not {keys[key].allowed}")
    for key in keys:
        if key not in found:  # absent, as opposed to ??? in conf/
            lines.append(f"{key}={MISSING} is not set; it takes {keys[key].allowed}")
    if not lines:  # every key is good on its own: check how they go together
        together = [_combinations(cfg), _tf_config(cfg, (environ or {}).get("TF_CONFIG"))]
        lines = [line for line in together if line][:1]
    return lines


def _unknown(cfg, key, value, keys):
    group = key.rpartition(".")[0]
    where = f"{group}={cfg[group].get('name')}" if group in ("dataset", "model", "strategy") else group or "the config"
    return f"{key}={show(value)} is not a key of {where}; {_advice(key, keys)}"


def _advice(key, keys) -> str:
    """"did you mean `<the declared key nearest to key>`?" (by their own names, those of its group first), or the
    keys of its group when none is near."""
    group, _, name = key.rpartition(".")
    own = {other.rpartition(".")[2]: other for other in keys if other.rpartition(".")[0] == group}
    anywhere = {}
    for other in keys:
        anywhere.setdefault(other.rpartition(".")[2], other)
    for names in (own, anywhere):
        near = difflib.get_close_matches(name, list(names), n=1, cutoff=0.7)
        if near:
            return f"did you mean `{names[near[0]]}`?"
    return f"its keys are {'|'.join(sorted(own)) if own else '(none)'}"


# Hydra's refusal of an override of a key the config does not have: it advises `+key=value`, which adds the key,
# and the check above then refuses.
_NOT_IN_STRUCT = re.compile(r"Could not override '(?P<key>[^']+)'\. To append to your config use \+(?P<override>\S+)"
                            r"\s+Key '[^']*' is not in struct")


def unknown_override(message: str) -> str | None:
    """The line for Hydra's error `message` when it refuses an override of a key no config declares: the key,
    and "did you mean" the declared key nearest to it; None for any other error."""
    match = _NOT_IN_STRUCT.search(" ".join(message.split()))
    if match is None:
        return None
    keys = dict(KEYS)
    for name in TASKS:
        keys.update(dataset_keys(name))
    for name in BUILDERS:
        keys.update(model_keys(name))
    for options in STRATEGY_KEYS.values():
        keys.update(options)
    key, group = match["key"], match["key"].rpartition(".")[0]
    return f"{match['override']} is not a key of {group or 'the config'}; {_advice(key, keys)}"


def _compiles(text) -> bool:
    try:
        re.compile(text)
    except re.error:
        return False
    return True


def _combinations(cfg) -> str | None:
    """Keys whose values are each fine but do not go together."""
    recipe = _recipes(cfg)
    if recipe:
        return recipe
    if cfg.pipeline.service and cfg.pipeline.cache != "none":
        return (f"pipeline.cache={cfg.pipeline.cache} does not go with pipeline.service={cfg.pipeline.service}: "
                f"a cache would sit on each service worker, partial; use one or the other")
    inert = _inert(cfg) or _past_the_end(cfg)
    if inert:
        return inert
    wanted = dataset_inputs(cfg.dataset.name)
    if cfg.model.inputs != wanted:  # the model's own inputs: model_keys checked it
        fitting = sorted(name for name in BUILDERS if model_inputs(name) == wanted)
        return (f"model={cfg.model.name} takes {cfg.model.inputs} images but dataset={cfg.dataset.name} gives "
                f"{wanted} images; choose one of {'|'.join(fitting)}")
    return _too_small(cfg)


# Keys that act under one value of another key alone ("sgd only" in conf/trainer/default.yaml): set away from their
# default under any other value, they would change nothing, and nothing would say so.
ONLY_UNDER = {"trainer.momentum": ("trainer.optimizer", "sgd"), "trainer.weight_decay": ("trainer.optimizer", "adamw"),
              "trainer.warmup_steps": ("trainer.schedule", "cosine"),
              "trainer.decay_steps": ("trainer.schedule", "step"), "trainer.decay_rate": ("trainer.schedule", "step")}


def _inert(cfg) -> str | None:
    """A key of ONLY_UNDER set away from its default (conf/trainer/default.yaml) where its option is not chosen."""
    from tf_harness.data.integrity import reading

    defaults = OmegaConf.create(reading.read_text(Path(__file__).parents[1] / "conf" / "trainer" / "default.yaml"))
    for key, (option, value) in ONLY_UNDER.items():
        setting, chosen = OmegaConf.select(cfg, key), OmegaConf.select(cfg, option)
        if chosen != value and setting != defaults[key.partition(".")[2]]:
            return (f"{key}={show(setting)} acts only with {option}={value}, and {option}={chosen} ignores it; "
                    f"choose {option}={value}, or leave {key} at its default ({show(defaults[key.partition('.')[2]])})")
    return None


def _past_the_end(cfg) -> str | None:
    """A step the run never reaches, so that its setting would change nothing: the end of a cosine warm-up, or a
    profile's first step, at or past trainer.train_steps."""
    trainer = cfg.trainer
    steps = {"trainer.warmup_steps": (trainer.warmup_steps if trainer.schedule == "cosine" else 0,
                                      "the learning rate would never leave its warm-up"),
             "trainer.profile_steps": (trainer.profile_steps[0] if trainer.profile_steps else 0,
                                       "no step would be traced")}
    for key, (step, what) in steps.items():
        if step and step >= trainer.train_steps:
            return (f"{key}={show(OmegaConf.select(cfg, key))} reaches global step {step}, at or past "
                    f"trainer.train_steps={trainer.train_steps}: {what}; make it smaller, or train longer")
    return None


def _too_small(cfg) -> str | None:
    """pipeline.image_size below the smallest side the model's network takes (models/__init__.py `smallest_side`).
    The model is built before training too (experiments/trainer.py `build_model`): what cannot be stated here
    without TensorFlow is refused there."""
    size = OmegaConf.to_container(cfg.pipeline, resolve=True)["image_size"]
    model = OmegaConf.to_container(cfg.model, resolve=True)
    side, keys, why = smallest_side(cfg.model.name, model)
    if min(size if isinstance(size, list) else [size]) >= side:
        return None
    settings = "".join(f"{' with' if i == 0 else ','} model.{key}={show(model[key])}" for i, key in enumerate(keys))
    return (f"pipeline.image_size={show(size)} is too small for model={cfg.model.name}{settings}: it takes at least "
            f"{side}x{side} ({why})")


# The metrics of which a lower value is better; for every other one a higher value is.
LOWER_IS_BETTER = ("loss", "eer")


def best_mode(metric) -> str:
    """Whether a higher ("max") or a lower ("min") value of `metric` is the better one."""
    return "min" if metric in LOWER_IS_BETTER else "max"


def _recipes(cfg) -> str | None:
    """The training recipes' keys against the mode and the dataset (docs/training-loop.md#training-recipes)."""
    choice = cfg.checkpoint
    if choice != "latest" and cfg.mode not in EVALUATION_MODES:
        return (f"checkpoint={show(choice)} is for mode={'|'.join(EVALUATION_MODES)}; mode={cfg.mode} "
                f"{'resumes from the newest checkpoint' if cfg.mode != 'continuous_eval' else 'evaluates each one'}")
    split = cfg.get("split")
    if split is not None and cfg.mode not in SPLIT_MODES:
        return (f"split={split} is for mode={'|'.join(SPLIT_MODES)}; mode={cfg.mode} trains on train and evaluates "
                f"on validation")
    if split == "test" and TASKS.entries[cfg.dataset.name].test is None:
        return f"split=test: dataset={cfg.dataset.name} has no test split (docs/datasets.md); use split=validation"
    if _is_int(choice) and choice > cfg.trainer.train_steps:
        return (f"checkpoint={choice} is not a global step the run reaches: it takes latest, best or a step in "
                f"0..{cfg.trainer.train_steps} (trainer.train_steps)")
    metric, kind = cfg.trainer.best_metric, getattr(TASKS.entries[cfg.dataset.name], "task", None)
    field = _field_recipes(cfg, kind)
    if field:
        return field
    if metric is not None and kind in TASK_METRICS:
        written = ("loss", *TASK_METRICS[kind])
        if metric not in written and not (kind == "multilabel" and metric.startswith("auc/")):
            per_class = "|auc/<class>" if kind == "multilabel" else ""
            return (f"trainer.best_metric={metric} is not a metric dataset={cfg.dataset.name} writes at every "
                    f"evaluation; it writes {'|'.join(written)}{per_class}")
    mode, follows = cfg.trainer.best_mode, best_mode(metric)  # a null metric is the headline, higher is better
    if mode is not None and mode != follows:
        shown = f"trainer.best_metric={metric}" if metric is not None else "the headline metric (trainer.best_metric=null)"
        return (f"trainer.best_mode={mode} contradicts {shown}, of which a {'lower' if follows == 'min' else 'higher'} "
                f"value is better; leave trainer.best_mode unset (null), which follows the metric, or set it to "
                f"{follows}")
    return None


# The recipes that fit one kind of task only (SPEC.task), and why (docs/training-loop.md#recipes-of-the-field).
FIELD_RECIPES = {"trainer.label_smoothing": ("multiclass", "it smooths a softmax over classes"),
                 "pipeline.mixup_alpha": ("multiclass", "it mixes one-class labels into class distributions"),
                 "pipeline.cutmix_alpha": ("multiclass", "it mixes one-class labels into class distributions"),
                 "trainer.class_weights": ("multilabel", "it weighs each label's positives in a sigmoid loss")}


def _field_recipes(cfg, kind) -> str | None:
    """The field's recipes (losses, mixing, heatmaps) against the dataset's kind of task and the mode."""
    for key, (wanted, why) in FIELD_RECIPES.items():
        value = OmegaConf.select(cfg, key)
        if value and kind is not None and kind != wanted:
            return (f"{key}={show(value)} is for {wanted} datasets ({why}); dataset={cfg.dataset.name} is {kind} "
                    f"(use {key}={'null' if isinstance(value, str) else 0})")
    if cfg.heatmaps and cfg.mode != "predict":
        return f"heatmaps={cfg.heatmaps} is for mode=predict; mode={cfg.mode} writes none (use heatmaps=0)"
    if cfg.heatmaps and dataset_inputs(cfg.dataset.name) != "single":
        return (f"heatmaps={cfg.heatmaps} is for datasets of single images; dataset={cfg.dataset.name} gives "
                f"{dataset_inputs(cfg.dataset.name)} images (use heatmaps=0)")
    return None


def worker_count(cluster) -> int:
    """Training workers of a TF_CONFIG cluster: MultiWorkerMirroredStrategy counts the chief as one."""
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def _tf_config(cfg, text) -> str | None:
    """TF_CONFIG, the cluster description that strategy=multi_worker reads, where it is set."""
    if not text:
        return None
    shown = " ".join(text.split())
    try:
        config = json.loads(text)
    except ValueError as error:
        return (f"TF_CONFIG={shown} is not valid JSON ({error}); it takes "
                '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}')
    if not isinstance(config, dict):
        return f"TF_CONFIG={shown} is not a JSON object with cluster and task"
    cluster, task = config.get("cluster", {}), config.get("task", {})
    if not isinstance(cluster, dict) or not all(isinstance(hosts, list) for hosts in cluster.values()):
        return f"TF_CONFIG cluster={show(cluster)} is not a map from task type to a list of host:port"
    if not isinstance(task, dict):
        return f"TF_CONFIG task={show(task)} is not an object with type and index"
    if cluster or task:
        kind, index = task.get("type"), task.get("index", 0)
        if kind == "evaluator":  # Estimator's evaluator: outside the cluster, it runs mode=continuous_eval
            if not (_is_int(index) and index == 0):
                return f"TF_CONFIG task index={show(index)} is not 0, the index of a cluster's one evaluator task"
        elif kind not in cluster:
            return f"TF_CONFIG task type={show(kind)} is not one of {'|'.join(cluster) or '(an empty cluster)'}"
        elif not _is_int(index) or not 0 <= index < len(cluster[kind]):
            return (f"TF_CONFIG task index={show(index)} is not in 0..{len(cluster[kind]) - 1}, the indices of "
                    f"its {len(cluster[kind])} {kind} task(s)")
    count = worker_count(cluster)
    if count > 1 and cfg.strategy.name != "multi_worker":
        return (f"TF_CONFIG names {count} workers but strategy={cfg.strategy.name}; "
                f"use strategy=multi_worker (or unset TF_CONFIG)")
    if count > 1 and cfg.pipeline.batch_size % count:
        return f"pipeline.batch_size={cfg.pipeline.batch_size} does not divide across {count} workers"
    return None


def first_problem(cfg, environ=None):
    """The one line to report for `cfg`, or None when it is good."""
    found = problems(cfg, environ)
    return found[0] if found else None
