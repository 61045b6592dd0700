"""XLA's persistent cache: a second process of the same shapes loads the program, other shapes compile their
own, concurrent processes never see a half-written entry, and dead private folders are cleared."""
import fcntl
import os
import subprocess
import sys

import pytest

# One process: enable the cache, run one compiled function on an n x n input, publish.
SCRIPT = """
import sys
from tf_harness.experiments import xla_cache
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
    from tf_harness.experiments import xla_cache
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
    process = subprocess.run([sys.executable, "-c", "import os; from tf_harness.experiments import xla_cache; "
                              "print(xla_cache.enable(os.environ['HOME_CACHE'])); print(os.environ['TF_XLA_FLAGS'])"],
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, TF_XLA_FLAGS=mine, HOME_CACHE=str(tmp_path / "home")))
    assert process.returncode == 0, process.stderr[-2000:]
    assert process.stdout.splitlines() == ["None", mine]
    assert not (tmp_path / "home").exists()
