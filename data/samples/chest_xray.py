"""A small NIH ChestX-ray14 look-alike, in the exact release layout.

Writes ``images/*.png`` (1024x1024 8-bit grayscale, one RGBA like the real
``00000004_000.png``), ``Data_Entry_2017.csv`` with the real header, and the
patient-wise ``train_val_list.txt``/``test_list.txt``. Each present finding
adds a bright patch at a place of its own, a signal a network can learn from a
few hundred images.
"""
from pathlib import Path

import numpy as np
from PIL import Image

from tf_harness.data.integrity import writing
from tf_harness.data.samples import parallel_map

FINDINGS = ("Atelectasis", "Cardiomegaly", "Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia",
            "Pneumothorax", "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural_Thickening", "Hernia")
HEADER = ("Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,"
          "OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y],")
SIZE = 1024
PATIENTS = 120
FINDING_RATE = 0.2
TEST_FRACTION = 0.15
# Finding k brightens a 192px patch on a 4x4 grid, away from the image border.
_GRID = [(64 + 224 * (k // 4), 64 + 224 * (k % 4)) for k in range(len(FINDINGS))]
_PATCH = 192


def _background() -> np.ndarray:
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
    # Two dark lung fields on a brighter mediastinum, roughly where a PA film has them.
    lungs = np.exp(-(((x - 0.3) / 0.18) ** 2 + ((y - 0.5) / 0.3) ** 2)) + \
        np.exp(-(((x - 0.7) / 0.18) ** 2 + ((y - 0.5) / 0.3) ** 2))
    return 150 - 70 * lungs


def _image(background: np.ndarray, rng: np.random.Generator, labels) -> np.ndarray:
    # Coarse 4x4-pixel noise: film grain that survives downsizing and compresses like a real X-ray.
    noise = np.kron(rng.normal(0, 14, (SIZE // 4, SIZE // 4)).astype(np.float32), np.ones((4, 4), np.float32))
    image = background + noise
    for k, present in enumerate(labels):
        if present:
            top, left = _GRID[k]
            image[top:top + _PATCH, left:left + _PATCH] += 70
    return np.clip(image, 0, 255).astype(np.uint8)


def _write(job):
    path, background, seed, labels, rgba = job
    pixels = _image(background, np.random.default_rng(seed), labels)
    image = Image.fromarray(pixels, "L")
    if rgba:
        image = image.convert("RGBA")
    with writing.replacing(path, "wb") as file:
        image.save(file, format="PNG", compress_level=1)


def make_sample(root, seed: int = 0) -> None:
    """Writes the sample into `root` (which must not exist yet)."""
    root = Path(root)
    (root / "images").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    background = _background()
    rows, jobs, train_val, test = [], [], [], []
    test_patients = set(rng.choice(np.arange(1, PATIENTS + 1), int(PATIENTS * TEST_FRACTION), replace=False))
    for patient in range(1, PATIENTS + 1):
        age, sex, view = int(rng.integers(20, 80)), rng.choice(["M", "F"]), rng.choice(["PA", "AP"])
        for visit in range(int(rng.integers(1, 6))):
            name = f"{patient:08d}_{visit:03d}.png"
            labels = (rng.random(len(FINDINGS)) < FINDING_RATE).astype(int)
            findings = "|".join(f for f, on in zip(FINDINGS, labels) if on) or "No Finding"
            rows.append(f"{name},{findings},{visit},{patient},{age},{sex},{view},2500,2048,0.143,0.143")
            # The real release has RGBA files such as 00000004_000.png.
            jobs.append((root / "images" / name, background, int(rng.integers(2**31)), labels, name == "00000004_000.png"))
            (test if patient in test_patients else train_val).append(name)
    parallel_map(_write, jobs)
    writing.write_text(root / "Data_Entry_2017.csv", "\n".join([HEADER, *rows]) + "\n")
    writing.write_text(root / "train_val_list.txt", "\n".join(train_val))
    writing.write_text(root / "test_list.txt", "\n".join(test))
