"""TFRecord shards of a dataset: the converter and the reader.

Convert once, then train with ``pipeline.source=tfrecord``::

    python -m data.tfrecords dataset=chest_xray [dataset.root=...] [tfrecord.encoding=encoded|raw]
                             [pipeline.image_size=224]

Every split of the index tables becomes ``<split>-00003-of-00012.tfrecord`` files
of ``tf.train.Example`` records under ``tfrecord.dir``, named after the TF-slim /
Object Detection API convention: ``image/encoded``, ``image/format``,
``image/height``, ``image/width``, ``image/channels``, ``image/filename`` and
``image/class/label``. A pair table (columns ``path_a``, ``path_b``) gets the same
features per image under ``image_a/`` and ``image_b/`` and its label as
``pair/label``. ``tfrecord.encoding=encoded`` stores the original file bytes;
``raw`` stores the uint8 pixels that the dataset module's own ``load`` produces at
``pipeline.image_size``, so reading them needs no decode at all.

``manifest.json`` beside the shards records the dataset, encoding, image size,
feature spec, and per split and shard the record count and sha256. Shards are
written under a ``.tmp`` name and renamed when whole, and the manifest is
updated as each one completes, so a killed conversion leaves nothing a reader
takes for data and a re-run writes only the shards still missing.
"""
import hashlib
import io
import json
import logging
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import hydra
import numpy as np
import tensorflow as tf
from PIL import Image
from tqdm import tqdm

from data import images
from data.errors import ConfigError
from data.input_fn import dataset_module, load_tables, path_columns, records, workers
from data.skipped import SkipLog

log = logging.getLogger("data.tfrecords")  # not __name__, which is __main__ under `python -m`
AUTOTUNE = tf.data.AUTOTUNE

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
ENCODINGS = ("encoded", "raw")
# Raw records per tf.io.parse_example call: one op per batch instead of one per record.
PARSE_BATCH = 256
_MB = 1_000_000
_SHARD_NAME = re.compile(r"(\w+)-\d{5}-of-\d{5}\.tfrecord(\.tmp)?")
# Magic numbers of the formats tf.io.decode_image reads; the file name may lie (PNGs named .jpg).
_FORMATS = ((b"\x89PNG", "png"), (b"\xff\xd8", "jpeg"), (b"GIF8", "gif"), (b"BM", "bmp"))


# ---------------------------------------------------------------------------------------------
# Names and layout


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


def _label_shape(table):
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


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_json(path: Path, content) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(content, indent=1))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# The converter


def _preprocessing(cfg) -> dict:
    """The dataset settings besides the image size that decide raw pixels."""
    return {"resize": cfg.dataset.get("resize"), "crop_fraction": cfg.dataset.get("crop_fraction")}


def _check(cfg):
    if cfg.tfrecord.encoding not in ENCODINGS:
        raise ConfigError(f"tfrecord.encoding={cfg.tfrecord.encoding} is not one of {'|'.join(ENCODINGS)}")
    for key in ("shard_mb", "min_shards_per_worker"):
        value = cfg.tfrecord[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"tfrecord.{key}={value} must be a positive number")


def _plan(cfg, split, table, module) -> list:
    """Row indices per shard: shards aim at tfrecord.shard_mb and number enough for every worker.

    Training rows are shuffled into shards (indexes are often sorted by class or
    patient, and a reader mixes only a few shards at a time); evaluation shards
    keep table order, which evaluation and predict rely on.
    """
    columns = path_columns(table)
    if cfg.tfrecord.encoding == "raw":
        height, width = images.configured_size(cfg)
        size = len(table) * len(columns) * height * width * module.SPEC.channels
    else:
        size = sum(os.path.getsize(path) for column in columns for path in table[column])
    count = math.ceil(size / (cfg.tfrecord.shard_mb * _MB))
    if split == "train":
        count = max(count, int(cfg.tfrecord.min_shards_per_worker) * workers()[0])
    count = max(1, min(count, len(table)))
    order = np.random.default_rng(cfg.seed).permutation(len(table)) if split == "train" else np.arange(len(table))
    return np.array_split(order, count)


