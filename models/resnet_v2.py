"""ResNet-v2 (pre-activation ResNet, He et al. 2016) from keras.applications."""
import keras

from tf_harness.data.spec import DatasetSpec

# What the config check (experiments/schema.py) reads: one image per example, and the model.* keys build reads.
INPUTS = "single"
OPTIONS = ("batch_norm_momentum",)

_APPLICATIONS = {
    "resnet_v2_50": keras.applications.ResNet50V2,
    "resnet_v2_101": keras.applications.ResNet101V2,
    "resnet_v2_152": keras.applications.ResNet152V2,
}


def build(model_cfg, spec: DatasetSpec, image_size) -> keras.Model:
    """ResNet-v2 from scratch on `spec.channels`-channel images, with one logit per class.

    Inputs are expected in [-1, 1], as the keras.applications ResNet-v2 models are.
    """
    height, width = image_size
    backbone = _APPLICATIONS[model_cfg.name](
        include_top=False, weights=None, input_shape=(height, width, spec.channels), pooling="avg")
    # keras.applications fixes batch-norm momentum at 0.99; its moving statistics then need
    # several hundred steps to settle, and evaluation of a short run sees the initial ones.
    for layer in backbone.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = model_cfg.batch_norm_momentum
    # float32 logits keep the loss stable under mixed precision.
    logits = keras.layers.Dense(spec.num_outputs, dtype="float32", name="logits")(backbone.output)
    return keras.Model(backbone.input, logits, name=model_cfg.name)
