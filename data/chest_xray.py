"""NIH ChestX-ray14: 14 findings per frontal chest X-ray, as a multi-hot label.

Reads every published layout of the metadata: the 2017 ``Data_Entry_2017.csv``
(header ends with a comma and has bracketed columns), the v2020 variant (a
trailing comma on every row, ``Patient Sex``) and Kaggle's ``sample_labels.csv``
(CRLF, ages like ``060Y``). Columns are taken by position, since the headers
disagree. Images may sit anywhere below the root (flat ``images/`` or Kaggle's
``images_001/images/`` ...).

Damaged metadata never loses or moves an image unseen: a PNG without a row in the CSV, a row cut short
at the end of the file, and (with the official lists) an image in neither list are each listed in
skipped.csv and counted against dataset.max_skipped_fraction; a file that cannot be read as text is a
DatasetError naming it.
"""
import csv
import hashlib
import io
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf
from sklearn.model_selection import GroupShuffleSplit

from tf_harness.data.errors import DatasetError
from tf_harness.data.folders import is_folder
from tf_harness.data.integrity import pickle_cache
from tf_harness.data.integrity.cache_folder import cache_home
from tf_harness.data.integrity.skipped import SkipLog
from tf_harness.data.integrity.text_files import read_text, unreadable
from tf_harness.data.samples.chest_xray import make_sample
from tf_harness.data.spec import DatasetSpec
from tf_harness.data.task import Task

log = logging.getLogger(__name__)

FINDINGS = ("Atelectasis", "Cardiomegaly", "Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia",
            "Pneumothorax", "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural_Thickening", "Hernia")
NO_FINDING = "No Finding"
SPEC = DatasetSpec(name="chest_xray", task="multilabel", class_names=FINDINGS, channels=1)

# Most specific first: when several are present the newest metadata wins.
METADATA_FILES = ("Data_Entry_2017_v2020.csv", "Data_Entry_2017.csv", "sample_labels.csv")
# Positions shared by all variants (their header names differ).
COLUMNS = ("image", "findings", "follow_up", "patient_id", "patient_age", "patient_sex", "view_position")
# Bump when read_metadata's output changes, so cached tables are parsed again.
METADATA_VERSION = 3
# The official patient-wise split, in the release beside the CSV.
TRAIN_VAL_LIST, TEST_LIST = "train_val_list.txt", "test_list.txt"
_AGE_UNITS = {"Y": 1.0, "M": 1 / 12, "W": 1 / 52, "D": 1 / 365}


def list_tree(root: Path):
    """One walk of `root`: {PNG name: path}, and the metadata CSVs found by name."""
    images, metadata, seen = {}, {}, set()

    def walk(directory):
        # os.walk's top-down order, from scandir's entries: their paths come ready, where joining every
        # name into a path weighs on a warm index (docs/input-pipeline.md). Symlinked folders are followed: Kaggle's
        # images_001/ ... folders are often linked in from other disks; a link back to a folder already
        # listed (a loop) or that cannot be followed is skipped, and logged.
        stat = os.stat(directory)
        if (stat.st_dev, stat.st_ino) in seen:
            log.warning("Skipped %s: it leads to %s, listed already (a symbolic link loop, or a second link)",
                        directory, os.path.realpath(directory))
            return
        seen.add((stat.st_dev, stat.st_ino))
        folders = []
        with os.scandir(directory) as entries:
            for entry in entries:
                name = entry.name
                if name.endswith(".png"):
                    images.setdefault(name, entry.path)
                elif is_folder(entry):
                    folders.append(entry.path)
                elif name.endswith(".csv") and (name.startswith("Data_Entry_2017") or name.startswith("sample_labels")):
                    metadata.setdefault(name, Path(entry.path))
        for folder in folders:
            walk(folder)

    walk(str(root))
    return images, metadata


def find_metadata(root: Path, found: dict) -> Path:
    """The metadata CSV among `found` ({name: path}, from `list_tree`), preferring the newest release."""
    for preferred in METADATA_FILES:
        if preferred in found:
            return found[preferred]
    if found:
        return sorted(found.values())[0]
    raise DatasetError(f"no Data_Entry_2017*.csv or sample_labels.csv under {root}")


def _restore(name: str) -> str:
    return f"restore {name} from the release"


def cached_metadata(csv_path: Path, skipped) -> pd.DataFrame:
    """`read_metadata`, cached by the CSV's path, size and mtime: parsing NIH's 112,120 rows takes seconds."""
    try:
        stat = csv_path.stat()
    except OSError as error:
        raise unreadable(csv_path, error, _restore(csv_path.name)) from None
    key = repr((METADATA_VERSION, str(csv_path.resolve()), stat.st_size, stat.st_mtime_ns))
    cache = cache_home() / "index" / f"chest_xray-{hashlib.sha256(key.encode()).hexdigest()[:20]}.pkl"
    cached = pickle_cache.read(cache, key=key)  # keyed: another pickle in its place is made again, not unpacked
    if cached is None:
        parsed = SkipLog()
        table = read_metadata(csv_path, parsed)
        # The labels as one array: it unpickles far faster than a list per row (docs/input-pipeline.md).
        labels = np.array(table.label.tolist(), np.uint8).reshape(len(table), len(FINDINGS))
        cached = table.drop(columns="label"), labels, parsed.rows
        pickle_cache.write(cache, cached, key=key)
    table, labels, rows = cached
    skipped.extend(rows)
    return table.assign(label=labels.tolist())


