"""The benchmarks' only contact with the project's config and data API.

Every call into `tf_harness.data.*` (Tasks, `load_tables`, `path_columns`, `input_fn`, `make_iterator`, the TFRecord
converter's command line) and the Hydra config composition lives in the small functions below, so a
change of that API is adapted here and nowhere else. The rest of `benchmarks/` sees plain values:
a `DatasetInfo`, a `Bench` (one dataset at one batch and image size), a `tf.data.Dataset` of training
batches, a command line.
"""
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tf_harness.experiments.config.settings import Settings

ROOT = Path(__file__).resolve().parents[1]  # the repository: its conf/ and the folder subprocesses start in
DATASETS = ("chest_xray", "lfw_pairs", "imagenet_det")
SEED = 42


@dataclass
class DatasetInfo:
    """What the benchmarks need to know about a dataset's training split, as plain values.

    Attributes:
        spec: the dataset's DatasetSpec (`channels`, `paired`, `name`, ...).
        table: the training split's index table (a DataFrame, one row per example).
        path_columns: the table's image path columns (`path`, or `path_a`, `path_b`).
        sampled: True when training examples are pairs drawn afresh (LFW), not the table's rows.
        size: (height, width) that the pipeline resizes to.
        method: `resize` or `crop_or_pad` (dataset.resize).
        crop_fraction: the central fraction kept before resizing, or None.
        wnids: ImageNet DET's class ids in label order; None elsewhere.
    """

    spec: object
    table: object
    path_columns: list
    sampled: bool
    size: tuple
    method: str
    crop_fraction: object
    wnids: tuple = None


# ----- data API adapter: config --------------------------------------------------------------


def compose_cfg(dataset, batch_size, image_size, *overrides):
    """The project's config for `dataset`, composed with Hydra as `python run.py` would; `image_size`
    None keeps the dataset's own default."""
    sizes = [] if image_size is None else [f"pipeline.image_size={image_size}"]
    return compose_defaults(dataset, f"pipeline.batch_size={batch_size}", *sizes, *overrides)


