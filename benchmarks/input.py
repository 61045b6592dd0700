"""What the input costs: the project's pipeline beside independent baselines, per second and per CPU-second.

    python -m benchmarks input [throughput] [--datasets chest_xray,lfw_pairs,imagenet_det] [--batch-size 64]
                               [--image-size default,224] [--seconds 3] [--rounds 3] [--quiet-wait 10]
                               [--only ceiling,cores,a,b,c,d,e,f,g,h]
    python -m benchmarks input resize [--files GLOB] [--image-size 224] [--rounds 5] [--batches 12]
    python -m benchmarks input guard [--datasets ...] [--rounds 4] [--batches 8]
    python -m benchmarks input starvation [--datasets chest_xray] [--steps 10] [--model resnet_v2_152]
                                          [--batch-size 32] [--image-size 224]
    python -m benchmarks input augment [--batch-size 64] [--image-size 224] [--rounds 3] [--seconds 2]
    python -m benchmarks input release [--datasets ...] [--rounds 8] [--seconds 4]

Modes (`python -m benchmarks input MODE --help` for each one's options):

throughput (the default): every input source side by side, for each dataset present and each image size
    (`default`: the dataset's own, conf/dataset/<name>.yaml), on its embedded sample's training split:
    ceiling  the minimal TF decode (read, decode, bilinear resize, uint8; not the project's code) on
             one core in a pinned subprocess, x cores
    cores    the same on every core at once, a pinned subprocess each (a diagnostic: one busy core
             beside idle ones often runs faster than when all are busy)
    a        a Python loop decoding and resizing with PIL, one tf.constant per batch (the feed_dict way)
    b        the PyTorch DataLoader, num_workers = cores, the same PIL decode and resize (torch installed)
    c        our file pipeline: input_fn(training=True), pipeline.source=files (uint8 batches); LFW's
             drawn pairs with pipeline.image_table_mb=0, so that they decode their files
    d, e     pipeline.source=tfrecord with tfrecord.encoding=encoded / raw (converted into a temp dir)
    f        pipeline.cache=memory, after the pass that fills the cache; LFW: pairs gathered from the image
             table of its training images decoded once (data/image_table.py), its default
    g        the dataset's tutorial-style baseline, where it has one
    h        ImageNet DET only: g with its decode moved to a second map, which TF 2.21 parallelises
    a, b, g and h do c's work per image (decode, the same crop and resize, uint8 out); the ceiling only
    the minimal decode, so c ÷ ceiling is what the project's per-image work costs against the least
    TensorFlow can do. No row augments or normalises: the train step does that for every source alike.
resize: the project's shrink (tf_harness.data.images.resize) against a plain bilinear resize (its
    ceiling) and the shrink before area (`previous`), PNG decode included, on the real NIH fixtures
    (tests/fixtures/real/nih/images) unless --files says otherwise.
guard: what the decode guard (data/integrity/unreadable.py) costs: the training records loaded by input_fn's
    per-record load, bare and guarded.
augment: what the train step's augmentation costs (data/preprocessing.py), on one random uint8 RGB batch, traced
    as the step traces it, a new step number each batch:
    flips  flips and brightness (pipeline.augment), the default
    crop   flips, brightness and pipeline.random_resized_crop at its defaults (scale [0.08, 1], ratio [3/4, 4/3])
    mix    crop, then pipeline.mixup_alpha=0.2 and cutmix_alpha=1.0 (each batch takes one of them)
release: what letting go of an iterator costs the thread that lets go of it. Over the same training input
    (input_fn(training=True)), each row draws batches for --seconds, then its last reference is dropped, timed:
    iter     TensorFlow's own iterator, `iter(dataset)`
    project  the project's (data/iterators.py), destroyed in a thread of its own
    A wait is the iterator's destructor waiting for tf.data's autotuning thread.
starvation: does the real pipeline hold a real model's training step back? The Trainer fed by the real
    pipeline and by one cached batch repeated, in alternating blocks (see benchmarks/input_starvation.py).

Rows are independent implementations or the project's own code, never a mix: a ceiling is written here
(benchmarks/input_baselines.py), the code under test is reached through benchmarks/project_sources.py.
Sources run in paired rounds (interleaved, the order rotated each round) so drift and other processes'
load hit all of them alike; each measurement is a fresh iterator, a warm-up (excluded), then a fixed number
of batches (--batches, or sized in a calibration round to take about --seconds). Reported per row:
images/s and images per CPU-second of this process and its workers (which other load hardly moves), the
cores other processes used meanwhile, and the 1-minute load average before and after; ratios are medians
of per-round ratios with their min–max.
"""
import argparse
import glob
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import data_api, input_report, input_starvation, measure, record
from benchmarks.measure import CORES, Source

