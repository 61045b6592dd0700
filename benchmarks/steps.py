"""What the trainer's step and loops cost: against a plain Keras step, a device-bound ceiling, and each other.

    python -m benchmarks steps [cost] [--datasets chest_xray] [--steps 10] [--rounds 3] [--loops 1,10]
    python -m benchmarks steps first-calls [--datasets chest_xray] [--rounds 3] [--loops 1,10]
                                           [--variant nometa:'trainer.graph_optimizer={disable_meta_optimizer:true}']
    python -m benchmarks steps host-loss [--datasets lfw_pairs,imagenet_det] [--loops 1,10,50] [--jit false,true]
                                         [--variant base: --variant ahead:trainer.fetch_ahead=true]
    python -m benchmarks steps overhead [--datasets lfw_pairs,imagenet_det] [--per-call 50] [--jit null]
    python -m benchmarks steps per-loop [--datasets lfw_pairs,imagenet_det] [--loops 1,50]
                                        [--steps lfw_pairs=100,imagenet_det=50] [--rounds lfw_pairs=3,imagenet_det=1]
    python -m benchmarks steps variants [--datasets lfw_pairs] [--variant files:pipeline.image_table_mb=0]
                                        [--variant table:] [--loops 1] [--steps 200] [--rounds 5]
    every mode also: [--override pipeline.cache=memory ...] (a Hydra override for every row, repeatable)

Modes, each a set of rows timed after its trace and warm-up (start-up and tracing left out):

cost (the default): the trainer's traced step over a minimal one. Rows: keras, the yardstick
    (benchmarks/step_baselines.py: a plain Keras train step on its own instance of the default model; keras XLA
    beside it where the trainer compiles its step); step, `Trainer.one_step` (augmentation, the non-finite checks
    and skip, the batch-norm statistics kept for a skip, the global step); loop N, `Trainer.train_loop(iterator, N)`.
    Every row reads a few batches of the training pipeline cached in memory, so the input costs next to nothing.
first-calls: start-up instead: the cost rows' first call of one step (loop rows: one loop), trace and graph
    optimization included, each in a fresh process so no row inherits another's warm caches. keras runs under
    TensorFlow's own graph optimization (trainer.graph_optimizer={}), the others under the config's; with --variant
    NAME:OVERRIDES, the loop rows once per variant (no step row): Grappler's options against one yardstick.
host-loss: how much of a step is lost to the host. Rows: ceiling, N per call (the yardstick N times in one
    tf.function over one batch held on the device, for each N of --loops), ceiling XLA (the longest, compiled whole),
    and loop N, jit J (the trainer's loop over the run's pipeline: a Trainer per J of --jit, and per --variant as
    `loop N, jit J [NAME]`). Host loss = 1 - the fastest ceiling's time per step ÷ the row's, per round; the trainer's
    own extra device work counts as loss, so it bounds the host's share from above.
overhead: where that gap opens: a while loop written here around the yardstick adds, one row at a time, what the
    trainer's loop does per step (1. resident batch, 2. + iterator, 3. + clocks, 4. + results, 5. + pipeline), then
    6. trainer. Beside them, what the trainer's loop does not do: 3. + device condition (a loop condition reading a
    count kept on the device every step); beside 6, the trainer with trainer.fetch_ahead=true; with a GPU, 2. +
    iterator, prefetched to the device (tf.data's prefetch_to_device), and beside 6 the trainer over its pipeline so
    prefetched. At --per-call steps per call (the longest of --loops), the step under XLA where the trainer's is.
per-loop: steps/s of `Trainer.train_loop` at each of --loops (trainer.steps_per_loop) over the run's pipeline, against
    the first, and the milliseconds per step the longest saves: the host's per-call cost.
variants: the trainer's loop (at the first of --loops) under several configs side by side, each row a Trainer and
    pipeline of its own: `--variant NAME:OVERRIDES` (space-separated Hydra overrides on top of --override), the first
    the base. By default LFW's file pipeline (pipeline.image_table_mb=0) against its table (data/image_table.py).

Rows run in paired rounds, the order rotated every round, so drift and other processes' load fall on every row alike.
Reported per row (medians over rounds): steps/s, images/s (an LFW example is two images), images per CPU-second of
this process (every thread, tf.data's included), the input-wait fraction where the row times it, and per-round ratios
of time and of CPU per step to the mode's base row, with their spread (min–max over rounds). The devices TensorFlow
sees and the 1-minute load average (before and after) frame the output.
"""
import argparse
import sys

from benchmarks import first_calls, record

