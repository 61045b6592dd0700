"""Expected OS failures as one line: a full disk, a read-only folder, a path too long.

Python raises these as OSError with an errno; TensorFlow's file ops (checkpoints, summaries, the
tf.data cache) raise its own OpError subclasses whose message ends in the OS's wording, e.g.
`.../ckpt-6_temp/part-00000-of-00001.data-00000-of-00001.tempstate...; No space left on device`.
Both kinds become `<what happened>: <path>; <what to do>`. Nothing is lost on such a failure: a
checkpoint is written beside the previous ones and only then named in the `checkpoint` file, so the
newest complete one stays, and the next start removes the half-written one (experiments/run_dir/leftovers.py).

Nothing here imports TensorFlow, so the cli can use it for Hydra's own failures too (creating the
run directory, writing `.hydra/`).
"""
import errno
import os
import re

# errno -> what the user can do about it.
ADVICE = {
    errno.ENOSPC: "free some space, then run the same command again: it resumes from the newest complete checkpoint",
    errno.EDQUOT: "free some space, then run the same command again: it resumes from the newest complete checkpoint",
    errno.EROFS: "make it writable, or choose another hydra.run.dir (or HARNESS_CACHE for the cache)",
    errno.EACCES: "make it writable, or choose another hydra.run.dir (or HARNESS_CACHE for the cache)",
    errno.EPERM: "make it writable, or choose another hydra.run.dir (or HARNESS_CACHE for the cache)",
    errno.ENAMETOOLONG: "choose a shorter hydra.run.dir (each folder name at most 255 bytes)",
    # A file where a folder must be: hydra.run.dir or HARNESS_CACHE naming a file, or a file inside either.
    errno.EEXIST: "a file stands where a folder must be; move it, or choose another hydra.run.dir (or HARNESS_CACHE)",
    errno.ENOTDIR: "a file stands where a folder must be; move it, or choose another hydra.run.dir (or HARNESS_CACHE)",
    errno.EISDIR: "a folder stands where a file must be; move it, or choose another hydra.run.dir (or HARNESS_CACHE)",
}
# TensorFlow's wording: `{{function_node ...}} <path>; <strerror> [Op:SaveV2]`, or `<path>; <strerror>`; some ops
# name no path (`{{function_node ...}} Not a directory [Op:CreateSummaryFileWriter]`).
_REASONS = "|".join(re.escape(os.strerror(number)) for number in ADVICE)
_TF_MESSAGE = re.compile(r"(?:(?P<path>[^\s{}]+?);?\s+)?(?P<reason>" + _REASONS + ")")


def chain(error: BaseException):
    """`error`, then each error it came from (its cause, or the one being handled when it was raised)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def describe(error: BaseException) -> str | None:
    """The one line for `error` (or the error it came from) when it is an expected OS failure; None otherwise."""
    return next(filter(None, map(_describe_one, chain(error))), None)


def _describe_one(error):
    if isinstance(error, OSError) and error.errno in ADVICE:
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{where}; {ADVICE[error.errno]}"
    if type(error).__module__.startswith("tensorflow"):
        match = _TF_MESSAGE.search(str(error))
        if match:
            number = next(n for n in ADVICE if os.strerror(n) == match["reason"])
            where = f": {match['path']}" if match["path"] else ""
            return f"{match['reason']}{where}; {ADVICE[number]}"
    return None
