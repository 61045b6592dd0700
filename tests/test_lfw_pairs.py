"""The LFW pairs module against the real protocol files and JPEGs, and its embedded sample."""
import glob
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from PIL import Image
from sklearn.metrics import accuracy_score

from tf_harness.data import image_table, lfw_pairs
from tf_harness.data.errors import ConfigError, DatasetError
from tf_harness.data.image_table import ImageTableRecords
from tf_harness.data.input_fn import record_source
from tf_harness.data.integrity import unreadable
from tf_harness.data.integrity.skipped import SkipLog
from tf_harness.data.iterators import make_iterator
from tf_harness.data.samples.lfw_pairs import make_sample
from tf_harness.data.sources import SampledRecords
from tf_harness.experiments.config.schema import first_problem
from tests.conftest import compose, make_input, run_cli, tables_of, task_of
from tests.refusals import assert_config_error, raises_naming


def test_real_pairs_txt_is_ten_folds_of_300_same_and_300_different(real):
    pairs = lfw_pairs.read_pairs(real / "lfw" / "pairs.txt")
    assert len(pairs) == 6000
    assert pairs.label.sum() == 3000
    assert sorted(pairs.fold.unique()) == list(range(10))
    assert (pairs.groupby("fold").label.agg(["size", "sum"]).to_numpy() == [600, 300]).all()
    # Line 2 of the file is the first same-person pair; numbers are unpadded and reach 3 digits.
    first = pairs.iloc[0]
    assert (first.name_a, first.number_a, first.name_b, first.number_b, first.line) == ("Abel_Pacheco", 1,
                                                                                        "Abel_Pacheco", 4, 2)
    assert pairs.number_b.max() >= 100
    assert pairs.name_a.str.contains("-").any()


def test_real_dev_files_give_2200_and_1000_balanced_pairs(real):
    train = lfw_pairs.read_pairs(real / "lfw" / "pairsDevTrain.txt")
    test = lfw_pairs.read_pairs(real / "lfw" / "pairsDevTest.txt")
    assert (len(train), train.label.sum()) == (2200, 1100)
    assert (len(test), test.label.sum()) == (1000, 500)
    # View 1 is person-disjoint.
    people = lambda pairs: set(pairs.name_a) | set(pairs.name_b)  # noqa: E731
    assert not people(train) & people(test)


@pytest.fixture
def real_tree(tmp_path, real):
    """A tiny deep-funneled tree of the real JPEGs, one of them re-saved as grayscale, and a dev test file."""
    root = tmp_path / "lfw_root"
    folder = root / "lfw-deepfunneled"
    for name, number, source in [("Anthony_Hopkins", 1, "0001"), ("Anthony_Hopkins", 2, "0002"),
                                 ("Zico", 1, "0001"), ("Chang_Dae-whan", 1, "0002"), ("Chang_Dae-whan", 101, "0001"),
                                 ("Madonna", 1, "0002"), ("Madonna", 2, "0001")]:
        (folder / name).mkdir(parents=True, exist_ok=True)
        shutil.copy(real / "lfw" / f"Anthony_Hopkins_{source}.jpg", folder / name / f"{name}_{number:04d}.jpg")
    Image.open(folder / "Zico" / "Zico_0001.jpg").convert("L").save(folder / "Zico" / "Zico_0001.jpg")
    (root / "pairsDevTest.txt").write_text(
        "2\n"
        "Anthony_Hopkins\t1\t2\n"
        "Chang_Dae-whan\t1\t102\n"           # no image 102: skipped
        "Anthony_Hopkins\t1\tZico\t1\n"
        "Kim_Jong-Il\t3\tZico\t1\n")          # nobody called Kim_Jong-Il: skipped
    return root


