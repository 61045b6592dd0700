"""The steps benchmark's first-calls mode (`python -m benchmarks steps first-calls`, benchmarks/steps.py): start-up.

Each row's first call, trace and graph optimization included, is timed in a fresh process of its own (a child,
`--first-of ROW`), so no row inherits another's warm caches; the rows alternate in paired rounds.
"""
import json
import statistics
import subprocess
import sys

from benchmarks import data_api, measure
from benchmarks.measure import spread, timed


def table(dataset, args):
    """Paired rounds of the cost rows' first calls, one fresh process per row and round; their table. With
    --variant, the loop rows once per variant, named `loop N [variant]`."""
    if args.variant:
        names = ["keras", *(f"loop {n} [{name}]" for name, _ in args.variant for n in args.loops)]
    else:
        names = ["keras", "step", *(f"loop {n}" for n in args.loops)]
    results = {name: [] for name in names}
    for number, name in measure.rotations(names, args.rounds[dataset]):
        command = [sys.executable, "-m", "benchmarks", "steps", "first-calls", "--datasets", dataset, "--loops",
                   ",".join(map(str, args.loops)), "--first-of", name, *(f"--override={o}" for o in args.override),
                   *(f"--variant={variant}:{' '.join(overrides)}" for variant, overrides in args.variant)]
        out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=data_api.ROOT).stdout
        results[name].append(json.loads(out.strip().splitlines()[-1]))
        print(f"round {number + 1}, {name}: {results[name][-1]['cpu']:.1f} CPU-s", flush=True)
    print(f"\n{dataset}: first calls, {args.rounds[dataset]} rounds\n"
          "| row | seconds | CPU-s (min–max) | CPU-s ÷ keras (min–max) |\n|---|---|---|---|")
    for name in names:
        ratios = [run["cpu"] / base["cpu"] for run, base in zip(results[name], results["keras"])]
        print(f"| {name} | {statistics.median(run['seconds'] for run in results[name]):.1f} | "
              f"{spread([run['cpu'] for run in results[name]], 1)} | {spread(ratios, 3)} |")


def child(dataset, name, args, cost):
    """In this process (a first-calls child): the first call of one step (loop rows: one loop) of row `name`, under
    its variant's overrides; the keras row (the yardstick) under TensorFlow's own graph optimization."""
    name, _, variant = name.partition(" [")
    overrides = dict(args.variant).get(variant.rstrip("]"), [])
    if name == "keras":
        overrides = ["trainer.graph_optimizer={}"]
    args.override = [*args.override, *overrides]
    row = cost(dataset, args, [None]).rows[name]  # the cost mode's rows (benchmarks/step_modes.py)
    timing = timed(row.run, row.unit)
    print(json.dumps({"seconds": timing.seconds, "cpu": timing.cpu}))
