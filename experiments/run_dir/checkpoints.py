"""A run's checkpoints: which one it may restore, found from the checkpoint files themselves, and the manager
that saves the next ones without deleting or rewriting any that another process wrote.

Which checkpoint: the newest `ckpt-N` (N is the global step it holds) whose files are all there and whose every
float tensor is finite. They are found by listing `ckpt-*.index` in the folder, not through TensorFlow's
`checkpoint` state file: a state file that is missing, empty, garbled, or that lists fewer checkpoints than the
folder holds (a save killed between its files and the state, a copy that left it out) would otherwise hide the
checkpoints from `tf.train.latest_checkpoint`, and a run would start again at step 1 and overwrite them. What
the state file got wrong is logged in one line. A checkpoint may still hold non-finite values (written by an
older release, copied in, damaged on disk): restoring it would fail the run again at once (or train on from NaN),
so resume refuses it and falls back to the next newest, logging which it skipped and why. The check reads each
float tensor of the checkpoint once, about as much as the restore reads.

Saving: `Manager` is a tf.train.CheckpointManager that only ever deletes or rewrites checkpoints it saved itself.
TensorFlow's manager takes the checkpoints its `max_to_keep` may delete from the state file (those stamped after
its `last_preserved_timestamp`), so before creating it the state file is rewritten (atomically, listing only
complete checkpoints) with every checkpoint already in the folder stamped at or before `last_preserved_timestamp`:
the manager then tracks, and deletes, only its own saves. This is the public state-file API
(`generate_checkpoint_state_proto`) rather than clearing the manager's private `_maybe_delete`. After each save
the state file is written again to list every checkpoint in the folder, the older ones included, since the
manager itself records only its own.

The run numbers its checkpoints by global step (`checkpoint_number=step`: ckpt-N holds step N, which resume,
`input_pipelines.json` and the users read), so a run that resumes from a checkpoint older than the newest file
(that one non-finite or unreadable) would reach the newer one's name and overwrite it. It refuses instead, before
training, naming the file and how to go on (`CheckpointAheadError`); renaming its saves would break N = step.
`Manager.save` refuses, too, any name it did not write itself. A save that fails part-way (a disk filled up
while the merged index was written leaves the data beside an index cut short) removes what it wrote, so that
the run resumes from the checkpoint before it once there is room, rather than being refused by its remains.
"""
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import tensorflow as tf
from google.protobuf import text_format

from tf_harness.data.integrity import reading, writing

log = logging.getLogger(__name__)

STATE = "checkpoint"  # TensorFlow's state file in the checkpoint folder
PREFIX = "ckpt"  # the checkpoint name's prefix, tf.train.CheckpointManager's default
_INDEX = re.compile(rf"^{PREFIX}-(\d+)\.index$")
_DATA = re.compile(r"\.data-(\d+)-of-(\d+)$")
# The proto class of the state file, through the public (v1) API that builds it.
_CheckpointState = type(tf.compat.v1.train.generate_checkpoint_state_proto(".", PREFIX, [PREFIX]))


class UnrestorableError(RuntimeError):
    """A run directory holds checkpoints, but none of them may be restored."""


class CheckpointAheadError(UnrestorableError):
    """A checkpoint newer than the one restored is in the way of the run's next saves."""


def on_disk(checkpoint_dir) -> dict:
    """{N: prefix} of the checkpoints in `checkpoint_dir`, found by their `ckpt-N.index` files, N ascending."""
    found = {}
    folder = Path(checkpoint_dir)
    if folder.is_dir():
        for path in folder.iterdir():
            match = _INDEX.match(path.name)
            if match and path.is_file():
                found.setdefault(int(match.group(1)), folder / path.name[:-len(".index")])
    return dict(sorted(found.items()))


def missing_files(path) -> str | None:
    """Which of the files of the checkpoint at `path` (a prefix such as `.../ckpt-6`) are missing; None when none."""
    path = Path(path)
    if not Path(f"{path}.index").is_file():
        return "its index file is missing"
    shards, counts = set(), set()
    for data in path.parent.glob(f"{path.name}.data-*-of-*"):
        match = _DATA.search(data.name)
        if match and data.is_file():
            shards.add(int(match.group(1)))
            counts.add(int(match.group(2)))
    if not counts:
        return "its data file is missing"
    if len(counts) > 1 or shards != set(range(counts.pop())):
        return "some of its data files are missing"
    return None


