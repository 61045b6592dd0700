"""TFRecord shards as a record source (``pipeline.source=tfrecord``), checked against the run's config.

Before any pipeline reads a split, its shards are checked against manifest.json: each file's size on every
start, and its sha256 once per version of the file (`shard_verdicts`; the converter records the shards it
wrote). A damaged shard (cut short, or changed where it should not be) is read only as far as its records
are whole; the records it lost are listed in skipped.csv (`check_shards`) and count against
dataset.max_skipped_fraction. Training leaves them out; evaluation keeps their rows, with weight 0, so
table order holds. No read ever reaches the damage, so no DataLossError ends or silently shortens a pass.
"""
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tensorflow as tf

from tf_harness.data.errors import ConfigError, DatasetError
from tf_harness.data.integrity import reading
from tf_harness.data.iterators import make_iterator
from tf_harness.data.tfrecords.layout import (MANIFEST, SHARD_NAME, TFRecordSettings, convert_command, fingerprint,
                                              image_prefix, label_key, preprocessing, read_verdicts, sha256,
                                              shard_state, write_verdicts)

log = logging.getLogger(__name__)
AUTOTUNE = tf.data.AUTOTUNE
# Raw records per tf.io.parse_example call: one op per batch instead of one per record.
PARSE_BATCH = 256
# Records counted per step when a damaged shard's whole records are counted.
_COUNT_BATCH = 1024
# Damaged shards this process has logged, by (path, shard_state): each is logged once.
_logged = set()


def _size_text(size) -> str:
    """(height, width) as pipeline.image_size is written: one number for a square."""
    return str(size[0]) if size[0] == size[1] else f"[{size[0]},{size[1]}]"


# The fields of manifest.json that the reader and the converter use, as the converter writes them.
_MANIFEST_FIELDS = ("dataset", "encoding", "image_size", "preprocessing", "splits", "complete")
_SPLIT_FIELDS = ("count", "fingerprint", "path_columns", "label_shape", "shards")
_SHARD_FIELDS = ("file", "count", "bytes", "sha256")


def _shard_problem(shard, complete):
    """What is wrong with a manifest's `shard` entry, or None."""
    if not isinstance(shard, dict) or any(field not in shard for field in _SHARD_FIELDS):
        return f"a shard entry lacks one of {', '.join(_SHARD_FIELDS)}"
    name = shard["file"]
    # Only a file name the converter gives: never a path out of tfrecord.dir, nor a .tmp file.
    if not isinstance(name, str) or not SHARD_NAME.fullmatch(name) or name.endswith(".tmp"):
        return f"shard file {name!r} is not a shard name"
    if complete and not (isinstance(shard["count"], int) and isinstance(shard["bytes"], int)
                         and isinstance(shard["sha256"], str)):
        return f"shard {name} has no count, size or sha256"
    return None


def _manifest_problem(manifest):
    """What makes `manifest`, as parsed from JSON, other than one the converter writes, or None."""
    if not isinstance(manifest, dict) or any(field not in manifest for field in _MANIFEST_FIELDS):
        return f"it lacks one of {', '.join(_MANIFEST_FIELDS)}"
    if not isinstance(manifest["splits"], dict):
        return "its splits are not a mapping"
    for split, entry in manifest["splits"].items():
        if not isinstance(entry, dict) or any(field not in entry for field in _SPLIT_FIELDS):
            return f"split {split} lacks one of {', '.join(_SPLIT_FIELDS)}"
        if not isinstance(entry["shards"], list) or not isinstance(entry["path_columns"], list):
            return f"split {split} has no list of shards or path columns"
        found = next(filter(None, (_shard_problem(shard, manifest["complete"]) for shard in entry["shards"])), None)
        if found:
            return f"split {split}: {found}"
    return None


def read_manifest(path: Path) -> tuple:
    """(the manifest at `path`, None), or (None, why it is none the converter wrote): unreadable, not JSON, or
    without a field the reader and converter use. A file that is not there is (None, None)."""
    try:
        content = reading.read_bytes(path)
    except FileNotFoundError:
        return None, None
    except IsADirectoryError:
        return None, "a directory, not a file: move it away first"
    except OSError as error:  # no permission, a read error
        return None, f"unreadable: {error.strerror or error}"
    try:
        manifest = json.loads(content)
    except ValueError as error:  # cut short or emptied, or not UTF-8 (UnicodeDecodeError)
        return None, f"not JSON: {error}" if content.strip() else "empty"
    problem = _manifest_problem(manifest)
    return (None, problem) if problem else (manifest, None)


