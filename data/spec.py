"""What a model needs to know about a dataset."""
from dataclasses import dataclass

from tf_harness.data import TASKS


@dataclass(frozen=True)
class DatasetSpec:
    """The shape of a dataset's examples and labels.

    Attributes:
        name: the dataset's config name, e.g. ``chest_xray``.
        task: ``multilabel`` (sigmoid per class), ``binary`` (one sigmoid
            logit) or ``multiclass`` (softmax over classes).
        class_names: one name per output logit.
        channels: image channels after decoding (1 or 3).
        paired: True when an example is a pair of images. Left out (None), it is what the dataset's line in
            ``TASKS`` (data/__init__.py) declares, its ``inputs``: that line is the one place it is written,
            so that the config check reads it before TensorFlow starts. Given, it must agree with that line.
    """

    name: str
    task: str
    class_names: tuple
    channels: int
    paired: bool = None

    def __post_init__(self):
        entry = TASKS.entries.get(self.name)
        if entry is None and self.paired is None:
            raise ValueError(f"DatasetSpec(name={self.name!r}) has no line in TASKS (data/__init__.py) to say "
                             f"whether its examples are pairs; add one, or pass paired")
        if entry is not None and self.paired not in (None, entry.paired):
            raise ValueError(f"DatasetSpec(name={self.name!r}, paired={self.paired}) disagrees with its line in "
                             f"TASKS (data/__init__.py), inputs={entry.inputs!r}; leave paired out")
        if self.paired is None:
            object.__setattr__(self, "paired", entry.paired)
        if getattr(entry, "task", None) not in (None, self.task):
            raise ValueError(f"DatasetSpec(name={self.name!r}, task={self.task!r}) disagrees with its line in TASKS "
                             f"(data/__init__.py), task={entry.task!r}")

    @property
    def num_outputs(self) -> int:
        return len(self.class_names)
