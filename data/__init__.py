"""Datasets: one Task subclass per dataset (data/task.py), and the input pipeline that reads them.

`TASKS` is the one list of datasets, and its lines are where each dataset declares what the config check
(experiments/config/schema.py) needs: whether an example is one image or a pair, and its ``dataset.*`` options.
Nothing here imports TensorFlow, so the check reads them before TensorFlow starts; a Task's module is
imported when the Task itself is first asked for, and takes its OPTIONS and ``SPEC.paired`` from its line.
Adding a dataset: docs/adding-a-dataset.md.
"""
from dataclasses import dataclass

from tf_harness.data.errors import ConfigError  # noqa: F401  (re-exported)
from tf_harness.data.registry import INPUTS, Entry, Registry  # noqa: F401  (INPUTS re-exported)


@dataclass(frozen=True)
class Dataset(Entry):
    """A dataset's line: its Task class (``"module:Class"``), ``inputs`` (``single`` or ``pair``: what an example
    is, the Task's ``SPEC.paired``), ``options`` (the Task's OPTIONS: the ``dataset.*`` keys its constructor
    takes besides the decode settings) and ``task`` (``SPEC.task``: which metrics an evaluation writes, for the
    check of trainer.best_metric; None: checked once TensorFlow runs), ``test`` (what its test split is, for
    `split=test`; None: it has none) and ``unit`` (the table column holding the unit its examples are drawn in,
    which a bootstrap resamples together, e.g. a patient's images; None: each example) and ``protocol`` (the
    protocol whose metrics an evaluation of a whole split adds, measured on each of its folds:
    experiments/evaluation/metrics.py `PROTOCOLS`; None: none)."""

    task: str = None
    test: str = None
    unit: str = None
    protocol: str = None


# The datasets ---------------------------------------------------------------------------------------

# One line per dataset: its config name (conf/dataset/<name>.yaml), its Task class and what it declares.
TASKS = Registry({
    "chest_xray": Dataset("tf_harness.data.chest_xray:ChestXray", inputs="single",
                          options=("validation_fraction", "test_fraction"), task="multilabel",
                          test="the images test_list.txt names, or dataset.test_fraction of the patients",
                          unit="patient_id"),
    "imagenet_det": Dataset("tf_harness.data.imagenet_det:ImagenetDet", inputs="single", task="multiclass"),
    "lfw_pairs": Dataset("tf_harness.data.lfw_pairs:LfwPairs", inputs="pair", options=("eval_pairs", "fold"),
                         task="binary", test="View 2: pairs.txt's ten folds", protocol="verification"),
})


def __getattr__(name):
    """`Decode`, `image_size` and `Task`, imported (with TensorFlow) when first asked for."""
    if name in ("Decode", "image_size"):
        from tf_harness.data import images
        return getattr(images, name)
    if name == "Task":
        from tf_harness.data.task import Task
        return Task
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
