"""The architecture docs/architecture.md describes: layers without cycles, and modules and functions short enough to read."""
import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import PROJECT

SOURCES = ("data", "models", "experiments", "benchmarks", "run.py")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


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


def test_modules_and_functions_stay_short():
    long_files, long_functions = [], []
    for path in _python_files():
        source = path.read_text()
        if source.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(PROJECT)}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(PROJECT)}:{node.lineno} {node.name}: {length} lines")
    assert not long_files, long_files
    assert not long_functions, long_functions


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
    data/integrity/atomic_file.py alone: each is done one way, in one place."""
    flocks, replaces = _calls("fcntl", "flock"), _calls("os", "replace")
    assert len(flocks) == 1 and flocks[0].startswith("data/integrity/locks.py:"), flocks
    assert len(replaces) == 1 and replaces[0].startswith("data/integrity/atomic_file.py:"), replaces


# Where a reader enters each file of the documented path, and the file of the path that calls it there.
_ENTRIES = {"run.py": ("train_and_evaluate", None), "experiments/runner.py": ("run", "run.py"),
            "data/input_fn.py": ("input_fn", "experiments/runner.py"),
            "data/chest_xray.py": ("load", "data/input_fn.py"), "experiments/trainer.py": ("train_loop", "experiments/runner.py")}
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
    if path == "experiments/trainer.py":  # the first step: what came before it is all this test asks
        print(json.dumps(callers), flush=True)
        os._exit(0)

sys.argv = ["run.py", *sys.argv[3:]]
sys.setprofile(profile)
runpy.run_path(os.path.join(project, "run.py"), run_name="__main__")
"""


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
    # not open: cli.py's config check and exit status, progress.py's log lines above the bar.
    project_files = {path for path in callers["experiments/trainer.py"] if not path.startswith((".venv", "<"))}
    assert project_files <= {"run.py", "experiments/cli.py", "experiments/runner.py", "experiments/progress.py"}, \
        project_files
