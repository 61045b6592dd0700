"""The starvation check (`python -m benchmarks input starvation`): does the real input pipeline hold a real
model's training step back?

    python -m benchmarks input starvation [--datasets chest_xray] [--steps 10] [--model resnet_v2_152]
                                          [--batch-size 32] [--image-size 224]

It trains a real model (tf_harness.experiments.training.trainer.Trainer) fed by the real pipeline and by one cached
batch repeated (`data.take(1).cache().repeat()`, no input cost), in alternating blocks so load from
other processes falls on both feeds alike, and reports the ratio of median step times (the median of
per-block ratios, with their min–max) and the input-wait fraction measured the way experiments/runner.py
does, beside the pipeline's own time per batch, the CPU-seconds per step, other processes' cores and the
1-minute load average before and after.
"""
import statistics
import tempfile
import time

from benchmarks import data_api
from benchmarks.measure import CORES, SEED, load_average, system_busy_seconds, target_line
from tf_harness.experiments.config.settings import Settings

FEEDS = ("real", "cached")


class StepTimer:
    """Runs train steps and keeps, per feed, each step's time, input wait, CPU and others' cores."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.times, self.waits, self.cpu, self.others = ({feed: [] for feed in FEEDS} for _ in range(4))
        self.blocks = []  # (real step times, cached step times) of each block

    def step(self, iterator, feed=None):
        own, system = time.process_time(), system_busy_seconds()
        started = time.perf_counter()
        features, labels, weights = next(iterator)
        fetched = time.perf_counter()
        loss = float(self.trainer.one_step(features, labels, weights)["loss"])  # waits for the step, as runner.py does
        finished = time.perf_counter()
        if feed:
            self.times[feed].append(finished - started)
            self.waits[feed].append(fetched - started)
            self.cpu[feed].append(time.process_time() - own)
            self.others[feed].append(max(system_busy_seconds() - system - self.cpu[feed][-1], 0) /
                                     (finished - started))

    def run_blocks(self, real, cached_iterator, steps):
        """Blocks of steps, alternating feeds, so load from other processes falls on both alike. A real
        block opens a fresh iterator and deletes it after, so its decoding overlaps only its own steps;
        its first step (the pipeline starting and filling its buffers) is not counted."""
        block = min(steps, 5)
        while len(self.times["real"]) < steps:
            count = min(block, steps - len(self.times["real"]))
            real_iterator = iter(real)
            self.step(real_iterator)
            for _ in range(count):
                self.step(real_iterator, "real")
            del real_iterator
            for _ in range(count):
                self.step(cached_iterator, "cached")
            self.blocks.append((self.times["real"][-count:], self.times["cached"][-count:]))

    def block_ratios(self):
        """Each block's median real step time ÷ its median cached step time."""
        return [statistics.median(real) / statistics.median(cached) for real, cached in self.blocks]

    def wait_fraction(self, feed):
        return sum(self.waits[feed]) / sum(self.times[feed])


