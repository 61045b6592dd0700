"""The role a job runs: experiments/runner.py `run` hands each mode to its role's main, with the job and the
caller's actions, and returns what that main returns."""
import json
from types import SimpleNamespace

import pytest

from tf_harness.experiments import checkpoint_modes, runner, sidecar

from tf_harness.experiments.config import schema

# The role of each mode: the training main, the main of the modes that read a recorded checkpoint, or the sidecar's.
ROLES = {"train_and_evaluate": "train", "train": "train", "evaluate": "checkpoint", "predict": "checkpoint",
         "export": "checkpoint", "continuous_eval": "sidecar"}
EVALUATOR_TASK = json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                             "task": {"type": "evaluator", "index": 0}})


def test_every_mode_has_a_role():
    assert set(ROLES) == set(schema.MODES)


@pytest.fixture
def mains(monkeypatch):
    """The three mains replaced by recorders: the calls they got, as (role, mode, job, actions)."""
    called = []
    for role, module, name in (("train", runner, "train"), ("checkpoint", checkpoint_modes, "main"),
                               ("sidecar", sidecar, "main")):
        def main(settings, job, actions=(), role=role):
            called.append((role, settings.mode, job, list(actions)))
            return role, {"global_step": 3}
        monkeypatch.setattr(module, name, main)
    return called


@pytest.mark.parametrize("mode", sorted(ROLES))
def test_each_mode_runs_in_its_roles_main(mode, mains, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    job, extra = object(), ["an action"]
    assert runner.run(SimpleNamespace(mode=mode), job, extra) == (ROLES[mode], {"global_step": 3})
    assert mains == [(ROLES[mode], mode, job, extra)]


@pytest.mark.parametrize("mode", ["train_and_evaluate", "train"])
def test_tf_configs_evaluator_task_runs_the_sidecar_whatever_the_workers_mode(mode, mains, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", EVALUATOR_TASK)
    runner.run(SimpleNamespace(mode=mode), None)
    assert [call[0] for call in mains] == ["sidecar"]
