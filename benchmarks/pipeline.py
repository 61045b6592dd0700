#!/usr/bin/env python
"""Input-pipeline throughput, every input source measured side by side in one run.

    python benchmarks/pipeline.py [--datasets chest_xray,lfw_pairs,imagenet_det] [--batch-size 64]
                                  [--image-size 224] [--seconds 3] [--repeats 3] [--quiet-wait 10]
                                  [--only ceiling,cores,a,b,c,d,e,f,g,h]
    python benchmarks/pipeline.py --starvation [--dataset chest_xray] [--steps 10] [--model resnet_v2_152]
                                  [--batch-size 32] [--image-size 224]

For each dataset module present, on its embedded sample's training split, at one batch and
image size, it measures images/s of:

    ceiling  one-core decode+resize (the pipeline's own graph, module.load, in a sequential map with
             tf.data threading limited to 1, in a subprocess pinned to one CPU) x cores
    cores    the same on every core at once, a pinned subprocess each (a diagnostic: what the cores
             give together; one busy core beside idle ones often runs faster)
    a        a Python loop decoding and resizing with PIL, one tf.constant per batch (the feed_dict way)
    b        the PyTorch DataLoader, num_workers = cores, the same PIL decode and resize
    c        our file pipeline: input_fn(training=True), pipeline.source=files (uint8 batches)
    d, e     pipeline.source=tfrecord with tfrecord.encoding=encoded / raw (converted into a temp dir)
    f        pipeline.cache=memory, after the pass that fills the cache
    g        the dataset's tutorial-style baseline, where it has one: LFW, a Python generator that
             samples pairs and decodes them with PIL through Dataset.from_generator; ImageNet DET, the
             classic from_generator over (image, XML) + tf.py_function XML parsing + decode_jpeg
    h        ImageNet DET only: g with its decode moved to a second map, which TF 2.21 parallelises

a, b, g and h do the same work as c per image: decode, the same crop and resize (PIL's bilinear
filter is antialiased when shrinking, like tf.image.resize(antialias=True)), uint8 out. No row
augments or normalises: the train step does that on the device for every source alike
(data/preprocessing.py).

Every source is measured `--repeats` times, interleaved (round-robin, the order rotated each
round) so that drift and noise on a shared machine hit all of them alike; each measurement is a
fresh iterator, a warm-up (excluded), then a fixed number of batches sized in a calibration round
to take about `--seconds`. Before each measurement it waits (up to `--quiet-wait` s) for other
processes to go quiet. The tables report medians, and ratios are medians of per-round ratios.
Beside images/s it reports images per CPU-second of this process and its workers, which other
load hardly moves, and how many cores other processes used meanwhile.

`--starvation` trains a real model (experiments.trainer.Trainer) fed by the real pipeline and by
one cached batch repeated (`data.take(1).cache().repeat()`, no input cost), in alternating
blocks, and reports the ratio of median step times and the input-wait fraction measured the way
experiments/runner.py does, beside the pipeline's own time per batch.
"""
import argparse
import json
import logging
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and "--ceiling-worker" in sys.argv:
    # Pin before TensorFlow starts, so every thread it makes shares one core (taskset -c N).
    _core = int(sys.argv[sys.argv.index("--core") + 1]) if "--core" in sys.argv else min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_core})
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image  # noqa: E402

from data import images  # noqa: E402
from data.input_fn import dataset_module, input_fn, load_tables, path_columns, records  # noqa: E402
from data.skipped import SkipLog  # noqa: E402

log = logging.getLogger("benchmarks.pipeline")
AUTOTUNE = tf.data.AUTOTUNE
DATASETS = ("chest_xray", "lfw_pairs", "imagenet_det")
ROWS = ("ceiling", "cores", "a", "b", "c", "d", "e", "f", "g", "h")
CORES = len(os.sched_getaffinity(0))
SEED = 42


# ---------------------------------------------------------------------------------------------
# Configuration and the dataset under test


