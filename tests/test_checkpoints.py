"""Resume restores only a finite checkpoint: a non-finite or unreadable newest one is skipped, with the reason logged.
Checkpoints are found from their files, whatever the `checkpoint` state file says, and no start deletes or rewrites
a checkpoint it did not save itself."""
import json
import logging
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tf_harness.data.iterators import make_iterator
from tf_harness.experiments.config.settings import Settings
from tf_harness.experiments.run_dir import checkpoints
from tests.refusals import assert_error, assert_names, one_naming, raises_naming


def _save(manager, variable, value, step):
    variable.assign(value)
    return manager.save(checkpoint_number=step)


def test_the_newest_finite_checkpoint_is_chosen_and_the_others_named(tmp_path, caplog):
    weights = tf.Variable(tf.zeros([3]))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=weights, step=tf.Variable(0, dtype=tf.int64)),
                                         str(tmp_path), max_to_keep=5)
    good = _save(manager, weights, [1.0, 2.0, 3.0], 3)
    _save(manager, weights, [1.0, np.nan, 3.0], 6)
    _save(manager, weights, [np.inf, 2.0, 3.0], 9)
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.run_dir.checkpoints"):
        assert checkpoints.newest_finite(tmp_path) == good
    assert_names(one_naming(caplog.messages, tmp_path / "ckpt-9"), "1 tensor(s)", "NaN", "model/")
    assert f"Not restoring {tmp_path / 'ckpt-6'}" in caplog.text
    assert checkpoints.problem(good) is None


def test_a_missing_or_truncated_checkpoint_is_skipped_and_none_restorable_is_an_error(tmp_path, caplog):
    assert checkpoints.newest_finite(tmp_path) is None  # no checkpoint: start afresh
    weights = tf.Variable(tf.ones([1000]))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=weights), str(tmp_path), max_to_keep=5)
    first = _save(manager, weights, tf.ones([1000]), 1)
    second = _save(manager, weights, tf.ones([1000]) * 2, 2)
    data = next(tmp_path.glob("ckpt-2.data-*"))
    data.write_bytes(data.read_bytes()[:100])  # a save cut short by a full disk
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.run_dir.checkpoints"):
        assert checkpoints.newest_finite(tmp_path) == first
    assert_names(one_naming(caplog.messages, second), "cannot be read")
    for path in tmp_path.glob("ckpt-1.*"):
        path.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.run_dir.checkpoints"):
        with raises_naming(checkpoints.UnrestorableError, tmp_path, "ckpt-2", "cannot be read"):
            checkpoints.newest_finite(tmp_path)
    assert_names(one_naming(caplog.messages, tmp_path / "checkpoint"), "named ckpt-1", "found ckpt-2")


def test_a_damaged_input_iterator_state_is_skipped_by_training_and_read_by_evaluation(tmp_path, caplog):
    """A checkpoint whose iterator state no longer reads back (bytes written over on disk): a training run resumes
    from the checkpoint before it, and refuses in one line to train over it; evaluation, which restores no
    iterator, still reads it."""
    weights = tf.Variable(tf.zeros([4]))
    iterator = make_iterator(tf.data.Dataset.range(1000).shuffle(100, seed=1).batch(4))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=weights, input_iterator=iterator),
                                         str(tmp_path), max_to_keep=5)
    first = _save(manager, weights, tf.ones([4]), 2)
    next(iterator)
    second = _save(manager, weights, tf.ones([4]) * 2, 4)
    data = next(tmp_path.glob("ckpt-4.data-*"))
    content = bytearray(data.read_bytes())
    weights_bytes = np.full([4], 2.0, np.float32).tobytes()
    assert content.count(weights_bytes) == 1 and len(content) > 1000  # the iterator's state is the rest
    at = len(content) // 2 if content.find(weights_bytes) not in range(len(content) // 2 - 16, len(content) // 2 + 1) \
        else len(content) // 4
    content[at] ^= 0xFF  # one byte of the iterator's state, on disk
    data.write_bytes(bytes(content))
    assert checkpoints.problem(second) is None  # its weights read back whole: evaluation may use it
    assert checkpoints.problem(second, whole=True).startswith("it cannot be read (")
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.run_dir.checkpoints"):
        assert checkpoints.newest_finite(tmp_path, whole=True) == first
    assert_names(one_naming(caplog.messages, second), "cannot be read")
    checkpoints.check_before_start(tmp_path, "evaluate", 4)
    with raises_naming(checkpoints.CheckpointAheadError, second, "global step 2", "trainer.train_steps=6"):
        checkpoints.check_before_start(tmp_path, "train", 6)


