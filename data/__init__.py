"""Datasets: one Task subclass per dataset (data/task.py), and the input pipeline that reads them.

Adding a dataset: write ``data/<name>.py`` with a Task subclass, add it to TASKS
below, and add ``conf/dataset/<name>.yaml``; README's "Adding a dataset" has the steps.
"""
from tf_harness.data.chest_xray import ChestXray
from tf_harness.data.errors import ConfigError
from tf_harness.data.imagenet_det import ImagenetDet
from tf_harness.data.images import Decode, image_size
from tf_harness.data.lfw_pairs import LfwPairs
from tf_harness.data.task import Task

TASKS = {
    "chest_xray": ChestXray,
    "imagenet_det": ImagenetDet,
    "lfw_pairs": LfwPairs,
}


def task_from_config(cfg) -> Task:
    """The Task named by `dataset.name`, with its decode settings and options read from the config once."""
    name = cfg.dataset.name
    if name not in TASKS:
        raise ConfigError(f"dataset={name} is unknown; choose one of {', '.join(TASKS)}")
    task_class = TASKS[name]
    decode = Decode(image_size(cfg.pipeline.image_size), cfg.dataset.resize, cfg.dataset.crop_fraction)
    return task_class(decode, int(cfg.seed), **{key: cfg.dataset[key] for key in task_class.OPTIONS})
