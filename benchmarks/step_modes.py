"""The steps benchmark's rows (`python -m benchmarks steps`, whose command line and modes benchmarks/steps.py
describes): each mode's rows, run in paired rounds, and their table.

It starts TensorFlow, so benchmarks/steps.py imports it only once its command line is parsed.
"""
import itertools
import math
import statistics
from typing import Callable, NamedTuple

import tensorflow as tf

from benchmarks import data_api, measure
from benchmarks.measure import spread, timed, timing_ratios
from benchmarks.step_baselines import (ASIDES, PARTS, bare_loop, ceiling_loop, first_device, keras_step, on_device,
                                       prefetched)
from tf_harness.experiments.config import strategies
from tf_harness.experiments.config.settings import Settings
from tf_harness.experiments.training.trainer import Trainer

CACHED_BATCHES = 4
# overhead's asides beside 6. trainer: its pipeline prefetched to the device (GPU only), and trainer.fetch_ahead
TRAINER_PREFETCHED = "6. trainer, pipeline prefetched to the device"
TRAINER_AHEAD = "6. trainer, fetching ahead"


class Row(NamedTuple):
    run: Callable  # runs `steps` steps, waits for their results; returns their input wait in s, or None
    unit: int = 1  # steps per call: a row runs whole calls
    warm: Callable = None  # one short call that traces what `run` calls; None: run(unit)


class Plan(NamedTuple):
    """A mode's rows for one dataset, and how its table reads them."""

    rows: dict
    cfg: object
    info: object
    base: Callable  # results -> (label, the base Timings of each round)
    note: str = ""
    extra: tuple = None  # (column title, function(name, results, steps) -> cell)
    after: Callable = None  # function(results, steps) -> a line printed after the table


# ---------------------------------------------------------------------------------------------
# What every mode builds on


def setup(dataset, overrides, jit=None, info=None):
    """The dataset's default config with `overrides` (and trainer.jit_compile=`jit`), and its DatasetInfo: `info`,
    when a row of the same data has indexed it already."""
    cfg = data_api.compose_defaults(dataset, *overrides, *([f"trainer.jit_compile={jit}"] if jit else []))
    tf.keras.utils.set_random_seed(cfg.seed)
    return cfg, info or data_api.describe(cfg)


def make_trainer(cfg, info):
    return Trainer(Settings.from_config(cfg), info.spec, strategies.make_strategy(cfg.strategy), info.size)


def pipeline_iterator(cfg, info, to_device=False, trainer=None):
    """An iterator over the run's training pipeline (`to_device`: prefetched to the first GPU; `trainer`: as that
    Trainer's run takes it, `Trainer.input_iterator`); with a cache on, after the pass that fills it, so no row pays
    for filling it."""
    batches = data_api.train_input(cfg, info.table, workdir=None, seed=cfg.seed)
    iterator = prefetched(batches) if to_device else trainer.input_iterator(batches) if trainer else iter(batches)
    if cfg.pipeline.cache != "none" and not info.sampled:  # drawn pairs are never cached
        for _ in range(math.ceil(len(info.table) / cfg.pipeline.batch_size) + 1):
            next(iterator)
    return iterator


def step_row(step, iterator):
    """A row calling a one-step function (its first result the loss) once per batch."""
    def run(steps):
        for _ in range(steps):
            loss = step(*next(iterator))[0]
        float(loss)  # waits for the last step
    return Row(run)


