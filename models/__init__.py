"""Model builders by config name. A builder takes (model_cfg, spec, image_size) and
returns a keras.Model from float images to float32 logits, one per spec.class_names.

`BUILDERS` is the one list of models. Each model family's module declares ``INPUTS`` (``single``: one image
per example, ``pair``: two) and ``OPTIONS`` (the ``model.*`` keys its builder reads besides ``name`` and
``inputs``); experiments/schema.py reads those and the names here without importing TensorFlow.
"""
from tf_harness.data import INPUTS
from tf_harness.data.registry import Registry

# One line per model: its config name (conf/model/<name>.yaml) and its builder.
BUILDERS = Registry({
    "resnet_v2_50": "tf_harness.models.resnet_v2:build",
    "resnet_v2_101": "tf_harness.models.resnet_v2:build",
    "resnet_v2_152": "tf_harness.models.resnet_v2:build",
    "siamese_cnn": "tf_harness.models.siamese_cnn:build",
    "semi_alexnet": "tf_harness.models.semi_alexnet:build",
})


def model_inputs(name) -> str:
    """``single`` or ``pair``: what model `name` takes, read from its family's ``INPUTS``."""
    return BUILDERS.read(name, "INPUTS", lambda value: value in INPUTS, f"one of {'|'.join(INPUTS)}")