def pipeline_alone(data, batches=20):
    """Seconds per batch of `data` with nothing else running, after a short warm-up."""
    iterator = iter(data)
    for _ in range(max(2, batches // 5)):
        next(iterator)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return (time.perf_counter() - started) / batches


def make_trainer(cfg, info):
    """The model's Trainer, as experiments/assembly.py `build` builds it."""
    from tf_harness.experiments.config import strategies
    from tf_harness.experiments.training.trainer import Trainer

    strategy = strategies.make_strategy(cfg.strategy)
    return Trainer(Settings.from_config(cfg), info.spec, strategy, info.size)


def print_report(timer, alone, batch_size, load):
    real_step, cached_step = statistics.median(timer.times["real"]), statistics.median(timer.times["cached"])
    per_batch = statistics.median(alone)
    print()
    print("| feed | median step s | min–max | input_wait_fraction | CPU-s per step | others' cores |")
    print("|---|---|---|---|---|---|")
    for feed, title in (("real", "real pipeline (input_fn, files)"), ("cached", "one cached batch repeated")):
        times = timer.times[feed]
        print(f"| {title} | {statistics.median(times):.3f} | {min(times):.3f}–{max(times):.3f} | "
              f"{timer.wait_fraction(feed):.3f} | {statistics.median(timer.cpu[feed]):.2f} | "
              f"{statistics.median(timer.others[feed]):.2f} |")
    print(f"\nload average (1 min): {load[0]:.2f} before, {load[1]:.2f} after the steps")
    print(f"pipeline alone: {per_batch:.3f} s per batch of {batch_size} "
          f"({batch_size / per_batch:,.0f} images/s); the model step (fed from cache) takes {cached_step:.3f} s, "
          f"{cached_step / per_batch:.1f}× as long" + ("" if cached_step >= per_batch else
                                                         " -- SHORTER than the pipeline: input-bound by design"))
    print(target_line("real ÷ cached step time", timer.block_ratios(), 1.05, "<=", "blocks") +
          f"   (ratio of medians {real_step / cached_step:.2f})")
    extra_cpu = statistics.median(timer.cpu["real"]) - statistics.median(timer.cpu["cached"])
    print(f"  (the real feed's decoding shares the cores with the model: {extra_cpu:+.2f} CPU-s per step, "
          f"{extra_cpu / statistics.median(timer.cpu['cached']):+.1%} of the step's own CPU time)")
    fraction = timer.wait_fraction("real")
    band = ("not input-bound" if fraction < 0.05 else "moderately input-bound" if fraction < 0.2
            else "highly input-bound")
    print(target_line("input_wait_fraction (real)", fraction, 0.05, "<=") + f"   ({band})")


def add_arguments(parser, add_data):
    """The starvation mode's options on `parser`; `add_data` adds --datasets, --batch-size and --image-size."""
    add_data(parser, "chest_xray", 32, "224")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per feed")
    parser.add_argument("--model", default=None,
                        help="the model (default: the dataset's own, resnet_v2_152 for chest_xray)")


def run(args):
    """The check for each dataset and image size of `args`."""
    for dataset in args.datasets.split(","):
        for image_size in args.image_size:
            starvation(dataset, image_size, args)
    return 0


def starvation(dataset, image_size, args):
    """Median step time fed by the real pipeline ÷ fed by one cached batch, and the input-wait fraction."""
    import keras

    from tf_harness.experiments.config.schema import first_problem

    overrides = [f"model={args.model}"] if args.model else []
    cfg = data_api.compose_cfg(dataset, args.batch_size, image_size, *overrides)
    info = data_api.describe(cfg)
    if first_problem(cfg):
        raise SystemExit(f"config error: {first_problem(cfg)}")
    height, width = info.size
    print(f"\n# Starvation check: dataset {dataset}, model {cfg.model.name} via "
          f"tf_harness.experiments.training.trainer.Trainer, {height}x{width}, batch {args.batch_size}, "
          f"{args.steps} measured steps per feed, {CORES} cores")
    keras.utils.set_random_seed(cfg.seed)
    with tempfile.TemporaryDirectory(prefix="starvation-") as workdir:
        real = data_api.train_input(cfg, info.table, workdir, SEED)
        cached = real.take(1).cache().repeat()
        load_before = load_average()
        alone = [pipeline_alone(real)]
        timer = StepTimer(make_trainer(cfg, info))
        cached_iterator = iter(cached)
        started = time.perf_counter()
        timer.step(cached_iterator)  # the trace; both feeds share one element_spec, so one trace serves both
        print(f"trace + first step: {time.perf_counter() - started:.1f} s", flush=True)
        timer.run_blocks(real, cached_iterator, args.steps)
        alone.append(pipeline_alone(real))
    print_report(timer, alone, args.batch_size, (load_before, load_average()))