def problem(path, whole=False) -> str | None:
    """Why the checkpoint at `path` (a prefix such as `.../ckpt-6`) may not be restored, or None when it may:
    a missing or unreadable file, or the names of the tensors that hold NaN or infinite values. Its float
    tensors are read, which is what evaluation restores; with `whole`, every tensor, the input iterator's state
    included, which is what a training run restores."""
    missing = missing_files(path)
    if missing:
        return missing
    try:
        reader = tf.train.load_checkpoint(str(path))
        dtypes = sorted(reader.get_variable_to_dtype_map().items())
        others = [(name, dtype) for name, dtype in dtypes if not dtype.is_floating]
        if whole and others:  # read as a restore reads them (an iterator's state is a variant, which numpy can't hold)
            tf.raw_ops.RestoreV2(prefix=str(path), tensor_names=[name for name, _ in others],
                                 shape_and_slices=[""] * len(others), dtypes=[dtype for _, dtype in others])
        nonfinite = [name for name, dtype in dtypes
                     if dtype.is_floating and not np.isfinite(reader.get_tensor(name)).all()]
    except Exception as error:  # noqa: BLE001  the reader raises OpError, IndexError (a cut file), ValueError...
        return f"it cannot be read ({type(error).__name__}: {str(error).splitlines()[0]})"
    if nonfinite:
        shown = ", ".join(nonfinite[:3]) + (f" and {len(nonfinite) - 3} more" if len(nonfinite) > 3 else "")
        return f"{len(nonfinite)} tensor(s) hold NaN or infinite values ({shown})"
    return None


def state_problem(checkpoint_dir, found=None) -> str | None:
    """What the `checkpoint` state file of `checkpoint_dir` gets wrong about the checkpoints `found` there
    (by default, on_disk's): missing, empty, unreadable, naming a checkpoint that is not there or leaving out
    one that is. None when it agrees with the files (or neither holds any checkpoint)."""
    found = on_disk(checkpoint_dir) if found is None else found
    state_file = Path(checkpoint_dir) / STATE
    try:
        text = reading.read_bytes(state_file).decode()  # before TensorFlow's manager reads it
    except FileNotFoundError:
        return "was missing" if found else None
    except (OSError, UnicodeDecodeError) as error:
        return f"could not be read ({type(error).__name__}: {_first_line(error)})"
    if not text.strip():
        return "was empty"
    state = _CheckpointState()
    try:
        text_format.Parse(text, state)
    except Exception as error:  # noqa: BLE001  text_format.ParseError, and what protobuf raises on odd bytes
        return f"could not be read ({type(error).__name__}: {_first_line(error)})"
    if not state.model_checkpoint_path:
        return "named no checkpoint"
    # Names only: the state file may hold absolute paths from another place (a copied run directory).
    listed = list(dict.fromkeys(Path(p).name for p in [*state.all_model_checkpoint_paths,
                                                           state.model_checkpoint_path]))
    names = {prefix.name for prefix in found.values()}
    gone = [name for name in listed if name not in names]
    if gone:
        return f"named {_names(gone)}, which {'is' if len(gone) == 1 else 'are'} not there"
    left_out = [prefix.name for prefix in found.values() if prefix.name not in listed]
    if left_out:
        return f"left out {_names(left_out)} (it listed {len(listed)} of the {len(found)} checkpoints in the folder)"
    return None


def newest_finite(checkpoint_dir, whole=False) -> str | None:
    """The newest checkpoint in `checkpoint_dir` (the highest N of its `ckpt-N.index` files) that may be
    restored (`problem`; `whole` for a training run); each newer one skipped is logged with its reason, and what
    the state file got wrong, if anything, in one line. None when there is no checkpoint.

    Raises UnrestorableError when there are checkpoints but none may be restored: starting afresh would
    overwrite them, so the user decides.
    """
    found = on_disk(checkpoint_dir)
    trouble = state_problem(checkpoint_dir, found)
    if trouble:
        newest = (f"{found[max(found)].name}" + (f" (and {len(found) - 1} older)" if len(found) > 1 else "")
                  if found else "no checkpoint")
        log.warning("%s %s; found %s from their files", Path(checkpoint_dir) / STATE, trouble, newest)
    reasons = []
    for path in reversed(found.values()):
        reason = problem(path, whole)
        if reason is None:
            return str(path)
        log.warning("Not restoring %s: %s; trying the checkpoint before it", path, reason)
        reasons.append(f"{path.name}: {reason}")
    if reasons:
        raise UnrestorableError(f"no checkpoint in {checkpoint_dir} can be restored ({'; '.join(reasons)}); move "
                                f"them away to train afresh in this run directory")
    return None


