"""Every config group composes, each dataset brings its defaults, and every key has a schema."""
import copy
import os
import re
import resource
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from tf_harness import data
from tf_harness.models import BUILDERS
from tests.conftest import CONF, PROJECT, compose
from tests.refusals import assert_config_error, assert_names, raises_naming


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


@pytest.mark.parametrize("overrides", [
    ("pipeline.batch_size=4", "dataset=imagenet_det", "experiment=smoke", "model.filters=[2,2,2,2,2]"),
    ("dataset=chest_xray", "+trainer.extra=1", "model=semi_alexnet", "pipeline={image_size: 32, batch_size: 2}"),
    ("experiment=smoke", "trainer.learning_rate=1e30", "hydra.run.dir=/tmp/run", "~seed"),
    ("seed=1", "dataset=lfw_pairs", "seed=2"), ("trainer.trian_steps=3",), ("+seed=3",), ("~no_such_key",),
    ("dataset=no_such_dataset",), ("seed=1,2",),
])
def test_the_suites_compose_is_hydras(overrides):
    """tests/conftest.py applies plain values to a cached composition of the choices: the same config, key order
    and errors as Hydra's compose of all the overrides at once."""
    from hydra import compose as hydra_compose, initialize_config_dir

    def outcome(composed):
        try:
            cfg = composed()
        except Exception as error:
            return type(error), str(error), repr(error.__cause__)
        return OmegaConf.to_yaml(cfg), OmegaConf.is_struct(cfg)

    def hydras():
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=list(overrides))
        OmegaConf.set_struct(cfg, False)
        return cfg

    assert outcome(lambda: compose(*overrides)) == outcome(hydras)


def test_run_directories_land_under_outputs_and_are_unique():
    from hydra import compose as hydra_compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        first = hydra_compose(config_name="config", return_hydra_config=True)
        second = hydra_compose(config_name="config", return_hydra_config=True)
    assert first.hydra.run.dir.startswith("outputs/")
    assert first.hydra.sweep.dir.startswith("outputs/")
    assert first.hydra.run.dir != second.hydra.run.dir


# ---------------------------------------------------------------------------------------------
# The schema (experiments/config/schema.py): every key declared, every bad value one line, before TensorFlow

DATASETS = tuple(data.TASKS)


def _inputs(model):
    return OmegaConf.load(CONF / "model" / f"{model}.yaml").inputs


def _fitting_models(dataset):
    wanted = "pair" if data.TASKS[dataset].SPEC.paired else "single"
    return [model for model in _options("model") if _inputs(model) == wanted]


# Every dataset with every model that fits it, every strategy and every experiment: each leaf key of
# conf/ shows up in at least one of these.
COMBINATIONS = ([(f"dataset={dataset}", f"model={model}") for dataset in DATASETS for model in _fitting_models(dataset)]
                + [(f"dataset={dataset}", f"strategy={strategy}") for dataset in DATASETS
                   for strategy in _options("strategy")]
                + [(f"experiment={experiment}",) for experiment in _options("experiment")])


def _leaves(node, prefix=""):
    """(dotted key, value) for every leaf of a plain container; a list is a leaf."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _wrong_type(value):
    """A value of another type than `value`'s."""
    if isinstance(value, bool):
        return "maybe"
    if isinstance(value, (int, float, list)):
        return "abc"
    if isinstance(value, str):
        return 12345
    return {"wrong": "type"}  # null: no key takes a mapping


def _declaration(declared, key):
    """The declaration that judges `key`: its own, or that of the nearest declared key holding it."""
    parts = key.split(".")
    return next((declared[prefix] for prefix in (".".join(parts[:end]) for end in range(len(parts), 0, -1))
                 if prefix in declared), None)


# (key, the declaration judging it, its value's type) given wrong values in an earlier combination. The same
# declaration judges the same wrong value alike in every combination, so each is given them once; a group's name
# (dataset.name, model.name, ...) in every combination, as it decides which other keys are declared.
_GIVEN_WRONG_VALUES = set()