def compose_defaults(dataset, *overrides):
    """The project's config for `dataset`: its own defaults (model, sizes, batch), then `overrides`."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="config", overrides=[f"dataset={dataset}", *overrides])


def dataset_absent(name):
    """Why `name` cannot be benchmarked yet, or None when its Task and config are in place."""
    from tf_harness import data

    if name not in data.TASKS:
        return f"no Task named {name} in data.TASKS"
    if not (ROOT / "conf" / "dataset" / f"{name}.yaml").exists():
        return f"no conf/dataset/{name}.yaml"
    return None


# ----- data API adapter: the dataset and its training table -----------------------------------


def describe(cfg) -> DatasetInfo:
    """The dataset of `cfg`: its spec, verified training table and decode settings."""
    from tf_harness.data import imagenet_det
    from tf_harness.data.integrity.skipped import SkipLog
    from tf_harness.data.tables import load_tables, path_columns

    task = Settings.from_config(cfg).task()
    table = load_tables(task, cfg.dataset.root, cfg.pipeline.verify_images, SkipLog(),
                        cfg.dataset.max_skipped_fraction)["train"]
    return DatasetInfo(spec=task.SPEC, table=table, path_columns=path_columns(table),
                       sampled=task.DRAWS_TRAINING_RECORDS, size=task.decode.size, method=task.decode.method,
                       crop_fraction=task.decode.crop_fraction,
                       wnids=imagenet_det.WNIDS if isinstance(task, imagenet_det.ImagenetDet) else None)


class Bench:
    """One dataset at one batch and image size: its config, training table, and its examples in a fixed
    order, which every input row reads alike (the project's pipeline draws its own)."""

    def __init__(self, name, batch_size, image_size, workdir):
        """`image_size`: an int, or None for the dataset's own default (conf/dataset/<name>.yaml)."""
        self.name, self.batch_size, self.image_size = name, batch_size, image_size
        self.workdir = Path(workdir)
        self.cfg = compose_cfg(name, batch_size, image_size)
        self.info = describe(self.cfg)
        self.spec, self.table, self.sampled = self.info.spec, self.info.table, self.info.sampled
        self.per_example = 2 if self.spec.paired else 1
        self.size, self.method, self.crop_fraction = self.info.size, self.info.method, self.info.crop_fraction
        if self.sampled:
            groups = self.table.groupby("person", sort=True).path
            self.people = [list(paths) for _, paths in groups]
            self.with_two = [k for k, paths in enumerate(self.people) if len(paths) >= 2]
        else:
            self.rows = list(zip(*(self.table[c] for c in self.info.path_columns)))
            self.labels = [np.asarray(label, np.float32) for label in self.table.label]
            self.order = np.random.default_rng(SEED).permutation(len(self.rows))

    def cfg_with(self, *overrides):
        return compose_cfg(self.name, self.batch_size, self.image_size, *overrides)

    def first_image(self):
        """The first training image's path."""
        return self.table[self.info.path_columns[0]].iloc[0]

    def example(self, i):
        """Example i as (paths, label): a table row in a fixed shuffled order, or a drawn pair as
        the project draws them (even i: two images of one person; odd i: two people)."""
        if not self.sampled:
            row = self.order[i % len(self.order)]
            return self.rows[row], self.labels[row]
        rng = np.random.default_rng([SEED, i])
        if i % 2 == 0:
            paths = self.people[self.with_two[rng.integers(len(self.with_two))]]
            first, second = rng.choice(len(paths), 2, replace=False)
            return (paths[first], paths[second]), np.ones([1], np.float32)
        a, b = rng.choice(len(self.people), 2, replace=False)
        return (self.people[a][rng.integers(len(self.people[a]))],
                self.people[b][rng.integers(len(self.people[b]))]), np.zeros([1], np.float32)

    def example_paths(self, count=None):
        """The paths of the first `count` examples (default: one pass over the table, at least 1,024
        drawn pairs), each a tuple of one path or two."""
        count = count or (max(len(self.table), 1024) if self.sampled else len(self.table))
        return [tuple(str(path) for path in self.example(i)[0]) for i in range(count)]


# ----- data API adapter: the project's training pipeline --------------------------------------


def train_input(cfg, table, workdir, seed):
    """The project's training input for `table` (rows c, d, e, f and the starvation check's real
    feed): a tf.data.Dataset of (features, labels, weights) uint8 batches, repeated forever."""
    from dataclasses import replace

    from tf_harness.data.input_fn import Pipeline, input_fn

    pipeline = replace(Settings.from_config(cfg).input_pipeline(), seed=seed)
    return input_fn(Settings.from_config(cfg).task(), table, pipeline, split="train", training=True, model_dir=workdir)


def start_phases(dataset, root, image_size):
    """A run's two data phases at its start, over the tree at `root`, with `dataset`'s Task as a run at `image_size`
    builds it from its config: `index()`, which returns the split tables, and `verify(tables)`, which leaves out
    the files that do not decode (as pipeline.verify_images=true does)."""
    from tf_harness.data.integrity.skipped import SkipLog
    from tf_harness.data.tables import drop_undecodable

    task, skipped = Settings.from_config(compose_cfg(dataset, 1, image_size)).task(), SkipLog()
    return lambda: task.index(root, skipped), lambda tables: drop_undecodable(tables, skipped)


def project_iterator(data):
    """The project's iterator over `data` (data/iterators.py), as its trainer and evaluator make them."""
    from tf_harness.data.iterators import make_iterator

    return make_iterator(data)


def training_records(cfg, table):
    """The training records of `table` (drawn pairs for LFW, else row numbers), repeated, and the record
    source whose `load` turns one into an example, as `input_fn` maps them."""
    from tf_harness.data.input_fn import record_source

    source = record_source(Settings.from_config(cfg).task(), table, "train", training=True)
    return source.records(0).repeat(), source


def record_load(source, guarded):
    """The per-record load of `source`: bare, or inside the decode guard (data/integrity/unreadable.py) that turns an
    unreadable file into a skipped record."""
    import tensorflow as tf

    from tf_harness.data.integrity import unreadable

    load = tf.autograph.experimental.do_not_convert(source.load)
    return unreadable.guard(load, source.paths) if guarded else load


def project_resize():
    """The project's shrink of a decoded image: tf_harness.data.images.resize(image, size)."""
    from tf_harness.data.images import resize

    return resize


# ----- data API adapter: the tf.data service's servers -------------------------------------------


def service_command(server, *args):
    """The command line that starts a tf.data service `server` (dispatcher or worker) of the project."""
    return [sys.executable, "-m", "tf_harness.data.service", server, *args]


# ----- data API adapter: the TFRecord converter ------------------------------------------------


def tfrecord_convert_command(name, encoding, directory, image_size, hydra_dir):
    """The command line that converts `name`'s sample into TFRecord shards under `directory`."""
    sizes = [] if image_size is None else [f"pipeline.image_size={image_size}"]
    return [sys.executable, "-m", "tf_harness.data.tfrecords", f"dataset={name}", f"tfrecord.encoding={encoding}",
            f"tfrecord.dir={directory}", *sizes, f"hydra.run.dir={hydra_dir}"]


def tfrecord_overrides(encoding, directory):
    """Config overrides that make `train_input` read the shards `tfrecord_convert_command` wrote."""
    return ["pipeline.source=tfrecord", f"tfrecord.encoding={encoding}", f"tfrecord.dir={directory}"]


def memory_cache_overrides():
    """Config overrides that make `train_input` cache decoded images in memory."""
    return ["pipeline.cache=memory"]
