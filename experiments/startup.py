"""Where the time to the first training step goes, logged as one line.

A run's first step comes after Python and TensorFlow import, the dataset is
indexed and its images verified, the model is built, the first input_fn is
built and the first step is traced. Each phase is a lap of one clock.

TensorFlow itself is imported quietly (import_tensorflow_quietly): its C++
start-up chatter stays out of the terminal unless TF_CPP_MIN_LOG_LEVEL asks for it.
"""
import logging
import os
import re
import sys
import tempfile
import time

log = logging.getLogger(__name__)


# When Python began running this project's code: run.py (and the converter) import this module before
# anything else of weight, so this is within milliseconds of the interpreter's start. The process's own
# start time (/proc) is not used: a shell that `exec`s python after a venv install passes on its start.
_INTERPRETER_READY = time.perf_counter()
_job_start = None


def job_started() -> None:
    """Marks the start of a Hydra job. The first job of a process starts with the interpreter; a later one
    (the basic launcher runs a sweep's jobs one after another in one process) starts now."""
    global _job_start
    _job_start = _INTERPRETER_READY if _job_start is None else time.perf_counter()


class StartupClock:
    """Laps of the start-up phases; the first lap, "imports", runs from the job's start (job_started)."""

    def __init__(self):
        start = _INTERPRETER_READY if _job_start is None else _job_start
        self._last = time.perf_counter()
        self.laps = [("imports", self._last - start)]
        self.logged = False

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.laps.append((phase, now - self._last))
        self._last = now

    def first_step(self, steps: int) -> None:
        """Laps the first training loop (`steps` steps, the trace included) and logs the time to the first
        step with its laps; later calls do nothing."""
        if self.logged:
            return
        self.logged = True
        self.lap(f"first loop of {steps} step{'s' if steps > 1 else ''} with its trace")
        total = sum(seconds for _, seconds in self.laps)
        log.info("Time to the first step: %.1f s (%s)", total,
                 ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.laps))


# TensorFlow's C++ libraries log through absl before absl is initialised, and such lines ignore
# TF_CPP_MIN_LOG_LEVEL: on a machine without a GPU, every start printed 'cudart_stub.cc ... Could not
# find cuda drivers' twice and 'cuda_platform.cc ... failed call to cuInit'.
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_NO_GPU_PROBES = ("cudart_stub.cc", "failed call to cuInit")
# cli sets this when it chose TF_CPP_MIN_LOG_LEVEL itself; the user's own choice is shown in full.
DEFAULT_LEVEL_MARK = "HARNESS_DEFAULT_TF_LOG_LEVEL"


def _chatter(line: str, level: int, quiet_probes: bool) -> bool:
    if line.startswith("WARNING: All log messages before absl::InitializeLog()"):
        return level > 0
    match = _ABSL_LINE.match(line)
    if not match:
        return False
    return _SEVERITY[match.group(1)] < level or (quiet_probes and any(probe in line for probe in _NO_GPU_PROBES))


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow and finds its devices with stderr (file descriptor 2) captured, then writes back
    what TF_CPP_MIN_LOG_LEVEL asks for. When the harness chose that level (the user did not), the GPU
    probes' failures on a machine without one are left out too."""
    if "tensorflow" in sys.modules:
        return
    try:
        level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        level = 0
    quiet_probes = os.environ.get(DEFAULT_LEVEL_MARK) == "1"
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf
            tf.config.list_physical_devices()  # the CUDA probe; logical devices can still be configured after it
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not _chatter(line, level, quiet_probes)))
            sys.stderr.flush()
