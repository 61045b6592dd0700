"""Fault trials: a run stopped at a random instant, then resumed, must end as if never stopped.

    python -m benchmarks faults [--datasets lfw_pairs,chest_xray,imagenet_det] [--trials 20]
                                [--faults SIGTERM,SIGINT,SIGKILL] [--seed 0] [--work DIR] [--recipes]

For each dataset a small deterministic run is made once without a fault (the reference), noting
when each line of its output came. Each trial starts the same run in a fresh run directory and
sends the fault's signal at a seeded random instant, drawn so that it follows the run's own pace
under any machine load: a random one of the reference's output lines (or the process start) is
chosen, and the signal goes a random share of the reference's gap to the next line after the trial
prints that line. With one line per step, evaluation and checkpoint, every phase is hit: start-up,
indexing, tracing, steps, saves, evaluations and the exit. It then re-runs the same command into
the directory until it exits 0 and checks:
- the exit status: 128 + the signal (130 SIGINT, 143 SIGTERM; -N when the signal came while Python
  had no handler installed, at start-up or during its exit; -9 for SIGKILL), or 0 when the run had
  finished first;
- the final checkpoint's tensors (weights, optimizer slots, random state, global step) equal the
  reference's bit for bit;
- the train and validation `loss` summaries, read with TensorBoard's EventAccumulator, equal the
  reference's: one per step, same value, so a step logged twice or never counts as a failure, and a
  missing validation step means an interrupted evaluation was not redone. A SIGKILL leaves the
  steps logged after its last checkpoint to be trained and logged again on resume (TensorBoard
  shows both events; TF2's writers leave it no mark to purge the orphans by), so there the last
  event of each step must equal the reference's.
- with --recipes, the runs train with a recipe set (RECIPES: the best checkpoint, early stopping, EMA weights
  and gradient accumulation together, docs/training-loop.md#training-recipes, and FIELD_RECIPES: the random
  resized crop, and mixup, cutmix and label smoothing or the balanced loss where the dataset takes them,
  docs/training-loop.md#recipes-of-the-field), evaluating every 3 steps so that
  they stop early at step 9, between two checkpoints; the final checkpoint's tensors then include the averages
  and the best evaluation's state, and best.json, the best checkpoint's tensors and metrics.json's
  `stopped_early` must equal the reference's too.
Prints k/n per dataset and fault, and the reason of each failed trial; it exits 1 when a trial failed.
With --trials 0 it makes the reference runs alone.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import measure, record

NAME = "faults"
ROOT = Path(__file__).resolve().parents[1]
FAULTS = ("SIGTERM", "SIGINT", "SIGKILL")
STEPS = 12
# Small deterministic runs, one per dataset; the models are narrowed so a trial takes seconds of training.
COMMON = ("deterministic=true", "pipeline.batch_size=4", f"trainer.train_steps={STEPS}", "trainer.log_every=1",
          "trainer.checkpoint_every=4", "trainer.eval_every=6", "trainer.eval_steps=2", "trainer.keep_checkpoints=2")
SMALL_ALEXNET = ("model.filters=[8,16,16,16,16]", "model.dense_units=32")  # dropout 0.5 kept
# The recipe set of --recipes: evaluations at 3 (the best: no later one beats it by 0.5), 6 and 9, where the run
# stops, after patience=2 evaluations without an improvement; checkpoints at 4 and 8, and 9 at the stop.
RECIPES = ("trainer.eval_every=3", "trainer.keep_best=true", "trainer.early_stopping.patience=2",
           "trainer.early_stopping.min_delta=0.5", "trainer.ema_decay=0.9", "trainer.accumulate_steps=2")
# And the field's recipes, each where it fits the dataset (experiments/config/schema.py FIELD_RECIPES): the random
# resized crop everywhere, mixup, cutmix and label smoothing on the single-label dataset, the balanced loss on the
# multi-label one.
CROP = "pipeline.random_resized_crop={scale:[0.25,1]}"
FIELD_RECIPES = {"lfw_pairs": (CROP,), "chest_xray": (CROP, "trainer.class_weights=balanced"),
                 "imagenet_det": (CROP, "pipeline.mixup_alpha=0.2", "pipeline.cutmix_alpha=1.0",
                                  "trainer.label_smoothing=0.1")}
DATASETS = {
    "lfw_pairs": ("dataset=lfw_pairs", "pipeline.image_size=32", "model.widths=[8,16]", "model.embedding_size=16",
                  "model.head_units=8"),
    "chest_xray": ("dataset=chest_xray", "model=semi_alexnet", "pipeline.image_size=64", *SMALL_ALEXNET),
    "imagenet_det": ("dataset=imagenet_det", "pipeline.image_size=64", *SMALL_ALEXNET),
}


def command(dataset, run_dir, extra=()):
    """The run's command line; `extra`: overrides added after the common ones (RECIPES)."""
    return [sys.executable, "run.py", *DATASETS[dataset], *COMMON, *extra, f"hydra.run.dir={run_dir}"]


