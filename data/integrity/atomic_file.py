"""Files replaced whole: written under a temporary name beside their place, then renamed over it.

A reader never sees half a file: it opens the previous one or the new one, as the rename is atomic. A full disk,
an error or a kill while writing leaves the previous file as it was (or none, where there was none).

The temporary file is named for this process, `.<name>.<pid>.tmp`, because some files have two writers at once:
the trainer and a sidecar evaluator both write metrics.json, and neither may write into the other's half-written
temporary. The leading dot hides it, so nothing that lists a folder's files takes it for data.
"""
import os
import re
from contextlib import contextmanager
from pathlib import Path


def temporary_of(path) -> Path:
    """This process's temporary file for `path`, in the same folder, so the rename stays on one file system."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def is_temporary(name: str, of: str) -> bool:
    """Whether the file name `name` is any process's temporary for the file named `of`: what a killed write
    leaves."""
    return re.fullmatch(rf"\.{re.escape(of)}\.\d+\.tmp", name) is not None


@contextmanager
def replacing(path, mode: str = "w", **open_kwargs):
    """Opens this process's temporary file for `path` (`mode` "w" or "wb", and `open`'s other arguments) and
    yields it; on a clean exit it is closed, so flushed, and renamed over `path`. On any exception, or when the
    rename fails, the temporary is removed and the exception raised again: `path` keeps what it held."""
    if not mode.startswith("w"):
        raise ValueError(f"replacing() writes a whole new file: mode {mode!r} is not a write mode")
    temporary = temporary_of(path)
    try:
        with open(temporary, mode, **open_kwargs) as file:
            yield file
        os.replace(temporary, path)
    except BaseException as error:
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass  # a folder gone read-only, say: the error that got here is the one to report
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # a full disk fails the write or the close, which name no file
        raise
