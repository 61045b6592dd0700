"""Embedded samples: staging folders owned by a lock, not a pid, and samples that must match their manifest."""
import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from tf_harness.data import samples
from tf_harness.data.samples import sample_root, staging
from tests.refusals import assert_names, one_naming
from tests.conftest import PROJECT

# A process that holds a staging folder's lock, as a live generation in another process, host or PID namespace does.
HOLD = ("import fcntl, sys, time; lock = open(sys.argv[1], 'r+'); fcntl.flock(lock, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(600)")
# Another process's start: it removes what it judges stale, as sample_root does first.
REMOVE_STALE = ("import sys; from pathlib import Path; from tf_harness.data.samples import staging; "
                "print(len(staging.remove_stale(Path(sys.argv[1]))))")


def _folder(parent, pid, host=None, lock=True):
    path = parent / f".toy.{pid}@{host or socket.gethostname()}.abcd1234"
    (path / "data").mkdir(parents=True)
    if lock:
        (path / staging.LOCK).touch()
    return path


def _not_alive_here() -> int:
    """A pid no process has here, as a live generator's pid looks from another PID namespace."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_staging_folder_whose_lock_is_held_is_never_removed_and_a_dead_one_is(tmp_path, caplog):
    live = _folder(tmp_path, _not_alive_here())  # same host name, a pid not visible here: a container's run
    dead = _folder(tmp_path, os.getpid())  # its lock is free, whatever its name says
    fresh, old = _folder(tmp_path, 11, lock=False), _folder(tmp_path, 12, "elsewhere", lock=False)
    hour_ago = time.time() - 2 * staging.UNOWNED_AGE_S
    os.utime(old, (hour_ago, hour_ago))  # a folder of an older release, or one made this instant: by its age
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(live / staging.LOCK)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with caplog.at_level(logging.INFO, logger="tf_harness.data.samples.staging"):
            removed = staging.remove_stale(tmp_path)
        assert sorted(removed) == sorted([dead, old])
        assert live.exists() and fresh.exists() and (live / "data").exists()
        assert_names(one_naming(caplog.messages, dead), "Removed")
    finally:
        holder.kill()
        holder.wait()
    assert staging.remove_stale(tmp_path) == [live]  # its holder is gone, however it ended


def test_a_generation_holds_its_staging_folder_for_its_whole_life(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    seen = []

    def make_toy(root, seed):
        root.mkdir()
        (root / "a.txt").write_text("a" * 10)
        # Another process starting now, on any host, judges the folder live.
        result = subprocess.run([sys.executable, "-c", REMOVE_STALE, str(root.parent.parent)], cwd=PROJECT,
                                capture_output=True, text=True, timeout=120)
        seen.append(result.stdout.strip() or result.stderr[-2000:])
        (root / "b.txt").write_text("b" * 20)

    root = sample_root("toy", make_toy)
    assert seen == ["0"]
    assert (root / "a.txt").read_text() == "a" * 10 and (root / "b.txt").read_text() == "b" * 20
    manifest = json.loads((root / samples.MANIFEST).read_text())
    assert {name: size for name, (size, _) in manifest["files"].items()} == {"a.txt": 10, "b.txt": 20}
    assert [path.name for path in root.parent.iterdir()] == [root.name]  # its staging folder is gone


@pytest.mark.parametrize("damage", ["deleted", "resized", "rewritten at its size", "no manifest",
                                    "a manifest of another shape"])
def test_a_sample_that_does_not_match_its_manifest_is_generated_again(tmp_path, monkeypatch, caplog, damage):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    made = []

    def make_toy(root, seed):
        made.append(seed)
        (root / "images").mkdir(parents=True)
        for name in ("1.png", "2.png", "3.png"):
            (root / "images" / name).write_bytes(name.encode() * 100)

    root = sample_root("toy", make_toy)
    {"deleted": lambda: (root / "images" / "2.png").unlink(),
     "resized": lambda: (root / "images" / "3.png").write_bytes(b"cut"),
     "rewritten at its size": lambda: (root / "images" / "1.png").write_bytes(b"x" * 500),
     "no manifest": lambda: (root / samples.MANIFEST).unlink(),
     "a manifest of another shape": lambda: (root / samples.MANIFEST).write_text('{"version": 2, "files": []}')}[
        damage]()
    with caplog.at_level(logging.INFO, logger="tf_harness.data.samples"):
        assert sample_root("toy", make_toy) == root
    assert made == [0, 0]
    assert all((root / "images" / name).read_bytes() == name.encode() * 100 for name in ("1.png", "2.png", "3.png"))
    lines = [record.getMessage() for record in caplog.records
             if "does not match its manifest" in record.getMessage()]
    reason = {"deleted": "1 of its 3 files missing, 0 changed since, e.g. images/2.png",
              "resized": "0 of its 3 files missing, 1 changed since, e.g. images/3.png",
              "rewritten at its size": "0 of its 3 files missing, 1 changed since, e.g. images/1.png",
              "no manifest": f"it has no readable {samples.MANIFEST}",
              "a manifest of another shape": f"it has no readable {samples.MANIFEST}"}[damage]
    assert len(lines) == 1, lines
    assert_names(lines[0], f"{root} ", f"({reason})")
    assert sorted(path.name for path in root.parent.iterdir()) == [root.name]  # the damaged copy is gone
    caplog.clear()
    sample_root("toy", make_toy)
    assert made == [0, 0] and "does not match" not in caplog.text  # whole now: used as it is


def test_a_samples_folder_is_keyed_by_its_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))

    def make_toy(root, seed):
        root.mkdir()
        (root / "seed.txt").write_text(str(seed))

    assert (sample_root("toy", make_toy) / "seed.txt").read_text() == "0"
    assert (sample_root("toy", make_toy, seed=3) / "seed.txt").read_text() == "3"


def test_a_users_folder_that_matches_a_staging_name_is_never_removed(tmp_path):
    """Only a folder holding nothing but what a generation puts there goes, however old and whatever its name."""
    hour_ago = time.time() - 2 * staging.UNOWNED_AGE_S
    backup, notes = tmp_path / ".my_backup-20240101", tmp_path / f".notes.12@{socket.gethostname()}.abcd1234"
    older_release = tmp_path / ".lfw_pairs-abcd1234"
    for path, child in ((backup, "data"), (notes, "todo.txt"), (older_release, "data")):
        path.mkdir()
        (path / child).mkdir()
        os.utime(path, (hour_ago, hour_ago))
    assert staging.remove_stale(tmp_path) == [older_release]
    assert (backup / "data").is_dir() and (notes / "todo.txt").is_dir()
