"""Every config group composes, and each dataset brings its defaults."""
import pytest
from omegaconf import OmegaConf

import data
from models import BUILDERS
from tests.conftest import CONF, compose


def _options(group):
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group", ["dataset", "model", "pipeline", "trainer", "strategy", "experiment",
                                   "hparams_search"])
def test_every_option_of_every_group_composes(group):
    options = _options(group)
    assert options, f"conf/{group}/ is empty"
    for option in options:
        cfg = compose(f"{group}={option}")
        OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


def test_every_dataset_and_model_config_has_code_behind_it():
    assert set(_options("dataset")) == set(data.TASKS)
    assert set(_options("model")) == set(BUILDERS)


def test_chest_xray_brings_its_model_image_size_and_batch_size():
    cfg = compose("dataset=chest_xray")
    assert cfg.model.name == "resnet_v2_152"
    assert cfg.pipeline.image_size == 64 and cfg.pipeline.batch_size == 16


def test_command_line_overrides_win_over_dataset_defaults():
    cfg = compose("dataset=chest_xray", "model=resnet_v2_50", "pipeline.image_size=32")
    assert cfg.model.name == "resnet_v2_50" and cfg.pipeline.image_size == 32


def test_run_directories_land_under_outputs_and_are_unique():
    from hydra import compose as hydra_compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        first = hydra_compose(config_name="config", return_hydra_config=True)
        second = hydra_compose(config_name="config", return_hydra_config=True)
    assert first.hydra.run.dir.startswith("outputs/")
    assert first.hydra.sweep.dir.startswith("outputs/")
    assert first.hydra.run.dir != second.hydra.run.dir
