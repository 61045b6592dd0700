"""Datasets: one module per dataset, all with the same small interface.

A dataset module (``data/<name>.py``) exposes:

``SPEC``
    A :class:`data.spec.DatasetSpec`: task (``multilabel``, ``binary`` or
    ``multiclass``), class names, image channels and whether an example is an
    image pair.
``index(root, cfg, skipped) -> dict[str, pandas.DataFrame]``
    Runs once, in Python: lists and parses the metadata under ``root`` into one
    table per split (``train``, ``validation`` and, where the data has one,
    ``test``). Image path columns are named ``path`` (or ``path_a``/``path_b``
    for pairs) and hold absolute paths; the label column is ``label`` (an int,
    or a list of ints for multi-hot). Rows that cannot be used are reported
    with ``skipped.add(path, reason)`` and left out. Bad metadata that a user
    must fix raises :class:`data.errors.DatasetError`.
``load(record, cfg) -> (features, label)``
    A graph function (no Python per example) from one table record (a dict of
    scalar tensors, one per column) to uint8 image(s) resized to
    ``cfg.pipeline.image_size``, and the label. Its output is what the
    pipeline caches.
``make_sample(root, seed)``
    Writes the embedded sample into ``root`` in the exact real layout.

Optional:

``train_records(table, cfg, seed) -> tf.data.Dataset``
    An endless stream of training records sampled in the graph (LFW draws
    fresh pairs each epoch); when absent the table's rows are shuffled and
    repeated.
``protocol_metrics(table, scores) -> dict``
    Extra evaluation numbers that the dataset's official protocol defines.
"""
from data import chest_xray
from data import imagenet_det
from data import lfw_pairs

DATASETS = {
    "chest_xray": chest_xray,
    "imagenet_det": imagenet_det,
    "lfw_pairs": lfw_pairs,
}
