"""The input_fn factory: one tf.data pipeline shape for every dataset.

Every element is ``(features, labels, weights)`` with a static batch dimension.
Training batches drop the remainder; evaluation pads its last batch and gives
the padding weight 0, so evaluation sees every example exactly once, train and
validation share one ``element_spec``, and each step function is traced once.
"""
import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import tensorflow as tf
from tqdm import tqdm

import data as datasets
from data import caching, images
from data.errors import ConfigError
from data.samples import cache_home, sample_root

log = logging.getLogger(__name__)
AUTOTUNE = tf.data.AUTOTUNE


def dataset_module(cfg):
    """The dataset module named by `dataset.name`."""
    name = cfg.dataset.name
    if name not in datasets.DATASETS:
        raise ConfigError(f"dataset={name} is unknown; choose one of {', '.join(datasets.DATASETS)}")
    return datasets.DATASETS[name]


def dataset_root(cfg, module) -> Path:
    """`dataset.root`, or the embedded sample when it is unset."""
    if cfg.dataset.root is None:
        return sample_root(cfg.dataset.name, module.make_sample)
    root = Path(cfg.dataset.root).expanduser()
    if not root.is_dir():
        raise ConfigError(f"dataset.root={cfg.dataset.root} does not exist or is not a directory")
    return root


def load_tables(cfg, skipped) -> dict:
    """Indexes the dataset once, in Python, and drops rows whose images cannot be decoded."""
    module = dataset_module(cfg)
    tables = module.index(dataset_root(cfg, module), cfg, skipped)
    if cfg.pipeline.verify_images:
        paths = sorted({p for table in tables.values() for column in path_columns(table) for p in table[column]})
        bad = undecodable(paths, module.SPEC.channels)
        for path in sorted(bad):
            skipped.add(path, "undecodable image")
        tables = {name: table[~table[path_columns(table)].isin(bad).any(axis=1)].reset_index(drop=True)
                  for name, table in tables.items()}
    for name, table in tables.items():
        log.info("%s split: %d examples", name, len(table))
    return tables


def path_columns(table) -> list:
    """The table's image path columns: ``path``, or ``path_a`` and ``path_b`` for pairs."""
    return sorted(column for column in table.columns if column.startswith("path"))


def undecodable(paths, channels) -> set:
    """The paths among `paths` that do not decode, found once and cached by the files' sizes and mtimes."""
    signature = hashlib.sha256()
    for path in paths:
        stat = os.stat(path)
        signature.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    cached = cache_home() / "verified" / f"{signature.hexdigest()[:32]}-{channels}.json"
    if cached.exists():
        return set(json.loads(cached.read_text()))
    # A decode error drops the element, so the indices that come out are the files that decode.
    data = tf.data.Dataset.from_tensor_slices((np.arange(len(paths)), paths))
    data = data.map(lambda i, path: (i, tf.shape(images.decode(tf.io.read_file(path), channels))[0]),
                    num_parallel_calls=AUTOTUNE)
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


def records(table) -> tf.data.Dataset:
    """The cheap per-example records: image paths and labels, one tensor per column."""
    columns = path_columns(table) + ["label"]
    return tf.data.Dataset.from_tensor_slices({column: np.asarray(table[column].tolist()) for column in columns})


def _normalize(image, method):
    image = tf.cast(image, tf.float32)
    if method == "per_image_standardization":
        return tf.image.per_image_standardization(image)
    return image / 127.5 - 1.0  # unit_range: [-1, 1], what ResNet-v2 expects


def _augment(image, seed, flip):
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, seed)
    return tf.image.stateless_random_brightness(image, 0.1 * 255, seed + 1)


