"""What a run directory survives: a second process on it, killed saves and generations, signals."""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

from tf_harness.data.errors import ConfigError
from tf_harness.data.samples import sample_root, staging
from tf_harness.experiments import leftovers, run_lock
from tests.conftest import PROJECT, run_cli

# A process that takes a run directory's lock through the runner's own API and keeps it.
HOLD = ("import sys, time; from tf_harness.experiments import run_lock; run_lock.hold(sys.argv[1]); "
        "print('held', flush=True); time.sleep(600)")
# A lfw_pairs run small enough to start training within seconds (the siamese CNN traces fast).
TINY = ("dataset=lfw_pairs", "experiment=smoke", "trainer.log_every=1")


@contextmanager
def lock_holder(run_dir):
    """A child process holding `run_dir`'s lock; killed on exit."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=PROJECT, stdout=subprocess.PIPE,
                               text=True, env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait()


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def released():
    """Lets go of any lock a test took in this process."""
    yield
    run_lock.release()


def test_second_process_on_a_run_directory_exits_2_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    with lock_holder(run_dir) as holder:
        started = time.time()
        result = run_cli(*TINY, "trainer.train_steps=1000", f"hydra.run.dir={run_dir}", timeout=300)
        elapsed = time.time() - started
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: ")
    assert f"hydra.run.dir={run_dir} is in use by pid {holder.pid} on host {socket.gethostname()}" in last
    assert "Traceback" not in result.stderr
    # Refused before any work: nothing trained or written by the run (Hydra's own .hydra/ aside).
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "train").exists()
    assert elapsed < 120, f"took {elapsed:.0f} s to refuse"


def test_lock_of_a_live_process_is_refused_and_a_dead_ones_taken_over(tmp_path, released):
    run_dir = tmp_path / "run"
    with lock_holder(run_dir) as holder:
        with pytest.raises(ConfigError, match=f"in use by pid {holder.pid} on host"):
            run_lock.hold(run_dir)
        holder.send_signal(signal.SIGKILL)  # dies without releasing anything itself
        holder.wait()
        assert run_lock.hold(run_dir)
    assert json.loads((run_dir / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()


def test_stale_lock_file_content_does_not_block(tmp_path, released):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / run_lock.LOCK_NAME).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    assert run_lock.hold(run_dir)
    assert json.loads((run_dir / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    # A second multirun job of the same process gives the first directory back.
    assert run_lock.hold(tmp_path / "next")
    assert (run_dir / run_lock.LOCK_NAME).read_text() == ""


@pytest.mark.parametrize("task, chief", [({"type": "worker", "index": 0}, True),
                                         ({"type": "worker", "index": 1}, False),
                                         ({"type": "chief", "index": 0}, True)])
def test_under_multi_worker_only_the_chief_takes_the_lock(tmp_path, monkeypatch, released, task, chief):
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    if task["type"] == "chief":
        cluster["chief"] = ["localhost:3"]
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    run_dir = tmp_path / "run"
    with lock_holder(run_dir):
        if chief:
            with pytest.raises(ConfigError, match="is in use by pid"):
                run_lock.hold(run_dir)
        else:
            assert run_lock.hold(run_dir) is False


def test_a_killed_saves_staging_folder_is_removed_on_the_next_start(tmp_path, caplog):
    """Kills a real TensorFlow save mid-way, so the leftover is whatever this TF version leaves."""
    checkpoints = tmp_path / "run" / "checkpoints"
    saver = ("import sys, tensorflow as tf\n"
             "manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(tf.zeros([16, 1024, 1024]))), "
             "sys.argv[1], max_to_keep=2)\n"
             "for step in range(1000):\n    manager.save(checkpoint_number=step)\n")
    process = subprocess.Popen([sys.executable, "-c", saver, str(checkpoints)], cwd=PROJECT,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not list(checkpoints.glob("*_temp")) and time.time() < deadline and process.poll() is None:
        time.sleep(0.01)
    process.kill()
    process.wait()
    temp = list(checkpoints.glob("*_temp"))
    assert temp, "the save was never caught mid-way"
    kept = sorted(p.name for p in checkpoints.iterdir() if p not in temp)
    (checkpoints / "checkpoint.tmp0123456789abcdef").write_text("half a state file")
    with caplog.at_level(logging.INFO, logger="tf_harness.experiments.leftovers"):
        removed = leftovers.remove(checkpoints.parent)
    assert sorted(removed) == sorted([*temp, checkpoints / "checkpoint.tmp0123456789abcdef"])
    assert sorted(p.name for p in checkpoints.iterdir()) == kept  # complete checkpoints untouched
    assert all(str(path) in caplog.text for path in removed)


def test_stale_sample_staging_folders_are_removed_live_and_foreign_ones_kept(tmp_path, caplog):
    host = socket.gethostname()
    dead = tmp_path / f".lfw_pairs.{dead_pid()}@{host}.abcd1234"
    live = tmp_path / f".lfw_pairs.{os.getpid()}@{host}.abcd1234"
    foreign = tmp_path / f".lfw_pairs.{dead_pid()}@another-host.example.abcd1234"
    old_unowned, new_unowned = tmp_path / ".chest_xray-k2j4_x9q", tmp_path / ".chest_xray-abcdefgh"
    sample = tmp_path / "chest_xray-v2"
    for path in (dead, live, foreign, old_unowned, new_unowned, sample):
        (path / "data").mkdir(parents=True)
    (dead / staging.LOCK).touch()  # a lock file nobody holds: its generator is gone (tests/test_samples.py)
    hour_ago = time.time() - 2 * staging.UNOWNED_AGE_S
    os.utime(old_unowned, (hour_ago, hour_ago))
    with caplog.at_level(logging.INFO, logger="tf_harness.data.samples.staging"):
        removed = staging.remove_stale(tmp_path)
    assert sorted(removed) == sorted([dead, old_unowned])
    assert all(path.exists() for path in (live, foreign, new_unowned, sample))
    assert str(dead) in caplog.text


def test_sample_generation_stages_under_its_pid_and_clears_dead_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    samples = tmp_path / "samples"
    stale = samples / f".toy.{dead_pid()}@{socket.gethostname()}.abcd1234"
    (stale / "data").mkdir(parents=True)
    (stale / staging.LOCK).touch()  # a lock file nobody holds: its generator is gone
    seen = []

    def make_toy(root, seed):
        seen.append(root.parent.name)
        root.mkdir()
        (root / "file.txt").write_text("x")

    root = sample_root("toy", make_toy)
    assert (root / "file.txt").exists() and not stale.exists()
    assert seen[0].startswith(f".toy.{os.getpid()}@{socket.gethostname()}.")
    assert [p.name for p in samples.iterdir()] == [root.name]  # its own staging folder is gone too


@pytest.mark.slow
@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_saves_a_checkpoint_and_exits_128_plus_signum(tmp_path, signum, status):
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.train_steps=100000", "trainer.checkpoint_every=2", "trainer.eval_every=100000",
            f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen([sys.executable, "run.py", *args], cwd=PROJECT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    deadline = time.time() + 300
    # A checkpoint of step 2 means the loop is training.
    while not (run_dir / "checkpoints" / "ckpt-2.index").exists() and time.time() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        time.sleep(0.2)
    time.sleep(1)  # a few more steps, so the interrupt's save is not the step-2 one
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == status, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == f"interrupted by {signal.Signals(signum).name}"
    line = next(line for line in stdout.splitlines() if "Interrupted at global step" in line)
    step = int(line.split("Interrupted at global step ")[1].split(";")[0])
    assert step >= 2 and (run_dir / "checkpoints" / f"ckpt-{step}.index").exists()
