"""ResNet-v2 (pre-activation ResNet, He et al. 2016) from keras.applications, from scratch or pretrained.

``model.pretrained``: null builds the backbone from scratch (``weights=None``) on the dataset's channels;
``imagenet`` loads Keras's ImageNet weights (``weights="imagenet"``: downloaded once into Keras's cache,
``~/.keras/models/`` or ``$KERAS_HOME/models/``); a path loads that ``.weights.h5`` (Keras 3) or ``.h5`` file into
the backbone. Pretrained weights expect the channels they were trained on, three for ImageNet: grayscale images
(chest X-rays) are then repeated to three channels by a layer before the backbone. Their inputs are scaled to
[-1, 1] (keras.applications.resnet_v2.preprocess_input), which is what ``dataset.normalize=unit_range`` gives.
"""
import os
import re
import warnings

import keras
import numpy as np

from tf_harness.data.errors import ConfigError
from tf_harness.data.spec import DatasetSpec
from tf_harness.models import RESNET_V2

# What an example is, and the model.* keys build reads: declared once, in models/__init__.py.
INPUTS, OPTIONS = RESNET_V2.inputs, RESNET_V2.options

_APPLICATIONS = {
    "resnet_v2_50": keras.applications.ResNet50V2,
    "resnet_v2_101": keras.applications.ResNet101V2,
    "resnet_v2_152": keras.applications.ResNet152V2,
}
# keras.applications' names of the ImageNet weights files (without the top), and where Keras downloads them from.
_IMAGENET_FILES = {name: f"{name.replace('resnet_v2_', 'resnet')}v2_weights_tf_dim_ordering_tf_kernels_notop.h5"
                   for name in _APPLICATIONS}
_IMAGENET_URL = "https://storage.googleapis.com/tensorflow/keras-applications/resnet/"


def build(model_settings, spec: DatasetSpec, image_size) -> keras.Model:
    """ResNet-v2 on `spec.channels`-channel images, with one logit per class.

    Inputs are expected in [-1, 1], as the keras.applications ResNet-v2 models are.
    """
    height, width = image_size
    pretrained = model_settings.pretrained
    if pretrained is None:
        backbone = _APPLICATIONS[model_settings.name](
            include_top=False, weights=None, input_shape=(height, width, spec.channels), pooling="avg")
        images, features = backbone.input, backbone.output
    else:
        channels = 3 if pretrained == "imagenet" else weights_channels(pretrained)
        if channels != spec.channels and (channels, spec.channels) != (3, 1):
            raise ConfigError(f"model.pretrained={pretrained} holds weights for {channels}-channel images and the "
                              f"dataset's have {spec.channels}")
        backbone = _pretrained(model_settings.name, pretrained, (height, width, channels))
        images = keras.Input((height, width, spec.channels), name="image")
        # Grayscale to the three channels the weights expect, as an RGB copy of the image would give them.
        inputs = images if channels == spec.channels else keras.layers.Concatenate(name="gray_to_rgb")([images] * 3)
        features = backbone(inputs)
    # keras.applications fixes batch-norm momentum at 0.99; its moving statistics then need
    # several hundred steps to settle, and evaluation of a short run sees the initial ones.
    for layer in backbone.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = model_settings.batch_norm_momentum
    # float32 logits keep the loss stable under mixed precision.
    logits = keras.layers.Dense(spec.num_outputs, dtype="float32", name="logits")(features)
    return keras.Model(images, logits, name=model_settings.name)


def weights_channels(path) -> int:
    """The input channels of the weights file at `path`: its stem convolution's kernel, ResNet's one 7x7 kernel, is
    [7, 7, channels, 64]. Found by shape, since a Keras 3 .weights.h5 file names its layers by their class
    (``layers/conv2d/vars/0``) and a legacy .h5 file by their own names (``conv1_conv/conv1_conv/kernel:0``).
    3 when the file holds no such kernel (loading it then says what does not fit). Raises ConfigError when the
    file is no HDF5 file, or is cut short."""
    import h5py  # Keras' own dependency for .h5 files

    found = []

    def visit(name, item):
        if isinstance(item, h5py.Dataset) and len(item.shape) == 4 and tuple(item.shape[:2]) == (7, 7):
            found.append(item.shape[2])

    try:
        with h5py.File(os.path.expanduser(path), "r") as file:
            file.visititems(visit)
    except OSError as error:
        raise ConfigError(f"model.pretrained={path} {_unreadable(error)}") from None
    return found[0] if found else 3


