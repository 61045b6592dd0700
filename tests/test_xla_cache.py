"""XLA's persistent cache: a second process of the same shapes loads the program, other shapes compile their
own, concurrent processes never see a half-written entry, and dead private folders are cleared."""
import fcntl
import logging
import os
import subprocess
import sys

import pytest

from tests.refusals import assert_names

# One process: enable the cache, run one compiled function on an n x n input, publish.
SCRIPT = """
import sys
from tf_harness.experiments.training import xla_cache
print("shared", xla_cache.enable(sys.argv[1]))
import tensorflow as tf
n = int(sys.argv[2])

@tf.function(jit_compile=True)
def f(x):
    return tf.reduce_sum(tf.matmul(x, x))

print("result", float(f(tf.ones([n, n]))))
print("published", xla_cache.publish())
"""


def start(cache, n, **env):
    # The persistor's own log line says when a program was loaded rather than compiled.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="device_executable_persistor=1", **env)
    env.pop("TF_XLA_FLAGS", None)
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(cache), str(n)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(process):
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    return lines, "Loading cached entry" in err


def entries(cache):
    return sorted(path.name for path in cache.glob("xla/tf-*/*/*.pb"))


@pytest.mark.slow  # three XLA compiles in fresh processes
def test_a_second_process_of_the_same_shapes_loads_the_program_and_other_shapes_compile_their_own(tmp_path):
    first, loaded = finish(start(tmp_path, 8))
    assert first["result"] == "512.0" and first["published"] == "1" and not loaded
    import tensorflow as tf
    names = entries(tmp_path)
    assert len(names) == 1 and names[0].startswith("tf" + tf.__version__.replace(".", "_") + "_"), names
    again, loaded = finish(start(tmp_path, 8))
    assert again["result"] == "512.0" and again["published"] == "0" and loaded
    other, loaded = finish(start(tmp_path, 4))
    assert other["result"] == "64.0" and other["published"] == "1" and not loaded  # never served 8x8's program
    assert len(entries(tmp_path)) == 2
    assert not list(tmp_path.glob("xla/tf-*/*/.job-*"))  # each process removed its private folder


@pytest.mark.slow
def test_processes_that_compile_at_once_share_one_whole_entry(tmp_path):
    results = [finish(process)[0] for process in [start(tmp_path, 16) for _ in range(3)]]
    assert [r["result"] for r in results] == ["4096.0"] * 3
    assert sum(int(r["published"]) for r in results) == 1 and len(entries(tmp_path)) == 1
    later, loaded = finish(start(tmp_path, 16))
    assert later["result"] == "4096.0" and loaded


def test_a_dead_private_folder_is_removed_and_a_live_one_kept(tmp_path):
    from tf_harness.experiments.training import xla_cache
    shared = tmp_path / "shared"
    dead, live = shared / ".job-dead", shared / ".job-live"
    for private in (dead, live):
        private.mkdir(parents=True)
        (private / ".lock").touch()
        (private / "entry.pb").write_bytes(b"x")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(live / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        xla_cache._remove_dead(shared)
        assert not dead.exists() and (live / "entry.pb").exists()
    finally:
        holder.kill()
        holder.wait()
    with open(live / ".lock") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with its holder: the next start may remove it


def test_the_users_own_cache_folder_is_left_as_it_is(tmp_path):
    mine = f"--tf_xla_persistent_cache_directory={tmp_path / 'mine'}"
    process = subprocess.run([sys.executable, "-c", "import os; from tf_harness.experiments.training import xla_cache; "
                              "print(xla_cache.enable(os.environ['HOME_CACHE'])); print(os.environ['TF_XLA_FLAGS'])"],
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, TF_XLA_FLAGS=mine, HOME_CACHE=str(tmp_path / "home")))
    assert process.returncode == 0, process.stderr[-2000:]
    assert process.stdout.splitlines() == ["None", mine]
    assert not (tmp_path / "home").exists()


