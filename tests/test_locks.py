"""Exclusive locks on files (data/integrity/locks.py): held by one holder at a time, let go of when released or
when the holder dies, however it dies."""
import subprocess
import sys
import time

import pytest

from tf_harness.data.integrity import locks

# Another process that holds the lock on argv[1] (with the system's flock, not the module under test) until killed,
# or for argv[2] seconds.
HOLD = ("import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(float(sys.argv[2]))")


def holder(path, seconds=60):
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_lock_held_by_another_process_is_not_taken_until_that_process_dies(tmp_path):
    path = tmp_path / ".lock"
    other = holder(path)
    try:
        assert locks.take(path) is None
        assert locks.held_elsewhere(path)
    finally:
        other.kill()
        other.wait()
    assert not locks.held_elsewhere(path)
    with locks.take(path) as lock:
        assert isinstance(lock, locks.Held) and lock.path == path
        assert locks.held_elsewhere(path)  # another take, in this process, would not get it
        assert locks.take(path) is None
    assert not locks.held_elsewhere(path)  # let go of at the block's end
    assert locks.take(path) is not None


def test_waiting_takes_the_lock_once_its_holder_lets_go(tmp_path):
    path = tmp_path / ".lock"
    other = holder(path, seconds=1)
    try:
        start = time.monotonic()
        lock = locks.take(path, wait=True)
        assert lock is not None and time.monotonic() - start > 0.5
    finally:
        other.kill()
        other.wait()
    lock.release()
    lock.release()  # a second release does nothing
    lock.close()
    assert lock.fd is None and not locks.held_elsewhere(path)


def test_a_lock_file_is_made_unless_told_not_to(tmp_path):
    with pytest.raises(FileNotFoundError):
        locks.take(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()
    assert not locks.held_elsewhere(tmp_path / "missing")
    with locks.take(tmp_path / "made"):
        assert (tmp_path / "made").read_bytes() == b""
    assert (tmp_path / "made").exists()  # a lock file stays: a waiter on it must not lock a file nobody sees


def test_a_folder_in_the_lock_files_place_is_an_os_error_naming_it(tmp_path):
    (tmp_path / ".lock").mkdir()
    with pytest.raises(IsADirectoryError) as error:
        locks.take(tmp_path / ".lock")
    assert error.value.filename == str(tmp_path / ".lock")


def test_the_lock_files_content_is_left_to_its_user(tmp_path):
    path = tmp_path / ".lock"
    path.write_text("the holder's note\n")
    with locks.take(path):
        assert path.read_text() == "the holder's note\n"
    assert path.read_text() == "the holder's note\n"
