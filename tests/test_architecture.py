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