def load_manifest(task, settings: TFRecordSettings) -> dict:
    """The complete manifest in tfrecord.dir, checked against the task and settings.

    Raises:
        ConfigError: there is none, or it is for another dataset or config.
        DatasetError: it is damaged (cut short, emptied, not JSON, a field missing).
    """
    directory, command = settings.directory, convert_command(task, settings)
    path = directory / MANIFEST
    manifest, problem = read_manifest(path)
    if problem:
        raise DatasetError(f"{path} is damaged ({problem}); run `{command}` to convert the dataset again")
    if manifest is None:
        raise ConfigError(f"pipeline.source=tfrecord: no {MANIFEST} in tfrecord.dir={directory}; run `{command}` first")
    if not manifest.get("complete"):
        raise ConfigError(f"pipeline.source=tfrecord: the conversion in tfrecord.dir={directory} did not finish; "
                          f"run `{command}` again to complete it")
    if manifest["dataset"] != task.SPEC.name:
        raise ConfigError(f"tfrecord.dir={directory} holds dataset={manifest['dataset']}, not "
                          f"dataset={task.SPEC.name}; point tfrecord.dir at this dataset's shards")
    if manifest["encoding"] != settings.encoding:
        raise ConfigError(f"tfrecord.encoding={settings.encoding}, but tfrecord.dir={directory} holds "
                          f"{manifest['encoding']} shards; set tfrecord.encoding={manifest['encoding']} or run "
                          f"`{command}`")
    if manifest["encoding"] == "raw":
        size, written = list(task.decode.size), manifest["image_size"]
        if written != size:
            raise ConfigError(f"pipeline.image_size={_size_text(size)}, but the raw shards in {directory} hold "
                              f"{_size_text(written)}-pixel images; use pipeline.image_size={_size_text(written)} "
                              f"or run `{command}`")
        if manifest["preprocessing"] != preprocessing(task):
            raise ConfigError(f"dataset.resize/crop_fraction={preprocessing(task)} differ from the raw shards' "
                              f"{manifest['preprocessing']} in {directory}; run `{command}`")
    return manifest


def _count_readable(path, limit) -> int:
    """How many of the first `limit` records of the TFRecord file at `path` read whole (length and CRCs), up to
    the first that does not."""
    count = 0
    try:
        for size in make_iterator(tf.data.TFRecordDataset(path).take(limit).batch(_COUNT_BATCH).map(tf.size)):
            count += int(size)
    except tf.errors.OpError:  # within the batch that failed, count one by one
        try:
            rest = tf.data.TFRecordDataset(path).skip(count).take(min(_COUNT_BATCH, limit - count))
            for _ in make_iterator(rest):
                count += 1
        except tf.errors.OpError:
            pass
    return count


def _verdict(path, shard) -> tuple:
    """(readable records, what is wrong or None) of the shard file at `path`, checked against its manifest
    entry `shard`: whole when its size and sha256 are the recorded ones."""
    size, recorded, count = os.path.getsize(path), shard["bytes"], shard["count"]
    if size == recorded and sha256(path) == shard["sha256"]:
        return count, None
    if size > recorded and sha256(path, recorded) == shard["sha256"]:
        return count, f"{size - recorded} bytes after its recorded end"  # whole; read no further than its records
    if size < recorded:
        why = f"cut short: {size} of {recorded} bytes"
    else:
        why = "its sha256 differs from the manifest's" + (f" and it is {size} bytes, not {recorded}"
                                                           if size != recorded else "")
    readable = _count_readable(str(path), count)
    if size >= recorded and readable == count:
        return 0, why + "; its records are not the ones converted"  # every record whole, yet other content
    return readable, why  # the records before the damage are whole: their CRCs hold


