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

A disk cache's prefix is ``<split>-<key>``, the key a digest of everything that decides what it
holds (`content_key`): the split's rows and labels in order, the dataset's options (LFW's
eval_pairs and fold among them), the split seed, the decode settings, and where the records come
from (the files, or which shards and how much of each). A re-entry that changes any of them
(``mode=evaluate dataset.eval_pairs=pairs``) fills a cache of its own instead of reading another
setting's, and the split's caches of other keys, which no live process holds, are removed.
A memory cache lives and dies with its pipeline, so it never outlives its settings.

A finished cache is checked when a process first uses it (`_damage`): its index must open, and its data files
must hold the bytes its index lists. One that fails (a cut copy, a full disk, a garbled index) is removed and
filled again, with a warning. Damage of the same size is found by TensorFlow's checksums as the cache is read;
`damaged` turns that error into one line and removes the cache, so the same command fills it again.
"""
import glob
import hashlib
import json
import logging
import os
import re
from pathlib import Path

import numpy as np

from tf_harness.data.errors import ConfigError
from tf_harness.data.integrity import locks, reading
from tf_harness.data.tables import path_columns

log = logging.getLogger(__name__)
# Bump when what a cache holds changes (the element structure, the decode), so older caches are not read.
FORMAT = 1
# Cache prefixes this process holds, with their locks (locks.Held); the OS drops the locks when it exits.
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
    lock = locks.take(f"{prefix}.lock")
    if lock is None:
        raise ConfigError(f"pipeline.cache=disk: another running process is using the input cache {prefix}; "
                          f"wait for it to finish, or give this run its own hydra.run.dir")
    _held[prefix] = lock
    return True


def applies(kind: str, drawn: bool) -> bool:
    """Whether a `kind` cache holds a split's records: never for records drawn afresh in the graph
    (LFW's training pairs), which have no epoch to cache, whatever the kind. Their images are held
    decoded in the image table instead (data/image_table.py: with ``memory``, or within
    pipeline.image_table_mb), from which the pairs are drawn."""
    return kind != "none" and not drawn


def checkpointable(kind: str, task) -> bool:
    """Whether `task`'s training input iterator, with `kind` of cache, may go into a checkpoint.

    A memory cache's iterator state holds every element cached so far, so each
    checkpoint would grow to the size of the decoded split. A disk cache's holds
    the per-shard files of a pass in progress, which a killed run leaves partial
    and `clean_partial_cache` removes, so it cannot be restored. Drawn records' iterators are saved
    whatever the kind: drawn from the image table too, their state is the counter of draws and the
    batches prefetched; the table is held outside the iterator, in no checkpoint.
    """
    return not applies(kind, drawn=task.DRAWS_TRAINING_RECORDS)


def content_key(task, table, source, training) -> str:
    """A digest of everything that decides what a cache of `table`'s records holds: the rows (paths and labels, in
    order), the task's dataset, options, split seed and decode settings, whether it caches training elements,
    and the source's `identity` where it has one (TFRecord shards: their sha256 and readable records)."""
    decode = task.decode
    settings = {"format": FORMAT, "dataset": task.SPEC.name, "channels": task.SPEC.channels,
                "options": dict(task.options), "seed": task.seed, "training": bool(training),
                "decode": [list(decode.size), decode.method, decode.crop_fraction],
                "source": getattr(source, "identity", "files")}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    if table is not None:
        for column in path_columns(table):
            digest.update(f"\0{column}\0".encode() + "\n".join(table[column].astype(str)).encode())
        if "label" in table.columns:
            labels = np.asarray(table.label.tolist())
            digest.update(f"\0label{labels.shape}{labels.dtype}\0".encode() + labels.tobytes())
    return digest.hexdigest()[:16]


def _other_prefixes(directory: Path, split: str, own: str) -> set:
    """The prefixes of `split`'s caches in `directory` other than `own`: keyed ones and the unkeyed `<split>`."""
    pattern = re.compile(rf"({re.escape(split)}(?:-[0-9a-f]{{16}})?)[._]")
    found = {match.group(1) for match in map(pattern.match, os.listdir(directory)) if match}
    return {str(directory / name) for name in found} - {own}


def _remove_unheld(prefix: str) -> bool:
    """Removes the cache at `prefix` unless a live process holds it; True when removed."""
    try:
        lock = locks.take(f"{prefix}.lock")
    except OSError:
        return False
    if lock is None:
        return False
    with lock:
        _remove_files(prefix)
        os.remove(f"{prefix}.lock")
    return True


def _remove_files(prefix: str) -> None:
    """Removes the cache at `prefix`, all but its lock."""
    for path in glob.glob(f"{glob.escape(prefix)}.*") + glob.glob(f"{glob.escape(prefix)}_[0-9]*"):
        if path != f"{prefix}.lock":
            os.remove(path)


def _damage(prefix: str):
    """Why the finished cache at `prefix` cannot be read whole, or None. Reads its index alone: every element's
    tensors, their shapes and dtypes, which add up to the bytes its data files must hold."""
    import tensorflow as tf

    for path in [f"{prefix}.index", *glob.glob(f"{glob.escape(prefix)}.data-*")]:
        try:
            reading.check(path)  # TensorFlow opens them itself, and would wait on a named pipe
        except reading.SpecialFileError as error:
            return str(error)
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError) as error:
        return f"its index does not open: {getattr(error, 'message', error)}"
    if any(dtype in (tf.string, tf.variant) for dtype in dtypes.values()):
        return None  # no fixed size per element: left to the checksums
    listed = sum(int(np.prod(shape)) * dtypes[name].size for name, shape in shapes.items())
    held = sum(os.path.getsize(path) for path in glob.glob(f"{glob.escape(prefix)}.data-*"))
    return None if held == listed else f"its data files hold {held} bytes where its index lists {listed}"


def damaged(error: BaseException):
    """The one line for a TensorFlow error reading a disk cache this process holds (a checksum that no longer
    matches), once that cache is removed so the next start fills it again; None for any other error."""
    if not type(error).__module__.startswith("tensorflow"):
        return None
    message = str(error)
    for prefix in _held:
        if f"{prefix} " in message:  # TensorFlow's wording: `TensorBundle at <prefix> shard 0 (...): ...`
            _remove_files(prefix)
            reason = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:.*", "", message, flags=re.DOTALL)
            return (f"the input cache {prefix} is damaged ({' '.join(reason.split())}); it was removed: run the "
                    f"same command again, which fills it anew")
    return None


def cache(data, kind, model_dir, split, content=None):
    """`data.cache()` in memory, or on disk under `<model_dir>/input_cache/<split>-<key>`, removing the split's
    caches of other keys. `content`: what decides the cache's content, (task, table, source, training) for
    `content_key`, or the key itself; None: the cache is just `<split>`."""
    if kind == "memory":
        return data.cache()
    directory = Path(model_dir or ".") / "input_cache"
    directory.mkdir(parents=True, exist_ok=True)
    key = content_key(*content) if isinstance(content, tuple) else content
    prefix = str(directory / (split if key is None else f"{split}-{key}"))
    if _hold(prefix):  # the first use in this process: no live writer can own what is there
        clean_partial_cache(prefix)
        problem = os.path.exists(f"{prefix}.index") and _damage(prefix)
        if problem:
            _remove_files(prefix)
            log.warning("The input cache %s was damaged (%s); removed, this run fills it again", prefix, problem)
        for other in sorted(_other_prefixes(directory, split, prefix)):
            if _remove_unheld(other):
                log.info("Removed the input cache %s, made for other settings of the %s split than this run's",
                         other, split)
    return data.cache(prefix)
