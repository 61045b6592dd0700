"""Files replaced whole: written under a temporary name beside their place, then renamed over it.

A reader never sees half a file: it opens the previous one or the new one, as the rename is atomic. A full disk,
an error or a kill while writing leaves the previous file as it was (or none, where there was none).

The temporary file is named for this process, `.<name>.<pid>.tmp`, because some files have two writers at once:
the trainer and a sidecar evaluator both write metrics.json, and neither may write into the other's half-written
temporary. The leading dot hides it, so nothing that lists a folder's files takes it for data. A writer whose
temporary must have another name (one a clean-up elsewhere knows, or one unique across hosts) passes it.

This is the one place that renames a temporary over a file (`publish`): every file replaced whole goes through it.
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


def publish(temporary, path, *, fsync: bool = False) -> None:
    """Renames the whole file `temporary` over `path`, in one atomic step: a reader of `path` sees the previous
    file or this one. With `fsync`, its bytes reach the disk first, so that a machine that stops right after
    cannot leave `path` naming an empty file. When that fails, `temporary` is removed and the error raised again:
    `path` keeps what it held."""
    try:
        if fsync:
            with open(temporary, "rb") as file:
                os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        _remove(temporary)
        if isinstance(error, OSError) and error.filename == str(temporary):
            error.filename, error.filename2 = str(path), None  # a folder at `path`, say: the temporary is not at fault
        raise


@contextmanager
def replacing(path, mode: str = "w", temporary=None, **open_kwargs):
    """Opens a temporary file for `path` (`mode` "w" or "wb", and `open`'s other arguments) and yields it; on a
    clean exit it is closed, so flushed, and renamed over `path`. The temporary is this process's
    (`temporary_of`) unless `temporary` names another, in the same folder. On any exception, or when the rename
    fails, the temporary is removed and the exception raised again: `path` keeps what it held."""
    if not mode.startswith("w"):
        raise ValueError(f"replacing() writes a whole new file: mode {mode!r} is not a write mode")
    temporary = temporary_of(path) if temporary is None else Path(temporary)
    try:
        with open(temporary, mode, **open_kwargs) as file:
            yield file
    except BaseException as error:
        _remove(temporary)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # a full disk fails the write or the close, which name no file
        raise
    publish(temporary, path)


def _remove(temporary) -> None:
    try:
        Path(temporary).unlink(missing_ok=True)
    except OSError:
        pass  # a folder gone read-only, say: the error that got here is the one to report
