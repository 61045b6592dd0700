"""The Task interface: what a dataset declares, so that the pipeline and the runner need no special cases.

Adding a dataset means one subclass in ``data/<name>.py``, registered in
``data/__init__.py``, and one ``conf/dataset/<name>.yaml`` (README, "Adding a dataset").
"""
from pathlib import Path

from tf_harness.data.images import Decode
from tf_harness.data.spec import DatasetSpec


class Task:
    """One dataset: its spec, index, per-record load and evaluation protocol.

    A subclass sets the class attributes and implements `index`, `load` and
    `make_sample`; `train_records` and `protocol_metrics` are optional.

    Attributes:
        SPEC: the shape of the examples and labels (data/spec.py).
        DEFAULT_MODEL: the model config a dataset trains by default (its YAML names it too).
        OPTIONS: the ``dataset.*`` config keys the constructor takes besides the decode settings.
        DRAWS_TRAINING_RECORDS: whether `train_records` draws the training records (else the
            training table's rows are shuffled and repeated).
    """

    SPEC: DatasetSpec
    DEFAULT_MODEL: str
    OPTIONS: tuple = ()
    DRAWS_TRAINING_RECORDS = False

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

    def protocol_metrics(self, table, scores) -> dict:
        """Evaluation numbers the dataset's official protocol defines, from a whole split's scores."""
        return {}

    @staticmethod
    def make_sample(root: Path, seed: int) -> None:
        """Writes the embedded sample into `root` in the exact real layout."""
        raise NotImplementedError

    def read_image(self, path):
        """One image file, decoded with this task's channels and decode settings."""
        return self.decode.read(path, self.SPEC.channels)

    def decode_image(self, contents):
        """Image bytes (e.g. from a TFRecord), decoded exactly as `read_image` decodes a file."""
        return self.decode(contents, self.SPEC.channels)

