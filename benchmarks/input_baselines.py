"""The independent baselines the project's input is measured against. None of them runs the project's
own decode: each is written from scratch, as someone without this project would, so a ceiling is never
the code under test.

    ceiling  the minimal TF decode (tf.io.read_file, tf.io.decode_image with the channels,
             tf.image.resize bilinear, cast to uint8; nothing else) in a sequential map, tf.data
             threading limited to 1, in a subprocess pinned to one CPU; reported x cores
    cores    the same minimal decode on every core at once, a pinned subprocess each
    a        a Python loop decoding and resizing with PIL, one tf.constant per batch (the feed_dict way)
    b        the PyTorch DataLoader, num_workers = cores, the same PIL decode and resize
    g        the dataset's tutorial-style baseline: LFW, a Python generator that samples pairs and
             decodes them with PIL through Dataset.from_generator; ImageNet DET, the classic
             from_generator over (image, XML) + tf.py_function XML parsing + decode_jpeg
    h        ImageNet DET only: g with its decode moved to a second map, which TF 2.21 parallelises

and, for the shrink alone (`input resize`), a plain bilinear resize (its ceiling) and the project's
shrink as it was before area (`previous`), both written here.
"""
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image

from benchmarks.data_api import ROOT
from benchmarks.measure import CORES, Source, Stream

AUTOTUNE = tf.data.AUTOTUNE


# ---------------------------------------------------------------------------------------------
# Python-side baselines: PIL in a loop, in PyTorch's workers, in a generator


def pil_image(bench, path):
    """PIL's decode and the same crop and resize as the project: uint8 (height, width, channels)."""
    height, width = bench.size
    mode = "L" if bench.spec.channels == 1 else "RGB"
    with Image.open(path) as image:
        if image.format == "JPEG" and bench.method == "resize":
            # PIL's reduced JPEG decode (libjpeg's DCT scaling) down to the least that still leaves
            # the kept window at least the output size: PIL's counterpart to c's windowed decode.
            keep = bench.crop_fraction or 1
            image.draft(mode, (math.ceil(width / keep), math.ceil(height / keep)))
        image = image.convert(mode)
    if bench.crop_fraction:
        # tf.image.central_crop's box.
        top = int((image.height - image.height * bench.crop_fraction) / 2)
        left = int((image.width - image.width * bench.crop_fraction) / 2)
        image = image.crop((left, top, image.width - left, image.height - top))
    if bench.method == "crop_or_pad":
        pixels = crop_or_pad(np.asarray(image), height, width)
    else:
        # PIL's bilinear filter widens its support when shrinking: the antialiased resize.
        pixels = np.array(image.resize((width, height), Image.BILINEAR))  # a writable copy, as torch wants
    return pixels.reshape(height, width, bench.spec.channels)


def pil_example(bench, i):
    """Example i of `bench` decoded with PIL: (features, label)."""
    paths, label = bench.example(i)
    features = tuple(pil_image(bench, path) for path in paths)
    return (features if bench.spec.paired else features[0]), label


