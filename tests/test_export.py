"""mode=export: a SavedModel whose `serving_default` takes encoded image files and gives predictions.csv's
probabilities, loadable by TensorFlow alone.

The fast tests build tiny models in this process: the signature's names and shapes, its outputs against each
dataset's own `load` and the evaluation step's arithmetic on odd files (grayscale and CMYK JPEGs, a PNG named
.JPEG, RGBA and 16-bit PNGs), the formats it refuses and a request of pairs of two lengths, and the export
folder's rules: a folder that holds no complete SavedModel, or the export of another checkpoint or of a later
step, is refused. The slow ones train a tiny run per dataset (and per 16-bit dtype, LFW's default model), predict,
export, and serve predictions.csv's files from a fresh process that imports only TensorFlow.
"""
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tests.conftest import REAL, compose, require_real_fixtures, run_cli, task_of
from tests.matrix import BOUNDS, TOLERANCE
from tests.refusals import assert_names, one_naming, raises_naming
from tf_harness.data.errors import ConfigError
from tf_harness.experiments.checkpoint_modes import CheckpointModes
from tf_harness.experiments.config.settings import Settings
from tf_harness.experiments.evaluation import metrics
from tf_harness.experiments.run_dir.directory import RunDirectory
from tf_harness.experiments.serving import export
from tf_harness.experiments.training.trainer import Trainer

# A tiny model per dataset, at the smoke experiment's 32px; every decode setting differs between them.
TINY = {
    "chest_xray": ("model=semi_alexnet", "model.filters=[2,2,2,2,2]", "model.dense_units=4"),
    "lfw_pairs": ("model.widths=[2,2]", "model.embedding_size=4", "model.head_units=4"),
    "imagenet_det": ("model.filters=[2,2,2,2,2]", "model.dense_units=4"),
}


def tiny_config(dataset, *overrides):
    return compose(f"dataset={dataset}", "experiment=smoke", *TINY[dataset], *overrides)


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory):
    """Real NIH PNGs and LFW JPEGs, and files of every kind a decode must take: grayscale, CMYK and RGB JPEGs,
    a PNG named .JPEG, RGBA and 16-bit PNGs."""
    require_real_fixtures()
    folder = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (61, 83, 3), dtype=np.uint8))
    made = {"gray.jpg": (rgb.convert("L"), "JPEG"), "cmyk.jpg": (rgb.convert("CMYK"), "JPEG"),
            "rgb.jpeg": (rgb, "JPEG"), "png_named.JPEG": (rgb, "PNG"), "rgba.png": (rgb.convert("RGBA"), "PNG"),
            "sixteen.png": (Image.fromarray(rng.integers(0, 65536, (40, 50), dtype=np.uint16)), "PNG")}
    for name, (image, kind) in made.items():
        image.save(folder / name, kind)
    return ([folder / name for name in made] + sorted((REAL / "nih" / "images").glob("*.png"))[:2]
            + sorted((REAL / "lfw").glob("*.jpg")))


def tiny_trainer(cfg):
    task = task_of(cfg)
    return task, Trainer(Settings.from_config(cfg), task.SPEC, tf.distribute.get_strategy(), task.decode.size, loss=task.loss)


def export_run(task, trainer, model_dir, chief=True):
    """mode=export as a run does it (CheckpointModes): restores the newest restorable checkpoint, then exports it."""
    run_dir = RunDirectory(model_dir)
    run_dir.chief = chief
    settings = SimpleNamespace(mode="export", checkpoint="latest", split=None)
    CheckpointModes.restore(SimpleNamespace(run=SimpleNamespace(run_dir=run_dir, settings=settings, trainer=trainer,
                                                                task=task)))
    return export.export(task, trainer, run_dir)


