"""Work that may wait in TensorFlow's C++ without end, run so that the run still says so and still stops on a signal.

Python runs a signal handler only once the main thread is back in the interpreter, so a main thread blocked in
C++ (`next` on the iterator of a tf.data service whose dispatcher has no worker, or a traced train loop waiting
there for its batches) ignores SIGINT and SIGTERM. `call` runs such work in a daemon thread and waits for it in
Python, in short slices. One thread serves call after call: a fresh thread for each train loop slowed every
loop, where the kept one costs next to nothing (docs/benchmarks.md).

- once the work has run INTERVAL seconds longer than it is expected to take, a waiting line is logged, and again
  every INTERVAL seconds;
- `timeout` seconds past what it is expected to take, the run fails with Stalled and the caller's one line;
- a signal stops the run as anywhere else (experiments/run_dir/interrupts.py). Inside a deferred() block the
  signal is held, and the work gets a grace to finish, so the block still lands whole: GRACE seconds after the
  signal, or after twice what the work is expected to take if that is later.

Work that a signal leaves unfinished is abandoned, and `Abandoned`, an Interrupted, says so: the work may have
changed part of what a checkpoint holds, so nothing may be saved. Its thread may stay blocked in C++ for good; a
daemon thread, it does not hold up the process's exit (tests/test_service.py times the exit), and the next call
(a sweep's next job) gets a thread of its own. Work that runs past its bound is left the same way.
"""
import logging
import queue
import signal
import threading
import time

from tf_harness.experiments.run_dir import interrupts

log = logging.getLogger(__name__)
INTERVAL = 30.0  # seconds between waiting lines
GRACE = 5.0  # seconds a held signal gives unfinished work, at least
# The longest the main thread sleeps at a time: a signal the OS hands to another thread is seen within it.
_SLICE = 0.25
_worker = None  # the thread that runs the work, started by the first call


class Stalled(RuntimeError):
    """Work ran past its bound; the message is the run's one-line error."""


class Abandoned(interrupts.Interrupted):
    """A signal stopped the run while work it waited for still ran (`what`): nothing may be saved."""

    def __init__(self, signum: int, what: str):
        super().__init__(signum)
        self.what = what


class _Worker:
    """A daemon thread that runs one piece of work after another, each with its outcome and done event.

    Why it lets go of a job's arguments and result before it says the job is done: held until the next job, a
    run's last iterator (its buffers and threads) outlived the run, and the next run's first wait paid for its
    clean-up."""

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="tf_harness: waited work", daemon=True).start()

    def _serve(self):
        while True:
            work, args, outcome, done = self.jobs.get()
            try:
                outcome["value"] = work(*args)
            except BaseException as error:  # noqa: BLE001  raised again in the waiting thread
                outcome["error"] = error
            finally:
                del work, args, outcome  # before done: what the job took and gave is then its caller's alone
                done.set()


def call(work, *args, what, expected=0.0, hint="", timeout=None, stalled=None):
    """Returns `work(*args)`, or raises what it raised, having run it in a daemon thread while this thread waits.
    One caller at a time (the runner's main thread).

    `what` names the work in the waiting line (``waiting for <what> for <seconds> s (<hint>)``; `hint` may be a
    function, asked at each line, for what the wait looks like then); `expected`: the seconds
    it is expected to take at most (the longest such work before it). `timeout`: seconds past `expected` after
    which Stalled is raised with the line `stalled()` gives; None waits however long. A signal raises Abandoned
    when the work is left unfinished (module docstring). Whatever ends the wait early leaves the unfinished work
    its thread, and the next call starts another."""
    global _worker
    if _worker is None:
        _worker = _Worker()
    outcome, done = {}, threading.Event()
    _worker.jobs.put((work, args, outcome, done))
    try:
        _wait(done, what, expected, hint, timeout, stalled)
    except BaseException as error:
        if done.is_set():
            raise
        _worker = None  # the unfinished work keeps its thread; the next call starts another
        if isinstance(error, KeyboardInterrupt):  # a signal outside a deferred() block, or its grace passed
            raise Abandoned(getattr(error, "signum", signal.SIGINT), what) from None
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _wait(done, what, expected, hint, timeout, stalled):
    started = time.monotonic()
    next_line, signalled = expected + INTERVAL, None
    while not done.wait(_SLICE):
        elapsed = time.monotonic() - started
        held = interrupts.held()
        if held is not None:
            signalled = elapsed if signalled is None else signalled
            if elapsed >= max(signalled, 2 * expected) + GRACE:
                raise interrupts.Interrupted(held)
        if timeout is not None and elapsed >= expected + timeout:
            raise Stalled(stalled() if stalled else f"{what} did not finish in {timeout:g} s")
        if elapsed >= next_line:
            took = f", the longest before it took {expected:.1f} s" if expected else ""
            said = hint() if callable(hint) else hint
            log.warning("waiting for %s for %.0f s%s%s", what, elapsed, took, f" ({said})" if said else "")
            next_line += INTERVAL