def crop_or_pad(pixels, height, width):
    """tf.image.resize_with_crop_or_pad in NumPy: centre crop where larger, centre zero-pad where smaller."""
    h, w = pixels.shape[:2]
    top, left = max((h - height) // 2, 0), max((w - width) // 2, 0)
    pixels = pixels[top:top + height, left:left + width]
    h, w = pixels.shape[:2]
    out = np.zeros((height, width) + pixels.shape[2:], pixels.dtype)
    top, left = (height - h) // 2, (width - w) // 2
    out[top:top + h, left:left + w] = pixels
    return out


def python_loop_start(bench):
    """(a) The feed_dict way: a Python loop decodes a batch with PIL, then hands it to TF."""

    def start():
        counter = iter(range(10**12))

        def next_batch():
            examples = [pil_example(bench, next(counter)) for _ in range(bench.batch_size)]
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
        return pil_example(self.bench, i)


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
            yield pil_example(bench, i)
            i += 1

    data = tf.data.Dataset.from_generator(
        generate, output_signature=(features, tf.TensorSpec(label_shape, tf.float32)))
    return data.batch(bench.batch_size, drop_remainder=True).prefetch(AUTOTUNE)


# ---------------------------------------------------------------------------------------------
# The ImageNet DET tutorial (rows g and h)


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


def xml_label_parser(wnids):
    """The tutorial's tf.py_function body: an XML path -> the label of its largest box (background
    when it has none), parsed with ElementTree."""
    import xml.etree.ElementTree as ElementTree

    labels = {wnid: k for k, wnid in enumerate(wnids)}
    background = len(labels)

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
                label, largest = labels.get(obj.find("name").text.strip(), background), area
        return np.int32(label)

    return parse_xml


def tutorial_det_dataset(bench, separate_decode=False):
    """(g, ImageNet DET) The classic tutorial pipeline, faithfully: from_generator over (image, XML)
    paths, then one sequential map that parses the XML with tf.py_function (ElementTree, largest
    box -> label), reads the image, tf.io.decode_jpeg and the same crop-or-pad resize; then batch
    and prefetch. Like every row, it hands uint8 batches on (a tutorial would also normalise in its
    map; that is left to the step).

    (h) `separate_decode`: the same, with the decode in a second map of its own. That map holds
    no py_function, so TF 2.21's default map_parallelization runs it in parallel: the tutorial
    as it runs today when written that way, and a much harder baseline."""
    pairs = [(path, annotation_path(path)) for path in np.asarray(bench.table.path)[bench.order]]
    height, width = bench.size
    parse_xml = xml_label_parser(bench.info.wnids)

    def generate():
        while True:
            for image_path, xml_path in pairs:
                yield image_path, xml_path

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


# ---------------------------------------------------------------------------------------------
# The minimal TF decode: the ceiling and cores rows


def minimal_decode(path, channels, size):
    """Read, decode with `channels`, bilinear resize to `size`, cast to uint8: nothing else."""
    image = tf.io.decode_image(tf.io.read_file(path), channels=channels, expand_animations=False)
    return tf.cast(tf.image.resize(image, size, method="bilinear"), tf.uint8)


def minimal_decode_dataset(paths, channels, size, batch_size):
    """Batches of the examples `paths` (one or two paths each), in order, repeated, on one thread."""
    paired = len(paths[0]) == 2
    data = tf.data.Dataset.from_tensor_slices(np.asarray(paths)).repeat()
    if paired:
        data = data.map(lambda p: (minimal_decode(p[0], channels, size), minimal_decode(p[1], channels, size)),
                        num_parallel_calls=1)
    else:
        data = data.map(lambda p: minimal_decode(p[0], channels, size), num_parallel_calls=1)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.experimental_optimization.map_parallelization = False
    options.autotune.enabled = False
    return data.batch(batch_size, drop_remainder=True).with_options(options)


# The ceiling's worker process, started from the repository root: pinned to its core before TensorFlow
# starts, so every thread TensorFlow makes shares that one core (as `taskset -c N` would).
WORKER = ("import os, sys; os.sched_setaffinity(0, {int(sys.argv[2])}); "
          "from benchmarks.input_baselines import ceiling_worker; ceiling_worker(sys.argv[1])")


class CeilingSource(Source):
    """The minimal TF decode on one core in a pinned subprocess (`ceiling_worker`), reported x cores.

    With `all_cores`, one such subprocess per core, all decoding at once (the `cores` row): what
    the machine really gives when every core is busy, which the ceiling's one busy core (with the
    others idle, so often clocked higher) overstates.
    """

    def __init__(self, bench, all_cores=False):
        if all_cores:
            super().__init__("cores", f"minimal TF decode on all {CORES} cores at once (a pinned subprocess each)",
                             bench)
        else:
            super().__init__("ceiling", f"minimal TF decode (read, decode, bilinear resize, uint8), one core x "
                                        f"{CORES} cores (pinned subprocess)", bench)
        # Busy cores = CPU time per worker / this wall time: the one core of the ceiling, all of them here.
        self.wall_scale = 1 if all_cores else CORES
        examples = bench.workdir / f"minimal-decode-{bench.name}.json"
        examples.write_text(json.dumps({"paths": bench.example_paths(), "channels": bench.spec.channels,
                                        "size": list(bench.size), "batch_size": bench.batch_size}))
        cores = sorted(os.sched_getaffinity(0)) if all_cores else [min(os.sched_getaffinity(0))]
        self.processes = [subprocess.Popen([sys.executable, "-c", WORKER, str(examples), str(core)],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
                          for core in cores]
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


def ceiling_worker(examples_file):
    """The pinned subprocess (`WORKER`): the minimal decode sequentially on one core, answering the parent's
    requests on stdin, one JSON line each."""
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    spec = json.loads(Path(examples_file).read_text())
    data = minimal_decode_dataset(spec["paths"], spec["channels"], spec["size"], spec["batch_size"])
    iterator = iter(data)
    next(iterator)  # trace and first batch
    source = Source("ceiling", "", None, start=lambda: Stream(lambda: next(iterator)))
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "calibrate":
            batches, seconds = source.calibrate(request["seconds"])
            reply = {"batches": batches, "seconds": seconds}
        elif request["op"] == "measure":
            seconds, cpu_seconds, others, _ = source.measure(request["warmup"], request["batches"])
            reply = {"seconds": seconds, "cpu_seconds": cpu_seconds, "others": others}
        else:
            reply = {"ok": True}
        print(json.dumps(reply), flush=True)



# ---------------------------------------------------------------------------------------------
# The shrink alone (`input resize`): decoded images in, uint8 at the output size out


def plain_resize(image, size):
    """The resize's ceiling: a plain bilinear resize (no antialiasing), the least TensorFlow can do."""
    return tf.cast(tf.image.resize(image, size), tf.uint8)


def previous_resize(image, size):
    """The project's shrink before area: a bilinear pre-shrink to twice the size for images 4x the size or
    more, then TensorFlow's antialiased bilinear resize, rounded to uint8."""
    shape = tf.shape(image)
    ratio = tf.minimum(shape[0] // size[0], shape[1] // size[1])
    image = tf.cond(ratio >= 4, lambda: tf.image.resize(image, [2 * size[0], 2 * size[1]]),
                    lambda: tf.cast(image, tf.float32))
    return tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, size, antialias=True)), 0, 255), tf.uint8)
