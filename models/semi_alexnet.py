"""The semi-AlexNet: AlexNet (Krizhevsky et al. 2012) with about half the filters, in modern Keras form.

Shape, with the default widths, for a 415x482 RGB input::

    conv 11x11/4, 48   -> BN -> ReLU -> max-pool 3x3/2    104x121x48 -> 52x61x48
    conv 5x5,    128   -> BN -> ReLU -> max-pool 3x3/2     52x61x128 -> 26x31x128
    conv 3x3,    192   -> BN -> ReLU                       26x31x192
    conv 3x3,    192   -> BN -> ReLU                       26x31x192
    conv 3x3,    128   -> BN -> ReLU -> max-pool 3x3/2     26x31x128 -> 13x16x128
    global average pool                                    128
    dense 512 -> ReLU -> dropout, twice                    512
    dense, one float32 logit per class                     num_outputs

Batch norm stands in for AlexNet's local response normalisation, and global
pooling before the dense layers (instead of flattening a 6x6 map into 4096
units) keeps the network small enough to train on a CPU and lets it take any
image size. Convolutions and pools pad ``same``, so small images work too.
"""
import keras

from tf_harness.data.spec import DatasetSpec
from tf_harness.models import SEMI_ALEXNET

# What an example is, and the model.* keys build reads: declared once, in models/__init__.py.
INPUTS, OPTIONS = SEMI_ALEXNET.inputs, SEMI_ALEXNET.options

# (kernel size, stride, followed by a max-pool) of the five conv layers, as in AlexNet.
_CONV_LAYERS = ((11, 4, True), (5, 1, True), (3, 1, False), (3, 1, False), (3, 1, True))


def build(model_settings, spec: DatasetSpec, image_size) -> keras.Model:
    """Builds the semi-AlexNet for `spec.channels`-channel float images of `image_size` (height, width).

    Args:
        model_settings: ``filters`` (five conv widths), ``dense_units`` and ``dropout``.
    """
    height, width = image_size
    if len(model_settings.filters) != len(_CONV_LAYERS):
        raise ValueError(f"model.filters needs {len(_CONV_LAYERS)} widths, got {list(model_settings.filters)}")
    images = keras.Input((height, width, spec.channels), name="image")
    x = images
    for number, (filters, (kernel, stride, pool)) in enumerate(zip(model_settings.filters, _CONV_LAYERS), start=1):
        # No bias: batch norm's offset takes its place.
        x = keras.layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False,
                                name=f"conv{number}")(x)
        # Momentum 0.9, not Keras' 0.99: evaluation statistics settle within the few hundred steps of a CPU run.
        x = keras.layers.BatchNormalization(momentum=0.9, name=f"conv{number}_bn")(x)
        x = keras.layers.ReLU(name=f"conv{number}_relu")(x)
        if pool:
            # Overlapping 3x3/2 pools, as in AlexNet.
            x = keras.layers.MaxPooling2D(3, 2, padding="same", name=f"pool{number}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    for number in (6, 7):
        x = keras.layers.Dense(model_settings.dense_units, activation="relu", name=f"fc{number}")(x)
        x = keras.layers.Dropout(model_settings.dropout, name=f"fc{number}_dropout")(x)
    # float32 logits keep the softmax and loss stable under mixed precision.
    logits = keras.layers.Dense(spec.num_outputs, dtype="float32", name="logits")(x)
    return keras.Model(images, logits, name=model_settings.name)
