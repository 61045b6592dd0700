"""The architecture docs/architecture.md describes: layers without cycles, a main that reads top to bottom,
settings read once, and imports without side effects."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PROJECT

SOURCES = ("data", "models", "experiments", "benchmarks", "run.py")


def _python_files():
    for name in SOURCES:
        path = PROJECT / name
        yield from [path] if path.is_file() else sorted(path.rglob("*.py"))


def test_layers_and_no_import_cycles():
    """`lint-imports` checks pyproject.toml's contracts: data imports neither models nor experiments, models
    does not import experiments, and no package's modules import each other in a cycle."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=PROJECT, capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, PYTHONPATH=str(PROJECT)))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in result.stdout


# Each role's main, and the banner sections it reads in, in the order a run takes them; the assembly they share.
_MAINS = {("experiments/runner.py", "train"): ["Assembly", "Restore", "Loop", "Close"],
          ("experiments/checkpoint_modes.py", "main"): ["Assembly", "Restore", "The mode", "Close"],
          ("experiments/sidecar.py", "main"): ["Assembly", "Loop", "Close"],
          ("experiments/assembly.py", "assemble"): ["Settings", "Run directory", "Data", "Model", "Outputs"]}


def _function(path, name):
    """(the source lines, the ast node) of the module-level function `name` in `path`."""
    source = (PROJECT / path).read_text()
    node = next(node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == name)
    return source.splitlines()[node.lineno - 1:node.end_lineno], node


@pytest.mark.parametrize("path, name", list(_MAINS))
def test_each_roles_main_reads_top_to_bottom_in_its_sections_without_a_branch_on_the_role(path, name):
    """A role's main, and the assembly each one takes its run from, is one function in banner sections, in the
    order a run takes them, about a screen long, and no `if` in it asks for the mode or whether it is the sidecar:
    experiments/runner.py `run` picks the role, and the role's declaration says how its run is assembled."""
    body, main = _function(path, name)
    banners = [re.match(r"\s*# ([A-Z][a-z]+(?: [a-z]+)?)\b", line).group(1) for line in body
               if re.fullmatch(r"\s*# .*-{10,}", line)]
    assert banners == _MAINS[path, name], banners
    assert len(body) <= 60, len(body)
    tests = [ast.unparse(node.test) for node in ast.walk(main) if isinstance(node, (ast.If, ast.IfExp))]
    assert not [test for test in tests if re.search(r"mode|wanted|evaluator", test)], tests


def test_one_function_picks_the_role():
    """experiments/runner.py `run` picks the role in a few lines, and is where the other roles' mains are called."""
    _, run = _function("experiments/runner.py", "run")
    assert len(run.body) <= 6, ast.unparse(run)  # the docstring, then the dispatch
    lines = range(run.lineno, run.end_lineno + 1)
    callers = _calls("sidecar", "main") + _calls("checkpoint_modes", "main")
    assert len(callers) == 2 and all(caller.startswith("experiments/runner.py:") and int(caller.split(":")[1]) in lines
                                     for caller in callers), callers


def test_every_main_takes_its_run_from_the_one_assembly():
    """Each role's main calls experiments/assembly.py `assemble` once, and the product makes the strategy, the
    Trainer, the summaries and the evaluator there alone: the mains differ only in what they do with the run."""
    assembled = _calls("assembly", "assemble")
    for (path, name) in [main for main in _MAINS if main[1] != "assemble"]:
        _, main = _function(path, name)
        inside = [call for call in assembled if call.startswith(f"{path}:")
                  and main.lineno <= int(call.split(":")[1]) <= main.end_lineno]
        assert len(inside) == 1, (path, assembled)
    assert len(assembled) == 3, assembled
    made = (_calls("strategies", "make_strategy") + _calls("trainer", "Trainer") + _calls("summaries", "Summaries")
            + _calls("tf_harness.experiments.training.trainer", "Trainer")
            + _calls("tf_harness.experiments.summaries", "Summaries")
            + _calls("tf_harness.experiments.evaluator", "Evaluator"))
    made = [call for call in made if not call.startswith("benchmarks/")]  # a benchmark builds what it times
    assert made and all(call.startswith("experiments/assembly.py:") for call in made), made


