"""Robust image decoding and resizing, as graph ops (no Python per image)."""
import tensorflow as tf

_JPEG_MAGIC = b"\xff\xd8"


def decode(contents, channels):
    """Decodes JPEG/PNG/GIF/BMP bytes to uint8 with exactly `channels` channels.

    The format is sniffed from the bytes, not the file name, so PNGs named
    ``.jpg`` decode. Grayscale and CMYK JPEGs, RGBA and 16-bit PNGs all come out
    as `channels` uint8 channels.
    """
    if channels == 3:
        image = tf.io.decode_image(contents, channels=3, dtype=tf.uint8, expand_animations=False)
    else:
        # libjpeg cannot turn CMYK straight into one channel, so JPEGs go through RGB.
        is_jpeg = tf.equal(tf.strings.substr(contents, 0, 2), _JPEG_MAGIC)
        image = tf.cond(
            is_jpeg,
            lambda: tf.image.rgb_to_grayscale(tf.io.decode_jpeg(contents, channels=3)),
            lambda: tf.io.decode_image(contents, channels=channels, dtype=tf.uint8, expand_animations=False),
        )
    image.set_shape([None, None, channels])
    return image


def resize(image, size, method="resize", crop_fraction=None):
    """Resizes a uint8 image to `size` (int or (height, width)), returning uint8.

    Args:
        method: ``resize`` stretches to the size; ``crop_or_pad`` keeps the scale
            and centre-crops or zero-pads to it.
        crop_fraction: when set, first keep this central fraction of the image.
    """
    height, width = (size, size) if isinstance(size, int) else size
    if crop_fraction:
        image = tf.image.central_crop(image, crop_fraction)
    if method == "crop_or_pad":
        image = tf.image.resize_with_crop_or_pad(image, height, width)
    else:
        # antialias keeps thin structures when shrinking 1024px X-rays to a few dozen pixels; when
        # enlarging (LFW's face crops) it changes no pixel but costs a much slower kernel.
        shape = tf.shape(image)
        shrinking = tf.logical_or(shape[0] > height, shape[1] > width)
        image = tf.cond(shrinking, lambda: tf.image.resize(image, [height, width], antialias=True),
                        lambda: tf.image.resize(image, [height, width]))
        image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    image.set_shape([height, width, image.shape[-1]])
    return image


def read_and_resize(path, channels, size, method="resize", crop_fraction=None):
    """Reads an image file and returns it decoded and resized to uint8."""
    return resize(decode(tf.io.read_file(path), channels), size, method, crop_fraction)


def configured_size(cfg):
    """`pipeline.image_size` as (height, width); an int means a square."""
    size = cfg.pipeline.image_size
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
