"""`python -m tf_harness.compare RUN_A RUN_B [--split test]`: is run B better than run A on the same examples?

Reads each run's predictions of the split (mode=predict: `python run.py hydra.run.dir=<run> mode=predict
split=test`; predictions.csv, or predictions_<split>.csv for the split predict does not take by default) and
scores both on the examples they share, which must be the same: the same dataset, split and examples, or it
refuses in one line, exit 2. An example is matched by what it is in its dataset (its image paths below the folder
that holds them all, its fold, unit and labels), in any order, so the same examples predicted under another root
(another machine's mount, another HARNESS_CACHE) compare. Rows without a score in either run (a damaged file) are
left out of both. For each metric of experiments/evaluation/metrics.py `scored` (a protocol's too, such as LFW's `eer`,
when every example was scored by both; none for a metric undefined in both, the header says why) it prints A,
B, B - A, the difference's interval and a two-sided p-value: from a paired bootstrap that resamples the
dataset's unit (its patients for chest X-rays; an example otherwise) for both runs at once
(experiments/evaluation/intervals.py), or, for a binary task's `auc`, from DeLong's test.
"""
import argparse
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from tf_harness.data import TASKS
from tf_harness.data.integrity import reading
from tf_harness.experiments.config.config_keys import MIN_RESAMPLES
from tf_harness.experiments.evaluation import intervals, metrics
from tf_harness.experiments.evaluator import predictions_file

SAVED = Path(".hydra") / "config.yaml"


class Refused(Exception):
    """The two runs cannot be compared: one line saying why."""


def _parser():
    parser = argparse.ArgumentParser(prog="python -m tf_harness.compare", description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path, help="the run compared against (A)")
    parser.add_argument("run_b", type=Path, help="the run compared (B)")
    parser.add_argument("--split", choices=("validation", "test"), default="test",
                        help="the split both runs' predictions.csv hold (default test)")
    parser.add_argument("--resamples", type=int, default=1000,
                        help=f"bootstrap resamples, at least {MIN_RESAMPLES} (default 1000)")
    parser.add_argument("--seed", type=int, default=42, help="the bootstrap's seed (default 42)")
    return parser


def read_run(run_dir: Path, split: str):
    """(dataset name, predictions) of a run directory's predictions of `split` (experiments/evaluator.py
    `predictions_file`: predictions.csv, or predictions_<split>.csv)."""
    saved = run_dir / SAVED
    try:
        dataset = OmegaConf.create(reading.read_text(saved)).dataset.name
    except Exception as error:  # noqa: BLE001  any unreadable or foreign file is one line
        raise Refused(f"{saved} cannot be read ({_why(error)}); is {run_dir} a run directory?") from None
    entry = TASKS.entries.get(dataset)
    if split == "test" and entry is not None and entry.test is None:
        raise Refused(f"{run_dir} is of dataset={dataset}, which has no test split; compare its validation "
                      f"predictions with --split validation")
    path = run_dir / predictions_file(split, entry is not None and entry.test is not None)
    write = f"write it again with `python run.py hydra.run.dir={run_dir} mode=predict split={split}`"
    try:
        predictions = reading.read_csv(path)
    except reading.DamagedTableError as error:
        raise Refused(f"{error}; {write}") from None
    except OSError as error:
        raise Refused(f"{path} cannot be read ({_why(error)}); {write}") from None
    held = sorted(set(predictions["split"])) if "split" in predictions else ["unknown (an older predictions.csv)"]
    if held != [split]:
        raise Refused(f"{path} holds the {'|'.join(held)} split, not {split}; write it with `python run.py "
                      f"hydra.run.dir={run_dir} mode=predict split={split}`")
    return dataset, predictions


def _why(error) -> str:
    """What kept a file from being read, in a few words: the OS's (`is a named pipe, not a regular file`, `Is a
    directory`) or the error's name."""
    return getattr(error, "strerror", None) or type(error).__name__


def _columns(predictions, class_names):
    """The label columns: `label/<class>` per class, or `label`."""
    labelled = [f"label/{name}" for name in class_names]
    return labelled if set(labelled) <= set(predictions) else ["label"]


