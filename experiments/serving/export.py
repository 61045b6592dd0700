"""mode=export: the run's newest checkpoint as a SavedModel that TF Serving, or any TensorFlow, can load.

`<run>/export/<global_step>/` holds one signature, ``serving_default``:

- input ``image_bytes``, a string tensor of shape [None]: encoded image files, JPEG or PNG (told by their
  first bytes, whatever a file's name says; any other format fails the request with an InvalidArgument
  naming the input and the file's index, for every dataset alike); a dataset of pairs (``SPEC.paired``,
  LFW) takes ``image_bytes_a`` and ``image_bytes_b``, of one length (else an InvalidArgument naming both);
- output ``probabilities``, float32 [None, classes], one column per ``SPEC.class_names`` in that order:
  what predictions.csv holds for the same files.

Everything between the file and the probabilities is in the graph, built from the functions training
uses: the dataset's decode (``Task.decode_image``: channels forced, the format read from the bytes, the
crop and resize of ``dataset.resize`` and ``dataset.crop_fraction`` at ``pipeline.image_size``), the
evaluation-time preprocessing (``Preprocessing(..., training=False)``), the model in inference mode, and
experiments/evaluation/metrics.py's `probabilities` (a sigmoid per logit, or a softmax over classes, in float64).
Every dataset's ``load`` reads the whole image in every split: ImageNet DET's label is its largest box's
class, but the image is not cropped to that box, so a served image goes through exactly what an
evaluated one does.

An export is written into a staging folder beside its target (``export/.<step>.staging-<pid>``) and
renamed when complete, so `export/<step>/` is whole or absent. It records the checkpoint it came from in
``assets.extra/checkpoint.json`` (SavedModel's folder for files that loaders leave alone): the checkpoint's
name, global step and the sha256 of its index and data files, written before the rename. An export already
there is never rewritten: when it came from the checkpoint being exported (its record's sha256 is that
checkpoint's; one with no record, written before records were, when its weights are the checkpoint's), the
run logs that it is there and exits 0. Otherwise it is stale, the export of a checkpoint that has since been
moved away and trained again, and the run exits 1 naming it, and leaves it as it is; so it does when a
numbered folder of a later step is there, since a server loads the highest version and would serve that one,
and when a folder there holds no complete SavedModel (one copied in, emptied or cut short). A staging folder
left by a killed export is removed by the next export (the run directory's lock makes sure no live one is
writing it).

Under ``pipeline.dtype=bfloat16`` the export is not bit-exact with a CPU's predictions.csv: the loader's graph
optimizer (Grappler, on by default in TensorFlow and TF Serving; the harness turns it off on a CPU) turns
``unit_range``'s division by a constant into a product with its reciprocal, and one pixel value then rounds to
another bfloat16 number at the model's first cast; under ``float16`` a convolution's sums round in another order
at another batch size. Nothing a SavedModel holds keeps every loader's optimizer off its graph, so
docs/serving.md gives the bound of the difference per dtype, which tests/test_matrix.py asserts.
"""
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf import fingerprint_pb2, saved_model_pb2

from tf_harness.data.integrity import reading, writing
from tf_harness.experiments.run_dir import checkpoints
from tf_harness.experiments.run_dir.directory import no_checkpoint

log = logging.getLogger(__name__)

SIGNATURE = "serving_default"
OUTPUT = "probabilities"
FOLDER = "export"
_STAGING = re.compile(r"^\.\d+\.staging-\d+$")
_SHARD = re.compile(r"^variables\.data-(\d+)-of-(\d+)$")
# Where an export records its checkpoint: assets.extra/ is SavedModel's folder for files no loader reads.
RECORD = Path("assets.extra", "checkpoint.json")
# The formats the signature takes, by the first bytes of a file: JPEG's start-of-image marker (as data/images.py
# tells a JPEG) and PNG's signature.
FORMATS = {"JPEG": b"\xff\xd8", "PNG": b"\x89PNG\r\n\x1a\n"}
_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"  # the one entry of a variables index that is no variable


class DamagedExportError(checkpoints.UnrestorableError):
    """An export folder is there but holds no complete SavedModel; the run refuses before it changes anything, so
    the run's HParams status stays as it was (experiments/cli.py reads `before_start`)."""
    before_start = True


class StaleExportError(DamagedExportError):
    """An export folder is there that did not come from the checkpoint being exported (the same step's, or a later
    step's, which a server would load instead); the run refuses before it changes anything."""


