"""Interrupts as exceptions: SIGINT and SIGTERM both stop a run the way Ctrl-C does; so does SIGUSR2 where a
launcher asked for it (submitit, before a job's time limit), which then requeues the job once the run has saved.

Every layer may import this module (it needs nothing but the standard library), so
the code that saves a checkpoint on an interrupt and the command line that maps it
to an exit status agree on one exception.

A signal is raised where it lands, except where an exception would not stop the run or would
not be handled: inside a deferred() block (raised when the block ends); inside a finalizer
(`__del__`, e.g. tqdm's), where Python would print it as "Exception ignored in ..." with a
traceback and go on (raised at the next deferred() block's end, or before the job logs its
outcome: `raise_held`); and once the job has logged its outcome and exit status (`finished`),
from then to the process's exit: the run has finished, and exits with the status it logged
(`exiting` ignores both signals for the last steps of the exit, when Python restores their defaults).
In a sweep, the next job's start (`started`) raises a signal held since the previous job ended.
"""
import contextlib
import signal
import sys
import threading

# Signals that came while a deferred() block ran, inside a finalizer or after the job finished; raised later.
_pending = []
_deferring = False
_finished = False
# The handler a launcher set for SIGUSR2 before the run started (submitit's, which requeues the job), or None.
_requeue = None


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal. A subclass of KeyboardInterrupt, so everything that
    already saves and re-raises on Ctrl-C handles SIGTERM the same way; `signum`
    lets the command line exit 128 + signum (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_interrupt(signum, frame):
    """A signal handler: stops whatever the main thread is doing with Interrupted, or holds the signal
    (the module's docstring says when, and when it is raised)."""
    if _deferring or _finished or _in_finalizer(frame):
        _pending.append(signum)
        return
    raise Interrupted(signum)


def _in_finalizer(frame) -> bool:
    """Whether the main thread runs a finalizer (a `__del__`, whatever called it) or the interpreter is exiting."""
    if sys.is_finalizing():
        return True
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def raise_held() -> None:
    """Raises Interrupted for a signal held outside a deferred() block (one that landed in a finalizer)."""
    if _pending and not _deferring and not _finished:
        signum = _pending[0]
        _pending.clear()
        raise Interrupted(signum)


def held():
    """The signal held since a deferred() block began (or since one landed in a finalizer), or None: what work
    waited on inside the block looks at (experiments/run_dir/blocking.py)."""
    return _pending[0] if _pending else None


def finished() -> None:
    """The job has logged its outcome and exit status: from here on a signal is held, not raised, so that the
    status stands and nothing prints a traceback on the way out. `started` ends this for a sweep's next job."""
    global _finished
    _finished = True


def exiting() -> None:
    """The process is about to exit with the status its run logged: SIGINT and SIGTERM are ignored from here on.
    (Python puts back their default actions as it shuts down, so a late Ctrl-C would otherwise kill it with the
    signal instead of its status; an ignored signal is left ignored.)"""
    finished()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


def started() -> None:
    """A job starts: signals are raised again, one held since the previous job ended first."""
    global _finished
    _finished = False
    raise_held()


def reset() -> None:
    """The module's state as a new process has it: no signal held, no block deferring, no job finished, no
    launcher's handler. A run from Python (experiments/api.py) calls it on its way out, so that the caller's
    process handles signals afterwards as it did before."""
    global _deferring, _finished, _requeue
    _pending.clear()
    _deferring = _finished = False
    _requeue = None


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
    global _requeue
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, raise_interrupt)
        # submitit signals a job SIGUSR2 before its time limit, and its handler requeues the job at once: the run
        # saves first (Interrupted), then `requeue` hands the signal on.
        previous = signal.getsignal(signal.SIGUSR2)
        if callable(previous) and previous is not raise_interrupt:
            _requeue = previous
            signal.signal(signal.SIGUSR2, raise_interrupt)


def requeue(error: BaseException):
    """After a run that SIGUSR2 stopped (`error`) has saved: hands the signal to the handler the launcher set for
    it (submitit's, which requeues the job and exits). Returns the line of a job that was not requeued (its time
    limit reached too many times); None for any other interrupt, or without such a handler."""
    if _requeue is None or getattr(error, "signum", None) != signal.SIGUSR2:
        return None
    finished()  # the scheduler's SIGTERM that follows a requeue is held: the run has saved
    try:
        _requeue(signal.SIGUSR2, None)
    except Exception as refused:  # submitit's UncompletedJobError: "Job not requeued because: ..."
        return (f"stopped by SIGUSR2 before the time limit and not requeued ({refused}); the run saved its "
                f"checkpoint: running the same command again resumes it")
    return None


def behind(error: BaseException) -> KeyboardInterrupt | None:
    """`error` when it is an interrupt, or the interrupt an ImportError was raised from; else None. A signal that
    lands while an extension module initialises comes back as its ImportError ("initialization failed")."""
    while isinstance(error, ImportError):
        error = error.__cause__
    return error if isinstance(error, KeyboardInterrupt) else None


def exit_status(error: KeyboardInterrupt) -> int:
    """The shell's convention for a process stopped by a signal: 128 + the signal number."""
    return 128 + getattr(error, "signum", signal.SIGINT)
