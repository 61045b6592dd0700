"""Each config key is declared once (experiments/config/config_keys.py): the schema's tables, the re-entry rules and the
typed Settings all come from that one declaration, and a new key needs its YAML line and its field, nothing else."""
import dataclasses
import json
import os
import re
import subprocess
import sys
import typing
from collections.abc import Mapping

import pytest
from omegaconf import OmegaConf

from tests.conftest import PROJECT, compose
from tests.refusals import assert_config_error, assert_names
from tests.test_adding_a_dataset import _copy_project
from tests.test_config import COMBINATIONS, _leaves


def test_every_key_has_one_declaration_and_the_schema_checks_it():
    from tf_harness.experiments.config import config_keys, schema

    declared = config_keys.DECLARED
    strategy_keys = {key: check for keys in schema.STRATEGY_KEYS.values() for key, check in keys.items()}
    tables = (schema.KEYS, schema.OPTION_KEYS, strategy_keys)
    for key, field in declared.items():
        holding = [table for table in tables if key in table]
        assert len(holding) == 1, f"{key} is in {len(holding)} of the schema's tables"
        assert holding[0][key] is field.metadata["check"], key
    assert sorted(key for table in tables for key in table) == sorted(declared)
    # A key declared twice under one name would be one field; under two names, two leaves of conf/ (test_config).
    names = [f"{group.__name__}.{field.name}" for group in _groups(config_keys.Config) for field in
             dataclasses.fields(group)]
    assert len(names) == len(set(names))


def _groups(group):
    yield group
    for field in dataclasses.fields(group):
        if dataclasses.is_dataclass(field.type):
            yield from _groups(field.type)


def test_the_re_entry_rules_are_the_declared_ones():
    from tf_harness.experiments.config import config_keys
    from tf_harness.experiments.config.config_keys import EVALUATION, RUN_CONTROL
    from tf_harness.experiments.run_dir import reentry

    rules = {key: field.metadata["reentry"] for key, field in config_keys.DECLARED.items()}
    assert set(reentry.RUN_CONTROL) == {key for key, rule in rules.items() if rule is RUN_CONTROL
                                        and not key.startswith("strategy.")}
    assert set(reentry.EVALUATION_KEYS) == {key for key, rule in rules.items() if rule is EVALUATION}
    # The rules docs/run-directory.md states, unchanged by where they are written.
    assert set(reentry.EVALUATION_KEYS) == {"pipeline.batch_size", "dataset.eval_pairs", "dataset.fold"}
    assert {"mode", "checkpoint", "trainer.train_steps", "dataset.root", "pipeline.source", "pipeline.cache",
            "strategy.name", "strategy.logical_cpus"} <= {key for key, rule in rules.items() if rule is RUN_CONTROL}
    for key, rule in rules.items():
        for mode in config_keys.MODES:
            allowed = rule is RUN_CONTROL or (rule is EVALUATION and mode in config_keys.EVALUATION_MODES)
            assert reentry._allowed(key, mode) == allowed, (key, mode)
    assert not reentry._allowed("trainer.no_such_key", "evaluate")


def _holds(value, kind) -> bool:
    """Whether `value` is of the declared type `kind` (a class or a union of them; a bool is no int)."""
    kinds = typing.get_args(kind) or (kind,)
    if isinstance(value, bool):
        return bool in kinds
    return any(value is None if option is type(None) else isinstance(value, option) for option in kinds)


@pytest.mark.parametrize("overrides", COMBINATIONS, ids=" ".join)
def test_settings_hold_every_key_as_a_typed_attribute(overrides):
    from tf_harness.experiments.config import config_keys
    from tf_harness.experiments.config.settings import Settings

    cfg = compose(*overrides)
    written = OmegaConf.to_container(cfg, resolve=True)
    settings = Settings.from_config(cfg)
    for key, value in _leaves(written):
        attribute = settings
        for part in key.split("."):
            attribute = getattr(attribute, part)
        assert _holds(attribute, config_keys.DECLARED[key].type), (key, attribute)
        assert config_keys.plain(attribute) == value and settings.value(key) == value, key
    for key in set(config_keys.DECLARED) - {key for key, _ in _leaves(written)}:  # options the config lacks
        group, _, name = key.rpartition(".")
        assert getattr(getattr(settings, group), name) is None and settings.value(key, "absent") == "absent", key
    assert settings.to_dict() == written
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.trainer.train_steps = 1