# The baselines and the project's sources start TensorFlow: they are imported where a mode builds its rows, so that
# `--help` answers without it.

NAME = "input"
MODES = ("throughput", "resize", "guard", "starvation", "augment", "release")
REAL_NIH = data_api.ROOT / "tests" / "fixtures" / "real" / "nih" / "images" / "*.png"
log = logging.getLogger("benchmarks.input")


# ---------------------------------------------------------------------------------------------
# throughput


def baseline_sources(bench, only, notes):
    """Rows ceiling, cores, a and b (benchmarks/input_baselines.py)."""
    from benchmarks import input_baselines
    from benchmarks.input_baselines import CeilingSource

    sources = []
    if "ceiling" in only:
        sources.append(CeilingSource(bench))
    if "cores" in only and CORES > 1:
        sources.append(CeilingSource(bench, all_cores=True))
    if "a" in only:
        sources.append(Source("a", "Python loop + PIL, tf.constant per batch", bench,
                              input_baselines.python_loop_start(bench)))
    if "b" in only:
        try:
            start = input_baselines.torch_start(bench)
        except ImportError:
            notes["b"] = "skipped: torch not installed (pip install -e '.[bench]')"
        else:
            sources.append(Source("b", f"PyTorch {start.torch_version} DataLoader, {CORES} workers + PIL", bench,
                                  start))
    return sources


def tutorial_sources(bench, only):
    """Rows g and h: the datasets' tutorial-style baselines."""
    from benchmarks import input_baselines

    sources = []
    if "g" in only and bench.name == "lfw_pairs":
        sources.append(Source("g", "from_generator + PIL pair sampler (tutorial)", bench,
                              measure.tf_start(lambda: input_baselines.from_generator_dataset(bench))))
    elif "g" in only and bench.name == "imagenet_det":
        sources.append(Source("g", "tutorial: from_generator, one map: py_function XML + decode_jpeg", bench,
                              measure.tf_start(lambda: input_baselines.tutorial_det_dataset(bench))))
    if "h" in only and bench.name == "imagenet_det":
        sources.append(Source("h", "tutorial, decode in a 2nd map (auto-parallelised by TF 2.21)", bench,
                              measure.tf_start(lambda: input_baselines.tutorial_det_dataset(bench, True))))
    return sources


