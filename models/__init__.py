"""Model builders by config name. A builder takes (model_settings, spec, image_size) and
returns a keras.Model from float images to float32 logits, one per spec.class_names.

`BUILDERS` is the one list of models, and each model family is declared here once: its builder, what it takes
(``inputs``) and the ``model.*`` keys its builder reads (``options``). Nothing here imports TensorFlow, so
experiments/schema.py reads them before TensorFlow starts; each family's module takes its INPUTS and OPTIONS
from its declaration here.
"""
from tf_harness.data.registry import Entry, Registry


class Model(Entry):
    """A model family: its builder (``"module:build"``), ``inputs`` (``single``: one image per example, ``pair``:
    two) and ``options`` (the ``model.*`` keys its builder reads besides ``name`` and ``inputs``)."""


RESNET_V2 = Model("tf_harness.models.resnet_v2:build", inputs="single", options=("batch_norm_momentum", "pretrained"))
SEMI_ALEXNET = Model("tf_harness.models.semi_alexnet:build", inputs="single",
                     options=("filters", "dense_units", "dropout"))
SIAMESE_CNN = Model("tf_harness.models.siamese_cnn:build", inputs="pair",
                    options=("merge", "widths", "embedding_size", "head_units"))
# How siamese_cnn merges the two images of a pair (model.merge).
MERGES = ("embedding", "pixel_difference")

# One line per model: its config name (conf/model/<name>.yaml) and its family.
BUILDERS = Registry({
    "resnet_v2_50": RESNET_V2,
    "resnet_v2_101": RESNET_V2,
    "resnet_v2_152": RESNET_V2,
    "siamese_cnn": SIAMESE_CNN,
    "semi_alexnet": SEMI_ALEXNET,
})
