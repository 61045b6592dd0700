"""Removes what killed processes left in a run directory, once its lock is held.

A save killed mid-way leaves TensorFlow's staging folder for the checkpoint:
`checkpoints/ckpt-N_temp/part-00000-of-00001.{index,data-...}` (functional_saver
writes the shards there, then MergeV2Checkpoints moves them to `ckpt-N.*` and
deletes the folder), tens to hundreds of MB each. A kill while the `checkpoint`
state file is rewritten leaves `checkpoint.tmp<hex>` (file_io's atomic write).
Neither is ever read again: restore lists complete `ckpt-N` files (experiments/run_dir/checkpoints.py).
"""
import logging
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

# `ckpt-N_temp` (TF 2.x) and `ckpt-N_temp_<uuid>` (the TF1 Saver's name); `checkpoint.tmp<uuid hex>`.
LEFTOVER = re.compile(r"^(ckpt-\d+_temp.*|checkpoint\.tmp[0-9a-f]+)$")


def remove(run_dir) -> list:
    """Deletes killed saves' leftovers under `<run_dir>/checkpoints`, logging each; returns their paths.

    Call only while holding the run directory's lock: a live save's staging folder
    looks the same as a dead one's.
    """
    checkpoint_dir = Path(run_dir) / "checkpoints"
    if not checkpoint_dir.is_dir():
        return []
    removed = []
    for path in sorted(checkpoint_dir.iterdir()):
        if not LEFTOVER.match(path.name):
            continue
        size = _size(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        log.info("Removed %s (%.1f MB) left by an interrupted checkpoint save", path, size / 1e6)
        removed.append(path)
    return removed


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file())
