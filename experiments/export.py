"""mode=export: the run's newest checkpoint as a SavedModel that TF Serving, or any TensorFlow, can load.

`<run>/export/<global_step>/` holds one signature, ``serving_default``:

- input ``image_bytes``, a string tensor of shape [None]: encoded image files (JPEG or PNG, sniffed from
  the bytes); a dataset of pairs (``SPEC.paired``, LFW) takes ``image_bytes_a`` and ``image_bytes_b``;
- output ``probabilities``, float32 [None, classes], one column per ``SPEC.class_names`` in that order:
  what predictions.csv holds for the same files.

Everything between the file and the probabilities is in the graph, built from the functions training
uses: the dataset's decode (``Task.decode_image``: channels forced, the format read from the bytes, the
crop and resize of ``dataset.resize`` and ``dataset.crop_fraction`` at ``pipeline.image_size``), the
evaluation-time preprocessing (``Preprocessing(..., training=False)``), the model in inference mode, and
experiments/metrics.py's `probabilities` (a sigmoid per logit, or a softmax over classes, in float64).
Every dataset's ``load`` reads the whole image in every split: ImageNet DET's label is its largest box's
class, but the image is not cropped to that box, so a served image goes through exactly what an
evaluated one does.

An export is written into a staging folder beside its target (``export/.<step>.staging-<pid>``) and
renamed when complete, so `export/<step>/` is whole or absent. An export already there is never
rewritten: the run logs that it is there and exits 0. A folder there that holds no complete SavedModel (one
copied in, emptied or cut short) is not an export: the run exits 1 naming it, and leaves it as it is. A staging
folder left by a killed export is removed by the next export (the run directory's lock makes sure no live one is
writing it).
"""
import logging
import os
import re
import shutil
from pathlib import Path

import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf import saved_model_pb2

from tf_harness.experiments.run_dir import checkpoints
from tf_harness.experiments.run_dir.directory import no_checkpoint

log = logging.getLogger(__name__)

SIGNATURE = "serving_default"
OUTPUT = "probabilities"
FOLDER = "export"
_STAGING = re.compile(r"^\.\d+\.staging-\d+$")
_SHARD = re.compile(r"^variables\.data-(\d+)-of-(\d+)$")


class DamagedExportError(checkpoints.UnrestorableError):
    """An export folder is there but holds no complete SavedModel; the run refuses before it changes anything, so
    the run's HParams status stays as it was (experiments/cli.py reads `before_start`)."""
    before_start = True


def input_names(spec) -> tuple:
    """The signature's input names: one string tensor of encoded files per image of an example."""
    return ("image_bytes_a", "image_bytes_b") if spec.paired else ("image_bytes",)


def probabilities(task, logits):
    """experiments/metrics.py's `probabilities` as graph ops: float64 math, float32 out."""
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
        self.serve = tf.function(self._pair if spec.paired else self._single, input_signature=signature)

    def _decode(self, image_bytes):
        """A batch of encoded files as uint8 [batch, height, width, channels], each decoded as `load` does."""
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
        return self._outputs(self._decode(image_bytes))

    def _pair(self, image_bytes_a, image_bytes_b):
        return self._outputs((self._decode(image_bytes_a), self._decode(image_bytes_b)))


def remove_staging(export_dir: Path) -> None:
    """Deletes the staging folders that killed exports left in `export_dir`, logging each; call with the lock held."""
    if not export_dir.is_dir():
        return
    for path in sorted(export_dir.iterdir()):
        if _STAGING.match(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            log.info("Removed %s, left by an interrupted export", path)


def write(serving, target: Path) -> None:
    """Saves `serving` to `target` through a staging folder beside it, renamed once complete."""
    staging = target.parent / f".{target.name}.staging-{os.getpid()}"
    try:
        tf.saved_model.save(serving, str(staging), signatures={SIGNATURE: serving.serve})
        os.rename(staging, target)  # refuses, rather than replaces, a target that appeared meanwhile
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def damage(folder: Path) -> str | None:
    """Why `folder` is not a complete export, None when it is one, checked without loading the model: its
    saved_model.pb parses (one cut short does not) and holds the signature, its variables' index opens, its
    data files, variables.data-<i>-of-<n>, are all there, and every variable reads back whole (each is read
    against its checksum, so a data file cut short or written over is found here, not by whoever loads it)."""
    graph = folder / "saved_model.pb"
    if not folder.is_dir():
        return "not a folder"
    if not graph.is_file():
        return "no saved_model.pb"
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(graph.read_bytes())
    except DecodeError:
        return "saved_model.pb does not parse"
    if not any(SIGNATURE in meta.signature_def for meta in saved.meta_graphs):
        return f"saved_model.pb holds no {SIGNATURE} signature"
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


def export(task, trainer, run_dir, restored=None):
    """Exports a checkpoint to `<run>/export/<global_step>/`: `restored`, restored into `trainer` already
    (`checkpoint=best|<step>`), or by default the run directory's newest restorable one
    (experiments/run_dir/checkpoints.py `newest_finite`, as evaluate and predict find it), restored here. Returns
    that folder, or None on a worker that is not the chief (the chief alone writes it). An export already there is
    left as it is."""
    if not run_dir.chief:
        return None
    latest = restored or run_dir.latest()
    if latest is None:
        raise no_checkpoint("export", run_dir.checkpoint_dir)
    if restored is None:
        trainer.checkpoint().restore(latest).expect_partial()
    export_dir = run_dir.model_dir / FOLDER
    target = export_dir / str(trainer.step)
    if target.exists() or target.is_symlink():
        reason = damage(target)
        if reason:
            raise DamagedExportError(f"{target} is there but is not a complete export ({reason}); global step "
                                     f"{trainer.step} cannot be exported while it is there: move it out of "
                                     f"{export_dir}, then run mode=export again")
    remove_staging(export_dir)
    if target.exists():
        log.info("%s is there already: global step %d was exported before; leaving it as it is", target,
                 trainer.step)
        return target
    export_dir.mkdir(exist_ok=True)
    spec = task.SPEC
    write(Serving(task, trainer.preprocess, trainer.model), target)
    log.info("Exported %s (global step %d) to %s: signature %s takes %s (string [None], encoded JPEG or PNG "
             "files) and gives %s (float32 [None, %d]: %s)", latest, trainer.step, target, SIGNATURE,
             " and ".join(input_names(spec)), OUTPUT, spec.num_outputs, _class_list(spec.class_names))
    return target


def _class_list(names) -> str:
    return ", ".join(names) if len(names) <= 16 else f"{', '.join(names[:3])}, ... {names[-1]}"