@pytest.mark.parametrize("overrides", COMBINATIONS, ids=" ".join)
def test_every_leaf_key_is_declared_and_rejects_a_wrong_type(overrides):
    """A key added to conf/ without its line in experiments/config/schema.py fails here."""
    from tf_harness.experiments.config import schema

    cfg = compose(*overrides)
    assert schema.problems(cfg, {}) == []
    declared = schema.declared(cfg)
    for key, value in _leaves(OmegaConf.to_container(cfg, resolve=True)):
        given = (key, _declaration(declared, key), type(value))
        if given in _GIVEN_WRONG_VALUES and not key.endswith(".name"):
            continue
        _GIVEN_WRONG_VALUES.add(given)
        for wrong in (_wrong_type(value), {"wrong": "type"}):
            bad = copy.deepcopy(cfg)
            OmegaConf.update(bad, key, wrong, merge=False)
            problem = schema.first_problem(bad, {})
            assert problem is not None, f"{key}={wrong!r} passes the schema"
            assert problem.startswith(f"{key}=") and "is not a key" not in problem, problem


@pytest.mark.parametrize("dataset, override, named", [
    ("chest_xray", "trainer.eval_steps=0", ("trainer.eval_steps=0", ">= 1")),
    ("chest_xray", "trainer.learning_rate=abc", ("trainer.learning_rate=abc", "> 0")),
    ("chest_xray", "trainer.learning_rate=nan", ("trainer.learning_rate=nan", "> 0")),
    ("chest_xray", "trainer.train_steps=1.5", ("trainer.train_steps=1.5", ">= 1")),
    ("chest_xray", "seed=true", ("seed=true", "0..4294967295")),
    ("chest_xray", "pipeline.shuffle_buffer=-5", ("pipeline.shuffle_buffer=-5", ">= 1", "null")),
    ("chest_xray", "pipeline.image_size=[32,32,3]", ("pipeline.image_size=[32,32,3]", ">= 1")),
    ("chest_xray", "pipeline.image_size=0", ("pipeline.image_size=0", ">= 1")),
    ("chest_xray", "dataset.validation_fraction=2", ("dataset.validation_fraction=2", "(0, 1)")),
    ("chest_xray", "dataset.resize=bogus", ("dataset.resize=bogus", "resize|crop_or_pad")),
    ("chest_xray", "dataset.normalize=bogus", ("dataset.normalize=bogus", "unit_range|")),
    ("chest_xray", "dataset.root=/nonexistent/root", ("dataset.root=/nonexistent/root", "existing directory")),
    ("chest_xray", "deterministic=maybe", ("deterministic=maybe", "true", "false")),
    ("chest_xray", "mode=fit", ("mode=fit", "train_and_evaluate|train|evaluate|predict")),
    ("chest_xray", "trainer.optimizer=bogus", ("trainer.optimizer=bogus", "adam|adamw|sgd")),
    ("chest_xray", "trainer.schedule=linear", ("trainer.schedule=linear", "constant|cosine|step")),
    ("chest_xray", "trainer.profile_steps=5", ("trainer.profile_steps=5", "[start, stop]")),
    ("chest_xray", "trainer.decay_rate=0", ("trainer.decay_rate=0", "(0, 1]")),
    ("chest_xray", "pipeline.cache=bogus", ("pipeline.cache=bogus", "none|memory|disk")),
    ("chest_xray", "pipeline.source=bogus", ("pipeline.source=bogus", "files|tfrecord")),
    ("chest_xray", "pipeline.dtype=float64", ("pipeline.dtype=float64", "float32|float16")),
    ("chest_xray", "strategy.name=bogus", ("strategy.name=bogus", "auto|one_device|mirrored|")),
    ("chest_xray", "tfrecord.encoding=bogus", ("tfrecord.encoding=bogus", "encoded|raw")),
    ("chest_xray", "tfrecord.shard_mb=0", ("tfrecord.shard_mb=0", "> 0")),
    ("chest_xray", "+trainer.nesterov=true", ("trainer.nesterov=true", "not a key", "momentum")),
    ("chest_xray", "+dataset.eval_pairs=pairs", ("dataset.eval_pairs=pairs", "not a key", "dataset=chest_xray")),
    ("chest_xray", "model=siamese_cnn", ("model=siamese_cnn", "pair", "dataset=chest_xray", "single")),
    ("chest_xray", "model.inputs=pair", ("model.inputs=pair", "single")),
    ("chest_xray", "model.batch_norm_momentum=2", ("model.batch_norm_momentum=2", "[0, 1]")),
    ("imagenet_det", "model.dropout=1", ("model.dropout=1", "[0, 1)")),
    ("lfw_pairs", "model=semi_alexnet", ("model=semi_alexnet", "single", "dataset=lfw_pairs", "pair")),
    ("lfw_pairs", "model.merge=bogus", ("model.merge=bogus", "embedding|pixel_difference")),
    ("lfw_pairs", "dataset.crop_fraction=2", ("dataset.crop_fraction=2", "(0, 1]", "null")),
    ("lfw_pairs", "dataset.eval_pairs=bogus", ("dataset.eval_pairs=bogus", "dev_test|pairs")),
    ("lfw_pairs", "dataset.fold=10", ("dataset.fold=10", "0..9", "null")),
    ("lfw_pairs", "strategy=mirrored strategy.logical_cpus=0", ("strategy.logical_cpus=0", ">= 1")),
    ("lfw_pairs", "tfrecord.dir=${oc.env:NO_SUCH_VARIABLE}", ("tfrecord.dir=${oc.env:NO_SUCH_VARIABLE}", "resolve")),
    ("lfw_pairs", "pipeline.image_size=4",
     ("pipeline.image_size=4 ", "model=siamese_cnn", "model.widths=[16,32,64]", "8x8")),
    ("lfw_pairs", "pipeline.image_size=[64,15] model.widths=[8,8,8,8]",
     ("pipeline.image_size=[64,15] ", "model=siamese_cnn", "model.widths=[8,8,8,8]", "16x16")),
    ("chest_xray", "pipeline.image_size=[31,200]", ("pipeline.image_size=[31,200] ", "model=resnet_v2_152", "32x32")),
    ("imagenet_det", "model=resnet_v2_50 pipeline.image_size=8 model.pretrained=imagenet",
     ("pipeline.image_size=8 ", "model=resnet_v2_50", "32x32")),
])
def test_a_bad_value_is_one_line_naming_the_key_and_what_is_allowed(dataset, override, named):
    from tf_harness.experiments.config import schema

    problem = schema.first_problem(compose(f"dataset={dataset}", *override.split()), {})
    assert_names(problem, *named)
    assert problem.startswith(named[0]) and "\n" not in problem, problem


