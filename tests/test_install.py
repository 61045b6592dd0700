"""`pip install .` (not editable) into a fresh venv: the commands work from any folder, even one with its
own `models.py` and `data/`, and site-packages gains only the tf_harness namespace."""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import PROJECT
from tests.refusals import assert_config_error

# The repository's folders that install as tf_harness.<name>, every file in them included.
INSTALLED = ("data", "models", "experiments", "conf")
NOT_SHIPPED = shutil.ignore_patterns(".venv", ".git", "outputs", "build", "*.egg-info", "__pycache__", "*.pyc")


def _project_files(folder):
    return {path.relative_to(folder) for path in folder.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv with the project installed from a copy of the tree, as `pip install .` does. Its dependencies
    are this test environment's own, which its install took from the package registries: a line of a .pth file
    puts them after the venv's own site-packages, and pip installs the project alone (`--no-deps`)."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    shutil.copytree(PROJECT, source, ignore=NOT_SHIPPED)
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    python = root / "venv" / "bin" / "python"
    ours = sysconfig.get_paths()
    (_site_packages(root / "venv") / "test-environment.pth").write_text(
        "".join(f"{folder}\n" for folder in dict.fromkeys((ours["purelib"], ours["platlib"]))))
    result = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(source)],
                            capture_output=True, text=True, timeout=1800, env=_clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root / "venv", source


def _clean_env(**extra):
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return dict(env, TF_CPP_MIN_LOG_LEVEL="2", **extra)


def _site_packages(venv):
    paths = sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})
    return Path(paths["purelib"])


def _run(venv, folder, *command):
    """A command of the venv, started in `folder` as a user would there."""
    executable = venv / "bin" / command[0]
    return subprocess.run([str(executable), *command[1:]], cwd=folder, capture_output=True, text=True,
                          timeout=1200, env=_clean_env())


def _user_folder(tmp_path, name, shadowing):
    folder = tmp_path / name
    folder.mkdir()
    if shadowing:  # a user's own modules named like the project's packages, each failing if imported
        (folder / "models.py").write_text("raise ImportError('the user\\'s own models.py was imported')\n")
        (folder / "data").mkdir()
        (folder / "data" / "__init__.py").write_text("raise ImportError('the user\\'s own data/ was imported')\n")
    return folder


@pytest.mark.slow
def test_site_packages_gains_only_the_tf_harness_namespace_with_every_file(venv):
    venv_dir, source = venv
    site = _site_packages(venv_dir)
    for name in ("data", "models", "experiments", "conf", "run.py", "tests", "benchmarks"):
        assert not (site / name).exists(), f"site-packages gained a top-level {name}"
    for name in INSTALLED:
        missing = _project_files(source / name) - _project_files(site / "tf_harness" / name)
        assert not missing, f"not installed from {name}/: {sorted(map(str, missing))}"
    assert (site / "tf_harness" / "data" / "imagenet_det_synsets.txt").is_file()
    assert (site / "tf_harness" / "run.py").read_text() == (source / "run.py").read_text()  # the tf-harness command


@pytest.mark.slow
@pytest.mark.parametrize("shadowing", [False, True], ids=["empty folder", "folder with models.py and data/"])
def test_installed_commands_work_from_a_users_folder(venv, tmp_path, shadowing):
    venv_dir, _ = venv
    folder = _user_folder(tmp_path, "work", shadowing)
    imported = _run(venv_dir, folder, "python", "-c", "import tf_harness.run as m; print(m.__file__)")
    assert imported.stdout.strip().startswith(str(_site_packages(venv_dir))), imported.stdout + imported.stderr

    run_dir = tmp_path / "run"
    trained = _run(venv_dir, folder, "tf-harness", "dataset=chest_xray", "experiment=smoke", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (run_dir / "metrics.json").is_file() and (run_dir / "run.log").is_file()

    # The same exit statuses as run.py: a bad value is one line and exit 2.
    bad = _run(venv_dir, folder, "tf-harness", "seed=abc", f"hydra.run.dir={tmp_path / 'bad'}")
    assert_config_error(bad, "seed=abc ", "0..4294967295")

    for command in (["tf-harness-tfrecords"], ["python", "-m", "tf_harness.data.tfrecords"]):
        shards = tmp_path / f"shards-{len(command)}"
        converted = _run(venv_dir, folder, *command, "dataset=chest_xray", f"tfrecord.dir={shards}",
                         f"hydra.run.dir={tmp_path / f'convert-{len(command)}'}")
        assert converted.returncode == 0, converted.stderr[-3000:]
        assert (shards / "manifest.json").is_file() and list(shards.glob("train-*.tfrecord"))
    # The converter imports TensorFlow (tf_harness.data) before it checks the config, so its start-up lines may
    # come first; its error is still one last line and exit 2.
    bad = _run(venv_dir, folder, "tf-harness-tfrecords", "dataset=nope", f"hydra.run.dir={tmp_path / 'bad2'}")
    assert_config_error(bad, "dataset/nope", alone=False)
