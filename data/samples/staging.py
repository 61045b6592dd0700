"""Staging folders for sample generation, owned by a lock their generator holds.

A sample is generated into `.<name>.<pid>@<host>.XXXXXXXX` beside its final place, then renamed. The
folder holds a lock file, `.lock`, on which the generating process takes an flock as soon as the
folder exists and keeps it for the generation's life; the OS drops it when the process ends, however
it ends. So a staging folder whose lock can be taken is dead, whoever made it, and is removed; one
whose lock is held is live and left alone, whatever host or PID namespace it is seen from (its pid and
host in the name are only for people reading the folder). Folders without a lock file were made by an
older release, or are being made this instant: they are removed only once an hour old, and only when they hold
nothing but what a generation puts there, so a user's folder that happens to match a name is never removed.
"""
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from tf_harness.data.integrity import locks

log = logging.getLogger(__name__)

LOCK = ".lock"
_OWNED = re.compile(r"^\.(?P<name>[^.]+)\.(?P<pid>\d+)@(?P<host>.+)\.[a-z0-9_]{8}$")
# Before owners were named: `.<name>-XXXXXXXX`, for the samples of that release.
_UNOWNED = re.compile(r"^\.(chest_xray|lfw_pairs|imagenet_det)-[a-z0-9_]{8}$")
# All a generation puts in its staging folder besides its lock: the sample, and its lock before the rename.
_GENERATED = {"data", f"{LOCK}.new"}
UNOWNED_AGE_S = 3600


def _try_lock(path: Path):
    """The lock of the staging folder `path`, taken by this process (locks.Held); None when another process holds
    it. Raises FileNotFoundError when the folder has no lock file."""
    return locks.take(path / LOCK, create=False)


@contextmanager
def folder(parent: Path, name: str):
    """A new staging folder under `parent` for the sample `name`, locked by this process while the block runs,
    and removed after it."""
    path = Path(tempfile.mkdtemp(prefix=f".{name}.{os.getpid()}@{socket.gethostname()}.", dir=parent))
    lock = None
    try:
        # Locked under another name, then renamed: whoever finds a `.lock` finds it held.
        lock = locks.take(path / f"{LOCK}.new", wait=True)  # a folder made this instant: nobody else holds it
        os.rename(path / f"{LOCK}.new", path / LOCK)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if lock is not None:
            lock.close()


def _dead(path: Path):
    """(whether the staging folder `path` is dead, its lock when this process took it)."""
    try:
        lock = _try_lock(path)
    except FileNotFoundError:  # no lock file: an older release's folder, or one made this instant
        return _old_and_generated(path), None
    except OSError:
        return False, None
    return lock is not None, lock


def _old_and_generated(path: Path) -> bool:
    try:
        old = time.time() - path.lstat().st_mtime > UNOWNED_AGE_S
        return old and {child.name for child in path.iterdir()} <= _GENERATED
    except OSError:
        return False


def remove_stale(parent: Path) -> list:
    """Removes the staging folders under `parent` that no live generation holds, logging each; returns them."""
    if not parent.is_dir():
        return []
    removed = []
    for path in sorted(parent.iterdir()):
        if not (_OWNED.match(path.name) or _UNOWNED.match(path.name)) or not path.is_dir():
            continue
        dead, lock = _dead(path)
        try:
            if dead:
                shutil.rmtree(path, ignore_errors=True)
                log.info("Removed %s, a sample staging folder that no live generation holds", path)
                removed.append(path)
        finally:
            if lock is not None:
                lock.close()
    return removed