def loop_row(trainer, iterator, per_loop):
    """The trainer's loops of `per_loop` steps, as the runner calls them; a run returns its input wait. The
    warm-up call is at most 2 steps: one trace of the loop serves every length."""
    def run(steps):
        return sum(trainer.train_loop(iterator, per_loop).wait for _ in range(steps // per_loop))
    return Row(run, per_loop, lambda: trainer.train_loop(iterator, min(per_loop, 2)))


def named(name):
    return lambda results: (name, results[name])


def settings(cfg) -> str:
    """The run settings a table's rows share."""
    return (f"model={cfg.model.name} batch={cfg.pipeline.batch_size} image_size={cfg.pipeline.image_size} "
            f"cache={cfg.pipeline.cache}")


# ---------------------------------------------------------------------------------------------
# The modes' rows


def cost(dataset, args, jits):
    cfg, info = setup(dataset, args.override, jits[0])
    trainer = make_trainer(cfg, info)
    batches = data_api.train_input(cfg, info.table, workdir=None, seed=cfg.seed).take(CACHED_BATCHES).cache()
    iterator = iter(batches.repeat())
    for _ in range(CACHED_BATCHES):  # fills the cache, so no row pays for the pipeline's start
        next(iterator)
    rows = {"keras": step_row(keras_step(cfg, info.spec, info.size), iterator)}
    if trainer.jit_compile:  # the trainer's step is one XLA cluster: so is this yardstick's, beside the plain one
        rows["keras XLA"] = step_row(keras_step(cfg, info.spec, info.size, jit_compile=True), iterator)
    rows["step"] = step_row(lambda *batch: (trainer.one_step(*batch)["loss"],), iterator)
    rows.update({f"loop {n}": loop_row(trainer, iterator, n) for n in args.loops})
    return Plan(rows, cfg, info, named("keras"), f"step jit_compile={trainer.jit_compile}, "
                                                 f"{CACHED_BATCHES} cached batches")


def host_loss(dataset, args, jits):
    cfg, info = setup(dataset, args.override)
    iterator = pipeline_iterator(cfg, info)
    batch, longest = next(iterator), max(args.loops)
    # A ceiling per loop length: what looping alone gains a step with no host work of its own.
    rows = {f"ceiling, {n} per call": Row(ceiling_loop(cfg, info, batch, n, False), n) for n in args.loops}
    rows[f"ceiling XLA, {longest} per call"] = Row(ceiling_loop(cfg, info, batch, longest, True), longest)
    for jit, (variant, overrides) in itertools.product(jits, args.variant or [("", [])]):
        row_cfg, _ = setup(dataset, [*args.override, *overrides], jit, info)
        trainer = make_trainer(row_cfg, info)
        rows_input = pipeline_iterator(row_cfg, info, trainer=trainer) if overrides else iterator
        rows.update({f"loop {n}, jit {trainer.jit_compile}{f' [{variant}]' * bool(variant)}":
                     loop_row(trainer, rows_input, n) for n in args.loops})

    def fastest_ceiling(results):
        ceilings = [runs for name, runs in results.items() if name.startswith("ceiling")]
        return "fastest ceiling", [min(runs, key=lambda run: run.seconds) for runs in zip(*ceilings)]

    def host_loss_cell(name, results, steps):
        return spread([1 - 1 / ratio for ratio in timing_ratios(results[name], fastest_ceiling(results)[1])], 3)

    def gains(results, steps):
        shortest, longest_runs = (results[f"ceiling, {n} per call"] for n in (min(args.loops), longest))
        return (f"{dataset}: looping gains the bare step {spread(timing_ratios(shortest, longest_runs), 3)}× in "
                f"steps/s at {longest} vs {min(args.loops)} per call, saving "
                f"{spread(measure.saved_ms(shortest, longest_runs, steps))} ms per step: the host's cost of a call")
    return Plan(rows, cfg, info, fastest_ceiling, "", ("host loss (min–max)", host_loss_cell), gains)


def overhead(dataset, args, jits):
    cfg, info = setup(dataset, args.override, jits[0])
    trainer, per_call = make_trainer(cfg, info), max(args.loops)
    pipeline = pipeline_iterator(cfg, info)
    host_batch = next(pipeline)
    resident = on_device(host_batch)
    repeated = iter(tf.data.Dataset.from_tensors(host_batch).repeat())
    sources = {"resident": lambda: resident, "repeated": lambda: next(repeated), "pipeline": lambda: next(pipeline)}
    # Prefetching to the device only where there is one to copy to. On a CPU it saves nothing, and here
    # TensorFlow 2.21 hung at exit destroying a prefetch_to_device("/CPU:0") iterator.
    on_gpu = first_device() != "/CPU:0"
    asides = {name: aside for name, aside in ASIDES.items() if on_gpu or aside[1].source != "prefetched"}
    if on_gpu:
        ahead = prefetched(tf.data.Dataset.from_tensors(host_batch).repeat())
        sources["prefetched"] = lambda: next(ahead)
    yardstick = keras_step(cfg, info.spec, info.size)
    yardstick(*resident)  # builds the model and Adam's slots outside the loops, as a traced loop needs
    # As the trainer's trainer.jit_compile: the step one XLA cluster, the loop around it in the graph.
    step = yardstick.python_function
    step = tf.function(step, jit_compile=True) if trainer.jit_compile else step
    parts = {**PARTS, **{name: aside for name, (_, aside) in asides.items()}}
    rows = {name: Row(bare_loop(step, sources[each.source], per_call, each, host_batch[1].dtype), per_call)
            for name, each in parts.items()}
    rows["6. trainer"] = loop_row(trainer, pipeline, per_call)
    ahead_cfg, _ = setup(dataset, [*args.override, "trainer.fetch_ahead=true"], jits[0], info)
    rows[TRAINER_AHEAD] = loop_row(make_trainer(ahead_cfg, info), pipeline_iterator(ahead_cfg, info), per_call)
    above = {**{name: row for name, (row, _) in asides.items()}, TRAINER_AHEAD: "6. trainer"}
    if on_gpu:
        rows[TRAINER_PREFETCHED] = loop_row(trainer, pipeline_iterator(cfg, info, to_device=True), per_call)
        above[TRAINER_PREFETCHED] = "6. trainer"
    chain = [name for name in rows if name not in above]
    above.update(zip(chain[1:], chain))

    def added(name, results, steps):
        return spread(measure.saved_ms(results[name], results[above[name]], steps)) if name in above else "—"
    return Plan(rows, cfg, info, named("1. resident"), f"step jit_compile={trainer.jit_compile}, {per_call} steps "
                f"per call", ("ms per step added to the row above (min–max)", added))


def per_loop(dataset, args, jits):
    cfg, info = setup(dataset, args.override, jits[0])
    trainer, iterator = make_trainer(cfg, info), pipeline_iterator(cfg, info)
    rows = {f"loop {n}": loop_row(trainer, iterator, n) for n in args.loops}
    base, longest = f"loop {args.loops[0]}", f"loop {args.loops[-1]}"

    def speed_up(name, results, steps):
        return spread(timing_ratios(results[base], results[name]), 3)

    def saved(results, steps):
        # What the longest loop saved per step: the host's per-call cost (dispatch, read-back, Python) that a
        # loop spreads over its steps. No loop length can save more than all of it, which bounds the ratio.
        step_ms = statistics.median(1000 * run.seconds / steps for run in results[longest])
        return (f"{dataset}: a step at {args.loops[-1]} per loop takes {step_ms:.1f} ms; {args.loops[-1]} vs "
                f"{args.loops[0]} per loop saved {spread(measure.saved_ms(results[base], results[longest], steps))} "
                "ms per step")
    return Plan(rows, cfg, info, named(base), f"step jit_compile={trainer.jit_compile}",
                (f"steps/s ÷ {base} (min–max)", speed_up), saved)


def variants(dataset, args, jits):
    rows, plans = {}, []
    per_call = args.loops[0]
    for name, overrides in args.variant:
        cfg, info = setup(dataset, [*args.override, *overrides], jits[0])
        trainer = make_trainer(cfg, info)
        rows[name] = loop_row(trainer, pipeline_iterator(cfg, info), per_call)
        plans.append((cfg, info, f"{name}: {' '.join(overrides) or 'the config as it is'}"))
    base = next(iter(rows))

    def speed_up(name, results, steps):
        return spread(timing_ratios(results[base], results[name]), 3)
    return Plan(rows, plans[0][0], plans[0][1], named(base), f"loop {per_call}, step jit_compile="
                f"{trainer.jit_compile}; rows {'; '.join(note for *_, note in plans)}",
                (f"steps/s ÷ {base} (min–max)", speed_up))


MODES = {"cost": cost, "first-calls": None, "host-loss": host_loss, "overhead": overhead, "per-loop": per_loop,
         "variants": variants}


# ---------------------------------------------------------------------------------------------
# Running a plan


def warm_up(rows):
    """Each row's first call (its trace; loop rows of every length share one) and its second, timed."""
    for name, row in rows.items():
        call = row.warm or (lambda row=row: row.run(row.unit))
        first, second = timed(call), timed(call)
        print(f"{name}: first call {first.seconds:.1f} s ({first.cpu:.1f} CPU-s), the second {second.seconds:.2f} s "
              f"({second.cpu:.2f} CPU-s)", flush=True)


def bench(mode, dataset, args):
    """Runs `mode` on `dataset`: one table per --jit value, or one for all of them (host-loss)."""
    for jits in [args.jit] if mode == "host-loss" else [[jit] for jit in args.jit]:
        plan = MODES[mode](dataset, args, jits)
        unit = math.lcm(*(row.unit for row in plan.rows.values()))
        steps, rounds = unit * max(1, args.steps[dataset] // unit), args.rounds[dataset]  # whole calls of every row
        warm_up(plan.rows)
        results = measure.rotated_rounds({name: row.run for name, row in plan.rows.items()}, steps, rounds)
        if not rounds:
            continue
        print(f"\n{dataset}: {settings(plan.cfg)}, {plan.note + ', ' if plan.note else ''}{steps} steps per row, "
              f"{rounds} rounds")
        print_table(dataset, plan, results, steps)
        if plan.after:
            print(plan.after(results, steps), flush=True)


def print_table(dataset, plan, results, steps):
    """Medians over rounds of steps/s, images/s, images per CPU-second and the input-wait share; per-round
    ratios of time and CPU per step to the base, with their spread; and the mode's own column."""
    label, base_runs = plan.base(results)
    images = steps * plan.cfg.pipeline.batch_size * (2 if plan.info.spec.paired else 1)
    head = (f"| {dataset} row | steps/s | images/s | images/CPU-s | input wait | time per step ÷ {label} "
            f"(min–max) | CPU per step ÷ {label} (min–max) |" + (f" {plan.extra[0]} |" if plan.extra else ""))
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    for name, runs in results.items():
        rate = statistics.median(steps / run.seconds for run in runs)
        waits = [run.value / run.seconds for run in runs if run.value is not None]
        cells = [f"{rate:.2f}", f"{rate * images / steps:.0f}",
                 f"{statistics.median(measure.per(images, run.cpu) for run in runs):.1f}",
                 f"{statistics.median(waits):.3f}" if waits else "—",
                 spread(timing_ratios(runs, base_runs), 3), spread(timing_ratios(runs, base_runs, "cpu"), 3)]
        if plan.extra:
            cells.append(plan.extra[1](name, results, steps))
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
