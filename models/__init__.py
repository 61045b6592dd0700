"""Model builders by config name. A builder takes (model_cfg, spec, image_size) and
returns a keras.Model from float images to float32 logits, one per spec.class_names."""
from tf_harness.models import resnet_v2
from tf_harness.models import semi_alexnet
from tf_harness.models import siamese_cnn

BUILDERS = {
    "resnet_v2_50": resnet_v2.build,
    "resnet_v2_101": resnet_v2.build,
    "resnet_v2_152": resnet_v2.build,
    "siamese_cnn": siamese_cnn.build,
    "semi_alexnet": semi_alexnet.build,
}
