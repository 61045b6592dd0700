"""Datasets: one Task subclass per dataset (data/task.py), and the input pipeline that reads them.

`TASKS` is the one list of datasets. Nothing here imports TensorFlow: the config check
(experiments/schema.py) reads the names, and what each Task declares (data/registry.py), before
TensorFlow starts; a Task's module is imported when the Task itself is first asked for.
Adding a dataset: docs/adding-a-dataset.md.
"""
import dataclasses

from tf_harness.data.errors import ConfigError  # noqa: F401  (re-exported)
from tf_harness.data.registry import Call, Registry

# The datasets ---------------------------------------------------------------------------------------

# One line per dataset: its config name (conf/dataset/<name>.yaml) and its Task class.
TASKS = Registry({
    "chest_xray": "tf_harness.data.chest_xray:ChestXray",
    "imagenet_det": "tf_harness.data.imagenet_det:ImagenetDet",
    "lfw_pairs": "tf_harness.data.lfw_pairs:LfwPairs",
})


# What an example is: one image, or a pair of them.
INPUTS = ("single", "pair")


def dataset_inputs(name) -> str:
    """``single`` or ``pair``: what an example of dataset `name` is, read from its Task's ``SPEC.paired``."""
    from tf_harness.data.spec import DatasetSpec

    fields = dataclasses.fields(DatasetSpec)
    position = [field.name for field in fields].index("paired")

    def paired(spec):
        if not isinstance(spec, Call) or spec.function != f"{DatasetSpec.__module__}.{DatasetSpec.__name__}":
            return None
        return spec.kwargs.get("paired", spec.args[position] if len(spec.args) > position else fields[position].default)

    spec = TASKS.read(name, "SPEC", lambda value: isinstance(paired(value), bool),
                      "DatasetSpec(...) with a literal paired")
    return "pair" if paired(spec) else "single"


def __getattr__(name):
    """`Decode`, `image_size` and `Task`, imported (with TensorFlow) when first asked for."""
    if name in ("Decode", "image_size"):
        from tf_harness.data import images
        return getattr(images, name)
    if name == "Task":
        from tf_harness.data.task import Task
        return Task
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
