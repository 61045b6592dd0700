"""Augmentation and normalisation of uint8 image batches, inside the traced train and eval steps.

The input pipeline stops at decoded, resized uint8 batches; this module turns them into the
model's float inputs on the replica's device. That follows Keras' advice for image
preprocessing on accelerators, and keeps the host cores, the scarce resource that feeds a GPU,
for decoding: inside a tf.data map, flip + brightness + standardisation cost a good share of what
decoding and cropping an image does (docs/input-pipeline.md). uint8 batches also cross to the device at a
quarter of float32's bytes.
"""
import math

import tensorflow as tf


BRIGHTNESS_DELTA = 0.1 * 255
# random_resized_crop's defaults, Inception's (Szegedy et al. 2015): a share of the image's area, and width ÷ height.
CROP_SCALE, CROP_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
CROP_ATTEMPTS = 10  # boxes drawn per image; the first that fits inside it is taken, else the whole image
BETA_BISECTIONS = 24  # float32 has a 24-bit significand


class Preprocessing:
    """Augments (training only) and normalises a batch of images, or a pair of batches; mixes a training batch's
    images and labels (`mix`)."""

    def __init__(self, augment: bool, flip: bool, normalize: str, seed: int, crop=None, mixup_alpha=0.0,
                 cutmix_alpha=0.0, classes=None):
        """`augment`: random flips (with `flip`) and brightness in training; `normalize`: ``unit_range``
        or ``per_image_standardization`` (experiments/config/schema.py allows only these); `seed`: the seed of every
        random draw.
        `crop`: None, or ``{scale: [low, high], ratio: [low, high]}`` (either may be left out): a random resized crop
        of each training image (`random_resized_crop`). `mixup_alpha`, `cutmix_alpha`: 0 (off) or the alpha of the
        Beta draw that mixes a training batch (`mix`), whose labels are class indices out of `classes`."""
        self.augment, self.flip, self.normalize, self.seed = augment, flip, normalize, seed
        crop = None if crop is None else dict(crop)
        self.crop = None if crop is None else (tuple(crop.get("scale") or CROP_SCALE),
                                               tuple(crop.get("ratio") or CROP_RATIO))
        self.mixup_alpha, self.cutmix_alpha, self.classes = float(mixup_alpha), float(cutmix_alpha), classes

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

    def _seed(self, step, part):
        """The stateless seed of `step`'s draws for `part` on this replica."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        seed = tf.constant([self.seed, part], tf.int64)
        for data in (step, replica):
            seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(data, tf.int64))
        return seed

    def _one(self, images, training, step, part):
        images = tf.cast(images, tf.float32)
        if training and (self.augment or self.crop):
            seed = self._seed(step, part)
            if self.crop:  # its own seed, so the flips and brightness draw the same with the crop on or off
                images = random_resized_crop(images, tf.random.experimental.stateless_fold_in(seed, 1), *self.crop)
            if self.augment:
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

    def mix(self, features, labels, step):
        """Mixup (Zhang et al. 2018) or cutmix (Yun et al. 2019) of a training batch, after `__call__`: each example
        is mixed with the batch's reversed order, by one Beta(alpha, alpha) draw per batch; with both on, each batch
        takes one of them at even odds. The labels come back as class distributions [batch, classes]. With both
        alphas 0 it returns `features` and `labels` as they are. Seeded like `__call__`."""
        if not (self.mixup_alpha or self.cutmix_alpha):
            return features, labels
        seeds = tf.random.experimental.stateless_split(self._seed(step, 2), 4)
        targets = tf.one_hot(tf.cast(labels, tf.int32), self.classes) if labels.shape.rank == 1 else labels
        targets = tf.cast(targets, tf.float32)
        partner_images, partner_targets = tf.reverse(features, [0]), tf.reverse(targets, [0])
        mixed = []
        if self.mixup_alpha:
            share = beta(self.mixup_alpha, seeds[0])
            mixed.append((share * features + (1 - share) * partner_images, share))
        if self.cutmix_alpha:
            inside = _cut_box(tf.shape(features), beta(self.cutmix_alpha, seeds[1]), seeds[2])
            share = 1 - tf.reduce_mean(tf.cast(inside, tf.float32))  # of the image that stays its own
            mixed.append((tf.where(inside, partner_images, features), share))
        (images, share), *other = mixed
        if other:
            cut = tf.random.stateless_uniform([], seeds[3]) < 0.5
            images, share = tf.where(cut, other[0][0], images), tf.where(cut, other[0][1], share)
        return images, share * targets + (1 - share) * partner_targets


def beta(alpha, seed, shape=()):
    """Stateless Beta(alpha, alpha) draws: its inverse CDF (`tf.math.betainc`, by bisection to float32's resolution)
    at uniform draws. Not X / (X + Y) of two Gamma(alpha) draws: stateless Gamma draws have no XLA kernel."""
    uniform = tf.random.stateless_uniform(shape, seed)
    alpha = tf.constant(alpha, tf.float32)
    low, high = tf.zeros(shape), tf.ones(shape)
    for _ in range(BETA_BISECTIONS):
        middle = (low + high) / 2
        below = tf.math.betainc(alpha, alpha, middle) < uniform
        low, high = tf.where(below, middle, low), tf.where(below, high, middle)
    return (low + high) / 2


def _cut_box(shape, share, seed):
    """A [1, height, width, 1] mask of cutmix's box: (1 - `share`) of the area, its centre uniform in the image,
    clipped at the border."""
    height, width = tf.cast(shape[1], tf.float32), tf.cast(shape[2], tf.float32)
    side = tf.sqrt(1.0 - share)
    centre = tf.random.stateless_uniform([2], seed) * tf.stack([height, width])
    top, bottom = centre[0] - side * height / 2, centre[0] + side * height / 2
    left, right = centre[1] - side * width / 2, centre[1] + side * width / 2
    rows = tf.range(height)[:, None] + 0.5
    columns = tf.range(width)[None, :] + 0.5
    inside = (rows >= top) & (rows < bottom) & (columns >= left) & (columns < right)
    return inside[None, :, :, None]


def random_resized_crop(images, seed, scale=CROP_SCALE, ratio=CROP_RATIO):
    """Inception's random resized crop of each image of a float batch, resized back to its height and width.

    Each image draws CROP_ATTEMPTS boxes, of a uniform share `scale` of its area and a log-uniform width ÷ height in
    `ratio`, and takes the first that fits, placed uniformly; else the whole image. The draws are vectorised over
    the batch and the crop is `crop_and_resize`'s bilinear sampling written with gathers, because neither
    `stateless_sample_distorted_bounding_box` nor `crop_and_resize` has an XLA kernel (XLA compiles the step by
    default on a GPU).
    """
    shape = tf.shape(images)
    batch, height, width = shape[0], tf.cast(shape[1], tf.float32), tf.cast(shape[2], tf.float32)
    seeds = tf.random.experimental.stateless_split(seed, 3)
    area = tf.random.stateless_uniform([batch, CROP_ATTEMPTS], seeds[0], scale[0], scale[1]) * height * width
    aspect = tf.exp(tf.random.stateless_uniform([batch, CROP_ATTEMPTS], seeds[1], math.log(ratio[0]),
                                                math.log(ratio[1])))
    box_height, box_width = tf.sqrt(area / aspect) / height, tf.sqrt(area * aspect) / width  # shares of the sides
    fits = (box_height <= 1.0) & (box_width <= 1.0)
    first = tf.argmax(tf.cast(fits, tf.int32), axis=1, output_type=tf.int32)
    found = tf.reduce_any(fits, axis=1)
    box_height = tf.where(found, tf.gather(box_height, first, batch_dims=1), 1.0)
    box_width = tf.where(found, tf.gather(box_width, first, batch_dims=1), 1.0)
    place = tf.random.stateless_uniform([batch, 2], seeds[2])
    top, left = place[:, 0] * (1.0 - box_height), place[:, 1] * (1.0 - box_width)
    boxes = tf.stack([top, left, top + box_height, left + box_width], axis=1)
    return crop_and_resize(images, boxes)


def crop_and_resize(images, boxes):
    """`tf.image.crop_and_resize(images, boxes, range(batch), (height, width))` with bilinear sampling, one box
    per image, each resized to the images' own height and width; in gathers, which XLA compiles."""
    shape = tf.shape(images)

    def positions(low, high, size):
        """Where each output row (or column) samples the image: two neighbours and the weight of the second."""
        steps = tf.cast(tf.range(size), tf.float32) / tf.cast(tf.maximum(size - 1, 1), tf.float32)
        last = tf.cast(size - 1, tf.float32)
        at = (low[:, None] + steps[None, :] * (high - low)[:, None]) * last
        before = tf.clip_by_value(tf.floor(at), 0.0, last)
        return tf.cast(before, tf.int32), tf.cast(tf.minimum(before + 1, last), tf.int32), at - before

    top, bottom, down = positions(boxes[:, 0], boxes[:, 2], shape[1])
    left, right, across = positions(boxes[:, 1], boxes[:, 3], shape[2])
    rows = (tf.gather(images, top, axis=1, batch_dims=1) * (1 - down)[:, :, None, None]
            + tf.gather(images, bottom, axis=1, batch_dims=1) * down[:, :, None, None])
    return (tf.gather(rows, left, axis=2, batch_dims=1) * (1 - across)[:, None, :, None]
            + tf.gather(rows, right, axis=2, batch_dims=1) * across[:, None, :, None])
