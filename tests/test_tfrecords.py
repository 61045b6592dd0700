"""TFRecord shards: the converter (`python -m tf_harness.data.tfrecords`), the reader, and an independent reader's view."""
import csv
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from omegaconf import OmegaConf

from tf_harness.data import TASKS
from tf_harness.data.errors import ConfigError, DatasetError
from tf_harness.data.iterators import make_iterator
from tf_harness.data.sources import TableRecords
from tf_harness.data.tfrecords import layout, writer
from tf_harness.experiments.config.settings import Settings
from tests.conftest import PROJECT, compose, convert_shards, make_input, read_shards, run_cli, tables_of, task_of
from tests.refusals import assert_config_error, assert_names, raises_naming

SMALL = ("pipeline.image_size=32", "pipeline.batch_size=8")
ENCODINGS = layout.ENCODINGS


def _cfg(dataset, directory, encoding, *overrides):
    return compose(f"dataset={dataset}", *SMALL, f"tfrecord.encoding={encoding}", f"tfrecord.dir={directory}",
                   *overrides)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Converts a dataset once per encoding; returns (cfg, manifest, tables)."""
    done = {}

    def convert(dataset, encoding):
        if (dataset, encoding) not in done:
            cfg = _cfg(dataset, tmp_path_factory.mktemp(f"{dataset}-{encoding}"), encoding)
            done[dataset, encoding] = cfg, convert_shards(cfg), tables_of(cfg)
        return done[dataset, encoding]

    return convert


@pytest.fixture(scope="module")
def files_element_spec():
    """The element_spec of input_fn reading a dataset's image files, built once per (dataset, training) for both
    encodings' tests: (dataset, training, table) -> spec."""
    done = {}

    def spec(dataset, training, table):
        if (dataset, training) not in done:
            split = "train" if training else "validation"
            done[dataset, training] = make_input(compose(f"dataset={dataset}", *SMALL), table, training,
                                                 split).element_spec
        return done[dataset, training]

    return spec


def _override(cfg, *dotlist):
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(dotlist)))


def _shard_records(path):
    return sum(1 for _ in tf.data.TFRecordDataset(str(path)))


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _element_lists(data):
    """Every element of `data` as a flat list of numpy arrays."""
    return [[np.asarray(part) for part in tf.nest.flatten(element)] for element in data.as_numpy_iterator()]


# ---------------------------------------------------------------------------------------------
# The converter


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_manifest_records_every_split_shard_and_count(converted, encoding):
    cfg, manifest, tables = converted("chest_xray", encoding)
    directory = Path(cfg.tfrecord.dir)
    assert json.loads((directory / "manifest.json").read_text()) == manifest
    assert manifest["complete"] and manifest["dataset"] == "chest_xray" and manifest["encoding"] == encoding
    assert manifest["image_size"] == ([32, 32] if encoding == "raw" else None)
    assert set(manifest["splits"]) == set(tables)
    for split, entry in manifest["splits"].items():
        shards = entry["shards"]
        assert entry["count"] == len(tables[split]) == sum(shard["count"] for shard in shards)
        assert [shard["file"] for shard in shards] == [f"{split}-{i:05d}-of-{len(shards):05d}.tfrecord"
                                                        for i in range(len(shards))]
        for shard in shards:
            path = directory / shard["file"]
            assert _shard_records(path) == shard["count"]
            assert path.stat().st_size == shard["bytes"] and _sha256(path) == shard["sha256"]
        assert entry["feature_spec"]["image/class/label"] == {"dtype": "int64", "shape": [14]}
        assert {"image/encoded", "image/format", "image/height", "image/width", "image/channels",
                "image/filename"} <= set(entry["feature_spec"])
    # Enough training shards for every worker's share of files; the sample is far below 150 MB a shard.
    assert len(manifest["splits"]["train"]["shards"]) == cfg.tfrecord.min_shards_per_worker
    assert len(manifest["splits"]["validation"]["shards"]) == 1
    assert (directory / "skipped.csv").read_text().splitlines() == ["path,reason"]


