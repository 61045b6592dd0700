"""Interrupts as exceptions: SIGINT and SIGTERM both stop a run the way Ctrl-C does.

Every layer may import this module (it needs nothing but the standard library), so
the code that saves a checkpoint on an interrupt and the command line that maps it
to an exit status agree on one exception.
"""
import contextlib
import signal
import threading

# Signals that came while a deferred() block ran; raised when it ends.
_pending = []
_deferring = False


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal. A subclass of KeyboardInterrupt, so everything that
    already saves and re-raises on Ctrl-C handles SIGTERM the same way; `signum`
    lets the command line exit 128 + signum (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_interrupt(signum, frame):
    """A signal handler: stops whatever the main thread is doing with Interrupted, or, inside a
    deferred() block, when that block ends."""
    if _deferring:
        _pending.append(signum)
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def deferred():
    """Runs the block whole: SIGINT or SIGTERM arriving inside it is raised as Interrupted once it ends.

    For work whose parts must land together (a train loop, its summary and its checkpoint; an
    evaluation's summary and metrics.json). Nested blocks raise at the outermost one's end; a block that
    fails otherwise keeps its own exception.
    """
    global _deferring
    outer = _deferring
    _deferring = True
    try:
        yield
    finally:
        _deferring = outer
        held = [] if outer else _pending[:]
        if not outer:
            _pending.clear()  # a block that failed otherwise leaves no stale signal for the next one
    if held:
        raise Interrupted(held[0])


def install() -> None:
    """Makes SIGINT and SIGTERM raise Interrupted in the main thread.

    Python's default SIGTERM action kills the process outright: no checkpoint, no
    message. Handlers can only be set from the main thread; elsewhere (a test
    calling the runner from a worker thread) the defaults stay.
    """
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, raise_interrupt)


def exit_status(error: KeyboardInterrupt) -> int:
    """The shell's convention for a process stopped by a signal: 128 + the signal number."""
    return 128 + getattr(error, "signum", signal.SIGINT)
