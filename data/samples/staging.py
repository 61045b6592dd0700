"""Staging folders for sample generation, named after their owner so leftovers can be told apart.

A sample is generated into `.<name>.<pid>@<host>.XXXXXXXX` beside its final place,
then renamed. A generation killed before the rename leaves that folder behind; the
next start removes it once the pid in its name is no longer alive on this host.
Folders of other hosts (a shared cache) are left alone: their pids cannot be checked.
"""
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

_OWNED = re.compile(r"^\.(?P<name>[^.]+)\.(?P<pid>\d+)@(?P<host>.+)\.[a-z0-9_]{8}$")
# Before owners were named: `.<name>-XXXXXXXX`. Only old ones are removed, in case an
# older checkout is generating one right now.
_UNOWNED = re.compile(r"^\.[a-z_]+-[a-z0-9_]{8}$")
UNOWNED_AGE_S = 3600


def make(parent: Path, name: str) -> Path:
    """A new staging folder under `parent` for the sample `name`, owned by this process."""
    return Path(tempfile.mkdtemp(prefix=f".{name}.{os.getpid()}@{socket.gethostname()}.", dir=parent))


def alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale(parent: Path) -> list:
    """Removes staging folders under `parent` whose generator is dead, logging each; returns them."""
    if not parent.is_dir():
        return []
    host, removed = socket.gethostname(), []
    for path in sorted(parent.iterdir()):
        owned = _OWNED.match(path.name)
        if owned:
            stale = owned["host"] == host and not alive(int(owned["pid"]))
        else:
            stale = bool(_UNOWNED.match(path.name)) and time.time() - path.lstat().st_mtime > UNOWNED_AGE_S
        if stale and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            log.info("Removed %s, a sample staging folder left by a killed generation", path)
            removed.append(path)
    return removed
