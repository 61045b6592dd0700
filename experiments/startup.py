"""Where the time to the first training step goes, logged as one line.

A run's first step comes after Python and TensorFlow import, the dataset is
indexed and its images verified, the model is built, the first input_fn is
built and the first step is traced. Each phase is a lap of one clock.
"""
import logging
import os
import time

log = logging.getLogger(__name__)


def seconds_since_process_start() -> float:
    """Wall seconds since this process started (Linux's /proc); 0.0 where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class StartupClock:
    """Laps of the start-up phases; the first lap runs from the process's start."""

    def __init__(self):
        self.laps = [("imports", seconds_since_process_start())]
        self._last = time.perf_counter()
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
