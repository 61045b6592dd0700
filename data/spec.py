"""What a model needs to know about a dataset."""
from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetSpec:
    """The shape of a dataset's examples and labels.

    Attributes:
        name: the dataset's config name, e.g. ``chest_xray``.
        task: ``multilabel`` (sigmoid per class), ``binary`` (one sigmoid
            logit) or ``multiclass`` (softmax over classes).
        class_names: one name per output logit.
        channels: image channels after decoding (1 or 3).
        paired: True when an example is a pair of images.
    """

    name: str
    task: str
    class_names: tuple
    channels: int
    paired: bool = False

    @property
    def num_outputs(self) -> int:
        return len(self.class_names)
