"""trainer.optimizer and trainer.schedule: each optimizer trains, each schedule has its closed form, and
TensorBoard's learning_rate follows the schedule."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_harness.experiments.training import optimizers
from tests.conftest import event_tags, run_cli


def _tiny_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.build((None, 3))
    return model


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
@pytest.mark.parametrize("schedule", ["constant", "cosine", "step"])
def test_each_optimizer_builds_and_trains_a_step(name, schedule):
    model = _tiny_model()
    step = tf.Variable(0, dtype=tf.int64)
    rate = optimizers.schedule(schedule, 0.1, train_steps=10, warmup_steps=2 if schedule == "cosine" else 0,
                               decay_steps=5, decay_rate=0.5)
    optimizer = optimizers.optimizer(name, rate, step=step, momentum=0.9, weight_decay=0.01)
    optimizer.build(model.trainable_variables)
    step.assign(1)  # at step 0 the warm-up's rate is 0
    before = [v.numpy().copy() for v in model.trainable_variables]
    x, y = tf.ones((4, 3)), tf.zeros((4, 2))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y + 1.0))
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    assert any(not np.allclose(b, v.numpy()) for b, v in zip(before, model.trainable_variables))
    assert int(optimizer.iterations.numpy()) == 1
    expected = {"adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW, "sgd": keras.optimizers.SGD}[name]
    assert type(optimizer) is expected
    if name == "sgd":
        assert optimizer.momentum == 0.9
    if name == "adamw":
        assert optimizer.weight_decay == 0.01


def _rate_at(rate, step):
    return float(keras.ops.convert_to_numpy(rate(step))) if callable(rate) else rate


def test_cosine_with_warmup_follows_its_closed_form():
    rate = optimizers.schedule("cosine", 0.01, train_steps=110, warmup_steps=10)
    cosine = lambda step: 0.01 * 0.5 * (1 + math.cos(math.pi * (step - 10) / 100))  # noqa: E731
    for step, expected in [(5, 0.01 * 5 / 10), (35, cosine(35)), (110, 0.0)]:
        assert _rate_at(rate, step) == pytest.approx(expected, abs=1e-7), step


def test_step_decay_follows_its_closed_form():
    rate = optimizers.schedule("step", 0.1, train_steps=100, decay_steps=10, decay_rate=0.5)
    for step, expected in [(9, 0.1), (10, 0.05), (25, 0.025)]:
        assert _rate_at(rate, step) == pytest.approx(expected, rel=1e-6), step


def test_constant_is_a_plain_rate_and_the_schedule_follows_the_given_step():
    assert optimizers.schedule("constant", 0.001, train_steps=10) == 0.001
    step = tf.Variable(0, dtype=tf.int64)
    optimizer = optimizers.optimizer("adam", optimizers.schedule("step", 0.1, 100, decay_steps=10, decay_rate=0.5),
                                     step=step)
    step.assign(20)  # optimizer.iterations is still 0: the rate follows `step`
    assert float(keras.ops.convert_to_numpy(optimizer.learning_rate)) == pytest.approx(0.025)


def test_a_checkpoint_of_plain_adam_restores_into_the_default_optimizer(tmp_path):
    model = _tiny_model()
    old = keras.optimizers.Adam(0.001)
    old.build(model.trainable_variables)
    path = tf.train.Checkpoint(model=model, optimizer=old).save(str(tmp_path / "ckpt"))
    new = optimizers.optimizer("adam", optimizers.schedule("constant", 0.001, train_steps=10),
                               step=tf.Variable(0, dtype=tf.int64))
    new.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=new).restore(path).assert_consumed()


@pytest.mark.slow  # a training process
def test_tensorboard_learning_rate_follows_a_cosine_schedule(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli("dataset=lfw_pairs", "experiment=smoke", "pipeline.image_size=24", "model.widths=[8,16]",
                     "model.embedding_size=16", "model.head_units=8", "trainer.schedule=cosine",
                     "trainer.learning_rate=0.01", "trainer.warmup_steps=2", "trainer.train_steps=4",
                     "trainer.log_every=1", "trainer.steps_per_loop=1", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    from tensorboard.util import tensor_util
    train, _ = event_tags(run_dir / "train")
    logged = {event.step: float(tensor_util.make_ndarray(event.tensor_proto))
              for event in train.Tensors("learning_rate")}
    # Logged at global step S: the rate of the next step, warm-up 0 -> 0.01 over 2 steps, then cosine to 0 at 4.
    expected = {1: 0.005, 2: 0.01, 3: 0.01 * 0.5 * (1 + math.cos(math.pi / 2))}
    for step, rate in expected.items():
        assert logged[step] == pytest.approx(rate, abs=1e-7), (step, logged)