def run_dataset(name, image_size, args, only, workdir):
    """Measures and reports one dataset at one image size (None: its default); returns its summary
    entry, or None when it failed."""
    from benchmarks import project_sources
    from benchmarks.input_baselines import CeilingSource

    sources = []
    try:
        folder = Path(workdir) / f"{name}-{image_size or 'default'}"
        folder.mkdir()
        bench = data_api.Bench(name, args.batch_size, image_size, folder)
        notes = {}
        sources = (baseline_sources(bench, only, notes) + project_sources.pipeline_sources(bench, only, notes)
                   + tutorial_sources(bench, only))
        before = measure.load_average()
        measure.run_interleaved(sources, args.seconds, args.rounds, args.quiet_wait, args.batches)
        load = (before, measure.load_average())
    except Exception as error:  # one dataset failing (its files changed under us...) spares the others
        log.exception("%s failed", name)
        print(f"\n### {name}: failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
        return None
    finally:
        for source in sources:
            if isinstance(source, CeilingSource):
                source.close()
    return input_report.report_dataset(bench, sources, notes, args.rounds, load)


def throughput(args):
    only = set(args.only.split(",")) if args.only else set(input_report.ROWS)
    unknown = only - set(input_report.ROWS)
    if unknown:
        sys.exit(f"--only: unknown rows {', '.join(sorted(unknown))}; choose from {','.join(input_report.ROWS)}")
    print("columns: images/s is the median over rounds (wall clock); ÷ c is the median of per-round ratios to c; "
          "images per CPU-s counts this process and its workers only, so other load hardly moves it; cores busy is "
          "CPU-s per wall-s (the ceiling: of its one pinned core); others' cores is what other processes used "
          "meanwhile")
    summary, failed = [], False
    with tempfile.TemporaryDirectory(prefix="input-bench-") as workdir:
        for name, image_size in datasets_and_sizes(args):
            started = time.perf_counter()
            entry = run_dataset(name, image_size, args, only, workdir)
            if entry is None:
                failed = True
                continue
            summary.append(entry)
            print(f"\n({entry['label']} took {time.perf_counter() - started:.0f} s; load average now "
                  f"{measure.load_average():.1f} -- other processes on the machine show up as noise)")
    input_report.print_summary(summary, args)
    return 1 if failed else 0


def datasets_and_sizes(args):
    """(dataset, image size) for each dataset present and each size; absent datasets are reported."""
    for name in args.datasets.split(","):
        absent = data_api.dataset_absent(name)
        if absent:
            print(f"\n### {name}: skipped: {absent}")
            continue
        for image_size in args.image_size:
            yield name, image_size


# ---------------------------------------------------------------------------------------------
# resize and guard: a few rows against one


def resize(args):
    """The shrink alone: the same read, decode_png and parallel map around each resize."""
    from benchmarks import input_baselines

    paths = sorted(glob.glob(os.path.expanduser(args.files)))
    if not paths:
        raise SystemExit(f"no files match {args.files}")
    rows = {"ceiling": ("plain bilinear resize, written here", input_baselines.plain_resize),
            "previous": ("the shrink before area, written here", input_baselines.previous_resize),
            "project": ("tf_harness.data.images.resize", data_api.project_resize())}
    for image_size in args.image_size:
        size = (image_size or 224, image_size or 224)
        sources = [Source(key, title, None, measure.tf_start(lambda function=function: png_dataset(
            paths, function, size, args.batch_size)), images_per_batch=args.batch_size)
            for key, (title, function) in rows.items()]
        before = measure.load_average()
        measure.run_interleaved(sources, args.seconds, args.rounds, batches=args.batches)
        input_report.print_against(
            f"{len(paths)} files from {args.files}, to {size[0]}x{size[1]}, batch {args.batch_size}; "
            f"{args.rounds} paired rounds; load average (1 min) {before:.2f} before, "
            f"{measure.load_average():.2f} after", sources, "ceiling")
    return 0


def png_dataset(paths, resize_function, size, batch_size):
    """Read, decode_png (one channel), `resize_function` to `size`, in a parallel map over `paths` repeated."""
    import tensorflow as tf

    decoded = tf.data.Dataset.from_tensor_slices(paths).repeat().map(
        lambda path: resize_function(tf.io.decode_png(tf.io.read_file(path), channels=1), size),
        num_parallel_calls=tf.data.AUTOTUNE)
    return decoded.batch(batch_size).prefetch(2)


def guard(args):
    """The decode guard's cost: the same records loaded bare and guarded, per dataset and size."""
    from benchmarks import project_sources

    with tempfile.TemporaryDirectory(prefix="guard-bench-") as workdir:
        for name, image_size in datasets_and_sizes(args):
            bench = data_api.Bench(name, args.batch_size, image_size, workdir)
            sources = project_sources.guard_sources(bench)
            before = measure.load_average()
            measure.run_interleaved(sources, args.seconds, args.rounds, batches=args.batches)
            input_report.print_against(
                f"### {name}: {input_report.size_label(bench)}, batch {args.batch_size}; {args.rounds} paired "
                f"rounds; load average (1 min) {before:.2f} before, {measure.load_average():.2f} after",
                sources, "plain")
    return 0


# ---------------------------------------------------------------------------------------------
# augment: the train step's augmentation alone

AUGMENT_ROWS = {
    "flips": ("flips and brightness (pipeline.augment)", {}),
    "crop": ("flips, brightness and random_resized_crop (defaults)", {"crop": {}}),
    "mix": ("crop, then mixup 0.2 or cutmix 1.0", {"crop": {}, "mixup_alpha": 0.2, "cutmix_alpha": 1.0}),
}


def augment(args):
    """The rows of AUGMENT_ROWS in paired rounds, per image size."""
    import numpy as np
    import tensorflow as tf

    from tf_harness.data.preprocessing import Preprocessing

    for image_size in args.image_size:
        size = image_size or 224
        images = tf.constant(np.random.default_rng(0).integers(0, 256, (args.batch_size, size, size, 3), np.uint8))
        labels = tf.zeros([args.batch_size], tf.int32)
        sources = [Source(key, title, None, augment_start(Preprocessing(True, True, "unit_range", 0, classes=1000,
                                                                         **options), images, labels),
                          images_per_batch=args.batch_size)
                   for key, (title, options) in AUGMENT_ROWS.items()]
        before = measure.load_average()
        measure.run_interleaved(sources, args.seconds, args.rounds, batches=args.batches)
        input_report.print_against(
            f"augmentation of a {args.batch_size}x{size}x{size}x3 uint8 batch, traced; {args.rounds} paired rounds; "
            f"load average (1 min) {before:.2f} before, {measure.load_average():.2f} after", sources, "flips")
    return 0


def augment_start(preprocess, images, labels):
    """A start() whose batches are `preprocess` (and its `mix`) of `images`, at step 0, 1, 2, ..."""
    import itertools

    import tensorflow as tf

    @tf.function
    def step(number):
        features, _ = preprocess.mix(preprocess(images, training=True, step=number), labels, number)
        return tf.reduce_sum(features)  # one value back, so the host's copy costs nothing beside the work

    steps = itertools.count()
    return lambda: measure.Stream(lambda: step(tf.constant(next(steps), tf.int64)).numpy())


# ---------------------------------------------------------------------------------------------
# release: letting go of an iterator

RELEASE_ROWS = ("iter", "project")
WAITED = 0.1  # seconds: a let-go that took longer waited for a thread


def release(args):
    """Per dataset, RELEASE_ROWS in paired rounds over the same training input; prints the waits of the thread
    that lets go of each row's iterators."""
    with tempfile.TemporaryDirectory(prefix="release-bench-") as workdir:
        for name, image_size in datasets_and_sizes(args):
            bench = data_api.Bench(name, args.batch_size, image_size, workdir)
            data = data_api.train_input(bench.cfg, bench.table, bench.workdir, measure.SEED)
            make = {"iter": iter, "project": data_api.project_iterator}
            waits = {key: [] for key in RELEASE_ROWS}
            before = measure.load_average()
            for _, key in measure.rotations(RELEASE_ROWS, args.rounds):
                held = [make[key](data)]  # its one reference
                started = time.monotonic()
                while time.monotonic() - started < args.seconds:
                    next(held[0])
                waits[key].append(measure.timed(held.clear))
            print(f"\n### {name}: {input_report.size_label(bench)}, batch {args.batch_size}; {args.rounds} paired "
                  f"rounds of {args.seconds:g} s of batches; load average (1 min) {before:.2f} before, "
                  f"{measure.load_average():.2f} after\n")
            print(f"| row | let-go s, median | max | total | let-gos over {WAITED:g} s | CPU s, total |")
            print("|---|---|---|---|---|---|")
            for key in RELEASE_ROWS:
                seconds = [timing.seconds for timing in waits[key]]
                print(f"| {key} | {statistics.median(seconds):.3f} | {max(seconds):.3f} | {sum(seconds):.2f} | "
                      f"{sum(s > WAITED for s in seconds)} of {len(seconds)} | "
                      f"{sum(timing.cpu for timing in waits[key]):.2f} |")
    return 0


# ---------------------------------------------------------------------------------------------
# The command line


def image_sizes(text):
    """`--image-size`: comma-separated sizes, `default` for each dataset's own (None)."""
    return [None if size == "default" else int(size) for size in text.split(",")]


def add_rounds(parser, rounds, seconds, batches=None):
    parser.add_argument("--rounds", "--repeats", type=int, default=rounds, help="paired rounds (medians over them)")
    parser.add_argument("--seconds", type=float, default=seconds, help="length of one measurement of one row")
    parser.add_argument("--batches", type=int, default=batches,
                        help="batches per measurement, instead of sizing them to --seconds")


def add_data(parser, datasets, batch_size, image_size):
    parser.add_argument("--datasets", "--dataset", default=datasets,
                        help="comma-separated dataset modules; absent ones are reported as skipped")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--image-size", type=image_sizes, default=image_size,
                        help="comma-separated square sizes; default: each dataset's own (conf/dataset)")