def test_index_reads_a_funneled_tree_and_skips_pairs_with_missing_images(real_tree):
    skipped = SkipLog()
    tables = task_of(compose("dataset=lfw_pairs")).index(real_tree, skipped)
    validation = tables["validation"]
    assert validation.label.tolist() == [1, 0]
    assert validation.path_a[0].endswith("lfw-deepfunneled/Anthony_Hopkins/Anthony_Hopkins_0001.jpg")
    assert sorted(Path(path).name for path, _ in skipped.rows) == ["Chang_Dae-whan_0102.jpg", "Kim_Jong-Il_0003.jpg"]
    assert {reason for _, reason in skipped.rows} == {"missing image: pairsDevTest.txt line 3",
                                                       "missing image: pairsDevTest.txt line 5"}
    # Everyone the evaluation names stays out of training, skipped pairs' people too.
    assert set(tables["train"].person) == {"Madonna"}


def test_real_jpegs_and_a_grayscale_one_load_as_rgb_at_the_configured_size(real_tree):
    cfg = compose("dataset=lfw_pairs", "pipeline.image_size=40", "dataset.crop_fraction=0.6")
    validation = task_of(cfg).index(real_tree, SkipLog())["validation"]
    different = {column: tf.constant(validation[column][1]) for column in ("path_a", "path_b", "label")}
    assert different["path_b"].numpy().decode().endswith("Zico_0001.jpg")  # the grayscale one
    (image_a, image_b), label = task_of(cfg).load(different)
    assert image_a.shape == image_b.shape == (40, 40, 3)
    assert image_a.dtype == image_b.dtype == tf.uint8
    assert label.numpy().tolist() == [0.0]
    gray = image_b.numpy().astype(int)
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    assert not (image_a.numpy()[..., 0] == image_a.numpy()[..., 2]).all()


@pytest.mark.parametrize("line, bad", [(7, "Aaron_Peirsol\t1"), (7, "Aaron_Peirsol\tone\t2"),
                                       (1502, "A\t1\tB\t2\tC")])
def test_a_malformed_line_is_an_error_naming_file_and_line(tmp_path, real, line, bad):
    lines = (real / "lfw" / "pairsDevTrain.txt").read_text().splitlines()
    lines[line - 1] = bad
    path = tmp_path / "pairsDevTrain.txt"
    path.write_text("\n".join(lines))
    with pytest.raises(DatasetError, match=rf"pairsDevTrain.txt:{line}: "):
        lfw_pairs.read_pairs(path)


def test_a_header_that_miscounts_the_pairs_is_an_error(tmp_path, real):
    path = tmp_path / "pairs.txt"
    path.write_text((real / "lfw" / "pairs.txt").read_text().replace("10\t300", "10\t299", 1))
    with pytest.raises(DatasetError, match=r"pairs.txt:1: .*5980 pairs, found 6000"):
        lfw_pairs.read_pairs(path)


@pytest.mark.parametrize("which, name", [("dev_test", "pairsDevTest.txt"), ("pairs", "pairs.txt")])
def test_bytes_that_are_not_utf8_are_an_error_naming_file_line_and_byte(real_tree, which, name):
    """Bytes 10 and 11 of the file become ff fe, a byte-order mark's bytes where none belongs."""
    path = real_tree / name
    content = bytearray((real_tree / "pairsDevTest.txt").read_bytes())
    content[10:12] = b"\xff\xfe"
    path.write_bytes(bytes(content))
    task = task_of(compose("dataset=lfw_pairs", f"dataset.eval_pairs={which}"))
    with raises_naming(DatasetError, f"{path}:2:", "byte 10 (0xff)", "UTF-8"):
        task.index(real_tree, SkipLog())
    path.write_bytes(b"\xef\xbb\xbf" + bytes(content))  # after a byte-order mark, which is taken: byte 13
    with raises_naming(DatasetError, f"{path}:2:", "byte 13 (0xff)", "UTF-8"):
        task.index(real_tree, SkipLog())


def test_a_directory_in_place_of_a_pairs_file_is_an_error_naming_it(real_tree, tmp_path):
    path = real_tree / "pairsDevTest.txt"
    path.unlink()
    path.mkdir()
    with raises_naming(DatasetError, f"{path} ", "a directory", "LFW release"):
        task_of(compose("dataset=lfw_pairs")).index(real_tree, SkipLog())
    with raises_naming(DatasetError, f"{path} ", "(Is a directory)"):
        lfw_pairs.read_pairs(path)


