"""pipeline.cache=disk against what TensorFlow really leaves behind when a run is killed mid-pass."""
import glob
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

from tf_harness.data import TASKS, caching
from tf_harness.data.errors import ConfigError
from tf_harness.data.iterators import make_iterator
from tests.conftest import PROJECT, compose, run_cli, tables_of, task_of, wait_for_checkpoint
from tests.refusals import assert_names, raises_naming

ELEMENTS = 3000

# A child process that fills a disk cache part-way, then dies by SIGKILL, as an OOM kill or
# a cluster pre-emption would end a run. With `checkpoint`, it first saves the iterator
# mid-pass, as the runner did with trainer.checkpoint_input, which finishes TF's cache shards early.
_KILLED_PASS = textwrap.dedent("""
    import os, signal, sys
    import tensorflow as tf
    sys.path.insert(0, {project!r})
    from tf_harness.data import caching
    model_dir, checkpoint = sys.argv[1], sys.argv[2] == "checkpoint"
    data = caching.cache(tf.data.Dataset.range({elements}).map(lambda i: tf.fill([1000], i)), "disk", model_dir,
                         "train")
    iterator = iter(data)
    for _ in range(700):
        next(iterator)
    if checkpoint:
        tf.train.Checkpoint(iterator=iterator).save(os.path.join(model_dir, "ckpt", "ckpt"))
        for _ in range(700):
            next(iterator)
    print("ready", flush=True)
    os.kill(os.getpid(), signal.SIGKILL if sys.argv[3] == "kill" else signal.SIGSTOP)
""")