# The two lines of the new keys' declarations, in their group's dataclass before this line of it.
ANCHOR = "    early_stopping: EarlyStopping\n"
DECLARATIONS = ("    focal_gamma: float = key(number(0))\n"
                "    summary_every: int = key(integer(1), RUN_CONTROL)\n")
YAML = ("# The exponent of a focal loss's modulating factor.\nfocal_gamma: 2\n"
        "# Write the training scalars every this many steps.\nsummary_every: 5\n")
# Run in the copy: what the schema, Settings and re-entry make of the new keys.
PROBE = """
import json, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tf_harness.experiments.config import schema
from tf_harness.experiments.config.settings import Settings
from tf_harness.experiments.run_dir import reentry

def composed(*overrides):
    with initialize_config_dir(config_dir=str(Path("conf").absolute()), version_base="1.3"):
        return compose(config_name="config", overrides=["dataset=lfw_pairs", *overrides])

cfg, run_dir = composed(), Path(sys.argv[1])
(run_dir / ".hydra").mkdir(parents=True)
OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
trainer = Settings.from_config(cfg).trainer
found = {"problems": schema.problems(cfg, {}), "bad": schema.first_problem(composed("trainer.focal_gamma=-1"), {}),
         "misspelled": schema.first_problem(composed("+trainer.focal_gama=1"), {}),
         "typed": [trainer.focal_gamma, type(trainer.focal_gamma).__name__, trainer.summary_every,
                   type(trainer.summary_every).__name__],
         "run_control": [key in reentry.RUN_CONTROL for key in ("trainer.focal_gamma", "trainer.summary_every")]}
for override in ("trainer.summary_every=7", "trainer.focal_gamma=3"):
    merged, problem = reentry.compose(composed(override), run_dir, [override], {"dataset": "lfw_pairs"})
    found[override] = [problem, None if merged is None else OmegaConf.select(merged, override.partition("=")[0])]
print(json.dumps(found))
"""


def test_a_key_is_added_by_its_yaml_line_and_its_declaration_alone(tmp_path):
    """In a copy of the project, two keys are added to conf/trainer/default.yaml and declared as fields of Trainer,
    one fixed and one run control, with no other edit: the schema checks them, Settings holds them typed, and a
    re-entry refuses or takes a change of each by its declared rule."""
    copy = _copy_project(tmp_path / "tf_harness")
    declarations = copy / "experiments" / "config" / "config_keys.py"
    text = declarations.read_text()
    assert text.count(ANCHOR) == 1, "config_keys.py no longer declares the trainer group as this test expects"
    declarations.write_text(text.replace(ANCHOR, DECLARATIONS + ANCHOR))
    with open(copy / "conf" / "trainer" / "default.yaml", "a") as yaml:
        yaml.write(YAML)
    # The copy's modules come first on the path (tests/test_adding_a_dataset.py says why).
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    probe = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "run")], cwd=copy, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["problems"] == []
    assert assert_names(found["bad"], "trainer.focal_gamma=-1", ">= 0").startswith("trainer.focal_gamma=-1")
    assert assert_names(found["misspelled"], "trainer.focal_gama=1", "`trainer.focal_gamma`").startswith(
        "trainer.focal_gama=1")
    assert found["typed"] == [2.0, "float", 5, "int"]
    assert found["run_control"] == [False, True]
    assert found["trainer.summary_every=7"] == [None, 7]
    problem, merged = found["trainer.focal_gamma=3"]
    assert merged is None and problem.startswith("trainer.focal_gamma=3 "), problem
    assert_names(problem, "saved trainer.focal_gamma=2")
    allowed = problem.partition("on re-entry only ")[2]  # the keys that may change, in words
    assert re.search(r", trainer\.[\w|]*\bsummary_every\b", allowed) and "focal_gamma" not in allowed, problem

    bad = subprocess.run([sys.executable, "run.py", "dataset=lfw_pairs", "trainer.focal_gamma=-1",
                          f"hydra.run.dir={tmp_path / 'bad'}"], cwd=copy, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120, check=False)
    together = subprocess.CompletedProcess(bad.args, bad.returncode, stderr=bad.stdout)  # stdout and stderr in one
    assert assert_config_error(together, "trainer.focal_gamma=-1", ">= 0").startswith(
        "config error: trainer.focal_gamma=-1")
