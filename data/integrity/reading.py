"""The one door through which the project opens its own files, to read them or to lock them: a regular file, a
folder's own error, or one line saying what stands in the file's place.

A named pipe, a socket or a device where the project expects one of its files (a run directory's checkpoint state,
metrics.json or .lock, a cache, a sample's manifest, a dataset's metadata) would make a plain `open` wait for a
writer that never comes, in C, out of reach of SIGINT and SIGTERM. So the path is looked at first (`os.stat`), and
opened without blocking, and what was opened is looked at again (`os.fstat`), which closes the gap between the two.
Such a file is refused with SpecialFileError, an OSError (every caller that copes with an unreadable file copes
with this one: a cache is made again, a damaged record is logged) and a DatasetError (a command line reports it as
one line, exit 1).
"""
import errno
import fcntl
import os
import stat

from tf_harness.data.errors import DatasetError

# What a special file is, by its type bits; any other type that is neither a regular file nor a folder is "special".
KINDS = {stat.S_IFIFO: "named pipe", stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device",
         stat.S_IFBLK: "block device"}


class SpecialFileError(DatasetError, OSError):
    """A named pipe, socket or device stands where a regular file was expected; `str` is the one line."""

    def __init__(self, path, kind: str):
        OSError.__init__(self, None, f"is a {kind}, not a regular file", str(path))
        self.kind = kind

    def __str__(self):
        return f"{self.filename} {self.strerror}"


def kind_of(mode: int) -> str | None:
    """What a file of `mode` (an st_mode) is when it is neither a regular file nor a folder; None when it is one."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return KINDS.get(stat.S_IFMT(mode), "special file")


def check(path) -> None:
    """Raises SpecialFileError when a named pipe, socket or device stands at `path` (a link followed); nothing
    happens when it is a regular file or a folder, or when there is nothing there."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # the open that follows, if any, reports it
    kind = kind_of(mode)
    if kind:
        raise SpecialFileError(path, kind)


def open_descriptor(path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """`os.open(path, flags, mode)`, refusing a special file with SpecialFileError before any open could block on
    it; the descriptor returned blocks as usual."""
    check(path)
    descriptor = os.open(path, flags | os.O_NONBLOCK, mode)
    try:
        kind = kind_of(os.fstat(descriptor).st_mode)
        if kind:
            raise SpecialFileError(path, kind)  # put there between the stat and the open
        fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def open_file(path, mode: str = "rb", **open_kwargs):
    """The file at `path` opened for reading (`mode` "r" or "rb", and `open`'s other arguments), as `open` does,
    but a special file refused (SpecialFileError) without waiting on it."""
    if set(mode) - set("rbt"):
        raise ValueError(f"open_file() reads: mode {mode!r} is not a read mode")
    descriptor = open_descriptor(path)
    try:
        if stat.S_ISDIR(os.fstat(descriptor).st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        return open(descriptor, mode, **open_kwargs)
    except BaseException:
        os.close(descriptor)
        raise


def read_bytes(path) -> bytes:
    """The whole content of the regular file at `path` (SpecialFileError for a special file)."""
    with open_file(path, "rb") as file:
        return file.read()


def read_text(path, encoding: str = "utf-8", errors: str = "strict") -> str:
    """The whole text of the regular file at `path` (SpecialFileError for a special file)."""
    return read_bytes(path).decode(encoding, errors)


class DamagedTableError(DatasetError, ValueError):
    """A CSV file of the project's that cannot be read back as the table it was written as; `str` is the one line,
    naming the file and what is wrong with it."""


def read_csv(path, **read_csv_kwargs):
    """The table of the CSV file at `path` that the project wrote (predictions, an index), as a pandas DataFrame
    (`pandas.read_csv`'s keyword arguments). The one place such a file is parsed.

    Raises OSError as `open_file` does (SpecialFileError, FileNotFoundError, ...), and DamagedTableError when the
    file is not what a whole write leaves: not UTF-8, no header, a row of another length than the header (a file
    cut mid-row, by a kill during a plain write or a copy), a missing column asked for, or a line pandas cannot
    parse."""
    import csv
    import io

    import pandas as pd

    try:
        text = read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as error:
        raise DamagedTableError(f"{path} is damaged: byte {error.start} is not UTF-8 text") from None
    rows = csv.reader(io.StringIO(text, newline=""))
    header = next(rows, None)
    if not header:
        raise DamagedTableError(f"{path} is damaged: it is empty, without even its header")
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise DamagedTableError(f"{path} is damaged: line {number} has {len(row)} of its {len(header)} fields "
                                    f"(a file cut short, or written over)")
    try:
        return pd.read_csv(io.StringIO(text), **read_csv_kwargs)
    except (ValueError, csv.Error) as error:  # pandas' ParserError and EmptyDataError are ValueErrors
        raise DamagedTableError(f"{path} is damaged: {' '.join(str(error).split())[:200]}") from None