def expected_probabilities(task, trainer, paths):
    """What predict computes for these files: the dataset's `load`, the eval step's preprocessing and model call,
    metrics.probabilities."""
    label = [0.0] * task.SPEC.num_outputs if task.SPEC.task == "multilabel" else 0
    if task.SPEC.paired:
        records = [{"path_a": str(a), "path_b": str(b), "label": label} for a, b in zip(paths, paths[::-1])]
    else:
        records = [{"path": str(path), "label": label} for path in paths]
    images = [task.load({key: tf.constant(value) for key, value in record.items()})[0] for record in records]
    features = tuple(tf.stack(part) for part in zip(*images)) if task.SPEC.paired else tf.stack(images)
    logits = trainer.model(trainer.preprocess(features, training=False), training=False)
    return metrics.probabilities(task.SPEC.task, tf.cast(logits, tf.float32).numpy())


def served_probabilities(serve, task, paths):
    contents = [Path(path).read_bytes() for path in paths]
    if task.SPEC.paired:
        feed = {"image_bytes_a": tf.constant(contents, tf.string),
                "image_bytes_b": tf.constant(contents[::-1], tf.string)}
    else:
        feed = {"image_bytes": tf.constant(contents, tf.string)}
    return serve(**feed)[export.OUTPUT].numpy()


@pytest.mark.parametrize("dataset", sorted(TINY))
def test_the_signature_decodes_files_as_load_does_and_gives_the_probabilities(dataset, odd_files, tmp_path):
    task, trainer = tiny_trainer(tiny_config(dataset))
    target = tmp_path / "1"
    export.write(export.Serving(task, trainer.preprocess, trainer.model), target)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["1"]  # the staging folder is gone
    serve = tf.saved_model.load(str(target)).signatures[export.SIGNATURE]
    inputs = serve.structured_input_signature[1]
    names = ["image_bytes_a", "image_bytes_b"] if task.SPEC.paired else ["image_bytes"]
    assert sorted(inputs) == names
    assert all(spec.dtype == tf.string and spec.shape.as_list() == [None] for spec in inputs.values())
    output = serve.structured_outputs[export.OUTPUT]
    assert output.dtype == tf.float32 and output.shape.as_list() == [None, task.SPEC.num_outputs]
    got = served_probabilities(serve, task, odd_files)
    expected = expected_probabilities(task, trainer, odd_files)
    assert got.shape == expected.shape == (len(odd_files), task.SPEC.num_outputs)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOLERANCE)
    assert served_probabilities(serve, task, []).shape == (0, task.SPEC.num_outputs)  # an empty batch


def test_an_export_is_written_once_and_a_killed_exports_staging_folder_removed(odd_files, tmp_path, caplog):
    cfg = tiny_config("imagenet_det")
    task, trainer = tiny_trainer(cfg)
    with raises_naming(ConfigError, "mode=export", tmp_path / "checkpoints"):
        export_run(task, trainer, tmp_path)
    trainer.global_step.assign(3)
    trainer.checkpoint().write(str(tmp_path / "checkpoints" / "ckpt-3"))
    trainer.global_step.assign(0)
    kernel = trainer.model.trainable_variables[0]
    saved = kernel.numpy()
    kernel.assign(tf.zeros_like(kernel))  # the export holds the checkpoint's weights, not these
    leftover = tmp_path / "export" / ".3.staging-999999"
    (leftover / "variables").mkdir(parents=True)
    with caplog.at_level(logging.INFO, logger="tf_harness.experiments.serving.export"):
        target = export_run(task, trainer, tmp_path)
    assert target == tmp_path / "export" / "3" and (target / "saved_model.pb").is_file()
    assert sorted(path.name for path in target.parent.iterdir()) == ["3"]
    assert_names(one_naming(caplog.messages, leftover), "Removed")
    np.testing.assert_array_equal(kernel.numpy(), saved)
    serve = tf.saved_model.load(str(target)).signatures[export.SIGNATURE]
    np.testing.assert_allclose(served_probabilities(serve, task, odd_files),
                               expected_probabilities(task, trainer, odd_files), rtol=0, atol=TOLERANCE)
    assert "signature serving_default takes image_bytes" in caplog.text
    before = {path: path.stat().st_mtime_ns for path in target.rglob("*")}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tf_harness.experiments.serving.export"):
        assert export_run(task, trainer, tmp_path) == target
    assert_names(one_naming(caplog.messages, target, "already"), "global step 3")
    assert {path: path.stat().st_mtime_ns for path in target.rglob("*")} == before
    assert export_run(task, trainer, tmp_path, chief=False) is None  # the chief alone writes


