"""The tf.data service's cost: the file pipeline read here vs through a localhost dispatcher.

    python -m benchmarks service [--dataset chest_xray] [--workers 1,2] [--rounds 5] [--seconds 8]
                                 [--batch-size N] [--image-size N]

Rows: the project's training pipeline (`pipeline.source=files`) iterated in this process, and the
same pipeline with `pipeline.service=grpc://localhost:PORT`, fed by a dispatcher and 1 or 2 workers
started as `python -m tf_harness.data.service ...` subprocesses. Each row reports images/s and images per
CPU-second, where CPU counts this process and the row's dispatcher and workers. Rows run in paired,
interleaved rounds; each ratio to the local row is the median of per-round ratios with its min–max.

On one machine the workers share the trainer's cores, so the service cannot be faster than local
decoding here: what this measures is its overhead (gRPC, copying batches between processes, a
dispatcher), the price paid for cores that another machine would add. `--workers 0` measures the
local row alone.
"""
import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import data_api, measure, record
from benchmarks.data_api import Bench
from benchmarks.measure import Source, tf_start

NAME = "service"

WORKDIR = Path(tempfile.gettempdir()) / "service-bench"


class Cluster:
    """A dispatcher and `workers` workers on localhost, each a `python -m tf_harness.data.service` process."""

    def __init__(self, workers, logs):
        with socket.socket() as probe:
            probe.bind(("localhost", 0))
            port = probe.getsockname()[1]
        self.address = f"grpc://localhost:{port}"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        commands = [data_api.service_command("dispatcher", "--port", str(port), "--host", "localhost")]
        commands += [data_api.service_command("worker", "--dispatcher", self.address, "--host", "localhost")
                     for _ in range(workers)]
        self.processes, self.logs = [], []
        for index, command in enumerate(commands):
            log_path = logs / f"{port}-{index}.log"
            self.logs.append(log_path)
            self.processes.append(subprocess.Popen(command, cwd=data_api.ROOT, env=env, stdout=open(log_path, "w"),
                                                   stderr=subprocess.STDOUT))
            self._wait_for(log_path, "Dispatcher listening" if index == 0 else "Worker started")

    def _wait_for(self, log_path, text, timeout=180):
        deadline = time.monotonic() + timeout
        while text not in log_path.read_text():
            if time.monotonic() > deadline or self.processes[-1].poll() is not None:
                raise RuntimeError(f"no {text!r} from {log_path}: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)

    def pids(self):
        return [process.pid for process in self.processes]

    def stop(self):
        for process in reversed(self.processes):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def sources(bench, clusters):
    def pipeline(*overrides):
        return lambda: data_api.train_input(bench.cfg_with(*overrides), bench.table, WORKDIR, measure.SEED)

    rows = [Source("local", "file pipeline, read here", bench, tf_start(pipeline()))]
    for count, cluster in clusters.items():
        rows.append(Source(f"service{count}", f"through a localhost dispatcher, {count} worker(s)", bench,
                           tf_start(pipeline(f"pipeline.service={cluster.address}"), cluster.pids)))
    return rows


def report(bench, rows, loads):
    print(f"{bench.name}, {bench.image_size} px, batch {bench.batch_size}, {measure.CORES} cores; "
          f"load average {loads[0]:.2f} before, {loads[1]:.2f} after; {len(rows[0].rates)} paired rounds")
    # images/CPU-s counts every process of a row; "here" this process alone, the trainer's share.
    print(f"  {'row':<44} {'images/s':>9} {'images/CPU-s':>13} {'here':>9} {'busy cores':>11}")
    for row in rows:
        print(f"  {row.title:<44} {statistics.median(row.rates):9.1f} {statistics.median(row.cpu_rates):13.1f} "
              f"{statistics.median(row.own_rates):9.1f} {statistics.median(row.busy):11.2f}")
    by_key = {row.key: row for row in rows}
    print("  ratio to the local row, median of per-round ratios (min–max):")
    for row in rows[1:]:
        print(f"    {row.title:<44} images/s {measure.spread(measure.round_ratios(by_key, row.key, 'local'))}, "
              f"per CPU-s {measure.spread(measure.round_ratios(by_key, row.key, 'local', 'cpu_rates'))}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME}", description=__doc__,
                                     formatter_class=measure.Help)
    parser.add_argument("--dataset", default="chest_xray", choices=data_api.DATASETS)
    parser.add_argument("--workers", default="1,2", help="worker counts, one localhost cluster each; 0: none")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the dataset's")
    parser.add_argument("--image-size", type=int, default=None, help="default: the dataset's")
    parser.add_argument("--rounds", "--repeats", type=int, default=5, help="paired rounds")
    parser.add_argument("--seconds", type=float, default=8, help="seconds per row and round")
    args = parser.parse_args(argv)
    with record.recorded(NAME, argv):
        defaults = data_api.compose_defaults(args.dataset).pipeline
        bench = Bench(args.dataset, args.batch_size or defaults.batch_size, args.image_size or defaults.image_size,
                      WORKDIR)
        WORKDIR.mkdir(parents=True, exist_ok=True)
        clusters = {}
        try:
            for count in (int(value) for value in args.workers.split(",")):
                if count:
                    clusters[count] = Cluster(count, WORKDIR)
            rows = sources(bench, clusters)
            before = measure.load_average()
            measure.run_interleaved(rows, args.seconds, args.rounds)
            report(bench, rows, (before, measure.load_average()))
        finally:
            for cluster in clusters.values():
                cluster.stop()
    return 0