def test_a_named_pipe_in_place_of_a_pairs_file_is_an_error_naming_it(real_tree):
    path = real_tree / "pairsDevTest.txt"
    path.unlink()
    os.mkfifo(path)
    with raises_naming(DatasetError, f"{path} ", "a named pipe", "LFW release"):
        task_of(compose("dataset=lfw_pairs")).index(real_tree, SkipLog())


@pytest.fixture(scope="module")
def sample():
    """The session's embedded sample, as a run with dataset.root unset finds it; the tests here only read it."""
    from tf_harness.data.samples import sample_root
    return sample_root("lfw_pairs", make_sample)


def test_sample_has_the_real_layout_and_formats(sample):
    jpegs = sorted((sample / "lfw").glob("*/*.jpg"))
    names = {path.parent.name for path in jpegs}
    assert all(path.name.startswith(path.parent.name + "_") for path in jpegs)
    assert any("-" in name for name in names) and any("_" not in name for name in names)
    assert max(int(path.stem[-4:]) for path in jpegs) >= 100
    assert {Image.open(path).size for path in jpegs[:50]} == {(250, 250)}
    assert any(Image.open(path).mode == "L" for path in jpegs)
    assert (sample / "pairs.txt").read_text().splitlines()[0] == "10\t30"
    pairs = lfw_pairs.read_pairs(sample / "pairs.txt")
    assert pairs.number_b.max() >= 100
    fold_people = [set(fold.name_a) | set(fold.name_b) for _, fold in pairs.groupby("fold")]
    assert sum(len(people) for people in fold_people) == len(set().union(*fold_people))  # person-disjoint folds
    for name in ("pairs.txt", "pairsDevTrain.txt", "pairsDevTest.txt"):
        every = lfw_pairs.read_pairs(sample / name)
        assert {(a, n) for a, n in zip(every.name_a, every.number_a)} <= {
            (path.parent.name, int(path.stem[-4:])) for path in jpegs}


def test_sample_is_deterministic(sample, tmp_path):
    make_sample(tmp_path / "again", seed=0)
    for name in ("pairs.txt", "pairsDevTrain.txt", "pairsDevTest.txt"):
        assert (tmp_path / "again" / name).read_text() == (sample / name).read_text()
    jpegs = sorted(path.relative_to(sample) for path in sample.glob("lfw/*/*.jpg"))
    assert jpegs == sorted(path.relative_to(tmp_path / "again") for path in (tmp_path / "again").glob("lfw/*/*.jpg"))
    for path in jpegs[::50]:
        assert (tmp_path / "again" / path).read_bytes() == (sample / path).read_bytes()


@pytest.fixture(scope="module")
def sample_tables(sample):
    return task_of(compose("dataset=lfw_pairs")).index(sample, SkipLog())


def _people(paths):
    return [Path(path.decode()).parent.name for path in paths]


def _draw(table, seed, count):
    records = task_of(compose("dataset=lfw_pairs")).train_records(table, seed).take(count)
    drawn = {key: [] for key in ("path_a", "path_b", "label")}
    for batch in records.batch(count):
        for key in drawn:
            drawn[key] = batch[key].numpy().tolist()
    return drawn


def test_training_pairs_are_balanced_and_only_of_training_people(sample_tables):
    train, validation = sample_tables["train"], sample_tables["validation"]
    drawn = _draw(train, seed=0, count=len(train))  # an epoch's worth of images
    labels = np.array(drawn["label"])
    assert abs(labels.mean() - 0.5) < 0.03
    people_a, people_b = _people(drawn["path_a"]), _people(drawn["path_b"])
    assert set(people_a + people_b) <= set(train.person)
    assert not set(people_a + people_b) & (set(validation.name_a) | set(validation.name_b))
    assert ((np.array(people_a) == np.array(people_b)) == (labels == 1)).all()
    assert all(a != b for a, b in zip(drawn["path_a"], drawn["path_b"]))
    # Many distinct pairs: fresh draws, not a fixed list.
    assert len(set(zip(drawn["path_a"], drawn["path_b"]))) > 0.9 * len(train)