def compose_cfg(dataset, batch_size, image_size, *overrides):
    """The project's config for `dataset`, composed with Hydra as `python run.py` would."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="config", overrides=[f"dataset={dataset}", f"pipeline.batch_size={batch_size}",
                                                        f"pipeline.image_size={image_size}", *overrides])


def dataset_absent(name):
    """Why `name` cannot be benchmarked yet, or None when its module and config are in place."""
    import data as datasets

    if not (ROOT / "data" / f"{name}.py").exists():
        return f"no data/{name}.py"
    if name not in datasets.DATASETS:
        return f"data/{name}.py is not registered in data.DATASETS"
    if not (ROOT / "conf" / "dataset" / f"{name}.yaml").exists():
        return f"no conf/dataset/{name}.yaml"
    return None


class Bench:
    """One dataset at one batch and image size: its config, training table and Python-side twins."""

    def __init__(self, name, batch_size, image_size, workdir):
        self.name, self.batch_size, self.image_size = name, batch_size, image_size
        self.workdir = Path(workdir)
        self.cfg = compose_cfg(name, batch_size, image_size)
        self.module = dataset_module(self.cfg)
        self.spec = self.module.SPEC
        self.table = load_tables(self.cfg, SkipLog())["train"]
        self.sampled = hasattr(self.module, "train_records")
        self.per_example = 2 if self.spec.paired else 1
        self.size = images.configured_size(self.cfg)
        self.method = self.cfg.dataset.resize
        self.crop_fraction = self.cfg.dataset.get("crop_fraction")
        if self.sampled:
            groups = self.table.groupby("person", sort=True).path
            self.people = [list(paths) for _, paths in groups]
            self.with_two = [k for k, paths in enumerate(self.people) if len(paths) >= 2]
        else:
            columns = path_columns(self.table)
            self.rows = list(zip(*(self.table[c] for c in columns)))
            self.labels = [np.asarray(label, np.float32) for label in self.table.label]
            self.order = np.random.default_rng(SEED).permutation(len(self.rows))

    def cfg_with(self, *overrides):
        return compose_cfg(self.name, self.batch_size, self.image_size, *overrides)

    # The Python side (rows a, b, g): the same examples, decoded and resized with PIL.

    def example(self, i):
        """Example i as (paths, label): a table row in a fixed shuffled order, or a drawn pair as
        `train_records` draws them (even i: two images of one person; odd i: two people)."""
        if not self.sampled:
            row = self.order[i % len(self.order)]
            return self.rows[row], self.labels[row]
        rng = np.random.default_rng([SEED, i])
        if i % 2 == 0:
            paths = self.people[self.with_two[rng.integers(len(self.with_two))]]
            first, second = rng.choice(len(paths), 2, replace=False)
            return (paths[first], paths[second]), np.ones([1], np.float32)
        a, b = rng.choice(len(self.people), 2, replace=False)
        return (self.people[a][rng.integers(len(self.people[a]))],
                self.people[b][rng.integers(len(self.people[b]))]), np.zeros([1], np.float32)

    def pil_image(self, path):
        """PIL's decode and the same crop and resize as data.images: uint8 (height, width, channels)."""
        height, width = self.size
        with Image.open(path) as image:
            image = image.convert("L" if self.spec.channels == 1 else "RGB")
        if self.crop_fraction:
            # tf.image.central_crop's box.
            top = int((image.height - image.height * self.crop_fraction) / 2)
            left = int((image.width - image.width * self.crop_fraction) / 2)
            image = image.crop((left, top, image.width - left, image.height - top))
        if self.method == "crop_or_pad":
            pixels = _crop_or_pad(np.asarray(image), height, width)
        else:
            # PIL's bilinear filter widens its support when shrinking: the antialiased resize.
            pixels = np.array(image.resize((width, height), Image.BILINEAR))  # a writable copy, as torch wants
        return pixels.reshape(height, width, self.spec.channels)

    def pil_example(self, i):
        paths, label = self.example(i)
        features = tuple(self.pil_image(path) for path in paths)
        return (features if self.spec.paired else features[0]), label


