"""One process per run directory: a lock held for the run's life.

Two processes training into one `hydra.run.dir` interleave checkpoints and summaries
(one crashed in MergeV2Checkpoints; another resumed from the first's checkpoint while
it was still training). The lock is an `fcntl.flock` on `<run dir>/.lock`:
- the OS drops it when its holder exits, however it exits (SIGKILL included), so a
  lock left by a dead process is taken over without any clean-up;
- the file's content (pid and host of the holder) only names the holder in the
  error message; a stale content never blocks, since only the flock counts.
Under multi_worker only the chief takes it: the workers share the run directory.
"""
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from tf_harness.data.errors import ConfigError
from tf_harness.experiments import strategies

log = logging.getLogger(__name__)
LOCK_NAME = ".lock"

# The lock this process holds: {run dir: open file descriptor}. Kept open for the
# process's life; the next multirun job of the same process releases it first.
_held = {}


def hold(run_dir) -> bool:
    """Takes the run directory's lock for this process's life; False on a non-chief worker.

    Raises ConfigError (exit 2) naming the holder when another process has it.
    """
    if strategies.workers()[1] != 0:  # worker 0 is the chief (or the task `chief`, counted as worker 0)
        return False
    release()  # an earlier job of a multirun sweep in this process has finished
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise ConfigError(f"hydra.run.dir={run_dir} is in use by pid {holder.get('pid', '?')} on host "
                          f"{holder.get('host', '?')} (lock file {path}); wait for that run to finish or stop "
                          f"it, or choose another hydra.run.dir") from None
    # Overwrite whatever a dead holder left: the content only names the live holder.
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode() + b"\n")
    os.fsync(fd)
    _held[run_dir] = fd
    return True


def _holder(fd) -> dict:
    """The holder's record; it may be a moment from being written, so read a few times."""
    for _ in range(20):
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if text:
            try:
                return json.loads(text)
            except ValueError:
                pass  # caught mid-write
        time.sleep(0.05)
    return {}


def release() -> None:
    """Lets go of the lock(s) this process holds. The file stays: unlinking a lock file
    lets a waiter lock the old file while a newcomer locks a new one."""
    for run_dir, fd in list(_held.items()):
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        del _held[run_dir]