def test_shards_aim_at_the_configured_size(tmp_path):
    cfg = _cfg("chest_xray", tmp_path, "encoded", "tfrecord.shard_mb=2")
    manifest = convert_shards(cfg)
    validation = manifest["splits"]["validation"]
    total = sum(shard["bytes"] for shard in validation["shards"])
    assert len(validation["shards"]) == -(-total // 2_000_000)  # ceil: about 2 MB each
    assert max(shard["bytes"] for shard in validation["shards"]) < 2_000_000 * 1.5


def test_train_shards_split_across_workers_from_tf_config(converted, monkeypatch):
    cfg, manifest, tables = converted("chest_xray", "raw")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": [f"localhost:{2000 + i}" for i in range(3)]},
                                                "task": {"type": "worker", "index": 0}}))
    settings = Settings.from_config(_override(cfg, "tfrecord.min_shards_per_worker=4")).tfrecords()
    from tf_harness.experiments.config.strategies import workers
    plan = writer._plan(task_of(cfg), settings, "train", tables["train"], cfg.seed, workers()[0])
    assert len(plan) == 4 * 3 and sorted(np.concatenate(plan)) == list(range(len(tables["train"])))

    everything = {image.tobytes() for image, _ in read_shards(cfg, "train", False).as_numpy_iterator()}
    seen = []
    for index in range(3):
        context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=index)
        seen.append({image.tobytes() for image, _ in read_shards(cfg, "train", True, context=context)
                     .as_numpy_iterator()})
    assert all(seen) and sum(map(len, seen)) == len(everything) == manifest["splits"]["train"]["count"]
    assert set().union(*seen) == everything
    with raises_naming(ConfigError, "10 train shards", "11 workers"):
        read_shards(cfg, "train", True, context=tf.distribute.InputContext(num_input_pipelines=11))


