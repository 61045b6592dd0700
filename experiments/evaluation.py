"""The Estimator's evaluation and prediction passes over a split: its logits in table order, the metrics and
summaries of an evaluation (metrics.json), and predictions.csv.

`Evaluation` is the part of experiments/runner.py's Estimator that reads a split once, without training: the
runner's loop calls `evaluate` on its interval, mode=evaluate and the sidecar evaluator (experiments/sidecar.py)
call it on a restored checkpoint, and mode=predict calls `predict`.
"""
import logging

import numpy as np
import pandas as pd
from tqdm import tqdm

from tf_harness.data.evaluation_sample import EXAMPLES_PER_STEP
from tf_harness.data.tables import path_columns
from tf_harness.data.task import Task
from tf_harness.experiments import metrics
from tf_harness.experiments.run_dir import interrupts
from tf_harness.experiments.progress import logs_above_the_bar
from tf_harness.experiments.summaries import write_metrics

log = logging.getLogger(__name__)


class Evaluation:
    """Evaluation and prediction for the Estimator (experiments/runner.py), which holds the config, task, trainer,
    tables, summaries and run directory these methods read, and `eval_rows`, the validation rows that
    trainer.eval_steps samples (data/evaluation_sample.py; None: every row)."""

    def _outputs(self, data, rows):
        """Logits of the `rows` examples `data` holds (a split, or a partial evaluation's sample of it), in table
        order and padding removed; the summed loss; and which of those rows count (weight > 0: a damaged file
        that was not checked up front has 0)."""
        logits, weights, total_loss = [], [], 0.0
        iterator = iter(data)
        batches = -(-rows // self.cfg.pipeline.batch_size)  # the last one padded
        with tqdm(total=batches, desc="evaluate", unit="batch", leave=False, dynamic_ncols=True) as progress:
            while True:
                # A signal waits for the batch's end, so it never lands inside TensorFlow's own Python code.
                with interrupts.deferred():
                    batch = next(iterator, None)
                    if batch is None:
                        break
                    features, labels, batch_weights = batch
                    loss, batch_logits = self.trainer.eval_step(features, labels, batch_weights)
                    total_loss += float(loss)
                    logits.append(batch_logits.numpy())
                    weights.append(batch_weights.numpy())
                    progress.update()
        seen = min(rows, len(logits) * self.cfg.pipeline.batch_size)  # padding only ever ends the last batch
        return np.concatenate(logits)[:seen], total_loss, np.concatenate(weights)[:seen] > 0

    @logs_above_the_bar
    def evaluate(self, restore=False):
        """Evaluates on the validation split and writes metrics.json; a fresh iterator each time."""
        if restore:
            self._restore_model()
        step = self.trainer.step
        table = self.tables[self.eval_split]
        scored = table if self.eval_rows is None else table.iloc[self.eval_rows]  # trainer.eval_steps' sample
        logits, total_loss, counted = self._outputs(self.eval_data, len(scored))
        logits, count = logits[counted], int(counted.sum())
        labels = np.asarray(scored.label.tolist()[:len(counted)])[counted]
        values = {"loss": total_loss / max(count, 1),
                  **metrics.evaluate(self.spec.task, self.spec.class_names, labels, logits)}
        if count == len(table):  # a protocol's metrics (LFW's folds) are defined on the whole split only
            values.update(self.task.protocol_metrics(table, metrics.probabilities(self.spec.task, logits)))
        self._note_unreadable()  # skipped.csv lists the rows this evaluation could not count
        with interrupts.deferred():  # the summary and metrics.json both, or neither: resume redoes it then
            self.summaries.scalars("validation", values, step)
            self.summaries.evaluation(self.spec, labels, metrics.probabilities(self.spec.task, logits), step)
            if self.chief:
                write_metrics(self.model_dir, {**values, "global_step": step, "examples": count,
                                               "split_examples": len(table)})
        self.last_values = values
        if self.cfg.trainer.eval_steps is not None:
            log.info("Evaluated %d of %d %s examples (%s)", count, len(table), self.eval_split, self._sample_note())
        headline = metrics.headline(self.spec.task)
        log.info("Evaluation at global step %d on %d examples: loss %.4f, %s %.4f", step, count, values["loss"],
                 headline, values.get(headline, float("nan")))
        return values

    def _sample_note(self) -> str:
        """What trainer.eval_steps made of this evaluation, for its count line."""
        steps = self.cfg.trainer.eval_steps
        if self.eval_rows is None:
            return f"trainer.eval_steps={steps} asks for {steps} x {EXAMPLES_PER_STEP}: the whole split"
        note = (f"trainer.eval_steps={steps}: {steps} x {EXAMPLES_PER_STEP}, a sample stratified by class, drawn with "
                f"seed={self.pipeline.seed}, the same at every evaluation and pipeline.batch_size")
        if type(self.task).protocol_metrics is not Task.protocol_metrics:  # the dataset has a protocol of its own
            note += f"; the protocol metrics of {self.spec.name} are defined on the whole split and left out"
        return note

    def predict(self):
        """Writes predictions.csv, one row per example: the image path(s), a probability per class, the true
        label(s) where the split has them (`label`, or `label/<class>` per class for multi-label), and the
        checkpoint's `global_step`."""
        self._restore_model()
        split = "test" if "test" in self.tables else self.eval_split
        table = self.tables[split]
        # Every worker takes part: the steps are collective.
        logits, _, counted = self._outputs(self._input_fn(split, training=False), len(table))
        self._note_unreadable()
        if not self.chief:
            return
        scores = metrics.probabilities(self.spec.task, logits).reshape(len(table), -1)
        scores[~counted] = np.nan  # damaged files that were not checked up front have no prediction
        columns = [table[path_columns(table)].reset_index(drop=True),
                   pd.DataFrame(scores, columns=list(self.spec.class_names))]
        if "label" in table:
            columns.append(label_columns(table.label.tolist(), self.spec.class_names))
        predictions = pd.concat(columns, axis=1)
        predictions["global_step"] = self.trainer.step
        predictions.to_csv(self.model_dir / "predictions.csv", index=False)
        log.info("Wrote %d predictions for the %s split at global step %d to %s", len(predictions), split,
                 self.trainer.step, self.model_dir / "predictions.csv")


def label_columns(labels, class_names):
    """The true labels as columns: `label/<class>` per class for a multi-label vector, else one `label`."""
    if labels and np.ndim(labels[0]) > 0:
        return pd.DataFrame(np.asarray(labels), columns=[f"label/{name}" for name in class_names])
    return pd.DataFrame({"label": labels})