def parse_age(value) -> float:
    """Age in years from ``58`` or Kaggle's ``060Y``/``013M``/``001D``."""
    text = str(value).strip()
    if text and text[-1].upper() in _AGE_UNITS:
        return float(text[:-1]) * _AGE_UNITS[text[-1].upper()]
    return float(text) if text else float("nan")


def multi_hot(findings: str) -> list:
    """The 14-finding multi-hot vector of a ``Finding Labels`` cell such as ``Mass|Nodule``.

    Raises:
        ValueError: naming a finding that is not one of FINDINGS or ``No Finding``.
    """
    labels = [0] * len(FINDINGS)
    for finding in str(findings).split("|"):
        finding = finding.strip()
        if finding == NO_FINDING:
            continue
        if finding not in FINDINGS:
            raise ValueError(f"unknown finding {finding!r}")
        labels[FINDINGS.index(finding)] = 1
    return labels


def _parse_row(row) -> dict:
    """One metadata row by column name, with its ``label``; ValueError names what is wrong."""
    if len(row) < len(COLUMNS):
        raise ValueError(f"{len(row)} fields, expected at least {len(COLUMNS)}")
    fields = dict(zip(COLUMNS, row))
    try:
        fields["patient_id"] = int(fields["patient_id"])
    except ValueError:
        raise ValueError(f"Patient ID {fields['patient_id']!r} is not an integer") from None
    try:
        fields["patient_age"] = parse_age(fields["patient_age"])
    except ValueError:
        raise ValueError(f"Patient Age {fields['patient_age']!r} is not an age") from None
    fields["label"] = multi_hot(fields["findings"])
    return fields


def read_metadata(csv_path: Path, skipped=None) -> pd.DataFrame:
    """Parses any variant of the metadata CSV into one row per image.

    A row that cannot be used (too few fields, a bad Patient ID or age, an unknown
    finding) is left out and reported to `skipped` (a SkipLog) with its line and why. So is
    a last row cut short (the file ends mid-row, with fewer fields than the row before): a
    CSV truncated in a copy or download. Every release ends with a line break, and a cut
    inside the last field only (pixel spacing, unused) leaves the row's label whole.

    Raises:
        DatasetError: the file cannot be read, or is not UTF-8 text.
    """
    text = read_text(csv_path, _restore(csv_path.name))
    ends_mid_row = not text.endswith(("\n", "\r"))
    rows = list(csv.reader(io.StringIO(text, newline="")))
    table, width = [], None
    for line, row in enumerate(rows, start=1):
        if line == 1 or not row:
            continue  # the header, whose names differ between releases, and blank lines
        try:
            if line == len(rows) and ends_mid_row and width is not None and len(row) < width:
                raise ValueError(f"cut short, the file ends mid-row ({len(row)} fields where the row before "
                                 f"has {width})")
            width = len(row)
            table.append(_parse_row(row))
        except ValueError as error:
            if skipped is not None:
                skipped.add(row[0], f"bad metadata: {csv_path.name} line {line}: {error}")
    return pd.DataFrame(table, columns=[*COLUMNS, "label"])


def _read_list(path: Path, fix: str) -> set:
    return {line.strip() for line in read_text(path, fix).splitlines() if line.strip()}