def refuse_ahead(checkpoint_dir, step, train_steps) -> None:
    """Raises CheckpointAheadError when `checkpoint_dir` holds a checkpoint that a run resumed at global `step`
    would overwrite on its way to `train_steps` (it saves ckpt-N at step N, by interval, at the end or on a signal)."""
    ahead = [n for n in on_disk(checkpoint_dir) if step < n <= train_steps]
    if not ahead:
        return
    first, others = min(ahead), len(ahead) - 1
    raise CheckpointAheadError(
        f"{Path(checkpoint_dir) / f'{PREFIX}-{first}'}{f' (and {others} more)' if others else ''} is ahead of global "
        f"step {step}, the newest checkpoint that can be restored, and training on to trainer.train_steps="
        f"{train_steps} would overwrite it; move {PREFIX}-{first}.*{' and the others' if others else ''} out of "
        f"{checkpoint_dir} to train again from step {step}, or set trainer.train_steps to {first - 1} or less")


def write_state(checkpoint_dir, latest=None) -> None:
    """Rewrites the `checkpoint` state file of `checkpoint_dir` to list every complete checkpoint in it, oldest
    (lowest N) first and `latest` (a prefix or name; default the highest N) last, every one stamped at or before
    the state's last_preserved_timestamp, so that a tf.train.CheckpointManager created on it deletes none of them.

    Written only after checking each listed checkpoint's files, to a temporary file then moved into place
    (writing.publish), so the state file never names a checkpoint that is not there; removed when there is
    none."""
    folder = Path(checkpoint_dir)
    state_file = folder / STATE
    names = [prefix.name for prefix in on_disk(folder).values() if missing_files(prefix) is None]
    if not names:
        state_file.unlink(missing_ok=True)
        return
    latest = Path(latest).name if latest and Path(latest).name in names else names[-1]
    names.remove(latest)
    names.append(latest)
    now = time.time()
    stamps = [min(os.stat(folder / f"{name}.index").st_mtime, now) for name in names]
    state = tf.compat.v1.train.generate_checkpoint_state_proto(
        ".", latest, all_model_checkpoint_paths=names, all_model_checkpoint_timestamps=stamps,
        last_preserved_timestamp=now)
    # The name file_io's own atomic write uses, which experiments/run_dir/leftovers.py removes after a kill.
    temporary = folder / f"{STATE}.tmp{uuid.uuid4().hex}"
    try:
        with writing.replacing(state_file, temporary=temporary, fsync=True) as f:
            f.write(text_format.MessageToString(state))
            if any(missing_files(folder / name) for name in names):
                raise _ListedGone
    except _ListedGone:  # a checkpoint deleted meanwhile: list what is there
        return write_state(folder, latest)


class _ListedGone(Exception):
    """A checkpoint the state was about to list is gone."""


class Manager(tf.train.CheckpointManager):
    """A tf.train.CheckpointManager for a run that resumed at the current value of `step_counter` from
    `restored` (a checkpoint prefix, or None), in a folder that may hold checkpoints it did not write:
    its max_to_keep deletes only its own saves, and it never rewrites a checkpoint it did not save.

    `run_checkpoints`: the run's checkpoint folder, when `directory` is another (a non-chief worker's scratch
    folder); `train_steps`: the step the run trains to. Raises CheckpointAheadError (before writing anything)
    when a checkpoint in `run_checkpoints` lies between the resumed step and `train_steps`.
    """

    def __init__(self, checkpoint, directory, max_to_keep, *, step_counter, restored=None, train_steps=None,
                 run_checkpoints=None):
        directory = Path(directory)
        if train_steps is not None:
            refuse_ahead(run_checkpoints or directory, int(step_counter.read_value().numpy()), train_steps)
        if directory.is_dir():
            # Every checkpoint already there is listed as preserved: TensorFlow's manager leaves those alone.
            write_state(directory, restored)
        self._own = set()
        super().__init__(checkpoint, str(directory), max_to_keep=max_to_keep, step_counter=step_counter)

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        number = int(self.checkpoint.save_counter.read_value().numpy()) + 1 if checkpoint_number is None else \
            int(checkpoint_number)
        prefix = os.path.join(self.directory, f"{PREFIX}-{number}")
        if prefix not in self._own and Path(f"{prefix}.index").exists():
            raise CheckpointAheadError(f"{prefix} was not saved by this run and would be overwritten; move "
                                       f"{PREFIX}-{number}.* out of {self.directory} to save there")
        try:
            path = super().save(checkpoint_number, check_interval=check_interval, options=options)
        except Exception:
            _remove_failed_save(prefix)
            raise
        if path:
            self._own.add(path)
            write_state(self.directory, path)  # TensorFlow's manager lists only its own saves
        return path


