"""ILSVRC DET as single-object classification: the class of an image's largest box.

Reads the real ILSVRC tree under ``root`` (``root/ILSVRC`` or ``root`` itself)::

    Data/DET/{train,val}/.../*.JPEG          images
    Annotations/DET/{train,val}/.../*.xml    PASCAL-VOC-style boxes, same relative path

Training images sit in ``ILSVRC2013_train/<wnid>/``, ``ILSVRC2013_train_extra*/``
(negatives, which have no XML) and ``ILSVRC2014_train_000*/``. The label is the
index, in devkit order, of the largest box's synset among the 200 DET synsets, or
``BACKGROUND`` (200) when an image has no XML, no objects, or a largest object of
another synset. Every XML is parsed once; the index is cached under
``cache_home()/index`` and rebuilt only when a file in the tree changes. A warm
start compares the tree's folder mtimes only (`_unchanged_index`).
"""
import hashlib
import logging
import os
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pandas as pd
import tensorflow as tf
from tqdm import tqdm

from tf_harness.data.errors import DatasetError
from tf_harness.data.folders import is_folder
from tf_harness.data.integrity import pickle_cache, reading
from tf_harness.data.integrity.cache_folder import cache_home
from tf_harness.data.samples.imagenet_det import make_sample
from tf_harness.data.spec import DatasetSpec
from tf_harness.data.task import Task

log = logging.getLogger(__name__)

# The devkit's map_det.txt (``wnid index name``), copied so the package needs nothing outside it.
SYNSETS_FILE = Path(__file__).with_name("imagenet_det_synsets.txt")
# Folders under Data/DET and Annotations/DET, by split name.
SPLIT_FOLDERS = {"train": "train", "validation": "val"}
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
# Bump when the index's content changes, so cached indexes are rebuilt.
INDEX_VERSION = 1
# What the caches are written with, and read back only for (data/integrity/pickle_cache.py): another pickle in
# their place is made again, never looked into.
_FOLDERS_KEY, _INDEX_KEY = ("imagenet_det folders", INDEX_VERSION), ("imagenet_det index", INDEX_VERSION)
# Below this many XMLs a progress bar is noise.
_PROGRESS_MIN = 2000


def read_synsets(path=SYNSETS_FILE) -> list:
    """(wnid, name) pairs in devkit order, from a ``map_det.txt`` of ``wnid index name`` lines."""
    synsets = []
    for number, line in enumerate(reading.read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        wnid, position, name = line.split(maxsplit=2)
        if int(position) != len(synsets) + 1:
            raise DatasetError(f"{path}:{number}: index {position} out of order; expected {len(synsets) + 1}")
        synsets.append((wnid, name.strip()))
    return synsets


SYNSETS = read_synsets()
WNIDS = tuple(wnid for wnid, _ in SYNSETS)
BACKGROUND = len(WNIDS)
_LABEL_OF_WNID = {wnid: label for label, wnid in enumerate(WNIDS)}
SPEC = DatasetSpec(name="imagenet_det", task="multiclass",
                   class_names=tuple(name for _, name in SYNSETS) + ("background",), channels=3)


def parse_annotation(path):
    """Reads one ILSVRC XML into (width, height, objects), objects as (wnid, xmin, ymin, xmax, ymax).

    Children are looked up by tag, since their order differs between files.

    Raises:
        ElementTree.ParseError: the file is not well-formed XML.
        ValueError: a size, name or box coordinate is missing or not a number.
    """
    with reading.open_file(path, "rb") as file:
        annotation = ElementTree.parse(file).getroot()
    width, height = _number(annotation, "size/width"), _number(annotation, "size/height")
    if width <= 0 or height <= 0:
        raise ValueError(f"image size {width}x{height}")
    objects = []
    for element in annotation.findall("object"):
        wnid = (element.findtext("name") or "").strip()
        if not wnid:
            raise ValueError("object without a name")
        objects.append((wnid, *(_number(element, f"bndbox/{tag}") for tag in ("xmin", "ymin", "xmax", "ymax"))))
    return width, height, objects


def _number(element, tag) -> float:
    text = element.findtext(tag)
    if text is None:
        raise ValueError(f"no <{tag}>")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"<{tag}> is {text.strip()!r}, not a number") from None


