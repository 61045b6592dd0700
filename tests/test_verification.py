"""Image files checked at both ends, once per file, and damaged files kept out of runs that did not check them."""
import csv
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tf_harness.data.integrity.skipped import SkipLog
from tf_harness.data.integrity.verification import check_files, problem
from tf_harness.data.iterators import make_iterator
from tests.conftest import compose, convert_shards, make_input, run_cli, tables_of, task_of
from tests.refusals import assert_error, assert_names, one_naming

DAMAGED = ("00000001_001.png", "00000003_001.png")  # truncated, garbage
DAMAGED_INSIDE = "00000005_002.png"  # both ends whole, compressed data broken


def damaged_copies(tmp_path, real):
    """Real NIH PNGs and LFW JPEGs, and damaged copies of them: {name: (path, whole)}."""
    png = next((real / "nih" / "images").glob("*.png")).read_bytes()
    jpeg = (real / "lfw" / "Anthony_Hopkins_0001.jpg").read_bytes()
    files = {"png": (png, True), "jpeg": (jpeg, True), "png_cut": (png[:len(png) // 2], False),
             "png_no_iend": (png[:-12], False), "jpeg_cut": (jpeg[:len(jpeg) * 2 // 3], False),
             "garbage": (os.urandom(5000), False), "empty": (b"", False), "text": (b"not an image\n", False),
             "png_bad_ihdr": (png[:16] + b"\0" * 8 + png[24:], False)}
    paths = {}
    for name, (content, whole) in files.items():
        (tmp_path / name).write_bytes(content)
        paths[name] = (tmp_path / name, whole)
    return paths


def test_the_check_tells_whole_real_images_from_damaged_copies(tmp_path, real):
    for name, (path, whole) in damaged_copies(tmp_path, real).items():
        assert (problem(path) is None) == whole, (name, problem(path))
    assert problem(tmp_path / "absent").startswith("unreadable file")
    assert all(problem(path) is None for path in (real / "nih" / "images").glob("*.png"))
    assert all(problem(path) is None for path in (real / "lfw").glob("*.jpg"))


def test_tensorflow_fails_on_what_the_check_rejects(tmp_path, real):
    """The check stands for a decode: what it rejects does not decode (a PNG without IEND aside, which TensorFlow
    reads), so leaving those files out up front loses nothing a run could have used."""
    for name, (path, whole) in damaged_copies(tmp_path, real).items():
        if not whole and name != "png_no_iend":
            with pytest.raises(tf.errors.InvalidArgumentError):
                tf.io.decode_image(tf.io.read_file(str(path)), channels=1).numpy()


def test_only_new_or_changed_files_are_read_again(tmp_path, real):
    folder = tmp_path / "images"
    folder.mkdir()
    for png in sorted((real / "nih" / "images").glob("*.png"))[:6]:
        shutil.copy(png, folder / png.name)
    paths = sorted(str(path) for path in folder.iterdir())
    assert check_files(paths) == ({}, 6)
    assert check_files(paths) == ({}, 0)
    changed = folder / os.path.basename(paths[2])
    changed.write_bytes(changed.read_bytes()[:1000])  # truncated in place
    os.utime(changed, ns=(1, 1))
    assert check_files(paths) == ({str(changed): "truncated PNG (no IEND chunk at the end)"}, 1)
    added = folder / "new.png"
    added.write_bytes(b"garbage")
    bad, checked = check_files(paths + [str(added)])
    assert checked == 1 and bad == {str(changed): "truncated PNG (no IEND chunk at the end)",
                                    str(added): "not a PNG, JPEG, GIF or BMP file"}
    shutil.copy(real / "nih" / "images" / changed.name, changed)  # mended: its verdict goes
    os.utime(changed, ns=(2, 2))
    assert check_files(paths + [str(added)]) == ({str(added): "not a PNG, JPEG, GIF or BMP file"}, 1)
    assert check_files(paths) == ({}, 0)  # a file left out is forgotten, with its verdict


@pytest.fixture
def damaged_tree(tmp_path, real):
    """A chest tree of the real PNGs, one truncated and one replaced by garbage, with their 24 CSV rows."""
    root = tmp_path / "nih"
    (root / "images").mkdir(parents=True)
    for png in (real / "nih" / "images").glob("*.png"):
        shutil.copy(png, root / "images" / png.name)
    truncated = root / "images" / DAMAGED[0]
    truncated.write_bytes(truncated.read_bytes()[:30_000])
    (root / "images" / DAMAGED[1]).write_bytes(os.urandom(30_000))
    lines = (real / "nih" / "Data_Entry_2017_head.csv").read_text().splitlines()
    present = {png.name for png in (root / "images").iterdir()}
    (root / "Data_Entry_2017.csv").write_text("\n".join(lines[:1] + [line for line in lines[1:]
                                                                      if line.split(",")[0] in present]) + "\n")
    return root


def test_verified_runs_list_damaged_files_in_skipped_with_their_reason(damaged_tree):
    skipped = SkipLog()
    cfg = compose("dataset=chest_xray", f"dataset.root={damaged_tree}", "dataset.max_skipped_fraction=0.2")
    tables = tables_of(cfg, skipped)
    assert sum(len(table) for table in tables.values()) == 22
    assert sorted((os.path.basename(path), reason) for path, reason in skipped.rows) == [
        (DAMAGED[0], "undecodable image: truncated PNG (no IEND chunk at the end)"),
        (DAMAGED[1], "undecodable image: not a PNG, JPEG, GIF or BMP file")]


def test_unverified_pipelines_leave_damaged_files_out_and_keep_evaluation_in_order(damaged_tree):
    """pipeline.verify_images=false: training never sees the damaged files and runs on for epochs; evaluation keeps
    every row in table order, the damaged ones with weight 0."""
    cfg = compose("dataset=chest_xray", f"dataset.root={damaged_tree}", "pipeline.verify_images=false",
                  "pipeline.image_size=16", "pipeline.batch_size=4", "dataset.validation_fraction=0.5")
    tables = tables_of(cfg)
    assert sum(len(table) for table in tables.values()) == 24
    for split in ("train", "validation"):
        table = tables[split]
        data = make_input(cfg, table, training=False, split=split)
        weights = np.concatenate([batch_weights for _, _, batch_weights in data.as_numpy_iterator()])[:len(table)]
        damaged = table.path.map(os.path.basename).isin(DAMAGED).to_numpy()
        np.testing.assert_array_equal(weights, (~damaged).astype(np.float32))
    train = tables["train"]
    whole = int((~train.path.map(os.path.basename).isin(DAMAGED)).sum())
    data = make_input(cfg, train, training=True, split="train")
    batches = list(data.take(3 * len(train) // 4).as_numpy_iterator())  # about three epochs, no error
    labels = np.concatenate([batch_labels for _, batch_labels, _ in batches])
    assert len(labels) == len(batches) * 4
    images = {image.tobytes() for batch, _, _ in batches for image in batch}
    assert len(images) <= whole and not any(image.max() == 0 for batch, _, _ in batches for image in batch)


@pytest.mark.slow
def test_an_unverified_run_with_damaged_files_trains_and_evaluates_to_the_end(damaged_tree, tmp_path):
    overrides = ("dataset=chest_xray", f"dataset.root={damaged_tree}", "pipeline.verify_images=false",
                 "dataset.validation_fraction=0.5")
    run_dir = tmp_path / "run"
    result = run_cli(*overrides, "model=resnet_v2_50", "pipeline.image_size=32", "pipeline.batch_size=4",
                     "trainer.train_steps=8", "trainer.eval_every=4", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    validation = tables_of(compose(*overrides))["validation"]
    whole = int((~validation.path.map(os.path.basename).isin(DAMAGED)).sum())
    assert json.loads((run_dir / "metrics.json").read_text())["examples"] == whole < len(validation)


def damage_inside(path):
    """Breaks 200 bytes a third of the way into a file, leaving both its ends whole."""
    content = bytearray(path.read_bytes())
    middle = len(content) // 3
    content[middle:middle + 200] = bytes((byte * 7 + 13) % 256 for byte in content[middle:middle + 200])
    path.write_bytes(bytes(content))


@pytest.fixture
def damaged_inside_tree(damaged_tree):
    """damaged_tree, and one more PNG whose two ends are whole but whose middle does not decode."""
    damage_inside(damaged_tree / "images" / DAMAGED_INSIDE)
    return damaged_tree


def test_a_file_damaged_inside_passes_the_check_and_fails_the_decode(damaged_inside_tree):
    path = damaged_inside_tree / "images" / DAMAGED_INSIDE
    assert problem(path) is None
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(tf.io.read_file(str(path)), channels=1).numpy()


def test_files_damaged_inside_are_left_out_and_reported_with_their_reason(damaged_inside_tree, tmp_path):
    """Evaluation keeps every row in order, the one that does not decode with weight 0; training runs on without
    it; both report the file, and collect names it with the decoder's reason."""
    from tf_harness.data.integrity import unreadable
    cfg = compose("dataset=chest_xray", f"dataset.root={damaged_inside_tree}", "pipeline.image_size=16",
                  "pipeline.batch_size=4", "dataset.validation_fraction=0.5", "dataset.max_skipped_fraction=0.2")
    tables = tables_of(cfg)
    assert sum(len(table) for table in tables.values()) == 22  # the truncated and garbage files, left out up front
    split = next(name for name, table in tables.items() if table.path.str.endswith(DAMAGED_INSIDE).any())
    table, model_dir = tables[split], tmp_path / "run"
    data = make_input(cfg, table, training=False, split=split, model_dir=model_dir)
    weights = np.concatenate([batch_weights for _, _, batch_weights in data.as_numpy_iterator()])[:len(table)]
    np.testing.assert_array_equal(weights, (~table.path.str.endswith(DAMAGED_INSIDE)).to_numpy().astype(np.float32))
    known = set()
    damaged = damaged_inside_tree / "images" / DAMAGED_INSIDE
    assert unreadable.collect(unreadable.report_folder(model_dir), known) == [
        (str(damaged), f"undecodable image: damaged inside (Invalid PNG data, size {damaged.stat().st_size})")]
    assert unreadable.collect(unreadable.report_folder(model_dir), known) == []  # reported once

    shutil.rmtree(unreadable.report_folder(model_dir))
    data = make_input(cfg, table, training=True, split=split, model_dir=model_dir)
    batches = list(data.take(3 * len(table) // 4).as_numpy_iterator())  # about three epochs, no error
    assert not any(image.max() == 0 for batch, _, _ in batches for image in batch)
    assert [path for path, _ in unreadable.collect(unreadable.report_folder(model_dir), set())] == [
        str(damaged_inside_tree / "images" / DAMAGED_INSIDE)]


def test_only_reports_a_pipeline_wrote_become_skipped_rows(tmp_path, real, caplog):
    """A damaged report file, one put in the report folder, or a directory there is one log line each, once,
    and no rows: never a traceback, nor a skipped.csv row for a line a pipeline did not write."""
    from tf_harness.data.integrity import unreadable
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes(next((real / "nih" / "images").glob("*.png")).read_bytes()[:100])
    report_dir = unreadable.report_folder(tmp_path / "run")
    report_dir.mkdir(parents=True)
    load = lambda path: (tf.image.resize(tf.io.decode_png(tf.io.read_file(path), 1), [4, 4]), 0)  # noqa: E731
    guard = unreadable.guard(load, lambda path: [path], report_dir)
    assert [weight for *_, weight in tf.data.Dataset.from_tensors(str(damaged)).map(guard)] == [0.0]
    reports = list(report_dir.iterdir())
    bad_bytes, two_lines, folder = (report_dir / f"{number}.txt" for number in (1, 2, 3))
    bad_bytes.write_bytes(b"\xff\xfe\0garbage")
    two_lines.write_text("garbage line one\n/etc/passwd")
    folder.mkdir()
    with caplog.at_level(logging.WARNING, logger="tf_harness.data.integrity.unreadable"):
        rows = unreadable.collect(report_dir, set())
        assert unreadable.collect(report_dir, set(path for path, _ in rows)) == []  # logged once
    assert len(reports) == 1 and [path for path, _ in rows] == [str(damaged)]
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 3, messages
    assert_names(messages[0], f"1 unreadable lines in {bad_bytes} ", "ignored")
    assert_names(messages[1], f"2 unreadable lines in {two_lines} ", "ignored")
    assert_names(messages[2], f"{folder} ", "a directory", "ignored")


def test_training_stops_with_one_line_when_no_record_decodes(tmp_path, real):
    """A load that fails on every record must not leave training waiting forever for a batch."""
    from tf_harness.data.integrity import unreadable
    cfg = compose("dataset=chest_xray", f"dataset.root={real / 'nih'}", "pipeline.image_size=16",
                  "pipeline.batch_size=4", "dataset.max_skipped_fraction=0.6", "pipeline.verify_images=false")
    table = tables_of(cfg)["train"]
    table = table.assign(path=str(tmp_path / "absent.png"))
    data = make_input(cfg, table, training=True, split="train")
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{len(table)} {unreadable.FAILED_IN_A_ROW}"):
        next(make_iterator(data))


@pytest.mark.slow  # end-to-end runs
def test_a_run_lists_a_file_damaged_inside_in_skipped_and_evaluates_the_rest(damaged_inside_tree, tmp_path):
    run_dir = tmp_path / "run"
    overrides = ("dataset=chest_xray", f"dataset.root={damaged_inside_tree}", "dataset.validation_fraction=0.5",
                 "dataset.max_skipped_fraction=0.2")
    result = run_cli(*overrides, "model=semi_alexnet", "pipeline.image_size=16", "pipeline.batch_size=4",
                     "trainer.train_steps=6", "trainer.eval_every=6", "trainer.log_every=2", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(run_dir / "skipped.csv") as f:
        rows = {os.path.basename(row["path"]): row["reason"] for row in csv.DictReader(f)}
    assert set(rows) == {*DAMAGED, DAMAGED_INSIDE}
    assert rows[DAMAGED_INSIDE].startswith("undecodable image: damaged inside (Invalid PNG data")
    validation = tables_of(compose(*overrides))["validation"]
    whole = int((~validation.path.str.endswith(DAMAGED_INSIDE)).sum())
    assert json.loads((run_dir / "metrics.json").read_text())["examples"] == whole


def test_encoded_shards_of_a_file_damaged_inside_leave_it_out_and_name_it(damaged_inside_tree, tmp_path):
    """`encoded` shards store the files' bytes as they are; the damaged one fails its decode when read, and the
    report names the file it came from."""
    from tf_harness.data.integrity import unreadable
    cfg = compose("dataset=chest_xray", f"dataset.root={damaged_inside_tree}", "pipeline.image_size=16",
                  "pipeline.batch_size=4", "dataset.validation_fraction=0.5", "dataset.max_skipped_fraction=0.2",
                  "tfrecord.encoding=encoded", f"tfrecord.dir={tmp_path / 'shards'}")
    convert_shards(cfg)
    cfg.pipeline.source = "tfrecord"
    tables = tables_of(cfg)
    split = next(name for name, table in tables.items() if table.path.str.endswith(DAMAGED_INSIDE).any())
    table, model_dir = tables[split], tmp_path / "run"
    data = make_input(cfg, table, training=False, split=split, model_dir=model_dir)
    weights = np.concatenate([batch_weights for _, _, batch_weights in data.as_numpy_iterator()])[:len(table)]
    assert sorted(weights) == [0.0] + [1.0] * (len(table) - 1)  # the train split's shards are in shuffled order
    rows = unreadable.collect(unreadable.report_folder(model_dir), set())
    assert [path for path, _ in rows] == [str(damaged_inside_tree / "images" / DAMAGED_INSIDE)]


@pytest.mark.parametrize("source", ["tfrecord", "service"])
def test_training_from_shards_or_a_service_reports_a_file_damaged_inside(damaged_inside_tree, tmp_path, source):
    """Training's first epoch is guarded whatever the source: `encoded` shards, or a tf.data service's workers
    (two, each guarding its own first epoch's worth); later epochs run on without the file."""
    from tensorflow.data.experimental import service as tf_service

    from tf_harness.data.integrity import unreadable
    cfg = compose("dataset=chest_xray", f"dataset.root={damaged_inside_tree}", "pipeline.image_size=16",
                  "pipeline.batch_size=4", "dataset.validation_fraction=0.5", "dataset.max_skipped_fraction=0.2")
    servers = []
    if source == "tfrecord":
        cfg.tfrecord.encoding, cfg.tfrecord.dir = "encoded", str(tmp_path / "shards")
        convert_shards(cfg)
        cfg.pipeline.source = "tfrecord"
    else:
        dispatcher = tf_service.DispatchServer(tf_service.DispatcherConfig(port=0))
        servers = [dispatcher] + [tf_service.WorkerServer(tf_service.WorkerConfig(
            dispatcher_address=dispatcher.target.split("://")[1])) for _ in range(2)]
        cfg.pipeline.service = dispatcher.target
    tables = tables_of(cfg)
    split = next(name for name, table in tables.items() if table.path.str.endswith(DAMAGED_INSIDE).any())
    table, model_dir = tables[split], tmp_path / "run"
    data = make_input(cfg, table, training=True, split=split, model_dir=model_dir)
    batches = list(data.take(3 * len(table) // 4).as_numpy_iterator())  # about three epochs, no error
    assert not any(image.max() == 0 for batch, _, _ in batches for image in batch)
    rows = unreadable.collect(unreadable.report_folder(model_dir), set())
    assert [path for path, _ in rows] == [str(damaged_inside_tree / "images" / DAMAGED_INSIDE)]
    assert rows[0][1].startswith("undecodable image: damaged inside (Invalid PNG data")
    del servers


def test_drawn_training_pairs_report_a_file_damaged_inside_before_the_first_draw(tmp_path):
    """LFW's training pairs are drawn, with no epochs: a guarded pass decodes every training image once before
    the draws, reports the damaged one, and yields no pairs of its own."""
    from tf_harness.data.integrity import unreadable
    from tf_harness.data.samples.lfw_pairs import make_sample
    root = tmp_path / "lfw"
    make_sample(root, seed=0)
    cfg = compose("dataset=lfw_pairs", f"dataset.root={root}", "pipeline.image_size=16", "pipeline.batch_size=4",
                  "deterministic=true")
    table = tables_of(cfg)["train"]
    whole = list(make_input(cfg, table, training=True, split="train").take(3).as_numpy_iterator())
    damaged = Path(table.path.iloc[len(table) // 2])
    content = bytearray(damaged.read_bytes())
    # A Huffman table claiming more codes than it can hold: libjpeg gives up on any decode of the file, a
    # window's too. (Damage to the compressed data often decodes, with warnings, and is not caught.)
    table_counts = content.index(b"\xff\xc4") + 5
    content[table_counts:table_counts + 16] = b"\xff" * 16
    damaged.write_bytes(bytes(content))
    assert problem(damaged) is None
    with pytest.raises(tf.errors.InvalidArgumentError):
        task_of(cfg).read_image(str(damaged)).numpy()
    model_dir = tmp_path / "run"
    batches = list(make_input(cfg, table, training=True, split="train", model_dir=model_dir).take(3).as_numpy_iterator())
    rows = unreadable.collect(unreadable.report_folder(model_dir), set())
    assert [path for path, _ in rows] == [str(damaged)]
    assert rows[0][1].startswith("undecodable image: damaged inside")
    # The same draws as before the damage, from the first: the pass yields none of its own (and these seeded
    # draws hold no pair with the damaged file).
    for before, after in zip(whole, batches):
        np.testing.assert_array_equal(before[1], after[1])
        np.testing.assert_array_equal(before[0][0], after[0][0])
        np.testing.assert_array_equal(before[0][1], after[0][1])


@pytest.mark.slow  # end-to-end runs
def test_a_run_on_files_that_never_decode_stops_with_one_line(damaged_tree, tmp_path):
    for png in (damaged_tree / "images").iterdir():
        png.write_bytes(os.urandom(3000))
    result = run_cli("dataset=chest_xray", f"dataset.root={damaged_tree}", "pipeline.verify_images=false",
                     "model=semi_alexnet", "pipeline.image_size=16", "pipeline.batch_size=4", "trainer.train_steps=2",
                     f"hydra.run.dir={tmp_path / 'run'}")
    assert_error(result, 1, "in a row failed to read or decode", "in training")


def test_a_file_rewritten_in_place_with_its_old_size_and_mtime_is_checked_again(tmp_path, real):
    """A verdict is keyed by the file's size, mtime and ctime: a copy or an editor may keep or set back the first
    two, never the ctime."""
    png = next((real / "nih" / "images").glob("*.png"))
    path = tmp_path / "image.png"
    shutil.copy(png, path)
    assert check_files([str(path)]) == ({}, 1)
    before = path.stat()
    path.write_bytes(os.urandom(before.st_size))  # same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # and mtime
    assert check_files([str(path)]) == ({str(path): "not a PNG, JPEG, GIF or BMP file"}, 1)


def test_a_pickled_cache_is_read_only_for_its_own_key_and_never_fails_a_run(tmp_path):
    from tf_harness.data.integrity import pickle_cache
    path = tmp_path / "cache.pkl"
    pickle_cache.write(path, {"verdicts": 1}, key=("v3", "/data/lfw"))
    assert pickle_cache.read(path, "none", key=("v3", "/data/lfw")) == {"verdicts": 1}
    assert pickle_cache.read(path, "none", key=("v3", "/data/nih")) == "none"  # another folder's, same file
    path.write_bytes(b"cno_such_module\nThing\n.")  # a pickle of a class that is gone
    assert pickle_cache.read(path, "none") == "none"
    path.write_bytes(b"\x80\x04\x95\xff")  # cut short
    assert pickle_cache.read(path, "none") == "none"


@pytest.mark.parametrize("first", ["frame", "array"])
def test_a_keyed_read_of_an_unkeyed_cache_of_an_earlier_version_makes_it_again(tmp_path, first):
    """The chest index cache of an earlier version, unkeyed: a (DataFrame, labels, rows) triple. Its keyed read
    asked the DataFrame whether it was the key's marker, and every chest run failed with its ambiguous truth."""
    import numpy as np
    import pandas as pd
    from tf_harness.data.integrity import pickle_cache
    path = tmp_path / "chest_xray-index.pkl"
    head = pd.DataFrame({"path": ["a.png"]}) if first == "frame" else np.zeros(3)
    pickle_cache.write(path, (head, np.zeros((1, 14)), []))
    assert pickle_cache.read(path, "none", key="metadata v2") == "none"
    pickle_cache.write(path, ("tf-harness keyed cache", np.zeros(3), "content"))  # an array where the key goes
    assert pickle_cache.read(path, "none", key="metadata v2") == "none"


def test_a_folder_in_the_place_of_a_verdicts_file_is_removed_with_a_warning_and_the_file_written(
        tmp_path, monkeypatch, caplog):
    from tf_harness.data.integrity import verification
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    image = tmp_path / "images" / "a.jpg"
    image.parent.mkdir()
    image.write_bytes(b"\xff\xd8\xff\xe0" + b"\0" * 100 + b"\xff\xd9")
    records = verification._records_file([str(image)])
    (records / "left").mkdir(parents=True)  # a folder, not empty, where the verdicts go
    with caplog.at_level(logging.INFO):
        assert check_files([str(image)]) == ({}, 1)
    one_naming(caplog.messages, records, "Removing the folder")
    assert records.is_file()
    assert check_files([str(image)]) == ({}, 0)  # read back: nothing checked again
