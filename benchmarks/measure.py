"""How every benchmark measures: the one place for timing, rounds, CPU accounting and the figures' format.

- The command line as a reader types it (`command`) and the 1-minute load average; benchmarks/record.py
  frames each run with them and writes its results file.
- Timing: wall and CPU seconds of a call (`timed`); CPU seconds of a live process (/proc) and of
  the whole machine, so a row can say how many cores other processes used meanwhile.
- Paired rounds: every row once per round, the order rotated every round (`rotations`), so drift and
  other processes' load fall on every row alike. Rows that run a number of steps use `rotated_rounds`;
  input sources, measured over a calibrated number of batches of a fresh iterator, use `Source` and
  `run_interleaved`.
- Figures: medians with their spread (min–max over rounds), and ratios as medians of per-round
  ratios: each round's two measurements are minutes apart at most, so load that comes and goes cancels
  better than in a ratio of medians.

Nothing here imports TensorFlow.
"""
import argparse
import math
import os
import shlex
import statistics
import time
from typing import Any, NamedTuple

CORES = len(os.sched_getaffinity(0))
SEED = 42
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# The command line and the load


class Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """A benchmark's --help: its module docstring as written, then each option with its default."""


def load_average():
    """The machine's 1-minute load average."""
    return os.getloadavg()[0]


def command(name, argv):
    """The command line that runs benchmark `name` with `argv`, as a reader would type it."""
    return f"python -m benchmarks {shlex.join([name, *argv])}"


# ---------------------------------------------------------------------------------------------
# Timing and CPU accounting


class Timing(NamedTuple):
    seconds: float  # wall
    cpu: float  # this process, every thread (os.times): TensorFlow's and tf.data's pools included
    value: Any  # what the timed call returned (a loop row: its steps' input wait in seconds, or None)


def timed(run, *args) -> Timing:
    """The wall and CPU seconds of `run(*args)`, and what it returned."""
    before, started = os.times(), time.perf_counter()
    value = run(*args)
    seconds, after = time.perf_counter() - started, os.times()
    return Timing(seconds, (after.user - before.user) + (after.system - before.system), value)


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


def per(amount, seconds):
    """`amount` per second. A CPU time shorter than the clock's tick reads 0 s: it counts as one tick. A wall
    time (perf_counter's, finer than a tick) is taken as it is, so a row timed against itself reads 1."""
    return amount / (seconds or 1 / _CLOCK_TICKS)


# ---------------------------------------------------------------------------------------------
# Paired rounds


def rotations(names, rounds):
    """(round, name) for `rounds` rounds of every one of `names`, the order rotated every round."""
    names = list(names)
    for number in range(rounds):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            yield number, name


def rotated_rounds(rows, steps, rounds):
    """Each row's Timings of `steps` steps over `rounds` paired rounds; `rows` maps names to functions that
    run a number of steps and wait for their results."""
    results = {name: [] for name in rows}
    for _, name in rotations(rows, rounds):
        results[name].append(timed(rows[name], steps))
    return results


class Stream:
    """One iterator of an input source: `next_batch()`, `close()`, and the worker processes it runs on."""

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
        self.own_rates = []  # images per CPU-second of this process alone, without its workers
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
        """(wall seconds, CPU seconds, other processes' busy cores, CPU seconds of this process alone) for
        `batches` batches of a fresh stream, after `warmup` batches."""
        stream = self.start()
        try:
            for _ in range(warmup):
                stream.next_batch()
            own, cpu, system = time.process_time(), stream.cpu_seconds(), system_busy_seconds()
            started = time.perf_counter()
            for _ in range(batches):
                stream.next_batch()
            wall, cpu, own = time.perf_counter() - started, stream.cpu_seconds() - cpu, time.process_time() - own
            return wall, cpu, max(system_busy_seconds() - system - cpu, 0.0) / wall, own
        finally:
            stream.close()

    def record(self, elapsed, cpu, others, own=None):
        """Keeps one round's measurement: images/s, images per CPU-second (with the workers', and of this
        process alone), busy cores, others' cores."""
        images = self.batches * self.images_per_batch
        self.others.append(others)
        self.rates.append(images / elapsed)
        self.cpu_rates.append(per(images, cpu))
        self.own_rates.append(per(images, cpu if own is None else own))
        self.busy.append(cpu / (elapsed * self.wall_scale))


def tf_start(make_dataset, worker_pids=None):
    """A start() over a tf.data pipeline built once (so a memory cache persists); CPU counts the processes
    `worker_pids()` names too."""
    holder = {}

    def start():
        if "data" not in holder:
            holder["data"] = make_dataset()
        iterators = [iter(holder["data"])]
        # Dropping the last reference to the iterator stops its background threads.
        return Stream(lambda: next(iterators[0]), iterators.clear, worker_pids)

    return start


def others_busy(window=0.5):
    """Cores that other processes keep busy now, sampled over `window` seconds while this one idles."""
    system, own = system_busy_seconds(), time.process_time()
    time.sleep(window)
    return max(system_busy_seconds() - system - (time.process_time() - own), 0.0) / window


def wait_for_quiet(max_wait, threshold=0.25):
    """Waits, up to `max_wait` seconds, for a moment when other processes use under `threshold` cores;
    returns whether it came. A measurement taken while another job runs says little about the row,
    and the interleaving and medians cancel only noise that comes and goes."""
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline:
        if others_busy() < threshold:
            return True
    return False


def run_interleaved(sources, seconds, repeats, quiet_wait=0.0, batches=None):
    """Calibration round (unless `batches` fixes the count), then `repeats` rounds of every source, the
    order rotated each round; each measurement a fresh stream after a warm-up."""
    for source in sources:
        if batches:
            source.batches = batches
        else:
            count, elapsed = source.calibrate(seconds / 2)
            source.batches = max(2, round(count * seconds / max(elapsed, 1e-9)))
    missed = 0
    for _, key in rotations([source.key for source in sources], repeats):
        source = next(source for source in sources if source.key == key)
        if quiet_wait > 0 and missed < 3:
            # After three waits in a row in vain the machine is busy for good: stop waiting.
            missed = 0 if wait_for_quiet(quiet_wait) else missed + 1
        warmup = max(2, math.ceil(source.batches / 5))
        before = load_average()
        source.record(*source.measure(warmup, source.batches))
        source.loads.append((before, load_average()))


# ---------------------------------------------------------------------------------------------
# Figures


def median(source):
    return statistics.median(source.rates) if source and source.rates else None


def spread(values, digits=2):
    """'median (min–max)' of `values`, 'n/a (not measured)' when there are none."""
    if not values:
        return "n/a (not measured)"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def round_ratios(by_key, top, bottom, field="rates"):
    """top ÷ bottom in every round (images/s, or images per CPU-second with field="cpu_rates"); None
    when either was not measured."""
    if top not in by_key or bottom not in by_key:
        return None
    return [x / y for x, y in zip(getattr(by_key[top], field), getattr(by_key[bottom], field))]


def timing_ratios(runs, base_runs, field="seconds"):
    """Per round, a row's wall (or "cpu") seconds ÷ the base row's."""
    return [per(getattr(run, field), getattr(base, field)) for run, base in zip(runs, base_runs)]


def saved_ms(base_runs, runs, steps):
    """Per round, the milliseconds per step that `runs` took less than `base_runs`."""
    return [1000 * (base.seconds - run.seconds) / steps for base, run in zip(base_runs, runs)]


def load_text(source):
    """'before–after': the medians over rounds of the load average around the row's measurements."""
    before, after = zip(*source.loads)
    return f"{statistics.median(before):.1f}–{statistics.median(after):.1f}"


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
