"""A small LFW look-alike, in the exact release layout.

Writes ``lfw/<Name>/<Name>_NNNN.jpg`` (250x250 JPEGs; one grayscale, as some
real LFW files are) and ``pairs.txt``, ``pairsDevTrain.txt`` and
``pairsDevTest.txt`` in the real formats, with smaller counts. Names have
hyphens, several parts or a single word, like the real ones, and a few people
have over 100 images so that 3-digit image numbers appear in the pairs files.

Each identity is a face-like ellipse in the middle of the frame whose skin and
hair colours and stripe orientation and period belong to that person; every
photo moves, scales and recolours it a little and adds a new background and
noise. A small siamese CNN learns to compare these cues, which carry over to
people it has never seen, as the person-disjoint evaluation requires.
"""
from pathlib import Path

import numpy as np
from PIL import Image

from tf_harness.data.integrity import writing
from tf_harness.data.samples import parallel_map

SIZE = 250
# People of the development split (View 1): training and test identities are disjoint.
DEV_TRAIN_PEOPLE = 44
DEV_TEST_PEOPLE = 22
# Per class: same-person and different-person lines in each file (the real files have 1100, 500 and 10x300).
DEV_TRAIN_PAIRS = 150
DEV_TEST_PAIRS = 100
FOLDS, FOLD_PAIRS = 10, 30
# People with over 100 photos (the real George_W_Bush has 530), so numbers reach 3 digits.
PROLIFIC = {"train": 2, "test": 1}
PROLIFIC_IMAGES = (101, 112)
# Most people have a handful of photos; some have just one, as in the real set.
IMAGES_PER_PERSON = (1, 10)