def input_names(spec) -> tuple:
    """The signature's input names: one string tensor of encoded files per image of an example."""
    return ("image_bytes_a", "image_bytes_b") if spec.paired else ("image_bytes",)


def probabilities(task, logits):
    """experiments/evaluation/metrics.py's `probabilities` as graph ops: float64 math, float32 out."""
    logits = tf.cast(logits, tf.float64)
    scores = tf.nn.softmax(logits, axis=-1) if task == "multiclass" else tf.sigmoid(logits)
    return tf.cast(scores, tf.float32)


class Serving(tf.Module):
    """The model, with the dataset's decode and the evaluation-time preprocessing before it and the
    probabilities after it. `serve` is the traced signature function."""

    def __init__(self, task, preprocess, model):
        """`task`: the run's Task (its SPEC and decode settings); `preprocess`: the trainer's Preprocessing;
        `model`: the keras.Model holding the restored weights."""
        super().__init__(name="serving")
        self.model = model
        self._task, self._preprocess = task, preprocess
        spec = task.SPEC
        self._image = tf.TensorSpec([*task.decode.size, spec.channels], tf.uint8)
        signature = [tf.TensorSpec([None], tf.string, name=name) for name in input_names(spec)]
        # Traced as written, without AutoGraph: nothing here branches on a tensor in Python, and a process that
        # exports several runs (api.run) then depends on no cache of converted functions.
        self.serve = tf.function(self._pair if spec.paired else self._single, input_signature=signature,
                                 autograph=False)

    def _decode(self, name, image_bytes):
        """A batch of encoded files as uint8 [batch, height, width, channels], each decoded as `load` does; fails
        with an InvalidArgument naming input `name` and the first file that is neither a JPEG nor a PNG."""
        taken = tf.zeros_like(image_bytes, tf.bool)
        for magic in FORMATS.values():
            taken = tf.logical_or(taken, tf.equal(tf.strings.substr(image_bytes, 0, len(magic)), magic))
        # The first file not taken; the False appended keeps argmin defined for an empty request.
        first = tf.argmin(tf.cast(tf.concat([taken, [False]], 0), tf.int32), output_type=tf.int32)
        formats = " and ".join(FORMATS)
        check = tf.debugging.Assert(tf.reduce_all(taken), [tf.strings.format(
            f"{name}[{{}}] is neither a {' nor a '.join(FORMATS)} file: this model takes {formats} files", first)])
        with tf.control_dependencies([check]):
            image_bytes = tf.identity(image_bytes)
        return tf.map_fn(self._task.decode_image, image_bytes, fn_output_signature=self._image)

    def _outputs(self, features):
        spec = self._task.SPEC

        def predict():
            logits = self.model(self._preprocess(features, training=False), training=False)
            return probabilities(spec.task, logits)

        # An empty request gets an empty answer: TensorFlow's Conv2D gives a batch of 0 its input's shape (2.21).
        count = tf.shape(tf.nest.flatten(features)[0])[0]
        return {OUTPUT: tf.cond(count > 0, predict, lambda: tf.zeros([0, spec.num_outputs], tf.float32))}

    def _single(self, image_bytes):
        return self._outputs(self._decode("image_bytes", image_bytes))

    def _pair(self, image_bytes_a, image_bytes_b):
        # The model would broadcast a single photo against many: a request of pairs holds as many of each.
        sizes = tf.size(image_bytes_a), tf.size(image_bytes_b)
        check = tf.debugging.Assert(tf.equal(*sizes), [tf.strings.format(
            "image_bytes_a holds {} files and image_bytes_b {}: a request of pairs gives both inputs one file per "
            "pair", sizes)])
        with tf.control_dependencies([check]):
            image_bytes_a, image_bytes_b = tf.identity(image_bytes_a), tf.identity(image_bytes_b)
        return self._outputs((self._decode("image_bytes_a", image_bytes_a),
                              self._decode("image_bytes_b", image_bytes_b)))