@pytest.mark.parametrize("dataset, key, value, line", [
    ("chest_xray", "trainer.eval_steps", "-3", "trainer.eval_steps=-3 is not an integer >= 1, or null"),
    ("chest_xray", "trainer.learning_rate", "-1", "trainer.learning_rate=-1 is not a number > 0"),
    ("chest_xray", "seed", "abc", "seed=abc is not an integer in 0..4294967295"),
    ("chest_xray", "trainer.momentum", "1", "trainer.momentum=1 is not a number in [0, 1)"),
    ("chest_xray", "trainer.profile_steps", "[3,1]",
     "trainer.profile_steps=[3,1] is not [start, stop]: two integers with 0 <= start < stop, or null"),
    ("imagenet_det", "model.filters", "[1,2]", "model.filters=[1,2] is not a list of 5 integers >= 1"),
])
def test_a_bad_value_states_what_its_declaration_allows(dataset, key, value, line):
    """The words after `is not` are the key's declared `allowed` text (experiments/config/config_keys.py)."""
    from tf_harness.experiments.config import schema

    declared = {**schema.KEYS, **schema.OPTION_KEYS}[key]
    problem = schema.first_problem(compose(f"dataset={dataset}", f"{key}={value}"), {})
    assert problem == f"{key}={value} is not {declared.allowed}" and problem.startswith(line), problem


def test_good_values_pass():
    from tf_harness.experiments.config import schema

    for overrides in [("pipeline.image_size=[32,48]", "trainer.eval_steps=null", "pipeline.dtype=float16",
                       "trainer.learning_rate=1", "mode=predict", "trainer.profile_steps=[0,2]", "pipeline.cache=disk", "pipeline.source=tfrecord"),
                      ("dataset=lfw_pairs", "dataset.eval_pairs=pairs", "dataset.fold=9", "dataset.crop_fraction=null",
                       "model.merge=pixel_difference", "tfrecord.encoding=raw"),
                      ("dataset=imagenet_det", "model=resnet_v2_50", "trainer.optimizer=sgd", "deterministic=true")]:
        assert schema.problems(compose(*overrides), {}) == [], overrides