def start(dataset, run_dir, extra=()):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(command(dataset, run_dir, extra), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def reference(dataset, work, extra=()):
    """Runs `dataset` once without a fault; returns (run dir, anchors): each anchor is (output lines so far,
    seconds since the start), from the process start to its exit. Lines that come together (the config's
    many lines) make one anchor, so no moment weighs more for its line count."""
    run_dir = work / dataset / "reference"
    started = time.perf_counter()
    process = start(dataset, run_dir, extra)
    lines, anchors = [], [(0, 0.0)]
    for line in process.stdout:
        lines.append(line)
        now = time.perf_counter() - started
        if now - anchors[-1][1] < 0.02:
            anchors[-1] = (len(lines), anchors[-1][1])
        else:
            anchors.append((len(lines), now))
    if process.wait() != 0:
        raise SystemExit(f"the {dataset} reference run failed:\n{''.join(lines[-30:])}")
    anchors.append((len(lines), time.perf_counter() - started))
    return run_dir, anchors


def instant(rng, anchors):
    """A random instant: (the number of output lines to wait for, then the seconds to wait after it)."""
    number = rng.randrange(len(anchors) - 1)
    (lines, at), (_, until) = anchors[number], anchors[number + 1]
    return lines, rng.uniform(0, until - at)


def interrupt(dataset, run_dir, fault, anchor, delay, extra=()):
    """Starts the run; once it has printed `anchor` lines, waits `delay` seconds and sends `fault` unless it has
    ended. Returns (exit status, output)."""
    process = start(dataset, run_dir, extra)
    output, reached = [], threading.Event()

    def read():
        for line in process.stdout:
            output.append(line)
            if len(output) >= anchor:
                reached.set()
        reached.set()  # the process ended first

    reader = threading.Thread(target=read, daemon=True)
    if anchor == 0:
        reached.set()
    reader.start()
    reached.wait(timeout=900)
    try:
        process.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        process.send_signal(getattr(signal, fault))
    status = process.wait(timeout=600)
    reader.join(timeout=10)
    return status, "".join(output)


def expected_statuses(fault):
    signum = getattr(signal, fault)
    return {0, -signum} if fault == "SIGKILL" else {0, 128 + signum, -signum}


def resume(dataset, run_dir, tries=2, extra=()):
    """Re-runs the command into `run_dir` until it exits 0; returns None or what went wrong."""
    for _ in range(tries):
        done = subprocess.run(command(dataset, run_dir, extra), cwd=ROOT, capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        if done.returncode == 0:
            return None
    return f"resume exited {done.returncode}: {done.stderr.strip().splitlines()[-1:] or done.stdout[-500:]}"


def final_tensors(run_dir, path=None):
    """(path, {name: value}) of the checkpoint at `path`, by default the run's latest."""
    import tensorflow as tf
    path = path or tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    reader = tf.train.load_checkpoint(path)
    # The input iterator is a variant tensor; the object graph's proto bytes need not repeat; save_counter
    # counts saves, which an interrupt adds (its own), not training state.
    skip = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    return path, {name: reader.get_tensor(name) for name, dtype in reader.get_variable_to_dtype_map().items()
                  if dtype != tf.variant and name not in skip}


def loss_events(logdir):
    """[(step, value)] of the `loss` summaries under `logdir`, in file order, every one kept."""
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator
    accumulator = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.TENSORS: 0},
                                                     purge_orphaned_data=False)
    accumulator.Reload()
    if "loss" not in accumulator.Tags()["tensors"]:
        return []
    return [(event.step, float(tf.make_ndarray(event.tensor_proto))) for event in accumulator.Tensors("loss")]


def recipe_records(run_dir):
    """What the recipes leave beside the checkpoints: best.json, and metrics.json's early-stopping keys."""
    def read(name):
        try:
            return json.loads((run_dir / name).read_text())
        except (OSError, ValueError):
            return None
    metrics = read("metrics.json") or {}
    return read("best.json"), {key: metrics.get(key) for key in ("global_step", "stopped_early", "best_global_step")}


