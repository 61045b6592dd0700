"""Augmentation and normalisation in the steps: ranges, seeding by step, no augmentation in eval (seeding by replica:
tests/test_replicas.py)."""
import numpy as np
import pytest
import tensorflow as tf

from tf_harness.experiments.config.settings import Settings
from tests.conftest import compose


def batch(seed=0, shape=(8, 16, 20, 3)):
    return tf.constant(np.random.default_rng(seed).integers(0, 256, shape, np.uint8))


@pytest.fixture
def det():
    return Settings.from_config(compose("dataset=imagenet_det")).preprocessing()  # flips, per-image standardisation


def test_unit_range_maps_uint8_to_minus_one_one():
    preprocess = Settings.from_config(compose("dataset=chest_xray")).preprocessing()
    images = tf.constant([[[[0]], [[255]]]], tf.uint8)
    np.testing.assert_allclose(preprocess(images, training=False).numpy().ravel(), [-1.0, 1.0])
    augmented = preprocess(batch(shape=(4, 8, 8, 1)), training=True, step=tf.constant(3, tf.int64)).numpy()
    assert augmented.dtype == np.float32 and -1.0 <= augmented.min() < augmented.max() <= 1.0


def test_evaluation_standardises_each_image_and_does_not_augment(det):
    images = batch()
    out = det(images, training=False).numpy()
    np.testing.assert_allclose(out.mean(axis=(1, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(out.std(axis=(1, 2, 3)), 1, atol=1e-3)
    np.testing.assert_array_equal(out, det(images, training=False).numpy())
    np.testing.assert_allclose(out, tf.image.per_image_standardization(tf.cast(images, tf.float32)).numpy())


def test_training_draws_are_seeded_by_the_step(det):
    images = batch()
    step = [det(images, training=True, step=tf.constant(s, tf.int64)).numpy() for s in (5, 5, 6)]
    np.testing.assert_array_equal(step[0], step[1])  # resumable: the same step gives the same batch
    assert not np.array_equal(step[0], step[2])
    assert not np.array_equal(step[0], det(images, training=False).numpy())


def test_flips_and_brightness_vary_per_image():
    cfg = compose("dataset=imagenet_det", "dataset.normalize=unit_range")
    preprocess = Settings.from_config(cfg).preprocessing()
    images = tf.repeat(batch(shape=(1, 6, 10, 3)), 64, axis=0)  # one image, 64 times
    out = preprocess(images, training=True, step=tf.constant(1, tf.int64)).numpy()
    plain = preprocess(images, training=False).numpy()[0]
    mirrored = plain[:, ::-1]
    # Each copy is the image or its mirror, shifted by one brightness delta (clipped at the ends).
    flipped = [np.abs(o - mirrored).max() < np.abs(o - plain).max() for o in out]
    assert 16 < sum(flipped) < 48
    shifts = [np.median((o - (mirrored if f else plain))) for o, f in zip(out, flipped)]
    assert np.ptp(shifts) > 0.1 and max(np.abs(shifts)) <= 0.1 * 255 / 127.5 + 1e-6


def test_pairs_are_augmented_independently():
    preprocess = Settings.from_config(compose("dataset=lfw_pairs")).preprocessing()
    images = batch()
    first, second = preprocess((images, images), training=True, step=tf.constant(2, tf.int64))
    assert not np.array_equal(first.numpy(), second.numpy())
