"""The TFRecord converter: every split of a dataset's index into shards under tfrecord.dir.

``encoded`` records hold the original file bytes; ``raw`` records hold the uint8
pixels the task's own ``load`` produces, so reading them needs no decode. Shards
are written under a ``.tmp`` name and renamed when whole, and the manifest is
updated as each completes, so a killed conversion leaves nothing a reader takes
for data and a re-run writes only the shards still missing.
"""
import io
import logging
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image
from tqdm import tqdm

from tf_harness.data.errors import DatasetError
from tf_harness.data.integrity import reading
from tf_harness.data.integrity.skipped import SkipLog
from tf_harness.data.integrity.writing import is_temporary, publish
from tf_harness.data.iterators import make_iterator
from tf_harness.data.sources import TableRecords
from tf_harness.data.tables import load_tables, path_columns
from tf_harness.data.tfrecords.layout import (FORMAT_VERSION, MANIFEST, SHARD_NAME, TFRecordSettings, convert_command,
                                              feature_spec, fingerprint, image_prefix, label_key, label_shape_of,
                                              preprocessing, read_verdicts, sha256, shard_name, shard_state,
                                              write_json, write_verdicts)
from tf_harness.data.tfrecords.reader import read_manifest

log = logging.getLogger("tf_harness.data.tfrecords")
_MB = 1_000_000
# Magic numbers of the formats tf.io.decode_image reads; the file name may lie (PNGs named .jpg).
_FORMATS = ((b"\x89PNG", "png"), (b"\xff\xd8", "jpeg"), (b"GIF8", "gif"), (b"BM", "bmp"))


def _plan(task, settings: TFRecordSettings, split, table, seed, workers) -> list:
    """Row indices per shard: shards aim at tfrecord.shard_mb and number enough for every worker.

    Training rows are shuffled into shards (indexes are often sorted by class or
    patient, and a reader mixes only a few shards at a time); evaluation shards
    keep table order, which evaluation and predict rely on.
    """
    columns = path_columns(table)
    if settings.encoding == "raw":
        height, width = task.decode.size
        size = len(table) * len(columns) * height * width * task.SPEC.channels
    else:
        size = sum(os.path.getsize(path) for column in columns for path in table[column])
    count = math.ceil(size / (settings.shard_mb * _MB))
    if split == "train":
        count = max(count, settings.min_shards_per_worker * workers)
    count = max(1, min(count, len(table)))
    order = np.random.default_rng(seed).permutation(len(table)) if split == "train" else np.arange(len(table))
    return np.array_split(order, count)


def _image_format(contents: bytes) -> str:
    return next((name for magic, name in _FORMATS if contents.startswith(magic)), "unknown")


def _encoded_image(path):
    """The features of one image file stored as its original bytes."""
    contents = reading.read_bytes(path)
    try:
        with Image.open(io.BytesIO(contents)) as image:  # reads the header only
            (width, height), channels = image.size, len(image.getbands())
    except OSError:  # a format PIL cannot parse but TensorFlow decodes; sizes are informative only
        width = height = channels = 0
    return contents, _image_format(contents), height, width, channels


def _stored_images(task, encoding, rows):
    """(row position, [(contents, format, height, width, channels) per path column]) of each row to store."""
    columns = path_columns(rows)
    if encoding == "encoded":
        for i in range(len(rows)):
            yield i, [_encoded_image(rows[column].iloc[i]) for column in columns]
        return
    # raw: the task's own load, so shards hold exactly the pixels the file pipeline makes.
    source = TableRecords(task, rows)
    data = source.records(seed=0).map(lambda i: (i, source.load(i)[0]), num_parallel_calls=tf.data.AUTOTUNE,
                                      deterministic=True)
    for i, pixels in make_iterator(data.ignore_errors()):  # a row whose load fails is left out
        images = [image.numpy() for image in (pixels if isinstance(pixels, tuple) else (pixels,))]
        yield int(i), [(image.tobytes(), "raw", *image.shape) for image in images]


def _serialize(features: dict) -> bytes:
    def feature(value):
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(value).astype(np.int64).tolist()))

    example = tf.train.Example(features=tf.train.Features(feature={key: feature(value)
                                                                   for key, value in features.items()}))
    # Map order is otherwise not fixed, and equal shards must hash equal for a re-run to reuse them.
    return example.SerializeToString(deterministic=True)