def flip_last_byte(path):
    content = bytearray(path.read_bytes())
    content[-1] ^= 0xFF
    path.write_bytes(bytes(content))


def test_an_export_folder_that_holds_no_complete_savedmodel_is_refused_and_left_as_it_is(tmp_path):
    """An empty export/<step>/, or one whose saved_model.pb was cut short, was logged as exported, exit 0; a
    variables data file cut short or written over at its size passed until the export was loaded."""
    import shutil
    from tf_harness.experiments.run_dir.checkpoints import UnrestorableError
    cfg = tiny_config("lfw_pairs")
    task, trainer = tiny_trainer(cfg)
    trainer.global_step.assign(2)
    trainer.checkpoint().write(str(tmp_path / "checkpoints" / "ckpt-2"))
    whole = export_run(task, trainer, tmp_path)
    pb = (whole / "saved_model.pb").read_bytes()
    data = Path("variables", "variables.data-00000-of-00001")
    read_back = r"variable \S+ does not read back: .+"  # the variable and TensorFlow's first line
    damages = [(re.escape("no saved_model.pb"), lambda target: (target / "saved_model.pb").unlink()),
               (re.escape("saved_model.pb does not parse"),
                lambda target: (target / "saved_model.pb").write_bytes(pb[:-7])),
               (re.escape("saved_model.pb holds no serving_default signature"),
                lambda target: (target / "saved_model.pb").write_bytes(b"")),
               (re.escape("variables/variables.index does not open"),
                lambda target: shutil.rmtree(target / "variables")),
               (re.escape("a data file of variables/ is missing"), lambda target: (target / data).unlink()),
               (read_back, lambda target: (target / data).write_bytes((target / data).read_bytes()[:-100])),
               (read_back, lambda target: flip_last_byte(target / data))]  # at its size: the checksum finds it
    kept = shutil.copytree(whole, tmp_path / "kept")
    target = whole
    for reason, damage in damages:
        shutil.rmtree(target)
        shutil.copytree(kept, target)
        damage(target)
        before = {path: path.read_bytes() if path.is_file() else None for path in target.rglob("*")}
        with raises_naming(UnrestorableError, f"{target} ", "global step 2", f"out of {target.parent}",
                           "mode=export") as refused:  # cli: one line, exit 1
            export_run(task, trainer, tmp_path)
        assert re.search(f"\\({reason}\\)", str(refused.value)), str(refused.value)
        assert refused.value.before_start  # it changed nothing: the run's HParams status stays
        assert {path: path.read_bytes() if path.is_file() else None for path in target.rglob("*")} == before
        assert sorted(path.name for path in target.parent.iterdir()) == ["2"]
    shutil.rmtree(target)
    target.mkdir()  # the reported case: an empty folder
    with pytest.raises(UnrestorableError, match=r"\(no saved_model.pb\)"):
        export_run(task, trainer, tmp_path)
    assert not any(target.iterdir())


def snapshot(folder):
    """Every path under `folder` with its bytes (None for a folder): what a refusal must leave as it was."""
    return {path: path.read_bytes() if path.is_file() else None for path in sorted(folder.rglob("*"))}


