"""The XLA compile cache: a run's first step with the cache cold, then warm, in paired rounds.

Each round makes a fresh cache home (samples are shared, generated once up front), then runs the same
`python run.py ... trainer.jit_compile=true` twice: the first run compiles the train step and publishes it
(experiments/training/xla_cache.py), the second loads it. Each run's own "Time to the first step" line gives its
"first loop" lap (the trace, the compile or the load, and the first step). The figure is warm ÷ cold of
that lap, per round, with its spread; the rows also give the whole time to the first step and each run's
CPU seconds. The rounds alternate nothing else, so load that comes and goes hits a pair alike.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import measure, record

PROJECT = Path(__file__).resolve().parents[1]
FIRST_STEP = re.compile(r"Time to the first step: ([\d.]+) s \((.*)\)")
PUBLISHED = re.compile(r"XLA programs are cached in \S+ \((\d+) there already\)")


def first_step(overrides, cache, run_dir):
    """One run to its end: (time to the first step, first-loop lap, CPU seconds, entries the cache held)."""
    command = [sys.executable, "run.py", *overrides, "trainer.jit_compile=true", f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, HARNESS_CACHE=str(cache), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_XLA_FLAGS", None)
    log = run_dir.with_suffix(".log")
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=PROJECT, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)  # the child's own CPU time
    output = log.read_text()
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"{' '.join(command)} exited {os.waitstatus_to_exitcode(status)}:\n{output[-3000:]}")
    total, laps = FIRST_STEP.search(output).groups()
    loop = next(float(re.search(r"([\d.]+) s$", lap).group(1)) for lap in laps.split(", ")
                if lap.startswith("first loop"))
    held = PUBLISHED.search(output)
    return float(total), loop, usage.ru_utime + usage.ru_stime, int(held.group(1)) if held else None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks compile_cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="cold/warm pairs")
    parser.add_argument("--override", action="append", default=[],
                        help="a Hydra override for every run (repeatable); the default is the LFW smoke run")
    args = parser.parse_args(argv)
    overrides = args.override or ["dataset=lfw_pairs", "experiment=smoke", "trainer.train_steps=1",
                                  "trainer.eval_every=100000"]
    with record.recorded("compile_cache", argv or [], devices=False):
        work = Path(tempfile.mkdtemp(prefix="compile-cache-"))
        samples = Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "tf-harness"))
        try:
            if not (samples / "samples").is_dir():
                samples = work / "samples-home"
                first_step(overrides, samples, work / "warm-up")  # generates the samples once, outside the rounds
            rows = []
            for number in range(args.rounds):
                cache = work / f"round-{number}"
                shutil.copytree(samples / "samples", cache / "samples", symlinks=True)
                cold = first_step(overrides, cache, work / f"cold-{number}")
                warm = first_step(overrides, cache, work / f"warm-{number}")
                rows.append((cold, warm, os.getloadavg()[0]))
                print(f"round {number + 1}: cold first step {cold[0]:.1f} s (first loop {cold[1]:.1f} s, {cold[2]:.1f} "
                      f"CPU-s, cache held {cold[3]}), warm {warm[0]:.1f} s (first loop {warm[1]:.1f} s, {warm[2]:.1f} "
                      f"CPU-s, cache held {warm[3]}); load {rows[-1][2]:.2f}", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        loops = [warm[1] / cold[1] for cold, warm, _ in rows]
        totals = [warm[0] / cold[0] for cold, warm, _ in rows]
        print(measure.target_line("first loop, warm ÷ cold", loops, 0.5, op="<="))
        print(measure.target_line("first step, warm ÷ cold", totals, None))
        print(f"  first loop cold {statistics.median(c[1] for c, _, _ in rows):.1f} s, warm "
              f"{statistics.median(w[1] for _, w, _ in rows):.1f} s (medians)")
    return 0
