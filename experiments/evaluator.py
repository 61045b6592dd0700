"""Evaluation and prediction passes over a split: its logits in table order, an evaluation's metrics and
summaries (metrics.json, and every evaluation in metrics.jsonl: experiments/evaluation/metrics_history.py), and
predictions.csv.

Each role's main evaluates through one `Evaluator` (experiments/assembly.py `make_evaluator`): training on its interval
(experiments/runner.py), mode=evaluate and predict (experiments/checkpoint_modes.py), the sidecar evaluator
(experiments/sidecar.py). metrics.json is the training run's last evaluation, which a resumed run reads: an
evaluation of the test split, or mode=evaluate of a checkpoint older than the one metrics.json holds, is written
beside it (`BESIDE`) and never replaces it; each such record is appended to that file's history too
(`metrics_test.jsonl`), so a test evaluation of another checkpoint keeps the earlier one's.
"""
import logging
import time

import numpy as np
import pandas as pd
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from tf_harness.data.evaluation_sample import EXAMPLES_PER_STEP, sample_rows
from tf_harness.data.integrity.writing import replacing
from tf_harness.data.iterators import make_iterator
from tf_harness.data.tables import path_columns
from tf_harness.experiments.evaluation import heatmaps, intervals, metrics, metrics_history
from tf_harness.experiments.evaluation.metrics_history import evaluated_record, write_metrics
from tf_harness.experiments.run_dir import blocking, interrupts

log = logging.getLogger(__name__)

# Where mode=evaluate writes an evaluation that must not replace metrics.json, by split.
BESIDE = {"test": "metrics_test.json", "validation": "metrics_validation.json"}
PREDICTIONS = "predictions.csv"
# What a training run adds to its last evaluation's record (experiments/training/recipes.py): an evaluation of the same
# step by mode=evaluate keeps them.
KEPT = ("stopped_early", "best_global_step", "best_value")


def predicted_split(has_test) -> str:
    """The split mode=predict takes by default: the test split where the dataset has one, else validation."""
    return "test" if has_test else "validation"


def predictions_file(split, has_test) -> str:
    """Where mode=predict keeps a split's predictions: predictions.csv for the split it takes by default
    (`predicted_split`), predictions_<split>.csv for the other, so that neither replaces the other."""
    return PREDICTIONS if split == predicted_split(has_test) else f"predictions_{split}.csv"