def _examples(task, encoding, rows, skipped):
    """Serialized examples of `rows` (a table slice), in row order."""
    columns = path_columns(rows)
    key = label_key(len(columns) > 1)
    labels = rows.label.tolist() if "label" in rows.columns else None
    stored = set()
    for i, stored_images in _stored_images(task, encoding, rows):
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


def _write_shard(task, encoding, rows, path: Path, progress, skipped, stop=None) -> dict:
    """Writes one shard under a temporary name and renames it when whole. The temporary is `<shard>.tmp`, not
    writing.py's own name: tf.io.TFRecordWriter takes a path, and the converter's clean-up knows this name.
    `stop` (a threading.Event), once set, ends the shard at its next record, unfinished (_Stopped)."""
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with tf.io.TFRecordWriter(str(tmp)) as writer:
        for record in _examples(task, encoding, rows, skipped):
            if stop is not None and stop.is_set():
                raise _Stopped(path)
            writer.write(record)
            count += 1
            progress.update(1)
    digest = sha256(tmp)
    publish(tmp, path)
    return {"file": path.name, "count": count, "bytes": path.stat().st_size, "sha256": digest}


class _Stopped(Exception):
    """A shard left unfinished because the conversion was stopped (a signal); its `.tmp` is cleaned up next time."""


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
            and sha256(path) == old["sha256"])


def _planned_manifest(task, settings: TFRecordSettings, tables, seed, workers):
    """The manifest this conversion will write, its shards not yet written, and a (split, shard, rows) job each."""
    raw = settings.encoding == "raw"
    manifest = {"format_version": FORMAT_VERSION, "dataset": task.SPEC.name, "encoding": settings.encoding,
                # raw pixels are valid only for the size and resize method they were made with
                "image_size": list(task.decode.size) if raw else None,
                "preprocessing": preprocessing(task) if raw else None,
                "channels": task.SPEC.channels, "seed": seed, "splits": {}, "complete": False}
    jobs = []
    for split, table in tables.items():
        if split == "train" and task.DRAWS_TRAINING_RECORDS:
            # Drawn afresh every step from the image files (LFW's pairs); no fixed records to store.
            log.info("Not converting %s's train split: its training examples are drawn from the image files",
                     task.SPEC.name)
            continue
        shards = _plan(task, settings, split, table, seed, workers)
        columns, label_shape = path_columns(table), label_shape_of(table)
        manifest["splits"][split] = {
            "count": None, "fingerprint": fingerprint(table), "path_columns": columns, "label_shape": label_shape,
            "feature_spec": feature_spec(columns, label_shape),
            "shards": [{"file": shard_name(split, i, len(shards)), "count": None, "bytes": None, "sha256": None}
                       for i in range(len(shards))]}
        jobs += [(split, i, table.iloc[rows]) for i, rows in enumerate(shards)]
    return manifest, jobs


def _earlier_manifest(path: Path, command) -> dict:
    """The manifest an earlier run left at `path`, or None: none there, or damaged (one log line), when its
    shards cannot be trusted and are written again.

    Raises:
        DatasetError: a directory is in its place, which the converter did not make and does not remove.
    """
    if path.is_dir():
        raise DatasetError(f"{path} is a directory, not the converter's manifest; move it away and run "
                           f"`{command}` again")
    old, problem = read_manifest(path)
    if problem:
        log.warning("%s is damaged (%s); converting every shard again, and replacing it", path, problem)
    return old


def _reuse_complete_shards(directory: Path, manifest: dict, jobs: list, command) -> list:
    """Takes over the shards of an earlier run of the same plan that are whole; returns the jobs left to do.

    Writes the new manifest, with the reused shards recorded, before any shard is written.
    """
    old_path = directory / MANIFEST
    old = _earlier_manifest(old_path, command)
    # Only files the converter knows it wrote are removed: those an earlier manifest lists, and the .tmp names.
    written = {shard["file"] for entry in (old or {"splits": {}})["splits"].values() for shard in entry["shards"]}
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
    _remove_earlier_files(directory, manifest, written)
    write_json(old_path, manifest)
    return pending