def test_training_pairs_depend_only_on_the_seed(sample_tables):
    train = sample_tables["train"]
    first, again, other = _draw(train, 7, 64), _draw(train, 7, 64), _draw(train, 8, 64)
    assert first == again
    assert first["path_a"] != other["path_a"]


def test_sampler_iterator_checkpoint_restores_the_next_element(sample_tables, tmp_path):
    records = task_of(compose("dataset=lfw_pairs")).train_records(sample_tables["train"], 3).batch(4)
    iterator = make_iterator(records)
    for _ in range(5):
        next(iterator)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    saved = checkpoint.save(tmp_path / "ckpt")
    expected = [next(iterator)["path_a"].numpy().tolist() for _ in range(3)]
    checkpoint.restore(saved)
    assert [next(iterator)["path_a"].numpy().tolist() for _ in range(3)] == expected


# ---------------------------------------------------------------------------------------------
# The image table: the training images decoded once, pairs drawn by row (data/image_table.py)


def test_stateless_uniforms_are_tensorflows_own_draws_bit_for_bit():
    counters = np.concatenate([np.arange(40), [2**31, 2**32 + 7, 2**62 + 11, 2**63 - 1]])
    for seed in (0, 42, 42 + 7919 * 3, 2**32 - 1):
        for count in (4, 3):
            expected = np.stack([tf.random.stateless_uniform([count], seed=tf.constant([seed, counter], tf.int64),
                                                             dtype=tf.float64) for counter in counters])
            np.testing.assert_array_equal(image_table.stateless_uniforms(seed, counters, count).numpy(), expected)


def test_batched_draws_are_the_training_pairs_as_rows_of_the_sorted_images(sample_tables):
    task = task_of(compose("dataset=lfw_pairs"))
    train = sample_tables["train"].sample(frac=1, random_state=0)  # any order: the draws sort it
    paths = task.training_images(train).path.to_numpy(dtype=str)
    for seed in (3, 3 + 7919):
        drawn = list(task.train_draws(train, seed, 48).take(4).as_numpy_iterator())
        expected = next(make_iterator(task.train_records(train, seed).batch(4 * 48)))
        rows = {key: np.concatenate([batch[key] for batch in drawn]) for key in drawn[0]}
        assert paths[rows["row_a"]].tolist() == [path.decode() for path in expected["path_a"].numpy()]
        assert paths[rows["row_b"]].tolist() == [path.decode() for path in expected["path_b"].numpy()]
        assert rows["label"].tolist() == expected["label"].numpy().tolist()


def _table_cfg(sample, *overrides):
    return compose("dataset=lfw_pairs", f"dataset.root={sample}", "pipeline.image_size=16", "pipeline.batch_size=4",
                   "deterministic=true", *overrides)


def _same_batches(first, second):
    for (features, labels, weights), (other_features, other_labels, other_weights) in zip(first, second, strict=True):
        np.testing.assert_array_equal(features[0], other_features[0])
        np.testing.assert_array_equal(features[1], other_features[1])
        np.testing.assert_array_equal(labels, other_labels)
        np.testing.assert_array_equal(weights, other_weights)


def test_training_batches_are_the_same_with_and_without_the_image_table(sample, caplog):
    cfg = _table_cfg(sample)
    table = tables_of(cfg)["train"]
    with caplog.at_level(logging.INFO, logger="tf_harness.data"):
        with_table = list(make_input(cfg, table, training=True, split="train").take(12).as_numpy_iterator())
    assert (f"lfw_pairs: decoded the {len(table)} training images once into a table of 0.4 MB (16x16x3 uint8) in "
            in caplog.text), caplog.text
    assert "batches of 4, pairs drawn from the image table" in caplog.text
    files = list(make_input(_table_cfg(sample, "pipeline.image_table_mb=0"), table, training=True,
                            split="train").take(12).as_numpy_iterator())
    _same_batches(with_table, files)
    assert [labels.mean() for _, labels, _ in with_table] == [0.5] * 12  # balanced, as the draws make them
    # pipeline.cache=memory asks for the table whatever the budget: the same batches again.
    cached = make_input(_table_cfg(sample, "pipeline.cache=memory", "pipeline.image_table_mb=0"), table,
                        training=True, split="train")
    _same_batches(with_table, list(cached.take(12).as_numpy_iterator()))


