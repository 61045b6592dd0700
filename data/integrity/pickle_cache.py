"""Pickled caches under cache_home(): the parsed indexes, metadata and verification verdicts.

A cache is read whole or not at all (a missing or damaged one is simply made again, a folder or special file
in its place removed, with a warning), and written
through a temporary file renamed into place, so a killed write never leaves half a cache behind.

A file's name is a digest of what decides its content. Written with a `key`, the file holds that key
too, and is read back only for an equal key: a cache copied, renamed or named by a digest that two
keys share never serves the other's content.
"""
import logging
import pickle
import shutil
from pathlib import Path

from tf_harness.data.integrity import reading, writing

log = logging.getLogger(__name__)
_KEYED = "tf-harness keyed cache"


def read(path: Path, default=None, key=None):
    """The object pickled at `path` (with `key`, only where it was written with an equal key), or `default`
    when there is none or it cannot be read."""
    try:
        with reading.open_file(path, "rb") as f:
            content = pickle.load(f)
    except FileNotFoundError:
        return default
    except Exception as error:  # noqa: BLE001; a damaged or foreign pickle fails in many ways: make it again
        log.info("Ignoring the unreadable cache %s (%s: %s)", path, type(error).__name__, error)
        return default
    if key is None:
        return content
    if not _written_with(content, key):
        log.info("Ignoring the cache %s: it was written for other settings", path)
        return default
    return content[2]


def _written_with(content, key) -> bool:
    """Whether `content` is what `write` pickled with `key`. Anything else may be in its place (an unkeyed cache of
    an earlier version, whose first item is a DataFrame, say), and its `==` may give an array or raise."""
    if not (isinstance(content, tuple) and len(content) == 3 and type(content[0]) is str and content[0] == _KEYED):
        return False
    try:
        return bool(content[1] == key)
    except Exception:  # noqa: BLE001  an array's or a frame's ambiguous truth, a comparison that refuses
        return False


def write(path: Path, content, key=None) -> None:
    """Pickles `content` (with `key`, for `read` to check) to `path` atomically: beside it first, then renamed
    over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        writing.check_place(path)
    except reading.SpecialFileError as error:  # the cache's own name: nobody else's, and nothing to keep
        log.warning("Removing the %s %s, which stands where this cache file goes, to write the cache", error.kind,
                    path)
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    with writing.replacing(path, "wb") as f:
        pickle.dump(content if key is None else (_KEYED, key, content), f, protocol=pickle.HIGHEST_PROTOCOL)