def test_an_export_records_its_checkpoint_and_one_of_another_checkpoint_is_refused(tmp_path, caplog):
    """The reported case: export/2 of a checkpoint that was then moved away, and step 2 trained again, was kept and
    logged as exported, exit 0, while it served the old weights."""
    from tf_harness.experiments.run_dir.checkpoints import UnrestorableError
    task, trainer = tiny_trainer(tiny_config("chest_xray"))  # its dropout layers hold integer seed states too
    checkpoints, aside = tmp_path / "checkpoints", tmp_path / "aside"
    trainer.global_step.assign(2)
    trainer.checkpoint().write(str(checkpoints / "ckpt-2"))
    target = export_run(task, trainer, tmp_path)
    record = json.loads((target / "assets.extra" / "checkpoint.json").read_text())
    assert record == {"checkpoint": "ckpt-2", "global_step": 2,
                      "sha256": export.checkpoint_sha256(checkpoints / "ckpt-2")}
    assert re.fullmatch(r"[0-9a-f]{64}", record["sha256"])
    tf.saved_model.load(str(target))  # TensorFlow loads the folder with the record in it
    copied = shutil.copytree(checkpoints, tmp_path / "copied")
    assert export.checkpoint_sha256(copied / "ckpt-2") == record["sha256"]  # the same wherever the run directory is

    # The checkpoint is moved away, as the advice for a checkpoint ahead says, and step 2 is trained again.
    aside.mkdir()
    for path in checkpoints.glob("ckpt-2.*"):
        path.rename(aside / path.name)
    kernel = trainer.model.trainable_variables[0]
    kernel.assign(kernel + 0.5)
    trainer.checkpoint().write(str(checkpoints / "ckpt-2"))
    assert export.checkpoint_sha256(checkpoints / "ckpt-2") != record["sha256"]
    then = f"global step 2 cannot be exported while it is there: move it out of {target.parent}, then run " \
           f"mode=export again"
    stale = re.escape(f"{target} is there but was exported from another checkpoint than {checkpoints / 'ckpt-2'} (")
    found = r"it came from ckpt-2 at global step 2, sha256 [0-9a-f]{12}\.\.\., and the run's ckpt-2 has sha256 " \
            r"[0-9a-f]{12}\.\.\."
    no_record = "it holds no readable assets.extra/checkpoint.json and its weights are not those of ckpt-2"
    before = snapshot(target.parent)
    for reason in (found, re.escape(no_record)):
        if reason != found:
            shutil.rmtree(target / "assets.extra")  # an export written before exports recorded their checkpoint
            before = snapshot(target.parent)
        with pytest.raises(UnrestorableError) as refused:  # cli: one line, exit 1
            export_run(task, trainer, tmp_path)
        assert re.fullmatch(stale + reason + re.escape(f"); {then}"), str(refused.value)), str(refused.value)
        assert refused.value.before_start  # it changed nothing: the run's HParams status stays
        assert snapshot(target.parent) == before

    # The first checkpoint back: the export without a record holds its weights, so it is that checkpoint's export.
    for path in checkpoints.glob("ckpt-2.*"):
        path.unlink()
    for path in aside.iterdir():
        path.rename(checkpoints / path.name)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tf_harness.experiments.serving.export"):
        assert export_run(task, trainer, tmp_path) == target
    assert_names(one_naming(caplog.messages, target, "already"), "global step 2")
    assert snapshot(target.parent) == before

    # A later version, which a server would load rather than this one, from a checkpoint no longer in the run.
    later = shutil.copytree(target, target.parent / "5")
    shutil.copytree(target, target.parent / "5.old")  # not a version: a server loads numbered folders alone
    before = snapshot(target.parent)
    with raises_naming(UnrestorableError, f"{later} ", "a later version", "global step 2", checkpoints / "ckpt-2",
                       f"out of {target.parent}", "mode=export") as refused:
        export_run(task, trainer, tmp_path)
    assert refused.value.before_start
    assert snapshot(target.parent) == before


@pytest.mark.parametrize("damage", ["delete", "empty", "garble"])
def test_an_export_whose_own_records_were_damaged_is_kept_with_a_warning_for_each(tmp_path, caplog, damage):
    """The damage matrix's case: an export whose checkpoint record or fingerprint.pb was deleted, emptied or garbled
    was kept without a word."""
    task, trainer = tiny_trainer(tiny_config("lfw_pairs"))
    trainer.global_step.assign(2)
    trainer.checkpoint().write(str(tmp_path / "checkpoints" / "ckpt-2"))
    target = export_run(task, trainer, tmp_path)
    for path in (target / "assets.extra" / "checkpoint.json", target / "fingerprint.pb"):
        if damage == "delete":
            path.unlink()
        else:
            path.write_bytes(b"" if damage == "empty" else bytes(range(256)) * 4)
    before = snapshot(target.parent)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tf_harness.experiments.serving.export"):
        assert export_run(task, trainer, tmp_path) == target
    warnings = [record.getMessage() for record in caplog.records
                if record.levelno == logging.WARNING and record.name == "tf_harness.experiments.serving.export"]
    assert len(warnings) == 2, warnings
    for warning, damaged in zip(warnings, ("assets.extra/checkpoint.json", "fingerprint.pb"), strict=True):
        assert_names(warning, f"{target} ", damaged, tmp_path / "checkpoints" / "ckpt-2", "kept")
    assert snapshot(target.parent) == before