def differences(expected_dir, run_dir, killed, recipes=False):
    """What differs between the reference's outcome and the run's: a list of short reasons."""
    import numpy as np
    problems = []
    if recipes:
        (want_best, want_stop), (best, stop) = recipe_records(expected_dir), recipe_records(run_dir)
        if best != want_best:
            problems.append(f"best.json {best}, not {want_best}")
        if stop != want_stop:
            problems.append(f"metrics.json {stop}, not {want_stop}")
        if want_best and best == want_best:
            _, expected_best = final_tensors(expected_dir, str(expected_dir / want_best["checkpoint"]))
            _, actual_best = final_tensors(run_dir, str(run_dir / best["checkpoint"]))
            if any(not np.array_equal(expected_best[name], actual_best.get(name)) for name in expected_best):
                problems.append(f"the tensors of {best['checkpoint']} differ")
    (expected_path, expected), (path, actual) = final_tensors(expected_dir), final_tensors(run_dir)
    if Path(path).name != Path(expected_path).name:
        problems.append(f"latest checkpoint {Path(path).name}, not {Path(expected_path).name}")
    differing = sorted(name for name in expected.keys() | actual.keys()
                       if name not in expected or name not in actual or not np.array_equal(expected[name], actual[name]))
    if differing:
        problems.append(f"{len(differing)} tensor(s) differ, e.g. {differing[0]}")
    for split in ("train", "validation"):
        want, got = loss_events(expected_dir / split), loss_events(run_dir / split)
        if killed:  # the steps logged after the last checkpoint are logged again: compare the last of each
            got = sorted(dict(got).items())
        if got != want:
            steps = [step for step, _ in got]
            repeated = sorted({step for step in steps if steps.count(step) > 1})
            missing = sorted({step for step, _ in want} - set(steps))
            problems.append(f"{split} loss events differ (repeated steps {repeated}, missing steps {missing})")
    return problems


def trial(dataset, fault, when, expected_dir, run_dir, extra=()):
    """One trial; returns (exit status, None or the reason it failed)."""
    status, output = interrupt(dataset, run_dir, fault, *when, extra=extra)
    if status not in expected_statuses(fault):
        return status, f"exit status {status}: {output.strip().splitlines()[-1:]}"
    if status != 0:
        problem = resume(dataset, run_dir, extra=extra)
        if problem:
            return status, problem
    problems = differences(expected_dir, run_dir, killed=fault == "SIGKILL", recipes=bool(extra))
    return status, "; ".join(problems) or None


def run_trials(datasets, faults, trials, seed=0, work=None, log=print, recipes=False, extra=()):
    """Runs `trials` trials per dataset and fault, round-robin (so a run cut short still covers each), with the
    recipe sets RECIPES and FIELD_RECIPES when `recipes`, and the overrides `extra` (a strategy, say) in every run;
    returns {(dataset, fault): (passed, run, failures, exit statuses)}."""
    rng = random.Random(seed)
    work = Path(work or tempfile.mkdtemp(prefix="faults-"))
    extras = {dataset: (*extra, *((*RECIPES, *FIELD_RECIPES[dataset]) if recipes else ())) for dataset in datasets}
    references = {}
    for dataset in datasets:
        references[dataset] = reference(dataset, work, extras[dataset])
        log(f"{dataset}: reference run {references[dataset][1][-1][1]:.1f} s, "
            f"{len(references[dataset][1]) - 1} instants to draw from")
    counts = {(dataset, fault): (0, 0, [], []) for dataset in datasets for fault in faults}
    for number in range(trials):
        for dataset in datasets:
            expected_dir, anchors = references[dataset]
            for fault in faults:
                when = instant(rng, anchors)
                run_dir = work / dataset / f"{fault}-{number}"
                status, problem = trial(dataset, fault, when, expected_dir, run_dir, extras[dataset])
                where = f"{when[1]:.2f} s after line {when[0]}"
                log(f"{dataset} {fault} #{number} {where}: exit {status}, {problem or 'ok'}")
                passed, run, failures, statuses = counts[dataset, fault]
                statuses.append(status)
                if problem:
                    failures.append(f"{dataset} {fault} #{number} {where}: {problem}")
                else:
                    shutil.rmtree(run_dir, ignore_errors=True)
                counts[dataset, fault] = (passed + (problem is None), run + 1, failures, statuses)
    return counts


def report(counts, log=print):
    log("\n| dataset | fault | resumed exactly | exit statuses seen |\n|---|---|---|---|")
    for (dataset, fault), (passed, run, _, statuses) in counts.items():
        seen = ", ".join(f"{status}×{statuses.count(status)}" for status in sorted(set(statuses)))
        log(f"| {dataset} | {fault} | {passed}/{run} | {seen} |")
    for (_, _), (_, _, failures, _) in counts.items():
        for failure in failures:
            log(f"failed: {failure}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME}", description=__doc__,
                                     formatter_class=measure.Help)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--faults", default="SIGTERM,SIGINT")
    parser.add_argument("--trials", type=int, default=20, help="trials per dataset and fault")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", help="where the run directories go (default: a new temporary folder)")
    parser.add_argument("--recipes", action="store_true", help="train with the recipe set RECIPES: the best "
                        "checkpoint, early stopping, EMA weights and gradient accumulation; and FIELD_RECIPES: the "
                        "random resized crop, mixup, cutmix, label smoothing or the balanced loss")
    args = parser.parse_args(argv)
    with record.recorded(NAME, argv, devices=False):  # TensorFlow runs in the trials' processes
        started = time.time()
        counts = run_trials(args.datasets.split(","), args.faults.split(","), args.trials, args.seed, args.work,
                            recipes=args.recipes)
        report(counts)
        print(f"{time.time() - started:.0f} s in all")
    return 0 if all(passed == run for passed, run, _, _ in counts.values()) else 1
