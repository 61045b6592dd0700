"""Windowed JPEG decoding keeps exactly the pixels that decoding the whole file and cropping keeps."""
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tf_harness.data import images
from tf_harness.data.samples import imagenet_det as det_sample
from tests.conftest import REAL, require_real_fixtures

SETTINGS = [  # (channels, (height, width), method, crop_fraction)
    (3, (224, 224), "crop_or_pad", None),  # crops both sides of an ILSVRC image
    (3, (415, 482), "crop_or_pad", None),  # the DET default: crops a little, pads the rest
    (3, (48, 48), "resize", 0.5),  # the LFW default: a central quarter, shrunk
    (3, (224, 224), "resize", 0.5),  # a central quarter, enlarged
    (1, (100, 120), "crop_or_pad", None),
    (3, (37, 53), "crop_or_pad", 0.7),
    (1, (64, 64), "resize", None),  # no crop: the whole-file decode
]


def whole_decode_then_crop(contents, channels, size, method, crop_fraction):
    """What the pipeline did before windowed decoding: tf.image's own crops on the full decode."""
    image = images.decode(contents, channels)
    if crop_fraction:
        image = tf.image.central_crop(image, crop_fraction)
    if method == "crop_or_pad":
        return tf.image.resize_with_crop_or_pad(image, *size)
    return images.resize(image, size)  # the same resize: this compares the windows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Real LFW JPEGs and NIH PNGs, and the DET sample's odd files: grayscale, CMYK, PNG named .JPEG."""
    require_real_fixtures()
    root = tmp_path_factory.mktemp("det")
    det_sample.make_sample(root, seed=0)
    det = sorted((root / "ILSVRC" / "Data" / "DET").rglob("*.JPEG"))
    modes = {}
    for path in det:
        with Image.open(path) as image:
            modes.setdefault((image.format, image.mode), path)
    assert {("JPEG", "L"), ("JPEG", "CMYK"), ("PNG", "RGB")} <= set(modes), modes
    return (sorted((REAL / "lfw").glob("*.jpg")) + sorted((REAL / "nih" / "images").glob("*.png"))[:2] +
            list(modes.values()) + det[:40])


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_windowed_decode_equals_whole_decode_and_crop(files, setting):
    for path in files:
        contents = tf.io.read_file(str(path))
        got = images.decode_and_resize(contents, *setting).numpy()
        expected = whole_decode_then_crop(contents, *setting).numpy()
        assert got.shape == expected.shape == (*setting[1], setting[0])
        np.testing.assert_array_equal(got, expected, err_msg=str(path))


@pytest.mark.parametrize("size", [(64, 64), (224, 224), (100, 120)], ids=str)
def test_shrink_stays_within_a_level_of_the_direct_antialiased_resize(size):
    """The cheaper shrinks (a plain bilinear pre-shrink of images 8x the size, area below that) move the real
    X-rays' pixels by at most 1 level on average from a direct antialiased resize (the output before them),
    and no image by 1.5."""
    require_real_fixtures()
    paths = sorted((REAL / "nih" / "images").glob("*.png"))
    assert len(paths) >= 20
    differences = []
    for path in paths:
        image = images.decode(tf.io.read_file(str(path)), 1)
        got = images.resize(image, size).numpy().astype(np.float64)
        direct = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, size, antialias=True)), 0, 255), tf.uint8)
        differences.append(np.abs(got - direct.numpy()).mean())
    assert np.mean(differences) <= 1.0, differences
    assert max(differences) <= 1.5, differences
    assert min(differences) > 0, "the cheaper shrink did not run"


def test_face_windows_shrink_within_a_level_of_the_direct_antialiased_resize():
    """LFW's default: the central 125px window of a 250px face photo, shrunk to 48px by area."""
    require_real_fixtures()
    paths = sorted((REAL / "lfw").glob("*.jpg"))
    assert paths
    for path in paths:
        contents = tf.io.read_file(str(path))
        got = images.decode_and_resize(contents, 3, (48, 48), "resize", 0.5).numpy().astype(np.float64)
        window = tf.image.central_crop(images.decode(contents, 3), 0.5)
        direct = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(window, (48, 48), antialias=True)), 0, 255),
                         tf.uint8).numpy()
        assert 0 < np.abs(got - direct).mean() <= 1.0, path