@pytest.mark.parametrize("tf_config, named", [
    ("{not json", ("TF_CONFIG={not json", "JSON")),
    ("[1, 2]", ("TF_CONFIG=[1, 2]", "JSON object")),
    ('{"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 2}}',
     ("TF_CONFIG", "index=2", "0..1")),
    ('{"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": "a"}}',
     ("TF_CONFIG", "index=a", "0..1")),
    ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "chief", "index": 0}}',
     ("TF_CONFIG", "type=chief", "worker")),
    ('{"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 1}}',
     ("TF_CONFIG", "2 workers", "strategy=auto", "strategy=multi_worker")),
])
def test_a_malformed_tf_config_is_one_line(tf_config, named):
    from tf_harness.experiments.config import schema

    problem = schema.first_problem(compose("dataset=chest_xray"), {"TF_CONFIG": tf_config})
    assert_names(problem, *named)
    assert problem.startswith(named[0]) and "\n" not in problem, problem


def test_a_good_tf_config_passes():
    from tf_harness.experiments.config import schema

    config = '{"cluster": {"chief": ["h:1"], "worker": ["h:2"]}, "task": {"type": "worker", "index": 0}}'
    assert schema.problems(compose("dataset=chest_xray", "strategy=multi_worker"), {"TF_CONFIG": config}) == []
    assert schema.problems(compose("dataset=chest_xray"), {"TF_CONFIG": ""}) == []


def test_the_schema_agrees_with_the_code_it_stands_in_for():
    """The schema is read before TensorFlow starts, so it repeats LFW's evaluation pair files' names."""
    from tf_harness.data import lfw_pairs
    from tf_harness.experiments.config import schema

    assert schema.OPTION_KEYS["dataset.eval_pairs"].allowed == f"one of {'|'.join(lfw_pairs.EVAL_PAIRS)}"


def test_the_schema_reads_each_dataset_and_model_from_its_code():
    """Names, keys and inputs come from the lines of TASKS and BUILDERS, read before TensorFlow starts: what the
    schema reads is what the imported Task classes and model family modules hold."""
    from importlib import import_module
    from tf_harness.experiments.config import schema

    assert schema.KEYS["dataset.name"].allowed == f"one of {'|'.join(data.TASKS)}"
    assert schema.KEYS["model.name"].allowed == f"one of {'|'.join(BUILDERS)}"
    for name, task in data.TASKS.items():
        assert task.SPEC.name == compose(f"dataset={name}").dataset.name == name  # its sample is found by it
        assert schema.dataset_inputs(name) == ("pair" if task.SPEC.paired else "single"), name
        assert set(schema.dataset_keys(name)) == {f"dataset.{option}" for option in task.OPTIONS}, name
    for name, path in BUILDERS.paths.items():
        family = import_module(path.partition(":")[0])
        assert BUILDERS[name] is family.build
        assert schema.model_inputs(name) == family.INPUTS, name
        assert set(schema.model_keys(name)) == {"model.inputs", *(f"model.{option}" for option in family.OPTIONS)}
    declared = {key for name in data.TASKS for key in schema.dataset_keys(name)}
    declared |= {key for name in BUILDERS for key in schema.model_keys(name)}
    assert sorted(set(schema.OPTION_KEYS) - declared) == [], "types of keys that no dataset or model declares"


TOY_TASK = """
raise ImportError("the config check reads this module's line in TASKS; it never runs the module")

from tf_harness.data.spec import DatasetSpec
from tf_harness.data.task import Task


class Toy(Task):
    SPEC = DatasetSpec(name="toy", task="binary", class_names=("same",), channels=3)
"""


def _toy_registered(tmp_path, monkeypatch, registry, path, source, inputs="pair", options=()):
    """`source` as a module of its own in `tmp_path`, registered in `registry` as `toy` with `inputs` and `options`."""
    from tf_harness.data.registry import Entry

    module = f"toy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.entries, "toy", Entry(f"{module}:{path}", inputs=inputs, options=options))
    return module


