"""TFRecord shards of a dataset: layout (names, manifest), writer (the converter), reader (a record source).

Convert once, then train with ``pipeline.source=tfrecord``::

    python -m tf_harness.data.tfrecords dataset=chest_xray [dataset.root=...] [tfrecord.encoding=encoded|raw]
                             [pipeline.image_size=224]

Every split of the index tables becomes ``<split>-00003-of-00012.tfrecord`` files
of ``tf.train.Example`` records under ``tfrecord.dir``, named after the TF-slim /
Object Detection API convention: ``image/encoded``, ``image/format``,
``image/height``, ``image/width``, ``image/channels``, ``image/filename`` and
``image/class/label``. A pair table (columns ``path_a``, ``path_b``) gets the same
features per image under ``image_a/`` and ``image_b/`` and its label as
``pair/label``. ``tfrecord.encoding=encoded`` stores the original file bytes;
``raw`` stores the uint8 pixels that the task's own ``load`` produces at
``pipeline.image_size``, so reading them needs no decode at all.

``manifest.json`` beside the shards records the dataset, encoding, image size,
feature spec, and per split and shard the record count and sha256. Shards are
written under a ``.tmp`` name and renamed when whole, and the manifest is
updated as each one completes, so a killed conversion leaves nothing a reader
takes for data and a re-run writes only the shards still missing.
"""
from tf_harness.data.tfrecords.layout import TFRecordSettings  # noqa: F401  (what the pipeline settings hold)