def _image_format(contents: bytes) -> str:
    return next((name for magic, name in _FORMATS if contents.startswith(magic)), "unknown")


def _encoded_image(path):
    """The features of one image file stored as its original bytes."""
    with open(path, "rb") as f:
        contents = f.read()
    try:
        with Image.open(io.BytesIO(contents)) as image:  # reads the header only
            (width, height), channels = image.size, len(image.getbands())
    except OSError:  # a format PIL cannot parse but TensorFlow decodes; sizes are informative only
        width = height = channels = 0
    return contents, _image_format(contents), height, width, channels


def _stored_images(cfg, module, rows):
    """(row position, [(contents, format, height, width, channels) per path column]) of each row to store."""
    columns = path_columns(rows)
    if cfg.tfrecord.encoding == "encoded":
        for i in range(len(rows)):
            yield i, [_encoded_image(rows[column].iloc[i]) for column in columns]
        return
    # raw: the module's own load, so shards hold exactly the pixels the file pipeline makes.
    data = records(rows).enumerate().map(lambda i, record: (i, module.load(record, cfg)[0]),
                                         num_parallel_calls=AUTOTUNE, deterministic=True)
    for i, pixels in data.ignore_errors().as_numpy_iterator():  # a row whose load fails is left out
        yield i, [(image.tobytes(), "raw", *image.shape) for image in (pixels if isinstance(pixels, tuple)
                                                                         else (pixels,))]


def _serialize(features: dict) -> bytes:
    def feature(value):
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(value).astype(np.int64).tolist()))

    example = tf.train.Example(features=tf.train.Features(feature={key: feature(value)
                                                                   for key, value in features.items()}))
    # Map order is otherwise not fixed, and equal shards must hash equal for a re-run to reuse them.
    return example.SerializeToString(deterministic=True)


def _examples(cfg, module, rows, skipped):
    """Serialized examples of `rows` (a table slice), in row order."""
    columns = path_columns(rows)
    key = label_key(len(columns) > 1)
    labels = rows.label.tolist() if "label" in rows.columns else None
    stored = set()
    for i, stored_images in _stored_images(cfg, module, rows):
        stored.add(i)
        features = {}
        for column, (contents, image_format, height, width, channels) in zip(columns, stored_images):
            prefix = image_prefix(column)
            features.update({f"{prefix}/encoded": contents, f"{prefix}/format": image_format.encode(),
                             f"{prefix}/height": height, f"{prefix}/width": width, f"{prefix}/channels": channels,
                             f"{prefix}/filename": str(rows[column].iloc[i]).encode()})
        if labels is not None:
            features[key] = labels[i]
        yield _serialize(features)
    for i in sorted(set(range(len(rows))) - stored):
        skipped.add(rows[columns[0]].iloc[i], "undecodable image (raw TFRecord conversion)")


def _write_shard(cfg, module, rows, path: Path, progress, skipped) -> dict:
    """Writes one shard under a temporary name and renames it when whole."""
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with tf.io.TFRecordWriter(str(tmp)) as writer:
        for record in _examples(cfg, module, rows, skipped):
            writer.write(record)
            count += 1
            progress.update(1)
    sha256 = _sha256(tmp)
    os.replace(tmp, path)
    return {"file": path.name, "count": count, "bytes": path.stat().st_size, "sha256": sha256}


def _identity(manifest) -> dict:
    """What decides a manifest's shard contents; shards of an equal identity can be reused."""
    same = {key: value for key, value in manifest.items() if key not in ("splits", "complete")}
    same["splits"] = {split: (entry["fingerprint"], [shard["file"] for shard in entry["shards"]])
                      for split, entry in manifest["splits"].items()}
    return same


def _reusable(directory: Path, old: dict) -> bool:
    """Whether a shard that the manifest `old` records as complete is on disk, whole and unchanged."""
    path = directory / old["file"]
    return (old.get("sha256") is not None and path.exists() and path.stat().st_size == old["bytes"]
            and _sha256(path) == old["sha256"])