@pytest.fixture(scope="module", params=sorted(TINY))
def loaded(request, tmp_path_factory):
    """(task, serving_default) of a tiny export of each dataset, loaded from disk."""
    task, trainer = tiny_trainer(tiny_config(request.param))
    target = tmp_path_factory.mktemp(request.param) / "1"
    export.write(export.Serving(task, trainer.preprocess, trainer.model), target)
    return task, tf.saved_model.load(str(target)).signatures[export.SIGNATURE]


def test_every_dataset_takes_jpeg_and_png_and_refuses_any_other_format_naming_the_file(loaded, tmp_path):
    """LFW and DET took GIF, BMP and WebP, chest X-rays refused them with a decode error; the signature, the docs and
    README say JPEG or PNG."""
    task, serve = loaded
    rgb = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    encoded = {}
    for kind in ("JPEG", "PNG", "GIF", "BMP", "WEBP"):
        rgb.save(tmp_path / f"image.{kind.lower()}", kind)
        encoded[kind] = (tmp_path / f"image.{kind.lower()}").read_bytes()
    names = export.input_names(task.SPEC)

    def request(files):
        return {name: tf.constant(files if name == names[-1] else [encoded["JPEG"]] * len(files), tf.string)
                for name in names}

    served = serve(**request([encoded["PNG"], encoded["JPEG"]]))[export.OUTPUT]
    assert served.shape == (2, task.SPEC.num_outputs)
    for kind in ("GIF", "BMP", "WEBP"):
        with raises_naming(tf.errors.InvalidArgumentError, f"{names[-1]}[1] ", "JPEG", "PNG"):
            serve(**request([encoded["PNG"], encoded[kind], encoded["JPEG"]]))


@pytest.mark.parametrize("loaded", ["lfw_pairs"], indirect=True)
def test_a_request_of_pairs_whose_two_inputs_differ_in_length_is_refused(loaded):
    """image_bytes_a of 2 files and image_bytes_b of 1 were broadcast: two probabilities for one photo."""
    _, serve = loaded
    photo = sorted((REAL / "lfw").glob("*.jpg"))[0].read_bytes()
    for a, b in ((2, 1), (1, 2), (0, 1)):
        with raises_naming(tf.errors.InvalidArgumentError, f"image_bytes_a holds {a} ", f"image_bytes_b {b}:"):
            serve(image_bytes_a=tf.constant([photo] * a, tf.string), image_bytes_b=tf.constant([photo] * b, tf.string))
    assert serve(image_bytes_a=tf.constant([photo] * 2), image_bytes_b=tf.constant([photo] * 2))[export.OUTPUT].shape \
        == (2, 1)


# Run in a fresh interpreter with no tf_harness import: serves predictions.csv's files through the export.
SERVE = """
import csv, json, sys
import numpy as np
import tensorflow as tf

export, predictions = sys.argv[1], sys.argv[2]
serve = tf.saved_model.load(export).signatures["serving_default"]
with open(predictions, newline="") as f:
    rows = list(csv.DictReader(f))
columns = {"image_bytes": "path", "image_bytes_a": "path_a", "image_bytes_b": "path_b"}
inputs = sorted(serve.structured_input_signature[1])
described = ("global_step", "split", "fold", "patient_id")  # what predictions.csv says of each row besides scores
classes = [c for c in rows[0] if c not in columns.values() and c not in described and not c.startswith("label")]
expected = np.array([[float(row[c]) for c in classes] for row in rows])
kept = ~np.isnan(expected).any(axis=1)  # a file predict could not decode has no probabilities
feed = {}
for name in inputs:
    feed[name] = tf.constant([open(row[columns[name]], "rb").read() for row, keep in zip(rows, kept) if keep])
got = serve(**feed)["probabilities"].numpy()
print(json.dumps({"inputs": inputs, "outputs": sorted(serve.structured_outputs), "shape": list(got.shape),
                  "classes": len(classes), "rows": int(kept.sum()),
                  "max_abs_diff": float(np.abs(got - expected[kept]).max()),
                  "harness_imported": any(name.startswith("tf_harness") for name in sys.modules)}))
"""


