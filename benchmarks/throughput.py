#!/usr/bin/env python
"""Input-pipeline throughput, every input source measured side by side in one run.

    python benchmarks/throughput.py [--datasets chest_xray,lfw_pairs,imagenet_det] [--batch-size 64]
                                    [--image-size default,224] [--seconds 3] [--repeats 3] [--quiet-wait 10]
                                    [--only ceiling,cores,a,b,c,d,e,f,g,h]

For each dataset module present, on its embedded sample's training split, at one batch size
and each image size (`default`: the dataset's own, conf/dataset/<name>.yaml), it measures
images/s and images per CPU-second of:

    ceiling  the minimal TF decode (read, decode, bilinear resize, uint8; not the project's code) on
             one core in a pinned subprocess, x cores
    cores    the same on every core at once, a pinned subprocess each (a diagnostic: what the cores
             give together; one busy core beside idle ones often runs faster)
    a        a Python loop decoding and resizing with PIL, one tf.constant per batch (the feed_dict way)
    b        the PyTorch DataLoader, num_workers = cores, the same PIL decode and resize
    c        our file pipeline: input_fn(training=True), pipeline.source=files (uint8 batches)
    d, e     pipeline.source=tfrecord with tfrecord.encoding=encoded / raw (converted into a temp dir)
    f        pipeline.cache=memory, after the pass that fills the cache
    g        the dataset's tutorial-style baseline, where it has one (see benchmarks/baselines.py)
    h        ImageNet DET only: g with its decode moved to a second map, which TF 2.21 parallelises

a, b, g and h do the same work as c per image: decode, the same crop and resize (PIL's bilinear
filter is antialiased when shrinking, like tf.image.resize(antialias=True)), uint8 out. Where c
decodes only a JPEG's window, a and b use PIL's reduced decode (draft()) where it applies; PIL
has no windowed decode, so with crop_or_pad (DET) they decode whole JPEGs where c does not. The
ceiling does only the minimal decode (no crop, plain bilinear), so c ÷ ceiling shows what the
project's per-image work costs against the least TensorFlow can do. No row augments or
normalises: the train step does that on the device for every source alike.

Every source is measured `--repeats` times, interleaved (round-robin, the order rotated each
round) so that drift and noise on a shared machine hit all of them alike; each measurement is a
fresh iterator, a warm-up (excluded), then a fixed number of batches sized in a calibration round
to take about `--seconds`. Before each measurement it waits (up to `--quiet-wait` s) for other
processes to go quiet. The tables report medians; ratios are medians of per-round ratios, with
their min–max over the rounds. Beside images/s every row reports images per CPU-second of this
process and its workers, which other load hardly moves, and how many cores other processes used
meanwhile, and the 1-minute load average before and after its measurements (medians over rounds);
each dataset gives the load average before and after its rounds. Cores per 1,000 images/s is
1,000 ÷ images per CPU-second. A summary table over every dataset and size closes the report.

The starvation check is benchmarks/starvation.py.
"""
import argparse
import logging
import math
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import data_api  # noqa: E402
from baselines import (CeilingSource, from_generator_dataset, python_loop_start, torch_start,  # noqa: E402
                       tutorial_det_dataset)
from measure import CORES, ROOT, SEED, Bench, Source, load_average, run_interleaved, tf_start  # noqa: E402
from report import ROWS, print_summary, report_dataset  # noqa: E402

import tensorflow as tf  # noqa: E402

log = logging.getLogger("benchmarks.throughput")


# ---------------------------------------------------------------------------------------------
# The project's pipeline (rows c, d, e, f): every use of its data API goes through data_api


def project_source(key, title, bench, cfg):
    """A row of the project's own training input, `data_api.train_input` with `cfg`."""
    return Source(key, title, bench, tf_start(lambda: data_api.train_input(cfg, bench.table, bench.workdir, SEED)))


