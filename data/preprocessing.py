"""Augmentation and normalisation of uint8 image batches, inside the traced train and eval steps.

The input pipeline stops at decoded, resized uint8 batches; this module turns them into the
model's float inputs on the replica's device. That follows Keras' advice for image
preprocessing on accelerators, and keeps the host cores, the scarce resource that feeds a GPU,
for decoding: inside a tf.data map, flip + brightness + standardisation cost a good share of what
decoding and cropping an image does (docs/input-pipeline.md). uint8 batches also cross to the device at a
quarter of float32's bytes.
"""
import tensorflow as tf


BRIGHTNESS_DELTA = 0.1 * 255


class Preprocessing:
    """Augments (training only) and normalises a batch of images, or a pair of batches."""

    def __init__(self, augment: bool, flip: bool, normalize: str, seed: int):
        """`augment`: random flips (with `flip`) and brightness in training; `normalize`: ``unit_range``
        or ``per_image_standardization`` (experiments/schema.py allows only these); `seed`: the seed of every random draw."""
        self.augment, self.flip, self.normalize, self.seed = augment, flip, normalize, seed

    def __call__(self, features, training, step=None):
        """`features`: uint8 [batch, height, width, channels], or a tuple of such batches.

        With `training`, `step` (an int64 scalar) seeds the random draws together with `seed`
        and the replica's index: the augmentation is deterministic, different for every step and
        replica, and resumes exactly with the global step from a checkpoint.
        """
        if isinstance(features, (tuple, list)):
            # Each image of a pair draws its own flip and brightness, as separate photos would differ.
            return tuple(self._one(images, training, step, part) for part, images in enumerate(features))
        return self._one(features, training, step, 0)

    def _one(self, images, training, step, part):
        images = tf.cast(images, tf.float32)
        if training and self.augment:
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            seed = tf.constant([self.seed, part], tf.int64)
            for data in (step, replica):
                seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(data, tf.int64))
            images = self._augment(images, seed)
        if self.normalize == "per_image_standardization":
            return tf.image.per_image_standardization(images)
        return images / 127.5 - 1.0  # unit_range: [-1, 1], what ResNet-v2 expects

    def _augment(self, images, seed):
        draws = tf.random.stateless_uniform([tf.shape(images)[0], 1, 1, 2], seed)
        if self.flip:
            images = tf.where(draws[..., :1] < 0.5, tf.reverse(images, axis=[2]), images)
        delta = (draws[..., 1:] * 2 - 1) * BRIGHTNESS_DELTA
        return tf.clip_by_value(images + delta, 0, 255)