def test_a_killed_conversion_is_ignored_by_readers_and_finished_by_a_rerun(tmp_path, converted):
    """SIGKILLs a real conversion between writing a shard and renaming it, then runs it again."""
    directory = tmp_path / "shards"
    overrides = ["dataset=chest_xray", *SMALL, "tfrecord.encoding=encoded", f"tfrecord.dir={directory}"]
    script = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        sys.path.insert(0, {str(PROJECT)!r})
        from tests.conftest import compose, convert_shards
        from tf_harness.data.tfrecords import writer
        hashed, lock, sha256 = [], threading.Lock(), writer.sha256
        def sha256_then_die(path):  # runs on a finished .tmp shard, before its rename
            with lock:
                hashed.append(path)
                count = len(hashed)
            if count > 5:
                threading.Event().wait()  # other writers stop with their shard still .tmp
            if count == 5:
                time.sleep(0.5)  # lets the main thread record the four shards renamed so far
                os.kill(os.getpid(), signal.SIGKILL)
            return sha256(path)
        writer.sha256 = sha256_then_die
        convert_shards(compose(*{overrides!r}))
    """)
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert killed.returncode == -9, killed.stderr[-2000:]
    left = json.loads((directory / "manifest.json").read_text())
    assert not left["complete"]
    assert list(directory.glob("*.tfrecord.tmp")), "the shard being renamed stays under its .tmp name"
    recorded = {shard["file"]: os.stat(directory / shard["file"])
                for entry in left["splits"].values() for shard in entry["shards"] if shard["sha256"]}
    assert 0 < len(recorded) <= 4

    cfg = compose(*overrides)
    with raises_naming(ConfigError, f"tfrecord.dir={directory}", "did not finish",
                       "`python -m tf_harness.data.tfrecords dataset=chest_xray`"):
        read_shards(cfg, "train", True, 0)

    manifest = convert_shards(cfg)
    assert not list(directory.glob("*.tmp"))
    for name, before in recorded.items():  # recorded whole: kept, not rewritten
        after = os.stat(directory / name)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # Byte for byte what an uninterrupted conversion writes.
    _, clean, _ = converted("chest_xray", "encoded")
    assert manifest["splits"] == clean["splits"]


def test_a_rerun_rewrites_only_a_damaged_shard_and_readers_ignore_tmp_files(tmp_path):
    cfg = _cfg("chest_xray", tmp_path, "encoded")
    manifest = convert_shards(cfg)
    shards = [tmp_path / shard["file"] for entry in manifest["splits"].values() for shard in entry["shards"]]
    damaged = shards[3]
    content = bytearray(damaged.read_bytes())
    content[len(content) // 2] ^= 0xFF  # same size, different bytes
    damaged.write_bytes(bytes(content))
    stray = tmp_path / "train-00004-of-00010.tfrecord.tmp"
    stray.write_bytes(b"half a shard")
    half_manifest = tmp_path / ".manifest.json.12345.tmp"  # a conversion killed while writing its manifest
    half_manifest.write_text("{")
    tables = tables_of(cfg)
    # The reader takes its file list from the manifest, never from the folder.
    assert sum(1 for _ in read_shards(cfg, "validation", False, 0, tables["validation"])) == len(
        tables["validation"])
    before = {path: os.stat(path) for path in shards}

    again = convert_shards(cfg)
    assert again == manifest and _sha256(damaged) == manifest["splits"]["train"]["shards"][3]["sha256"]
    rewritten = [path for path in shards if os.stat(path).st_ino != before[path].st_ino]
    assert rewritten == [damaged]
    assert not stray.exists() and not half_manifest.exists()


def _damage_manifest(path, how):
    """Damages the manifest at `path` as a bad disk, an editor or a mistaken command might."""
    content = path.read_text()
    if how == "cut short":
        path.write_text(content[:100])
    elif how == "emptied":
        path.write_text("")
    elif how == "a directory":
        path.unlink()
        path.mkdir()
    elif how == "a key missing":
        manifest = json.loads(content)
        del manifest["splits"]["validation"]["shards"][0]["sha256"]
        path.write_text(json.dumps(manifest))
    else:  # not UTF-8
        path.write_bytes(b"\xff\xfe" + content.encode()[2:])


@pytest.mark.parametrize("how", ["cut short", "emptied", "a directory", "a key missing", "not UTF-8"])
def test_a_damaged_manifest_is_one_error_naming_it_and_the_converter(converted, tmp_path, how):
    cfg, manifest, _ = converted("lfw_pairs", "encoded")
    directory = tmp_path / "shards"
    shutil.copytree(cfg.tfrecord.dir, directory)
    _damage_manifest(directory / "manifest.json", how)
    cfg = _override(cfg, f"tfrecord.dir={directory}")
    with raises_naming(DatasetError, directory / "manifest.json", "damaged",
                       "`python -m tf_harness.data.tfrecords dataset=lfw_pairs`") as error:
        read_shards(cfg, "validation", False)
    assert "\n" not in str(error.value)


def test_the_converter_takes_a_damaged_manifest_for_none_and_removes_no_file_it_did_not_write(converted, tmp_path,
                                                                                             caplog):
    cfg, clean, _ = converted("lfw_pairs", "encoded")
    directory = tmp_path / "shards"
    shutil.copytree(cfg.tfrecord.dir, directory)
    _damage_manifest(directory / "manifest.json", "cut short")
    cfg = _override(cfg, f"tfrecord.dir={directory}")
    shard = directory / clean["splits"]["validation"]["shards"][0]["file"]
    before = os.stat(shard)
    unknown = directory / "validation-00003-of-00007.tfrecord"  # named like a shard; no manifest lists it
    unknown.write_bytes(b"someone else's")
    with caplog.at_level(logging.WARNING, logger="tf_harness.data.tfrecords"):
        manifest = convert_shards(cfg)
    assert manifest == json.loads((directory / "manifest.json").read_text())
    assert manifest["splits"] == clean["splits"]
    assert os.stat(shard).st_ino != before.st_ino  # unverified, so written again
    assert unknown.read_bytes() == b"someone else's"
    damaged = [record.getMessage() for record in caplog.records if "is damaged" in record.getMessage()]
    assert len(damaged) == 1
    assert_names(damaged[0], directory / "manifest.json", "not JSON")
    assert any("1 file(s)" in record.getMessage() and unknown.name in record.getMessage()
               for record in caplog.records)
    read_shards(cfg, "validation", False)  # whole again

    _damage_manifest(directory / "manifest.json", "a directory")
    with raises_naming(DatasetError, directory / "manifest.json", "a directory",
                       "`python -m tf_harness.data.tfrecords dataset=lfw_pairs`"):
        convert_shards(cfg)


def test_pair_tables_store_one_image_feature_set_per_path_column():
    assert [layout.image_prefix(column) for column in ("path", "path_a", "path_b")] == ["image", "image_a",
                                                                                          "image_b"]
    spec = layout.feature_spec(["path_a", "path_b"], [])
    assert {"image_a/encoded", "image_b/encoded", "image_a/filename", "image_b/height"} <= set(spec)
    assert spec["pair/label"] == {"dtype": "int64", "shape": []} and "image/class/label" not in spec


def test_bad_encoding_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tf_harness.data.tfrecords", "dataset=chest_xray", "tfrecord.encoding=png",
                             f"tfrecord.dir={tmp_path / 'shards'}", f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=PROJECT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert_config_error(result, "tfrecord.encoding=png", "encoded|raw")


# ---------------------------------------------------------------------------------------------
# The reader


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("dataset", sorted(TASKS))
def test_reader_gives_what_the_file_pipeline_gives(converted, files_element_spec, dataset, encoding):
    cfg, manifest, tables = converted(dataset, encoding)
    task = task_of(cfg)
    for split in manifest["splits"]:
        source = TableRecords(task, tables[split])
        files = source.records(seed=0).map(source.load)
        shards = read_shards(cfg, split, False, 0, tables[split])
        assert shards.element_spec == files.element_spec
        if split == "validation":
            # In table order, pixel for pixel what load makes (raw: stored by it; encoded: decoded here).
            for expected, got in zip(_element_lists(files), _element_lists(shards), strict=True):
                for a, b in zip(expected, got, strict=True):
                    np.testing.assert_array_equal(a, b)

    for training, split in ((True, "train"), (False, "validation")):
        from_shards = make_input(_override(cfg, "pipeline.source=tfrecord"), tables[split], training, split)
        assert from_shards.element_spec == files_element_spec(dataset, training, tables[split])
        next(make_iterator(from_shards))


def test_training_stream_is_shuffled_endless_and_whole_per_epoch(converted):
    cfg, manifest, tables = converted("chest_xray", "raw")
    count = manifest["splits"]["train"]["count"]

    def two_epochs(seed):
        shards = _override(cfg, "pipeline.source=tfrecord", "pipeline.batch_size=1", "deterministic=true",
                           f"seed={seed}")
        stream = [image.tobytes() for image, _, _ in make_input(shards, tables["train"], True, "train").unbatch()
                  .take(2 * count).as_numpy_iterator()]
        return stream[:count], stream[count:]

    first, second = two_epochs(7)
    stored = [image.tobytes() for image, _ in read_shards(cfg, "train", False).as_numpy_iterator()]
    assert sorted(first) == sorted(second) == sorted(stored)  # each epoch is the whole split
    assert first != stored and first != second  # shuffled, and reshuffled every epoch
    assert two_epochs(7) == (first, second)  # seeded: a pipeline built again gives the same stream
    assert two_epochs(8)[0] != first


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_restored_input_checkpoint_resumes_the_exact_stream(converted, encoding, tmp_path):
    """The runner saves the input iterator with trainer.checkpoint_input; shards must resume exactly."""
    cfg, _, tables = converted("chest_xray", encoding)
    cfg = _override(cfg, "pipeline.source=tfrecord", "deterministic=true")
    iterator = make_iterator(make_input(cfg, tables["train"], True, "train"))
    for _ in range(10):
        next(iterator)
    saved = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
    expected = [next(iterator) for _ in range(3)]
    restored = make_iterator(make_input(cfg, tables["train"], True, "train"))
    tf.train.Checkpoint(iterator=restored).restore(saved)
    for batch in expected:
        for a, b in zip(tf.nest.flatten(batch), tf.nest.flatten(next(restored)), strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_raw_shards_at_another_size_are_a_config_error(converted):
    cfg, _, _ = converted("chest_xray", "raw")
    other = _override(cfg, "pipeline.image_size=48")
    with raises_naming(ConfigError, "pipeline.image_size=48", cfg.tfrecord.dir, "pipeline.image_size=32"):
        read_shards(other, "validation", False, 0)


def test_shards_of_another_encoding_or_none_at_all_are_config_errors(converted, tmp_path):
    cfg, _, tables = converted("chest_xray", "encoded")
    raw = _override(cfg, "tfrecord.encoding=raw")
    with raises_naming(ConfigError, "tfrecord.encoding=raw", f"tfrecord.dir={cfg.tfrecord.dir}",
                       "tfrecord.encoding=encoded"):
        read_shards(raw, "validation", False, 0)
    empty = _override(cfg, f"tfrecord.dir={tmp_path}", "pipeline.source=tfrecord")
    with raises_naming(ConfigError, f"tfrecord.dir={tmp_path}", "manifest.json",
                       "`python -m tf_harness.data.tfrecords dataset=chest_xray`"):
        make_input(empty, tables["validation"], False, "validation")
    with raises_naming(ConfigError, f"tfrecord.dir={cfg.tfrecord.dir}", "validation",
                       f"({len(tables['validation']) - 1} examples)"):
        read_shards(cfg, "validation", False, 0, tables["validation"].iloc[1:])


# ---------------------------------------------------------------------------------------------
# An independent reader: the `tfrecord` package from PyPI, and CRC32C checked here

_INDEPENDENT_READER = textwrap.dedent("""
    import io, json, struct, sys
    # tfrecord's package __init__ imports its PyTorch dataset when torch is importable; only its reader is needed.
    sys.modules["torch"] = None
    import crc32c
    import numpy as np
    from PIL import Image
    from tfrecord.reader import example_loader

    def masked_crc(data):  # TFRecord's framing: masked CRC32C of the length and of the payload
        crc = crc32c.crc32c(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    def framed_records(path):
        content, offset, count = open(path, "rb").read(), 0, 0
        while offset < len(content):
            header = content[offset:offset + 8]
            length, = struct.unpack("<Q", header)
            payload = content[offset + 12:offset + 12 + length]
            if struct.unpack("<I", content[offset + 8:offset + 12])[0] != masked_crc(header):
                return "length CRC mismatch at %d" % offset
            if struct.unpack("<I", content[offset + 12 + length:offset + 16 + length])[0] != masked_crc(payload):
                return "payload CRC mismatch at %d" % offset
            offset, count = offset + 16 + length, count + 1
        return count

    directory, corrupt = sys.argv[1], sys.argv[2]
    manifest = json.load(open(directory + "/manifest.json"))
    report = {"counts": {}, "labels": {}, "images": []}
    for split, entry in manifest["splits"].items():
        labels = []
        for shard in entry["shards"]:
            path = directory + "/" + shard["file"]
            parsed = list(example_loader(path, None))
            report["counts"][shard["file"]] = [framed_records(path), len(parsed)]
            labels += [example["image/class/label"].tolist() for example in parsed]
            for example in parsed[:3]:
                filename = example["image/filename"].decode()
                height, width, channels = (int(example["image/" + key][0]) for key in ("height", "width", "channels"))
                if example["image/format"] == b"raw":
                    pixels = np.frombuffer(example["image/encoded"], np.uint8).reshape(height, width, channels)
                    np.save("%s/%s.npy" % (sys.argv[3], len(report["images"])), pixels)
                    report["images"].append({"filename": filename, "shape": [height, width, channels]})
                    continue
                source = open(filename, "rb").read()
                stored, original = Image.open(io.BytesIO(example["image/encoded"])), Image.open(filename)
                report["images"].append({
                    "filename": filename, "same_bytes": example["image/encoded"] == source,
                    "same_pixels": np.array_equal(np.asarray(stored), np.asarray(original)),
                    "format": example["image/format"].decode(), "header": [height, width, channels],
                    "pil": [original.height, original.width, len(original.getbands())]})
        report["labels"][split] = labels
    # The check must be able to fail: one flipped payload byte in a copy of the first shard.
    first = directory + "/" + manifest["splits"]["validation"]["shards"][0]["file"]
    content = bytearray(open(first, "rb").read())
    content[100] ^= 0x01
    open(corrupt, "wb").write(bytes(content))
    report["corrupt"] = framed_records(corrupt)
    print(json.dumps(report))
""")


@pytest.mark.skipif(importlib.util.find_spec("tfrecord") is None,
                    reason="the tfrecord package (pip install -e '.[test]') is not installed")
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_an_independent_tfrecord_reader_agrees(converted, encoding, tmp_path):
    """Reads every shard with the `tfrecord` package, in a process without TensorFlow.

    TensorFlow and `tfrecord` both register the `tensorflow.Example` protos, and
    protobuf refuses the second registration, so they cannot share a process.
    """
    cfg, manifest, tables = converted("chest_xray", encoding)
    result = subprocess.run([sys.executable, "-c", _INDEPENDENT_READER, cfg.tfrecord.dir, str(tmp_path / "corrupt"),
                             str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    for entry in manifest["splits"].values():
        for shard in entry["shards"]:
            assert report["counts"][shard["file"]] == [shard["count"], shard["count"]]
    assert isinstance(report["corrupt"], str) and "CRC mismatch" in report["corrupt"]
    # Evaluation splits are stored in table order; train rows are shuffled into shards.
    assert report["labels"]["validation"] == tables["validation"].label.tolist()
    assert sorted(report["labels"]["train"]) == sorted(tables["train"].label.tolist())
    assert report["images"]
    if encoding == "encoded":
        for image in report["images"]:
            assert image["same_bytes"] and image["same_pixels"] and image["format"] == "png", image
            assert image["header"] == image["pil"], image
        return
    task = task_of(cfg)
    for k, image in enumerate(report["images"]):
        assert image["shape"] == [32, 32, 1]
        table = next(t for t in tables.values() if image["filename"] in set(t.path))
        source = TableRecords(task, table[table.path == image["filename"]])
        pixels = source.load(source.records(seed=0).get_single_element())[0]
        np.testing.assert_array_equal(np.load(tmp_path / f"{k}.npy"), pixels.numpy())


def test_the_converter_starts_as_quietly_as_run_py(tmp_path):
    """No TensorFlow C++ start-up lines when TF_CPP_MIN_LOG_LEVEL is unset, as for run.py: a bad config is
    its one line, and a conversion prints its own lines alone."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "HARNESS_DEFAULT_TF_LOG_LEVEL")}
    command = [sys.executable, "-m", "tf_harness.data.tfrecords", "dataset=lfw_pairs", f"tfrecord.dir={tmp_path / 's'}"]
    bad = subprocess.run([*command, "tfrecord.encoding=png", f"hydra.run.dir={tmp_path / 'bad'}"], cwd=PROJECT,
                         capture_output=True, text=True, timeout=300, env=env)
    assert_config_error(bad, "tfrecord.encoding=png", "encoded|raw")
    good = subprocess.run([*command, f"hydra.run.dir={tmp_path / 'run'}"], cwd=PROJECT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert good.returncode == 0, good.stderr[-2000:]
    output = good.stdout + good.stderr
    assert "absl::InitializeLog" not in output and "cudart_stub" not in output and "cpu_feature_guard" not in output, \
        output[:2000]


# ---------------------------------------------------------------------------------------------
# Damaged shards: checked against the manifest before any pipeline reads them


def _damaged_copy(converted, tmp_path, encoding="raw"):
    """A copy of the chest shards of `encoding` that a test may damage: (cfg reading it, manifest, tables)."""
    cfg, manifest, tables = converted("chest_xray", encoding)
    directory = tmp_path / "shards"
    shutil.copytree(cfg.tfrecord.dir, directory)
    return _override(cfg, f"tfrecord.dir={directory}", "pipeline.source=tfrecord"), manifest, tables


def _cut(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def test_cut_train_shards_lose_only_their_lost_records_which_are_listed_counted_and_logged(converted, tmp_path,
                                                                                             caplog):
    """Every train shard cut short, as a disk or a broken copy leaves it: each is read as far as its records are
    whole, its lost records are one skipped.csv row naming the shard and counting as that many examples against
    dataset.max_skipped_fraction, and the log says so; training reads on through epochs without an error."""
    from tf_harness.data.integrity.skipped import SkipLog
    from tf_harness.data.tables import check_skipped
    from tf_harness.data.tfrecords.reader import TFRecordRecords, check_shards
    cfg, manifest, tables = _damaged_copy(converted, tmp_path)
    directory, shards = Path(cfg.tfrecord.dir), manifest["splits"]["train"]["shards"]
    record = shards[0]["bytes"] // shards[0]["count"]  # raw records of one size: pixels and a label
    for shard in shards:
        _cut(directory / shard["file"], 2 * record + record // 2)  # two whole records, then half of one
    skipped = SkipLog()
    with caplog.at_level(logging.WARNING, logger="tf_harness.data.tfrecords.reader"):
        check_shards(task_of(cfg), tables, Settings.from_config(cfg).tfrecords(), "train", skipped)
    lost = sum(shard["count"] - 2 for shard in shards)
    assert skipped.rows == [(str(directory / shard["file"]),
                             f"shard damaged: {shard['count'] - 2} of {shard['count']} records unreadable")
                            for shard in shards]
    assert len(skipped) == skipped.in_tables == lost and skipped.summary() == f"{lost} shard damaged"
    for shard in shards:
        [warned] = [message for message in caplog.messages if str(directory / shard["file"]) in message]
        assert_names(warned, f"{2 * record + record // 2} of {shard['bytes']} bytes",
                     f"{shard['count'] - 2} of its {shard['count']} records", "skipped.csv")
    total = sum(len(table) for table in tables.values())
    with raises_naming(DatasetError, f"{lost} of {total} examples", f"({lost} shard damaged)",
                       "dataset.max_skipped_fraction=0.1"):
        check_skipped(tables, skipped, 0.1)
    check_skipped(tables, skipped, 0.99)

    source = TFRecordRecords(task_of(cfg), tables["train"], "train", True, Settings.from_config(cfg).tfrecords())
    assert source.epoch_length() == source.count == 2 * len(shards)
    whole = {image.tobytes() for image, _ in read_shards(converted("chest_xray", "raw")[0], "train", False)
             .as_numpy_iterator()}
    stream = make_input(_override(cfg, "pipeline.batch_size=1"), tables["train"], True, "train").unbatch()
    images = [image.tobytes() for image, _, _ in stream.take(3 * source.count).as_numpy_iterator()]
    assert len(images) == 3 * source.count and len(set(images)) == source.count and set(images) <= whole


def test_a_run_whose_cut_shards_lose_too_much_stops_with_one_line(converted, tmp_path):
    from tf_harness.experiments import api
    cfg, manifest, _ = _damaged_copy(converted, tmp_path)
    for shard in manifest["splits"]["train"]["shards"]:
        _cut(Path(cfg.tfrecord.dir) / shard["file"], 300)  # not even one whole record
    run_dir, lost = tmp_path / "run", manifest["splits"]["train"]["count"]
    with raises_naming(api.RunFailed, f"{lost} of 361 examples", f"({lost} shard damaged)",
                       "dataset.max_skipped_fraction=0.1") as stopped:
        api.run(["dataset=chest_xray", *SMALL, "model=semi_alexnet", "tfrecord.encoding=raw",
                 f"tfrecord.dir={cfg.tfrecord.dir}", "pipeline.source=tfrecord", "trainer.train_steps=2"],
                run_dir=str(run_dir))
    assert stopped.value.status == 1 and "\n" not in str(stopped.value)  # the command line's exit status and line
    with open(run_dir / "skipped.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(manifest["splits"]["train"]["shards"])
    assert all(row["reason"].startswith("shard damaged: ") for row in rows)
    assert "records are unreadable and left out" in (run_dir / "run.log").read_text()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_cut_validation_shard_keeps_table_order_and_counts_its_lost_rows_for_nothing(converted, tmp_path,
                                                                                      encoding):
    """Evaluation reads a cut shard's whole records and gives each lost one a blank of weight 0 in its row: no
    DataLossError, table order holds, and no image file is reported for the lost records."""
    from tf_harness.data.integrity import unreadable
    cfg, manifest, tables = _damaged_copy(converted, tmp_path, encoding)
    shard = manifest["splits"]["validation"]["shards"][0]
    path = Path(cfg.tfrecord.dir) / shard["file"]
    _cut(path, path.stat().st_size // 2)
    table, model_dir = tables["validation"], tmp_path / "run"
    batches = list(make_input(cfg, table, False, "validation", model_dir=model_dir).as_numpy_iterator())
    weights = np.concatenate([batch_weights for _, _, batch_weights in batches])[:len(table)]
    labels = np.concatenate([batch_labels for _, batch_labels, _ in batches])[:len(table)]
    readable = int(weights.sum())
    assert 0 < readable < len(table) and weights.tolist() == [1.0] * readable + [0.0] * (len(table) - readable)
    np.testing.assert_array_equal(labels[:readable], np.asarray(table.label.tolist())[:readable])
    assert unreadable.collect(unreadable.report_folder(model_dir), set()) == []


@pytest.mark.slow
def test_a_run_with_a_cut_validation_shard_evaluates_the_rest_in_one_line(converted, tmp_path):
    cfg, manifest, tables = _damaged_copy(converted, tmp_path)
    shard = manifest["splits"]["validation"]["shards"][0]
    path = Path(cfg.tfrecord.dir) / shard["file"]
    _cut(path, path.stat().st_size // 2)
    run_dir = tmp_path / "run"
    result = run_cli("dataset=chest_xray", *SMALL, "model=semi_alexnet", "tfrecord.encoding=raw",
                     f"tfrecord.dir={cfg.tfrecord.dir}", "pipeline.source=tfrecord", "trainer.train_steps=2",
                     "trainer.eval_every=2", "dataset.max_skipped_fraction=0.2", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "DataLossError" not in output
    lines = [line for line in output.splitlines() if str(path) in line and "is damaged" in line]
    assert len(lines) == 1, output[-3000:]
    with open(run_dir / "skipped.csv") as f:
        rows = list(csv.DictReader(f))
    lost = int(rows[0]["reason"].split()[2])
    assert rows == [{"path": str(path), "reason": f"shard damaged: {lost} of {shard['count']} records unreadable"}]
    assert json.loads((run_dir / "metrics.json").read_text())["examples"] == shard["count"] - lost


def test_shards_changed_in_place_are_found_by_their_sha256(converted, tmp_path, caplog):
    """Damage that keeps a shard's size: zeroed blocks (a bad disk, a torn write) are read up to the damage; a whole
    shard of other records (two swapped) gives none; bytes after a whole shard are not read."""
    from tf_harness.data.tfrecords.reader import TFRecordRecords, shard_verdicts
    cfg, manifest, tables = _damaged_copy(converted, tmp_path)
    directory, shards = Path(cfg.tfrecord.dir), manifest["splits"]["train"]["shards"]
    record = shards[0]["bytes"] // shards[0]["count"]
    first, second, third = (directory / shard["file"] for shard in shards[:3])
    content = bytearray(first.read_bytes())
    content[5 * record + 10:7 * record] = bytes(2 * record - 10)  # the 6th record onwards
    first.write_bytes(bytes(content))
    swapped = second.read_bytes()
    second.write_bytes(third.read_bytes())
    third.write_bytes(swapped)
    fourth = directory / shards[3]["file"]
    fourth.write_bytes(fourth.read_bytes() + b"appended by an editor\n")
    with caplog.at_level(logging.WARNING, logger="tf_harness.data.tfrecords.reader"):
        verdicts = shard_verdicts(directory, shards[:5])
    assert verdicts[0] == (5, "its sha256 differs from the manifest's")
    assert verdicts[1] == verdicts[2] == (0, "its sha256 differs from the manifest's; its records are not the ones "
                                             "converted")
    assert verdicts[3] == (shards[3]["count"], "22 bytes after its recorded end")
    assert verdicts[4] == (shards[4]["count"], None)
    assert (f"TFRecord shard {fourth} has 22 bytes after its recorded end; its {shards[3]['count']} records are "
            f"read, and nothing after them") in caplog.text
    source = TFRecordRecords(task_of(cfg), tables["train"], "train", True, Settings.from_config(cfg).tfrecords())
    assert sum(1 for _ in source.records(0)) == sum(readable for readable, _ in shard_verdicts(directory, shards))


def test_a_shards_sha256_is_read_once_per_version_of_the_file(converted, tmp_path, monkeypatch):
    """The converter records the shards it wrote, so reading them hashes nothing; a file copied or touched is
    hashed once, then remembered."""
    from tf_harness.data.tfrecords import reader
    cfg, manifest, tables = converted("chest_xray", "raw")
    hashed = []
    monkeypatch.setattr(reader, "sha256", lambda path, limit=None: hashed.append(path) or layout.sha256(path, limit))
    settings = Settings.from_config(cfg).tfrecords()
    reader.TFRecordRecords(task_of(cfg), tables["train"], "train", True, settings)
    assert hashed == []
    copy, _, _ = _damaged_copy(converted, tmp_path)
    copied = Settings.from_config(copy).tfrecords()
    for _ in range(2):
        reader.TFRecordRecords(task_of(copy), tables["train"], "train", True, copied)
    assert len(hashed) == len(manifest["splits"]["train"]["shards"])
    os.utime(copied.directory / manifest["splits"]["train"]["shards"][0]["file"])
    reader.TFRecordRecords(task_of(copy), tables["train"], "train", True, copied)
    assert len(hashed) == len(manifest["splits"]["train"]["shards"]) + 1


@pytest.mark.slow  # indexes and checks the chest sample before it converts: about a minute on 2 busy cores
def test_a_signal_stops_the_conversion_at_once_leaving_the_shards_not_begun(tmp_path, monkeypatch):
    """The writers stop at their next record and the shards not begun are cancelled: the pool's block would
    otherwise write every shard, the whole conversion, before the signal could end the process."""
    import signal
    import threading
    import time

    cfg = _cfg("chest_xray", tmp_path / "shards", "encoded")
    examples, sent = writer._examples, []

    def slowly(*args):
        for record in examples(*args):
            if not sent:  # the first record of the first shard: the conversion is under way
                sent.append(time.monotonic())
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(0.2)
            yield record

    monkeypatch.setattr(writer, "_examples", slowly)
    with pytest.raises(KeyboardInterrupt):
        convert_shards(cfg)
    took = time.monotonic() - sent[0]
    assert took < 5, took  # each of the 361 records takes 0.2 s: the whole conversion would take 36 s or more
    manifest = json.loads((tmp_path / "shards" / layout.MANIFEST).read_text()) if (
        tmp_path / "shards" / layout.MANIFEST).exists() else {}
    assert not manifest.get("complete")
