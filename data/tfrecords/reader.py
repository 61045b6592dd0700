"""TFRecord shards as a record source (``pipeline.source=tfrecord``), checked against the run's config."""
import json
import os

import tensorflow as tf

from tf_harness.data.errors import ConfigError
from tf_harness.data.tfrecords.layout import (MANIFEST, TFRecordSettings, convert_command, fingerprint, image_prefix,
                                   label_key, preprocessing)

AUTOTUNE = tf.data.AUTOTUNE
# Raw records per tf.io.parse_example call: one op per batch instead of one per record.
PARSE_BATCH = 256


def _size_text(size) -> str:
    """(height, width) as pipeline.image_size is written: one number for a square."""
    return str(size[0]) if size[0] == size[1] else f"[{size[0]},{size[1]}]"


def load_manifest(task, settings: TFRecordSettings) -> dict:
    """The complete manifest in tfrecord.dir, checked against the task and settings."""
    directory, command = settings.directory, convert_command(task, settings)
    path = directory / MANIFEST
    if not path.exists():
        raise ConfigError(f"pipeline.source=tfrecord: no {MANIFEST} in tfrecord.dir={directory}; run `{command}` first")
    manifest = json.loads(path.read_text())
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
        self.files = [str(directory / shard["file"]) for shard in entry["shards"]]
        missing = [path for path in self.files if not os.path.exists(path)]
        if missing:
            raise ConfigError(f"{len(missing)} shard(s) listed in {directory / MANIFEST} are missing, e.g. "
                              f"{missing[0]}; run `{command}`")
        self.raw, self.entry = manifest["encoding"] == "raw", entry
        self.count = entry["count"]
        # Records hold image bytes, not paths: a shuffle buffer of them is bounded in MB.
        self.record_bytes = sum(shard["bytes"] for shard in entry["shards"]) / max(self.count, 1)
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
            data = data.interleave(tf.data.TFRecordDataset, cycle_length=cycle_length, num_parallel_calls=AUTOTUNE)
        else:
            # One file after another, so evaluation sees records in table order.
            data = tf.data.TFRecordDataset(data)
        if self.raw:
            # Raw pixels need no decode, only a parse: a whole batch in one parse and one reshape, since
            # per record these ops would cost more than the bytes.
            data = data.batch(PARSE_BATCH).map(self._parse_raw, num_parallel_calls=AUTOTUNE).unbatch()
        return data

    def epoch_length(self, context=None) -> int:
        """How many records one epoch of `records` holds: those of this worker's shards."""
        shards = self.entry["shards"]
        if self.training and context is not None and context.num_input_pipelines > 1:
            shards = shards[context.input_pipeline_id::context.num_input_pipelines]  # as `records` shards them
        return sum(shard["count"] for shard in shards)

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
        """The image files an encoded record was made from, which a failed decode names (data/unreadable.py)."""
        parsed = tf.io.parse_single_example(record[0], {f"{prefix}/filename": tf.io.FixedLenFeature([], tf.string)
                                                        for prefix in self.prefixes})
        return [parsed[f"{prefix}/filename"] for prefix in self.prefixes]