def remove_staging(export_dir: Path) -> None:
    """Deletes the staging folders that killed exports left in `export_dir`, logging each; call with the lock held."""
    if not export_dir.is_dir():
        return
    for path in sorted(export_dir.iterdir()):
        if _STAGING.match(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            log.info("Removed %s, left by an interrupted export", path)


def checkpoint_sha256(prefix) -> str:
    """The sha256 of the checkpoint at `prefix` (e.g. `.../ckpt-4`): its index file and its data files, each
    as its name after the prefix, its size and its bytes, in name order; the same wherever the run directory is."""
    prefix = Path(prefix)
    digest = hashlib.sha256()
    for path in sorted([Path(f"{prefix}.index"), *prefix.parent.glob(f"{prefix.name}.data-*-of-*")]):
        digest.update(f"{path.name[len(prefix.name):]}\0{path.stat().st_size}\0".encode())
        with reading.open_file(path, "rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def source_record(prefix, step) -> dict:
    """What an export of the checkpoint at `prefix`, holding global step `step`, records of it."""
    return {"checkpoint": Path(prefix).name, "global_step": int(step), "sha256": checkpoint_sha256(prefix)}


def read_record(folder: Path) -> dict | None:
    """The record of the export in `folder`; None when it has none or one that does not read as a record."""
    try:
        record = json.loads(reading.read_text(folder / RECORD))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    keys = {"checkpoint": str, "global_step": int, "sha256": str}
    if not isinstance(record, dict) or not all(isinstance(record.get(key), kind) for key, kind in keys.items()):
        return None
    return record


def _weights(values) -> list:
    """The floating-point arrays of `values` as a sorted list of (dtype, shape, sha256 of the bytes): equal for the
    same weights in any order. Integer variables (a dropout layer's seed state) play no part in a prediction."""
    return sorted((array.dtype.str, array.shape, hashlib.sha256(array.tobytes()).hexdigest())
                  for array in (np.asarray(value) for value in values) if array.dtype.kind == "f")


def same_weights(folder: Path, model) -> bool:
    """Whether the weights of the (complete) export in `folder` are `model`'s, value for value."""
    reader = tf.train.load_checkpoint(str(folder / "variables" / "variables"))
    saved = [reader.get_tensor(name) for name in reader.get_variable_to_shape_map() if name != _OBJECT_GRAPH]
    return _weights(saved) == _weights(variable.numpy() for variable in model.variables)


def staleness(folder: Path, record: dict, model) -> str | None:
    """Why the complete export in `folder` is not one of the checkpoint `record` describes (restored into `model`),
    or None when it is: its record names another checkpoint or step; or, without a record, its weights differ."""
    found = read_record(folder)
    if found is None:
        if same_weights(folder, model):
            return None
        return f"it holds no readable {RECORD.as_posix()} and its weights are not those of {record['checkpoint']}"
    if found["global_step"] == record["global_step"] and found["sha256"] == record["sha256"]:
        return None
    return (f"it came from {found['checkpoint']} at global step {found['global_step']}, sha256 "
            f"{found['sha256'][:12]}..., and the run's {record['checkpoint']} has sha256 {record['sha256'][:12]}...")


def write(serving, target: Path, record: dict | None = None) -> None:
    """Saves `serving` to `target` through a staging folder beside it, renamed once complete; `record`, the
    checkpoint it holds (`source_record`), goes into the staging folder first."""
    staging = target.parent / f".{target.name}.staging-{os.getpid()}"
    try:
        tf.saved_model.save(serving, str(staging), signatures={SIGNATURE: serving.serve})
        if record is not None:
            (staging / RECORD).parent.mkdir(exist_ok=True)
            writing.write_text(staging / RECORD, json.dumps(record, indent=1) + "\n")
        os.rename(staging, target)  # refuses, rather than replaces, a target that appeared meanwhile
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def damage(folder: Path) -> str | None:
    """Why `folder` is not a complete export, None when it is one, checked without loading the model: its
    saved_model.pb parses (one cut short does not) and holds the signature, its variables' index opens, its
    data files, variables.data-<i>-of-<n>, are all there, and every variable reads back whole (each is read
    against its checksum, so a data file cut short or written over is found here, not by whoever loads it), and
    none of its files is a named pipe, socket or device, which a loader would wait on."""
    graph = folder / "saved_model.pb"
    if not folder.is_dir():
        return "not a folder"
    if not graph.is_file():
        return "no saved_model.pb"
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(reading.read_bytes(graph))
    except DecodeError:
        return "saved_model.pb does not parse"
    if not any(SIGNATURE in meta.signature_def for meta in saved.meta_graphs):
        return f"saved_model.pb holds no {SIGNATURE} signature"
    for path in sorted(folder.rglob("*")):
        try:
            reading.check(path)  # a loader opens every file itself (fingerprint.pb, variables), and would wait on it
        except reading.SpecialFileError as error:
            return f"{path.relative_to(folder).as_posix()} {error.strerror}"
    variables = folder / "variables"
    try:
        reader = tf.train.load_checkpoint(str(variables / "variables"))
    except (tf.errors.OpError, ValueError):
        return "variables/variables.index does not open"
    shards = [_SHARD.match(path.name) for path in variables.iterdir()]
    counts = {int(match[2]) for match in shards if match}
    found = {int(match[1]) for match in shards if match}
    if len(counts) != 1 or found != set(range(counts.pop())):
        return "a data file of variables/ is missing"
    for name in reader.get_variable_to_shape_map():
        try:
            reader.get_tensor(name)
        except (tf.errors.OpError, ValueError, IndexError) as error:  # IndexError: TensorFlow's OUT_OF_RANGE
            return f"variable {name} does not read back: {str(error).splitlines()[0]}"
    return None


def bookkeeping(folder: Path) -> list:
    """What has gone from a complete export's own records, which no loader needs: its checkpoint record, and the
    fingerprint.pb TensorFlow writes with every SavedModel (present, parsing, not blank)."""
    problems = [] if read_record(folder) else [f"holds no readable {RECORD.as_posix()}"]
    fingerprint = fingerprint_pb2.FingerprintDef()
    try:
        fingerprint.ParseFromString(reading.read_bytes(folder / "fingerprint.pb"))
    except (OSError, DecodeError):
        fingerprint.Clear()
    if not fingerprint.saved_model_checksum:
        problems.append("holds no readable fingerprint.pb")
    return problems


def export(task, trainer, run_dir, restored=None):
    """Exports a checkpoint to `<run>/export/<global_step>/`: `restored`, restored into `trainer` already
    (`checkpoint=best|<step>`), or by default the run directory's newest restorable one
    (experiments/run_dir/checkpoints.py `newest_finite`, as evaluate and predict find it), restored here. Returns
    that folder, or None on a worker that is not the chief (the chief alone writes it). An export of the same
    checkpoint already there is left as it is; one of another checkpoint, a later step's export or a folder that
    holds no complete SavedModel refuses the run before it changes anything."""
    if not run_dir.chief:
        return None
    latest = restored or run_dir.latest()
    if latest is None:
        raise no_checkpoint("export", run_dir.checkpoint_dir)
    if restored is None:
        trainer.checkpoint().restore(latest).expect_partial()
    export_dir = run_dir.model_dir / FOLDER
    target = export_dir / str(trainer.step)
    then = f"global step {trainer.step} cannot be exported while it is there: move it out of {export_dir}, then run " \
           f"mode=export again"
    record = source_record(latest, trainer.step)
    if target.exists() or target.is_symlink():
        reason = damage(target)
        if reason:
            raise DamagedExportError(f"{target} is there but is not a complete export ({reason}); {then}")
        reason = staleness(target, record, trainer.model)
        if reason:
            raise StaleExportError(f"{target} is there but was exported from another checkpoint than {latest} "
                                   f"({reason}); {then}")
    later = _later_versions(export_dir, trainer.step)
    if later:
        raise StaleExportError(f"{later[0]} is there, a later version than global step {trainer.step}: a server "
                               f"loads the highest version, so it would serve that one rather than the export of "
                               f"{latest}; move it out of {export_dir}, then run mode=export again")
    remove_staging(export_dir)
    if target.exists():
        log.info("%s is there already: global step %d was exported before; leaving it as it is", target,
                 trainer.step)
        for problem in bookkeeping(target):
            log.warning("%s %s; its weights are those of %s, so it is kept as it is", target, problem, latest)
        return target
    export_dir.mkdir(exist_ok=True)
    spec = task.SPEC
    write(Serving(task, trainer.preprocess, trainer.model), target, record)
    log.info("Exported %s (global step %d) to %s: signature %s takes %s (string [None], encoded JPEG or PNG "
             "files) and gives %s (float32 [None, %d]: %s)", latest, trainer.step, target, SIGNATURE,
             " and ".join(input_names(spec)), OUTPUT, spec.num_outputs, _class_list(spec.class_names))
    return target


def _later_versions(export_dir: Path, step) -> list:
    """The numbered folders of `export_dir` (the versions a server loads) of steps after `step`, highest first."""
    if not export_dir.is_dir():
        return []
    later = [path for path in export_dir.iterdir() if path.name.isdigit() and int(path.name) > step and path.is_dir()]
    return sorted(later, key=lambda path: int(path.name), reverse=True)


def _class_list(names) -> str:
    return ", ".join(names) if len(names) <= 16 else f"{', '.join(names[:3])}, ... {names[-1]}"
