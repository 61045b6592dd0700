"""The one door through which the project writes its files, beside reading.py, the one it reads them through.

A file is either replaced whole (`replacing`, `publish`) or appended to (`appending`); nothing else opens a file
of the project's for writing.

Replaced whole: written under a temporary name beside its place, then renamed over it. A reader never sees half a
file: it opens the previous one or the new one, as the rename is atomic. A full disk, an error or a kill while
writing leaves the previous file as it was (or none, where there was none).

Before any open, what stands in the file's place is looked at (`check_place`): a named pipe, socket or device is
refused with reading.SpecialFileError, and a folder with IsADirectoryError, each one line naming the place. Opened
for writing, a named pipe waits for a reader that never comes, out of reach of SIGINT and SIGTERM; renamed over,
it, or a folder's name, would be lost, and the project never replaces what it did not write. The temporary, and
a file appended to, are opened without blocking too (reading.open_descriptor), so that one put there meanwhile is
refused the same way.

The temporary file is named for this process, `.<name>.<pid>.tmp`, because some files have two writers at once:
the trainer and a sidecar evaluator both write metrics.json, and neither may write into the other's half-written
temporary. The leading dot hides it, so nothing that lists a folder's files takes it for data. A writer whose
temporary must have another name (one a clean-up elsewhere knows, or one unique across hosts) passes it.

This is the one place that renames a temporary over a file (`publish`): every file replaced whole goes through it.
"""
import errno
import io
import logging
import os
import re
import stat
from contextlib import contextmanager
from pathlib import Path

from tf_harness.data.integrity import reading

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND


def temporary_of(path) -> Path:
    """This process's temporary file for `path`, in the same folder, so the rename stays on one file system."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def is_temporary(name: str, of: str) -> bool:
    """Whether the file name `name` is any process's temporary for the file named `of`: what a killed write
    leaves."""
    return re.fullmatch(rf"\.{re.escape(of)}\.\d+\.tmp", name) is not None


class FolderInPlaceError(reading.SpecialFileError, IsADirectoryError):
    """A folder stands where the project writes a file; `str` is the one line, as for a named pipe there."""

    def __init__(self, path):
        super().__init__(path, "folder")
        self.errno = errno.EISDIR


def check_place(path) -> None:
    """Raises, in one line naming `path`, when what stands there cannot be written over: reading.SpecialFileError
    for a named pipe, socket or device (a link followed), FolderInPlaceError (an IsADirectoryError too) for a
    folder. Nothing happens for a regular file, or for nothing at all."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # nothing there, or a place the open that follows reports
    if stat.S_ISDIR(mode):
        raise FolderInPlaceError(path)
    kind = reading.kind_of(mode)
    if kind:
        raise reading.SpecialFileError(path, kind)


def publish(temporary, path, *, fsync: bool = False) -> None:
    """Renames the whole file `temporary` over `path`, in one atomic step: a reader of `path` sees the previous
    file or this one. With `fsync`, its bytes reach the disk first, so that a machine that stops right after
    cannot leave `path` naming an empty file. When that fails, `temporary` is removed and the error raised again:
    `path` keeps what it held. Raises check_place's errors, before the rename, when `path` holds a special file
    or a folder."""
    try:
        if fsync:
            with open(temporary, "rb") as file:
                os.fsync(file.fileno())
        check_place(path)
        os.replace(temporary, path)
    except BaseException as error:
        _remove(temporary)
        if isinstance(error, OSError) and error.filename == str(temporary):
            error.filename, error.filename2 = str(path), None  # a folder at `path`, say: the temporary is not at fault
        raise


@contextmanager
def replacing(path, mode: str = "w", temporary=None, *, fsync: bool = False, **open_kwargs):
    """Opens a temporary file for `path` (`mode` "w" or "wb", and `open`'s other arguments) and yields it; on a
    clean exit it is closed, so flushed, and renamed over `path`. The temporary is this process's
    (`temporary_of`) unless `temporary` names another, in the same folder; `fsync` as for `publish`. On any
    exception, or when the rename fails, the temporary is removed and the exception raised again: `path` keeps
    what it held. A special file or a folder at `path` is refused (check_place) before anything is opened."""
    if not mode.startswith("w"):
        raise ValueError(f"replacing() writes a whole new file: mode {mode!r} is not a write mode")
    check_place(path)
    temporary = temporary_of(path) if temporary is None else Path(temporary)
    try:
        with _open(temporary, _CREATE, mode, open_kwargs) as file:
            yield file
    except BaseException as error:
        _remove(temporary)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(path)  # a full disk fails the write or the close, which name no file
        raise
    publish(temporary, path, fsync=fsync)


def write_text(path, text: str, **open_kwargs) -> None:
    """Replaces `path` whole with `text` (`replacing`, with `open`'s other arguments)."""
    with replacing(path, **open_kwargs) as file:
        file.write(text)


def write_bytes(path, data: bytes) -> None:
    """Replaces `path` whole with `data` (`replacing`)."""
    with replacing(path, "wb") as file:
        file.write(data)


def appending(path, mode: str = "a", **open_kwargs):
    """`path` opened for appending (`mode` "a" or "ab", and `open`'s other arguments), made when missing. A special
    file or a folder at `path` is refused (check_place) before any open could wait on it."""
    if not mode.startswith("a"):
        raise ValueError(f"appending() adds to a file: mode {mode!r} is not an append mode")
    check_place(path)
    return _open(path, _APPEND, mode, open_kwargs)


def creating(path, mode: str = "w", **open_kwargs):
    """`path` made anew and opened for writing (`mode` "w" or "wb"): FileExistsError when anything stands there
    (so no open waits on a named pipe), for a writer that must be the only one to make it."""
    if not mode.startswith("w"):
        raise ValueError(f"creating() writes a new file: mode {mode!r} is not a write mode")
    return _open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode, open_kwargs, look_first=False)


class LogFile(logging.FileHandler):
    """A logging.FileHandler whose file is opened through `appending`: a log's place is guarded like any file's."""

    def _open(self):
        return appending(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors)


def _open(path, flags: int, mode: str, open_kwargs: dict, look_first: bool = True):
    """A file object on `path` opened with `flags` without blocking (reading.open_descriptor), as `open(path, mode)`
    makes one. Without `look_first`, `flags` must never open what stands there (O_EXCL)."""
    descriptor = reading.open_descriptor(path, flags) if look_first else os.open(path, flags, 0o644)
    try:
        file = open(descriptor, mode, **open_kwargs)
    except BaseException:
        os.close(descriptor)
        raise
    raw = file
    while raw is not None and not isinstance(raw, io.FileIO):
        raw = getattr(raw, "buffer", None) or getattr(raw, "raw", None)
    if raw is not None:
        raw.name = str(path)  # named by its path, as `open` names it, not by its descriptor
    return file


def _remove(temporary) -> None:
    try:
        Path(temporary).unlink(missing_ok=True)
    except OSError:
        pass  # a folder gone read-only, say: the error that got here is the one to report