def _remove_earlier_files(directory: Path, manifest: dict, written: set) -> None:
    """Removes the shards of an earlier plan, which would only waste space, and the .tmp leftovers of a killed
    run: only files named in `written` (an earlier manifest's shards), .tmp names of shards, and the manifest's
    temporaries (write_json). Others named like shards are left in place, with one log line."""
    planned = {shard["file"] for entry in manifest["splits"].values() for shard in entry["shards"]}
    written = written | {name + ".tmp" for name in written | planned}
    unknown = []
    for path in sorted(directory.iterdir()):
        if (path.name in written and path.name not in planned) or is_temporary(path.name, of=MANIFEST):
            path.unlink(missing_ok=True)
        elif SHARD_NAME.fullmatch(path.name) and path.name not in planned:
            unknown.append(path.name)
    if unknown:
        log.warning("%d file(s) in %s named like shards are not listed by any manifest, e.g. %s; left in place "
                    "(readers take only the shards %s lists)", len(unknown), directory, unknown[0], MANIFEST)


def _remember_whole(directory: Path, manifest: dict) -> None:
    """Records every shard of `manifest` as whole, as hashed when written or reused, so that a reader checks its
    sha256 again only once the file changes (tf_harness.data.tfrecords.reader.readable_records)."""
    verdicts = read_verdicts(directory)
    for entry in manifest["splits"].values():
        for shard in entry["shards"]:
            verdicts[shard["file"]] = (shard_state(directory / shard["file"], shard), (shard["count"], None))
    write_verdicts(directory, verdicts)


def convert(task, settings: TFRecordSettings, seed, verify_images, max_skipped_fraction, workers=1) -> dict:
    """Writes the shards and manifest of every split of `task`'s dataset; returns the manifest.

    Args:
        task: the dataset's Task; its decode settings make raw pixels.
        settings: the tfrecord.* settings and the dataset root.
        seed: the split and shard-assignment seed.
        verify_images: leave out images that do not decode (tf_harness.data.tables.load_tables).
        max_skipped_fraction: the largest share of examples that may be left out.
        workers: training workers (TF_CONFIG); the train split gets min_shards_per_worker each.

    Re-running with the same dataset and settings writes only the shards that are
    missing or do not match the manifest's sha256.
    """
    directory = settings.directory
    directory.mkdir(parents=True, exist_ok=True)
    skipped = SkipLog()
    tables = load_tables(task, settings.dataset_root, verify_images, skipped, max_skipped_fraction)
    manifest, jobs = _planned_manifest(task, settings, tables, seed, workers)
    encoding = settings.encoding

    pending = _reuse_complete_shards(directory, manifest, jobs, convert_command(task, settings))
    log.info("Converting %s to %s TFRecords in %s: %d of %d shards to write", task.SPEC.name, encoding,
             directory, len(pending), len(jobs))
    total = sum(len(rows) for _, _, rows in pending)
    # A signal (or any error) stops the writers at their next record and cancels the shards not begun: leaving the
    # pool's block would otherwise wait for every shard, the whole conversion, before the process could exit.
    stop = threading.Event()
    with tqdm(total=total, desc=f"writing {encoding} TFRecords", unit="img") as progress, \
            ThreadPoolExecutor(max(os.cpu_count() or 1, 2)) as pool:
        try:
            futures = {pool.submit(_write_shard, task, encoding, rows,
                                   directory / manifest["splits"][split]["shards"][i]["file"], progress, skipped,
                                   stop): (split, i) for split, i, rows in pending}
            for future in as_completed(futures):
                split, i = futures[future]
                manifest["splits"][split]["shards"][i].update(future.result())
                write_json(directory / MANIFEST, manifest)  # progress survives a kill; complete shards are reused
        except BaseException:
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    for entry in manifest["splits"].values():
        entry["count"] = sum(shard["count"] for shard in entry["shards"])
    manifest["complete"] = True
    write_json(directory / MANIFEST, manifest)
    _remember_whole(directory, manifest)
    skipped.write(directory / "skipped.csv")
    for split, entry in manifest["splits"].items():
        log.info("%s: %d examples in %d shards", split, entry["count"], len(entry["shards"]))
    return manifest
