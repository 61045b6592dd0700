"""Which checkpoint a run may restore: the newest one whose every float tensor is finite.

The runner never writes non-finite weights, but a checkpoint may still hold them: one written by an
older release, copied in, or damaged on disk. Restoring it would fail the run again at once (or
train on from NaN), so resume refuses it and falls back to the next newest, logging which it skipped
and why. The check reads each float tensor of the checkpoint once, about as much as the restore reads.
"""
import logging
from pathlib import Path

import numpy as np
import tensorflow as tf

log = logging.getLogger(__name__)


class UnrestorableError(RuntimeError):
    """A run directory holds checkpoints, but none of them may be restored."""


def problem(path) -> str | None:
    """Why the checkpoint at `path` (a prefix such as `.../ckpt-6`) may not be restored, or None when it may:
    a missing or unreadable file, or the names of the tensors that hold NaN or infinite values."""
    if not Path(f"{path}.index").is_file():
        return "its index file is missing"
    try:
        reader = tf.train.load_checkpoint(str(path))
        nonfinite = [name for name, dtype in sorted(reader.get_variable_to_dtype_map().items())
                     if dtype.is_floating and not np.isfinite(reader.get_tensor(name)).all()]
    except Exception as error:  # noqa: BLE001  the reader raises OpError, IndexError (a cut file), ValueError...
        return f"it cannot be read ({type(error).__name__}: {str(error).splitlines()[0]})"
    if nonfinite:
        shown = ", ".join(nonfinite[:3]) + (f" and {len(nonfinite) - 3} more" if len(nonfinite) > 3 else "")
        return f"{len(nonfinite)} tensor(s) hold NaN or infinite values ({shown})"
    return None


def newest_finite(checkpoint_dir) -> str | None:
    """The newest checkpoint in `checkpoint_dir` (by the `checkpoint` state file's save order) that may be
    restored; each newer one skipped is logged with its reason. None when there is no checkpoint.

    Raises UnrestorableError when there are checkpoints but none may be restored: starting afresh would
    overwrite them, so the user decides.
    """
    state = tf.train.get_checkpoint_state(str(checkpoint_dir))
    if state is None:
        return None
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    if state.model_checkpoint_path in paths:  # the latest is last in save order; keep it so
        paths.remove(state.model_checkpoint_path)
        paths.append(state.model_checkpoint_path)
    reasons = []
    for path in reversed(paths):
        path = str(Path(checkpoint_dir) / Path(path).name)  # the state file may hold paths from another place
        reason = problem(path)
        if reason is None:
            return path
        log.warning("Not restoring %s: %s; trying the checkpoint before it", path, reason)
        reasons.append(f"{Path(path).name}: {reason}")
    raise UnrestorableError(f"no checkpoint in {checkpoint_dir} can be restored ({'; '.join(reasons)}); move "
                            f"them away to train afresh in this run directory")
