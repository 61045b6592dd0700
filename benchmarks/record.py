"""The record of a benchmark's run: framed by a header and a footer, and written to one results file.

`recorded` wraps a benchmark's run: before it, the command, the devices TensorFlow sees (for benchmarks that
start it in this process), the cores and the 1-minute load average; after it, the load average again; and
then everything the run printed, with the machine, the date and the command, as JSON under
benchmarks/results/ (`write_result`; benchmarks/results/README.md lists the fields). Every benchmark goes
through it, so every results file has the same form.

TensorFlow is imported only where devices are listed, so benchmarks that time other processes (real_size,
faults) do not start it, nor hold a GPU, in their own.
"""
import contextlib
import datetime
import glob
import io
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import measure

# Where results files go; HARNESS_BENCHMARK_RESULTS names another folder (the tests' runs write to a temporary one).
RESULTS = Path(__file__).resolve().parent / "results"


def header(name, argv, devices=True):
    """Prints the command, with `devices` the devices TensorFlow sees, and the cores and load before; returns
    what it printed as plain values: {"devices": ..., "tensorflow": ..., "load_before": ...}."""
    print(f"command: {measure.command(name, argv)}")
    printed = {"devices": None, "tensorflow": None}
    if devices:
        import tensorflow as tf

        names = [device.name for device in tf.config.list_logical_devices()]
        details = [tf.config.experimental.get_device_details(gpu).get("device_name", "?")
                   for gpu in tf.config.list_physical_devices("GPU")]
        print(f"devices: {names} {details}; TensorFlow {tf.__version__}")
        printed.update(devices={"logical": names, "gpus": details}, tensorflow=tf.__version__)
    printed["load_before"] = measure.load_average()
    print(f"load average (1 min) before: {printed['load_before']:.2f}; cores: {measure.CORES}", flush=True)
    return printed


def footer():
    """Prints the load average after; returns it."""
    after = measure.load_average()
    print(f"load average (1 min) after: {after:.2f}", flush=True)
    return after


class _Tee(io.TextIOBase):
    """A text stream that writes through to `stream` and keeps a copy of everything written."""

    def __init__(self, stream):
        self.stream, self.kept = stream, io.StringIO()

    def write(self, text):
        self.kept.write(text)
        return self.stream.write(text)

    @property
    def encoding(self):
        return self.stream.encoding

    def isatty(self):
        return self.stream.isatty()

    def flush(self):
        self.stream.flush()


@contextlib.contextmanager
def recorded(name, argv, devices=True):
    """Frames one run of benchmark `name`: the header before (`devices`: with the devices TensorFlow sees), the
    footer after, and what the run printed in between written with the machine, date and command to a results
    file (`write_result`). A run that raises writes none: its figures are not whole."""
    started = datetime.datetime.now().astimezone()
    printed = header(name, argv, devices)
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield
    after = footer()
    record = {"benchmark": name, "command": measure.command(name, argv), "argv": list(argv),
              "date": started.isoformat(timespec="seconds"),
              "seconds": round((datetime.datetime.now().astimezone() - started).total_seconds(), 1),
              "machine": machine(), "devices": printed["devices"], "tensorflow": printed["tensorflow"],
              "load_average_1min": {"before": round(printed["load_before"], 2), "after": round(after, 2)},
              "figures": figures(tee.kept.getvalue())}
    write_result(record)


def write_result(record):
    """Writes `record` (a benchmark run's plain values) as JSON to <results>/<date>-<time>-<benchmark>.json
    and prints the path; a folder that cannot be written is one line on stderr, and the printed figures stand."""
    folder = Path(os.environ.get("HARNESS_BENCHMARK_RESULTS") or RESULTS)
    stamp = datetime.datetime.fromisoformat(record["date"]).strftime("%Y-%m-%d-%H%M%S")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for number in range(100):  # two runs in the same second get a file each
            path = folder / f"{stamp}-{record['benchmark']}{f'-{number}' if number else ''}.json"
            try:
                with open(path, "x", encoding="utf-8") as file:
                    file.write(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"{folder}: 100 results files of {stamp} already")
    except OSError as error:
        print(f"results not written: {error}", file=sys.stderr, flush=True)
        return None
    print(f"results: {path}", flush=True)
    return path


def machine():
    """The machine as plain values: CPU model, the cores this process may use and all of them, memory, GPUs."""
    model = None
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), None)
    memory = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo", encoding="utf-8") as meminfo:
        memory = round(int(meminfo.readline().split()[1]) / 2**20, 1)  # MemTotal, in kB
    return {"cpu": model or platform.processor() or None, "cores": measure.CORES, "cores_in_all": os.cpu_count(),
            "memory_gib": memory, "gpus": gpu_names(), "python": platform.python_version()}


def gpu_names():
    """The NVIDIA GPUs' model names, from the driver's /proc files or nvidia-smi, without starting TensorFlow;
    [] where there are none."""
    names = []
    for information in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        with contextlib.suppress(OSError), open(information, encoding="utf-8") as file:
            names += [line.split(":", 1)[1].strip() for line in file if line.startswith("Model:")]
    if names or not shutil.which("nvidia-smi"):
        return names
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def figures(output):
    """A run's printed report as plain values: its Markdown tables, each {"title": the line above it, "columns",
    "rows"}, and its other non-empty lines in order."""
    tables, lines, table, previous = [], [], None, ""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and table is None:
            table = {"title": previous, "columns": cells, "rows": []}
            tables.append(table)
        elif line.startswith("|") and not all(set(cell) <= set("-: ") for cell in cells):
            table["rows"].append(cells)
        elif not line.startswith("|"):
            table = None
            if line.strip():
                lines.append(line.rstrip())
                previous = line.strip()
    return {"tables": tables, "lines": lines}