def _checkpoint_bytes(prefix):
    return sum(os.path.getsize(path) for path in glob.glob(f"{prefix}*"))


def test_an_image_table_iterator_resumes_exactly_and_its_checkpoints_hold_no_table(sample, tmp_path):
    """The iterator's checkpoint is the counter of draws and the batches prefetched: restored into a pipeline built
    afresh, as a resumed run builds it, it goes on with the very next batch; and no checkpoint holds the table."""
    cfg = _table_cfg(sample, "pipeline.image_size=32", "pipeline.batch_size=2")
    table = tables_of(cfg)["train"]
    size = image_table.table_bytes(task_of(cfg), len(table))
    sizes = {}
    for kind, budget in (("table", 1024), ("files", 0)):
        cfg.pipeline.image_table_mb = budget
        iterator = make_iterator(make_input(cfg, table, training=True, split="train"))
        for _ in range(5):
            next(iterator)
        prefix = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / kind / "ckpt"))
        sizes[kind] = _checkpoint_bytes(prefix)
        expected = [next(iterator) for _ in range(4)]
        resumed = make_iterator(make_input(cfg, table, training=True, split="train"))
        tf.train.Checkpoint(iterator=resumed).restore(prefix).assert_existing_objects_matched()
        _same_batches([tf.nest.map_structure(np.asarray, batch) for batch in expected],
                      [tf.nest.map_structure(np.asarray, next(resumed)) for _ in range(4)])
    assert sizes["table"] < size / 5, (sizes, size)
    assert sizes["table"] < 2 * sizes["files"], sizes


def test_a_table_over_its_budget_is_one_log_line_and_the_pairs_decode_their_files(sample, caplog):
    cfg = _table_cfg(sample)
    task, tables = task_of(cfg), tables_of(cfg)
    table = tables["train"]
    size = image_table.table_bytes(task, len(table))
    assert size == len(table) * 16 * 16 * 3
    with caplog.at_level(logging.INFO, logger="tf_harness.data"):
        over = record_source(task, table, "train", True, image_table_mb=size / 1e6 - 0.001)
        off = record_source(task, table, "train", True, image_table_mb=0)
    assert isinstance(over, SampledRecords) and isinstance(off, SampledRecords)
    lines = [record.getMessage() for record in caplog.records if "table" in record.getMessage()]
    assert lines == [f"lfw_pairs: a table of the {len(table)} training images would take 0.4 MB, over "
                     f"pipeline.image_table_mb={size / 1e6 - 0.001:g}: training pairs decode their image files every "
                     "step"], lines
    assert isinstance(record_source(task, table, "train", True, image_table_mb=size / 1e6), ImageTableRecords)
    assert isinstance(record_source(task, table, "train", True, cache="memory", image_table_mb=0), ImageTableRecords)
    assert not isinstance(record_source(task, tables["validation"], "validation", False, image_table_mb=1024),
                          ImageTableRecords)


def _damage_inside(path):
    """A Huffman table claiming more codes than it can hold: libjpeg gives up on any decode of the file, though
    both its ends are whole (as tests/test_verification.py damages one)."""
    content = bytearray(path.read_bytes())
    table_counts = content.index(b"\xff\xc4") + 5
    content[table_counts:table_counts + 16] = b"\xff" * 16
    path.write_bytes(bytes(content))


