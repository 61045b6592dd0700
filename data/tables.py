"""A dataset's index tables: where the data is, its rows per split, and which image files decode.

This is the pipeline's first step (index once, in Python; docs/input-pipeline.md) around a Task's own `index`.
"""
import logging
from pathlib import Path

from tf_harness.data.errors import ConfigError, DatasetError
from tf_harness.data.integrity.verification import check_files
from tf_harness.data.samples import sample_root

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
        verify_images: check every image file once (data/integrity/verification.py; remembered per file),
            so a damaged file is listed in skipped.csv instead of surfacing mid-epoch.
        skipped: the run's SkipLog.
        max_skipped_fraction: the largest share of the examples that may be skipped
            (dataset.max_skipped_fraction); more means the data is not what it claims to be.

    Raises:
        DatasetError: more than `max_skipped_fraction` of the examples were skipped.
    """
    tables = task.index(dataset_root(task, root), skipped)
    if verify_images:
        tables = drop_undecodable(tables, skipped)
    check_skipped(tables, skipped, max_skipped_fraction)
    return tables


def drop_undecodable(tables, skipped) -> dict:
    """`tables` without the rows whose image files are not whole, each listed in `skipped` with what is wrong."""
    paths = sorted({p for table in tables.values() for column in path_columns(table) for p in table[column]})
    bad, checked = check_files(paths)
    log.info("Verified %d image files: %d checked now (new or changed), %d not whole", len(paths), checked, len(bad))
    for path in sorted(bad):
        skipped.add(path, f"undecodable image: {bad[path]}")
    return {name: table[~table[path_columns(table)].isin(list(bad)).any(axis=1)].reset_index(drop=True)
            for name, table in tables.items()}


def check_skipped(tables, skipped, max_skipped_fraction) -> None:
    """Logs each split's size; raises DatasetError when more than `max_skipped_fraction` of the examples
    were skipped."""
    for name, table in tables.items():
        log.info("%s split: %d examples", name, len(table))
    # Records lost from damaged TFRecord shards are skipped, yet still rows of the tables (SkipLog.in_tables).
    kept = sum(len(table) for table in tables.values()) - skipped.in_tables
    if len(skipped) > max_skipped_fraction * (kept + len(skipped)):
        raise DatasetError(f"{len(skipped)} of {kept + len(skipped)} examples were skipped ({skipped.summary()}), "
                           f"more than dataset.max_skipped_fraction={max_skipped_fraction}; fix the data or raise "
                           f"dataset.max_skipped_fraction (the skipped examples are listed in skipped.csv)")