def preprocess_fn(cfg, training, seed):
    """Augments (training only) and normalises uint8 images to float32; graph-only."""
    augment = training and cfg.pipeline.augment
    flip, method = cfg.dataset.flip, cfg.dataset.normalize

    def one(image, element_seed):
        image = tf.cast(image, tf.float32)
        if augment:
            image = tf.clip_by_value(_augment(image, element_seed, flip), 0, 255)
        return _normalize(image, method)

    def preprocess(index, example):
        features, label = example
        element_seed = tf.stack([tf.constant(seed, tf.int64), index])
        if isinstance(features, tuple):
            features = tuple(one(image, element_seed + 2 * k) for k, image in enumerate(features))
        else:
            features = one(features, element_seed)
        return features, label

    return preprocess


def pad_batch(batch_size):
    """Pads a final short batch to `batch_size`, with weight 0 on the padding."""

    def pad(features, labels):
        size = tf.shape(labels)[0]

        def pad_one(tensor):
            padding = [[0, batch_size - size]] + [[0, 0]] * (tensor.shape.rank - 1)
            padded = tf.pad(tensor, padding)
            padded.set_shape([batch_size] + tensor.shape[1:])
            return padded

        return tf.nest.map_structure(pad_one, features), pad_one(labels), pad_one(tf.ones([size]))

    return pad


def input_fn(cfg, table, training, split, model_dir=None, seed=None) -> tf.data.Dataset:
    """Builds the pipeline for one split's table, in DESIGN's order.

    Args:
        cfg: the composed config.
        table: the split's index table (from `load_tables`).
        training: shuffle, repeat forever, augment and drop the last partial batch.
        split: the split's name, used to name the disk cache.
        model_dir: run directory, where `pipeline.cache=disk` keeps its files.
        seed: shuffle and augmentation seed; defaults to `cfg.seed`.
    """
    module = dataset_module(cfg)
    seed = cfg.seed if seed is None else seed
    batch_size = cfg.pipeline.batch_size
    cache = cfg.pipeline.cache
    sampled = training and hasattr(module, "train_records")
    buffer = cfg.pipeline.shuffle_buffer or max(len(table), 1)
    if cache not in ("none", "memory", "disk"):
        raise ConfigError(f"pipeline.cache={cache} is not one of none|memory|disk")

    if cfg.pipeline.source == "tfrecord" and not sampled:
        from data import tfrecords  # imported here: data.tfrecords imports this module
        # Shuffles and, unless a cache comes next, repeats the records itself when training.
        data = tfrecords.read(cfg, split, training, seed, table)
    else:
        if cfg.pipeline.source == "tfrecord":
            log.info("%s draws its training examples from the image files afresh; shards serve its evaluation",
                     cfg.dataset.name)
        # Index records are cheap; shuffling them, not decoded images, keeps the buffer small.
        data = module.train_records(table, cfg, seed) if sampled else records(table)
        if training and not sampled and cache == "none":
            # Reshuffled every pass; repeat after shuffle so each epoch is seen whole.
            data = data.shuffle(buffer, seed, reshuffle_each_iteration=True).repeat()
        # The expensive part: read, decode and resize in parallel.
        data = data.map(lambda record: module.load(record, cfg), num_parallel_calls=AUTOTUNE)
    if cache != "none" and not sampled:
        # Cache decoded, resized images once; shuffle and augment after, so every pass differs.
        data = caching.cache(data, cache, model_dir, split)
        if training:
            data = data.shuffle(min(buffer, 10_000), seed, reshuffle_each_iteration=True).repeat()
    # A per-element counter seeds stateless augmentation: deterministic and checkpointable.
    data = data.enumerate().map(preprocess_fn(cfg, training, seed), num_parallel_calls=AUTOTUNE)
    if training:
        data = data.batch(batch_size, drop_remainder=True)
        data = data.map(lambda features, labels: (features, labels, tf.ones([batch_size])))
    else:
        data = data.batch(batch_size).map(pad_batch(batch_size))
    # Overlap input with the model step.
    data = data.prefetch(AUTOTUNE)
    options = tf.data.Options()
    # Training may take whichever image decodes first; evaluation keeps table order, which
    # predictions.csv and the protocol metrics rely on.
    options.deterministic = bool(cfg.deterministic) or not training
    return data.with_options(options)
