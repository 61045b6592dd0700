"""Warm start (Estimator's `warm_start_from`): a new run's first weights from another run's checkpoint.

`trainer.init_checkpoint` names a run directory (its newest restorable checkpoint is taken, as a resume would
take it: experiments/run_dir/checkpoints.py `newest_finite`), its `checkpoints/` folder, or one checkpoint, a prefix such
as `<run>/checkpoints/ckpt-6`. The model variables of this run that match one of the checkpoint's model variables
by name and shape are restored; `trainer.init_exclude`, a regular expression searched in each name, leaves the
variables it matches at their initial values (e.g. `logits`, a new head). Nothing else is restored: the optimizer
starts fresh and the global step at 0, so the learning-rate schedule and the step budget start over too.

Names: a variable's name is its Keras path, `<layer>/<weight>` (`conv2/kernel`, `tower/bn0/gamma`), on both sides.
In the checkpoint it is read from the object graph that tf.train.Checkpoint writes with the tensors: every variable
reachable from the checkpoint's `model` node, with the name its SerializedTensor records (`full_name`, the name
the variable was created with, which is the Keras path) and its checkpoint key. The key alone would not do: it is
the variable's first path from the root (`optimizer/_trainable_variables/3/...` for a trainable one,
`model/_operations/6/...` for a batch-norm statistic), numbered by the order of the layers and the optimizer's
variables, which another model's checkpoint does not share. Dropout's random state is not a weight and is left out.

A checkpoint of a run with `trainer.ema_decay` holds the moving average of each trained weight, an optimizer variable
named after the weight's path (`<optimizer>/conv2_kernel_average`). Its evaluations and exports used the averages, so
a warm start takes the average in place of the weight wherever there is one (once the run had applied an update,
before which the averages are not set), and its summary line says how many.

A variable that does not match is not an error: every one left out, for its name, its shape or init_exclude, is
listed in one log line (`summary`). An init checkpoint that is missing or cannot be read is a config error (exit 2)
found before the run writes anything (`check`), and so is one of which no variable fits the model (`check_fit`, once
the model is built): such a warm start would train from scratch while the user believes otherwise, a checkpoint of
another dataset's model, say. The runner's `Controller.resume` holds the resume policy that decides when a warm start
applies (`start`).
"""
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from tf_harness.data.errors import ConfigError
from tf_harness.experiments.config.schema import TRAINING_MODES
from tf_harness.experiments.run_dir import checkpoints

log = logging.getLogger(__name__)

OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"  # the tensor in which tf.train.Checkpoint keeps its object graph
SHOWN = 8  # names listed per kind of skip; the rest are counted
# Dropout's random state: not a weight (experiments/training/trainer.py `checkpoint`).
_RANDOM_STATE = "seed_generator_state"
_AVERAGE = "_average"  # how Keras names a weight's moving average: `<optimizer>/<path, / as _>_average`


@dataclass(frozen=True)
class Stored:
    """One model variable in a checkpoint: its name (the Keras path), key and shape."""

    name: str
    key: str
    shape: tuple


@dataclass
class Plan:
    """What a warm start restores and what it leaves out, by variable name."""

    restored: list = field(default_factory=list)  # (model variable, Stored)
    excluded: list = field(default_factory=list)  # names matching init_exclude
    shape: list = field(default_factory=list)  # (name, checkpoint shape, model shape)
    missing: list = field(default_factory=list)  # model variables with no checkpoint variable of their name
    unused: list = field(default_factory=list)  # checkpoint model variables with no model variable of their name
    total: int = 0  # the model's variables (weights and batch-norm statistics)
    averaged: int = 0  # restored variables that took their moving average (trainer.ema_decay)


def start(settings, model, latest) -> None:
    """Steps 2 and 3 of the resume policy for a training run (experiments/runner.py `Controller.resume`): with
    `latest`, the run's own checkpoint, trainer.init_checkpoint is ignored (logged); without, the model variables it
    holds that match are restored into `model` (the optimizer and the global step are left as they are, fresh)."""
    init, pretrained = settings.trainer.init_checkpoint, settings.model.pretrained
    if latest:
        if init:
            log.info("trainer.init_checkpoint=%s is ignored: the run resumes from its own checkpoint %s", init, latest)
        return
    if pretrained and settings.dataset.normalize != "unit_range":
        # keras.applications.resnet_v2.preprocess_input scales to [-1, 1], which is what unit_range gives.
        log.warning("model.pretrained=%s: the weights were trained on images scaled to [-1, 1] "
                    "(dataset.normalize=unit_range), and this run uses dataset.normalize=%s", pretrained,
                    settings.dataset.normalize)
    if init:
        exclude = _exclude(settings)
        restore(model, resolve(init), exclude)


