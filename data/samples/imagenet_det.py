"""A miniature ILSVRC DET tree, in the real release layout and XML schema.

Writes under ``root/ILSVRC``::

    Data/DET/train/ILSVRC2013_train/<wnid>/<wnid>_<n>.JPEG     one object of the folder's class
    Data/DET/train/ILSVRC2013_train_extra{0,1}/...JPEG           negatives, no XML
    Data/DET/train/ILSVRC2014_train_000{0,1}/...JPEG             several objects per image
    Data/DET/val/ILSVRC2013_val_<n>.JPEG
    Annotations/DET/{train,val}/<same relative path>.xml

It covers the quirks the reader must handle: XMLs whose children come in
another order, XMLs with no object, boxes running past the image edge, a
largest object whose WNID is outside the 200 DET synsets, a grayscale JPEG, a
CMYK JPEG, a PNG named ``.JPEG`` and one malformed XML. The signal: each DET
object is a rectangle in its class's colour on a grey, grainy scene, and an
image's label is its largest box, so a network can learn it from a few hundred
images.
"""
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
from PIL import Image

from tf_harness.data.integrity import writing
from tf_harness.data.samples import parallel_map

# Ten real DET synsets, each drawn in a colour of its own.
CLASSES = {
    "n02691156": (230, 30, 30),    # airplane: red
    "n07739125": (30, 200, 40),    # apple: green
    "n07753592": (40, 60, 235),    # banana: blue
    "n02834778": (235, 220, 30),   # bicycle: yellow
    "n02924116": (220, 40, 220),   # bus: magenta
    "n02958343": (30, 215, 225),   # car: cyan
    "n02084071": (245, 140, 20),   # dog: orange
    "n02503517": (130, 40, 200),   # elephant: purple
    "n03467517": (20, 20, 20),     # guitar: black
    "n02391049": (250, 250, 250),  # zebra: white
}
# 'wing', an ILSVRC CLS-LOC synset that is not one of the 200 DET synsets; drawn as a dark checkerboard.
OUTSIDE_WNID = "n04592741"
TRAIN_2013_PER_CLASS = 26
EMPTY_2013_PER_CLASS = 2
TRAIN_2014_FOLDERS = ("ILSVRC2014_train_0000", "ILSVRC2014_train_0001")
TRAIN_2014_PER_FOLDER = 40
EXTRA_FOLDERS = ("ILSVRC2013_train_extra0", "ILSVRC2013_train_extra1")
NEGATIVES_PER_FOLDER = 15
VALIDATION_IMAGES = 120


def _scene(rng, width, height) -> np.ndarray:
    """A grey scene of coarse blotches and film grain, with no saturated colour."""
    coarse = rng.uniform(60, 190, (8, 8, 1)) + rng.uniform(-12, 12, (8, 8, 3))
    scene = np.asarray(Image.fromarray(np.clip(coarse, 0, 255).astype(np.uint8)).resize(
        (width, height), Image.BILINEAR), np.float32)
    return scene + 10 * rng.standard_normal((height, width, 1), np.float32)