def _crop_or_pad(pixels, height, width):
    """tf.image.resize_with_crop_or_pad in NumPy: centre crop where larger, centre zero-pad where smaller."""
    h, w = pixels.shape[:2]
    top, left = max((h - height) // 2, 0), max((w - width) // 2, 0)
    pixels = pixels[top:top + height, left:left + width]
    h, w = pixels.shape[:2]
    out = np.zeros((height, width) + pixels.shape[2:], pixels.dtype)
    top, left = (height - h) // 2, (width - w) // 2
    out[top:top + h, left:left + w] = pixels
    return out


# ---------------------------------------------------------------------------------------------
# Input sources. A measurement opens one fresh Stream (an iterator) of a source and closes it after.

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid):
    """User + system CPU seconds of a live process (all its threads), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def system_busy_seconds():
    """CPU seconds all processes of the machine have been busy (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = [int(value) for value in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


class Stream:
    """One iterator of a source: `next_batch()`, `close()`, and the worker processes it runs on."""

    def __init__(self, next_batch, close=None, worker_pids=None):
        self.next_batch = next_batch
        self._close = close
        self._worker_pids = worker_pids

    def cpu_seconds(self):
        """CPU time used so far by this process (every thread) and the stream's worker processes."""
        pids = self._worker_pids() if self._worker_pids else ()
        return time.process_time() + sum(process_cpu_seconds(pid) for pid in pids)

    def close(self):
        if self._close:
            self._close()


class Source:
    """An input source; `start()` opens a Stream. Wall-clock images/s and images per CPU-second per round."""

    def __init__(self, key, title, bench, start=None):
        self.key, self.title, self.bench = key, title, bench
        self._start = start
        self.batches = None  # fixed per measurement, set by calibration
        self.rates, self.cpu_rates, self.busy, self.others = [], [], [], []
        self.wall_scale = 1  # the ceiling reports one core's wall time divided by the cores

    @property
    def images_per_batch(self):
        return self.bench.batch_size * self.bench.per_example

    def start(self) -> Stream:
        return self._start()

    def calibrate(self, seconds):
        """Batches in about `seconds`, after a short warm-up; returns (batches, elapsed)."""
        stream = self.start()
        try:
            for _ in range(2):
                stream.next_batch()
            count, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds or count < 2:
                stream.next_batch()
                count += 1
            return count, time.perf_counter() - started
        finally:
            stream.close()

    def measure(self, warmup, batches):
        """(wall seconds, CPU seconds, other processes' busy cores) for `batches` batches of a fresh
        stream, after `warmup` batches."""
        stream = self.start()
        try:
            for _ in range(warmup):
                stream.next_batch()
            cpu, system, started = stream.cpu_seconds(), system_busy_seconds(), time.perf_counter()
            for _ in range(batches):
                stream.next_batch()
            wall, cpu = time.perf_counter() - started, stream.cpu_seconds() - cpu
            return wall, cpu, max(system_busy_seconds() - system - cpu, 0.0) / wall
        finally:
            stream.close()


def tf_start(make_dataset):
    """A start() over a tf.data pipeline; the dataset object is built once (so a memory cache persists)."""
    holder = {}

    def start():
        if "data" not in holder:
            holder["data"] = make_dataset()
        iterators = [iter(holder["data"])]
        # Dropping the last reference to the iterator stops its background threads.
        return Stream(lambda: next(iterators[0]), iterators.clear)

    return start


def python_loop_start(bench):
    """(a) The feed_dict way: a Python loop decodes a batch with PIL, then hands it to TF."""

    def start():
        counter = iter(range(10**12))

        def next_batch():
            examples = [bench.pil_example(next(counter)) for _ in range(bench.batch_size)]
            features = [e[0] for e in examples]
            if bench.spec.paired:
                stacked = tuple(tf.constant(np.stack(part)) for part in zip(*features))
            else:
                stacked = tf.constant(np.stack(features))
            return stacked, tf.constant(np.stack([e[1] for e in examples]))

        return Stream(next_batch)

    return start


class _TorchExamples:
    """A map-style torch Dataset of example i, decoded with PIL in the worker processes."""

    def __init__(self, bench):
        self.bench = bench

    def __len__(self):
        return 10**9

    def __getitem__(self, i):
        return self.bench.pil_example(i)


def torch_start(bench):
    """(b) torch.utils.data.DataLoader, num_workers = cores, each batch handed to TF."""
    import torch
    from torch.utils.data import DataLoader

    loader = DataLoader(_TorchExamples(bench), batch_size=bench.batch_size, shuffle=False, num_workers=CORES,
                        drop_last=True)

    def start():
        iterator = iter(loader)

        def next_batch():
            batch = next(iterator)
            return tf.nest.map_structure(lambda t: tf.constant(t.numpy()), batch)

        def close():
            iterator._shutdown_workers()

        return Stream(next_batch, close, lambda: [worker.pid for worker in iterator._workers])

    start.torch_version = torch.__version__
    return start


def from_generator_dataset(bench):
    """(g, LFW) The tutorial way: a Python generator samples pairs and decodes them with PIL."""
    height, width = bench.size
    image = tf.TensorSpec([height, width, bench.spec.channels], tf.uint8)
    features = (image, image) if bench.spec.paired else image
    label_shape = np.shape(bench.example(0)[1])

    def generate():
        i = 0
        while True:
            yield bench.pil_example(i)
            i += 1

    data = tf.data.Dataset.from_generator(
        generate, output_signature=(features, tf.TensorSpec(label_shape, tf.float32)))
    return data.batch(bench.batch_size, drop_remainder=True).prefetch(AUTOTUNE)


def annotation_path(image_path):
    """ILSVRC's XML for an image: the same relative path under Annotations/DET; '' when it has none."""
    path = Path(image_path)
    parts = list(path.parts)
    for k in range(len(parts) - 2):
        if parts[k] == "Data" and parts[k + 1] == "DET":
            parts[k] = "Annotations"
            xml = Path(*parts).with_suffix(".xml")
            return str(xml) if xml.exists() else ""
    return ""


def tutorial_det_dataset(bench, separate_decode=False):
    """(g, ImageNet DET) The classic tutorial pipeline, faithfully: from_generator over (image, XML)
    paths, then one sequential map that parses the XML with tf.py_function (ElementTree, largest
    box -> label), reads the image, tf.io.decode_jpeg and the same crop-or-pad resize; then batch
    and prefetch. Like every row, it hands uint8 batches on (a tutorial would also normalise in its
    map; that is left to the step).

    (h) `separate_decode`: the same, with the decode in a second map of its own. That map holds
    no py_function, so TF 2.21's default map_parallelization runs it in parallel: the tutorial
    as it runs today when written that way, and a much harder baseline."""
    import xml.etree.ElementTree as ElementTree

    wnids = {wnid: k for k, wnid in enumerate(bench.module.WNIDS)}
    background = len(wnids)
    pairs = [(path, annotation_path(path)) for path in np.asarray(bench.table.path)[bench.order]]
    height, width = bench.size

    def generate():
        while True:
            for image_path, xml_path in pairs:
                yield image_path, xml_path

    def parse_xml(xml_path):
        xml_path = xml_path.numpy().decode()
        if not xml_path:
            return np.int32(background)
        root = ElementTree.parse(xml_path).getroot()
        label, largest = background, 0.0
        for obj in root.findall("object"):
            box = obj.find("bndbox")
            area = ((float(box.find("xmax").text) - float(box.find("xmin").text)) *
                    (float(box.find("ymax").text) - float(box.find("ymin").text)))
            if area > largest:
                label, largest = wnids.get(obj.find("name").text.strip(), background), area
        return np.int32(label)

    def parse(image_path, xml_path):
        label = tf.py_function(parse_xml, [xml_path], tf.int32)
        label.set_shape([])
        return image_path, label

    def decode(image_path, label):
        image = tf.io.decode_jpeg(tf.io.read_file(image_path), channels=3)
        return tf.image.resize_with_crop_or_pad(image, height, width), label

    data = tf.data.Dataset.from_generator(generate, output_signature=(tf.TensorSpec([], tf.string),
                                                                      tf.TensorSpec([], tf.string)))
    if separate_decode:
        data = data.map(parse).map(decode)
    else:
        data = data.map(lambda image_path, xml_path: decode(*parse(image_path, xml_path)))
    return data.batch(bench.batch_size, drop_remainder=True).prefetch(1)


class CeilingSource(Source):
    """One-core decode+resize in a pinned subprocess (`--ceiling-worker`), reported x cores.

    With `all_cores`, one such subprocess per core, all decoding at once (the `cores` row): what
    the machine really gives when every core is busy, which the ceiling's one busy core (with the
    others idle, so often clocked higher) overstates.
    """

    def __init__(self, bench, all_cores=False):
        if all_cores:
            super().__init__("cores", f"decode+resize on all {CORES} cores at once (a pinned subprocess each)", bench)
        else:
            super().__init__("ceiling", f"one-core decode+resize x {CORES} cores (pinned subprocess)", bench)
        # Busy cores = CPU time per worker / this wall time: the one core of the ceiling, all of them here.
        self.wall_scale = 1 if all_cores else CORES
        command = [sys.executable, str(Path(__file__).resolve()), "--ceiling-worker", "--dataset", bench.name,
                   "--batch-size", str(bench.batch_size), "--image-size", str(bench.image_size)]
        cores = sorted(os.sched_getaffinity(0)) if all_cores else [min(os.sched_getaffinity(0))]
        self.processes = [subprocess.Popen(command + ["--core", str(core)], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True, cwd=ROOT) for core in cores]
        self._ask({"op": "ready"})

    def _ask(self, request):
        """Sends `request` to every worker at once and returns their replies."""
        for process in self.processes:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
        replies = []
        for process in self.processes:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"a ceiling worker for {self.bench.name} exited ({process.wait()})")
            replies.append(json.loads(line))
        return replies

    def calibrate(self, seconds):
        reply = self._ask({"op": "calibrate", "seconds": seconds})[0]
        return reply["batches"], reply["seconds"] / CORES

    def measure(self, warmup, batches):
        # One core: its wall time divided by the cores, the rate all cores would reach decoding alone.
        # All cores: the slowest worker's time for its batches, divided by the workers that ran meanwhile,
        # and the workers' mean CPU time, as the caller counts one worker's batches.
        # This process only waits meanwhile, so a worker's count of others' cores is right (less the
        # other workers').
        replies = self._ask({"op": "measure", "warmup": warmup, "batches": batches})
        others = min(reply["others"] for reply in replies) - (len(replies) - 1)
        return (max(reply["seconds"] for reply in replies) / CORES,
                statistics.mean(reply["cpu_seconds"] for reply in replies), max(others, 0.0))

    def close(self):
        for process in self.processes:
            if process.poll() is None:
                process.stdin.close()
                process.wait(timeout=30)


def ceiling_worker(args):
    """The pinned subprocess: module.load sequentially on one core, answering the parent's requests."""
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    cfg = compose_cfg(args.dataset, args.batch_size, args.image_size)
    module = dataset_module(cfg)
    table = load_tables(cfg, SkipLog())["train"]
    if hasattr(module, "train_records"):
        data = module.train_records(table, cfg, SEED)
    else:
        data = records(table).shuffle(len(table), SEED, reshuffle_each_iteration=True).repeat()
    data = data.map(lambda record: module.load(record, cfg), num_parallel_calls=1)
    data = data.batch(args.batch_size)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.experimental_optimization.map_parallelization = False
    options.autotune.enabled = False
    iterator = iter(data.with_options(options))
    next(iterator)  # trace and first batch
    source = Source("ceiling", "", None, start=lambda: Stream(lambda: next(iterator)))
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "calibrate":
            batches, seconds = source.calibrate(request["seconds"])
            reply = {"batches": batches, "seconds": seconds}
        elif request["op"] == "measure":
            seconds, cpu_seconds, others = source.measure(request["warmup"], request["batches"])
            reply = {"seconds": seconds, "cpu_seconds": cpu_seconds, "others": others}
        else:
            reply = {"ok": True}
        print(json.dumps(reply), flush=True)


# ---------------------------------------------------------------------------------------------
# TFRecords


def convert_tfrecords(bench, encoding):
    """Converts the sample with `python -m data.tfrecords` into the work folder; returns (dir, seconds)."""
    directory = bench.workdir / f"tfrecords-{bench.name}-{encoding}"
    command = [sys.executable, "-m", "data.tfrecords", f"dataset={bench.name}", f"tfrecord.encoding={encoding}",
               f"tfrecord.dir={directory}", f"pipeline.image_size={bench.image_size}",
               f"hydra.run.dir={bench.workdir / ('hydra-' + bench.name + '-' + encoding)}"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"`{shlex.join(command[1:])}` exited {done.returncode}: {tail[0]}")
    return directory, time.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# The throughput run


def build_sources(bench, only, notes):
    """The sources to measure for `bench`, in row order; reasons for the rows left out go to `notes`."""
    cfg = bench.cfg
    sources = []

    def wanted(key):
        return key in only

    if wanted("ceiling"):
        sources.append(CeilingSource(bench))
    if wanted("cores") and CORES > 1:
        sources.append(CeilingSource(bench, all_cores=True))
    if wanted("a"):
        sources.append(Source("a", "Python loop + PIL, tf.constant per batch", bench, python_loop_start(bench)))
    if wanted("b"):
        try:
            start = torch_start(bench)
        except ImportError:
            notes["b"] = "skipped: torch not installed (pip install -e '.[bench]')"
        else:
            sources.append(Source("b", f"PyTorch {start.torch_version} DataLoader, {CORES} workers + PIL", bench,
                                  start))
    if wanted("c"):
        sources.append(Source("c", "input_fn, source=files (decode in tf.data)", bench, tf_start(
            lambda: input_fn(cfg, bench.table, training=True, split="train", model_dir=bench.workdir, seed=SEED))))
    for key, encoding in (("d", "encoded"), ("e", "raw")):
        if not wanted(key):
            continue
        if bench.sampled:
            notes[key] = "n/a: training pairs are drawn from image files (no train shards; input_fn reads files)"
            continue
        try:
            directory, seconds = convert_tfrecords(bench, encoding)
            tf_cfg = bench.cfg_with("pipeline.source=tfrecord", f"tfrecord.encoding={encoding}",
                                    f"tfrecord.dir={directory}")
            data = input_fn(tf_cfg, bench.table, training=True, split="train", model_dir=bench.workdir, seed=SEED)
        except Exception as error:  # a converter still being written must not stop the other rows
            notes[key] = f"skipped: {type(error).__name__}: {error}"
            continue
        sources.append(Source(key, f"input_fn, source=tfrecord, encoding={encoding}", bench,
                              tf_start(lambda data=data: data)))
        notes[key + "_convert"] = f"converted in {seconds:.1f} s"
    if wanted("f"):
        if bench.sampled:
            notes["f"] = "n/a: input_fn caches no sampled training pairs (train_records)"
        else:
            cache_cfg = bench.cfg_with("pipeline.cache=memory")
            source = Source("f", "input_fn, cache=memory (after the filling pass)", bench, tf_start(
                lambda: input_fn(cache_cfg, bench.table, training=True, split="train", model_dir=bench.workdir,
                                 seed=SEED)))
            fill_batches = math.ceil(len(bench.table) / bench.batch_size) + 1
            stream = source.start()
            started = time.perf_counter()
            for _ in range(fill_batches):
                stream.next_batch()
            notes["f_fill"] = (f"filling pass: {fill_batches * source.images_per_batch / (time.perf_counter() - started):.0f}"
                               f" images/s")
            stream.close()
            sources.append(source)
    if wanted("g"):
        if bench.name == "lfw_pairs":
            sources.append(Source("g", "from_generator + PIL pair sampler (tutorial)", bench,
                                  tf_start(lambda: from_generator_dataset(bench))))
        elif bench.name == "imagenet_det":
            sources.append(Source("g", "tutorial: from_generator, one map: py_function XML + decode_jpeg", bench,
                                  tf_start(lambda: tutorial_det_dataset(bench))))
    if wanted("h") and bench.name == "imagenet_det":
        sources.append(Source("h", "tutorial, decode in a 2nd map (auto-parallelised by TF 2.21)", bench,
                              tf_start(lambda: tutorial_det_dataset(bench, separate_decode=True))))
    return sources


def others_busy(window=0.5):
    """Cores that other processes keep busy now, sampled over `window` seconds while this one idles."""
    system, own = system_busy_seconds(), time.process_time()
    time.sleep(window)
    return max(system_busy_seconds() - system - (time.process_time() - own), 0.0) / window


def wait_for_quiet(max_wait, threshold=0.25):
    """Waits, up to `max_wait` seconds, for a moment when other processes use under `threshold` cores;
    returns whether it came.

    The machine may be shared: a measurement taken while another job runs says little about the
    pipeline, and the interleaving and medians cancel only noise that comes and goes."""
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline:
        if others_busy() < threshold:
            return True
    return False


def run_interleaved(sources, seconds, repeats, quiet_wait=0.0):
    """Calibration round, then `repeats` rounds of every source, the order rotated each round."""
    for source in sources:
        batches, elapsed = source.calibrate(seconds / 2)
        source.batches = max(2, round(batches * seconds / max(elapsed, 1e-9)))
    missed = 0
    for round_number in range(repeats):
        shift = round_number % len(sources)
        for source in sources[shift:] + sources[:shift]:
            if quiet_wait > 0 and missed < 3:
                # After three waits in a row in vain the machine is busy for good: stop waiting.
                missed = 0 if wait_for_quiet(quiet_wait) else missed + 1
            warmup = max(2, math.ceil(source.batches / 5))
            elapsed, cpu, others = source.measure(warmup, source.batches)
            source.others.append(others)
            source.rates.append(source.batches * source.images_per_batch / elapsed)
            source.cpu_rates.append(source.batches * source.images_per_batch / max(cpu, 1e-9))
            source.busy.append(cpu / (elapsed * source.wall_scale))


def median(source):
    return statistics.median(source.rates) if source and source.rates else None


def target_line(name, value, target, op=">="):
    if value is None:
        return f"  {name:<26} n/a (not measured)"
    if target is None:
        return f"  {name:<26} {value:8.2f}"
    verdict = "PASS" if (value >= target if op == ">=" else value <= target) else "MISS"
    return f"  {name:<26} {value:8.2f}   target {op.replace('>=', '≥').replace('<=', '≤')} {target:<5g} {verdict}"


def paired_ratio(by_key, top, bottom):
    """Median over rounds of top ÷ bottom, each round's two measurements taken minutes apart at most,
    so load that comes and goes on a shared machine cancels better than in a ratio of medians."""
    if top not in by_key or bottom not in by_key:
        return None
    return statistics.median(x / y for x, y in zip(by_key[top].rates, by_key[bottom].rates))


def report_dataset(bench, sources, notes, repeats):
    by_key = {source.key: source for source in sources}
    rate = {key: median(source) for key, source in by_key.items()}
    c = rate.get("c")
    column = path_columns(bench.table)[0]
    with Image.open(bench.table[column].iloc[0]) as image:
        example_image = f"{image.width}x{image.height} {image.format}"
    height, width = bench.size
    what = "images (pairs drawn from them)" if bench.spec.paired else "images"
    print(f"\n### {bench.name}: {example_image} sources -> {height}x{width}, batch {bench.batch_size}"
          f"{' pairs' if bench.spec.paired else ''}, {len(bench.table)} training {what}; "
          f"median of {repeats} interleaved repeats\n")
    header = ("| row | input source | images/s | min–max |" + (" pairs/s |" if bench.spec.paired else "") +
              " ÷ c | images per CPU-s | cores busy | others' cores |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for key in ROWS:
        if key in by_key:
            source = by_key[key]
            value = rate[key]
            spread = f"{min(source.rates):,.0f}–{max(source.rates):,.0f}"
            pairs = f" {value / 2:,.0f} |" if bench.spec.paired else ""
            vs_c = f"{value / c:.2f}" if c else "–"
            per_cpu = statistics.median(source.cpu_rates)
            busy = statistics.median(source.busy)
            others = statistics.median(source.others)
            print(f"| {key} | {source.title} | {value:,.0f} | {spread} |{pairs} {vs_c} | {per_cpu:,.0f} | "
                  f"{busy:.2f} | {others:.2f} |")
        elif key in notes:
            print(f"| {key} | {notes[key]} | – | – |" + (" – |" if bench.spec.paired else "") + " – | – | – | – |")
    extra = [f"{key[0]}: {notes[key]}" for key in ("d_convert", "e_convert", "f_fill") if key in notes]
    if extra:
        print("\n(" + "; ".join(extra) + ")")
    chest = bench.name == "chest_xray"
    print(f"\nratios ({bench.name}; median of per-round ratios):")
    print(target_line("c ÷ ceiling", paired_ratio(by_key, "c", "ceiling"), 0.8 if bench.spec.paired else 0.85))
    if "cores" in by_key:
        print(f"  {'c ÷ cores':<26} {paired_ratio(by_key, 'c', 'cores'):8.2f}   (diagnostic: c against every core "
              f"decoding at once; cores ÷ ceiling {paired_ratio(by_key, 'cores', 'ceiling'):.2f})")
    print(target_line("c ÷ a", paired_ratio(by_key, "c", "a"), 3 if chest else 4))
    print(target_line("c ÷ b", paired_ratio(by_key, "c", "b"), 1.3))
    if chest and bench.image_size == 224:
        print(target_line("e ÷ c", paired_ratio(by_key, "e", "c"), 30))
    else:
        print(target_line("e ÷ c", paired_ratio(by_key, "e", "c"), None))
    print(target_line("d ÷ c", paired_ratio(by_key, "d", "c"), None))
    print(target_line("f ÷ c", paired_ratio(by_key, "f", "c"), None))
    if bench.name in ("lfw_pairs", "imagenet_det"):
        print(target_line("c ÷ g", paired_ratio(by_key, "c", "g"), 3))
    if bench.name == "imagenet_det":
        print(target_line("c ÷ h", paired_ratio(by_key, "c", "h"), None))
    if bench.spec.paired and c:
        print(f"  pair pipeline c: {c / 2:,.0f} pairs/s = {c:,.0f} images/s (two decodes per pair)")
    if "c" in by_key and "ceiling" in by_key:
        # CPU time is immune to other processes' load: how much work per image c adds to the bare decode.
        efficiency = statistics.median(by_key["c"].cpu_rates) / statistics.median(by_key["ceiling"].cpu_rates)
        print(f"  {'c ÷ ceiling per CPU-second':<26} {efficiency:8.2f}   (diagnostic: c's CPU cost per image vs "
              f"the bare one-core decode+resize, unaffected by other load)")
    return rate


def throughput(args, command_line):
    only = set(args.only.split(",")) if args.only else set(ROWS)
    unknown = only - set(ROWS)
    if unknown:
        sys.exit(f"--only: unknown rows {', '.join(sorted(unknown))}; choose from {','.join(ROWS)}")
    print(f"# Input pipeline benchmark\n\ncommand: {command_line}")
    print(f"machine: {CORES} cores, tensorflow {tf.__version__}; --seconds {args.seconds}, --repeats {args.repeats}, "
          f"--quiet-wait {args.quiet_wait}; load average {os.getloadavg()[0]:.1f}")
    print("columns: images/s is the median over repeats (wall clock); images per CPU-s counts this process and its "
          "workers only, so other load hardly moves it; cores busy is CPU-s per wall-s (the ceiling: of its one "
          "pinned core); others' cores is what other processes used meanwhile")
    summary, failed = {}, False
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as workdir:
        for name in args.datasets.split(","):
            absent = dataset_absent(name)
            if absent:
                print(f"\n### {name}: skipped: {absent}")
                continue
            started = time.perf_counter()
            sources = []
            try:
                bench = Bench(name, args.batch_size, args.image_size, workdir)
                notes = {}
                sources = build_sources(bench, only, notes)
                run_interleaved(sources, args.seconds, args.repeats, args.quiet_wait)
            except Exception as error:  # one dataset failing (its files changed under us...) spares the others
                log.exception("%s failed", name)
                print(f"\n### {name}: failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
                failed = True
                continue
            finally:
                for source in sources:
                    if isinstance(source, CeilingSource):
                        source.close()
            summary[name] = (report_dataset(bench, sources, notes, args.repeats), notes,
                             {s.key: s.title for s in sources})
            print(f"\n({name} took {time.perf_counter() - started:.0f} s; load average now "
                  f"{os.getloadavg()[0]:.1f} -- other processes on the machine show up as noise)")
    print_summary(summary, args)
    print(f"\ncommand: {command_line}")
    return 1 if failed else 0


def print_summary(summary, args):
    if not summary:
        return
    names = list(summary)
    titles = {}
    for _, _, source_titles in summary.values():
        for key, title in source_titles.items():
            titles.setdefault(key, title)
    print(f"\n## Which input source to use ({CORES} cores, {args.image_size}x{args.image_size}, "
          f"batch {args.batch_size}; images/s and × the file pipeline c)\n")
    print("| input source | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for key in ROWS:
        if key not in titles and not any(key in notes for _, notes, _ in summary.values()):
            continue
        cells = []
        for name in names:
            rate, notes, _ = summary[name]
            if key in rate and rate[key]:
                c = rate.get("c")
                cells.append(f"{rate[key]:,.0f} ({rate[key] / c:.2f}×)" if c else f"{rate[key]:,.0f}")
            else:
                cells.append(notes.get(key, "–").split(":")[0])
        title = {"g": "tutorial baseline (LFW: from_generator + PIL; DET: from_generator + py_function XML)",
                 "cores": f"decode+resize on all {CORES} cores at once",
                 "h": "DET tutorial, decode in a 2nd map (auto-parallelised)"}.get(
            key, titles.get(key, {"b": "PyTorch DataLoader + PIL", "d": "TFRecord encoded", "e": "TFRecord raw",
                                  "f": "cache=memory"}.get(key, key)))
        print(f"| {key}: {title} | " + " | ".join(cells) + " |")


# ---------------------------------------------------------------------------------------------
# Starvation check


def starvation(args, command_line):
    """Median step time fed by the real pipeline ÷ fed by one cached batch, and the input-wait fraction."""
    import keras

    from experiments import strategies
    from experiments.runner import check_config
    from experiments.trainer import Trainer

    batch_size = args.batch_size
    overrides = [f"model={args.model}"] if args.model else []
    cfg = compose_cfg(args.dataset, batch_size, args.image_size, *overrides)
    module = dataset_module(cfg)
    check_config(cfg, module.SPEC)
    print(f"# Starvation check\n\ncommand: {command_line}")
    print(f"dataset {args.dataset}, model {cfg.model.name} via experiments.trainer.Trainer, "
          f"{args.image_size}x{args.image_size}, batch {batch_size}, {args.steps} measured steps per feed, "
          f"{CORES} cores")
    keras.utils.set_random_seed(cfg.seed)
    table = load_tables(cfg, SkipLog())["train"]
    with tempfile.TemporaryDirectory(prefix="starvation-") as workdir:
        real = input_fn(cfg, table, training=True, split="train", model_dir=workdir, seed=SEED)
        cached = real.take(1).cache().repeat()

        def pipeline_alone(batches=20):
            iterator = iter(real)
            for _ in range(max(2, batches // 5)):
                next(iterator)
            started = time.perf_counter()
            for _ in range(batches):
                next(iterator)
            return (time.perf_counter() - started) / batches

        alone = [pipeline_alone()]
        strategy = strategies.make_strategy(cfg.strategy)
        trainer = Trainer(cfg, module.SPEC, strategy, images.configured_size(cfg))
        times = {"real": [], "cached": []}
        waits = {"real": [], "cached": []}
        cpu = {"real": [], "cached": []}
        others = {"real": [], "cached": []}

        def step(iterator, feed=None):
            own, system = time.process_time(), system_busy_seconds()
            started = time.perf_counter()
            features, labels, weights = next(iterator)
            fetched = time.perf_counter()
            loss, _, _ = trainer.train_step(features, labels, weights)
            loss = float(loss)  # waits for the step, as runner.py does
            finished = time.perf_counter()
            if feed:
                times[feed].append(finished - started)
                waits[feed].append(fetched - started)
                cpu[feed].append(time.process_time() - own)
                others[feed].append(max(system_busy_seconds() - system - cpu[feed][-1], 0) / (finished - started))

        cached_iterator = iter(cached)
        started = time.perf_counter()
        step(cached_iterator)  # the trace; both feeds share one element_spec, so one trace serves both
        print(f"trace + first step: {time.perf_counter() - started:.1f} s", flush=True)
        # Blocks of steps, alternating feeds, so load from other processes falls on both alike. A real
        # block opens a fresh iterator and deletes it after, so its decoding overlaps only its own steps;
        # its first step (the pipeline starting and filling its buffers) is not counted.
        block = min(args.steps, 5)
        while len(times["real"]) < args.steps:
            count = min(block, args.steps - len(times["real"]))
            real_iterator = iter(real)
            step(real_iterator)
            for _ in range(count):
                step(real_iterator, "real")
            del real_iterator
            for _ in range(count):
                step(cached_iterator, "cached")
        alone.append(pipeline_alone())
    real_step, cached_step = statistics.median(times["real"]), statistics.median(times["cached"])
    per_batch = statistics.median(alone)
    print()
    print("| feed | median step s | min–max | input_wait_fraction | CPU-s per step | others' cores |")
    print("|---|---|---|---|---|---|")
    for feed, title in (("real", "real pipeline (input_fn, files)"), ("cached", "one cached batch repeated")):
        fraction = sum(waits[feed]) / sum(times[feed])
        print(f"| {title} | {statistics.median(times[feed]):.3f} | {min(times[feed]):.3f}–{max(times[feed]):.3f} | "
              f"{fraction:.3f} | {statistics.median(cpu[feed]):.2f} | {statistics.median(others[feed]):.2f} |")
    print(f"\npipeline alone: {per_batch:.3f} s per batch of {batch_size} "
          f"({batch_size / per_batch:,.0f} images/s); the model step (fed from cache) takes {cached_step:.3f} s, "
          f"{cached_step / per_batch:.1f}× as long" + ("" if cached_step >= per_batch else
                                                         " -- SHORTER than the pipeline: input-bound by design"))
    print(target_line("real ÷ cached step time", real_step / cached_step, 1.05, "<="))
    extra_cpu = statistics.median(cpu["real"]) - statistics.median(cpu["cached"])
    print(f"  (the real feed's decoding shares the cores with the model: {extra_cpu:+.2f} CPU-s per step, "
          f"{extra_cpu / statistics.median(cpu['cached']):+.1%} of the step's own CPU time)")
    fraction = sum(waits["real"]) / sum(times["real"])
    band = "not input-bound" if fraction < 0.05 else "moderately input-bound" if fraction < 0.2 else "highly input-bound"
    print(target_line("input_wait_fraction (real)", fraction, 0.05, "<=") + f"   ({band})")
    print(f"\ncommand: {command_line}")


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help="comma-separated dataset modules; absent ones are reported as skipped")
    parser.add_argument("--batch-size", type=int, default=None, help="default 64 (32 with --starvation)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one measurement of one source")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved measurements per source (median)")
    parser.add_argument("--quiet-wait", type=float, default=10.0,
                        help="before each measurement, wait up to this many seconds for other processes to "
                             "use under 0.25 cores (0: never wait)")
    parser.add_argument("--only", default=None, help=f"comma-separated rows among {','.join(ROWS)}")
    parser.add_argument("--starvation", action="store_true", help="the starvation check instead of throughput")
    parser.add_argument("--dataset", default="chest_xray", help="the dataset of --starvation")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per feed with --starvation")
    parser.add_argument("--model", default=None,
                        help="model of --starvation (default: the dataset's own, resnet_v2_152 for chest_xray)")
    parser.add_argument("--ceiling-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--core", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = 32 if args.starvation else 64
    return args


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.ceiling_worker:
        ceiling_worker(args)
        return
    command_line = "python benchmarks/pipeline.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.starvation:
        starvation(args, command_line.strip())
    else:
        sys.exit(throughput(args, command_line.strip()))


if __name__ == "__main__":
    main()