def test_a_task_registered_only_in_tasks_is_known_to_the_schema(tmp_path, monkeypatch):
    from tf_harness.experiments.config import schema

    cfg = compose("dataset=lfw_pairs")
    cfg.dataset.name = "toy"
    del cfg.dataset["fold"]
    problem = assert_names(schema.first_problem(cfg, {}), "dataset.name=toy", "chest_xray|")
    assert problem.startswith("dataset.name=toy") and "not a key" not in problem, problem
    module = _toy_registered(tmp_path, monkeypatch, data.TASKS, "Toy", TOY_TASK, options=("eval_pairs",))
    assert schema.problems(cfg, {}) == []  # its name, its one option and its pairs, from data.TASKS alone
    assert module not in sys.modules
    cfg.dataset.fold = 3
    problem = assert_names(schema.first_problem(cfg, {}), "dataset.fold=3", "not a key", "dataset=toy",
                           "crop_fraction|eval_pairs|flip|max_skipped_fraction|name|normalize|resize|root")
    assert problem.startswith("dataset.fold=3"), problem
    del cfg.dataset["fold"]
    cfg.model = compose("model=semi_alexnet").model
    problem = assert_names(schema.first_problem(cfg, {}), "model=semi_alexnet", "single", "dataset=toy", "pair",
                           "siamese_cnn")
    assert problem.startswith("model=semi_alexnet"), problem


@pytest.mark.parametrize("inputs, typed, named", [
    # A new option needs its type in the schema.
    ("pair", False, ("dataset.threshold=0.5", "experiments/config/config_keys.py")),
    ("pair", True, ("model=semi_alexnet", "single", "dataset=toy", "pair")),
    # A line the schema cannot use is an error naming what to write.
    ("pairs", True, ("toy_", ":Toy", "inputs='pairs'", "single|pair")),
])
def test_what_a_tasks_line_declares_is_what_the_schema_checks(tmp_path, monkeypatch, inputs, typed, named):
    from tf_harness.experiments.config import schema

    if typed:
        monkeypatch.setitem(schema.OPTION_KEYS, "dataset.threshold", schema.number(0, 1))
    cfg = compose("dataset=imagenet_det")
    cfg.dataset.name, cfg.dataset.threshold = "toy", 0.5
    try:
        _toy_registered(tmp_path, monkeypatch, data.TASKS, "Toy", TOY_TASK, inputs=inputs, options=("threshold",))
        found = schema.first_problem(cfg, {})
    except ValueError as error:
        found = str(error)
    assert_names(found, *named)
    assert found.startswith(named[0]) and "\n" not in found, found


def test_a_task_takes_its_options_and_pairs_from_its_line_in_tasks(monkeypatch):
    """The line in TASKS is the one place a dataset's options and pairs are written: its Task class and its
    DatasetSpec take them from there, and writing them again is refused, or must agree."""
    from tf_harness.data.spec import DatasetSpec
    from tf_harness.data.task import Task

    monkeypatch.setitem(data.TASKS.entries, "toy", data.Dataset("toy_tasks:Toy", inputs="pair", options=("fold",)))
    spec = DatasetSpec(name="toy", task="binary", class_names=("same",), channels=3)
    assert spec.paired is True
    assert DatasetSpec(name="toy", task="binary", class_names=("same",), channels=3, paired=True) == spec
    toy = type("Toy", (Task,), {"__module__": "toy_tasks", "SPEC": spec})
    assert toy.OPTIONS == ("fold",)
    assert type("Unlisted", (Task,), {"__module__": "toy_tasks", "SPEC": spec}).OPTIONS == ()
    with raises_naming(TypeError, "toy_tasks:Toy", "OPTIONS", "TASKS (data/__init__.py)"):
        type("Toy", (Task,), {"__module__": "toy_tasks", "SPEC": spec, "OPTIONS": ("fold",)})
    with raises_naming(ValueError, "paired=False", "TASKS", "inputs='pair'"):
        DatasetSpec(name="toy", task="binary", class_names=("same",), channels=3, paired=False)
    with raises_naming(ValueError, "DatasetSpec(name='nowhere')", "TASKS"):
        DatasetSpec(name="nowhere", task="binary", class_names=("same",), channels=3)
    with raises_naming(ValueError, "'toy_tasks.Toy'", "'module:attribute'"):
        data.Dataset("toy_tasks.Toy", inputs="single")
    with raises_naming(ValueError, "toy_tasks:Toy", "options='fold'"):
        data.Dataset("toy_tasks:Toy", inputs="single", options="fold")