def _paint(pixels, rng, wnid, box) -> None:
    """Draws an object's look into its box, clipped to the image."""
    height, width = pixels.shape[:2]
    xmin, ymin, xmax, ymax = box
    region = pixels[max(ymin, 0):min(ymax, height), max(xmin, 0):min(xmax, width)]
    if wnid in CLASSES:
        region[:] = np.asarray(CLASSES[wnid], np.float32) * rng.uniform(0.75, 1.0)
    else:
        y, x = np.indices(region.shape[:2])
        region[:] = np.where(((x // 12 + y // 12) % 2)[..., None] == 1, 40.0, 110.0)
    region += 12 * rng.standard_normal(region.shape[:2] + (1,), np.float32)


def _box(rng, width, height, fraction) -> tuple:
    """A box covering `fraction` (low, high) of each side, somewhere inside the image."""
    box_width = int(width * rng.uniform(*fraction))
    box_height = int(height * rng.uniform(*fraction))
    xmin = int(rng.integers(0, width - box_width + 1))
    ymin = int(rng.integers(0, height - box_height + 1))
    return xmin, ymin, xmin + box_width, ymin + box_height


def _past_edge(box, width, height) -> tuple:
    """The same box, declared as running past the right and bottom edges (as some real boxes do)."""
    xmin, ymin, xmax, ymax = box
    return xmin, ymin, max(xmax, width - 10) + 37, max(ymax, height - 10) + 23


def _objects(rng, width, height, largest_wnid, others) -> list:
    """The largest object and `others` small enough never to be the largest, in a random order."""
    objects = [(largest_wnid, _box(rng, width, height, (0.45, 0.7)))]
    if rng.random() < 0.2:
        objects[0] = (largest_wnid, _past_edge(objects[0][1], width, height))
    objects += [(wnid, _box(rng, width, height, (0.12, 0.25))) for wnid in others]
    return [objects[i] for i in rng.permutation(len(objects))]


def _visible_area(box, width, height) -> int:
    xmin, ymin, xmax, ymax = box
    return max(min(xmax, width) - max(xmin, 0), 0) * max(min(ymax, height) - max(ymin, 0), 0)


def _xml(folder, filename, width, height, objects, reordered) -> bytes:
    """An annotation in the ILSVRC schema; `reordered` changes the children's order, as some files do."""
    def element(tag, children=(), text=None):
        made = ElementTree.Element(tag)
        made.text = text
        made.extend(children)
        return made

    def number(tag, value):
        return element(tag, text=str(value))

    size = [number("width", width), number("height", height)]
    objects = [[element("name", text=wnid), element("bndbox", [number("xmin", xmin), number("xmax", xmax),
                                                               number("ymin", ymin), number("ymax", ymax)])]
               for wnid, (xmin, ymin, xmax, ymax) in objects]
    header = [element("folder", text=folder), element("filename", text=filename),
              element("source", [element("database", text="ILSVRC_2014")])]
    if reordered:
        size.reverse()
        for name, bndbox in objects:
            bndbox[:] = reversed(list(bndbox))
        objects = [[bndbox, name] for name, bndbox in objects]
        children = [*(element("object", parts) for parts in objects), element("size", size), *header]
    else:
        children = [*header, element("size", size), *(element("object", parts) for parts in objects)]
    annotation = element("annotation", children)
    ElementTree.indent(annotation, space="\t")
    return (ElementTree.tostring(annotation, encoding="unicode") + "\n").encode()


def _write(job) -> None:
    image_path, xml_path, seed, objects, size, encoding, xml = job
    rng = np.random.default_rng(seed)
    width, height = size
    pixels = _scene(rng, width, height)
    # The largest object is painted last, so the label's colour is never hidden under another object.
    for wnid, box in sorted(objects, key=lambda obj: _visible_area(obj[1], width, height)):
        _paint(pixels, rng, wnid, box)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    image_path.parent.mkdir(parents=True, exist_ok=True)
    with writing.replacing(image_path, "wb") as file:
        if encoding == "png":
            image.save(file, format="PNG")  # a PNG under a .JPEG name, as a few real files are
        else:
            mode = {"gray": "L", "cmyk": "CMYK"}.get(encoding, "RGB")
            image.convert(mode).save(file, format="JPEG", quality=90)
    if xml is not None:
        xml_path.parent.mkdir(parents=True, exist_ok=True)
        writing.write_bytes(xml_path, xml)


def make_sample(root, seed: int = 0) -> None:
    """Writes the sample into `root/ILSVRC`, the same for the same `seed`."""
    ilsvrc = Path(root) / "ILSVRC"
    rng = np.random.default_rng(seed)
    wnids = list(CLASSES)
    jobs = []

    def add(split, folder, stem, objects_of=None, encoding="jpeg", xml="normal"):
        """Queues one image; objects_of(width, height) gives its objects, None for a negative without XML."""
        width, height = 2 * int(rng.integers(170, 251)), 2 * int(rng.integers(150, 221))
        objects = objects_of(width, height) if objects_of else []
        relative = Path(split) / folder / stem if folder else Path(split) / stem
        annotation = None
        if objects_of is not None:
            reordered = rng.random() < 0.25
            annotation = _xml(Path(folder or split).name, stem, width, height, objects, reordered)
            if xml == "malformed":
                annotation = annotation[:len(annotation) // 2]  # cut off mid-file, as an interrupted copy is
        jobs.append((ilsvrc / "Data" / "DET" / relative.with_suffix(".JPEG"),
                     ilsvrc / "Annotations" / "DET" / relative.with_suffix(".xml"),
                     int(rng.integers(2**31)), objects, (width, height), encoding, annotation))

    def mixed(width, height):
        """One to three objects, sometimes none, sometimes a largest one outside the 200 synsets."""
        draw = rng.random()
        if draw < 0.08:
            return []
        largest = OUTSIDE_WNID if draw < 0.14 else wnids[int(rng.integers(len(wnids)))]
        others = [wnids[int(rng.integers(len(wnids)))] for _ in range(int(rng.integers(0, 3)))]
        objects = _objects(rng, width, height, largest, others)
        if rng.random() < 0.15:
            # Declared larger than the largest object, but mostly outside the image: clipped, it is small.
            objects.append((wnids[int(rng.integers(len(wnids)))], (width - 30, 10, width + 600, height - 10)))
        return objects

    for k, wnid in enumerate(wnids):
        for n in range(TRAIN_2013_PER_CLASS):
            encoding = "gray" if (k, n) == (0, 0) else "jpeg"
            add("train", f"ILSVRC2013_train/{wnid}", f"{wnid}_{1000 + n}",
                lambda w, h, wnid=wnid: _objects(rng, w, h, wnid, []), encoding)
        for n in range(EMPTY_2013_PER_CLASS):
            add("train", f"ILSVRC2013_train/{wnid}", f"{wnid}_{9000 + n}", lambda w, h: [])
    number = 0
    for folder in TRAIN_2014_FOLDERS:
        for _ in range(TRAIN_2014_PER_FOLDER):
            number += 1
            add("train", folder, f"ILSVRC2014_train_{number:08d}", mixed,
                encoding="cmyk" if number == 1 else "jpeg", xml="malformed" if number == 2 else "normal")
    number = 0
    for folder in EXTRA_FOLDERS:
        for _ in range(NEGATIVES_PER_FOLDER):
            number += 1
            add("train", folder, f"ILSVRC2013_train_{number:08d}")
    for number in range(1, VALIDATION_IMAGES + 1):
        add("val", None, f"ILSVRC2013_val_{number:08d}", mixed, encoding="png" if number == 1 else "jpeg")
    parallel_map(_write, jobs)