def paired_examples(run_a, run_b, split):
    """Both runs' predictions on the same examples: (dataset, class names, labels, scores A, scores B, units)."""
    dataset_a, a = read_run(run_a, split)
    dataset_b, b = read_run(run_b, split)
    if dataset_a != dataset_b:
        raise Refused(f"{run_a} is of dataset={dataset_a} and {run_b} of dataset={dataset_b}; compare runs of one")
    entry = TASKS.entries[dataset_a]
    described = [column for column in a if column.startswith("path")] + \
        [column for column in ("fold", entry.unit) if column in a]
    class_names = [column for column in a if column not in described and not column.startswith("label")
                   and column not in ("global_step", "split")]
    labels = _columns(a, class_names)
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        raise Refused(f"{run_a} and {run_b} hold different examples ({len(a)} and {len(b)} rows of "
                      f"{split}); another example list?")
    key_a, key_b = (_identities(table, described, labels) for table in (a, b))
    rows_b = pd.Series(np.arange(len(b)), index=key_b)
    missing = ~key_a.isin(rows_b.index)
    if missing.any():
        row = int(np.flatnonzero(missing)[0])
        raise Refused(f"{run_a} and {run_b} hold different examples: {a.loc[row, described[0]]} (row {row + 2} of "
                      f"{predictions_file(split, entry.test is not None)} in {run_a}) has no match in {run_b}; "
                      f"another example list?")
    b = b.iloc[rows_b[key_a].to_numpy()].reset_index(drop=True)  # B's rows in A's order
    scored = a[class_names].notna().all(axis=1) & b[class_names].notna().all(axis=1)
    if not scored.any():
        raise Refused(f"{run_a} and {run_b} share no example that both runs scored")
    a, b = a[scored], b[scored]
    units = a[entry.unit].to_numpy() if entry.unit in a else np.arange(len(a))
    folds = metrics.folds_of(dataset_a, a) if scored.all() else None  # a protocol takes the whole split
    return (dataset_a, entry, class_names, a[labels].to_numpy(), a[class_names].to_numpy(), b[class_names].to_numpy(),
            units, int((~scored).sum()), folds)


def _identities(table, described, labels) -> pd.Index:
    """Each row's identity as an example of its dataset, whatever root the run read it under: its image paths
    relative to the deepest folder that holds every image of the table, its fold and unit, its labels, and its
    occurrence among equal rows."""
    paths = [column for column in described if column.startswith("path")]
    folders = [os.path.dirname(str(path)) for column in paths for path in table[column]]
    root = os.path.commonpath(folders) if folders else ""
    parts = [table[column].astype(str).map(lambda path: os.path.relpath(path, root)) for column in paths]
    parts += [table[column].astype(str) for column in described if column not in paths]
    parts += [table[column].astype(str) for column in labels]
    joined = pd.concat(parts, axis=1).agg("\x1f".join, axis=1)
    return pd.Index(joined + "\x1f" + joined.groupby(joined).cumcount().astype(str))


def compare(run_a, run_b, split="test", resamples=1000, seed=42):
    """(what was compared, one row per metric: {metric, a, b, difference, interval, p, test})."""
    dataset, entry, class_names, labels, scores_a, scores_b, units, left_out, folds = paired_examples(run_a, run_b,
                                                                                                    split)
    task = entry.task
    if task != "multilabel":
        labels = labels.reshape(-1)
    value_a = metrics.scored(task, class_names, labels, scores_a, folds)
    value_b = metrics.scored(task, class_names, labels, scores_b, folds)
    bootstrapped = intervals.paired(task, class_names, labels, scores_a, scores_b, units, resamples, seed, folds)
    undefined = [name for name in value_a if np.isnan(value_a[name]) and np.isnan(value_b[name])]
    notes = folds.notes(labels) if folds is not None else {}
    rows = []
    for name in (name for name in value_a if name not in undefined):
        interval, p = bootstrapped[name]
        test = f"paired bootstrap, {resamples} resamples"
        if task == "binary" and name == "auc":
            _, interval, p = intervals.delong(labels, scores_a, scores_b)
            test = "DeLong"
        rows.append({"metric": name, "a": float(value_a[name]), "b": float(value_b[name]),
                     "difference": float(value_b[name] - value_a[name]), "interval": interval, "p": p,
                     "test": test})
    unit = entry.unit or "example"
    units_text = f" ({len(np.unique(units))} {unit}s)" if entry.unit else ""
    header = (f"dataset={dataset} split={split}: {len(units)} examples{units_text} scored by both runs"
              f"{f', {left_out} without a score left out' if left_out else ''}; A={run_a}, B={run_b}; the paired "
              f"bootstrap resamples {unit}s (seed {seed})")
    if undefined:
        header += "; no row for " + "; ".join(
            f"{name} ({notes.get(f'{name}/null_because', 'undefined on these examples in both runs')})"
            for name in undefined)
    return header, rows


def _text(rows, header) -> str:
    width = max(len(row["metric"]) for row in rows)
    lines = [header, f"{'metric':<{width}}  {'A':>7}  {'B':>7}  {'B - A':>8}  {'95% interval':>19}  {'p':>7}  test"]
    for row in rows:
        interval = row["interval"]
        shown = f"[{interval[0]:+.4f}, {interval[1]:+.4f}]" if interval else "undefined"
        lines.append(f"{row['metric']:<{width}}  {row['a']:7.4f}  {row['b']:7.4f}  {row['difference']:+8.4f}  "
                     f"{shown:>19}  {row['p']:7.4f}  {row['test']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.resamples < MIN_RESAMPLES:
        print(f"compare: --resamples={args.resamples} is below {MIN_RESAMPLES}, the fewest that leave a resample "
              f"beyond each bound of a 95% interval; use {MIN_RESAMPLES} or more (default 1000)", file=sys.stderr)
        return 2
    try:
        header, rows = compare(args.run_a, args.run_b, args.split, args.resamples, args.seed)
    except Refused as refused:
        print(f"compare: {refused}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C mid-bootstrap; SIGTERM's default action ends it with 143
        print("compare: interrupted by SIGINT; nothing was written", file=sys.stderr)
        return 130
    print(_text(rows, header))
    return 0
