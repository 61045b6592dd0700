"""Shared measurement machinery of the input benchmarks.

- `Bench`: one dataset at one batch and image size, with its examples in a fixed order and their
  PIL decode (the Python-side baselines' work).
- CPU accounting: CPU seconds of this process and its workers (/proc), and of the whole machine.
- `Stream` and `Source`: one iterator of an input source, and a source measured in rounds.
- `run_interleaved`: paired rounds, every source once per round in a rotating order, each
  measurement after a wait (bounded) for other processes to go quiet.
- Medians, and ratios as medians of per-round ratios with their spread over rounds.
"""
import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (str(ROOT), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image  # noqa: E402

CORES = len(os.sched_getaffinity(0))
SEED = 42
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def load_average():
    """The machine's 1-minute load average."""
    return os.getloadavg()[0]


# ---------------------------------------------------------------------------------------------
# The dataset under test


class Bench:
    """One dataset at one batch and image size: its config, training table and Python-side twins."""

    def __init__(self, name, batch_size, image_size, workdir):
        """`image_size`: an int, or None for the dataset's own default (conf/dataset/<name>.yaml)."""
        import data_api

        self.name, self.batch_size, self.image_size = name, batch_size, image_size
        self.workdir = Path(workdir)
        self.cfg = data_api.compose_cfg(name, batch_size, image_size)
        self.info = data_api.describe(self.cfg)
        self.spec, self.table, self.sampled = self.info.spec, self.info.table, self.info.sampled
        self.per_example = 2 if self.spec.paired else 1
        self.size, self.method, self.crop_fraction = self.info.size, self.info.method, self.info.crop_fraction
        if self.sampled:
            groups = self.table.groupby("person", sort=True).path
            self.people = [list(paths) for _, paths in groups]
            self.with_two = [k for k, paths in enumerate(self.people) if len(paths) >= 2]
        else:
            self.rows = list(zip(*(self.table[c] for c in self.info.path_columns)))
            self.labels = [np.asarray(label, np.float32) for label in self.table.label]
            self.order = np.random.default_rng(SEED).permutation(len(self.rows))

    def cfg_with(self, *overrides):
        import data_api

        return data_api.compose_cfg(self.name, self.batch_size, self.image_size, *overrides)

    def first_image(self):
        """The first training image's path."""
        return self.table[self.info.path_columns[0]].iloc[0]

    # The Python side (rows a, b, g) and the minimal decode's examples: the same examples.

    def example(self, i):
        """Example i as (paths, label): a table row in a fixed shuffled order, or a drawn pair as
        the project draws them (even i: two images of one person; odd i: two people)."""
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

    def example_paths(self, count=None):
        """The paths of the first `count` examples (default: one pass over the table, at least 1,024
        drawn pairs), each a tuple of one path or two."""
        count = count or (max(len(self.table), 1024) if self.sampled else len(self.table))
        return [tuple(str(path) for path in self.example(i)[0]) for i in range(count)]

    def pil_image(self, path):
        """PIL's decode and the same crop and resize as the project: uint8 (height, width, channels)."""
        height, width = self.size
        mode = "L" if self.spec.channels == 1 else "RGB"
        with Image.open(path) as image:
            if image.format == "JPEG" and self.method == "resize":
                # PIL's reduced JPEG decode (libjpeg's DCT scaling) down to the least that still leaves
                # the kept window at least the output size: PIL's counterpart to c's windowed decode.
                keep = self.crop_fraction or 1
                image.draft(mode, (math.ceil(width / keep), math.ceil(height / keep)))
            image = image.convert(mode)
        if self.crop_fraction:
            # tf.image.central_crop's box.
            top = int((image.height - image.height * self.crop_fraction) / 2)
            left = int((image.width - image.width * self.crop_fraction) / 2)
            image = image.crop((left, top, image.width - left, image.height - top))
        if self.method == "crop_or_pad":
            pixels = crop_or_pad(np.asarray(image), height, width)
        else:
            # PIL's bilinear filter widens its support when shrinking: the antialiased resize.
            pixels = np.array(image.resize((width, height), Image.BILINEAR))  # a writable copy, as torch wants
        return pixels.reshape(height, width, self.spec.channels)

    def pil_example(self, i):
        paths, label = self.example(i)
        features = tuple(self.pil_image(path) for path in paths)
        return (features if self.spec.paired else features[0]), label


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


# ---------------------------------------------------------------------------------------------
# CPU accounting


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


# ---------------------------------------------------------------------------------------------
# Input sources. A measurement opens one fresh Stream (an iterator) of a source and closes it after.


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

    def __init__(self, key, title, bench, start=None, images_per_batch=None):
        self.key, self.title, self.bench = key, title, bench
        self._start = start
        self._images_per_batch = images_per_batch
        self.batches = None  # fixed per measurement, set by calibration
        self.rates, self.cpu_rates, self.busy, self.others = [], [], [], []
        self.loads = []  # (before, after): the 1-minute load average around each measurement
        self.wall_scale = 1  # the ceiling reports one core's wall time divided by the cores

    @property
    def images_per_batch(self):
        if self._images_per_batch:
            return self._images_per_batch
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

    def record(self, elapsed, cpu, others):
        """Keeps one round's measurement: images/s, images per CPU-second, busy cores, others' cores."""
        images = self.batches * self.images_per_batch
        self.others.append(others)
        self.rates.append(images / elapsed)
        self.cpu_rates.append(images / max(cpu, 1e-9))
        self.busy.append(cpu / (elapsed * self.wall_scale))


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


# ---------------------------------------------------------------------------------------------
# Interleaved paired rounds on a shared machine


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
            before = load_average()
            source.record(*source.measure(warmup, source.batches))
            source.loads.append((before, load_average()))


# ---------------------------------------------------------------------------------------------
# Medians and ratios


def median(source):
    return statistics.median(source.rates) if source and source.rates else None


def round_ratios(by_key, top, bottom, field="rates"):
    """top ÷ bottom in every round (images/s, or images per CPU-second with field="cpu_rates"); None
    when either was not measured. Each round's two measurements are taken minutes apart at most, so
    load that comes and goes on a shared machine cancels better than in a ratio of medians."""
    if top not in by_key or bottom not in by_key:
        return None
    return [x / y for x, y in zip(getattr(by_key[top], field), getattr(by_key[bottom], field))]


def load_text(source):
    """'before–after': the medians over rounds of the load average around the row's measurements."""
    before, after = zip(*source.loads)
    return f"{statistics.median(before):.1f}–{statistics.median(after):.1f}"


def ratio_text(ratios):
    """'median (min–max)' of per-round ratios, 'n/a (not measured)' for None."""
    if not ratios:
        return "n/a (not measured)"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def target_line(name, ratios, target, op=">=", rounds="rounds"):
    """One ratio's line: the median of per-round ratios, their spread, and the target's verdict.
    `ratios` may also be one number (a fraction with no rounds), printed without a spread."""
    if ratios is None or (not isinstance(ratios, (int, float)) and not ratios):
        return f"  {name:<26} n/a (not measured)"
    if isinstance(ratios, (int, float)):
        value, line = ratios, f"  {name:<26} {ratios:8.2f}"
    else:
        value = statistics.median(ratios)
        line = f"  {name:<26} {value:8.2f}   ({min(ratios):.2f}–{max(ratios):.2f} over {len(ratios)} {rounds})"
    if target is None:
        return line
    verdict = "PASS" if (value >= target if op == ">=" else value <= target) else "MISS"
    return f"{line}   target {op.replace('>=', '≥').replace('<=', '≤')} {target:<5g} {verdict}"