def _remove_failed_save(prefix) -> None:
    """Removes what a save of `prefix` that raised (a full disk, a quota) wrote, unless the checkpoint there is
    complete and readable (the error came after its files, or before they were touched). A part left behind,
    such as an index cut short beside its data, would be skipped on resume yet stand ahead of the checkpoint
    resumed from, refusing the run; only this run's own save is removed: Manager.save refuses any other's name."""
    prefix = Path(prefix)
    if problem(prefix) is None:
        return
    # Its index and data files, and any temporary of theirs (`.tempstate<n>`); check_before_start refused to start
    # with files of this step already there, so they are all this save's.
    parts = [path for path in prefix.parent.glob(f"{prefix.name}.*") if path.is_file()]
    staging = [path for path in prefix.parent.glob(f"{prefix.name}_temp*") if path.is_dir()]
    try:
        for path in parts:
            path.unlink(missing_ok=True)
        for path in staging:
            shutil.rmtree(path)
    except OSError as error:  # a folder turned read-only: the next start refuses with the file named
        log.warning("Could not remove the files of the failed save of %s: %s", prefix, error)
        return
    log.warning("Removed the files of the failed save of %s: %s", prefix, ", ".join(p.name for p in parts + staging))


def _names(names) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _first_line(error) -> str:
    return (str(error).splitlines() or [""])[0]


def check_before_start(checkpoint_dir, mode, train_steps, recorded_run=True) -> None:
    """Before a run writes anything in its directory, what its checkpoints allow. Raises UnrestorableError when
    the folder holds checkpoints but none may be restored, and, for a training mode, CheckpointAheadError
    when training on from the one that is restored to `train_steps` would overwrite a checkpoint file already there: a newer checkpoint that cannot be restored, or
    the files of one whose index is gone. Why a newer checkpoint is skipped is logged with a refusal (the restore
    logs it otherwise). A `recorded_run` with no checkpoint to train on from is logged too: it starts at step 0."""
    checkpoint_dir = Path(checkpoint_dir)
    reasons, refused = _Kept(), False
    logger = logging.getLogger(__name__)
    logger.addHandler(reasons)
    propagate, logger.propagate = logger.propagate, False
    try:
        training = mode in ("train", "train_and_evaluate")
        latest = newest_finite(checkpoint_dir, whole=training)
        if not training:
            return
        step = int(latest.rpartition("-")[2]) if latest else 0
        refuse_ahead(checkpoint_dir, step, train_steps)
        # Files of a checkpoint whose index is gone are not a checkpoint, but a save of that step would overwrite them.
        orphans = {}
        for path in sorted(checkpoint_dir.glob(f"{PREFIX}-*.*")):
            match = re.match(rf"^{PREFIX}-(\d+)\.", path.name)
            if match and path.is_file() and step < int(match.group(1)) <= train_steps:
                orphans.setdefault(int(match.group(1)), []).append(path)
        if orphans:
            number = min(orphans)
            raise CheckpointAheadError(
                f"{orphans[number][0]} is a file of checkpoint {PREFIX}-{number}, whose index is "
                f"missing, ahead of global step {step}, the newest checkpoint that can be restored; training on to "
                f"trainer.train_steps={train_steps} would overwrite it; move {PREFIX}-{number}.* out of "
                f"{checkpoint_dir} to train again from step {step}, or set trainer.train_steps to {number - 1} or less")
    except UnrestorableError as error:
        refused = error.before_start = True  # the job changed nothing: experiments/cli.py's Outcome.ran
        raise
    finally:
        logger.removeHandler(reasons)
        logger.propagate = propagate
        for record in reasons.records if refused else ():  # why each newer checkpoint was skipped, before the line
            logger.handle(record)
    if latest is None and recorded_run:
        log.warning("No checkpoint in %s to resume from: training starts at global step 0", checkpoint_dir)


class _Kept(logging.Handler):
    """Keeps the records it is handed, for check_before_start."""

    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)