def _planned_manifest(cfg, module, tables):
    """The manifest this conversion will write, its shards not yet written, and a (split, shard, rows) job each."""
    raw = cfg.tfrecord.encoding == "raw"
    manifest = {"format_version": FORMAT_VERSION, "dataset": cfg.dataset.name, "encoding": cfg.tfrecord.encoding,
                # raw pixels are valid only for the size and resize method they were made with
                "image_size": list(images.configured_size(cfg)) if raw else None,
                "preprocessing": _preprocessing(cfg) if raw else None,
                "channels": module.SPEC.channels, "seed": cfg.seed, "splits": {}, "complete": False}
    jobs = []
    for split, table in tables.items():
        if split == "train" and hasattr(module, "train_records"):
            # Drawn afresh every step from the image files (LFW's pairs); no fixed records to store.
            log.info("Not converting %s's train split: its training examples are drawn from the image files",
                     cfg.dataset.name)
            continue
        shards = _plan(cfg, split, table, module)
        columns, label_shape = path_columns(table), _label_shape(table)
        manifest["splits"][split] = {
            "count": None, "fingerprint": fingerprint(table), "path_columns": columns, "label_shape": label_shape,
            "feature_spec": feature_spec(columns, label_shape),
            "shards": [{"file": shard_name(split, i, len(shards)), "count": None, "bytes": None, "sha256": None}
                       for i in range(len(shards))]}
        jobs += [(split, i, table.iloc[rows]) for i, rows in enumerate(shards)]
    return manifest, jobs


def convert(cfg) -> dict:
    """Writes the shards and manifest of every split of `cfg`'s dataset; returns the manifest.

    Re-running with the same dataset and settings writes only the shards that are
    missing or do not match the manifest's sha256.
    """
    _check(cfg)
    module = dataset_module(cfg)
    directory = Path(cfg.tfrecord.dir).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    skipped = SkipLog()
    manifest, jobs = _planned_manifest(cfg, module, load_tables(cfg, skipped))
    encoding = cfg.tfrecord.encoding

    old_path = directory / MANIFEST
    old = json.loads(old_path.read_text()) if old_path.exists() else None
    if old is not None and _identity(old) != _identity(manifest):
        log.warning("%s describes other shards (another encoding, size, dataset or shard plan); rewriting all",
                    old_path)
        old = None
    pending = []
    for split, i, rows in jobs:
        shard = manifest["splits"][split]["shards"][i]
        previous = old["splits"][split]["shards"][i] if old else None
        if previous and _reusable(directory, previous):
            shard.update(previous)
        else:
            pending.append((split, i, rows))
    # Files of an earlier plan would only waste space; leftovers of a killed run are rewritten.
    planned = {shard["file"] for entry in manifest["splits"].values() for shard in entry["shards"]}
    for path in directory.iterdir():
        if _SHARD_NAME.fullmatch(path.name) and path.name not in planned:
            path.unlink()
    _write_json(old_path, manifest)

    log.info("Converting %s to %s TFRecords in %s: %d of %d shards to write", cfg.dataset.name, encoding,
             directory, len(pending), len(jobs))
    total = sum(len(rows) for _, _, rows in pending)
    with tqdm(total=total, desc=f"writing {encoding} TFRecords", unit="img") as progress, \
            ThreadPoolExecutor(max(os.cpu_count() or 1, 2)) as pool:
        futures = {pool.submit(_write_shard, cfg, module, rows,
                               directory / manifest["splits"][split]["shards"][i]["file"], progress, skipped):
                   (split, i) for split, i, rows in pending}
        for future in as_completed(futures):
            split, i = futures[future]
            manifest["splits"][split]["shards"][i].update(future.result())
            _write_json(old_path, manifest)  # progress survives a kill; complete shards are reused
    for entry in manifest["splits"].values():
        entry["count"] = sum(shard["count"] for shard in entry["shards"])
    manifest["complete"] = True
    _write_json(old_path, manifest)
    skipped.write(directory / "skipped.csv")
    for split, entry in manifest["splits"].items():
        log.info("%s: %d examples in %d shards", split, entry["count"], len(entry["shards"]))
    return manifest


# ---------------------------------------------------------------------------------------------
# The reader


