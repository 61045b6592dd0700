"""A dataset release's text files (metadata CSVs, split lists, pairs files), read whole as UTF-8.

A copy or download can damage any of them: one that cannot be read, or that holds a byte that is not UTF-8
text, is a DatasetError naming the file, and for such a byte its line and offset, with what to do about it.
"""
import codecs

from tf_harness.data.errors import DatasetError
from tf_harness.data.integrity import reading


def read_text(path, fix: str) -> str:
    """The text of the file at `path`, less a leading byte-order mark (spreadsheet programs write one).

    Raises:
        DatasetError: naming the file, why it cannot be read (for a byte that is not UTF-8: its line and its
            offset in the file) and `fix`, what to do about it.
    """
    try:
        content = reading.read_bytes(path)
    except reading.SpecialFileError as error:  # a named pipe, say, refused before it was opened
        raise DatasetError(f"{error}; {fix}") from None
    except OSError as error:  # a directory in its place, a dangling link, no permission, a read error
        raise unreadable(path, error, fix) from None
    mark = len(codecs.BOM_UTF8) if content.startswith(codecs.BOM_UTF8) else 0
    try:
        return content[mark:].decode("utf-8")
    except UnicodeDecodeError as error:
        byte = mark + error.start
        line = content.count(b"\n", 0, byte) + 1
        raise DatasetError(f"{path}:{line}: byte {byte} (0x{content[byte]:02x}) is not UTF-8 text; the file is "
                           f"damaged, {fix}") from None


def unreadable(path, error: OSError, fix: str) -> DatasetError:
    """The error for a release's file that the OS would not let us read (or stat): `path`, why, and `fix`."""
    return DatasetError(f"{path} cannot be read ({error.strerror or error}); {fix}")