class Evaluator:
    """Reads a split once, without training, through the trainer's eval step.

    `input_fn(split, rows)` builds a split's evaluation pipeline; the validation one is built at the first
    evaluation, so a run that never evaluates never builds it. `note_unreadable()` lists in skipped.csv the
    files a pass found unreadable. `write` is false on every process but the one that writes the run's files.
    `beside`: this is the sidecar evaluator, which never replaces a metrics.json of a later global step (the
    trainer's own evaluation, say): metrics.json holds the newest evaluation of the run. `chosen`: the
    `checkpoint=` of mode=evaluate, which never replaces a metrics.json of a later global step either, nor drops
    what the training run added to the one of its own step (`KEPT`). `bootstrap` resamples of `unit` (a table
    column; None: each example), seeded with `seed`, give each metric's interval (experiments/evaluation/intervals.py),
    in every evaluation's record: metrics.json, metrics.jsonl and metrics_test.json.
    """

    def __init__(self, task, trainer, tables, summaries, model_dir, *, batch_size, eval_steps, seed, input_fn,
                 note_unreadable, write=True, beside=False, chosen=None, bootstrap=0, unit=None):
        self.task, self.spec, self.trainer, self.tables = task, task.SPEC, trainer, tables
        self.summaries, self.model_dir, self.write, self.beside = summaries, model_dir, write, beside
        self.batch_size, self.eval_steps, self.seed = batch_size, eval_steps, seed
        self.input_fn, self.note_unreadable = input_fn, note_unreadable
        self.chosen, self.bootstrap, self.unit = chosen, bootstrap, unit
        self.split = "validation"
        # trainer.eval_steps: the same seeded, stratified rows at every evaluation (None: the whole split).
        self.rows = sample_rows(tables[self.split], eval_steps, seed)
        self._data = None
        self.last_values = {}  # the last evaluation's metrics
        self._logged = (None, {})  # `logged`
        self._shown = None  # experiments/evaluation/heatmaps.py's ValidationHeatmaps, made at the first evaluation

    def logged(self, step, means):
        """The train scalars logged at global `step` (experiments/training/actions.py `Log`): an evaluation at that step
        writes them beside its own in metrics.jsonl, as `train/<name>`."""
        self._logged = (step, {f"train/{name}": value for name, value in means.items()})

    def _heatmaps(self):
        if self._shown is None:
            self._shown = heatmaps.ValidationHeatmaps(self.task, self.trainer, self.tables[self.split])
        return self._shown

    def _outputs(self, data, rows):
        """Logits of the `rows` examples `data` holds (a split, or a partial evaluation's sample of it), in table
        order and padding removed; the summed loss; and which of those rows count (weight > 0: a damaged file
        that was not checked up front has 0)."""
        logits, weights, total_loss = [], [], 0.0
        iterator = make_iterator(data)
        batches = -(-rows // self.batch_size)  # the last one padded
        longest = 0.0  # the longest wait for a batch yet, in seconds
        with tqdm(total=batches, desc="evaluate", unit="batch", leave=False, dynamic_ncols=True) as progress:
            while True:
                # A signal waits for the batch's end, so it never lands inside TensorFlow's own Python code. The batch
                # is awaited in Python (experiments/run_dir/blocking.py): input that never comes (an image file that is
                # a named pipe, say) is logged while it is awaited, and a signal still ends the run.
                with interrupts.deferred():
                    began = time.monotonic()
                    what = f"evaluation input batch {len(logits) + 1} of {batches}"
                    batch = blocking.call(next, iterator, None, what=what, expected=longest)
                    longest = max(longest, time.monotonic() - began)
                    if batch is None:
                        break
                    features, labels, batch_weights = batch
                    loss, batch_logits = self.trainer.eval_step(features, labels, batch_weights)
                    total_loss += float(loss)
                    logits.append(batch_logits.numpy())
                    weights.append(batch_weights.numpy())
                    progress.update()
        seen = min(rows, len(logits) * self.batch_size)  # padding only ever ends the last batch
        return np.concatenate(logits)[:seen], total_loss, np.concatenate(weights)[:seen] > 0

    def evaluate(self, split="validation") -> dict:
        """Evaluates the trainer's weights (their moving average with trainer.ema_decay: the trainer's `averaged`)
        on the validation split and writes metrics.json, or on the test split (`split`) and writes
        metrics_test.json; a fresh iterator each time."""
        with logging_redirect_tqdm(), self.trainer.averaged():
            return self._evaluate() if split == self.split else self._evaluate_whole(split)

    def _evaluate(self) -> dict:
        if self._data is None:
            self._data = self.input_fn(self.split, rows=self.rows)
        step = self.trainer.step
        table = self.tables[self.split]
        scored = table if self.rows is None else table.iloc[self.rows]  # trainer.eval_steps' sample
        logits, total_loss, counted = self._outputs(self._data, len(scored))
        logits, count = logits[counted], int(counted.sum())
        labels = np.asarray(scored.label.tolist()[:len(counted)])[counted]
        scores = metrics.probabilities(self.spec.task, logits)
        folds = self._folds(table, count)
        values = {"loss": total_loss / max(count, 1),
                  **metrics.scored(self.spec.task, self.spec.class_names, labels, scores, folds),
                  **self._protocol(table, labels, scores, folds)}
        # Only the process that writes the record resamples: the intervals go nowhere else.
        bounds, how = self._intervals(labels, scores, scored.iloc[:len(counted)][counted], folds) if self.write \
            else ({}, {})
        bounds = {**bounds, **(folds.notes(labels) if folds else {})}
        self.note_unreadable()  # skipped.csv lists the rows this evaluation could not count
        with interrupts.deferred():  # the summary and metrics.json both, or neither: resume redoes it then
            self.summaries.scalars("validation", values, step)
            self.summaries.evaluation(self.spec, labels, scores, step)
            self.summaries.heatmaps(self._heatmaps().overlays, step)  # a few validation images' heatmaps
            record = {**values, **bounds, "global_step": step, "examples": count, "split_examples": len(table),
                      "bootstrap": how}
            held = evaluated_record(self.model_dir) if self.write and (self.beside or self.chosen) else None
            later = held["global_step"] if held else None
            if self.chosen and later is not None and later > step:  # mode=evaluate of an older checkpoint
                self._write_beside({**record, "checkpoint": self.chosen}, self.split)
                log.info("metrics.json holds the training run's evaluation of global step %d and is left as it is; "
                         "this one, of checkpoint=%s, is in %s", later, self.chosen, BESIDE[self.split])
            elif self.write:  # metrics.jsonl before metrics.json: a kill between the two redoes the evaluation
                logged_at, trained = self._logged
                metrics_history.append(self.model_dir, {**record, **(trained if logged_at == step else {})})
                if later is not None and later > step:
                    log.info("metrics.json holds the evaluation of a later global step (%d) and is left as it is; "
                             "this one is in validation/, metrics.jsonl and this log", later)
                else:
                    kept = {key: held[key] for key in KEPT if key in held} if self.chosen and later == step else {}
                    write_metrics(self.model_dir, {**record, **kept})
        self.last_values = values
        if self.eval_steps is not None:
            log.info("Evaluated %d of %d %s examples (%s)", count, len(table), self.split, self._sample_note())
        headline = metrics.headline(self.spec.task)
        log.info("Evaluation at global step %d on %d examples: loss %.4f, %s %.4f", step, count, values["loss"],
                 headline, values.get(headline, float("nan")))
        return values

    def _evaluate_whole(self, split) -> dict:
        """Evaluates the whole of `split` and writes its record, with each metric's interval, to `BESIDE[split]`;
        metrics.json, metrics.jsonl and the summaries are left as they are."""
        step, table = self.trainer.step, self.tables[split]
        logits, total_loss, counted = self._outputs(self.input_fn(split), len(table))
        scores = metrics.probabilities(self.spec.task, logits)
        count, scored = int(counted.sum()), table[counted]
        labels = np.asarray(scored.label.tolist())
        folds = self._folds(table, count)
        values = {"loss": total_loss / max(count, 1),
                  **metrics.scored(self.spec.task, self.spec.class_names, labels, scores[counted], folds),
                  **self._protocol(table, labels, scores, folds)}
        notes = folds.notes(labels) if folds else {}
        began = time.monotonic()
        bounds, how = self._intervals(labels, scores[counted], scored, folds)
        values.update(bounds)
        self.note_unreadable()
        seen = self.task.seen_in_training(self.tables, split)  # a test number to report has seen none of them
        record = {**values, **notes, "global_step": step, "examples": count, "split_examples": len(table),
                  "split": split, "checkpoint": self.chosen, "bootstrap": how,
                  **({"seen_in_training": seen} if seen is not None else {})}
        if self.write:
            self._write_beside(record, split)
        if seen and seen["seen"]:
            log.warning("%d of the %d %ss of the %s split were in the training split too (%s: seen_in_training)",
                        seen["seen"], seen["of"], seen["unit"], split, BESIDE[split])
        self.last_values = values
        headline = metrics.headline(self.spec.task)
        interval = values.get(f"{headline}/ci95")
        log.info("Evaluation of the %s split at global step %d on %d examples: loss %.4f, %s %.4f%s; written to %s",
                 split, step, count, values["loss"], headline, values.get(headline, float("nan")),
                 f" (95% interval {interval[0]:.4f}..{interval[1]:.4f}, {self.bootstrap} resamples of "
                 f"{how['over']}, {time.monotonic() - began:.1f} s)" if interval else "",
                 self.model_dir / BESIDE[split])
        return values

    def _folds(self, table, count):
        """The split's folds and its dataset's protocol metrics (experiments/evaluation/metrics.py `Folds`), or None:
        unless all `count` examples of `table` were scored, as a protocol (LFW's folds) is defined on the whole
        split."""
        return metrics.folds_of(self.spec.name, table) if count == len(table) else None

    def _protocol(self, table, labels, scores, folds) -> dict:
        """What the dataset's protocol reports beside its metrics' means over `folds`: their spread over the
        folds, and the Task's own protocol numbers (LFW's ten-fold accuracy); none without `folds`."""
        if folds is None:
            return {}
        return {**folds.spread(labels, scores), **self.task.protocol_metrics(table, scores)}

    def _write_beside(self, record, split):
        """Writes `record` to `BESIDE[split]` (the last such evaluation) after appending it to that file's history,
        `<name>.jsonl`, so that an evaluation of another checkpoint never takes an earlier one's place silently."""
        history = f"{BESIDE[split].removesuffix('.json')}.jsonl"
        metrics_history.append(self.model_dir, record, name=history)
        write_metrics(self.model_dir, record, BESIDE[split])

    def _intervals(self, labels, scores, scored, folds):
        """Each metric's `<metric>/ci95` over the `scored` rows (their `labels` and `scores`), and the record's
        `bootstrap` entry saying how they were drawn: resamples, `unit` (the table column, or `example`), what
        that is in words (`over`: patients, pairs, images) and the seed."""
        units = scored[self.unit].to_numpy() if self.unit else np.arange(len(scored))
        bounds = intervals.intervals(self.spec.task, self.spec.class_names, labels, scores, units, self.bootstrap,
                                     self.seed, folds)
        over = f"{self.unit.removesuffix('_id')}s" if self.unit else "pairs" if self.spec.paired else "images"
        return bounds, {"resamples": self.bootstrap, "unit": self.unit or "example", "over": over, "seed": self.seed}

    def _sample_note(self) -> str:
        """What trainer.eval_steps made of this evaluation, for its count line."""
        steps = self.eval_steps
        if self.rows is None:
            return f"trainer.eval_steps={steps} asks for {steps} x {EXAMPLES_PER_STEP}: the whole split"
        note = (f"trainer.eval_steps={steps}: {steps} x {EXAMPLES_PER_STEP}, a sample stratified by class, drawn with "
                f"seed={self.seed}, the same at every evaluation and pipeline.batch_size")
        if metrics.protocol_names(self.spec.name):
            note += f"; the protocol metrics of {self.spec.name} are defined on the whole split and left out"
        return note

    def predict(self, split=None):
        """Writes predictions.csv (`predictions_file`), one row per example of `split` (None: the test split where
        there is one, else validation; with trainer.ema_decay, from the averaged weights): the image path(s), LFW's
        `fold` and the bootstrap's unit column where the table has them, a probability per class, the true label(s)
        where the split has them (`label`, or `label/<class>` per class for multi-label), the checkpoint's
        `global_step` and the `split`. Returns its table (None on a process that does not write)."""
        split = split or predicted_split("test" in self.tables)
        table = self.tables[split]
        # Every worker takes part: the steps are collective.
        with logging_redirect_tqdm(), self.trainer.averaged():
            logits, _, counted = self._outputs(self.input_fn(split), len(table))
        self.note_unreadable()
        if not self.write:
            return None
        scores = metrics.probabilities(self.spec.task, logits).reshape(len(table), -1)
        scores[~counted] = np.nan  # damaged files that were not checked up front have no prediction
        described = [column for column in ("fold", self.unit) if column in table]
        columns = [table[path_columns(table) + described].reset_index(drop=True),
                   pd.DataFrame(scores, columns=list(self.spec.class_names))]
        if "label" in table:
            columns.append(label_columns(table.label.tolist(), self.spec.class_names))
        predictions = pd.concat(columns, axis=1)
        predictions["global_step"] = self.trainer.step
        predictions["split"] = split
        path = self.model_dir / predictions_file(split, "test" in self.tables)
        with replacing(path, newline="") as f:  # whole, or the earlier one
            predictions.to_csv(f, index=False)
        log.info("Wrote %d predictions for the %s split at global step %d to %s", len(predictions), split,
                 self.trainer.step, path)
        return predictions


def label_columns(labels, class_names):
    """The true labels as columns: `label/<class>` per class for a multi-label vector, else one `label`."""
    if labels and np.ndim(labels[0]) > 0:
        return pd.DataFrame(np.asarray(labels), columns=[f"label/{name}" for name in class_names])
    return pd.DataFrame({"label": labels})
