"""Shared test set-up: a private cache folder, the real fixtures and config composition."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
CONF = PROJECT / "conf"
REAL = PROJECT.parent / "shared" / "fixtures" / "real"


@pytest.fixture(scope="session", autouse=True)
def harness_cache(tmp_path_factory):
    """Samples, indexes and verification results go to a fresh folder for the whole session."""
    cache = tmp_path_factory.mktemp("harness-cache")
    os.environ["HARNESS_CACHE"] = str(cache)
    return cache


@pytest.fixture
def real():
    """The real sample files of the three datasets."""
    if not REAL.exists():
        pytest.skip(f"real fixtures not found at {REAL}")
    return REAL


def compose(*overrides):
    """The project's config composed as `python run.py` would, with `overrides`."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf
    from experiments import cli  # noqa: F401  (registers the run_id resolver)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    OmegaConf.set_struct(cfg, False)
    return cfg


def event_tags(logdir):
    """A run's TensorBoard events read back with TensorBoard's own reader: (accumulator, tags)."""
    from tensorboard.backend.event_processing import event_accumulator
    accumulator = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return accumulator, set(accumulator.Tags()["tensors"]) | set(accumulator.Tags()["scalars"])


def run_cli(*args, timeout=900, env=None, **kwargs):
    """Runs `python run.py args...` as a user would; returns the CompletedProcess. `env` adds variables."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable, "run.py", *args], cwd=PROJECT, capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)
