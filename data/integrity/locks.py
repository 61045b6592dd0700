"""Exclusive locks on files, held by a process: an `fcntl.flock` on an open lock file.

The OS drops such a lock when its holder's descriptor closes, which it does when the holder exits, however it
exits (SIGKILL included); so a lock that can be taken was left by nobody alive, and what it guarded is stale. The
file's content is the user's (a run's `.lock` names its holder) and never decides anything. Unlinking a lock file
that others may wait on would let a waiter hold the old file while a newcomer locks a new one: a lock file is
removed, if ever, only with what it guards, by its holder.

Nothing here imports TensorFlow: the run directory's lock is taken before it starts.
"""
import fcntl
import os

from tf_harness.data.integrity import reading


class Held:
    """An exclusive lock this process holds on the file `path` through the open descriptor `fd`. Let go of it
    with `release` (or `close`), or use it as a context manager that lets go at the end of the block."""

    def __init__(self, path, fd: int):
        self.path, self.fd = path, fd

    def release(self) -> None:
        """Unlocks and closes the lock file; later calls do nothing."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            # Explicitly: a process forked meanwhile shares the open file, which would hold the lock past close.
            _flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass  # the OS lets go of it as the descriptor closes
        finally:
            os.close(fd)

    close = release

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.release()

    def __repr__(self):
        return f"Held({str(self.path)!r}, fd={self.fd})"


def take(path, *, wait: bool = False, create: bool = True) -> Held | None:
    """Takes an exclusive lock on the file `path`: returns it held, or None when another holder has it (with
    `wait`, waits for it instead, so never None). The file is made (mode 0644) when missing, unless `create` is
    false: then FileNotFoundError. A named pipe, socket or device in its place is reading.SpecialFileError; any
    other OSError of opening it (a folder in its place, a read-only folder) is raised as it is, naming the path. A second `take` of the same file in one process counts as another holder."""
    fd = reading.open_descriptor(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    try:
        taken = _flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BaseException:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        return None
    return Held(path, fd)


def held_elsewhere(path) -> bool:
    """Whether another holder has the lock on the file `path` now: another process, or another `take` in this
    process. False when there is no such file."""
    try:
        lock = take(path, create=False)
    except FileNotFoundError:
        return False
    if lock is None:
        return True
    lock.release()
    return False


def _flock(fd: int, operation: int) -> bool:
    """flock(2) on `fd`; False when a non-blocking lock is held by another."""
    try:
        fcntl.flock(fd, operation)
    except BlockingIOError:
        return False
    return True