def _convert_command(cfg) -> str:
    command = f"python -m data.tfrecords dataset={cfg.dataset.name}"
    if cfg.dataset.root is not None:
        command += f" dataset.root={cfg.dataset.root}"
    if cfg.tfrecord.encoding == "raw":
        command += f" tfrecord.encoding=raw pipeline.image_size={cfg.pipeline.image_size}"
    return command


def load_manifest(cfg) -> dict:
    """The complete manifest in tfrecord.dir, checked against this run's config."""
    directory = Path(cfg.tfrecord.dir).expanduser()
    path = directory / MANIFEST
    if not path.exists():
        raise ConfigError(f"pipeline.source=tfrecord: no {MANIFEST} in tfrecord.dir={directory}; "
                          f"run `{_convert_command(cfg)}` first")
    manifest = json.loads(path.read_text())
    if not manifest.get("complete"):
        raise ConfigError(f"pipeline.source=tfrecord: the conversion in tfrecord.dir={directory} did not finish; "
                          f"run `{_convert_command(cfg)}` again to complete it")
    if manifest["dataset"] != cfg.dataset.name:
        raise ConfigError(f"tfrecord.dir={directory} holds dataset={manifest['dataset']}, not "
                          f"dataset={cfg.dataset.name}; point tfrecord.dir at this dataset's shards")
    if manifest["encoding"] != cfg.tfrecord.encoding:
        raise ConfigError(f"tfrecord.encoding={cfg.tfrecord.encoding}, but tfrecord.dir={directory} holds "
                          f"{manifest['encoding']} shards; set tfrecord.encoding={manifest['encoding']} or run "
                          f"`{_convert_command(cfg)}`")
    if manifest["encoding"] == "raw":
        size = list(images.configured_size(cfg))
        if manifest["image_size"] != size:
            written = manifest["image_size"]
            written = written[0] if written[0] == written[1] else written
            raise ConfigError(f"pipeline.image_size={cfg.pipeline.image_size}, but the raw shards in {directory} "
                              f"hold {written}-pixel images; use pipeline.image_size={written} or run "
                              f"`{_convert_command(cfg)}`")
        if manifest["preprocessing"] != _preprocessing(cfg):
            raise ConfigError(f"dataset.resize/crop_fraction={_preprocessing(cfg)} differ from the raw shards' "
                              f"{manifest['preprocessing']} in {directory}; run `{_convert_command(cfg)}`")
    return manifest


def _target_spec(cfg, module, entry):
    """What module.load makes of a record of this split: the element_spec to match."""
    record = {column: tf.constant("") for column in entry["path_columns"]}
    record["label"] = tf.zeros(entry["label_shape"], tf.int64)
    return tf.data.Dataset.from_tensors(record).map(lambda r: module.load(r, cfg)).element_spec


