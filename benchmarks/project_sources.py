"""The project's own input as measured rows: the code under test, reached only through data_api.

    c        input_fn(training=True), pipeline.source=files (uint8 batches); drawn pairs (LFW) with
             pipeline.image_table_mb=0, so they decode their files
    d, e     pipeline.source=tfrecord with tfrecord.encoding=encoded / raw (converted into a work folder)
    f        pipeline.cache=memory, after the pass that fills the cache; drawn pairs: the image table
             (data/image_table.py), LFW's default
    plain, guarded   the training records loaded by input_fn's per-record load, bare and inside the
             decode guard (`input guard`)

A row that cannot be built (no TFRecords for drawn pairs, a converter that fails) leaves a note
saying why instead, so the other rows still run.
"""
import math
import shlex
import subprocess
import time

import tensorflow as tf

from benchmarks import data_api
from benchmarks.measure import SEED, Source, tf_start

AUTOTUNE = tf.data.AUTOTUNE
# The config overrides under which drawn training pairs decode their image files (no image table).
FILES_ONLY = ("pipeline.image_table_mb=0",)


def project_source(key, title, bench, cfg):
    """A row of the project's own training input, `data_api.train_input` with `cfg`."""
    return Source(key, title, bench, tf_start(lambda: data_api.train_input(cfg, bench.table, bench.workdir, SEED)))


def convert_tfrecords(bench, encoding):
    """Converts the sample with the project's converter into the work folder; returns (dir, seconds)."""
    directory = bench.workdir / f"tfrecords-{bench.name}-{encoding}"
    command = data_api.tfrecord_convert_command(bench.name, encoding, directory, bench.image_size,
                                                bench.workdir / f"hydra-{bench.name}-{encoding}")
    started = time.perf_counter()
    done = subprocess.run(command, cwd=data_api.ROOT, capture_output=True, text=True)
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
    """Row f: the project's pipeline with a memory cache, after the pass that fills it; for drawn pairs (LFW),
    the image table, which input_fn fills before the first draw (its default within pipeline.image_table_mb)."""
    if bench.sampled:
        return project_source("f", "input_fn, cache=memory: pairs gathered from the image table (decoded once)",
                              bench, bench.cfg_with(*data_api.memory_cache_overrides()))
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


def pipeline_sources(bench, only, notes):
    """Rows c, d, e and f among `only`, in row order; reasons for the rows left out go to `notes`."""
    sources = []
    if "c" in only:
        # Drawn pairs decode their files only without the image table (data/image_table.py), LFW's default.
        cfg = bench.cfg_with(*FILES_ONLY) if bench.sampled else bench.cfg
        sources.append(project_source("c", "input_fn, source=files (decode in tf.data)", bench, cfg))
    for key, encoding in (("d", "encoded"), ("e", "raw")):
        if key in only:
            sources.append(tfrecord_source(bench, key, encoding, notes))
    if "f" in only:
        sources.append(cache_source(bench, notes))
    return [source for source in sources if source]


def guard_sources(bench):
    """The same training records loaded in one parallel map, bare (`plain`) and guarded (`guarded`)."""
    records, source = data_api.training_records(bench.cfg, bench.table)

    def pipeline(guarded):
        loaded = records.map(data_api.record_load(source, guarded), num_parallel_calls=AUTOTUNE)
        return loaded.batch(bench.batch_size).prefetch(AUTOTUNE)

    return [Source("plain", "input_fn's per-record load, parallel map", bench, tf_start(lambda: pipeline(False))),
            Source("guarded", "the same inside the decode guard (data/integrity/unreadable.py)", bench,
                   tf_start(lambda: pipeline(True)))]