def largest_object_label(width, height, objects) -> int:
    """The label of the object with the largest box inside the image; BACKGROUND if none.

    Boxes may run past the image edge, so only their visible part counts. A tie
    goes to the object listed first.
    """
    label, largest = BACKGROUND, 0.0
    for wnid, xmin, ymin, xmax, ymax in objects:
        visible_width = min(xmax, width) - max(xmin, 0.0)
        visible_height = min(ymax, height) - max(ymin, 0.0)
        area = max(visible_width, 0.0) * max(visible_height, 0.0)
        if area > largest:
            label, largest = _LABEL_OF_WNID.get(wnid, BACKGROUND), area
    return label


def _find_ilsvrc(root) -> Path:
    root = Path(root)
    for candidate in (root / "ILSVRC", root):
        if (candidate / "Data" / "DET").is_dir():
            return candidate
    raise DatasetError(f"no ILSVRC/Data/DET folder under {root}")


def _mtime(folder):
    try:
        return os.stat(folder).st_mtime_ns
    except FileNotFoundError:
        return None


def _list_files(top: Path, suffixes, folders: dict) -> list:
    """Sorted (relative path, size, mtime) of the files under `top` whose suffix is in `suffixes`; each folder's
    mtime, taken before it is listed, goes into `folders`."""
    found, pending, seen = [], [str(top)], set()
    while pending:
        folder = pending.pop()
        folders[folder] = _mtime(folder)
        if folders[folder] is None:
            continue
        stat = os.stat(folder)  # a symbolic link back to a folder listed already (a loop) is skipped, and logged
        if (stat.st_dev, stat.st_ino) in seen:
            log.warning("Skipped %s: it leads to %s, listed already (a symbolic link loop, or a second link)", folder,
                        os.path.realpath(folder))
            continue
        seen.add((stat.st_dev, stat.st_ino))
        with os.scandir(folder) as entries:
            for entry in entries:
                if is_folder(entry):
                    pending.append(entry.path)
                elif entry.name.lower().endswith(suffixes):
                    stat = entry.stat()
                    found.append((os.path.relpath(entry.path, top), stat.st_size, stat.st_mtime_ns))
    return sorted(found)


def _folders_file(ilsvrc: Path) -> Path:
    """Where the tree's folder mtimes are kept, with the name of the index they were taken for."""
    digest = hashlib.sha256(repr((INDEX_VERSION, str(ilsvrc.resolve()))).encode()).hexdigest()[:20]
    return cache_home() / "index" / f"imagenet_det-folders-{digest}.pkl"


def _unchanged_index(ilsvrc: Path):
    """The cached index when no folder of the tree changed since it was made, else None.

    Adding, removing or renaming a file changes its folder's mtime, so a warm start reads a few
    hundred folder mtimes instead of listing and hashing every file (docs/input-pipeline.md). A file
    rewritten in place keeps its folder's mtime: `touch` the folder to have it re-indexed.
    """
    saved = pickle_cache.read(_folders_file(ilsvrc), key=_FOLDERS_KEY)
    if saved is None or any(_mtime(folder) != mtime for folder, mtime in saved["folders"].items()):
        return None
    cache = Path(saved["index"])
    index = pickle_cache.read(cache, key=_INDEX_KEY)
    return None if index is None else (index, cache)


def _cache_file(ilsvrc: Path, listings: dict) -> Path:
    """The index cache for this exact tree: any added, removed or rewritten file changes the name."""
    digest = hashlib.sha256(repr((INDEX_VERSION, str(ilsvrc.resolve()), WNIDS)).encode())
    for split in sorted(listings):
        for listing in listings[split]:
            digest.update(repr((split, listing)).encode())
    return cache_home() / "index" / f"imagenet_det-{digest.hexdigest()[:20]}.pkl"


