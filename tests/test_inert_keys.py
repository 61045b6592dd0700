"""Settings that would change nothing, and nothing would say so, are config errors: a key that acts under one
choice of another alone (trainer.momentum with trainer.optimizer=sgd, ...), set away from its default where that
choice is not made; a step the run never reaches (a cosine warm-up's end, a profile's start)."""
import pytest

from tf_harness.experiments.config import schema
from tests.conftest import compose


@pytest.mark.parametrize("overrides, key, choice", [
    (["trainer.momentum=0.5"], "trainer.momentum", "trainer.optimizer=sgd"),
    (["trainer.weight_decay=0.01"], "trainer.weight_decay", "trainer.optimizer=adamw"),
    (["trainer.warmup_steps=100"], "trainer.warmup_steps", "trainer.schedule=cosine"),
    (["trainer.schedule=cosine", "trainer.decay_steps=100"], "trainer.decay_steps", "trainer.schedule=step"),
    (["trainer.decay_rate=0.5"], "trainer.decay_rate", "trainer.schedule=step"),
])
def test_a_key_its_choice_ignores_is_a_config_error(overrides, key, choice):
    line = schema.first_problem(compose("dataset=lfw_pairs", *overrides))
    assert line is not None and line.startswith(f"{key}=") and choice in line, line


@pytest.mark.parametrize("overrides", [
    [], ["experiment=smoke"], ["trainer.optimizer=sgd", "trainer.momentum=0.5"],
    ["trainer.optimizer=adamw", "trainer.weight_decay=0.01"], ["trainer.schedule=cosine", "trainer.warmup_steps=10"],
    ["trainer.schedule=step", "trainer.decay_steps=100", "trainer.decay_rate=0.5"], ["trainer.decay_rate=0.1"],
])
def test_the_same_keys_under_their_choice_or_at_their_default_are_accepted(overrides):
    assert schema.first_problem(compose("dataset=lfw_pairs", *overrides)) is None


@pytest.mark.parametrize("overrides, key", [
    (["trainer.schedule=cosine", "trainer.warmup_steps=500", "trainer.train_steps=500"], "trainer.warmup_steps"),
    (["trainer.profile_steps=[600,602]", "trainer.train_steps=500"], "trainer.profile_steps"),
])
def test_a_step_the_run_never_reaches_is_a_config_error(overrides, key):
    line = schema.first_problem(compose("dataset=lfw_pairs", *overrides))
    assert line is not None and line.startswith(f"{key}=") and "trainer.train_steps=500" in line, line
    smaller = [override.replace("=500", "=499").replace("[600,602]", "[498,500]") for override in overrides[:-1]]
    assert schema.first_problem(compose("dataset=lfw_pairs", *smaller, "trainer.train_steps=500")) is None
