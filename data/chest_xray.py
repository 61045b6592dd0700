"""NIH ChestX-ray14: 14 findings per frontal chest X-ray, as a multi-hot label.

Reads every published layout of the metadata: the 2017 ``Data_Entry_2017.csv``
(header ends with a comma and has bracketed columns), the v2020 variant (a
trailing comma on every row, ``Patient Sex``) and Kaggle's ``sample_labels.csv``
(CRLF, ages like ``060Y``). Columns are taken by position, since the headers
disagree. Images may sit anywhere below the root (flat ``images/`` or Kaggle's
``images_001/images/`` ...).
"""
import csv
import hashlib
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf
from sklearn.model_selection import GroupShuffleSplit

from tf_harness.data import pickle_cache
from tf_harness.data.errors import DatasetError
from tf_harness.data.folders import is_folder
from tf_harness.data.samples import cache_home
from tf_harness.data.samples.chest_xray import make_sample
from tf_harness.data.skipped import SkipLog
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
METADATA_VERSION = 2
_AGE_UNITS = {"Y": 1.0, "M": 1 / 12, "W": 1 / 52, "D": 1 / 365}


def list_tree(root: Path):
    """One walk of `root`: {PNG name: path}, and the metadata CSVs found by name."""
    images, metadata, seen = {}, {}, set()

    def walk(directory):
        # os.walk's top-down order, from scandir's entries: their paths come ready, where joining
        # 112,120 names took a third of a warm index. Symlinked folders are followed: Kaggle's
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


def cached_metadata(csv_path: Path, skipped) -> pd.DataFrame:
    """`read_metadata`, cached by the CSV's path, size and mtime: parsing NIH's 112,120 rows takes seconds."""
    stat = csv_path.stat()
    key = repr((METADATA_VERSION, str(csv_path.resolve()), stat.st_size, stat.st_mtime_ns))
    cache = cache_home() / "index" / f"chest_xray-{hashlib.sha256(key.encode()).hexdigest()[:20]}.pkl"
    cached = pickle_cache.read(cache)
    if cached is None:
        parsed = SkipLog()
        table = read_metadata(csv_path, parsed)
        # The labels as one array: unpickling 112,120 lists took 0.25 s, the array and tolist() 0.07 s.
        labels = np.array(table.label.tolist(), np.uint8).reshape(len(table), len(FINDINGS))
        cached = table.drop(columns="label"), labels, parsed.rows
        pickle_cache.write(cache, cached)
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
    finding) is left out and reported to `skipped` (a SkipLog) with its line and why.
    """
    table = []
    with open(csv_path, newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            if line == 1 or not row:
                continue  # the header, whose names differ between releases, and blank lines
            try:
                table.append(_parse_row(row))
            except ValueError as error:
                if skipped is not None:
                    skipped.add(row[0] if row else "", f"bad metadata: {csv_path.name} line {line}: {error}")
    return pd.DataFrame(table, columns=[*COLUMNS, "label"])


def _read_list(path: Path) -> set:
    return {line.strip() for line in path.read_text().splitlines() if line.strip()}


def split(table: pd.DataFrame, root: Path, validation_fraction: float, seed: int) -> dict:
    """Official lists where present, else a patient-wise split; no patient is in two splits."""
    train_val_list, test_list = root / "train_val_list.txt", root / "test_list.txt"
    if train_val_list.exists() or test_list.exists():
        if train_val_list.exists():
            in_train_val = table.image.isin(_read_list(train_val_list))
        else:
            in_train_val = ~table.image.isin(_read_list(test_list))
        train_val, test = table[in_train_val], table[~in_train_val]
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
    OPTIONS = ("validation_fraction",)
    make_sample = staticmethod(make_sample)

    def index(self, root, skipped) -> dict:
        """Tables of (path, label) per split; rows whose image file is absent are skipped."""
        root = Path(root)
        files, metadata = list_tree(root)
        csv_path = find_metadata(root, metadata)
        table = cached_metadata(csv_path, skipped)
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
        return split(table, root, self.options["validation_fraction"], self.seed)

    def load(self, record):
        """Reads one X-ray as a single-channel uint8 image (RGBA files included) and its multi-hot label."""
        return self.read_image(record["path"]), tf.cast(record["label"], tf.float32)