def _reads_the_config(tree) -> bool:
    """Whether a module reads a raw config (a name `cfg`) by attribute, item or `get`, or Hydra's (`HydraConfig`)."""
    return any(isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.value, ast.Name)
               and node.value.id == "cfg" for node in ast.walk(tree)) or any(
        isinstance(node, ast.Name) and node.id == "HydraConfig" or isinstance(node, ast.alias)
        and node.name.endswith("HydraConfig") for node in ast.walk(tree))


def test_the_config_reader_sees_hydra_config_too():
    """The check below would miss a module that asks Hydra for its config under any other name than `cfg`."""
    assert _reads_the_config(ast.parse("from hydra.core.hydra_config import HydraConfig\n"))
    assert _reads_the_config(ast.parse("def f(cfg):\n    return cfg.trainer\n"))
    assert not _reads_the_config(ast.parse("def f(settings):\n    return settings.trainer\n"))


def test_at_most_three_modules_read_the_raw_config():
    """The config becomes Settings, and what Hydra says about the job a settings.Job, at the top
    (experiments/config/settings.py); the schema check and the re-entry comparison read it raw, before that. Every other
    module, the command line's wrappers and the runner included, takes plain values."""
    readers = sorted(str(path.relative_to(PROJECT)) for path in _python_files()
                     if not str(path.relative_to(PROJECT)).startswith("benchmarks")
                     and _reads_the_config(ast.parse(path.read_text())))
    assert len(readers) <= 3 and set(readers) <= {"experiments/config/settings.py", "experiments/config/schema.py",
                                                    "experiments/run_dir/reentry.py"}, readers


def test_importing_a_module_changes_no_global_state():
    """Environment, warnings, log levels and config resolvers are set by cli.setup(), which entry points call."""
    check = ("import logging, os, sys, warnings\n"
             "import hydra, numpy, omegaconf  # what they do as they import is theirs\n"
             "before = (dict(os.environ), list(warnings.filters), logging.raiseExceptions,\n"
             "          logging.getLogger('tensorflow').level)\n"
             "from omegaconf import OmegaConf\n"
             "import tf_harness.experiments.cli, tf_harness.experiments.config.settings, tf_harness.experiments.config.schema\n"
             "after = (dict(os.environ), list(warnings.filters), logging.raiseExceptions,\n"
             "         logging.getLogger('tensorflow').level)\n"
             "assert before == after, [b == a for b, a in zip(before, after)]\n"
             "assert not OmegaConf.has_resolver('run_id') and not OmegaConf.has_resolver('run_dir_subdir')\n"
             "assert 'tensorflow' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", check], cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def _calls(module, function):
    """Where the source calls `module.function` (as such, or imported by name): ["path:line", ...]."""
    found = []
    for path in _python_files():
        tree = ast.parse(path.read_text())
        by_name = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                   and node.module == module for alias in node.names if alias.name == function}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = node.func
            if (isinstance(called, ast.Attribute) and called.attr == function and isinstance(called.value, ast.Name)
                    and called.value.id == module) or (isinstance(called, ast.Name) and called.id in by_name):
                found.append(f"{path.relative_to(PROJECT)}:{node.lineno}")
    return found


def test_one_module_takes_file_locks_and_one_replaces_files():
    """Locks on files are taken in data/integrity/locks.py alone, and files are renamed over others in
    data/integrity/writing.py alone: each is done one way, in one place."""
    flocks, replaces = _calls("fcntl", "flock"), _calls("os", "replace")
    assert len(flocks) == 1 and flocks[0].startswith("data/integrity/locks.py:"), flocks
    assert len(replaces) == 1 and replaces[0].startswith("data/integrity/writing.py:"), replaces