def convert_tfrecords(bench, encoding):
    """Converts the sample with the project's converter into the work folder; returns (dir, seconds)."""
    directory = bench.workdir / f"tfrecords-{bench.name}-{encoding}"
    command = data_api.tfrecord_convert_command(bench.name, encoding, directory, bench.image_size,
                                                bench.workdir / f"hydra-{bench.name}-{encoding}")
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"`{shlex.join(command[1:])}` exited {done.returncode}: {tail[0]}")
    return directory, time.perf_counter() - started


def tfrecord_source(bench, key, encoding, notes):
    """Row d or e: the shards converted, then read by the project's pipeline; None (with a note) if not."""
    if bench.sampled:
        notes[key] = "n/a: training pairs are drawn from image files (no train shards; input_fn reads files)"
        return None
    try:
        directory, seconds = convert_tfrecords(bench, encoding)
        data = data_api.train_input(bench.cfg_with(*data_api.tfrecord_overrides(encoding, directory)), bench.table,
                                    bench.workdir, SEED)
    except Exception as error:  # a converter still being written must not stop the other rows
        notes[key] = f"skipped: {type(error).__name__}: {error}"
        return None
    notes[key + "_convert"] = f"converted in {seconds:.1f} s"
    return Source(key, f"input_fn, source=tfrecord, encoding={encoding}", bench, tf_start(lambda: data))


def cache_source(bench, notes):
    """Row f: the project's pipeline with a memory cache, after the pass that fills it."""
    if bench.sampled:
        notes["f"] = "n/a: input_fn caches no sampled training pairs (train_records)"
        return None
    source = project_source("f", "input_fn, cache=memory (after the filling pass)", bench,
                            bench.cfg_with(*data_api.memory_cache_overrides()))
    fill_batches = math.ceil(len(bench.table) / bench.batch_size) + 1
    stream = source.start()
    started = time.perf_counter()
    for _ in range(fill_batches):
        stream.next_batch()
    rate = fill_batches * source.images_per_batch / (time.perf_counter() - started)
    notes["f_fill"] = f"filling pass: {rate:.0f} images/s"
    stream.close()
    return source


# ---------------------------------------------------------------------------------------------
# The rows of one dataset


def baseline_sources(bench, only, notes):
    """Rows ceiling, cores, a and b (benchmarks/baselines.py)."""
    sources = []
    if "ceiling" in only:
        sources.append(CeilingSource(bench))
    if "cores" in only and CORES > 1:
        sources.append(CeilingSource(bench, all_cores=True))
    if "a" in only:
        sources.append(Source("a", "Python loop + PIL, tf.constant per batch", bench, python_loop_start(bench)))
    if "b" in only:
        try:
            start = torch_start(bench)
        except ImportError:
            notes["b"] = "skipped: torch not installed (pip install -e '.[bench]')"
        else:
            sources.append(Source("b", f"PyTorch {start.torch_version} DataLoader, {CORES} workers + PIL", bench,
                                  start))
    return sources


def pipeline_sources(bench, only, notes):
    """Rows c, d, e and f: the project's own pipeline."""
    sources = []
    if "c" in only:
        sources.append(project_source("c", "input_fn, source=files (decode in tf.data)", bench, bench.cfg))
    for key, encoding in (("d", "encoded"), ("e", "raw")):
        if key in only:
            sources.append(tfrecord_source(bench, key, encoding, notes))
    if "f" in only:
        sources.append(cache_source(bench, notes))
    return [source for source in sources if source]


def tutorial_sources(bench, only):
    """Rows g and h: the datasets' tutorial-style baselines."""
    sources = []
    if "g" in only and bench.name == "lfw_pairs":
        sources.append(Source("g", "from_generator + PIL pair sampler (tutorial)", bench,
                              tf_start(lambda: from_generator_dataset(bench))))
    elif "g" in only and bench.name == "imagenet_det":
        sources.append(Source("g", "tutorial: from_generator, one map: py_function XML + decode_jpeg", bench,
                              tf_start(lambda: tutorial_det_dataset(bench))))
    if "h" in only and bench.name == "imagenet_det":
        sources.append(Source("h", "tutorial, decode in a 2nd map (auto-parallelised by TF 2.21)", bench,
                              tf_start(lambda: tutorial_det_dataset(bench, separate_decode=True))))
    return sources


