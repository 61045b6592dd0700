"""Robust image decoding and resizing, as graph ops (no Python per image)."""
from dataclasses import dataclass

import tensorflow as tf

_JPEG_MAGIC = b"\xff\xd8"


def _is_jpeg(contents):
    return tf.equal(tf.strings.substr(contents, 0, 2), _JPEG_MAGIC)


def _decode_any(contents, channels):
    return tf.io.decode_image(contents, channels=channels, dtype=tf.uint8, expand_animations=False)


def decode(contents, channels):
    """Decodes JPEG/PNG/GIF/BMP bytes to uint8 with exactly `channels` channels.

    The format is sniffed from the bytes, not the file name, so PNGs named
    ``.jpg`` decode. Grayscale and CMYK JPEGs, RGBA and 16-bit PNGs all come out
    as `channels` uint8 channels.
    """
    if channels == 3:
        image = _decode_any(contents, 3)
    else:
        # libjpeg cannot turn CMYK straight into one channel, so JPEGs go through RGB.
        image = tf.cond(
            _is_jpeg(contents),
            lambda: tf.image.rgb_to_grayscale(tf.io.decode_jpeg(contents, channels=3)),
            lambda: _decode_any(contents, channels),
        )
    image.set_shape([None, None, channels])
    return image


def _kept_window(height, width, size, method, crop_fraction):
    """The [top, left, height, width] box of an image that survives the crop before resizing.

    It is tf.image.central_crop's box for `crop_fraction`, then, for ``crop_or_pad``,
    tf.image.resize_with_crop_or_pad's crop where the image is larger than `size`.
    """
    if crop_fraction:
        # central_crop's arithmetic, so both decode paths keep the same pixels.
        top = tf.cast((tf.cast(height, tf.float64) * (1 - crop_fraction)) / 2, tf.int32)
        left = tf.cast((tf.cast(width, tf.float64) * (1 - crop_fraction)) / 2, tf.int32)
        height, width = height - 2 * top, width - 2 * left
    else:
        top = left = tf.constant(0, tf.int32)
    if method == "crop_or_pad":
        top += tf.maximum((height - size[0]) // 2, 0)
        left += tf.maximum((width - size[1]) // 2, 0)
        height, width = tf.minimum(height, size[0]), tf.minimum(width, size[1])
    return tf.stack([top, left, height, width])


def decode_and_resize(contents, channels, size, method="resize", crop_fraction=None):
    """Decodes image bytes like `decode`, crops and resizes them to `size`, as uint8.

    Args:
        size: (height, width).
        method: ``resize`` stretches to the size; ``crop_or_pad`` keeps the scale
            and centre-crops or zero-pads to it.
        crop_fraction: when set, first keep this central fraction of the image.

    A JPEG decodes only the window that the crops keep (libjpeg skips most of
    the work outside it): LFW's central crop keeps a quarter of each face photo,
    a 224x224 centre crop under a third of an ILSVRC image.
    """
    height, width = size
    cropping = bool(crop_fraction) or method == "crop_or_pad"

    def jpeg():
        shape = tf.image.extract_jpeg_shape(contents)
        top, left, kept_height, kept_width = tf.unstack(
            _kept_window(shape[0], shape[1], size, method, crop_fraction))
        # libjpeg upsamples chroma at a window's edge from the edge alone; one more pixel on each
        # side gives the kept pixels the neighbours a full decode uses, so they match it exactly.
        outer_top, outer_left = tf.maximum(top - 1, 0), tf.maximum(left - 1, 0)
        outer_bottom = tf.minimum(top + kept_height + 1, shape[0])
        outer_right = tf.minimum(left + kept_width + 1, shape[1])
        # channels=3 first: libjpeg cannot turn CMYK straight into one channel.
        image = tf.io.decode_and_crop_jpeg(
            contents, tf.stack([outer_top, outer_left, outer_bottom - outer_top, outer_right - outer_left]),
            channels=3)
        image = image[top - outer_top:top - outer_top + kept_height, left - outer_left:left - outer_left + kept_width]
        return tf.image.rgb_to_grayscale(image) if channels == 1 else image

    def other():
        image = _decode_any(contents, channels)
        shape = tf.shape(image)
        top, left, kept_height, kept_width = tf.unstack(_kept_window(shape[0], shape[1], size, method, crop_fraction))
        return image[top:top + kept_height, left:left + kept_width]

    if cropping:
        image = tf.cond(_is_jpeg(contents), jpeg, other)
        image.set_shape([None, None, channels])
    else:
        image = decode(contents, channels)
    if method == "crop_or_pad":
        image = tf.image.resize_with_crop_or_pad(image, height, width)  # pads only: the crop is done
    else:
        image = resize(image, size)
    image.set_shape([height, width, channels])
    return image


def resize(image, size):
    """Resizes a uint8 image to `size` (height, width), antialiased when shrinking; uint8 out.

    At least eight times the size on both sides: a plain bilinear resize to twice the size, then an
    antialiased one; any other shrink of both sides: area (an exact box filter); one side shrinking: the
    antialiased resize; enlarging: plain bilinear, where antialiasing changes no pixel. Shrinking must
    antialias to keep thin structures of 1024px X-rays at a few dozen pixels, but TensorFlow's antialiased
    resize costs about as much CPU as a JPEG decode, hence the cheaper paths (docs/input-pipeline.md).
    tests/test_images.py bounds their differences from the direct antialiased resize.
    """
    height, width = size
    shape = tf.shape(image)
    ratio = tf.minimum(shape[0] // height, shape[1] // width)
    shrinking_both = tf.logical_and(shape[0] >= height, shape[1] >= width)
    shrinking_either = tf.logical_or(shape[0] > height, shape[1] > width)

    def much_larger():
        return tf.image.resize(tf.image.resize(image, [2 * height, 2 * width]), size, antialias=True)

    def other():  # enlarging, or shrinking one side only
        return tf.cond(shrinking_either, lambda: tf.image.resize(image, size, antialias=True),
                       lambda: tf.image.resize(image, size))

    image = tf.case([(ratio >= 8, much_larger), (shrinking_both, lambda: tf.image.resize(image, size, method="area"))],
                    default=other)
    return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)


@dataclass(frozen=True)
class Decode:
    """How a dataset's images become model inputs: what `decode_and_resize` needs, as plain values.

    Plain values rather than the config: a `load` traced by tf.data must not reach into
    OmegaConf, whose code AutoGraph would then convert (seconds per process).

    Attributes:
        size: (height, width) of the output.
        method: ``resize`` or ``crop_or_pad`` (see `decode_and_resize`).
        crop_fraction: the central fraction kept before resizing, or None.
    """

    size: tuple
    method: str
    crop_fraction: float = None

    def __call__(self, contents, channels):
        """Decodes, crops and resizes image bytes to uint8 [height, width, channels]."""
        return decode_and_resize(contents, channels, self.size, self.method, self.crop_fraction)

    def read(self, path, channels):
        """Reads an image file and decodes it like `__call__`."""
        return self(tf.io.read_file(path), channels)


def image_size(value) -> tuple:
    """`pipeline.image_size` as (height, width); an int means a square."""
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))