def test_a_process_started_by_a_run_takes_its_own_folder_and_keeps_the_users_flags(tmp_path):
    """A run started from a Python session that ran one itself (a test suite, a notebook) inherits the flags that
    session's `enable` added; they name the parent's private folder, not a choice of the user's."""
    script = ("import os, sys, subprocess; from tf_harness.experiments.training import xla_cache; "
              "xla_cache.enable(sys.argv[1]); print(os.environ['TF_XLA_FLAGS']); sys.stdout.flush(); "
              "sys.argv[2:] and subprocess.run([sys.executable, '-c', sys.argv[3], sys.argv[1]], check=True)")
    env = dict(os.environ, TF_XLA_FLAGS="--tf_xla_enable_lazy_compilation=false")
    env.pop("HARNESS_XLA_FLAGS_ADDED", None)
    process = subprocess.run([sys.executable, "-c", script, str(tmp_path), "child", script], capture_output=True,
                             text=True, timeout=120, env=env)
    assert process.returncode == 0, process.stderr[-2000:]
    parent, child = process.stdout.splitlines()
    folders = [flags.split("--tf_xla_persistent_cache_directory=")[1].split()[0] for flags in (parent, child)]
    assert folders[0] != folders[1] and all(os.path.basename(f).startswith(".job-") for f in folders), folders
    assert child.count("--tf_xla_persistent_cache_directory") == 1
    assert all(flags.startswith("--tf_xla_enable_lazy_compilation=false ") for flags in (parent, child))

# A process that stands in for a jit_compile run without TensorFlow: it enables the cache, logs its notes, and
# "compiles" the entry argv[2] (a whole protocol buffer, as TensorFlow writes) unless the cache seeded it; then it
# publishes.
FAKE_RUN = """
import logging, sys
from tf_harness.experiments.training import xla_cache
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stdout)
shared = xla_cache.enable(sys.argv[1])
xla_cache.report()
entry = xla_cache._private / sys.argv[2]
print("loaded" if entry.exists() else "compiled")
if not entry.exists():
    entry.write_bytes(bytes.fromhex(sys.argv[3]))
print("published", xla_cache.publish())
"""
NAME = "tf2_21_0_123456789.pb"
# Field 1 (the key), field 2 (the HLO module) and field 3 (the executable), each length-delimited.
ENTRY = b"\x0a\x03key" + b"\x12\x08hlo-prog" + b"\x1a\x90\x03" + bytes(range(256)) * 1 + b"x" * 144


def fake_run(cache, name=NAME, entry=ENTRY):
    process = subprocess.run([sys.executable, "-u", "-c", FAKE_RUN, str(cache), name, entry.hex()], capture_output=True,
                             text=True, timeout=120, env={k: v for k, v in os.environ.items() if k != "TF_XLA_FLAGS"})
    assert process.returncode == 0 and "Traceback" not in process.stderr, process.stderr[-3000:]
    lines = process.stdout.splitlines()
    logged = [line for line in lines if line.startswith(("INFO ", "WARNING "))]
    return [line for line in lines if line not in logged], logged


def shared_folder(cache):
    (folder,) = [path for path in cache.glob("xla/tf-*/*") if path.is_dir()]
    return folder


def assert_whole(folder, name=NAME, entry=ENTRY):
    """The shared entry `name` is `entry`, and its record says so."""
    import hashlib
    import json
    assert (folder / name).read_bytes() == entry
    assert json.loads((folder / f"{name}.sha256").read_text()) == {"bytes": len(entry),
                                                                   "sha256": hashlib.sha256(entry).hexdigest()}