def test_the_harness_traces_its_functions_without_autograph():
    """Every tf.function of the harness (benchmarks' baselines aside) is traced as written, `autograph=False`:
    AutoGraph would rewrite each function the step calls, in every new process, before the first trace
    (docs/training-loop.md)."""
    found = []
    for path in _python_files():
        if path.relative_to(PROJECT).parts[0] == "benchmarks":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            decorators = node.decorator_list if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            bare = [item for item in decorators if ast.unparse(item) == "tf.function"]
            called = isinstance(node, ast.Call) and ast.unparse(node.func) == "tf.function" and not any(
                keyword.arg == "autograph" and ast.unparse(keyword.value) == "False" for keyword in node.keywords)
            if bare or called:
                found.append(f"{path.relative_to(PROJECT)}:{node.lineno}")
    assert not found, found


def test_no_module_uses_hydras_internals_or_rewrites_the_command_line():
    """A single run is composed with Hydra's public compose API (experiments/cli.py `single_run`), from the overrides
    as typed: nothing imports `hydra._internal`, and no entry point assigns `sys.argv` for Hydra to read."""
    internal, rewrites = [], []
    for path in _python_files():
        if str(path.relative_to(PROJECT)).startswith(("benchmarks", "tests")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            internal += [f"{path.relative_to(PROJECT)}:{node.lineno}" for name in names
                         if name.startswith("hydra._internal")]
            targets = node.targets if isinstance(node, ast.Assign) else []
            rewrites += [f"{path.relative_to(PROJECT)}:{node.lineno}" for target in targets
                         if "sys.argv" in ast.unparse(target)]
    assert internal == [] and rewrites == [], (internal, rewrites)


# The modules a run's whole Settings reaches: the entry points, the mains and their sections, the run directory's
# claim, the HParams record (every key is a column) and the Trainer (model, pipeline and trainer groups at once).
WHOLE_SETTINGS = {"data/tfrecords/__main__.py", "experiments/checkpoint_modes.py", "experiments/cli.py",
                  "experiments/sweeps/hparams.py", "experiments/run_dir/directory.py", "experiments/run_dir/input_record.py",
                  "experiments/runner.py", "experiments/assembly.py", "experiments/sidecar.py", "experiments/summaries.py",
                  "experiments/training/trainer.py", "experiments/training/warm_start.py"}


def test_a_component_receives_its_settings_group_not_the_whole_settings():
    """Following `settings` from the run's entry entered 34 files. A parameter named `settings`, unannotated or
    annotated Settings, takes the whole of them; every other component takes its group (`trainer_settings`, a
    group's dataclass), so the modules the whole reaches stay the few listed."""
    receiving = set()
    for path in _python_files():
        name = str(path.relative_to(PROJECT))
        if name.startswith(("benchmarks", "tests")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                receiving |= {name for arg in node.args.args + node.args.kwonlyargs if arg.arg == "settings"
                              and (arg.annotation is None or ast.unparse(arg.annotation) == "Settings")}
    assert receiving == WHOLE_SETTINGS and len(receiving) <= 15, sorted(receiving ^ WHOLE_SETTINGS)


# Where a reader enters each file of the documented path, and the file of the path that calls it there.
_ENTRIES = {"run.py": ("compose_and_run", None), "experiments/runner.py": ("run", "run.py"),
            "data/input_fn.py": ("input_fn", "experiments/runner.py"),
            "data/chest_xray.py": ("load", "data/input_fn.py"), "experiments/training/trainer.py": ("train_loop", "experiments/runner.py")}
_TRACE = """
import json, os, runpy, sys
project, wanted = sys.argv[1], json.loads(sys.argv[2])
entries = {os.path.join(project, path): name for path, (name, _) in wanted.items()}
callers = {}

def profile(frame, event, arg):
    if event != "call" or entries.get(frame.f_code.co_filename) != frame.f_code.co_name:
        return
    path = os.path.relpath(frame.f_code.co_filename, project)
    if path in callers:
        return
    stack, caller = [], frame.f_back
    while caller is not None:
        stack.append(os.path.relpath(caller.f_code.co_filename, project))
        caller = caller.f_back
    callers[path] = stack
    if path == "experiments/training/trainer.py":  # the first step: what came before it is all this test asks
        print(json.dumps(callers), flush=True)
        os._exit(0)

import hydra, keras, tensorflow  # imported before the profile, which would see each of their calls: no file of the path
sys.argv = ["run.py", *sys.argv[3:]]
sys.setprofile(profile)
runpy.run_path(os.path.join(project, "run.py"), run_name="__main__")
"""


def project_file(path, project=PROJECT) -> bool:
    """Whether `path` (relative to `project`, as the trace writes the files on the stack) is one of the project's
    own files: a file inside the project folder, and inside no virtual environment (a folder holding pyvenv.cfg,
    whatever its name) or installed packages there, wherever the interpreter's environment lives."""
    project = Path(os.path.abspath(project))
    full = Path(os.path.abspath(project / path))
    if not full.is_file() or not full.is_relative_to(project):  # "<frozen runpy>", "../venv/...", the stdlib
        return False
    parts = full.relative_to(project).parts
    folders = [project.joinpath(*parts[:end]) for end in range(1, len(parts))]
    return not any(folder.name in ("site-packages", "dist-packages") or (folder / "pyvenv.cfg").is_file()
                   for folder in folders)


def test_a_project_file_is_one_inside_the_project_and_outside_any_environment(tmp_path):
    """The path test counted the files of a virtual environment beside the clone (../venv/...) as the project's."""
    project = tmp_path / "clone"
    files = ["run.py", "experiments/cli.py", ".venv/lib/python3.11/site-packages/hydra/main.py",
             "env/lib/python3.11/site-packages/hydra/main.py", "env/bin/tool.py", "vendor/site-packages/hydra/main.py",
             "../venv/lib/python3.11/site-packages/hydra/main.py", "../elsewhere.py"]
    for name in files:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("")
    for environment in (".venv", "env"):
        (project / environment / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert [name for name in files if project_file(name, project)] == ["run.py", "experiments/cli.py"]
    assert not project_file("<frozen runpy>", project) and not project_file("experiments/missing.py", project)
    assert not project_file(str(tmp_path / "venv/lib/python3.11/site-packages/hydra/main.py"), project)


def test_the_documented_path_to_the_first_step_is_the_one_a_run_takes(tmp_path):
    """docs/architecture.md lists the files from `python run.py dataset=chest_xray` to the first step; a real
    run enters each one from the one before it."""
    import json
    import re
    text = (PROJECT / "docs" / "architecture.md").read_text()
    section = text[text.index("## From the command line to the first step"):]
    documented = re.findall(r"^\d\. `([^`]+)`:", section, flags=re.M)
    assert documented == list(_ENTRIES), documented
    assert "four files after run.py" in section and len(documented) == 5
    result = subprocess.run([sys.executable, "-c", _TRACE, str(PROJECT), json.dumps(_ENTRIES), "dataset=chest_xray",
                             "model=semi_alexnet", "pipeline.image_size=32", "pipeline.batch_size=4",
                             "trainer.train_steps=1", f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=PROJECT, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    callers = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(callers) == set(documented), callers
    for entered, (function, caller) in list(_ENTRIES.items())[1:]:
        # The nearest file of the path on the stack is the one the documented step comes from.
        nearest = next(path for path in callers[entered] if path in _ENTRIES)
        assert nearest == caller, f"{entered}'s {function} was called from {nearest}, not {caller}"
    # At the first step, no file outside the path stands between the command and it, but wrappers a reader need
    # not open: cli.py's config check and exit status.
    project_files = {path for path in callers["experiments/training/trainer.py"] if project_file(path)}
    assert project_files <= {"run.py", "experiments/cli.py", "experiments/runner.py", "experiments/progress.py"}, \
        project_files