def check(settings, checkpoint_dir) -> None:
    """Before a run writes anything (experiments/runner.py `train`): raises ConfigError when a training run without a
    checkpoint of its own in `checkpoint_dir` would warm-start from a trainer.init_checkpoint that cannot be
    restored, or with a trainer.init_exclude that is no regular expression."""
    init = settings.trainer.init_checkpoint
    if init and settings.mode in TRAINING_MODES and not checkpoints.on_disk(checkpoint_dir):
        _exclude(settings)
        stored_variables(resolve(init))


def check_fit(settings, checkpoint_dir, model) -> None:
    """Once the model is built, before the run writes anything: raises ConfigError when a warm start `check` lets
    through would restore none of `model`'s variables (none matches one of the checkpoint's by name and shape, or
    trainer.init_exclude leaves out every one that does)."""
    init = settings.trainer.init_checkpoint
    if not init or settings.mode not in TRAINING_MODES or checkpoints.on_disk(checkpoint_dir):
        return
    prefix, exclude = resolve(init), _exclude(settings)
    stored, variables = stored_variables(prefix), _variables(model)
    result = plan(variables, stored, exclude)
    if result.restored:
        return
    left_out = [f"{len(result.shape)} differ in shape", f"{len(result.missing)} are not in the checkpoint"]
    left_out += [f"{len(result.excluded)} are excluded by trainer.init_exclude={exclude}"] if result.excluded else []
    raise ConfigError(
        f"trainer.init_checkpoint={init}: none of the {result.total} variables of model={settings.model.name} matches "
        f"one in {prefix} by name and shape ({', '.join(left_out)}; the checkpoint holds "
        f"{_first([entry.name for entry in stored]) or 'no model variable'}, the model "
        f"{_first([variable.path for variable in variables])}): it would train from scratch; name a checkpoint of "
        f"this model's layers, or set trainer.init_checkpoint=null")


def _first(names, count=3) -> str:
    return ", ".join(names[:count]) + (", ..." if len(names) > count else "")


def _variables(model) -> list:
    """The model's variables a warm start restores: its weights and batch-norm statistics, not Dropout's random
    state."""
    return [variable for variable in model.variables if not variable.path.endswith(_RANDOM_STATE)]


def _exclude(settings):
    exclude = settings.trainer.init_exclude
    try:
        re.compile(exclude or "")
    except re.error as error:
        raise ConfigError(f"trainer.init_exclude={exclude} is not a regular expression ({error})") from None
    return exclude


def resolve(value) -> str:
    """The checkpoint prefix trainer.init_checkpoint=`value` names: the newest restorable checkpoint of a run
    directory or checkpoint folder, or the checkpoint itself. Raises ConfigError when there is none to restore."""
    path = Path(str(value)).expanduser()
    if path.name.endswith(".index"):  # the checkpoint's index file, named instead of its prefix
        path = path.with_name(path.name[:-len(".index")])
    if not path.is_dir():
        if not Path(f"{path}.index").is_file():
            raise ConfigError(f"trainer.init_checkpoint={value} is neither a directory nor a checkpoint (no "
                              f"{path}.index); name a run directory or a checkpoint such as <run>/checkpoints/ckpt-6")
        reason = checkpoints.problem(path)
        if reason:
            raise ConfigError(f"trainer.init_checkpoint={value} cannot be restored: {reason}")
        return str(path)
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    try:
        newest = checkpoints.newest_finite(folder)
    except checkpoints.UnrestorableError:
        reasons = [f"{prefix.name}: {checkpoints.problem(prefix)}" for prefix in checkpoints.on_disk(folder).values()]
        raise ConfigError(f"trainer.init_checkpoint={value}: no checkpoint in {folder} can be restored "
                          f"({'; '.join(reasons[-3:])})") from None
    if newest is None:
        raise ConfigError(f"trainer.init_checkpoint={value} holds no checkpoint (no ckpt-N.index in {folder}); name "
                          f"a run directory or a checkpoint such as <run>/checkpoints/ckpt-6")
    return newest


