"""Names, layout and manifest of TFRecord shards, shared by the writer and the reader."""
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tf_harness.data.integrity import pickle_cache, reading
from tf_harness.data.integrity.cache_folder import cache_home
from tf_harness.data.integrity.writing import replacing
from tf_harness.data.tables import path_columns

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
ENCODINGS = ("encoded", "raw")
SHARD_NAME = re.compile(r"(\w+)-\d{5}-of-\d{5}\.tfrecord(\.tmp)?")


@dataclass(frozen=True)
class TFRecordSettings:
    """The ``tfrecord.*`` settings, as plain values, and the dataset root the shards are made from.

    Attributes:
        directory: where the shards and manifest.json are (tfrecord.dir).
        encoding: ``encoded`` (the files' bytes) or ``raw`` (resized uint8 pixels).
        shard_mb: the size shards aim at.
        min_shards_per_worker: the least number of train shards per training worker.
        cycle_length: shards read at once, interleaved, when training.
        dataset_root: dataset.root (None: the embedded sample), for the converter.
    """

    directory: Path
    encoding: str
    shard_mb: float
    min_shards_per_worker: int
    cycle_length: int
    dataset_root: str = None



def convert_command(task, settings: TFRecordSettings) -> str:
    """The command line that writes the shards `settings` asks for, for error messages."""
    command = f"python -m tf_harness.data.tfrecords dataset={task.SPEC.name}"
    if settings.dataset_root is not None:
        command += f" dataset.root={settings.dataset_root}"
    if settings.encoding == "raw":
        height, width = task.decode.size
        size = height if height == width else f"[{height},{width}]"
        command += f" tfrecord.encoding=raw pipeline.image_size={size}"
    return command


def preprocessing(task) -> dict:
    """The decode settings besides the image size that decide raw pixels."""
    return {"resize": task.decode.method, "crop_fraction": task.decode.crop_fraction}


def image_prefix(path_column: str) -> str:
    """The feature prefix of a table's path column: ``path`` -> ``image``, ``path_a`` -> ``image_a``."""
    return "image" + path_column[len("path"):]


def label_key(paired: bool) -> str:
    return "pair/label" if paired else "image/class/label"


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def feature_spec(columns, label_shape) -> dict:
    """The FixedLenFeature spec of every feature a record holds, as JSON-able dicts."""
    spec = {}
    for column in columns:
        prefix = image_prefix(column)
        for name, dtype in (("encoded", "string"), ("format", "string"), ("height", "int64"), ("width", "int64"),
                            ("channels", "int64"), ("filename", "string")):
            spec[f"{prefix}/{name}"] = {"dtype": dtype, "shape": []}
    if label_shape is not None:
        spec[label_key(len(columns) > 1)] = {"dtype": "int64", "shape": list(label_shape)}
    return spec


def label_shape_of(table):
    """[] for an integer label, [n] for a multi-hot list, None for a table without labels."""
    if "label" not in table.columns:
        return None
    first = table.label.iloc[0] if len(table) else 0
    return [len(first)] if isinstance(first, (list, tuple, np.ndarray)) else []


def fingerprint(table) -> str:
    """A digest of a split's rows (file names and labels, in table order).

    File names rather than full paths, so a dataset moved to another root still
    matches its shards, while any added, dropped, reordered or relabelled row does not.
    """
    digest = hashlib.sha256()
    columns = path_columns(table)
    labels = table.label.tolist() if "label" in table.columns else [None] * len(table)
    for row, label in zip(zip(*(table[column] for column in columns)), labels):
        label = np.asarray(label).tolist() if label is not None else None
        digest.update(json.dumps([[os.path.basename(path) for path in row], label]).encode())
    return digest.hexdigest()


def sha256(path, limit=None) -> str:
    """The sha256 of the file at `path`, or of its first `limit` bytes."""
    digest = hashlib.sha256()
    left = float("inf") if limit is None else limit
    with reading.open_file(path, "rb") as f:
        while left > 0:
            block = f.read(int(min(1 << 20, left)))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


# Shard verdicts ---------------------------------------------------------------------------------------
# Whether a shard still holds what manifest.json records of it, remembered per shard file so that its
# sha256 is read once per version of the file (the converter records the shards it writes or checks).
# A verdict is (readable records, what is wrong or None) and holds while the file's `shard_state` is equal.
VERDICTS_VERSION = 1


def shard_state(path, shard) -> tuple:
    """What a verdict on the shard file at `path` holds for: the file as it is now (size, mtime, ctime, which
    no copy or editor sets back, and inode) and what the manifest records of it (`shard`). Raises OSError."""
    stat = os.stat(path)
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, shard["bytes"], shard["sha256"],
            shard["count"])


def _verdicts_key(directory: Path) -> tuple:
    return VERDICTS_VERSION, str(Path(directory).resolve())


def _verdicts_file(directory: Path) -> Path:
    digest = hashlib.sha256(repr(_verdicts_key(directory)).encode()).hexdigest()[:20]
    return cache_home() / "verified" / f"shards-{digest}.pkl"


def read_verdicts(directory: Path) -> dict:
    """{shard file name: (shard_state, verdict)} of the shards in `directory`."""
    return pickle_cache.read(_verdicts_file(directory), {}, key=_verdicts_key(directory))


def write_verdicts(directory: Path, verdicts: dict) -> None:
    pickle_cache.write(_verdicts_file(directory), verdicts, key=_verdicts_key(directory))


def write_json(path: Path, content) -> None:
    with replacing(path) as f:
        f.write(json.dumps(content, indent=1))

