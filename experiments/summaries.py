"""What a run leaves for review: TensorBoard scalars, the HParams record and metrics.json."""
import json
import math
import os

import tensorflow as tf
from omegaconf import OmegaConf
from tensorboard.plugins.hparams import api as hparams_api

from experiments import run_directory

# Config keys a sweep typically varies; they become the HParams dashboard's columns.
HPARAM_KEYS = ("dataset.name", "model.name", "pipeline.batch_size", "pipeline.image_size", "pipeline.cache",
               "pipeline.source", "pipeline.dtype", "trainer.optimizer", "trainer.learning_rate", "trainer.schedule",
               "trainer.train_steps", "seed", "strategy.name", "model.merge")


class Summaries:
    """Event writers for `<model_dir>/train` and `<model_dir>/validation`."""

    def __init__(self, model_dir, enabled=True):
        self.model_dir = model_dir
        self.enabled = enabled
        make = tf.summary.create_file_writer if enabled else (lambda _: tf.summary.create_noop_writer())
        self.writers = {split: make(os.path.join(model_dir, split)) for split in ("train", "validation")}

    def scalars(self, split, values: dict, step: int):
        with self.writers[split].as_default(step=step):
            for tag, value in values.items():
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    tf.summary.scalar(tag, float(value))
        self.writers[split].flush()

    def hparams(self, cfg, headline):
        """Records the run's hyper-parameters for TensorBoard's HParams dashboard, once per run directory: a
        re-entry (resume, evaluate, predict) runs the saved config, already recorded."""
        if not self.enabled or run_directory.has_hparams(self.model_dir):
            return
        values = {}
        for key in HPARAM_KEYS:
            value = OmegaConf.select(cfg, key)
            if value is not None:
                values[key] = value if isinstance(value, (bool, int, float, str)) else str(list(value))
        with tf.summary.create_file_writer(self.model_dir).as_default():
            hparams_api.hparams_config(
                hparams=[hparams_api.HParam(key) for key in values],
                metrics=[hparams_api.Metric(headline, group="validation"),
                         hparams_api.Metric("loss", group="validation")])
            hparams_api.hparams(values)


def evaluated_step(model_dir):
    """The global step of the evaluation metrics.json holds; None when there is none yet."""
    try:
        with open(os.path.join(model_dir, "metrics.json")) as f:
            return json.load(f).get("global_step")
    except (OSError, ValueError):
        return None


def write_metrics(model_dir, values: dict):
    """Writes metrics.json atomically, so a reader never sees half a file."""
    path = os.path.join(model_dir, "metrics.json")
    clean = {key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in values.items()}
    with open(path + ".tmp", "w") as f:
        json.dump(clean, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)