def _index_split(image_dir: Path, annotation_dir: Path, image_files: list, xml_files: list):
    """Parses a split's XMLs into a (path, label) table and the (path, reason) rows it skipped."""
    xml_by_stem = {os.path.splitext(relative)[0]: relative for relative, _, _ in xml_files}
    rows, skipped = [], []
    progress = tqdm(image_files, desc=f"Indexing {image_dir}", unit="image",
                    disable=len(xml_files) < _PROGRESS_MIN)
    for relative, _, _ in progress:
        xml_relative = xml_by_stem.get(os.path.splitext(relative)[0])
        if xml_relative is None:
            label = BACKGROUND  # negatives (ILSVRC2013_train_extra*) come without an XML
        else:
            xml_path = annotation_dir / xml_relative
            try:
                label = largest_object_label(*parse_annotation(xml_path))
            except (ElementTree.ParseError, ValueError, OSError) as error:
                skipped.append((str(xml_path), f"malformed XML: {error}"))
                continue
        rows.append((str(image_dir / relative), label))
    table = pd.DataFrame(rows, columns=["path", "label"]).astype({"label": "int64"})
    return table, skipped


def _build_index(ilsvrc: Path, listings: dict) -> dict:
    tables, skipped = {}, []
    for split, folder in SPLIT_FOLDERS.items():
        image_files, xml_files = listings[split]
        tables[split], split_skipped = _index_split(ilsvrc / "Data" / "DET" / folder,
                                                    ilsvrc / "Annotations" / "DET" / folder, image_files, xml_files)
        skipped.extend(split_skipped)
    return {"tables": tables, "skipped": skipped}


class ImagenetDet(Task):
    """ILSVRC DET as the class of each image's largest object, or background; no options."""

    SPEC = SPEC
    make_sample = staticmethod(make_sample)

    def index(self, root, skipped) -> dict:
        """Tables of (path, label) for ``train`` (Data/DET/train) and ``validation`` (Data/DET/val).

        Malformed XMLs are listed in `skipped` and their images left out; that list is
        cached with the tables, so a reused index reports them too.
        """
        ilsvrc = _find_ilsvrc(root)
        for split, folder in SPLIT_FOLDERS.items():
            image_dir = ilsvrc / "Data" / "DET" / folder
            if not image_dir.is_dir():
                raise DatasetError(f"no {image_dir} folder; ImageNet DET needs Data/DET/train and Data/DET/val")
        unchanged = _unchanged_index(ilsvrc)
        if unchanged:
            cached, cache = unchanged
            log.info("Reusing the ImageNet DET index in %s (no folder changed)", cache)
        else:
            cached = self._index_tree(ilsvrc)
        for split, table in cached["tables"].items():
            if table.empty:
                raise DatasetError(f"no usable images in {ilsvrc / 'Data' / 'DET' / SPLIT_FOLDERS[split]}")
        skipped.extend(cached["skipped"])
        return cached["tables"]

    @staticmethod
    def _index_tree(ilsvrc: Path) -> dict:
        """Lists the tree and returns its index: the cached one when no file changed, else a new one."""
        listings, folders = {}, {}
        for split, folder in SPLIT_FOLDERS.items():
            listings[split] = (_list_files(ilsvrc / "Data" / "DET" / folder, IMAGE_SUFFIXES, folders),
                               _list_files(ilsvrc / "Annotations" / "DET" / folder, (".xml",), folders))
        cache = _cache_file(ilsvrc, listings)
        cached = pickle_cache.read(cache, key=_INDEX_KEY)
        if cached is not None:
            log.info("Reusing the ImageNet DET index in %s", cache)
        else:
            cached = _build_index(ilsvrc, listings)
            pickle_cache.write(cache, cached, key=_INDEX_KEY)
            log.info("Indexed ImageNet DET under %s into %s", ilsvrc, cache)
        pickle_cache.write(_folders_file(ilsvrc), {"folders": folders, "index": str(cache)}, key=_FOLDERS_KEY)
        return cached

    def load(self, record):
        """Reads one image as RGB uint8 (grayscale, CMYK and PNG-named-JPEG included) and its class index."""
        return self.read_image(record["path"]), tf.cast(record["label"], tf.int32)