def test_images_that_fail_to_decode_are_reported_and_left_out_of_the_table(sample, tmp_path):
    root = tmp_path / "lfw"
    shutil.copytree(sample, root)
    cfg = _table_cfg(root, "pipeline.verify_images=false")
    task, table = task_of(cfg), tables_of(cfg)["train"]
    damaged = [Path(table.path.iloc[len(table) // 3]), Path(table.path.iloc[2 * len(table) // 3])]
    _damage_inside(damaged[0])
    damaged[1].write_bytes(b"not an image\n")
    model_dir = tmp_path / "run"
    source = record_source(task, table, "train", True, image_table_mb=1024, model_dir=model_dir)
    assert isinstance(source, ImageTableRecords)
    rows = unreadable.collect(unreadable.report_folder(model_dir), set())  # the rows the runner adds to skipped.csv
    assert sorted(path for path, _ in rows) == sorted(map(str, damaged))
    reasons = dict(rows)
    assert reasons[str(damaged[0])].startswith("undecodable image: damaged inside")
    assert reasons[str(damaged[1])].startswith("undecodable image: ")
    # Left out of the table: the pairs are drawn over the images that decoded.
    assert source.count == len(table) - 2 == len(source.table)
    assert not set(map(str, damaged)) & set(source.table.path)
    drawn = next(make_iterator(task.train_draws(source.table, 0, 512)))
    assert int(tf.reduce_max([drawn["row_a"], drawn["row_b"]])) < source.count
    features, labels, weights = next(make_iterator(source.batches(0, batch_size=4)))
    assert features[0].shape == (4, 16, 16, 3) and labels.shape == (4, 1)


def test_with_no_image_decoding_there_is_no_table_and_the_file_pipeline_stops_the_run(sample, tmp_path, caplog):
    cfg = _table_cfg(sample)
    table = tables_of(cfg)["train"].assign(path=str(tmp_path / "absent.jpg"))
    with caplog.at_level(logging.WARNING, logger="tf_harness.data"):
        data = make_input(cfg, table, training=True, split="train")
    assert f"lfw_pairs: {len(table)} of the {len(table)} training images failed to decode" in caplog.text
    with pytest.raises(tf.errors.InvalidArgumentError, match=unreadable.FAILED_IN_A_ROW):
        next(make_iterator(data))


def test_a_run_started_before_the_image_table_goes_on_reading_the_files_it_checkpointed(sample, tmp_path, caplog):
    """The two pipelines' iterators do not restore into each other: a run directory whose saved config predates
    pipeline.image_table_mb, and whose checkpoints therefore hold the file pipeline's iterator, keeps it."""
    from omegaconf import OmegaConf
    cfg = _table_cfg(sample)
    task, table = task_of(cfg), tables_of(cfg)["train"]
    saved = OmegaConf.to_container(cfg)

    def run_dir(name, config, checkpoints=True):
        folder = tmp_path / name
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(config))
        if checkpoints:
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "ckpt-2.index").write_bytes(b"")
        return folder

    older = {**saved, "pipeline": {key: value for key, value in saved["pipeline"].items() if key != "image_table_mb"}}
    for model_dir, drawn_from in ((run_dir("today", saved), ImageTableRecords),
                                  (run_dir("older, not yet checkpointed", older, checkpoints=False), ImageTableRecords),
                                  (tmp_path / "fresh", ImageTableRecords),
                                  (run_dir("older", older), SampledRecords)):
        with caplog.at_level(logging.INFO, logger="tf_harness.data"):
            caplog.clear()
            source = record_source(task, table, "train", True, image_table_mb=1024, model_dir=model_dir)
        assert isinstance(source, drawn_from), model_dir
    assert ("lfw_pairs: this run started before the image table, and its checkpoints hold the input iterator of "
            "pairs read from the image files, so it goes on reading them") in caplog.text


def test_evaluation_selects_dev_test_or_pairs_folds(sample):
    def tables(*overrides):
        return task_of(compose("dataset=lfw_pairs", *overrides)).index(sample, SkipLog())

    dev = tables()["validation"]
    assert len(dev) == 2 * int((sample / "pairsDevTest.txt").read_text().split()[0])
    every = tables("dataset.eval_pairs=pairs")["validation"]
    assert sorted(every.fold.unique()) == list(range(10))
    fold = tables("dataset.eval_pairs=pairs", "dataset.fold=3")
    assert set(fold["validation"].fold) == {3} and len(fold["validation"]) == len(every) // 10
    held_out = set(fold["validation"].name_a) | set(fold["validation"].name_b)
    assert not held_out & set(fold["train"].person)
    assert set(every.name_a[every.fold != 3]) <= set(fold["train"].person)
    with pytest.raises(ConfigError, match="dataset.fold=10"):
        tables("dataset.eval_pairs=pairs", "dataset.fold=10")
    with pytest.raises(ConfigError, match="dataset.eval_pairs=view2"):
        tables("dataset.eval_pairs=view2")


def test_ten_fold_protocol_matches_a_direct_computation():
    rng = np.random.default_rng(0)
    labels = np.tile(np.repeat([1, 0], 15), 10)
    table = pd.DataFrame({"label": labels, "fold": np.repeat(np.arange(10), 30)})
    # Informative but imperfect scores, so the chosen thresholds matter.
    scores = rng.normal(labels * 1.2, 1.0)
    accuracies = []
    for fold in range(10):
        test = table.fold.to_numpy() == fold
        # Every candidate threshold on the nine other folds; the highest of the best ones, as roc_curve orders them.
        candidates = np.concatenate([[np.inf], np.sort(np.unique(scores[~test]))[::-1]])
        train_accuracy = [accuracy_score(labels[~test], scores[~test] >= t) for t in candidates]
        threshold = candidates[int(np.argmax(train_accuracy))]
        accuracies.append(accuracy_score(labels[test], scores[test] >= threshold))
    result = task_of(compose("dataset=lfw_pairs")).protocol_metrics(table, scores)
    assert result["ten_fold_accuracy_mean"] == pytest.approx(np.mean(accuracies))
    assert result["ten_fold_accuracy_std"] == pytest.approx(np.std(accuracies, ddof=1))
    assert 0.6 < result["ten_fold_accuracy_mean"] < 0.9
    one_fold = task_of(compose("dataset=lfw_pairs")).protocol_metrics(table[table.fold == 0], scores[:30])
    assert one_fold == {}  # one fold: no accuracy across folds (its rates are the declared metrics')


def test_configs_pair_the_siamese_cnn_with_lfw_only():
    cfg = compose("dataset=lfw_pairs")
    assert (cfg.model.name, cfg.model.inputs, cfg.model.merge) == ("siamese_cnn", "pair", "embedding")
    assert first_problem(cfg) is None
    assert first_problem(compose("dataset=lfw_pairs", "model=resnet_v2_50")).startswith("model=resnet_v2_50 takes ")
    assert first_problem(compose("dataset=chest_xray", "model=siamese_cnn")).startswith("model=siamese_cnn takes ")


@pytest.mark.slow
def test_default_run_learns_and_ten_fold_evaluation_reports(tmp_path):
    """`python run.py dataset=lfw_pairs` as a user runs it, then mode=evaluate on pairs.txt."""
    run_dir = tmp_path / "run"
    done = run_cli("dataset=lfw_pairs", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert list((run_dir / "checkpoints").glob("*.index"))
    assert list((run_dir / "train").glob("**/events.out.tfevents.*"))
    assert list((run_dir / "validation").glob("**/events.out.tfevents.*"))
    assert (run_dir / "skipped.csv").read_text().splitlines() == ["path,reason"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_step"] == compose("dataset=lfw_pairs").trainer.train_steps
    assert metrics["accuracy"] >= 0.75 and metrics["auc"] >= 0.8

    done = run_cli("dataset=lfw_pairs", "mode=evaluate", "dataset.eval_pairs=pairs", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["examples"] == 600
    assert 0.6 <= metrics["ten_fold_accuracy_mean"] <= 1 and metrics["ten_fold_accuracy_std"] >= 0


@pytest.mark.slow
def test_a_single_image_model_with_lfw_exits_2_with_one_line(tmp_path):
    done = run_cli("dataset=lfw_pairs", "model=resnet_v2_50", f"hydra.run.dir={tmp_path}")
    assert_config_error(done, "model=resnet_v2_50", "dataset=lfw_pairs", alone=False)
