"""Fine-tuning controls: which variables train (`trainer.freeze`) and at what share of the learning rate
(`trainer.lr_multipliers`).

A variable is named by its Keras path, `<layer>/<weight>` (`tower/conv0/kernel`, `conv1_conv/kernel` in a
pretrained ResNet-v2 backbone), as warm start names it; a rule is a regular expression searched in it.

- `trainer.freeze`: the trainable variables it matches are not trained: they get no gradient, no optimizer slot
  and no moving average, and stay as built, warm-started or restored. A batch-normalization layer whose every
  weight it matches runs in inference mode (Keras 3's `trainable = False` on the layer), so its moving statistics
  stay as they are too.
- `trainer.lr_multipliers`: `{rule: factor}`; a trained variable takes the factor of the first rule, in the order
  written, that matches it: its update uses the learning rate (the schedule's, at the global step) times the
  factor. The optimizer is the configured Keras optimizer with `update_step` taking the factor
  (experiments/training/optimizers.py `with_multipliers`), so the checkpoint holds the same variables as without.

One log line says what each rule matched; a rule that matches no variable, or a `freeze` that leaves none to train,
is a config error, in one line. The rules'
syntax is checked before TensorFlow starts (experiments/config/schema.py).
"""
import logging
import re

import keras

from tf_harness.data.errors import ConfigError

log = logging.getLogger(__name__)
SHOWN = 4  # variable names shown per rule in a config error


def trained_variables(model, freeze) -> list:
    """The model's variables that train: its trainable variables but those `freeze` (a regular expression, or None)
    matches. Sets the batch-normalization layers whose every weight it matches to inference mode; logs one line."""
    variables = list(model.trainable_variables)
    if freeze is None:
        return variables
    pattern = re.compile(freeze)
    frozen = [variable for variable in variables if pattern.search(variable.path)]
    if not frozen:
        raise ConfigError(f"trainer.freeze={freeze} matches none of the model's {len(variables)} trainable variables "
                          f"(e.g. {_names(variables)})")
    layers = [layer for layer in model._flatten_layers(include_self=False)
              if isinstance(layer, keras.layers.BatchNormalization) and layer.weights
              and all(pattern.search(weight.path) for weight in layer.weights)]
    for layer in layers:
        layer.trainable = False
    trained = [variable for variable in model.trainable_variables if not pattern.search(variable.path)]
    if not trained:
        raise ConfigError(f"trainer.freeze={freeze} matches every one of the model's {len(variables)} trainable "
                          f"variables, so nothing would train; match fewer (e.g. {_names(variables)})")
    log.info("trainer.freeze=%s: %d of %d trainable variables frozen, %d trained; %d batch-normalization layer(s) "
             "in inference mode", freeze, len(variables) - len(trained), len(variables), len(trained), len(layers))
    return trained


def multipliers(variables, rules) -> list:
    """[(variable, factor)] of the `variables` that `rules` (`{regular expression: factor}`, in order) give a
    factor: each the first rule's that matches it. Logs one line with each rule's count; a rule that matches none
    of them is a ConfigError."""
    if not rules:
        return []
    compiled = [(rule, re.compile(rule), float(factor)) for rule, factor in rules.items()]
    counts, chosen = {rule: 0 for rule, _, _ in compiled}, []
    for variable in variables:
        matching = [(rule, factor) for rule, pattern, factor in compiled if pattern.search(variable.path)]
        for rule, _ in matching:
            counts[rule] += 1
        if matching:
            chosen.append((variable, matching[0][1]))
    unmatched = [rule for rule, count in counts.items() if not count]
    if unmatched:
        raise ConfigError(f"trainer.lr_multipliers: {unmatched[0]!r} matches none of the {len(variables)} trained "
                          f"variables (e.g. {_names(variables)})")
    log.info("trainer.lr_multipliers: %s; %d of %d trained variables take a factor (the first rule that matches)",
             ", ".join(f"{rule!r} x{factor:g} matched {counts[rule]}" for rule, _, factor in compiled), len(chosen),
             len(variables))
    return chosen


def _names(variables) -> str:
    return ", ".join(variable.path for variable in variables[:SHOWN]) + (" ..." if len(variables) > SHOWN else "")