def read(cfg, split, training, seed, table=None) -> tf.data.Dataset:
    """`(features, label)` elements of a split's shards, exactly as `module.load` makes them.

    Args:
        cfg: the composed config; reads tfrecord.dir, pipeline.image_size and pipeline.cache.
        split: ``train``, ``validation`` or ``test``.
        training: shuffle files and records and, unless pipeline.cache is on (the
            cache must see one whole pass; input_fn shuffles and repeats after it),
            repeat forever. Under a multi-worker TF_CONFIG each worker reads its own files.
        seed: the shuffle seed.
        table: the split's index table, when known: the shards must hold exactly its rows.

    Without `training` records come in stored order: table order for every split
    but train, whose rows the converter shuffles into shards.

    Raises:
        ConfigError: the shards are missing, incomplete, stale or made for another config.
    """
    module = dataset_module(cfg)
    manifest = load_manifest(cfg)
    directory = Path(cfg.tfrecord.dir).expanduser()
    entry = manifest["splits"].get(split)
    if entry is None:
        raise ConfigError(f"the shards in tfrecord.dir={directory} have no {split} split "
                          f"(they have {', '.join(manifest['splits'])}); run `{_convert_command(cfg)}`")
    if table is not None and (entry["fingerprint"] != fingerprint(table) or entry["count"] != len(table)):
        raise ConfigError(f"the {split} shards in tfrecord.dir={directory} ({entry['count']} examples) do not match "
                          f"the dataset's {split} split ({len(table)} examples); run `{_convert_command(cfg)}`")
    if entry["label_shape"] is None:
        raise ConfigError(f"the {split} split has no labels to read from tfrecord.dir={directory}")
    files = [str(directory / shard["file"]) for shard in entry["shards"]]
    missing = [path for path in files if not os.path.exists(path)]
    if missing:
        raise ConfigError(f"{len(missing)} shard(s) listed in {directory / MANIFEST} are missing, e.g. {missing[0]}; "
                          f"run `{_convert_command(cfg)}`")
    target = _target_spec(cfg, module, entry)
    prefixes = [image_prefix(column) for column in entry["path_columns"]]
    paired, raw = len(prefixes) > 1, manifest["encoding"] == "raw"
    key = label_key(paired)
    parse_spec = {f"{prefix}/encoded": tf.io.FixedLenFeature([], tf.string) for prefix in prefixes}
    parse_spec[key] = tf.io.FixedLenFeature(entry["label_shape"], tf.int64)
    label_spec = target[1]
    endless = training and cfg.pipeline.cache == "none"

    data = tf.data.Dataset.from_tensor_slices(files)
    if training:
        count, index = workers()
        if count > 1:
            if len(files) < count:
                raise ConfigError(f"{len(files)} {split} shards cannot be split across {count} workers; run "
                                  f"`{_convert_command(cfg)}` with this TF_CONFIG set")
            # By file, before shuffling, so the workers' files are disjoint and together whole.
            data = data.shard(count, index)
        data = data.shuffle(len(files), seed, reshuffle_each_iteration=True)
        cycle_length = min(len(files), cfg.tfrecord.cycle_length)
        data = data.interleave(tf.data.TFRecordDataset, cycle_length=cycle_length, num_parallel_calls=AUTOTUNE)
    else:
        # One file after another, so evaluation sees records in table order.
        data = tf.data.TFRecordDataset(data)
    if endless:
        # Records hold image bytes, not paths: the buffer is bounded in MB (tfrecord.shuffle_buffer_mb).
        # Repeat after shuffle, so each epoch is seen whole.
        mean_bytes = sum(shard["bytes"] for shard in entry["shards"]) / max(entry["count"], 1)
        buffer = cfg.pipeline.shuffle_buffer or int(cfg.tfrecord.shuffle_buffer_mb * _MB // max(mean_bytes, 1))
        data = data.shuffle(max(1, min(buffer, entry["count"])), seed, reshuffle_each_iteration=True).repeat()

    image_specs = list(target[0]) if paired else [target[0]]

    def element(pixels, label):
        return (tuple(pixels) if paired else pixels[0]), tf.cast(label, label_spec.dtype)

    if raw:
        def parse(serialized):
            # A whole batch in one parse and one reshape: per record, these ops would cost more than the bytes.
            parsed = tf.io.parse_example(serialized, parse_spec)
            pixels = [tf.reshape(tf.io.decode_raw(parsed[f"{prefix}/encoded"], tf.uint8), [-1, *spec.shape])
                      for prefix, spec in zip(prefixes, image_specs)]
            return element(pixels, tf.reshape(parsed[key], [-1, *label_spec.shape]))

        return data.batch(PARSE_BATCH).map(parse, num_parallel_calls=AUTOTUNE).unbatch()

    channels = module.SPEC.channels

    def parse_and_decode(serialized):
        # Per record: the decode dwarfs the parse, and batches of encoded images would only fill buffers
        # (and input checkpoints) with bytes. The decode and resize are the module's load's, on stored bytes.
        parsed = tf.io.parse_single_example(serialized, parse_spec)
        pixels = [images.decode_configured(parsed[f"{prefix}/encoded"], channels, cfg) for prefix in prefixes]
        return element(pixels, tf.reshape(parsed[key], label_spec.shape))

    return data.map(parse_and_decode, num_parallel_calls=AUTOTUNE)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg):
    """`python -m data.tfrecords`: a config error is one line on stderr and exit status 2, as for run.py."""
    from experiments import cli  # the command line's conventions; the reader needs nothing from experiments

    cli.guarded(convert, cfg)


if __name__ == "__main__":
    import sys

    from experiments import cli

    sys.exit(cli.exit_code(main))
