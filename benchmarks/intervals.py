"""Bootstrap intervals: their cost at each dataset's test-split size, and against a test evaluation.

Two tables. The first times experiments/evaluation/intervals.py `intervals` (evaluation.bootstrap resamples, vectorised)
on synthetic scores of each dataset's test-split shape: examples, classes and units, and for a dataset with a
protocol its ten folds (LFW's `eer` and `tar_at_far_*` per fold). The second times
`mode=evaluate split=test` end to end on a small trained run of the embedded LFW sample, in alternating
rounds with evaluation.bootstrap=0 and with the resamples asked for, and reads from its log line how long the
intervals took: their share of the evaluation.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import measure, record

NAME = "intervals"
PROJECT = Path(__file__).resolve().parent.parent
# (dataset, task, examples, classes, units): the real test splits' shapes, the units a bootstrap draws.
SHAPES = (("chest_xray", "multilabel", 25596, 14, 2800),  # test_list.txt's images, about 9 per patient
          ("lfw_pairs", "binary", 6000, 1, 6000),  # View 2: ten folds of 600 pairs
          ("imagenet_det", "multiclass", 20000, 201, 20000))  # the size of Data/DET/val
_SECONDS = re.compile(r"resamples of \w+s, ([0-9.]+) s\)")


def time_intervals(dataset, task, examples, classes, units, resamples, rounds):
    import pandas as pd

    from tf_harness.experiments.evaluation import intervals, metrics

    rng = np.random.default_rng(0)
    if task == "multilabel":
        labels, scores = (rng.random((examples, classes)) < 0.1).astype(int), rng.random((examples, classes))
    elif task == "binary":
        labels, scores = rng.integers(0, 2, examples), rng.random(examples)
    else:
        labels, scores = rng.integers(0, classes, examples), rng.dirichlet(np.ones(classes), examples)
    names = [f"c{k}" for k in range(classes)]
    drawn = rng.integers(0, units, examples)
    folds = metrics.folds_of(dataset, pd.DataFrame({"fold": np.arange(examples) * 10 // examples}))
    seconds = []
    for _ in range(rounds):
        began = time.perf_counter()
        intervals.intervals(task, names, labels, scores, drawn, resamples, seed=0, folds=folds)
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def _run(*args):
    began = time.perf_counter()
    result = subprocess.run([sys.executable, "run.py", *args], cwd=PROJECT, capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=900)
    if result.returncode:
        raise RuntimeError(f"run.py {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}")
    return time.perf_counter() - began, result.stdout


def time_evaluations(resamples, rounds):
    """(median evaluate seconds without intervals, with them, median interval seconds from the log)."""
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        _run("dataset=lfw_pairs", "experiment=smoke", f"hydra.run.dir={run_dir}")
        without, with_, inside = [], [], []
        for _ in range(rounds):
            without.append(_run(f"hydra.run.dir={run_dir}", "mode=evaluate", "split=test",
                                "evaluation.bootstrap=0")[0])
            seconds, stdout = _run(f"hydra.run.dir={run_dir}", "mode=evaluate", "split=test",
                                   f"evaluation.bootstrap={resamples}")
            with_.append(seconds)
            inside.append(float(_SECONDS.search(stdout).group(1)))
    return statistics.median(without), statistics.median(with_), statistics.median(inside)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME}", description=__doc__,
                                     formatter_class=measure.Help)
    parser.add_argument("--resamples", type=int, default=1000, help="evaluation.bootstrap")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median is reported")
    parser.add_argument("--no-run", action="store_true", help="skip the end-to-end table")
    args = parser.parse_args(argv)
    with record.recorded(NAME, argv, devices=False):
        print(f"\n{args.resamples} resamples, median of {args.rounds} rounds, {measure.CORES} cores\n")
        print("| dataset | task | examples | classes | units | interval seconds |")
        print("|---|---|---|---|---|---|")
        for dataset, task, examples, classes, units in SHAPES:
            seconds = time_intervals(dataset, task, examples, classes, units, args.resamples, args.rounds)
            print(f"| {dataset} | {task} | {examples} | {classes} | {units} | {seconds:.2f} |")
        if not args.no_run:
            without, with_, inside = time_evaluations(args.resamples, args.rounds)
            print("\nmode=evaluate split=test on the LFW sample's View 2 (600 pairs), after 4 smoke steps\n")
            print("| evaluation.bootstrap | process seconds | interval seconds (log) | interval share |")
            print("|---|---|---|---|")
            print(f"| 0 | {without:.2f} | 0 | 0 |")
            print(f"| {args.resamples} | {with_:.2f} | {inside:.2f} | {inside / with_:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