def shard_verdicts(directory, shards, command=None) -> list:
    """(readable records, what is wrong or None) per shard of a manifest entry's `shards`, in order.

    A shard whose size or sha256 differs from the manifest's is damaged: it is readable only up to its first
    record that does not read whole. Verdicts are remembered per shard file (tf_harness.data.tfrecords.layout),
    so a sha256 is read once per version of a file; each damaged shard is logged once per process.
    """
    directory = Path(directory)
    stored = read_verdicts(directory)
    states = [shard_state(directory / shard["file"], shard) for shard in shards]
    pending = [i for i, (shard, state) in enumerate(zip(shards, states))
               if stored.get(shard["file"], (None,))[0] != state]
    if pending:
        start = time.monotonic()
        # hashlib and TensorFlow's reads release the GIL: shards are checked side by side.
        with ThreadPoolExecutor(min(len(pending), max(os.cpu_count() or 1, 2), 8)) as pool:
            found = list(pool.map(lambda i: _verdict(directory / shards[i]["file"], shards[i]), pending))
        for i, verdict in zip(pending, found):
            stored[shards[i]["file"]] = states[i], verdict
        write_verdicts(directory, stored)
        log.info("Checked %d TFRecord shard(s) in %s against %s (sizes and sha256 of %.1f MB) in %.1f s; "
                 "remembered until a file changes", len(pending), directory, MANIFEST,
                 sum(states[i][0] for i in pending) / 1e6, time.monotonic() - start)
    verdicts = [stored[shard["file"]][1] for shard in shards]
    for shard, state, (readable, why) in zip(shards, states, verdicts):
        path = directory / shard["file"]
        if why is None or (str(path), state) in _logged:
            continue
        _logged.add((str(path), state))
        lost = shard["count"] - readable
        rewrite = f"; `{command}` rewrites it" if command else ""
        if lost:
            log.warning("TFRecord shard %s is damaged (%s): %d of its %d records are unreadable and left out "
                        "(skipped.csv)%s", path, why, lost, shard["count"], rewrite)
        else:
            log.warning("TFRecord shard %s has %s; its %d records are read, and nothing after them%s", path, why,
                        shard["count"], rewrite)
    return verdicts


def _split_entry(task, table, split, settings: TFRecordSettings) -> tuple:
    """The manifest and its entry for `split`, checked: the shards must exist, be complete, and hold exactly
    `table`'s rows (unless None).

    Raises:
        ConfigError: the shards are missing, incomplete, stale or made for another config.
    """
    manifest = load_manifest(task, settings)
    directory, command = settings.directory, convert_command(task, settings)
    entry = manifest["splits"].get(split)
    if entry is None:
        raise ConfigError(f"the shards in tfrecord.dir={directory} have no {split} split "
                          f"(they have {', '.join(manifest['splits'])}); run `{command}`")
    if table is not None and (entry["fingerprint"] != fingerprint(table) or entry["count"] != len(table)):
        raise ConfigError(f"the {split} shards in tfrecord.dir={directory} ({entry['count']} examples) do not "
                          f"match the dataset's {split} split ({len(table)} examples); run `{command}`")
    if entry["label_shape"] is None:
        raise ConfigError(f"the {split} split has no labels to read from tfrecord.dir={directory}")
    missing = [str(directory / shard["file"]) for shard in entry["shards"]
               if not os.path.exists(directory / shard["file"])]
    if missing:
        raise ConfigError(f"{len(missing)} shard(s) listed in {directory / MANIFEST} are missing, e.g. "
                          f"{missing[0]}; run `{command}`")
    return manifest, entry


def splits_read(mode, tables) -> list:
    """The splits whose pipelines a run of `mode` builds (experiments/runner.py): the validation split always,
    and the train split to train, the test split (where there is one) to predict."""
    if mode == "predict":
        return ["validation"] + (["test"] if "test" in tables else [])
    return ["validation"] if mode == "evaluate" else ["train", "validation"]