def split(table: pd.DataFrame, root: Path, validation_fraction: float, seed: int, skipped,
          test_fraction: float = 0.0) -> dict:
    """Official lists where present, else a patient-wise split; no patient is in two splits.

    With train_val_list.txt and test_list.txt, each image goes to the split its list names; one in
    neither list (a list cut short, say) is left out and reported to `skipped` (a SkipLog), never moved to
    another split. With one list alone, the images not in it are the other split, as the release's
    lists are each other's complement, and a warning says so: without the other list, an image lost
    from a list cut short cannot be told from one of the other split. Without either list,
    `test_fraction` of the patients are held out as the test split (none by default), and
    `validation_fraction` of the others go to validation.

    Raises:
        DatasetError: an image is in both lists (the release's lists are disjoint, so these are not its
            files, and a test image would be trained on); no image is left for training; a list cannot
            be read (a dangling link included, never taken for an absent list).
    """
    paths = [root / TRAIN_VAL_LIST, root / TEST_LIST]
    present = [os.path.lexists(path) for path in paths]
    fix = f"restore it from the release, or remove both {TRAIN_VAL_LIST} and {TEST_LIST} to split patient-wise"
    if any(present):
        train_val_names, test_names = (_read_list(path, fix) if there else None for path, there in zip(paths, present))
        if all(present):
            overlap = train_val_names & test_names
            if overlap:
                raise DatasetError(f"{TRAIN_VAL_LIST} and {TEST_LIST} share {len(overlap)} image names (e.g. "
                                   f"{min(overlap)}), which the release's lists never do; restore both from the "
                                   f"release, or remove both to split patient-wise")
            in_train_val, in_test = table.image.isin(train_val_names), table.image.isin(test_names)
            neither = table[~(in_train_val | in_test)]
            for path in neither.path:
                skipped.add(path, f"in neither {TRAIN_VAL_LIST} nor {TEST_LIST}")
            if len(neither):
                log.warning("%d of %d images are in neither %s nor %s, and left out (listed in skipped.csv): is "
                            "one of the lists cut short?", len(neither), len(table), TRAIN_VAL_LIST, TEST_LIST)
        else:
            there, absent = paths if present[0] else paths[::-1]
            in_list = table.image.isin(train_val_names if present[0] else test_names)
            in_train_val, in_test = (in_list, ~in_list) if present[0] else (~in_list, in_list)
            log.warning("%s is absent: the %d of %d images not in %s go to the %s split; restore %s from the "
                        "release, so that an image lost from a list cut short is caught", absent.name,
                        (~in_list).sum(), len(table), there.name, "test" if present[0] else "training/validation",
                        absent.name)
        train_val, test = table[in_train_val], table[in_test]
        if train_val.empty and present[0]:
            raise DatasetError(f"none of the {len(table)} indexed images is in {paths[0]} ({len(train_val_names)} "
                               f"names), so there is nothing to train on; {fix}")
        if train_val.empty:
            raise DatasetError(f"all {len(table)} indexed images are in {paths[1]}, the test list, so there is nothing "
                               f"to train on; {_restore(TRAIN_VAL_LIST)} beside it, or remove {TEST_LIST} to split "
                               f"patient-wise")
    elif test_fraction:
        held_out = GroupShuffleSplit(n_splits=1, test_size=test_fraction, random_state=seed)
        train_val_rows, test_rows = next(held_out.split(table, groups=table.patient_id))
        train_val, test = table.iloc[train_val_rows], table.iloc[test_rows]
    else:
        train_val, test = table, table.iloc[:0]
    splitter = GroupShuffleSplit(n_splits=1, test_size=validation_fraction, random_state=seed)
    train_rows, val_rows = next(splitter.split(train_val, groups=train_val.patient_id))
    splits = {"train": train_val.iloc[train_rows], "validation": train_val.iloc[val_rows]}
    if len(test):
        splits["test"] = test
    return {name: part.reset_index(drop=True) for name, part in splits.items()}


class ChestXray(Task):
    """NIH ChestX-ray14 as a 14-label multi-label task; options: ``validation_fraction``."""

    SPEC = SPEC
    IDENTITIES = ("patient", "patient_id", ("patient_id",))
    make_sample = staticmethod(make_sample)

    def index(self, root, skipped) -> dict:
        """Tables of (path, label) per split.

        Skipped, each listed in `skipped`: bad rows (read_metadata), rows whose image file is absent (only
        some archives downloaded), PNGs under `root` without a row in the CSV (a CSV cut short), and images
        in neither official list (split).
        """
        root = Path(root)
        files, metadata = list_tree(root)
        csv_path = find_metadata(root, metadata)
        parsed = SkipLog()
        table = cached_metadata(csv_path, parsed)
        skipped.extend(parsed.rows)
        if table.empty:
            first = f", the first: {parsed.rows[0][1]}" if parsed.rows else ""
            raise DatasetError(f"{csv_path} has no usable rows ({len(parsed)} bad{first}); {_restore(csv_path.name)}")
        named = set(table.image).union(image for image, _ in parsed.rows)  # a bad row's image is skipped once
        unnamed = sorted(set(files) - named)
        for image in unnamed:
            skipped.add(files[image], f"no row in {csv_path.name}")
        if unnamed:
            log.warning("%d of the %d PNG files under %s have no row in %s, and are left out (listed in "
                        "skipped.csv): is it cut short?", len(unnamed), len(files), root, csv_path.name)
        table["path"] = table.image.map(files)
        missing = table.path.isna()
        for image in table.image[missing]:
            skipped.add(image, "missing image file")
        if missing.any():
            log.warning("%d of %d rows in %s have no image file under %s", missing.sum(), len(table), csv_path.name,
                        root)
        table = table[~missing]
        if table.empty:
            raise DatasetError(f"none of the images listed in {csv_path} are under {root}")
        return split(table, root, self.options["validation_fraction"], self.seed, skipped,
                     self.options["test_fraction"])

    def load(self, record):
        """Reads one X-ray as a single-channel uint8 image (RGBA files included) and its multi-hot label."""
        return self.read_image(record["path"]), tf.cast(record["label"], tf.float32)
