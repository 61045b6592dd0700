"""Pickled caches under cache_home(): the parsed indexes, metadata and verification verdicts.

A cache is read whole or not at all (a missing or damaged one is simply made again), and written
through a temporary file renamed into place, so a killed write never leaves half a cache behind.
"""
import os
import pickle
from pathlib import Path


def read(path: Path, default=None):
    """The object pickled at `path`, or `default` when there is none or it cannot be read."""
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return default


def write(path: Path, content) -> None:
    """Pickles `content` to `path` atomically: beside it first, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as f:
        pickle.dump(content, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(temporary, path)
