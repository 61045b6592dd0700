"""The siamese CNN: two image inputs, one float32 logit, both merge modes."""
import numpy as np
import pytest

from tf_harness.data.lfw_pairs import SPEC
from tf_harness.models import BUILDERS
from tests.conftest import compose


def _model(merge, size=(32, 32)):
    model_cfg = compose("dataset=lfw_pairs", f"model.merge={merge}").model
    return BUILDERS["siamese_cnn"](model_cfg, SPEC, size)


@pytest.mark.parametrize("merge", ["embedding", "pixel_difference"])
def test_builds_with_two_inputs_and_one_float32_logit(merge):
    model = _model(merge, (32, 40))
    assert [tuple(x.shape) for x in model.inputs] == [(None, 32, 40, 3)] * 2
    rng = np.random.default_rng(0)
    image_a, image_b = (rng.uniform(-1, 1, (3, 32, 40, 3)).astype("float32") for _ in range(2))
    logits = model((image_a, image_b), training=False)
    assert tuple(logits.shape) == (3, 1)
    assert logits.dtype == "float32"
    # The order of the pair carries no meaning, and the score says so.
    np.testing.assert_allclose(model((image_b, image_a), training=False), logits, rtol=1e-5, atol=1e-5)


def test_embedding_tower_is_shared():
    model = _model("embedding")
    kernels = [w for w in model.weights if "conv" in w.path and w.path.endswith("kernel")]
    # One set of conv kernels for both images: one per configured width, not two.
    assert len(kernels) == len(compose("dataset=lfw_pairs").model.widths)
