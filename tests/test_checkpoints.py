"""Resume restores only a finite checkpoint: a non-finite or unreadable newest one is skipped, with the reason logged."""
import logging

import numpy as np
import pytest
import tensorflow as tf

from tf_harness.experiments import checkpoints


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
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.checkpoints"):
        assert checkpoints.newest_finite(tmp_path) == good
    assert f"Not restoring {tmp_path / 'ckpt-9'}: 1 tensor(s) hold NaN or infinite values (model/" in caplog.text
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
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.checkpoints"):
        assert checkpoints.newest_finite(tmp_path) == first
    assert f"Not restoring {second}: it cannot be read" in caplog.text
    for path in tmp_path.glob("ckpt-1.*"):
        path.unlink()
    with pytest.raises(checkpoints.UnrestorableError, match=r"ckpt-2: it cannot be read.*ckpt-1: its index file is"):
        checkpoints.newest_finite(tmp_path)


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

    from tf_harness.experiments.trainer import Trainer
    from tests.conftest import task_of
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    task = task_of(cfg)
    trainer = Trainer(cfg, task.SPEC, tf.distribute.get_strategy(), task.decode.size)
    checkpoint = trainer.checkpoint()
    checkpoint.restore(str(run_dir / "checkpoints" / f"ckpt-{step}")).expect_partial()
    trainer.model.trainable_variables[0].assign(tf.fill(trainer.model.trainable_variables[0].shape, np.nan))
    tf.train.CheckpointManager(checkpoint, str(run_dir / "checkpoints"), max_to_keep=3).save(checkpoint_number=step)


@pytest.mark.slow
def test_resume_refuses_a_non_finite_newest_checkpoint_and_retrains_from_the_one_before(tmp_path):
    from tests.conftest import run_cli
    first = run_cli(*TINY_LFW, f"hydra.run.dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-3000:]
    expected = _tensors(tmp_path / "checkpoints" / "ckpt-9")
    _plant_nan(tmp_path, 9)
    assert checkpoints.problem(tmp_path / "checkpoints" / "ckpt-9").startswith("1 tensor(s) hold NaN")
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-9")

    resumed = run_cli(*TINY_LFW, f"hydra.run.dir={tmp_path}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Not restoring {tmp_path / 'checkpoints' / 'ckpt-9'}: 1 tensor(s) hold NaN" in resumed.stdout
    assert f"Resumed from {tmp_path / 'checkpoints' / 'ckpt-6'} at global step 6" in resumed.stdout
    actual = _tensors(tmp_path / "checkpoints" / "ckpt-9")  # trained again from step 6, deterministically
    assert expected.keys() == actual.keys()
    assert [name for name in expected if not np.array_equal(expected[name], actual[name])] == []
