"""Labeled Faces in the Wild (LFW): are two face photos of the same person?

Reads the release layout: images at ``lfw/<Name>/<Name>_0001.jpg`` (or the
``lfw_funneled/`` and ``lfw-deepfunneled/`` variants) and the protocol files
``pairs.txt`` (View 2: ten person-disjoint folds) and ``pairsDevTest.txt``
(View 1). In the pairs files image numbers are not zero-padded (``Zico 1 2``);
in file names they are padded to four digits.

Evaluation uses the fixed protocol pairs. Training draws fresh balanced pairs
every step, in the graph, from every person of the image tree who is not in the
evaluation pairs, so no evaluation person is ever seen in training.
"""
import logging
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf
from sklearn.metrics import roc_curve

from tf_harness.data.errors import ConfigError, DatasetError
from tf_harness.data.folders import is_folder
from tf_harness.data.image_table import stateless_uniforms
from tf_harness.data.integrity import reading
from tf_harness.data.integrity.text_files import read_text
from tf_harness.data.samples.lfw_pairs import make_sample
from tf_harness.data.spec import DatasetSpec
from tf_harness.data.task import Task

log = logging.getLogger(__name__)

SPEC = DatasetSpec(name="lfw_pairs", task="binary", class_names=("same",), channels=3)

# The release tarballs: original, funneled (Huang et al. 2007) and deep-funneled (Huang et al. 2012).
IMAGE_FOLDERS = ("lfw", "lfw_funneled", "lfw-deepfunneled")
EVAL_PAIRS = {"dev_test": "pairsDevTest.txt", "pairs": "pairs.txt"}
_IMAGE_NAME = re.compile(r"(.+)_(\d+)\.jpg")


def find_image_folder(root: Path) -> Path:
    """The image tree under `root`: the first of IMAGE_FOLDERS present (also nested, as Kaggle ships it)."""
    for name in IMAGE_FOLDERS:
        for folder in (root / name / name, root / name):
            if folder.is_dir():
                return folder
    if root.name in IMAGE_FOLDERS:
        return root
    raise DatasetError(f"no {'/, '.join(IMAGE_FOLDERS)}/ image folder under {root}")


def list_images(folder: Path) -> dict:
    """Maps (name, image number) to the file path, for every ``<Name>/<Name>_NNNN.jpg`` in `folder`."""
    found = {}
    for person in os.scandir(folder):
        if not is_folder(person):  # a symbolic link that cannot be followed (to itself, a loop) is logged
            continue
        for entry in os.scandir(person.path):
            match = _IMAGE_NAME.fullmatch(entry.name)
            if match and match.group(1) == person.name:
                found[(person.name, int(match.group(2)))] = entry.path
    return found


def _malformed(path, line_number, why):
    return DatasetError(f"{path}:{line_number}: {why}")


