"""The Task interface: what a dataset declares, so that the pipeline and the runner need no special cases.

Adding a dataset means one subclass in ``data/<name>.py``, its sample generator in ``data/samples/<name>.py``,
one ``conf/dataset/<name>.yaml`` and one line in ``TASKS`` (docs/adding-a-dataset.md).
"""
import importlib
from pathlib import Path

from tf_harness.data import TASKS, losses
from tf_harness.data.images import Decode
from tf_harness.data.spec import DatasetSpec


class Task:
    """One dataset: its spec, index, per-record load and evaluation protocol.

    A subclass sets the class attributes and implements `index` and `load`; `train_records`, `loss` and
    `protocol_metrics` are optional, and `make_sample` is ``data/samples/<SPEC.name>.py``'s.
    The dataset's default model is its conf/dataset/<name>.yaml's ``override /model:``.

    OPTIONS and ``SPEC.paired`` are written in the dataset's line in ``TASKS`` (data/__init__.py), which the
    config check (experiments/config/schema.py) reads before TensorFlow starts: a subclass that line names takes
    its OPTIONS from it, and writes none of its own; its ``DatasetSpec`` leaves ``paired`` out.

    Attributes:
        SPEC: the shape of the examples and labels (data/spec.py).
        OPTIONS: the ``dataset.*`` config keys the constructor takes besides the decode settings: the
            ``options`` of the class's line in ``TASKS``.
        DRAWS_TRAINING_RECORDS: whether `train_records` draws the training records (else the
            training table's rows are shuffled and repeated).
        IDENTITIES: who an example is of, where it is of someone, for `seen_in_training`.
        label_smoothing, positive_weights: the options of `loss` (data/losses.py), which the run's settings give
            the Task (``trainer.label_smoothing``, ``trainer.class_weights``); neutral by default.
    """

    SPEC: DatasetSpec
    OPTIONS: tuple = ()
    DRAWS_TRAINING_RECORDS = False
    # (the unit in words, the training table's column, an evaluated table's columns); None: of no one.
    IDENTITIES: tuple | None = None
    label_smoothing: float = 0.0
    positive_weights: tuple | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        entry = TASKS.declaring(cls.__module__, cls.__qualname__)
        if entry is None:
            return
        if "OPTIONS" in vars(cls):
            raise TypeError(f"{entry.path} writes OPTIONS; its line in TASKS (data/__init__.py) declares them")
        cls.OPTIONS = entry.options

    def __init__(self, decode: Decode, seed: int, **options):
        """`decode`: how images are decoded and resized; `seed`: the split seed; `options`: OPTIONS' values."""
        unknown = set(options) - set(self.OPTIONS)
        if unknown:
            raise TypeError(f"{type(self).__name__} takes no option(s) {', '.join(sorted(unknown))}")
        self.decode, self.seed, self.options = decode, seed, options

    def index(self, root: Path, skipped) -> dict:
        """Lists and parses the metadata under `root`, once, in Python.

        Returns one pandas table per split (``train``, ``validation`` and, where the
        data has one, ``test``). Image path columns are ``path`` (or ``path_a`` and
        ``path_b`` for pairs) and hold absolute paths; ``label`` is an int or a list
        of ints (multi-hot). Unusable rows go to ``skipped.add(path, reason)``; bad
        metadata that a user must fix raises tf_harness.data.errors.DatasetError.
        """
        raise NotImplementedError

    def load(self, record):
        """A graph function from one record (a dict of scalar tensors, one per table column) to
        ``(uint8 image or pair of images, label)``; no Python per example."""
        raise NotImplementedError

    def train_records(self, table, seed):
        """An endless stream of training records drawn in the graph (with DRAWS_TRAINING_RECORDS)."""
        raise NotImplementedError

    def loss(self, labels, logits, weights):
        """The batch's weighted sum of per-example losses, a float32 scalar, in the graph: the train step divides it
        by the global batch size, the evaluation sums it. The default is the task type's cross-entropy
        (data/losses.py) with the Task's `label_smoothing` and `positive_weights`; a dataset with a loss of its own
        overrides this."""
        return losses.batch_loss(self.SPEC.task, labels, logits, weights, self.label_smoothing, self.positive_weights)

    def protocol_metrics(self, table, scores) -> dict:
        """Evaluation numbers the dataset's official protocol defines, from a whole split's scores, beyond the
        metrics its line's ``protocol`` declares (experiments/evaluation/metrics.py `PROTOCOLS`), which every split
        gets."""
        return {}

    def seen_in_training(self, tables, split) -> dict | None:
        """How many of the identities (IDENTITIES) of `split`'s table the training table holds too: {"unit",
        "seen", "of"}; None where the dataset declares none or a table lacks the columns."""
        if self.IDENTITIES is None:
            return None
        unit, trained, evaluated = self.IDENTITIES
        train, table = tables.get("train"), tables.get(split)
        if train is None or table is None or trained not in train or not set(evaluated) <= set(table):
            return None
        identities = set().union(*(set(table[column]) for column in evaluated))
        return {"unit": unit, "seen": len(identities & set(train[trained])), "of": len(identities)}

    @classmethod
    def make_sample(cls, root: Path, seed: int) -> None:
        """Writes the embedded sample into `root` in the exact real layout: ``make_sample(root, seed)`` of
        ``data/samples/<SPEC.name>.py``, found by the dataset's name."""
        importlib.import_module(f"{__package__}.samples.{cls.SPEC.name}").make_sample(root, seed)

    def read_image(self, path):
        """One image file, decoded with this task's channels and decode settings."""
        return self.decode.read(path, self.SPEC.channels)

    def decode_image(self, contents):
        """Image bytes (e.g. from a TFRecord), decoded exactly as `read_image` decodes a file."""
        return self.decode(contents, self.SPEC.channels)

