"""Model builders by config name. A builder takes (model_settings, spec, image_size) and
returns a keras.Model from float images to float32 logits, one per spec.class_names.

`BUILDERS` is the one list of models, and each model family is declared here once: its builder, what it takes
(``inputs``), the ``model.*`` keys its builder reads (``options``) and the smallest images its network takes
(``smallest``). Nothing here imports TensorFlow, so experiments/config/schema.py reads them before TensorFlow starts;
each family's module takes its INPUTS and OPTIONS from its declaration here.
"""
from collections.abc import Callable
from dataclasses import dataclass

from tf_harness.data.registry import Entry, Registry


@dataclass(frozen=True)
class Model(Entry):
    """A model family: its builder (``"module:build"``), ``inputs`` (``single``: one image per example, ``pair``:
    two), ``options`` (the ``model.*`` keys its builder reads besides ``name`` and ``inputs``) and ``smallest``: from
    the family's ``model.*`` values, the smallest image side its network takes, the option keys that side depends
    on, and why, in a few words; None for a network that takes any size."""

    smallest: Callable | None = None


def _resnet_v2_smallest(model) -> tuple:
    return 32, (), "keras.applications' minimum for ResNet-v2"


def _siamese_cnn_smallest(model) -> tuple:
    blocks = len(model["widths"])
    return 2 ** blocks, ("widths",), f"each of its {blocks} conv blocks halves the image with a 2x2 max-pool"


RESNET_V2 = Model("tf_harness.models.resnet_v2:build", inputs="single", options=("batch_norm_momentum", "pretrained"),
                  smallest=_resnet_v2_smallest)
# Its convolutions and pools pad `same`: any image size builds.
SEMI_ALEXNET = Model("tf_harness.models.semi_alexnet:build", inputs="single",
                     options=("filters", "dense_units", "dropout"))
SIAMESE_CNN = Model("tf_harness.models.siamese_cnn:build", inputs="pair",
                    options=("merge", "widths", "embedding_size", "head_units"), smallest=_siamese_cnn_smallest)
# How siamese_cnn merges the two images of a pair (model.merge).
MERGES = ("embedding", "pixel_difference")


def smallest_side(name, model) -> tuple:
    """(side, keys, why): the smallest image height and width model `name` takes with `model`, its ``model.*``
    values; the option keys that side depends on; and why. (1, (), "") for a network that takes any size, or a line
    that declares none (a plain registry Entry)."""
    smallest = getattr(BUILDERS.entries[name], "smallest", None)
    return smallest(model) if smallest else (1, (), "")


# One line per model: its config name (conf/model/<name>.yaml) and its family.
BUILDERS = Registry({
    "resnet_v2_50": RESNET_V2,
    "resnet_v2_101": RESNET_V2,
    "resnet_v2_152": RESNET_V2,
    "siamese_cnn": SIAMESE_CNN,
    "semi_alexnet": SEMI_ALEXNET,
})