def test_a_model_registered_only_in_builders_is_known_to_the_schema(tmp_path, monkeypatch):
    from tf_harness.experiments.config import schema

    cfg = compose("dataset=lfw_pairs")
    cfg.model = {"name": "toy", "inputs": "pair", "dropout": 0.5}
    problem = assert_names(schema.first_problem(cfg, {}), "model.name=toy", "resnet_v2_50|")
    assert problem.startswith("model.name=toy"), problem
    source = 'raise ImportError("never run")\n\ndef build(*args):\n    pass\n'
    _toy_registered(tmp_path, monkeypatch, BUILDERS, "build", source, options=("dropout",))
    assert schema.problems(cfg, {}) == []
    cfg.model.inputs = "single"
    problem = assert_names(schema.first_problem(cfg, {}), "model.inputs=single", "pair")
    assert problem.startswith("model.inputs=single") and "\n" not in problem, problem


def test_checking_good_configs_imports_no_tensorflow():
    """The schema reads every Task and model family it checks against from their lines, never importing them."""
    code = ("import sys\n"
            "from tests.conftest import compose\n"
            "from tf_harness.experiments.config import schema\n"
            "for model in schema.BUILDERS:\n"
            "    for dataset in schema.TASKS:\n"
            "        schema.problems(compose(f'dataset={dataset}', f'model={model}'), {})\n"
            "print(sorted(name for name in sys.modules if name.split('.')[0] in ('tensorflow', 'keras')))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.stdout.strip() == "[]", result.stderr[-2000:]


# Keys in conf/ that no code reads yet, each with what happens meanwhile. An entry that code starts
# reading fails test_every_key_in_conf_is_read_by_some_code until it is removed from here.
NOT_YET_READ = {}
# Keys whose only reader is the schema's own logic, beyond declaring them.
READ_BY_THE_SCHEMA = {"model.inputs": "a model that takes pairs fits only a dataset of pairs"}
SOURCES = [PROJECT / "run.py", *[path for folder in ("data", "models", "experiments", "benchmarks")
                                 for path in sorted((PROJECT / folder).rglob("*.py"))
                                 if path.name not in ("schema.py", "config_keys.py")]]  # they name every key


def _read_in_code(key, sources):
    # A heuristic: the key's last name read as an attribute of the settings (settings.pipeline.cache,
    # model_settings.widths, self.trainer_settings.log_every) or named in quotes (settings.dataset.get("fold")).
    name = re.escape(key.rpartition(".")[2])
    return re.search(rf"(cfg|settings)(\.\w+)*\.{name}\b|[\"']{name}[\"']", sources) is not None


def test_every_key_in_conf_is_read_by_some_code():
    sources = "\n".join(path.read_text() for path in SOURCES)
    keys = {key for overrides in COMBINATIONS for key, _ in _leaves(OmegaConf.to_container(compose(*overrides)))}
    unread = sorted(key for key in keys if not _read_in_code(key, sources) and key not in READ_BY_THE_SCHEMA)
    assert unread == sorted(NOT_YET_READ), f"keys in conf/ that no code reads: {unread}"


@pytest.mark.parametrize("override, env, named", [
    ("trainer.eval_steps=-3", {}, ("trainer.eval_steps=-3", ">= 1")),
    ("dataset.resize=bogus", {}, ("dataset.resize=bogus", "resize|crop_or_pad")),
    ("model=siamese_cnn", {}, ("model=siamese_cnn", "pair", "dataset=chest_xray")),
    ("seed=1", {"TF_CONFIG": "{not json"}, ("TF_CONFIG={not json", "JSON")),
    ("pipeline.image_size=16", {}, ("pipeline.image_size=16 ", "model=resnet_v2_152", "32x32")),
])
def test_python_run_py_reports_a_bad_config_in_one_line_before_tensorflow_starts(tmp_path, override, env, named):
    """TensorFlow's start-up messages are left on (TF_CPP_MIN_LOG_LEVEL unset): none may come before, or at all."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG")}
    started = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "run.py", "dataset=chest_xray", override, f"hydra.run.dir={tmp_path}"],
                            cwd=PROJECT, env={**environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=60, check=False)
    finished = resource.getrusage(resource.RUSAGE_CHILDREN)
    together = subprocess.CompletedProcess(result.args, result.returncode, stderr=result.stdout)
    assert assert_config_error(together, *named).startswith(f"config error: {named[0]}")  # stdout and stderr in one
    # CPU seconds, not wall-clock: the check's own cost, whatever else the machine is running.
    seconds = (finished.ru_utime - started.ru_utime) + (finished.ru_stime - started.ru_stime)
    assert seconds < 2, f"the config check took {seconds:.1f} CPU seconds"


def test_a_bad_config_never_imports_tensorflow(tmp_path):
    code = ("import runpy, sys\n"
            "sys.argv = ['run.py', 'seed=abc', 'hydra.run.dir=' + sys.argv[1]]\n"
            "try:\n"
            "    runpy.run_path('run.py', run_name='__main__')\n"
            "except SystemExit as exit:\n"
            "    print(exit.code, 'tensorflow' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=PROJECT, capture_output=True, text=True,
                            timeout=60, check=False)
    status, imported = result.stdout.split()
    assert imported == "False", result.stderr
    assert_config_error(subprocess.CompletedProcess(result.args, int(status), stderr=result.stderr),
                        "seed=abc", "0..4294967295")


def test_a_datasets_default_model_is_named_once_in_its_yaml_and_takes_its_examples():
    from tf_harness.experiments.config import schema

    for name, task in data.TASKS.items():
        defaults = OmegaConf.to_container(OmegaConf.load(CONF / "dataset" / f"{name}.yaml").defaults)
        models = [entry["override /model"] for entry in defaults if isinstance(entry, dict) and "override /model" in entry]
        assert len(models) == 1, name
        assert compose(f"dataset={name}").model.name == models[0], name
        assert schema.model_inputs(models[0]) == schema.dataset_inputs(name), name
        assert not hasattr(task, "DEFAULT_MODEL"), f"{name}: its default model is its YAML's alone"


# Each model family at its smallest image side, one below it, and with only the height or the width below it.
SIZES = [("chest_xray", "resnet_v2_50", (), 32), ("imagenet_det", "semi_alexnet", ("model.filters=[4,4,4,4,4]",), 1),
         ("lfw_pairs", "siamese_cnn", ("model.widths=[4]",), 2),
         ("lfw_pairs", "siamese_cnn", ("model.widths=[4,4,4]", "model.merge=pixel_difference"), 8)]


@pytest.mark.parametrize("dataset, model, overrides, smallest", SIZES, ids=lambda value: str(value))
def test_the_schema_passes_an_image_size_exactly_when_the_model_builds_for_it(dataset, model, overrides, smallest):
    """What the schema states without TensorFlow (models/__init__.py `smallest_side`) is what Keras builds; and a
    size it would let through that Keras cannot build is a ConfigError naming the model's keys, never a traceback."""
    from tf_harness.data import TASKS
    from tf_harness.data.errors import ConfigError
    from tf_harness.experiments.config import schema
    from tf_harness.experiments.config.settings import Settings
    from tf_harness.experiments.training.trainer import build_model

    spec = TASKS[dataset].SPEC
    sizes = [smallest, [smallest, smallest + 5]]
    sizes += [smallest - 1, [smallest + 5, smallest - 1]] if smallest > 1 else []
    for size in sizes:
        cfg = compose(f"dataset={dataset}", f"model={model}", *overrides, f"pipeline.image_size={size}")
        passed = schema.first_problem(cfg, {}) is None
        settings = Settings.from_config(cfg)
        height, width = (size, size) if isinstance(size, int) else size
        try:
            build_model(settings, spec, (height, width))
            built = True
        except ConfigError as error:
            assert f"model={model}" in str(error) and f"pipeline.image_size={schema.show(size)}" in str(error)
            built = False
        assert passed == built == (min(height, width) >= smallest), (size, passed, built)