def _three(folder, keep=5):
    """ckpt-2, ckpt-4 and ckpt-6 in `folder`, saved by TensorFlow's own manager: each holds its step and a weight
    vector filled with it."""
    weights, step = tf.Variable(tf.zeros([4])), tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=weights, step=step), str(folder), max_to_keep=keep)
    for number in (2, 4, 6):
        step.assign(number)
        _save(manager, weights, tf.fill([4], float(number)), number)


def _resume(folder, train_steps=20, keep=3):
    """What the runner does on a training start: finds and restores the newest finite checkpoint, then creates
    the manager. Returns (restored path, weights, step, manager)."""
    weights, step = tf.Variable(tf.zeros([4])), tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=weights, step=step)
    latest = checkpoints.newest_finite(folder)
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
    manager = checkpoints.Manager(checkpoint, folder, max_to_keep=keep, step_counter=step, restored=latest,
                                  train_steps=train_steps)
    return latest, weights, step, manager


def _files(folder):
    """{name: bytes} of the checkpoint files in `folder`."""
    return {path.name: path.read_bytes() for path in sorted(folder.glob("ckpt-*"))}


def _listed(folder):
    state = tf.train.get_checkpoint_state(str(folder))
    return [p.rpartition("/")[2] for p in state.all_model_checkpoint_paths], state.model_checkpoint_path


def _state_naming(*names):
    """A state file's text that lists `names` (the last is the latest), as TensorFlow writes it."""
    return "".join([f'model_checkpoint_path: "{names[-1]}"\n', *(f'all_model_checkpoint_paths: "{n}"\n' for n in names)])


DAMAGE = {  # what is done to the state file, and how the log line says it
    "missing": (lambda state: state.unlink(), "was missing"),
    "empty": (lambda state: state.write_bytes(b""), "was empty"),
    "garbled": (lambda state: state.write_bytes(state.read_bytes()[:17] + b"\xff\x00{"), "could not be read ("),
    "garbled text": (lambda state: state.write_text('model_checkpoint_path: "ckpt-6"\nall_model_checkpoint_paths {'),
                     "could not be read (ParseError: "),
    "listing fewer": (lambda state: state.write_text(_state_naming("ckpt-2")),
                      "left out ckpt-4, ckpt-6"),
    "naming a missing one": (lambda state: state.write_text(_state_naming("ckpt-2", "ckpt-4", "ckpt-8")),
                             "named ckpt-8, which is not there"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_state_file_is_rebuilt_from_the_checkpoint_files(tmp_path, caplog, damage):
    _three(tmp_path)
    spoil, said = DAMAGE[damage]
    spoil(tmp_path / "checkpoint")
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.run_dir.checkpoints"):
        latest, weights, step, manager = _resume(tmp_path)
    assert latest == str(tmp_path / "ckpt-6")
    assert int(step.numpy()) == 6 and weights.numpy().tolist() == [6.0] * 4  # the newest one, restored
    lines = [r.getMessage() for r in caplog.records if r.name == "tf_harness.experiments.run_dir.checkpoints"]
    assert len(lines) == 1, lines
    assert_names(lines[0], f"{tmp_path / 'checkpoint'} {said}", "found ckpt-6 (and 2 older)")
    # The training start wrote the state file anew, atomically, listing what is there.
    assert _listed(tmp_path) == (["ckpt-2", "ckpt-4", "ckpt-6"], str(tmp_path / "ckpt-6"))
    assert manager.latest_checkpoint == str(tmp_path / "ckpt-6")
    assert checkpoints.state_problem(tmp_path) is None
    assert not list(tmp_path.glob("checkpoint.tmp*"))


@pytest.mark.parametrize("state", ["intact", "missing"])
def test_a_resumed_run_deletes_and_rewrites_only_the_checkpoints_it_saved(tmp_path, state):
    _three(tmp_path, keep=3)
    if state == "missing":
        (tmp_path / "checkpoint").unlink()
    before = _files(tmp_path)
    latest, weights, step, manager = _resume(tmp_path, keep=3)
    assert latest == str(tmp_path / "ckpt-6") and int(step.numpy()) == 6
    for number in (8, 10, 12):  # up to keep_checkpoints=3 saves of its own: nothing is deleted
        step.assign(number)
        _save(manager, weights, tf.fill([4], float(number)), number)
        assert {name: data for name, data in _files(tmp_path).items() if name in before} == before
    step.assign(14)
    _save(manager, weights, tf.fill([4], 14.0), 14)  # its fourth: it deletes its own oldest, ckpt-8, alone
    after = _files(tmp_path)
    assert {name: data for name, data in after.items() if name in before} == before
    assert sorted({name.partition(".")[0] for name in after}, key=lambda n: int(n[5:])) == [
        "ckpt-2", "ckpt-4", "ckpt-6", "ckpt-10", "ckpt-12", "ckpt-14"]
    assert _listed(tmp_path) == (["ckpt-2", "ckpt-4", "ckpt-6", "ckpt-10", "ckpt-12", "ckpt-14"],
                                 str(tmp_path / "ckpt-14"))
    assert checkpoints.newest_finite(tmp_path) == tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-14")


def test_a_checkpoint_ahead_of_the_restored_one_is_never_overwritten(tmp_path):
    weights, step = tf.Variable(tf.zeros([4])), tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=weights, step=step), str(tmp_path), max_to_keep=5)
    step.assign(3)
    _save(manager, weights, tf.ones([4]), 3)
    step.assign(6)
    _save(manager, weights, [1.0, np.nan, 1.0, 1.0], 6)  # refused on resume: it holds NaN
    nan, state = (tmp_path / "ckpt-6.index").read_bytes(), (tmp_path / "checkpoint").read_bytes()
    nan_data = next(tmp_path.glob("ckpt-6.data-*")).read_bytes()
    with raises_naming(checkpoints.CheckpointAheadError, tmp_path / "ckpt-6", "global step 3", "trainer.train_steps=6",
                       f"ckpt-6.* out of {tmp_path} ", "trainer.train_steps to 5"):
        _resume(tmp_path, train_steps=6)
    assert (tmp_path / "checkpoint").read_bytes() == state  # refused before writing anything
    # Training stops short of it: allowed, and a save under its name is refused even so.
    latest, weights, step, manager = _resume(tmp_path, train_steps=5)
    assert latest == str(tmp_path / "ckpt-3") and int(step.numpy()) == 3
    step.assign(5)
    _save(manager, weights, tf.fill([4], 5.0), 5)
    with raises_naming(checkpoints.CheckpointAheadError, tmp_path / "ckpt-6", "not saved by this run",
                       f"ckpt-6.* out of {tmp_path}"):
        manager.save(checkpoint_number=6)
    assert (tmp_path / "ckpt-6.index").read_bytes() == nan
    assert next(tmp_path.glob("ckpt-6.data-*")).read_bytes() == nan_data
    assert isinstance(checkpoints.CheckpointAheadError("x"), checkpoints.UnrestorableError)  # cli: one line, exit 1