NAME = "steps"
# Per mode: datasets, steps per row and round, paired rounds, loop lengths (per-loop's sized for a CPU's slow steps).
DEFAULTS = {"cost": ("chest_xray", "10", "3", "1,10"), "first-calls": ("chest_xray", "1", "3", "1,10"),
            "host-loss": ("lfw_pairs,imagenet_det", "200", "3", "1,10,50"),
            "overhead": ("lfw_pairs,imagenet_det", "200", "3", "50"),
            "per-loop": ("lfw_pairs,imagenet_det", "lfw_pairs=100,imagenet_det=50", "lfw_pairs=3,imagenet_det=1",
                         "1,50"),
            "variants": ("lfw_pairs", "200", "5", "1")}
MODES = tuple(DEFAULTS)
# The variants mode's rows unless --variant names others: LFW's file pipeline, then its image table.
VARIANTS = ("files:pipeline.image_table_mb=0", "table:")


# ---------------------------------------------------------------------------------------------
# The command line


def per_dataset(text, default, datasets):
    """`--steps`/`--rounds`: one number for every dataset, or per dataset as `lfw_pairs=100,imagenet_det=50`
    over the mode's `default`; a dataset named in neither gets the least of the numbers named."""
    def parse(value):
        if "=" not in value:
            return {dataset: int(value) for dataset in datasets}
        return {key: int(number) for key, number in (item.split("=") for item in value.split(",") if item)}
    values = {**parse(default), **parse(text)}
    return {dataset: values.get(dataset, min(values.values())) for dataset in datasets}


def parser(mode):
    datasets, steps, rounds, loops = DEFAULTS[mode]
    parse = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME} {mode}", description=__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter,
                                    epilog=f"The defaults above are the {mode} mode's; `python -m benchmarks {NAME} "
                                           f"MODE --help` shows another's (modes: {', '.join(MODES)}).")
    parse.add_argument("--datasets", "--dataset", default=datasets, help=f"comma-separated (default {datasets})")
    parse.add_argument("--steps", default=steps, help="steps per row and round: N, or per dataset as "
                                                         f"lfw_pairs=100,imagenet_det=50 (default {steps})")
    parse.add_argument("--rounds", default=rounds, help=f"paired rounds, likewise (default {rounds}); 0: only the "
                                                        "first and second calls")
    parse.add_argument("--loops", "--per-call", default=loops,
                       help=f"loop lengths (steps per call), comma-separated (default {loops}); overhead: the longest")
    parse.add_argument("--jit", default="", help="trainer.jit_compile values, comma-separated (true, false, null); "
                                                 "default: the config's")
    parse.add_argument("--override", action="append", default=[], help="a Hydra override for every row, repeatable")
    parse.add_argument("--variant", action="append", default=[],
                       help="variants: a row NAME:OVERRIDES (space-separated Hydra overrides), repeatable "
                            f"(default: {' '.join(repr(variant) for variant in VARIANTS)})")
    parse.add_argument("--first-calls", type=int, help="cost: rounds of start-up timing instead (= first-calls mode)")
    parse.add_argument("--first-of", help=argparse.SUPPRESS)  # a first-calls child: the row to time
    return parse


def parse_args(argv):
    mode = argv[0] if argv[:1] and argv[0] in MODES else "cost"
    args = parser(mode).parse_args(argv[1:] if argv[:1] == [mode] else argv)
    if args.first_calls:  # as the cost mode's --first-calls N: N rounds of first calls
        mode, args.rounds = "first-calls", str(args.first_calls)
    args.mode, args.datasets = mode, args.datasets.split(",")
    args.loops = [int(n) for n in args.loops.split(",")]
    args.jit = [jit or None for jit in args.jit.split(",")]
    default_variants = VARIANTS if mode == "variants" else ()
    args.variant = [(name, overrides.split()) for name, _, overrides in
                    (variant.partition(":") for variant in args.variant or default_variants)]
    _, steps, rounds, _ = DEFAULTS[mode]
    args.steps, args.rounds = per_dataset(args.steps, steps, args.datasets), per_dataset(args.rounds, rounds,
                                                                                          args.datasets)
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    # The rows start TensorFlow: imported once the command line is parsed, so that --help answers without it.
    from benchmarks import step_modes

    if args.first_of:
        return first_calls.child(args.datasets[0], args.first_of, args, step_modes.cost)
    with record.recorded(NAME, argv):
        for dataset in args.datasets:
            if args.mode == "first-calls":
                first_calls.table(dataset, args)
            else:
                step_modes.bench(args.mode, dataset, args)
    return 0
