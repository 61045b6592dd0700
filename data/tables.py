"""A dataset's index tables: where the data is, its rows per split, and which image files decode.

This is DESIGN's step 1 (index once, in Python) around a Task's own `index`.
"""
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from data.errors import ConfigError, DatasetError
from data.images import decode
from data.samples import cache_home, sample_root

log = logging.getLogger(__name__)


def dataset_root(task, root) -> Path:
    """`root` (dataset.root) as a checked folder, or the task's embedded sample when it is None."""
    if root is None:
        return sample_root(task.SPEC.name, task.make_sample)
    path = Path(root).expanduser()
    if not path.is_dir():
        raise ConfigError(f"dataset.root={root} does not exist or is not a directory")
    return path


def path_columns(table) -> list:
    """The table's image path columns: ``path``, or ``path_a`` and ``path_b`` for pairs."""
    return sorted(column for column in table.columns if column.startswith("path"))


def load_tables(task, root, verify_images, skipped, max_skipped_fraction) -> dict:
    """Indexes the dataset once, in Python, and with `verify_images` drops rows whose images do not decode.

    Args:
        task: the dataset's Task.
        root: dataset.root, or None for the embedded sample.
        verify_images: decode every image once up front (cached), so a bad file is
            listed in skipped.csv instead of surfacing mid-epoch.
        skipped: the run's SkipLog.
        max_skipped_fraction: the largest share of the examples that may be skipped
            (dataset.max_skipped_fraction); more means the data is not what it claims to be.

    Raises:
        DatasetError: more than `max_skipped_fraction` of the examples were skipped.
    """
    tables = task.index(dataset_root(task, root), skipped)
    if verify_images:
        tables = drop_undecodable(tables, task, skipped)
    check_skipped(tables, skipped, max_skipped_fraction)
    return tables


def drop_undecodable(tables, task, skipped) -> dict:
    """`tables` without the rows whose images do not decode, each listed in `skipped`."""
    paths = sorted({p for table in tables.values() for column in path_columns(table) for p in table[column]})
    bad = undecodable(paths, task)
    for path in sorted(bad):
        skipped.add(path, "undecodable image")
    return {name: table[~table[path_columns(table)].isin(bad).any(axis=1)].reset_index(drop=True)
            for name, table in tables.items()}


def check_skipped(tables, skipped, max_skipped_fraction) -> None:
    """Logs each split's size; raises DatasetError when more than `max_skipped_fraction` of the examples
    were skipped."""
    for name, table in tables.items():
        log.info("%s split: %d examples", name, len(table))
    kept = sum(len(table) for table in tables.values())
    if len(skipped) > max_skipped_fraction * (kept + len(skipped)):
        raise DatasetError(f"{len(skipped)} of {kept + len(skipped)} examples were skipped ({skipped.summary()}), "
                           f"more than dataset.max_skipped_fraction={max_skipped_fraction}; fix the data or raise "
                           f"dataset.max_skipped_fraction (the skipped examples are listed in skipped.csv)")


def undecodable(paths, task) -> set:
    """The paths among `paths` that do not decode, found once and cached by the files' sizes and mtimes."""
    channels = task.SPEC.channels
    signature = hashlib.sha256()
    for path in paths:
        stat = os.stat(path)
        signature.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    cached = cache_home() / "verified" / f"{signature.hexdigest()[:32]}-{channels}.json"
    if cached.exists():
        return set(json.loads(cached.read_text()))
    # A decode error drops the element, so the indices that come out are the files that decode.
    data = tf.data.Dataset.from_tensor_slices((np.arange(len(paths)), paths))
    data = data.map(lambda i, path: (i, tf.shape(decode(tf.io.read_file(path), channels))[0]),
                    num_parallel_calls=tf.data.AUTOTUNE)
    data = data.ignore_errors().batch(256)
    decoded = set()
    with tqdm(total=len(paths), desc="verifying images", unit="img", disable=len(paths) < 2000) as progress:
        for indices, _ in data.as_numpy_iterator():
            decoded.update(indices.tolist())
            progress.update(len(indices))
    bad = {path for i, path in enumerate(paths) if i not in decoded}
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(bad)))
    os.replace(tmp, cached)
    return bad