def stored_variables(prefix) -> list:
    """The model variables of the checkpoint at `prefix`, in the order of its object graph. Raises ConfigError
    when it holds no object graph with a model (it was not written by tf.train.Checkpoint(model=...))."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        graph = trackable_object_graph_pb2.TrackableObjectGraph()
        graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH))
        shapes = reader.get_variable_to_shape_map()
    except Exception as error:  # noqa: BLE001  NotFoundError (no object graph), DataLossError, a cut file...
        raise ConfigError(f"trainer.init_checkpoint: {prefix} cannot be read as a checkpoint of a model "
                          f"({type(error).__name__}: {(str(error).splitlines() or [''])[0]})") from None
    model = next((child.node_id for child in graph.nodes[0].children if child.local_name == "model"), None)
    if model is None:
        raise ConfigError(f"trainer.init_checkpoint: {prefix} holds no model (its objects are "
                          f"{', '.join(child.local_name for child in graph.nodes[0].children)})")
    found, seen, queue = [], {model}, [model]
    while queue:  # breadth first, each node once: a variable is reached from its layer and from lists of weights
        node = graph.nodes[queue.pop(0)]
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE" and not attribute.full_name.endswith(_RANDOM_STATE):
                found.append(Stored(attribute.full_name, attribute.checkpoint_key,
                                    tuple(shapes.get(attribute.checkpoint_key, ()))))
        for child in node.children:
            if child.node_id not in seen:
                seen.add(child.node_id)
                queue.append(child.node_id)
    return found


def stored_averages(prefix) -> dict:
    """{weight path with `/` as `_`: checkpoint key} of the moving averages (trainer.ema_decay) that the optimizer in
    the checkpoint at `prefix` holds; empty when it holds none, or has applied no update yet (the averages are set
    by the first)."""
    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH))
    optimizer = next((child.node_id for child in graph.nodes[0].children if child.local_name == "optimizer"), None)
    if optimizer is None:
        return {}
    found, iterations, seen, queue = {}, 0, {optimizer}, [optimizer]
    while queue:
        node = graph.nodes[queue.pop(0)]
        for attribute in node.attributes:
            if attribute.name != "VARIABLE_VALUE":
                continue
            name = attribute.full_name.partition("/")[2] or attribute.full_name  # `<optimizer>/<name>`
            if name.endswith(_AVERAGE):
                found[name[:-len(_AVERAGE)]] = attribute.checkpoint_key
            elif name == "iteration":
                iterations = int(reader.get_tensor(attribute.checkpoint_key))
        for child in node.children:
            if child.node_id not in seen:
                seen.add(child.node_id)
                queue.append(child.node_id)
    return found if iterations > 0 else {}


def plan(variables, stored, exclude=None) -> Plan:
    """Which of the model's `variables` take which `stored` checkpoint variable: the same name and shape, and a
    name `exclude` (a regular expression) does not match. A name that occurs more than once on a side (none does
    in this project's models) pairs its occurrences in order."""
    pattern = re.compile(exclude) if exclude else None
    by_name = {}
    for entry in stored:
        by_name.setdefault(entry.name, []).append(entry)
    result = Plan(total=len(variables))
    for variable in variables:
        name, candidates = variable.path, by_name.get(variable.path)
        entry = candidates.pop(0) if candidates else None
        if pattern is not None and pattern.search(name):
            result.excluded.append(name)
        elif entry is None:
            result.missing.append(name)
        elif entry.shape != tuple(variable.shape):
            result.shape.append((name, entry.shape, tuple(variable.shape)))
        else:
            result.restored.append((variable, entry))
    result.unused = [entry.name for left in by_name.values() for entry in left
                     if pattern is None or not pattern.search(entry.name)]
    return result


def restore(model, prefix, exclude=None) -> Plan:
    """Restores into `model` its variables that match the checkpoint at `prefix` (`plan`); logs `summary`."""
    result = plan(_variables(model), stored_variables(prefix), exclude)
    reader = tf.train.load_checkpoint(prefix)
    averages, shapes = stored_averages(prefix), reader.get_variable_to_shape_map()
    for variable, entry in result.restored:
        key = averages.get(entry.name.replace("/", "_"))
        if key is not None and tuple(shapes[key]) == entry.shape:
            result.averaged += 1
        else:
            key = entry.key
        variable.assign(np.asarray(reader.get_tensor(key)).astype(variable.dtype))
    skipped = result.shape or result.missing or result.unused
    log.log(logging.WARNING if skipped else logging.INFO, "%s", summary(prefix, result, exclude))
    return result


def summary(prefix, result, exclude=None) -> str:
    """The one line that says what a warm start restored and, by kind, every variable it left out."""
    shapes = [f"{name} {_shape(stored)} -> {_shape(model)}" for name, stored, model in result.shape]
    parts = [f"excluded (trainer.init_exclude={exclude or 'null'}): {_listed(result.excluded)}",
             f"shape differs (checkpoint -> model): {_listed(shapes)}",
             f"not in the checkpoint: {_listed(result.missing)}",
             f"in the checkpoint only: {_listed(result.unused)}"]
    if result.averaged:
        parts.append(f"{result.averaged} of them took their moving average (the checkpoint's trainer.ema_decay), "
                     f"as its evaluations did")
    return (f"Warm start from {prefix}: restored {len(result.restored)} of {result.total} model variables; "
            f"{'; '.join(parts)}; the optimizer and the global step start afresh")


def _listed(names) -> str:
    if not names:
        return "0"
    shown = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
    return f"{len(names)} ({shown})"


def _shape(shape) -> str:
    return "x".join(str(size) for size in shape) or "scalar"
