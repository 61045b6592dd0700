"""The optimizer and its learning-rate schedule, from the trainer settings (conf/trainer/default.yaml)."""
import keras


def schedule(name, learning_rate, train_steps, warmup_steps=0, decay_steps=1, decay_rate=1.0):
    """The learning rate as a function of the step: a float for `constant`, else a Keras schedule.

    - constant: `learning_rate` throughout.
    - cosine: linear warm-up from 0 to `learning_rate` over `warmup_steps`, then cosine decay to 0
      at `train_steps`.
    - step: `learning_rate * decay_rate ** floor(step / decay_steps)`.
    """
    if name == "constant":
        return learning_rate
    if name == "cosine":
        decay = max(1, train_steps - warmup_steps)
        if warmup_steps == 0:
            return keras.optimizers.schedules.CosineDecay(learning_rate, decay)
        return keras.optimizers.schedules.CosineDecay(0.0, decay, warmup_target=learning_rate,
                                                      warmup_steps=warmup_steps)
    if name == "step":
        return keras.optimizers.schedules.ExponentialDecay(learning_rate, decay_steps, decay_rate, staircase=True)
    raise ValueError(f"unknown learning-rate schedule {name!r}")


def optimizer(name, learning_rate, step=None, momentum=0.9, weight_decay=0.0, ema_decay=None, multipliers=()):
    """A Keras optimizer; `learning_rate` is a float or a schedule.

    A schedule is evaluated at `step` (a variable) when given, else at the optimizer's own
    `iterations`, which Keras counts only over applied updates.

    `ema_decay` (None: none): the optimizer also keeps an exponential moving average of the variables it
    updates (Keras' `use_ema`, `ema_momentum=ema_decay`), in optimizer variables, so a checkpoint of the
    optimizer holds it. Keras never writes it into the model by itself (`ema_overwrite_frequency` None): the
    trainer swaps it in for evaluation and export (experiments/training/trainer.py `averaged`).

    `multipliers`: [(variable, factor)], each variable's update taking the learning rate times its factor
    (`with_multipliers`).
    """
    if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule) and step is not None:
        scheduled = learning_rate
        learning_rate = lambda: scheduled(step)  # noqa: E731  (Keras calls a callable rate with no argument)
    options = {} if ema_decay is None else {"use_ema": True, "ema_momentum": float(ema_decay)}
    if name == "adam":
        made = with_multipliers(keras.optimizers.Adam, multipliers, learning_rate, **options)
    elif name == "adamw":
        made = with_multipliers(keras.optimizers.AdamW, multipliers, learning_rate, weight_decay=weight_decay,
                                **options)
    elif name == "sgd":  # Keras refuses an int momentum
        made = with_multipliers(keras.optimizers.SGD, multipliers, learning_rate, momentum=float(momentum), **options)
    else:
        raise ValueError(f"unknown optimizer {name!r}")
    return made


def with_multipliers(optimizer_class, multipliers, *args, **kwargs):
    """`optimizer_class(*args, **kwargs)`, or with `multipliers` ([(variable, factor)]) an instance of a subclass
    whose `update_step` applies each of those variables' updates at the learning rate times its factor. The factors
    live in the subclass, not the instance, so the optimizer's checkpoint holds what the plain optimizer's does.
    AdamW's decoupled weight decay keeps the base rate."""
    if not multipliers:
        return optimizer_class(*args, **kwargs)
    factors = {}

    class Multiplied(optimizer_class):
        def update_step(self, gradient, variable, learning_rate):
            factor = factors.get(self._var_key(variable))
            if factor is not None:
                learning_rate = learning_rate * factor
            return super().update_step(gradient, variable, learning_rate)

    Multiplied.__name__ = optimizer_class.__name__
    made = Multiplied(*args, **kwargs)
    factors.update({made._var_key(variable): factor for variable, factor in multipliers})
    return made