_FIRST = ("Ana", "Boris", "Carla", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kofi", "Lena",
          "Marco", "Nadia", "Omar", "Paula", "Quentin", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yara")
_LAST = ("Abbas", "Berg", "Costa", "Dalton", "Endo", "Fischer", "Garcia", "Haddad", "Ivanova", "Jensen", "Kim",
         "Lopez", "Moreau", "Novak", "Okafor", "Park", "Quinn", "Rossi", "Sato", "Tanaka", "Ueda", "Vargas")
_SINGLE = ("Zico", "Ronaldinho", "Madonna", "Pele", "Bono", "Shakira", "Xuxa", "Oprah")


def _names(rng, count):
    """Distinct LFW-style names: First_Last, hyphenated, three-part, or a single word."""
    names = []
    while len(names) < count:
        kind = rng.integers(6)
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        if kind == 0:
            name = str(rng.choice(_SINGLE))
        elif kind == 1:
            name = f"{first}-{rng.choice(_FIRST)}_{last}"
        elif kind == 2:
            name = f"{first}_{last}-{rng.choice(_LAST)}"
        elif kind == 3:
            name = f"{first}_{rng.choice(_FIRST)}_{last}"
        else:
            name = f"{first}_{last}"
        if name not in names:
            names.append(name)
    return names


def _identity(rng):
    return {"skin": rng.uniform(40, 220, 3), "hair": rng.uniform(20, 235, 3), "angle": rng.uniform(0, np.pi),
            "period": rng.uniform(9, 20)}


# Photos are drawn at half size and scaled up (a quarter of the pixels to compute); these are the
# drawn pixels' coordinates in full-size pixels.
_Y, _X = np.mgrid[0:SIZE:2, 0:SIZE:2].astype(np.float32) + 0.5


def _photo(identity, rng) -> np.ndarray:
    # A new place, background and lighting for every photo.
    background = rng.uniform(0, 255, 3).astype(np.float32) + np.multiply.outer(_X / SIZE, rng.uniform(-60, 60, 3))
    cy, cx = SIZE / 2 + rng.uniform(-8, 8, 2)
    scale = rng.uniform(0.92, 1.08)
    inside = ((_X - cx) / (46 * scale)) ** 2 + ((_Y - cy) / (58 * scale)) ** 2 <= 1
    hair = inside & (_Y < cy - 25 * scale)
    angle = identity["angle"] + rng.normal(0, 0.08)
    stripes = 30 * np.sin((2 * np.pi / identity["period"]) * ((_X - cx) * np.cos(angle) + (_Y - cy) * np.sin(angle)))
    face = (identity["skin"] + rng.normal(0, 8, 3)).astype(np.float32) + stripes[..., None]
    image = np.where(inside[..., None], face, background)
    image = np.where(hair[..., None], (identity["hair"] + rng.normal(0, 8, 3)).astype(np.float32), image)
    image += 10 * rng.standard_normal(image.shape, dtype=np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)


def _write(job):
    path, identity, seed, grayscale = job
    image = Image.fromarray(_photo(identity, np.random.default_rng(seed)), "RGB").resize((SIZE, SIZE), Image.BILINEAR)
    if grayscale:
        image = image.convert("L")
    with writing.replacing(path, "wb") as file:
        image.save(file, format="JPEG", quality=90)


def _pairs(rng, people, counts, per_class):
    """`per_class` same-person then different-person lines among `people`, without repeats where possible."""
    with_two = [p for p in people if counts[p] >= 2]
    available = sum(counts[p] * (counts[p] - 1) // 2 for p in with_two)
    same, different = [], []
    while len(same) < per_class:
        person = with_two[rng.integers(len(with_two))]
        a, b = sorted(rng.choice(counts[person], 2, replace=False) + 1)
        line = f"{person}\t{a}\t{b}"
        if line not in same or len(same) >= available:
            same.append(line)
    while len(different) < per_class:
        first, second = sorted(rng.choice(len(people), 2, replace=False))
        a, b = people[first], people[second]
        line = f"{a}\t{rng.integers(counts[a]) + 1}\t{b}\t{rng.integers(counts[b]) + 1}"
        if line not in different:
            different.append(line)
    return same + different


def make_sample(root, seed: int = 0) -> None:
    """Writes the sample into `root` (which must not exist yet)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    names = _names(rng, DEV_TRAIN_PEOPLE + DEV_TEST_PEOPLE)
    splits = {"train": sorted(names[:DEV_TRAIN_PEOPLE]), "test": sorted(names[DEV_TRAIN_PEOPLE:])}
    counts = {name: int(rng.integers(*IMAGES_PER_PERSON, endpoint=True)) for name in names}
    for split, how_many in PROLIFIC.items():
        for name in rng.choice(splits[split], how_many, replace=False):
            counts[name] = int(rng.integers(*PROLIFIC_IMAGES))

    jobs = []
    for name in names:
        identity = _identity(rng)
        (root / "lfw" / name).mkdir(parents=True)
        for number in range(1, counts[name] + 1):
            jobs.append([root / "lfw" / name / f"{name}_{number:04d}.jpg", identity, int(rng.integers(2**31)), False])
    # Real LFW has a few grayscale JPEGs; they must come out as 3 channels.
    next(job for job in jobs if counts[job[0].parent.name] >= 2)[3] = True
    parallel_map(_write, jobs)

    train = _pairs(rng, splits["train"], counts, DEV_TRAIN_PAIRS)
    test = _pairs(rng, splits["test"], counts, DEV_TEST_PAIRS)
    writing.write_text(root / "pairsDevTrain.txt", "\n".join([str(DEV_TRAIN_PAIRS), *train]) + "\n")
    writing.write_text(root / "pairsDevTest.txt", "\n".join([str(DEV_TEST_PAIRS), *test]) + "\n")
    # View 2: ten folds with no person in two of them.
    shuffled = [names[i] for i in rng.permutation(len(names))]
    folds = [_pairs(rng, sorted(shuffled[k::FOLDS]), counts, FOLD_PAIRS) for k in range(FOLDS)]
    writing.write_text(root / "pairs.txt", "\n".join([f"{FOLDS}\t{FOLD_PAIRS}", *sum(folds, [])]) + "\n")
