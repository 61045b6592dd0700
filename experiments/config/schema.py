"""Checks a composed config against the keys experiments/config/config_keys.py declares, before TensorFlow is imported.

Every leaf key of the composed config is declared once, as a field of its group in experiments/config/config_keys.py;
the tables checked here are derived from those fields:

- ``KEYS``: the keys every run has, by full name (``trainer.*``, ``pipeline.*``, ``tfrecord.*``, ...);
- ``OPTION_KEYS``: the keys only some datasets or models have (``dataset.validation_fraction``);
- ``STRATEGY_KEYS``: the keys of one strategy, by its name: the one list of strategy names.

The rest is imported from the TensorFlow-free modules that declare it: the datasets, whether an example is one
image or a pair, and their ``dataset.*`` options from ``TASKS`` (data/__init__.py); the models, what each takes
and their ``model.*`` options from models/__init__.py. So a dataset or model added there is known here with no
edit; an option key new to the harness needs its field in experiments/config/config_keys.py.

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
import re
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tf_harness.data import TASKS
from tf_harness.models import BUILDERS, smallest_side

from tf_harness.experiments.evaluation import metrics

# The modes and the tables are declared in config_keys; the rest of the project reads them here too.
from tf_harness.experiments.config.config_keys import (  # noqa: F401  names other modules import from the schema
    EVALUATING_MODES, EVALUATION_MODES, KEYS, MODES, ONLY_UNDER, OPTION_KEYS, RECIPES, SERVICE_ADDRESS,
    SIDECAR_MODE, SPLIT_MODES, STRATEGY_KEYS, TRAINING_MODES, Key, _is_int, number, one_of)

MISSING = "???"  # how an unset key's value is shown, as in Hydra's own notation
_UNSET = object()


def _keys(group, options) -> dict:
    return {f"{group}.{option}": OPTION_KEYS.get(f"{group}.{option}", _untyped(f"{group}.{option}"))
            for option in options}


def _untyped(key) -> Key:
    return Key(f"of a known type: experiments/config/config_keys.py declares none for {key} (a field of its group)",
               lambda value: False)


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


def _inert(cfg) -> str | None:
    """A key declared `only_under` another key's value (experiments/config/config_keys.py), set away from its default
    (conf/trainer/default.yaml) where that value is not chosen: it would change nothing, and nothing would say so."""
    from tf_harness.data.integrity import reading

    defaults = OmegaConf.create(reading.read_text(Path(__file__).parents[2] / "conf" / "trainer" / "default.yaml"))
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
    The model is built before training too (experiments/training/trainer.py `build_model`): what cannot be stated here
    without TensorFlow is refused there."""
    size = OmegaConf.to_container(cfg.pipeline, resolve=True)["image_size"]
    model = OmegaConf.to_container(cfg.model, resolve=True)
    side, keys, why = smallest_side(cfg.model.name, model)
    if min(size if isinstance(size, list) else [size]) >= side:
        return None
    settings = "".join(f"{' with' if i == 0 else ','} model.{key}={show(model[key])}" for i, key in enumerate(keys))
    return (f"pipeline.image_size={show(size)} is too small for model={cfg.model.name}{settings}: it takes at least "
            f"{side}x{side} ({why})")


def best_mode(metric) -> str:
    """Whether a higher ("max") or a lower ("min") value of `metric` is the better one
    (experiments/evaluation/metrics.py)."""
    return "min" if metrics.lower_is_better(metric) else "max"


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
    if metric is not None and kind in metrics.TASK_METRICS:
        protocol = metrics.protocol_names(cfg.dataset.name)
        written = ("loss", *metrics.names(kind), *protocol)
        if metric not in written and not (kind == "multilabel" and metric.startswith("auc/")):
            per_class = "|auc/<class>" if kind == "multilabel" else ""
            return (f"trainer.best_metric={metric} is not a metric dataset={cfg.dataset.name} writes at every "
                    f"evaluation; it writes {'|'.join(written)}{per_class}")
        if metric in protocol and cfg.trainer.eval_steps is not None:
            return (f"trainer.best_metric={metric} is a protocol metric of dataset={cfg.dataset.name}, measured on "
                    f"the whole validation split only, and trainer.eval_steps={cfg.trainer.eval_steps} evaluates a "
                    f"sample; leave trainer.eval_steps null")
    mode, follows = cfg.trainer.best_mode, best_mode(metric)  # a null metric is the headline, higher is better
    if mode is not None and mode != follows:
        shown = f"trainer.best_metric={metric}" if metric is not None else "the headline metric (trainer.best_metric=null)"
        return (f"trainer.best_mode={mode} contradicts {shown}, of which a {'lower' if follows == 'min' else 'higher'} "
                f"value is better; leave trainer.best_mode unset (null), which follows the metric, or set it to "
                f"{follows}")
    return None


# The recipes that fit some kinds of task only (SPEC.task), as experiments/config/config_keys.py declares them
# (docs/training-loop.md#recipes-of-the-field).
FIELD_RECIPES = {key: recipe for key, recipe in RECIPES.items() if recipe.fits}


def _field_recipes(cfg, kind) -> str | None:
    """The field's recipes (losses, mixing, heatmaps) against the dataset's kind of task and the mode."""
    for key, recipe in FIELD_RECIPES.items():
        value = OmegaConf.select(cfg, key)
        if value and kind is not None and kind not in recipe.fits:
            return (f"{key}={show(value)} is for {'|'.join(recipe.fits)} datasets ({recipe.why}); "
                    f"dataset={cfg.dataset.name} is {kind} (use {key}={'null' if isinstance(value, str) else 0})")
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
