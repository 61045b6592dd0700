"""Expected OS failures as one line: a full disk, a read-only folder, a path too long, a want of file handles.

Python raises these as OSError with an errno; TensorFlow's file ops (checkpoints, summaries, the
tf.data cache) raise its own OpError subclasses whose message ends in the OS's wording, e.g.
`.../ckpt-6_temp/part-00000-of-00001.data-00000-of-00001.tempstate...; No space left on device`.
Both kinds become `<what happened>: <path>; <what to do>`. Nothing is lost on such a failure: a
checkpoint is written beside the previous ones and only then named in the `checkpoint` file, so the
newest complete one stays, and the next start removes the half-written one (experiments/run_dir/leftovers.py).
A full disk before the run has a checkpoint leaves nothing to resume: the advice is then where to run instead.
A write to a file opened earlier fails without naming it (Python's OSError has no filename then): the caller
names the path it was writing under.

Nothing here imports TensorFlow, so the cli can use it for Hydra's own failures too (creating the
run directory, writing `.hydra/`).
"""
import errno
import os
import re

from tf_harness.data.integrity import resources

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
# A full disk (or quota) when the run directory holds no checkpoint to resume from.
NOTHING_TO_RESUME = "free some space, or choose a hydra.run.dir on a disk with room"
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


def describe(error: BaseException, where=None, resumable=True, run_dir=None) -> str | None:
    """The one line for `error` (or the error it came from) when it is an expected OS failure; None otherwise.

    `where`: the path to name when the error names none; `resumable`: whether the run directory holds a checkpoint
    that the same command resumes from once there is room (the advice for a full disk says so, or where to run).
    `run_dir`: the run directory the command line names; a file system that makes no folders of a user's
    (/proc) refuses to make it, or a folder above it, with "No such file or directory", expected there alone."""
    for one in chain(error):
        if run_dir is not None and isinstance(one, FileNotFoundError) and _makes(one.filename, run_dir):
            return f"{one.strerror}: {one.filename}; the folder cannot be made there: choose another hydra.run.dir"
    return next(filter(None, (_describe_one(one, where, resumable) for one in chain(error))), None) or \
        _exhausted(error)


def _exhausted(error) -> str | None:
    """The line for a want of a resource that ADVICE leaves out (file handles, memory, the file size limit): the
    one data/integrity/resources.py gives, which names what ran out."""
    try:
        resources.raise_if_exhausted(error)
    except resources.OutOfResource as out:
        return str(out)
    return None


def _makes(path, run_dir) -> bool:
    """Whether `path` is `run_dir`, or a folder above it, in a folder that exists: one making the run directory makes."""
    if not isinstance(path, str):
        return False
    path, run_dir = os.path.abspath(path), os.path.abspath(run_dir)
    return (path == run_dir or run_dir.startswith(path.rstrip(os.sep) + os.sep)) and os.path.isdir(
        os.path.dirname(path))


def _describe_one(error, where, resumable):
    if isinstance(error, OSError) and error.errno in ADVICE:
        reason, number, path = error.strerror, error.errno, error.filename
    elif type(error).__module__.startswith("tensorflow") and (match := _TF_MESSAGE.search(str(error))):
        reason, path = match["reason"], match["path"]
        number = next(n for n in ADVICE if os.strerror(n) == reason)
    else:
        return None
    path = path or where
    advice = ADVICE[number] if resumable or number not in (errno.ENOSPC, errno.EDQUOT) else NOTHING_TO_RESUME
    return f"{reason}{f': {path}' if path else ''}; {advice}"
