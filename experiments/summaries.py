"""What a run leaves for TensorBoard: scalars, review images, heatmaps and the HParams record (metrics.json:
experiments/evaluation/metrics_history.py)."""
import math
import os

import tensorflow as tf
from tensorboard.plugins.hparams import api as hparams_api

from tf_harness.experiments.evaluation import review
from tf_harness.experiments.sweeps import hparams as hparams_record


def file_writer(logdir: str):
    """An event writer for `logdir`, its folder made first: where a file stands in its place, Python's error names
    the path and TensorFlow's does not (experiments/run_dir/os_errors.py)."""
    os.makedirs(logdir, exist_ok=True)
    return tf.summary.create_file_writer(logdir)


class Summaries:
    """Event writers for `<model_dir>/train` and `<model_dir>/validation`; a split not in `splits` gets a writer
    that writes nothing (the sidecar evaluator writes validation/ alone, a non-chief worker neither)."""

    def __init__(self, model_dir, splits=("train", "validation")):
        self.model_dir = model_dir
        self.enabled = bool(splits)
        self.writers = {split: file_writer(os.path.join(model_dir, split)) if split in splits
                        else tf.summary.create_noop_writer() for split in ("train", "validation")}

    def close(self):
        for writer in self.writers.values():
            writer.close()

    def scalars(self, split, values: dict, step: int):
        with self.writers[split].as_default(step=step):
            for tag, value in values.items():
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    tf.summary.scalar(tag, float(value))
        self.writers[split].flush()

    def inputs(self, features, labels, spec, step):
        """A few training inputs as the model sees them (experiments/evaluation/review.py), under train/."""
        with self.writers["train"].as_default(step=step):
            review.write_inputs(features, labels, spec, step)
        self.writers["train"].flush()

    def evaluation(self, spec, labels, probabilities, step):
        """An evaluation's PR curves or confusion matrix (experiments/evaluation/review.py), under validation/."""
        if self.enabled:
            with self.writers["validation"].as_default(step=step):
                review.write_evaluation(spec, labels, probabilities, step)
            self.writers["validation"].flush()

    def heatmaps(self, overlays, step):
        """Image summary `heatmaps` under validation/ of what `overlays()` gives: (uint8 overlays, a line naming
        each), or None."""
        shown = overlays() if self.enabled else None
        if shown is not None:
            images, description = shown
            with self.writers["validation"].as_default(step=step):
                tf.summary.image("heatmaps", images, step=step, max_outputs=len(images),
                                 description=f"LayerCAM heatmaps of the class scored highest: {description}")
            self.writers["validation"].flush()

    def hparams(self, settings, spec, job):
        """Records the run's hyper-parameters for TensorBoard's HParams dashboard (experiments/sweeps/hparams.py), once
        per run directory: a re-entry (resume, evaluate, predict) runs the saved config, already recorded. `spec`:
        the dataset's DatasetSpec."""
        if not self.enabled or hparams_record.has_record(self.model_dir):
            return
        hparams, values, swept = hparams_record.hparams_and_values(settings, job)
        metrics = hparams_record.metric_columns(spec.task, hparams_record.swept_tasks(swept),
                                                hparams_record.protocol_columns(spec.name, swept))
        config = hparams_record.config_pb(hparams, metrics, swept)
        with tf.summary.create_file_writer(self.model_dir).as_default():
            tf.summary.experimental.write_raw_pb(config.SerializeToString(), step=0)
            # `<job number> · <sweep folder>` or the run folder's name: short, and repeated sweeps stay apart.
            hparams_api.hparams(values, trial_id=hparams_record.trial_id(self.model_dir, job))