def build_sources(bench, only, notes):
    """The sources to measure for `bench`, in row order; reasons for the rows left out go to `notes`."""
    sources = baseline_sources(bench, only, notes) + pipeline_sources(bench, only, notes)
    return sources + tutorial_sources(bench, only)


# ---------------------------------------------------------------------------------------------
# The run


def run_dataset(name, image_size, args, only, workdir):
    """Measures and reports one dataset at one image size (None: its default); returns its summary
    entry, or None when it failed."""
    sources = []
    try:
        folder = Path(workdir) / f"{name}-{image_size or 'default'}"
        folder.mkdir()
        bench = Bench(name, args.batch_size, image_size, folder)
        notes = {}
        sources = build_sources(bench, only, notes)
        before = load_average()
        run_interleaved(sources, args.seconds, args.repeats, args.quiet_wait)
        load = (before, load_average())
    except Exception as error:  # one dataset failing (its files changed under us...) spares the others
        log.exception("%s failed", name)
        print(f"\n### {name}: failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
        return None
    finally:
        for source in sources:
            if isinstance(source, CeilingSource):
                source.close()
    return report_dataset(bench, sources, notes, args.repeats, load)


def image_sizes(text):
    """`--image-size`: comma-separated sizes, `default` for each dataset's own (None)."""
    return [None if size == "default" else int(size) for size in text.split(",")]


def throughput(args, command_line):
    only = set(args.only.split(",")) if args.only else set(ROWS)
    unknown = only - set(ROWS)
    if unknown:
        sys.exit(f"--only: unknown rows {', '.join(sorted(unknown))}; choose from {','.join(ROWS)}")
    print(f"# Input pipeline benchmark\n\ncommand: {command_line}")
    print(f"machine: {CORES} cores, tensorflow {tf.__version__}; --seconds {args.seconds}, --repeats {args.repeats}, "
          f"--quiet-wait {args.quiet_wait}; load average {load_average():.1f}")
    print("columns: images/s is the median over repeats (wall clock); ÷ c is the median of per-round ratios to c; "
          "images per CPU-s counts this process and its workers only, so other load hardly moves it; cores busy is "
          "CPU-s per wall-s (the ceiling: of its one pinned core); others' cores is what other processes used "
          "meanwhile")
    summary, failed = [], False
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as workdir:
        for name in args.datasets.split(","):
            absent = data_api.dataset_absent(name)
            if absent:
                print(f"\n### {name}: skipped: {absent}")
                continue
            for image_size in args.image_size:
                started = time.perf_counter()
                entry = run_dataset(name, image_size, args, only, workdir)
                if entry is None:
                    failed = True
                    continue
                summary.append(entry)
                print(f"\n({entry['label']} took {time.perf_counter() - started:.0f} s; load average now "
                      f"{load_average():.1f} -- other processes on the machine show up as noise)")
    print_summary(summary, args)
    print(f"\ncommand: {command_line}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(data_api.DATASETS),
                        help="comma-separated dataset modules; absent ones are reported as skipped")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=image_sizes, default="default,224",
                        help="comma-separated square sizes; default: each dataset's own (conf/dataset)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measurement of one source")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved measurements per source (median)")
    parser.add_argument("--quiet-wait", type=float, default=10.0,
                        help="before each measurement, wait up to this many seconds for other processes to "
                             "use under 0.25 cores (0: never wait)")
    parser.add_argument("--only", default=None, help=f"comma-separated rows among {','.join(ROWS)}")
    return parser.parse_args(argv)


def main(argv=None, program="benchmarks/throughput.py"):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return throughput(args, f"python {program} {shlex.join(argv)}".strip())


if __name__ == "__main__":
    sys.exit(main())
