"""Siamese CNN for face verification: one logit for "these two photos show the same person".

Two ways to merge the pair (``model.merge``):

``embedding``
    One convolutional tower, its weights shared, embeds each image; a small
    head scores |e_a - e_b| (Koch et al. 2015). Sharing the tower makes the
    score symmetric in the pair and lets it compare people it was not trained on.
``pixel_difference``
    The network convolves |image_a - image_b| directly: cheaper, but it only
    sees where the two photos differ pixel by pixel.
"""
import keras

from tf_harness.data.spec import DatasetSpec
from tf_harness.models import SIAMESE_CNN

# What an example is, and the model.* keys build reads: declared once, in models/__init__.py (with MERGES).
INPUTS, OPTIONS = SIAMESE_CNN.inputs, SIAMESE_CNN.options


def conv_stack(widths, name) -> keras.Sequential:
    """Conv/BatchNorm/ReLU/MaxPool blocks, then global average pooling. Each block's 2x2 pool halves the image,
    rounding down, so it takes at least 2**len(widths) pixels a side (declared in models/__init__.py)."""
    layers = []
    for k, width in enumerate(widths):
        layers += [keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"conv{k}"),
                   keras.layers.BatchNormalization(name=f"bn{k}"),
                   keras.layers.ReLU(name=f"relu{k}"),
                   keras.layers.MaxPooling2D(name=f"pool{k}")]
    layers.append(keras.layers.GlobalAveragePooling2D(name="pool"))
    return keras.Sequential(layers, name=name)


def build(model_settings, spec: DatasetSpec, image_size) -> keras.Model:
    """A two-input model, (image_a, image_b) float images, returning one float32 logit per pair."""
    merge = model_settings.merge  # embedding or pixel_difference, as experiments/config/schema.py allows
    height, width = image_size
    image_a = keras.Input((height, width, spec.channels), name="image_a")
    image_b = keras.Input((height, width, spec.channels), name="image_b")
    widths = list(model_settings.widths)
    if merge == "embedding":
        tower = conv_stack(widths, "tower")
        embed = keras.layers.Dense(model_settings.embedding_size, name="embedding")
        # The same layer objects embed both images: that is the weight sharing.
        embedding_a, embedding_b = embed(tower(image_a)), embed(tower(image_b))
        features = keras.layers.Lambda(lambda e: keras.ops.abs(e[0] - e[1]), name="distance")(
            [embedding_a, embedding_b])
    else:
        difference = keras.layers.Lambda(lambda x: keras.ops.abs(x[0] - x[1]), name="difference")([image_a, image_b])
        features = conv_stack(widths, "difference_cnn")(difference)
    hidden = keras.layers.Dense(model_settings.head_units, activation="relu", name="head")(features)
    # float32 logits keep the loss stable under mixed precision.
    logits = keras.layers.Dense(spec.num_outputs, dtype="float32", name="logits")(hidden)
    return keras.Model([image_a, image_b], logits, name=f"siamese_cnn_{merge}")