def _child(model_dir, checkpoint=False, how="kill"):
    script = _KILLED_PASS.format(project=str(PROJECT), elements=ELEMENTS)
    return subprocess.Popen([sys.executable, "-c", script, str(model_dir), "checkpoint" if checkpoint else "plain",
                             how], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def _source(offset=0):
    return tf.data.Dataset.range(ELEMENTS).map(lambda i: tf.fill([1000], i + offset))


def _first_values(data):
    return np.array([element[0] for element in data.as_numpy_iterator()])


def _listing(directory):
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("checkpoint, tf_error", [(False, "concurrent caching iterator"),
                                                   (True, "Existing cache files found")],
                         ids=["killed", "checkpointed-then-killed"])
def test_next_build_cleans_a_killed_pass_and_reads_everything(tmp_path, checkpoint, tf_error):
    child = _child(tmp_path, checkpoint)
    child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL
    cache_dir = tmp_path / "input_cache"
    left = _listing(cache_dir)
    # What TF 2.21 leaves: a lockfile per shard begun, the shard being written as a .tempstate, no merged index.
    assert "train_0.lockfile" in left and "train.index" not in left, left
    if checkpoint:
        # Saving mid-pass finishes shard 0 as its own bundle; shard 1 is the one cut short.
        assert {"train_0.index", "train_0.data-00000-of-00001", "train_1.lockfile"} <= set(left), left
    else:
        assert any(name.startswith("train_0.data-00000-of-00001.tempstate") for name in left), left
    # Without cleaning, this is the error a user would get.
    with pytest.raises(tf.errors.AlreadyExistsError, match=tf_error):
        for _ in _source().cache(str(cache_dir / "train")):
            pass

    data = caching.cache(_source(), "disk", tmp_path, "train")
    assert _listing(cache_dir) == ["train.lock"]  # every leftover removed; the lock is this process's
    np.testing.assert_array_equal(_first_values(data), np.arange(ELEMENTS))
    assert "train.index" in _listing(cache_dir)
    assert not glob.glob(str(cache_dir / "train_*"))


def test_a_complete_cache_is_reused_not_rewritten(tmp_path):
    np.testing.assert_array_equal(_first_values(caching.cache(_source(), "disk", tmp_path, "train")),
                                  np.arange(ELEMENTS))
    files = {path: os.stat(path).st_mtime_ns for path in glob.glob(str(tmp_path / "input_cache" / "train.*"))}
    time.sleep(0.01)
    # A source that now yields other values: only a reused cache still gives the first pass's.
    again = caching.cache(_source(offset=10_000), "disk", tmp_path, "train")
    np.testing.assert_array_equal(_first_values(again), np.arange(ELEMENTS))
    assert {path: os.stat(path).st_mtime_ns for path in files} == files
    assert caching.clean_partial_cache(str(tmp_path / "input_cache" / "train")) is False


def test_a_live_run_on_the_same_cache_is_a_config_error_not_tf_error(tmp_path):
    child = _child(tmp_path, how="stop")  # stopped mid-pass, still alive and holding its cache
    try:
        assert child.stdout.readline().strip() == "ready"
        with raises_naming(ConfigError, "pipeline.cache=disk", "another running process",
                           f"{tmp_path / 'input_cache' / 'train'};", "hydra.run.dir"):
            caching.cache(_source(), "disk", tmp_path, "train")
        assert "train_0.lockfile" in _listing(tmp_path / "input_cache")  # the live run's files are untouched
    finally:
        child.kill()
        child.wait()
    # Once it is gone its leftovers are stale, and the next build cleans them.
    np.testing.assert_array_equal(_first_values(caching.cache(_source(), "disk", tmp_path, "train")),
                                  np.arange(ELEMENTS))


def _as_a_new_process():
    """Lets go of every cache this process holds, so the next use is a first use, as in the next run."""
    for lock in caching._held.values():
        lock.close()
    caching._held.clear()


def _filled(tmp_path):
    np.testing.assert_array_equal(_first_values(caching.cache(_source(), "disk", tmp_path, "train")),
                                  np.arange(ELEMENTS))
    _as_a_new_process()
    return str(tmp_path / "input_cache" / "train")


@pytest.mark.parametrize("damage", ["data cut", "index garbled", "index emptied"])
def test_a_finished_cache_that_was_damaged_is_filled_again_at_the_next_start(tmp_path, caplog, damage):
    prefix = _filled(tmp_path)
    if damage == "data cut":
        os.truncate(f"{prefix}.data-00000-of-00001", 100_000)
    else:
        with open(f"{prefix}.index", "r+b") as index:
            index.truncate(0) if damage == "index emptied" else index.write(b"\xff" * 64)
    with caplog.at_level(logging.WARNING, logger="tf_harness.data.caching"):
        again = caching.cache(_source(offset=10_000), "disk", tmp_path, "train")
    assert f"The input cache {prefix} was damaged" in caplog.text
    np.testing.assert_array_equal(_first_values(again), np.arange(ELEMENTS) + 10_000)  # filled anew
    _as_a_new_process()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tf_harness.data.caching"):  # the refilled cache passes
        np.testing.assert_array_equal(_first_values(caching.cache(_source(), "disk", tmp_path, "train")),
                                      np.arange(ELEMENTS) + 10_000)
    assert "damaged" not in caplog.text


def test_a_cache_damaged_at_its_size_fails_as_it_is_read_with_one_line_and_is_removed(tmp_path):
    prefix = _filled(tmp_path)
    with open(f"{prefix}.data-00000-of-00001", "r+b") as data:
        data.seek(50_000)
        data.write(bytes(64))  # the size its index lists: only the checksums can tell
    with pytest.raises(tf.errors.DataLossError) as raised:
        _first_values(caching.cache(_source(), "disk", tmp_path, "train"))
    assert caching.damaged(ValueError("another error")) is None
    line = caching.damaged(raised.value)
    assert_names(line, f"{prefix} ", "damaged", "Checksum does not match")
    assert "\n" not in line and "[Op:" not in line
    assert _listing(tmp_path / "input_cache") == ["train.lock"]
    _as_a_new_process()
    np.testing.assert_array_equal(_first_values(caching.cache(_source(), "disk", tmp_path, "train")),
                                  np.arange(ELEMENTS))


def test_memory_cache_iterators_are_kept_out_of_checkpoints(tmp_path):
    """A memory cache's iterator checkpoint carries every cached element; the runner must not save it."""
    # Random bytes, so that no compression hides what the checkpoint holds.
    data = _source().map(lambda x: tf.random.stateless_uniform([1000], [x[0], 0], maxval=256, dtype=tf.int32))
    data = data.map(lambda x: tf.cast(x, tf.uint8)).cache().repeat()
    sizes = []
    for elements in (100, 2000):
        iterator = make_iterator(data)
        for _ in range(elements):
            next(iterator)
        prefix = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / f"after-{elements}" / "ckpt"))
        sizes.append(sum(os.path.getsize(path) for path in glob.glob(prefix + "*")))
    assert sizes[1] - sizes[0] > 1900 * 1000 * 0.9  # the ~1 kB elements cached in between
    chest, lfw = TASKS["chest_xray"], TASKS["lfw_pairs"]
    assert not caching.checkpointable("memory", chest) and not caching.checkpointable("disk", chest)
    assert caching.checkpointable("none", chest)
    # LFW's training pairs are drawn afresh: no cache holds them (a memory cache's images are the image table's,
    # held outside the iterator, data/image_table.py), so their iterator is saved.
    assert all(caching.checkpointable(kind, lfw) for kind in ("none", "memory", "disk"))