def parser():
    top = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME}", description=__doc__,
                                  formatter_class=measure.Help)
    modes = top.add_subparsers(dest="mode", metavar="MODE")
    for mode in MODES:
        sub = modes.add_parser(mode, description=input_starvation.__doc__ if mode == "starvation" else __doc__,
                               formatter_class=measure.Help,
                               help=f"see `python -m benchmarks {NAME} {mode} --help`")
        if mode == "throughput":
            add_data(sub, ",".join(data_api.DATASETS), 64, "default,224")
            add_rounds(sub, 3, 3.0)
            sub.add_argument("--quiet-wait", type=float, default=10.0,
                             help="before each measurement, wait up to this many seconds for other processes to "
                                  "use under 0.25 cores (0: never wait)")
            sub.add_argument("--only", help=f"comma-separated rows among {','.join(input_report.ROWS)}")
        elif mode == "resize":
            sub.add_argument("--files", default=str(REAL_NIH), help="a glob of PNGs (default: the real NIH fixtures)")
            sub.add_argument("--image-size", "--size", type=image_sizes, default="224", help="comma-separated")
            sub.add_argument("--batch-size", type=int, default=8)
            add_rounds(sub, 5, 1.0, 12)
        elif mode == "guard":
            add_data(sub, ",".join(data_api.DATASETS), 64, "default")
            add_rounds(sub, 4, 1.0, 8)
        elif mode == "release":
            add_data(sub, ",".join(data_api.DATASETS), 64, "default")
            sub.add_argument("--rounds", type=int, default=8, help="paired rounds")
            sub.add_argument("--seconds", type=float, default=4.0, help="how long each iterator draws batches")
        elif mode == "augment":
            sub.add_argument("--batch-size", type=int, default=64)
            sub.add_argument("--image-size", type=image_sizes, default="224", help="comma-separated square sizes")
            add_rounds(sub, 3, 2.0)
        else:
            input_starvation.add_arguments(sub, add_data)
    return top


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    # The mode may be left out: throughput, as `python -m benchmarks input --datasets lfw_pairs`.
    full = argv if argv[:1] and (argv[0] in MODES or argv[0] in ("-h", "--help")) else ["throughput", *argv]
    args = parser().parse_args(full)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    run = {"throughput": throughput, "resize": resize, "guard": guard, "starvation": input_starvation.run,
           "augment": augment, "release": release}
    with record.recorded(NAME, argv):
        status = run[args.mode](args)
    print(f"command: {measure.command(NAME, argv)}")
    return status
