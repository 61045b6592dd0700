"""TFRecord shards: the converter (`python -m tf_harness.data.tfrecords`), the reader, and an independent reader's view."""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from omegaconf import OmegaConf

from tf_harness.data import TASKS
from tf_harness.data.errors import ConfigError
from tf_harness.data.sources import TableRecords
from tf_harness.data.tfrecords import layout, writer
from tests.conftest import PROJECT, compose, convert_shards, make_input, read_shards, tables_of, task_of

SMALL = ("pipeline.image_size=32", "pipeline.batch_size=8")
ENCODINGS = ("encoded", "raw")


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
    settings = layout.TFRecordSettings.from_config(_override(cfg, "tfrecord.min_shards_per_worker=4"))
    from tf_harness.experiments.strategies import workers
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
    with pytest.raises(ConfigError, match="10 train shards cannot be split across 11 workers"):
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
    with pytest.raises(ConfigError, match="did not finish; run `python -m tf_harness.data.tfrecords dataset=chest_xray`"):
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
    tables = tables_of(cfg)
    # The reader takes its file list from the manifest, never from the folder.
    assert sum(1 for _ in read_shards(cfg, "validation", False, 0, tables["validation"])) == len(
        tables["validation"])
    before = {path: os.stat(path) for path in shards}

    again = convert_shards(cfg)
    assert again == manifest and _sha256(damaged) == manifest["splits"]["train"]["shards"][3]["sha256"]
    rewritten = [path for path in shards if os.stat(path).st_ino != before[path].st_ino]
    assert rewritten == [damaged]
    assert not stray.exists()


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
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("config error")]
    assert errors == ["config error: tfrecord.encoding=png is not one of encoded|raw"], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# The reader


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("dataset", sorted(TASKS))
def test_reader_gives_what_the_file_pipeline_gives(converted, dataset, encoding):
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

    files_cfg = compose(f"dataset={dataset}", *SMALL)
    for training, split in ((True, "train"), (False, "validation")):
        from_files = make_input(files_cfg, tables[split], training, split)
        from_shards = make_input(_override(cfg, "pipeline.source=tfrecord"), tables[split], training, split)
        assert from_shards.element_spec == from_files.element_spec
        next(iter(from_shards))


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
    iterator = iter(make_input(cfg, tables["train"], True, "train"))
    for _ in range(10):
        next(iterator)
    saved = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt"))
    expected = [next(iterator) for _ in range(3)]
    restored = iter(make_input(cfg, tables["train"], True, "train"))
    tf.train.Checkpoint(iterator=restored).restore(saved)
    for batch in expected:
        for a, b in zip(tf.nest.flatten(batch), tf.nest.flatten(next(restored)), strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_raw_shards_at_another_size_are_a_config_error(converted):
    cfg, _, _ = converted("chest_xray", "raw")
    other = _override(cfg, "pipeline.image_size=48")
    with pytest.raises(ConfigError, match=r"pipeline.image_size=48, but the raw shards .* hold 32-pixel images"):
        read_shards(other, "validation", False, 0)


def test_shards_of_another_encoding_or_none_at_all_are_config_errors(converted, tmp_path):
    cfg, _, tables = converted("chest_xray", "encoded")
    raw = _override(cfg, "tfrecord.encoding=raw")
    with pytest.raises(ConfigError, match="tfrecord.encoding=raw, but .* holds encoded shards"):
        read_shards(raw, "validation", False, 0)
    empty = _override(cfg, f"tfrecord.dir={tmp_path}", "pipeline.source=tfrecord")
    with pytest.raises(ConfigError, match="run `python -m tf_harness.data.tfrecords dataset=chest_xray` first"):
        make_input(empty, tables["validation"], False, "validation")
    with pytest.raises(ConfigError, match="do not match the dataset's validation split"):
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