def test_the_state_file_never_names_a_checkpoint_that_is_not_there(tmp_path, caplog):
    _three(tmp_path)
    next(tmp_path.glob("ckpt-4.data-*")).unlink()  # ckpt-4 is incomplete now
    (tmp_path / "checkpoint").write_bytes(b"")
    latest, _, _, _ = _resume(tmp_path)
    assert latest == str(tmp_path / "ckpt-6")
    assert _listed(tmp_path) == (["ckpt-2", "ckpt-6"], str(tmp_path / "ckpt-6"))
    assert_names(checkpoints.problem(tmp_path / "ckpt-4"), "data file", "missing")
    # Every checkpoint moved away, a garbled state file left behind: a fresh start, and no state file naming them.
    for path in tmp_path.glob("ckpt-*"):
        path.unlink()
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-6"\nall_model {')
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.run_dir.checkpoints"):
        latest, weights, step, manager = _resume(tmp_path)
    assert latest is None and manager.latest_checkpoint is None
    assert_names(one_naming(caplog.messages, tmp_path / "checkpoint", "ParseError"), "could not be read",
                 "found no checkpoint")
    assert not (tmp_path / "checkpoint").exists()
    step.assign(1)
    _save(manager, weights, tf.ones([4]), 1)
    assert _listed(tmp_path) == (["ckpt-1"], str(tmp_path / "ckpt-1"))
    assert not list(tmp_path.glob("checkpoint.tmp*"))


TINY_LFW = ("dataset=lfw_pairs", "pipeline.image_size=24", "pipeline.batch_size=8", "model.widths=[8,16]",
            "model.embedding_size=16", "model.head_units=8", "trainer.eval_steps=2", "deterministic=true",
            "trainer.checkpoint_every=3", "trainer.eval_every=100", "trainer.train_steps=9")


def _tensors(path):
    reader = tf.train.load_checkpoint(str(path))
    skip = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    return {name: reader.get_tensor(name) for name, dtype in reader.get_variable_to_dtype_map().items()
            if dtype != tf.variant and name not in skip}