@pytest.mark.slow  # end-to-end runs
def test_lfw_with_a_memory_cache_draws_from_the_image_table_and_checkpoints_its_input(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli("dataset=lfw_pairs", "pipeline.cache=memory", "pipeline.image_table_mb=0", "trainer.train_steps=2",
                     "trainer.eval_steps=1", "trainer.checkpoint_every=2", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run_dir / "run.log").read_text()
    assert "lfw_pairs: decoded the 459 training images once into a table of 3.2 MB (48x48x3 uint8) in " in log, log
    assert "Built the train input pipeline: batches of 32, pairs drawn from the image table, cache memory" in log, log
    assert "serves its evaluation only" not in log and "checkpoints leave out the input iterator" not in log, log
    saved = [name for name, _ in tf.train.list_variables(str(run_dir / "checkpoints"))]
    assert any(name.startswith("input_iterator") for name in saved), saved
    assert not any("image_table" in name for name in saved), saved  # the table is in no checkpoint


@pytest.mark.slow
def test_a_killed_training_run_with_a_disk_cache_resumes(tmp_path):
    """`python run.py pipeline.cache=disk`, SIGKILLed mid first pass, then run again into the same directory."""
    run_dir = tmp_path / "run"
    args = ("dataset=chest_xray", "model=resnet_v2_50", "pipeline.image_size=32", "pipeline.batch_size=4",
            # A small shuffle buffer after the cache, so the first pass is read as training goes, not up front.
            "pipeline.cache=disk", "pipeline.shuffle_buffer=8", "trainer.checkpoint_every=2",
            "trainer.eval_every=1000", "trainer.eval_steps=1", f"hydra.run.dir={run_dir}")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    first = subprocess.Popen([sys.executable, "run.py", *args, "trainer.train_steps=40"], cwd=PROJECT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_checkpoint(first, run_dir / "checkpoints", 4, seconds=600)
    first.kill()
    first.wait()
    assert glob.glob(str(run_dir / "input_cache" / "train-*_*.lockfile")), "the kill should leave TF's lockfile"

    second = run_cli(*args, "trainer.train_steps=70")  # a pass is 62 batches: this one completes the cache
    assert second.returncode == 0, second.stderr[-3000:]
    assert "concurrent caching iterator" not in second.stderr
    assert len(glob.glob(str(run_dir / "input_cache" / "train-*.index"))) == 1  # keyed by its content (content_key)
    assert not glob.glob(str(run_dir / "input_cache" / "train-*_*"))
    names = [name for name, _ in tf.train.list_variables(str(run_dir / "checkpoints"))]
    assert not any(name.startswith("input_iterator") for name in names)
    assert "Removed a partial input cache" in (run_dir / "run.log").read_text()


# ---------------------------------------------------------------------------------------------
# Cache keys: everything that decides a cache's content names it


def test_cache_keys_differ_for_every_setting_that_decides_what_a_cache_holds():
    """LFW's eval_pairs and fold choose other validation pairs, so their caches must never be each other's; the
    image size, the split seed, the records' source and the element structure (training or not) likewise."""
    def key(*overrides, source=None, training=False, split="validation"):
        cfg = compose("dataset=lfw_pairs", *overrides)
        return caching.content_key(task_of(cfg), tables_of(cfg)[split], source, training)

    keys = {overrides: key(*overrides) for overrides in [(), ("dataset.eval_pairs=pairs",),
                                                         ("dataset.eval_pairs=pairs", "dataset.fold=0"),
                                                         ("dataset.eval_pairs=pairs", "dataset.fold=1")]}
    assert len(set(keys.values())) == len(keys), keys
    assert key() == keys[()] and all(len(value) == 16 for value in keys.values())  # the same settings, the same key
    shards = type("Shards", (), {"identity": {"encoding": "raw", "shards": [("ab12", 200)]}})()
    cut = type("Shards", (), {"identity": {"encoding": "raw", "shards": [("ab12", 150)]}})()
    others = [key("pipeline.image_size=32"), key("dataset.crop_fraction=0.8"), key("seed=7", split="train"),
              key(training=True), key(source=shards), key(source=cut)]
    assert len({keys[()], key(split="train"), *others}) == 2 + len(others)


def test_a_cache_of_other_settings_is_removed_unless_a_live_process_holds_it(tmp_path, caplog):
    child = _child(tmp_path, how="stop")  # holds the unkeyed `train` cache, stopped mid-pass
    try:
        assert child.stdout.readline().strip() == "ready"
        first = caching.cache(_source(), "disk", tmp_path, "train", "0123456789abcdef")
        np.testing.assert_array_equal(_first_values(first), np.arange(ELEMENTS))
        assert "train_0.lockfile" in _listing(tmp_path / "input_cache")  # the live run's files are untouched
    finally:
        child.kill()
        child.wait()
    with caplog.at_level(logging.INFO, logger="tf_harness.data.caching"):
        again = caching.cache(_source(offset=10_000), "disk", tmp_path, "train", "fedcba9876543210")
    np.testing.assert_array_equal(_first_values(again), np.arange(ELEMENTS) + 10_000)  # its own, not the other's
    left = _listing(tmp_path / "input_cache")
    assert not any(name.startswith(("train.", "train_")) for name in left), left  # the dead run's cache is gone
    assert "train-0123456789abcdef.index" in left  # held by this process, which still uses it
    assert "train-fedcba9876543210.index" in left
    assert f"Removed the input cache {tmp_path / 'input_cache' / 'train'}, made for other settings" in caplog.text


@pytest.mark.slow
def test_an_lfw_run_trained_with_a_disk_cache_evaluates_and_predicts_view_2_pairs_on_re_entry(tmp_path):
    """Trained against View 1 (dev_test) with pipeline.cache=disk, then re-entered with dataset.eval_pairs=pairs:
    evaluation and prediction read View 2's 600 pairs, not the 200 cached ones, and report the ten-fold protocol."""
    run_dir = tmp_path / "run"
    trained = run_cli("dataset=lfw_pairs", "experiment=smoke", "trainer.eval_steps=null", "pipeline.cache=disk",
                      "trainer.train_steps=2", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["examples"] == 200
    evaluated = run_cli(f"hydra.run.dir={run_dir}", "mode=evaluate", "dataset.eval_pairs=pairs")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["examples"] == 600 and {"ten_fold_accuracy_mean", "ten_fold_accuracy_std"} <= set(metrics)
    predicted = run_cli(f"hydra.run.dir={run_dir}", "mode=predict", "dataset.eval_pairs=pairs")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert len((run_dir / "predictions.csv").read_text().splitlines()) == 1 + 600
