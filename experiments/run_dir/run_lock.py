"""One process per run directory: a lock held for the run's life.

Two processes training into one `hydra.run.dir` interleave checkpoints and summaries
(one crashed in MergeV2Checkpoints; another resumed from the first's checkpoint while
it was still training). The lock is an `fcntl.flock` on `<run dir>/.lock`:
- the OS drops it when its holder exits, however it exits (SIGKILL included), so a
  lock left by a dead process is taken over without any clean-up;
- the file's content (pid and host of the holder) only names the holder in the
  error message; a stale content never blocks, since only the flock counts. A holder
  that exits (not killed) empties it, so a run directory nobody runs in holds an empty
  `.lock`, and a start that is refused leaves it as it found it.
Under multi_worker only the chief takes it: the workers share the run directory.

mode=continuous_eval (experiments/sidecar.py) evaluates beside the process that trains: it takes no `.lock`
but `<run dir>/.eval-lock`, the same kind of lock, so that two evaluators do not collide.

A process refused either lock writes nothing into the run directory's logs: it lets go of its own handle on
the run's log (Hydra opened `run.log` for the job before our code ran), so that its `config error` and exit
status lines reach stderr alone and the live run's `run.log` never reads as if it had stopped.

Nothing here imports TensorFlow, so the locks can be taken before it starts.
"""
import atexit
import json
import logging
import os
import socket
import time
from pathlib import Path

from tf_harness.data.errors import ConfigError
from tf_harness.data.integrity import locks, reading
from tf_harness.experiments.config import strategies

log = logging.getLogger(__name__)
LOCK_NAME = ".lock"
EVAL_LOCK_NAME = ".eval-lock"  # mode=continuous_eval's, beside the trainer's

# The locks this process holds: {lock file: locks.Held}. Kept for the process's life; the next multirun job of
# the same process releases them first.
_held = {}


def hold(run_dir) -> bool:
    """Takes the run directory's lock for this process's life; False on a non-chief worker.

    Raises ConfigError (exit 2) naming the holder when another process has it.
    """
    # Worker 0 is the chief (or the task `chief`, counted as worker 0); the evaluator task has no index.
    if strategies.workers()[1] != 0:
        return False
    if held(run_dir):  # this job took it already (before TensorFlow started)
        return True
    release(keep=run_dir)  # an earlier job of a multirun sweep in this process has finished
    _take(Path(run_dir), LOCK_NAME, lambda run_dir, path, pid, host: (
        f"hydra.run.dir={run_dir} is in use by pid {pid} on host {host} (lock file {path}); wait for that run to "
        f"finish or stop it, or choose another hydra.run.dir"))
    return True


def held(run_dir, name=LOCK_NAME) -> bool:
    """Whether this process holds the lock `name` (`.lock`, or EVAL_LOCK_NAME) of `run_dir`."""
    return Path(run_dir).absolute() / name in _held


def hold_evaluator(run_dir) -> None:
    """Takes the run directory's evaluator lock (`.eval-lock`) for this process's life, for mode=continuous_eval.

    Raises ConfigError (exit 2) naming the holder when another evaluator has it.
    """
    release(keep=run_dir)  # an earlier job of a multirun sweep in this process has finished
    _take(Path(run_dir), EVAL_LOCK_NAME, lambda run_dir, path, pid, host: (
        f"hydra.run.dir={run_dir} is evaluated by pid {pid} on host {host} (lock file {path}); one "
        f"mode=continuous_eval at a time evaluates a run directory: wait for that one to stop, or stop it"))


def _take(run_dir, name, refusal) -> None:
    """Takes the flock on `run_dir`/`name` and records this process in it; raises ConfigError with
    `refusal(run_dir, path, pid, host)` when another process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / name
    lock = locks.take(path)
    if lock is None:
        holder = _holder(path)
        leave_job_log(run_dir)  # the holder's log is not this process's to write in
        raise ConfigError(refusal(run_dir, path, holder.get("pid", "?"), holder.get("host", "?")))
    if not _held:
        atexit.register(release)  # a process that exits (not one that is killed) empties the lock files it held
    # Overwrite whatever a dead holder left: the content only names the live holder.
    try:
        os.ftruncate(lock.fd, 0)
        os.write(lock.fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                      "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode() + b"\n")
        os.fsync(lock.fd)
    except OSError as error:  # a full disk: os.write names no file, and the error line should
        lock.release()
        raise OSError(error.errno, error.strerror, str(path)) from None
    _held[path.absolute()] = lock


def leave_job_log(run_dir) -> list:
    """Closes and removes the root logger's file handlers that write into `run_dir` (Hydra's job log, run.log),
    so that nothing this process logs from here on lands there; returns them (closed), for their formatter."""
    root, run_dir = logging.getLogger(), Path(run_dir).resolve()
    left = [handler for handler in root.handlers
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).resolve().parent == run_dir]
    for handler in left:
        root.removeHandler(handler)
        handler.close()
    return left


def _holder(path) -> dict:
    """The holder's record in the lock file `path`; it may be a moment from being written, so read a few times."""
    for _ in range(20):
        try:
            text = reading.read_bytes(path)[:4096].decode(errors="replace").strip()
        except OSError:
            text = ""  # gone or unreadable this instant: the refusal names no holder rather than failing
        if text:
            try:
                return json.loads(text)
            except ValueError:
                pass  # caught mid-write
        time.sleep(0.05)
    return {}


def release(keep=None) -> None:
    """Lets go of the lock(s) this process holds, but those of run directory `keep`. The file stays: unlinking a
    lock file lets a waiter lock the old file while a newcomer locks a new one."""
    for path, lock in list(_held.items()):
        if keep is not None and path.parent == Path(keep).absolute():
            continue
        del _held[path]
        try:
            os.ftruncate(lock.fd, 0)
        except OSError:  # a full or read-only disk: the lock is let go of all the same
            pass
        lock.release()