def _unreadable(error) -> str:
    """What h5py's error opening a weights file means, for the one line that names the file."""
    text = " ".join(str(error).split())
    cut = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", text)
    if cut:
        return (f"is cut short ({cut[1]} of its {cut[2]} bytes): copy it again, or write it again with "
                f"save_weights")
    if "file signature not found" in text:
        return "is not a weights file (not an HDF5 file); name a .weights.h5 or .h5 file that save_weights wrote"
    return f"cannot be read as a weights file ({text[:200]})"


def imagenet_cache(name) -> str:
    """Where Keras looks for, and downloads, the ImageNet weights of model `name` (keras.utils.get_file's cache)."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(home, "models", _IMAGENET_FILES[name])


def _pretrained(name, weights, shape) -> keras.Model:
    """The keras.applications backbone of `name` on `shape` images, with `weights` (imagenet or a file) loaded.
    Raises ConfigError, in one line naming model.pretrained, when they cannot be loaded into it or hold NaN or
    infinity; Keras's own warnings while loading (one per layer that does not fit) are kept off the terminal."""
    path = weights if weights == "imagenet" else os.path.expanduser(weights)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        try:
            backbone = _APPLICATIONS[name](include_top=False, weights=path, input_shape=shape, pooling="avg")
        except Exception as error:  # noqa: BLE001  Keras raises a bare Exception for a failed download, ValueError...
            line = (str(error).splitlines() or [type(error).__name__])[0]
            if weights == "imagenet" and not isinstance(error, ValueError) and not os.path.isfile(imagenet_cache(name)):
                # Keras' line is "URL fetch failure on <url>: <code> -- <reason>"; the url is given below.
                raise ConfigError(f"model.pretrained=imagenet: Keras could not download {_IMAGENET_URL}"
                                  f"{_IMAGENET_FILES[name]} ({line.rpartition(' -- ')[2]}); put that file at "
                                  f"{imagenet_cache(name)}") from None
            if weights != "imagenet" and isinstance(error, OSError):  # h5py's: the file changed since it was read
                raise ConfigError(f"model.pretrained={weights} {_unreadable(error)}") from None
            if weights != "imagenet" and isinstance(error, ValueError):
                raise ConfigError(f"model.pretrained={weights} holds another model's weights: "
                                  f"{_mismatch(error, name)}; name the weights of model={name} (include_top=False)"
                                  ) from None
            raise ConfigError(f"model.pretrained={weights} does not fit model={name} on "
                              f"{'x'.join(map(str, shape))} images: {line}") from None
    nonfinite = next((variable.path for variable in backbone.weights if not np.isfinite(variable.numpy()).all()),
                     None)
    if nonfinite is not None:
        raise ConfigError(f"model.pretrained={weights} holds non-finite values (NaN or infinity), in {nonfinite} "
                          f"first: training would fail at its first steps; name weights that trained without "
                          f"diverging")
    return backbone


def _mismatch(error, name) -> str:
    """What does not fit, from Keras's error loading a weights file into the backbone of model `name`."""
    text = " ".join(str(error).split())
    layers = re.search(r"Model expected (\d+) layers, found (\d+) saved layers", text)
    if layers:
        return f"it holds {layers[2]} layers with weights, and model={name} has {layers[1]}"
    count = re.search(r"A total of (\d+) objects could not be loaded", text)
    count = f"{count[1]} layers do not fit, the first " if count else ""
    shapes = (re.search(r"variable\.shape=\(([^)]*)\), Received: value\.shape=\(([^)]*)\)\. "
                        r"Target variable: <Variable path=([^,>]+)", text)
              or re.search(r"for weight (\S+)\. Weight expects shape \(([^)]*)\)\. Received saved weight with shape "
                           r"\(([^)]*)\)", text))
    if shapes:
        variable, model_shape, file_shape = ((shapes[3], shapes[1], shapes[2]) if text[shapes.start():].startswith(
            "variable") else (shapes[1], shapes[2], shapes[3]))
        return f"{count}{variable} is {_shape(model_shape)} in the model and {_shape(file_shape)} in the file"
    return f"{count}{text.split(' Target variable:')[0].split(' List of objects')[0][:300]}"


def _shape(text) -> str:
    return "x".join(part.strip() for part in text.split(",") if part.strip()) or "scalar"
