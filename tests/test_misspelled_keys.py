"""A misspelled key is one config error line that names the key meant, whether Hydra refuses it (no `+`) or the
harness's own check does (with `+`)."""
import pytest

from tests.conftest import compose, run_cli
from tests.refusals import assert_config_error, assert_names


@pytest.mark.parametrize("override, meant", [
    ("trainer.trian_steps=3", "trainer.train_steps"),
    ("+trainer.trian_steps=3", "trainer.train_steps"),
    ("pipeline.imagesize=32", "pipeline.image_size"),
    ("trian_steps=3", "trainer.train_steps"),
])
def test_a_misspelled_key_gets_did_you_mean(override, meant):
    result = run_cli(override, timeout=120)
    line = assert_config_error(result, override.lstrip("+").partition("=")[0], f"`{meant}`")
    assert "+trainer" not in line.partition(" is not a key")[2]  # no advice to add the misspelled key


def test_the_schema_suggests_a_dataset_option_of_the_chosen_dataset():
    from omegaconf import OmegaConf, open_dict

    from tf_harness.experiments.config import schema

    cfg = compose("dataset=lfw_pairs")
    with open_dict(cfg):
        OmegaConf.update(cfg, "dataset.eval_pair", "pairs", merge=False)
    assert_names(schema.first_problem(cfg, {}), "dataset.eval_pair=pairs ", "dataset=lfw_pairs", "`dataset.eval_pairs`")


def test_a_key_near_none_still_lists_its_groups_keys():
    from tf_harness.experiments.config import schema

    line = schema.unknown_override("Could not override 'trainer.zzz'. To append to your config use +trainer.zzz=3 "
                                   "Key 'zzz' is not in struct")
    assert line.startswith("trainer.zzz=3 is not a key of trainer; its keys are accumulate_steps|")