def _plant_nan(run_dir, step):
    """Overwrites checkpoint `step` with the run's own model and optimizer, restored from it, one weight set to NaN."""
    from omegaconf import OmegaConf

    from tf_harness.experiments.training.trainer import Trainer
    from tests.conftest import task_of
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    task = task_of(cfg)
    trainer = Trainer(Settings.from_config(cfg), task.SPEC, tf.distribute.get_strategy(), task.decode.size, loss=task.loss)
    checkpoint = trainer.checkpoint()
    checkpoint.restore(str(run_dir / "checkpoints" / f"ckpt-{step}")).expect_partial()
    trainer.model.trainable_variables[0].assign(tf.fill(trainer.model.trainable_variables[0].shape, np.nan))
    tf.train.CheckpointManager(checkpoint, str(run_dir / "checkpoints"), max_to_keep=3).save(checkpoint_number=step)


@pytest.mark.slow
def test_resume_refuses_a_non_finite_newest_checkpoint_and_overwrites_it_only_once_moved_away(tmp_path):
    from tests.conftest import run_cli
    first = run_cli(*TINY_LFW, f"hydra.run.dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-3000:]
    expected = _tensors(tmp_path / "checkpoints" / "ckpt-9")
    _plant_nan(tmp_path, 9)
    assert checkpoints.problem(tmp_path / "checkpoints" / "ckpt-9").startswith("1 tensor(s) hold NaN")
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-9")
    planted = _files(tmp_path / "checkpoints")

    # Resuming from ckpt-6 would save ckpt-9 again: the run refuses, in one line, before training.
    refused = run_cli(*TINY_LFW, f"hydra.run.dir={tmp_path}")
    assert_names(one_naming(refused.stdout.splitlines(), f"{tmp_path / 'checkpoints' / 'ckpt-9'}:"), "NaN")
    assert_error(refused, 1, f"{tmp_path / 'checkpoints' / 'ckpt-9'} ", "global step 6", "trainer.train_steps=9",
                 f"ckpt-9.* out of {tmp_path / 'checkpoints'} ", "trainer.train_steps to 8")
    assert _files(tmp_path / "checkpoints") == planted

    aside = tmp_path / "aside"
    aside.mkdir()
    for path in (tmp_path / "checkpoints").glob("ckpt-9.*"):
        shutil.move(path, aside / path.name)
    resumed = run_cli(*TINY_LFW, f"hydra.run.dir={tmp_path}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resumed from {tmp_path / 'checkpoints' / 'ckpt-6'} at global step 6" in resumed.stdout
    actual = _tensors(tmp_path / "checkpoints" / "ckpt-9")  # trained again from step 6, deterministically
    assert expected.keys() == actual.keys()
    assert [name for name in expected if not np.array_equal(expected[name], actual[name])] == []


# The reproduction of the data loss: a short chest X-ray run, its state file then deleted or emptied.
SHORT_RUN = ("dataset=chest_xray", "model=semi_alexnet", "pipeline.image_size=32", "trainer.checkpoint_every=2",
             "trainer.eval_every=6")


@pytest.mark.slow
def test_a_deleted_or_empty_state_file_loses_no_checkpoint_on_evaluate_resume_or_predict(tmp_path):
    from tests.conftest import run_cli
    folder = tmp_path / "checkpoints"
    first = run_cli(*SHORT_RUN, "trainer.train_steps=6", f"hydra.run.dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-3000:]
    before = _files(folder)
    assert sorted(before) == [f"ckpt-{n}.{end}" for n in (2, 4, 6) for end in ("data-00000-of-00001", "index")]
    (folder / "checkpoint").unlink()
    found = f"{folder / 'checkpoint'} was missing; found ckpt-6 (and 2 older) from their files"

    evaluated = run_cli("mode=evaluate", f"hydra.run.dir={tmp_path}")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert found in evaluated.stdout
    assert f"Restored {folder / 'ckpt-6'} (global step 6)" in evaluated.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 6
    assert not (folder / "checkpoint").exists()  # a reader writes nothing

    resumed = run_cli("trainer.train_steps=8", f"hydra.run.dir={tmp_path}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert found in resumed.stdout
    assert f"Resumed from {folder / 'ckpt-6'} at global step 6" in resumed.stdout and "step 1/8" not in resumed.stdout
    after = _files(folder)
    assert {name: data for name, data in after.items() if name in before} == before  # each byte as it was
    assert sorted(after) == sorted([*before, "ckpt-8.data-00000-of-00001", "ckpt-8.index"])
    assert tf.train.latest_checkpoint(str(folder)) == str(folder / "ckpt-8")

    (folder / "checkpoint").write_bytes(b"")
    predicted = run_cli("mode=predict", f"hydra.run.dir={tmp_path}")
    assert predicted.returncode == 0 and "Traceback" not in predicted.stderr, predicted.stderr[-3000:]
    assert f"{folder / 'checkpoint'} was empty; found ckpt-8 (and 3 older) from their files" in predicted.stdout
    assert f"Restored {folder / 'ckpt-8'} (global step 8)" in predicted.stdout
    assert _files(folder) == after
