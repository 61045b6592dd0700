"""Class activation heatmaps: where in an image a model's score for a class comes from.

The heatmap of (image, class) is LayerCAM's (Jiang et al. 2021, a Grad-CAM that weighs each position of the map
by its own positive gradient rather than each channel by its mean one): the feature map of `feature_layer`, each
activation weighted by the positive gradient of the class's logit with respect to it, summed over channels, scaled
to [0, 1] and resized to the image. The map is the model's last one of at least MIN_CELLS cells across: a
network's last maps hold a few cells each a large part of the image, too coarse to say where in it a finding
lies, and Grad-CAM's channel means blur a finer map, which LayerCAM's per-position weights keep sharp.

`mode=predict heatmaps=N` writes overlays of the N (example, class) pairs of the highest scores
(`write_top`), and removes the overlays an earlier index listed that the new one does not, so that the folder holds
what its index lists; each evaluation shows a fixed few validation images' overlays in TensorBoard
(`ValidationHeatmaps`).
Datasets of single images only: experiments/config/schema.py refuses heatmaps for pairs.
"""
import logging
import re
from pathlib import Path

import keras
import matplotlib
import numpy as np
import pandas as pd
import tensorflow as tf
from PIL import Image

from tf_harness.data.errors import ConfigError
from tf_harness.data.integrity import reading, resources, unreadable
from tf_harness.data.integrity.writing import replacing

log = logging.getLogger(__name__)

FOLDER = "heatmaps"
INDEX = "index.csv"  # heatmaps/index.csv: one row per overlay written
SHOWN = 3  # validation examples whose heatmaps each evaluation shows
MIN_CELLS = 16  # across the shorter side of the map the heatmap reads, where the model has one that fine
OPACITY = 0.45  # of the heatmap's colours over the image
# Layers that only pool, pad or crop a map: a padded map's cells no longer line up with the image's.
_NOT_READ = (keras.layers.MaxPooling2D, keras.layers.AveragePooling2D, keras.layers.ZeroPadding2D,
             keras.layers.Cropping2D)


def feature_layer(model) -> keras.layers.Layer:
    """The model's last layer whose spatial output (batch, height, width, channels) is at least MIN_CELLS cells
    across, pools, paddings and crops left out; the finest spatial layer when none is that fine. Raises ValueError
    when the model has no spatial layer at its top level after its last nested model (a backbone nested as one
    layer) or its input."""
    spatial = []
    for layer in reversed(model.layers):
        if isinstance(layer, (keras.Model, keras.layers.InputLayer)):
            break
        output = getattr(layer, "output", None)
        if not isinstance(layer, _NOT_READ) and output is not None and len(output.shape) == 4:
            if min(output.shape[1:3]) >= MIN_CELLS:
                return layer
            spatial.append(layer)
    if not spatial:
        raise ValueError(f"model {model.name} has no layer with a spatial output at its top level for heatmaps")
    return max(spatial, key=lambda layer: min(layer.output.shape[1:3]))  # the last of the finest


class LayerCam:
    """The class activation heatmaps (LayerCAM) of one Keras model (float images in, logits out)."""

    def __init__(self, model):
        self.layer = feature_layer(model)
        self.model = keras.Model(model.inputs, [self.layer.output, model.output])

    def __call__(self, images, classes) -> np.ndarray:
        """Heatmaps [batch, height, width] in [0, 1] of each image of the float batch `images` (as the model takes
        them) for its class in `classes`; all zeros where no feature raises the class's logit."""
        images = tf.convert_to_tensor(images, tf.float32)
        with tf.GradientTape() as tape:
            maps, logits = self.model(images, training=False)
            scores = tf.gather(tf.cast(logits, tf.float32), tf.constant(classes, tf.int32), batch_dims=1)
        # The gradient is taken at the map the logits were computed from, in the compute dtype (a float16 map's
        # float32 cast is not on the path to the logits), and only then cast.
        gradients = tf.cast(tape.gradient(scores, maps), tf.float32)
        maps = tf.cast(maps, tf.float32)
        cams = tf.nn.relu(tf.reduce_sum(maps * tf.nn.relu(gradients), axis=-1, keepdims=True))
        cams = cams / tf.maximum(tf.reduce_max(cams, axis=[1, 2, 3], keepdims=True), 1e-12)
        return tf.image.resize(cams, tf.shape(images)[1:3])[..., 0].numpy()


def overlay(image, heatmap) -> np.ndarray:
    """uint8 RGB [height, width, 3]: `image` (uint8, gray or RGB) under the heatmap's colours (matplotlib's jet)."""
    image = np.asarray(image, np.float32)
    rgb = np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image[..., :3]
    colours = matplotlib.colormaps["jet"](np.asarray(heatmap))[..., :3] * 255
    return np.clip((1 - OPACITY) * rgb + OPACITY * colours, 0, 255).astype(np.uint8)


def _readable(task, paths) -> tuple:
    """(the positions in `paths` of the images that decode, those uint8 images stacked, decoded and resized as the
    pipeline does; None when none does). A file that does not decode is left out with a log line: the pipeline's
    guard reports it (data/integrity/unreadable.py)."""
    kept, images = [], []
    for position, path in enumerate(paths):
        try:
            images.append(task.read_image(tf.constant(str(path))).numpy())
        except tf.errors.OpError as error:
            resources.raise_if_exhausted(error, f"decoding {path} for its heatmap")
            log.info("No heatmap of %s: it does not decode (%s)", path, unreadable.decode_message(error))
            continue
        kept.append(position)
    return kept, np.stack(images) if images else None


