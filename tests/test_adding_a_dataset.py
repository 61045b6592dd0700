"""docs/adding-a-dataset.md, followed to the letter in a copy of the project: its four files, then its run."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.conftest import PROJECT

GUIDE = PROJECT / "docs" / "adding-a-dataset.md"
# A fenced block that names its file: ```python data/<name>.py
FILE_BLOCK = re.compile(r"^```\w+ (\S+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
RUN_BLOCK = re.compile(r"^```bash\n(python run\.py [^\n]*)\n```", re.MULTILINE)
TASKS_LINE = "TASKS = Registry({\n"


def _guide():
    """({path: text} of the guide's file blocks, the run command's arguments)."""
    text = GUIDE.read_text()
    files = {path: body for path, body in FILE_BLOCK.findall(text)}
    (command,) = RUN_BLOCK.findall(text)
    return files, shlex.split(command)[2:]


def _default_model(dataset_yaml):
    (model,) = re.findall(r"^  - override /model: (\w+)$", dataset_yaml, re.MULTILINE)
    return model


def _copy_project(target):
    """The project's files as git sees them (tracked, or new and not ignored), as a folder named tf_harness."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=PROJECT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = PROJECT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _add_dataset(copy, files):
    """Steps 1-3 write their files; step 4 adds its line to TASKS."""
    registry = copy / "data" / "__init__.py"
    for path, body in files.items():
        if path == "data/__init__.py":
            (line,) = body.splitlines()
            text = registry.read_text()
            assert text.count(TASKS_LINE) == 1, "data/__init__.py no longer opens TASKS as the guide's step 4 expects"
            registry.write_text(text.replace(TASKS_LINE, TASKS_LINE + line + "\n"))
        else:
            assert not (copy / path).exists(), f"{path} exists already"
            (copy / path).write_text(body)


@pytest.mark.slow  # a training process
def test_the_guide_adds_a_dataset_that_trains(tmp_path):
    files, args = _guide()
    dataset = next(arg.partition("=")[2] for arg in args if arg.startswith("dataset="))
    # Exactly the four steps: the Task, its sample generator, its YAML and the TASKS line.
    assert sorted(files) == sorted([f"data/{dataset}.py", f"data/samples/{dataset}.py",
                                    f"conf/dataset/{dataset}.yaml", "data/__init__.py"])
    copy = _copy_project(tmp_path / "tf_harness")
    _add_dataset(copy, files)
    # tf_harness is the editable install's namespace package, mapped to the checkout; a folder named tf_harness
    # first on the path comes first in it, so the copy's modules and conf/ are the ones imported.
    env = dict(os.environ, PYTHONPATH=str(tmp_path), HARNESS_CACHE=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="2")
    where = subprocess.run(
        [sys.executable, "-c", "import tf_harness.conf, tf_harness.data.samples, tf_harness.experiments.cli as c\n"
                               "from tf_harness.data import TASKS\n"
                               f"print(TASKS['{dataset}'].__module__, tf_harness.conf.__file__, c.__file__)"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert where.returncode == 0, where.stderr[-2000:]
    module, *paths = where.stdout.split()
    assert module == f"tf_harness.data.{dataset}"
    assert all(path.startswith(str(copy)) for path in paths), paths

    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "run.py", *args, f"hydra.run.dir={run_dir}"], cwd=copy, env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    saved = (run_dir / ".hydra" / "config.yaml").read_text()
    assert re.search(rf"^model:\n  name: {_default_model(files[f'conf/dataset/{dataset}.yaml'])}$", saved, re.M), saved
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_step"] > 0 and 0.0 <= metrics["accuracy"] <= 1.0, metrics
    assert f"embedded {dataset} sample" in result.stdout + result.stderr


def test_the_guide_names_no_file_beyond_its_four_steps():
    """The guide's four numbered steps, one file each, and the TASKS opening that step 4's line goes under."""
    files, _ = _guide()
    assert len(files) == 4
    text = GUIDE.read_text()
    steps = re.findall(r"^## (\d)\. ", text, re.MULTILINE)
    assert steps == ["1", "2", "3", "4"]
    assert TASKS_LINE in (PROJECT / "data" / "__init__.py").read_text()
