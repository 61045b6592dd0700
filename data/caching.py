"""tf.data caching of decoded images, safe against runs that were killed mid-pass.

What TensorFlow 2.21 leaves on disk while `data.cache(prefix)` fills (checked in
tests/test_caching.py against real runs):

- ``<prefix>_<n>.lockfile`` (holding only "Created at: <time>") and
  ``<prefix>_<n>.data-00000-of-00001.tempstate<random>`` while shard n is written;
- ``<prefix>_<n>.index`` and ``<prefix>_<n>.data-00000-of-00001`` for every shard
  finished early, which happens when the iterator is saved in a checkpoint mid-pass;
- ``<prefix>.index`` and ``<prefix>.data-*``, the merged cache, only once a pass
  completes; the per-shard files and lockfiles are then removed. ``<prefix>.index``
  alone decides whether TensorFlow reads the cache or writes it.

An iterator dropped mid-pass discards its partial files itself; a killed process
leaves them, and its lockfile makes the next run fail with "There appears to be a
concurrent caching iterator running". The lockfile cannot tell a dead run from a
live one, so this module holds an flock of its own for as long as the process
uses a prefix: a prefix nobody holds has only stale leftovers.
"""
import fcntl
import glob
import logging
import os
from pathlib import Path

from tf_harness.data.errors import ConfigError

log = logging.getLogger(__name__)
# Cache prefixes this process holds, with their open lock files; the OS drops the locks when it exits.
_held = {}


def clean_partial_cache(prefix: str) -> bool:
    """Removes what a killed caching pass left behind; True when there was something.

    Never call it while another iterator may be filling the same prefix.
    """
    # Per-shard files only exist while a pass is unfinished; the merged cache is whole once
    # <prefix>.index exists, and without it any merged data is an interrupted merge.
    leftovers = glob.glob(f"{glob.escape(prefix)}_[0-9]*")
    if not os.path.exists(f"{prefix}.index"):
        leftovers += glob.glob(f"{glob.escape(prefix)}.data-*")
    for path in leftovers:
        os.remove(path)
    if leftovers:
        log.warning("Removed a partial input cache left by an interrupted run: %s (%d files)", prefix, len(leftovers))
    return bool(leftovers)


def _hold(prefix: str) -> bool:
    """Locks `prefix` for this process; True the first time. Raises ConfigError when another process has it."""
    if prefix in _held:
        return False
    lock = open(f"{prefix}.lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ConfigError(f"pipeline.cache=disk: another running process is using the input cache {prefix}; "
                          f"wait for it to finish, or give this run its own hydra.run.dir") from None
    _held[prefix] = lock
    return True


def applies(kind: str, drawn: bool) -> bool:
    """Whether a `kind` cache holds a split's records: never for records drawn afresh in the graph
    (LFW's training pairs), which have no epoch to cache, whatever the kind."""
    return kind != "none" and not drawn


def checkpointable(kind: str, task) -> bool:
    """Whether `task`'s training input iterator, with `kind` of cache, may go into a checkpoint.

    A memory cache's iterator state holds every element cached so far, so each
    checkpoint would grow to the size of the decoded split. A disk cache's holds
    the per-shard files of a pass in progress, which a killed run leaves partial
    and `clean_partial_cache` removes, so it cannot be restored.
    """
    return not applies(kind, drawn=task.DRAWS_TRAINING_RECORDS)


def cache(data, kind, model_dir, split):
    """`data.cache()` in memory, or on disk under `<model_dir>/input_cache/<split>`."""
    if kind == "memory":
        return data.cache()
    directory = Path(model_dir or ".") / "input_cache"
    directory.mkdir(parents=True, exist_ok=True)
    prefix = str(directory / split)
    if _hold(prefix):  # the first use in this process: no live writer can own what is there
        clean_partial_cache(prefix)
    return data.cache(prefix)