def _name(text) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def top_pairs(predictions, class_names, count) -> list:
    """The `count` (row, class index) pairs of the highest scores in a predictions.csv table; rows without a
    prediction (NaN) left out."""
    scores = predictions[list(class_names)].to_numpy(np.float64)
    scores = np.where(np.isnan(scores), -np.inf, scores)
    order = np.argsort(-scores, axis=None, kind="stable")[:count]
    return [divmod(int(flat), len(class_names)) for flat in order if np.isfinite(scores.flat[flat])]


def write_top(task, trainer, predictions, count, model_dir, batch_size=16) -> Path:
    """Writes ``heatmaps/<image>_<class>.png`` for the `count` (example, class) pairs of the highest scores in
    `predictions` (predictions.csv's table), and ``heatmaps/index.csv``: each overlay's image path, class, score
    and the heatmap's peak (row, column) in the model's input pixels. Returns the folder."""
    folder = Path(model_dir) / FOLDER
    folder.mkdir(exist_ok=True)
    names = list(task.SPEC.class_names)
    pairs = top_pairs(predictions, names, count)
    try:
        cam, rows = LayerCam(trainer.model), []
    except ValueError as error:
        raise ConfigError(f"heatmaps={count}: {error}") from None
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        paths = [predictions.path.iloc[row] for row, _ in chunk]
        kept, images = _readable(task, paths)
        chunk, paths = [chunk[i] for i in kept], [paths[i] for i in kept]
        if not kept:
            continue
        heatmaps = cam(trainer.preprocess(images, training=False), [k for _, k in chunk])
        for (row, k), path, image, heatmap in zip(chunk, paths, images, heatmaps):
            file = folder / f"{_name(Path(path).stem)}_{_name(names[k])}.png"
            with replacing(file, "wb") as f:
                Image.fromarray(overlay(image, heatmap)).save(f, format="PNG")
            peak = np.unravel_index(int(np.argmax(heatmap)), heatmap.shape)
            rows.append({"file": file.name, "path": path, "class": names[k],
                         "score": float(predictions[names[k]].iloc[row]), "peak_row": int(peak[0]),
                         "peak_column": int(peak[1]), "height": heatmap.shape[0], "width": heatmap.shape[1]})
    stale = _listed(folder / INDEX) - {row["file"] for row in rows}
    with replacing(folder / INDEX) as f:
        pd.DataFrame(rows, columns=["file", "path", "class", "score", "peak_row", "peak_column", "height",
                                    "width"]).to_csv(f, index=False)
    for name in stale:  # an earlier predict's overlays that the new index does not list
        (folder / name).unlink(missing_ok=True)
    shape = cam.layer.output.shape
    log.info("heatmaps=%d: wrote %d heatmap overlay(s) of the highest scores, from layer %s's %dx%d map, to %s%s",
             count, len(rows), cam.layer.name, shape[1], shape[2], folder,
             f", and removed {len(stale)} an earlier index listed" if stale else "")
    return folder


def _listed(index) -> set:
    """The overlay files an earlier heatmaps/index.csv lists (plain names in its folder); none when there is no
    index, and none, with a warning, when it cannot be read: then no file is removed."""
    try:
        names = reading.read_csv(index, usecols=["file"], dtype=str)["file"].dropna()
    except FileNotFoundError:
        return set()
    except OSError as error:
        log.warning("%s cannot be read (%s); the overlays it listed are left as they are", index,
                    error.strerror or type(error).__name__)
        return set()
    except reading.DamagedTableError as error:
        log.warning("%s; the overlays it listed are left as they are", error)
        return set()
    return {name for name in names if name == Path(name).name and name.endswith(".png")}


class ValidationHeatmaps:
    """The heatmaps an evaluation shows in TensorBoard: the first SHOWN validation examples, those whose images
    decode, each for the class the model scores highest then; their images are read once."""

    def __init__(self, task, trainer, table):
        self.task, self.trainer = task, trainer
        self.paths = table.path.tolist()[:SHOWN] if "path" in table else []
        self._images = self._cam = None

    def overlays(self):
        """(uint8 overlays [n, height, width, 3], a line naming each one's class), or None when there is none."""
        if not self.paths:
            return None
        if self._images is None:
            try:
                self._cam = LayerCam(self.trainer.model)
            except ValueError as error:
                log.info("No heatmaps in TensorBoard: %s", error)
                self.paths = []
                return None
            kept, self._images = _readable(self.task, self.paths)
            self.paths = [self.paths[i] for i in kept]
            if not kept:
                return None
        features = self.trainer.preprocess(self._images, training=False)
        logits = self.trainer.model(features, training=False)
        classes = np.argmax(np.asarray(logits), axis=-1)
        heatmaps = self._cam(features, classes)
        names = self.task.SPEC.class_names
        shown = "; ".join(f"{i + 1}: {Path(path).name}, {names[k]}" for i, (path, k) in
                          enumerate(zip(self.paths, classes)))
        return np.stack([overlay(image, heatmap) for image, heatmap in zip(self._images, heatmaps)]), shown