def _plain_env():
    return {**{key: value for key, value in os.environ.items() if key != "PYTHONPATH"}, "TF_CPP_MIN_LOG_LEVEL": "2"}


def serve_in_fresh_process(target, predictions, cwd):
    result = subprocess.run([sys.executable, "-c", SERVE, str(target), str(predictions)], cwd=cwd, capture_output=True,
                            text=True, timeout=300, env=_plain_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def saved_model_cli(target):
    cli = Path(sys.executable).with_name("saved_model_cli")
    result = subprocess.run([str(cli), "show", "--dir", str(target), "--all"], capture_output=True, text=True,
                            timeout=300, env=_plain_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("dataset", sorted(TINY))
def test_an_exported_run_serves_predictions_csv_from_a_fresh_process(dataset, tmp_path):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    trained = run_cli(f"dataset={dataset}", "experiment=smoke", *TINY[dataset], "mode=train",
                      f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    for mode in ("predict", "export"):
        result = run_cli(f"hydra.run.dir={run_dir}", f"mode={mode}")
        assert result.returncode == 0, result.stderr[-3000:]
    target = run_dir / "export" / "4"
    assert sorted(path.name for path in target.parent.iterdir()) == ["4"]
    served = serve_in_fresh_process(target, run_dir / "predictions.csv", tmp_path)
    names = ["image_bytes_a", "image_bytes_b"] if dataset == "lfw_pairs" else ["image_bytes"]
    assert served["inputs"] == names and served["outputs"] == ["probabilities"]
    assert not served["harness_imported"]
    assert served["rows"] > 0 and served["shape"] == [served["rows"], served["classes"]]
    print(f"{dataset}: max abs difference {served['max_abs_diff']:.3g} over {served['rows']} rows, "
          f"{time.monotonic() - started:.0f} s")
    assert served["max_abs_diff"] <= TOLERANCE
    shown = saved_model_cli(target)
    signature = shown.split("signature_def['serving_default']:", 1)[1]
    for name in names:
        assert f"inputs['{name}'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" in signature
    assert f"outputs['probabilities'] tensor_info:\n        dtype: DT_FLOAT\n        shape: (-1, {served['classes']})" \
        in signature


# docs/serving.md's bounds per pipeline.dtype (tests/matrix.py), which the combination matrix holds every cell to.
# The 16-bit runs: LFW's default model, as reported (its bfloat16 export moved most), and the other datasets' tiny ones.
SIXTEEN_BIT = {"lfw_pairs": (), "chest_xray": TINY["chest_xray"], "imagenet_det": TINY["imagenet_det"]}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("dataset", sorted(SIXTEEN_BIT))
def test_a_16_bit_export_serves_predictions_csv_within_its_dtypes_bound(dataset, dtype, tmp_path):
    """A bfloat16 LFW export, loaded with TensorFlow's defaults, differed from predictions.csv by more than the 1e-4
    the docs gave: 40 steps at learning rate 0.003 move the weights far enough for the loader's rounding to show."""
    run_dir = tmp_path / "run"
    trained = run_cli(f"dataset={dataset}", "experiment=smoke", *SIXTEEN_BIT[dataset], f"pipeline.dtype={dtype}",
                      "trainer.train_steps=40", "trainer.learning_rate=0.003", "mode=train", f"hydra.run.dir={run_dir}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    for mode in ("predict", "export"):
        result = run_cli(f"hydra.run.dir={run_dir}", f"mode={mode}")
        assert result.returncode == 0, result.stderr[-3000:]
    served = serve_in_fresh_process(run_dir / "export" / "40", run_dir / "predictions.csv", tmp_path)
    assert not served["harness_imported"] and served["rows"] > 0
    print(f"{dataset} {dtype}: max abs difference {served['max_abs_diff']:.3g} over {served['rows']} rows")
    assert served["max_abs_diff"] <= BOUNDS[dtype]
