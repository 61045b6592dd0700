"""The input_fn factory: one tf.data pipeline shape for every dataset.

Every element is ``(features, labels, weights)`` with a static batch dimension;
features are uint8 images, which the traced steps augment and normalise on the
device (data/preprocessing.py). Training batches drop the remainder; evaluation
pads its last batch and gives the padding weight 0, so evaluation sees every
example exactly once, train and validation share one ``element_spec``, and each
step function is traced once.
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


def workers() -> tuple:
    """(number of training workers, this worker's index) from TF_CONFIG; (1, 0) without it."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster, task = config.get("cluster", {}), config.get("task", {})
    chiefs = len(cluster.get("chief", []))
    count = chiefs + len(cluster.get("worker", []))
    # MultiWorkerMirroredStrategy counts the chief as worker 0 when there is one.
    index = int(task.get("index", 0)) + (chiefs if task.get("type") == "worker" else 0)
    return max(count, 1), index


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
        training: shuffle, repeat forever and drop the last partial batch (the train step augments).
        split: the split's name, used to name the disk cache.
        model_dir: run directory, where `pipeline.cache=disk` keeps its files.
        seed: shuffle (and LFW pair-drawing) seed; defaults to `cfg.seed`.
    """
    module = dataset_module(cfg)
    seed = cfg.seed if seed is None else seed
    batch_size = cfg.pipeline.batch_size
    sampled = training and hasattr(module, "train_records")
    worker_count, worker = workers() if training else (1, 0)
    if worker_count > 1:
        # Each worker feeds its own replicas their share of the global batch, from its own examples.
        # (Evaluation is not split: every worker reads the whole split, and the steps take their slice.)
        if batch_size % worker_count:
            raise ConfigError(f"pipeline.batch_size={batch_size} does not divide across {worker_count} workers")
        batch_size //= worker_count
        log.info("Worker %d of %d: %s, %d examples of every global batch of %d", worker, worker_count,
                 "its own pair draws" if sampled else f"its 1/{worker_count} of the {split} split", batch_size,
                 cfg.pipeline.batch_size)
    cache = cfg.pipeline.cache
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
        if sampled:
            # Every worker draws its own pairs.
            data = module.train_records(table, cfg, seed + 7919 * worker)
        else:
            data = records(table)
            if worker_count > 1:
                data = data.shard(worker_count, worker)  # before shuffling: disjoint, and together whole
        if training and not sampled and cache == "none":
            # Reshuffled every pass; repeat after shuffle so each epoch is seen whole.
            data = data.shuffle(buffer, seed, reshuffle_each_iteration=True).repeat()
        # The expensive part: read, decode and resize in parallel.
        data = data.map(lambda record: module.load(record, cfg), num_parallel_calls=AUTOTUNE)
    if cache != "none" and not sampled:
        # Cache decoded, resized images once; shuffle after (and augment in the step), so every pass differs.
        data = caching.cache(data, cache, model_dir, split)
        if training:
            data = data.shuffle(min(buffer, 10_000), seed, reshuffle_each_iteration=True).repeat()
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
