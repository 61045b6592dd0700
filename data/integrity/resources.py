"""Running out of memory, disk, file handles or a service: what the machine lacks, never a fault of the data.

A read or decode that fails for want of a resource fails for good files as for bad ones. Taken for the file's
fault, it would list good files in skipped.csv or mark them bad in a cache, and a user would delete good data. So
every place that judges a file asks `exhausted` first, and raises OutOfResource, naming what ran out, instead of
giving a verdict. Nothing here imports TensorFlow: its errors are told by their class names and the OS's wording.
"""
import errno
import os

# errno -> what ran out.
_ERRNOS = {errno.ENOMEM: "memory", errno.ENOSPC: "disk space", errno.EDQUOT: "disk quota",
           errno.EFBIG: "room under the file size limit (ulimit -f)",
           errno.EMFILE: "file handles", errno.ENFILE: "file handles (the whole system's)"}
# TensorFlow's error classes -> what ran out.
_TF_ERRORS = {"ResourceExhaustedError": "memory", "UnavailableError": "a service (unavailable)"}


class OutOfResource(RuntimeError):
    """The machine ran out of something a run needs; the message is the run's one line and names what."""


def _chain(error):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def exhausted(error: BaseException) -> str | None:
    """What ran out when `error` (or an error it came from) is a want of a resource, else None: memory (MemoryError,
    ENOMEM, TensorFlow's ResourceExhausted or OOM), disk space or quota, room under the file size limit, file
    handles, or a service (TensorFlow's Unavailable)."""
    for one in _chain(error):
        if isinstance(one, MemoryError):
            return "memory"
        if isinstance(one, OSError) and one.errno in _ERRNOS:
            return _ERRNOS[one.errno]
        for cls in type(one).__mro__:
            if cls.__module__.startswith("tensorflow") and cls.__name__ in _TF_ERRORS:
                return _TF_ERRORS[cls.__name__]
        if type(one).__module__.startswith("tensorflow"):  # an OpError's message ends in the OS's wording
            found = next((what for number, what in _ERRNOS.items() if os.strerror(number) in str(one)), None)
            if found:
                return found
    return None


def raise_if_exhausted(error: BaseException, doing: str = "") -> None:
    """Raises OutOfResource from `error` when it is a want of a resource (`exhausted`); `doing` says what was being
    done, for the line. Does nothing otherwise."""
    what = exhausted(error)
    if what is None:
        return
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    raise OutOfResource(f"out of {what}{f' while {doing}' if doing else ''} ({first}); the data is not at fault: "
                        f"{_ADVICE.get(what, _ADVICE['memory'])}") from error


_ADVICE = {
    "memory": "ask for less (a smaller pipeline.image_size or pipeline.batch_size) or free some, then run the same "
              "command again",
    "disk space": "free some space, then run the same command again",
    "disk quota": "free some space, then run the same command again",
    "room under the file size limit (ulimit -f)": "raise the limit, then run the same command again",
    "file handles": "raise the limit (ulimit -n) or close other programs, then run the same command again",
    "file handles (the whole system's)": "close other programs, then run the same command again",
    "a service (unavailable)": "start the service again (or point at a live one), then run the same command again",
}