def check_shards(task, tables, settings: TFRecordSettings | None, mode, skipped) -> None:
    """Lists in `skipped` the records lost by damaged shards of the splits a run of `mode` reads, before any
    pipeline reads them: a row per shard (``shard damaged: 240 of 250 records unreadable``) that counts as that
    many examples, of rows still in `tables`, so that dataset.max_skipped_fraction weighs them
    (tf_harness.data.integrity.skipped.SkipLog). Nothing without `settings` (pipeline.source=files); splits that a run
    does not read from shards (LFW's drawn training pairs) are passed over."""
    if settings is None:
        return
    for split in splits_read(mode, tables):
        if split not in tables or (split == "train" and task.DRAWS_TRAINING_RECORDS):
            continue
        _, entry = _split_entry(task, tables[split], split, settings)
        verdicts = shard_verdicts(settings.directory, entry["shards"], convert_command(task, settings))
        for shard, (readable, _) in zip(entry["shards"], verdicts):
            lost = shard["count"] - readable
            if lost:
                skipped.add(settings.directory / shard["file"],
                            f"shard damaged: {lost} of {shard['count']} records unreadable", count=lost,
                            in_tables=True)


class TFRecordRecords:
    """A split's TFRecord shards: serialized examples (``encoded``) or parsed pixels (``raw``).

    Records come in stored order unless training: table order for every split
    but train, whose rows the converter shuffles into shards.
    """

    endless = False

    def __init__(self, task, table, split, training, settings: TFRecordSettings):
        """Checks the shards: they must exist, be complete, and hold exactly `table`'s rows.

        Raises:
            ConfigError: the shards are missing, incomplete, stale or made for another config.
        """
        self.task, self.split, self.training, self.settings = task, split, training, settings
        manifest, entry = _split_entry(task, table, split, settings)
        directory, command = settings.directory, convert_command(task, settings)
        self.files = [str(directory / shard["file"]) for shard in entry["shards"]]
        self.raw, self.entry = manifest["encoding"] == "raw", entry
        verdicts = shard_verdicts(directory, entry["shards"], command)
        # Records each shard can give; a damaged one is read no further (`records`).
        self.readable = [readable for readable, _ in verdicts]
        self.damaged = any(why is not None for _, why in verdicts)
        self.count = sum(self.readable)
        self.identity = {"encoding": manifest["encoding"], "shards": [(shard["sha256"], readable) for shard, readable
                                                                      in zip(entry["shards"], self.readable)]}
        if training and self.count == 0:
            raise DatasetError(f"no record of the {split} shards in tfrecord.dir={directory} can be read (listed in "
                               f"skipped.csv); run `{command}`")
        # Records hold image bytes, not paths: a shuffle buffer of them is bounded in MB.
        self.record_bytes = sum(shard["bytes"] for shard in entry["shards"]) / max(entry["count"], 1)
        self.prefixes = [image_prefix(column) for column in entry["path_columns"]]
        self.label_key = label_key(len(self.prefixes) > 1)
        self.parse_spec = {f"{prefix}/encoded": tf.io.FixedLenFeature([], tf.string) for prefix in self.prefixes}
        self.parse_spec[self.label_key] = tf.io.FixedLenFeature(entry["label_shape"], tf.int64)
        self.target = self._target_spec()

    def _target_spec(self):
        """What task.load makes of a record of this split: the element_spec to match."""
        record = {column: tf.constant("") for column in self.entry["path_columns"]}
        record["label"] = tf.zeros(self.entry["label_shape"], tf.int64)
        return tf.data.Dataset.from_tensors(record).map(self.task.load).element_spec

    def _element(self, pixels, label):
        return (tuple(pixels) if len(pixels) > 1 else pixels[0]), tf.cast(label, self.target[1].dtype)

    def records(self, seed, context=None) -> tf.data.Dataset:
        if not self.training and self.damaged:
            return self._with_blanks()
        read = tf.data.TFRecordDataset
        if self.damaged:  # each shard no further than its whole records
            data = tf.data.Dataset.from_tensor_slices((self.files, tf.constant(self.readable, tf.int64)))
            read = lambda path, readable: tf.data.TFRecordDataset(path).take(readable)  # noqa: E731
        else:
            data = tf.data.Dataset.from_tensor_slices(self.files)
        if self.training:
            workers = context.num_input_pipelines if context is not None else 1
            if workers > 1:
                if len(self.files) < workers:
                    raise ConfigError(f"{len(self.files)} {self.split} shards cannot be split across {workers} "
                                      f"workers; run `{convert_command(self.task, self.settings)}` with this "
                                      f"TF_CONFIG set")
                # By file, before shuffling, so the workers' files are disjoint and together whole.
                data = data.shard(workers, context.input_pipeline_id)
            data = data.shuffle(len(self.files), seed, reshuffle_each_iteration=True)
            cycle_length = min(len(self.files), self.settings.cycle_length)
            data = data.interleave(read, cycle_length=cycle_length, num_parallel_calls=AUTOTUNE)
        else:
            # One file after another, so evaluation sees records in table order.
            data = tf.data.TFRecordDataset(data)
        if self.raw:
            # Raw pixels need no decode, only a parse: a whole batch in one parse and one reshape, since
            # per record these ops would cost more than the bytes.
            data = data.batch(PARSE_BATCH).map(self._parse_raw, num_parallel_calls=AUTOTUNE).unbatch()
        return data

    def _with_blanks(self) -> tf.data.Dataset:
        """Evaluation's records when shards are damaged: each shard's whole records, then a blank of weight 0 for
        each record it lost, so table order holds and the lost rows count for nothing."""
        lost = [shard["count"] - readable for shard, readable in zip(self.entry["shards"], self.readable)]
        shards = tf.data.Dataset.from_tensor_slices((self.files, tf.constant(self.readable, tf.int64),
                                                     tf.constant(lost, tf.int64)))
        if not self.raw:
            # An empty record fails its parse, which unreadable.guard turns into a blank of weight 0.
            return shards.flat_map(lambda path, readable, lost: tf.data.TFRecordDataset(path).take(readable)
                                   .concatenate(tf.data.Dataset.from_tensors(tf.constant(b"")).repeat(lost)))
        features, label = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), self.target)
        blank = tf.data.Dataset.from_tensors((features, label, tf.constant(0.0)))

        def shard(path, readable, lost):
            whole = tf.data.TFRecordDataset(path).take(readable).batch(PARSE_BATCH).map(self._parse_raw).unbatch()
            return whole.map(lambda pixels, label: (pixels, label, tf.constant(1.0))).concatenate(blank.repeat(lost))

        return shards.flat_map(shard)

    def epoch_length(self, context=None) -> int:
        """How many records one epoch of `records` holds: the readable records of this worker's shards."""
        readable = self.readable
        if self.training and context is not None and context.num_input_pipelines > 1:
            readable = readable[context.input_pipeline_id::context.num_input_pipelines]  # as `records` shards them
        return sum(readable)

    def _parse_raw(self, serialized):
        parsed = tf.io.parse_example(serialized, self.parse_spec)
        image_specs = list(self.target[0]) if len(self.prefixes) > 1 else [self.target[0]]
        pixels = [tf.reshape(tf.io.decode_raw(parsed[f"{prefix}/encoded"], tf.uint8), [-1, *spec.shape])
                  for prefix, spec in zip(self.prefixes, image_specs)]
        return self._element(pixels, tf.reshape(parsed[self.label_key], [-1, *self.target[1].shape]))

    def load(self, *record):
        """Parses and decodes one encoded record, exactly as task.load decodes the file; raw records are ready."""
        if self.raw:
            return record
        # Per record: the decode dwarfs the parse, and batches of encoded images would only fill buffers
        # (and input checkpoints) with bytes.
        parsed = tf.io.parse_single_example(record[0], self.parse_spec)
        pixels = [self.task.decode_image(parsed[f"{prefix}/encoded"]) for prefix in self.prefixes]
        return self._element(pixels, tf.reshape(parsed[self.label_key], self.target[1].shape))

    def paths(self, *record):
        """The image files an encoded record was made from, which a failed decode names (data/integrity/unreadable.py)."""
        # An evaluation's blank for a lost record (`_with_blanks`) names no file.
        parsed = tf.io.parse_single_example(record[0], {f"{prefix}/filename": tf.io.FixedLenFeature([], tf.string, "")
                                                        for prefix in self.prefixes})
        return [parsed[f"{prefix}/filename"] for prefix in self.prefixes]