def damage_entry(folder, damage):
    entry, record = folder / NAME, folder / f"{NAME}.sha256"
    size = entry.stat().st_size
    if damage == "cut to half":
        os.truncate(entry, size // 2)
    elif damage == "emptied":
        os.truncate(entry, 0)
    elif damage == "written over at its size":
        entry.write_bytes(os.urandom(size))
    elif damage == "a folder in its place":
        entry.unlink()
        (entry / "inside").mkdir(parents=True)
    elif damage == "its record missing":
        record.unlink()
    elif damage == "its record garbled":
        record.write_text('{"bytes": ')
    elif damage == "a link to elsewhere":
        entry.unlink()
        entry.symlink_to(folder.parent)


@pytest.mark.parametrize("damage", ["cut to half", "emptied", "written over at its size", "a folder in its place",
                                    "its record missing", "its record garbled", "a link to elsewhere"])
def test_a_damaged_entry_is_named_once_removed_and_compiled_again(tmp_path, damage):
    """TensorFlow fails the compile on an entry cut short ("Read less bytes than requested"): a damaged entry
    never reaches a private folder. The run compiles its program again and publishes it whole."""
    first, _ = fake_run(tmp_path)
    assert first == ["compiled", "published 1"]
    folder = shared_folder(tmp_path)
    assert_whole(folder)
    damage_entry(folder, damage)
    second, logged = fake_run(tmp_path)
    warnings = [line for line in logged if line.startswith("WARNING")]
    assert len(warnings) == 1, logged
    assert_names(warnings[0], f"{folder / NAME} ", "removed")
    assert f"INFO XLA programs are cached in {folder} (0 there already)" in logged
    assert second == ["compiled", "published 1"]
    assert_whole(folder)  # repaired
    third, logged = fake_run(tmp_path)
    assert not [line for line in logged if line.startswith("WARNING")], logged
    assert f"INFO XLA programs are cached in {folder} (1 there already)" in logged
    assert third == ["loaded", "published 0"]
    assert sorted(path.name for path in folder.iterdir()) == [NAME, f"{NAME}.sha256"]


def test_an_entry_that_is_not_whole_is_not_published(tmp_path):
    lines, logged = fake_run(tmp_path, entry=ENTRY[:len(ENTRY) // 2])
    assert lines == ["compiled", "published 0"]
    assert logged[-1].startswith("WARNING "), logged
    assert_names(logged[-1], f"{NAME} ", "not published")
    assert not list(shared_folder(tmp_path).iterdir())
    assert fake_run(tmp_path)[0] == ["compiled", "published 1"]  # a whole one is, by the next run


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """This process's cache state pointed at a private and a shared folder, as `enable` leaves it."""
    from tf_harness.experiments.training import xla_cache
    private, shared = tmp_path / "shared" / ".job-test", tmp_path / "shared"
    private.mkdir(parents=True)
    monkeypatch.setattr(xla_cache, "_private", private)
    monkeypatch.setattr(xla_cache, "_shared", shared)
    (private / NAME).write_bytes(ENTRY)
    return xla_cache


def test_an_entry_another_process_is_publishing_is_left_to_it_and_a_dead_publishers_record_is_replaced(cache):
    import time
    record = cache._shared / f"{NAME}.sha256"
    record.write_text('{"bytes": 1, "sha256": "another"}')  # another process's, between its record and its entry
    assert cache.publish() == 0 and not (cache._shared / NAME).exists()
    old = time.time() - cache.ORPHAN_AGE_S - 1
    os.utime(record, (old, old))  # its publisher died before linking the entry
    assert cache.publish() == 1
    assert_whole(cache._shared)
    assert not [path for path in cache._shared.iterdir() if path.name.endswith(".tmp")]


def test_a_failure_to_publish_is_one_warning_not_an_error(cache, monkeypatch, caplog):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache.os, "open", full)
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.training.xla_cache"):
        assert cache.publish() == 0
    [message] = [record.getMessage() for record in caplog.records]
    assert_names(message, f"{cache._shared}:", "No space left on device")


@pytest.mark.slow  # two trainer.jit_compile=true runs
def test_a_run_on_an_entry_cut_to_half_compiles_it_again_with_one_warning(tmp_path):
    import hashlib
    import json
    from tests.conftest import run_cli
    args, env = ("dataset=lfw_pairs", "experiment=smoke", "trainer.jit_compile=true"), {
        "HARNESS_CACHE": str(tmp_path / "cache")}
    first = run_cli(*args, f"hydra.run.dir={tmp_path / 'first'}", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    (entry,) = (tmp_path / "cache").glob("xla/tf-*/*/*.pb")
    os.truncate(entry, entry.stat().st_size // 2)
    second = run_cli(*args, f"hydra.run.dir={tmp_path / 'second'}", env=env)
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr[-3000:]
    log = (tmp_path / "second" / "run.log").read_text()
    warnings = [line for line in log.splitlines() if "[WARNING]" in line]
    assert len(warnings) == 1, warnings
    assert_names(warnings[0], f"{entry} ")
    assert f"XLA programs are cached in {entry.parent} (0 there already)" in log
    record = json.loads(entry.with_name(entry.name + ".sha256").read_text())  # repaired: whole, as recorded
    assert record == {"bytes": entry.stat().st_size, "sha256": hashlib.sha256(entry.read_bytes()).hexdigest()}