def read_pairs(path) -> pd.DataFrame:
    """Parses a pairs file into one row per pair: name_a, number_a, name_b, number_b, label, fold, line.

    The header is ``<pairs per class>`` (the dev files) or ``<folds>\\t<pairs per class>``
    (pairs.txt); each fold holds that many same-person lines ``name n1 n2`` and
    different-person lines ``name1 n1 name2 n2``.

    Raises:
        DatasetError: naming the file and line, for a line that is not a pair,
            a header that does not match the number of pairs, or bytes that are
            not UTF-8 text; naming the file, for one that cannot be read.
    """
    lines = read_text(path, "restore it from the LFW release").splitlines()
    if not lines:
        raise DatasetError(f"{path} is empty; expected a header line such as '10\\t300'")
    header = lines[0].split()
    if len(header) not in (1, 2) or not all(field.isdigit() for field in header):
        raise _malformed(path, 1, f"expected a header '<pairs>' or '<folds>\\t<pairs>', got {lines[0]!r}")
    folds, per_class = (1, int(header[0])) if len(header) == 1 else (int(header[0]), int(header[1]))
    per_fold = 2 * per_class
    rows = []
    for line_number, line in enumerate(lines[1:], start=2):
        fields = line.split()
        if not fields:
            continue  # a trailing empty line is harmless
        if len(fields) == 3:
            name_a, number_a, number_b = fields
            name_b = name_a
        elif len(fields) == 4:
            name_a, number_a, name_b, number_b = fields
        else:
            raise _malformed(path, line_number, f"expected 'name\\tn1\\tn2' or 'name1\\tn1\\tname2\\tn2', got {line!r}")
        if not (number_a.isdigit() and number_b.isdigit()):
            raise _malformed(path, line_number, f"image numbers must be integers, got {line!r}")
        rows.append((name_a, int(number_a), name_b, int(number_b), int(len(fields) == 3),
                     len(rows) // per_fold, line_number))
    if len(rows) != folds * per_fold:
        raise _malformed(path, 1, f"header {lines[0]!r} promises {folds * per_fold} pairs, found {len(rows)}")
    return pd.DataFrame(rows, columns=["name_a", "number_a", "name_b", "number_b", "label", "fold", "line"])


def _find_pairs_file(root: Path, folder: Path, name: str) -> Path:
    candidates = (root / name, folder.parent / name, folder / name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    fix = f"restore {name} from the LFW release"
    for candidate in candidates:
        if candidate.is_dir():
            raise DatasetError(f"{candidate} is a directory, not a regular file; {fix}")
        try:
            reading.check(candidate)
        except reading.SpecialFileError as error:
            raise DatasetError(f"{error}; {fix}") from None
    raise DatasetError(f"{name} not found in {root}; it is needed for the evaluation pairs (dataset.eval_pairs)")


def evaluation_pairs(which: str, fold, root: Path, folder: Path) -> pd.DataFrame:
    """The protocol pairs that dataset.eval_pairs (`which`) and dataset.fold select."""
    if which not in EVAL_PAIRS:
        raise ConfigError(f"dataset.eval_pairs={which} is not one of {'|'.join(EVAL_PAIRS)}")
    path = _find_pairs_file(root, folder, EVAL_PAIRS[which])
    pairs = read_pairs(path)
    pairs["file"] = path.name
    if which == "pairs" and fold is not None:
        folds = pairs.fold.nunique()
        if not 0 <= fold < folds:
            raise ConfigError(f"dataset.fold={fold} must be null (all folds) or 0..{folds - 1}")
        pairs = pairs[pairs.fold == fold]
    return pairs


def best_threshold(scores, labels) -> float:
    """The threshold t maximising the accuracy of predicting `same` when score >= t."""
    false_positive_rate, true_positive_rate, thresholds = roc_curve(labels, scores, drop_intermediate=False)
    positives = np.sum(labels == 1)
    negatives = len(labels) - positives
    correct = true_positive_rate * positives + (1 - false_positive_rate) * negatives
    return thresholds[np.argmax(correct)]


def _with_paths(pairs, files, folder, skipped) -> pd.DataFrame:
    """`pairs` with path_a and path_b from `files`; a pair naming a missing image is skipped."""
    pairs = pairs.copy()
    pairs["path_a"] = [files.get(key) for key in zip(pairs.name_a, pairs.number_a)]
    pairs["path_b"] = [files.get(key) for key in zip(pairs.name_b, pairs.number_b)]
    missing = pairs.path_a.isna() | pairs.path_b.isna()
    for pair in pairs[missing].itertuples():
        name, number = (pair.name_a, pair.number_a) if pd.isna(pair.path_a) else (pair.name_b, pair.number_b)
        skipped.add(folder / name / f"{name}_{number:04d}.jpg", f"missing image: {pair.file} line {pair.line}")
    return pairs[~missing].reset_index(drop=True)


class LfwPairs(Task):
    """LFW face verification; options: ``eval_pairs`` (dev_test|pairs) and ``fold``."""

    SPEC = SPEC
    DRAWS_TRAINING_RECORDS = True
    IDENTITIES = ("person", "person", ("name_a", "name_b"))
    make_sample = staticmethod(make_sample)

    def index(self, root, skipped) -> dict:
        """The evaluation pairs (``validation``) and the images of every other person (``train``).

        ``validation`` has path_a, path_b, label (1: same person) and fold; a pair
        naming a missing image is skipped. ``train`` has one row per image: person
        and path; `train_records` draws pairs from it.
        """
        root = Path(root)
        folder = find_image_folder(root)
        files = list_images(folder)
        if not files:
            raise DatasetError(f"no <Name>/<Name>_NNNN.jpg images in {folder}")
        which, fold = self.options["eval_pairs"], self.options["fold"]
        pairs = evaluation_pairs(which, fold, root, folder)
        validation = _with_paths(pairs, files, folder, skipped)

        # Everyone named by the evaluation pairs, skipped lines included, stays out of training.
        held_out = set(pairs.name_a) | set(pairs.name_b)
        train = pd.DataFrame(sorted((name, path) for (name, _), path in files.items() if name not in held_out),
                             columns=["person", "path"])
        log.info("LFW images from %s: %d training people (%d images); %d evaluation pairs of %d people",
                 folder, train.person.nunique(), len(train), len(validation), len(held_out))
        columns = ["path_a", "path_b", "label", "fold", "name_a", "name_b"]
        tables = {"train": train, "validation": validation[columns]}
        if any((place / EVAL_PAIRS["pairs"]).is_file() for place in (root, folder.parent, folder)):
            # The test split: View 2, all ten folds, as the protocol reports it.
            test = validation if (which, fold) == ("pairs", None) else \
                _with_paths(evaluation_pairs("pairs", None, root, folder), files, folder, skipped)
            seen = (set(test.name_a) | set(test.name_b)) & set(train.person)
            if seen:
                log.info("%d of the %d people of View 2 (pairs.txt, the test split) are among the training people "
                         "(dataset.eval_pairs=%s holds out only its own); training with dataset.eval_pairs=pairs "
                         "holds them all out", len(seen), len(set(test.name_a) | set(test.name_b)), which)
            tables["test"] = test[columns]
        return tables

    @staticmethod
    def training_images(table) -> pd.DataFrame:
        """The training table in the order the draws index it: by person, then path (row i is image i)."""
        return table.sort_values(["person", "path"]).reset_index(drop=True)

    @staticmethod
    def _pair_draw(table, seed):
        """The draw: (i, u) -> (row_a, row_b, label) of element(s) i, rows of `training_images(table)`, from u,
        their four uniforms ([..., 4] float64 in [0, 1), drawn by (seed, i)); graph ops, elementwise over i."""
        counts = table.groupby("person", sort=True).size()
        if len(counts) < 2 or (counts >= 2).sum() == 0:
            raise DatasetError(f"training needs two people and one person with two images; the images tree "
                               f"left {len(counts)} people outside the evaluation pairs")
        starts = tf.constant(np.concatenate([[0], np.cumsum(counts.to_numpy())[:-1]]), tf.int64)
        counts_t = tf.constant(counts.to_numpy(), tf.int64)
        with_two = tf.constant(np.flatnonzero(counts.to_numpy() >= 2), tf.int64)
        people = tf.constant(len(counts), tf.int64)

        def draw(u, n):
            """An integer in [0, n) from a uniform u in [0, 1)."""
            return tf.minimum(tf.cast(tf.floor(u * tf.cast(n, tf.float64)), tf.int64), n - 1)

        def image(person, u):
            return tf.gather(starts, person) + draw(u, tf.gather(counts_t, person))

        def pair(i, u):
            same = tf.equal(i % 2, 0)
            # Same person: one person with two or more images, two distinct images of theirs.
            person = tf.gather(with_two, draw(u[..., 0], tf.size(with_two, out_type=tf.int64)))
            count = tf.gather(counts_t, person)
            first = draw(u[..., 1], count)
            second = draw(u[..., 2], count - 1)
            second += tf.cast(second >= first, tf.int64)  # skip `first`, so the two images differ
            same_a, same_b = tf.gather(starts, person) + first, tf.gather(starts, person) + second
            # Different people: two distinct people, any image of each.
            person_a = draw(u[..., 0], people)
            person_b = draw(u[..., 1], people - 1)
            person_b += tf.cast(person_b >= person_a, tf.int64)
            different_a, different_b = image(person_a, u[..., 2]), image(person_b, u[..., 3])
            return tf.where(same, same_a, different_a), tf.where(same, same_b, different_b), tf.cast(same, tf.int64)

        return pair

    def train_records(self, table, seed) -> tf.data.Dataset:
        """An endless stream of balanced training pairs {path_a, path_b, label}, drawn in the graph.

        Element i is a same-person pair when i is even and a different-person pair
        when odd, so every even batch is exactly balanced. Its random draws are
        stateless ops seeded by (seed, i): the stream depends only on the seed, and
        an iterator checkpoint is just the counter. `train_draws` draws the same
        pairs as rows of the training images, a batch at a time.
        """
        table = self.training_images(table)
        pair = self._pair_draw(table, seed)
        paths = tf.constant(table.path.to_numpy(dtype=str))

        def paths_of(i):
            u = tf.random.stateless_uniform([4], seed=tf.stack([tf.constant(seed, tf.int64), i]), dtype=tf.float64)
            row_a, row_b, label = pair(i, u)
            return {"path_a": tf.gather(paths, row_a), "path_b": tf.gather(paths, row_b), "label": label}

        # Graph ops only: nothing for AutoGraph to convert.
        return tf.data.Dataset.counter().map(tf.autograph.experimental.do_not_convert(paths_of))

    def train_draws(self, table, seed, batch) -> tf.data.Dataset:
        """`train_records`' pairs, `batch` at a time, as rows of `training_images(table)`: an endless stream
        of {row_a, row_b, label}, each [batch], whose element k holds pairs k * batch ... (k + 1) * batch - 1.

        One element per batch, its draws computed together (image_table.stateless_uniforms: the numbers
        tf.random.stateless_uniform draws for each (seed, i)), costs a small fraction of a pair's own
        element in tf.data; an iterator checkpoint is still just the counter (of batches).
        """
        pair = self._pair_draw(self.training_images(table), seed)

        def rows(k):
            i = k * batch + tf.range(batch, dtype=tf.int64)
            row_a, row_b, label = pair(i, stateless_uniforms(seed, i, 4))
            return {"row_a": row_a, "row_b": row_b, "label": label}

        return tf.data.Dataset.counter().map(tf.autograph.experimental.do_not_convert(rows))

    def load(self, record):
        """Reads both faces as RGB uint8 (grayscale JPEGs too), centre-cropped and resized, and the label."""
        images = (self.read_image(record["path_a"]), self.read_image(record["path_b"]))
        return images, tf.reshape(tf.cast(record["label"], tf.float32), [1])

    def load_drawn(self, record, images):
        """A batch of `train_draws` as `load` gives each pair, batched: its faces gathered from `images`, the
        training images decoded by `read_image` in `training_images` order (data/image_table.py)."""
        faces = (tf.gather(images, record["row_a"]), tf.gather(images, record["row_b"]))
        return faces, tf.expand_dims(tf.cast(record["label"], tf.float32), -1)

    def protocol_metrics(self, table, scores) -> dict:
        """LFW's protocol accuracy: with several folds, each fold's accuracy at the threshold chosen on the other
        folds, their mean and standard deviation as `ten_fold_accuracy_mean`/`_std` (ddof=1, as the LFW README
        defines it). The verification rates (`eer`, `tar_at_far_*`) are the protocol's declared metrics
        (experiments/evaluation/metrics.py `PROTOCOLS`)."""
        folds, labels, scores = table.fold.to_numpy(), table.label.to_numpy(), np.asarray(scores).reshape(-1)
        if len(np.unique(folds)) < 2:
            return {}
        accuracies = []
        for fold in np.unique(folds):
            test = folds == fold
            threshold = best_threshold(scores[~test], labels[~test])
            accuracies.append(np.mean((scores[test] >= threshold) == labels[test]))
        prefix = "ten_fold" if len(accuracies) == 10 else f"{len(accuracies)}_fold"
        return {f"{prefix}_accuracy_mean": float(np.mean(accuracies)),
                f"{prefix}_accuracy_std": float(np.std(accuracies, ddof=1))}
