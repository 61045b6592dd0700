"""The NIH ChestX-ray14 module against the real metadata variants and real PNGs."""
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tf_harness.data import chest_xray
from tf_harness.data.errors import DatasetError
from tf_harness.data.images import Decode
from tf_harness.data.skipped import SkipLog
from tests.conftest import compose, tables_of, task_of


def test_2017_header_with_trailing_comma_and_bracketed_columns(real):
    table = chest_xray.read_metadata(real / "nih" / "Data_Entry_2017_head.csv")
    assert len(table) == 57
    first = table.iloc[0]
    assert (first.image, first.patient_id, first.patient_age) == ("00000001_000.png", 1, 58)
    assert first.label == [0, 1] + [0] * 12  # Cardiomegaly


def test_v2020_rows_with_trailing_comma(real):
    table = chest_xray.read_metadata(real / "nih" / "Data_Entry_2017_v2020_head.csv")
    assert len(table) == 10
    assert table.iloc[1].label[chest_xray.FINDINGS.index("Emphysema")] == 1
    assert table.iloc[0].patient_sex == "M"


def test_kaggle_sample_labels_with_crlf_and_unit_ages(real):
    table = chest_xray.read_metadata(real / "nih" / "sample_labels_kaggle.csv")
    assert len(table) == 5600
    assert not table.image.str.contains("\r").any() and not table.view_position.str.contains("\r").any()
    first = table.iloc[0]
    assert first.patient_age == 60.0
    assert sum(first.label) == 4  # Emphysema|Infiltration|Pleural_Thickening|Pneumothorax
    assert chest_xray.parse_age("013M") == pytest.approx(13 / 12)
    assert chest_xray.parse_age("001D") == pytest.approx(1 / 365)


def test_labels_are_multi_hot_in_canonical_order():
    assert chest_xray.FINDINGS[0] == "Atelectasis" and chest_xray.FINDINGS[-1] == "Hernia"
    assert chest_xray.multi_hot("No Finding") == [0] * 14
    assert chest_xray.multi_hot("Hernia|Atelectasis") == [1] + [0] * 12 + [1]


def test_bad_metadata_rows_are_skipped_with_their_line_and_reason(tmp_path, real):
    lines = (real / "nih" / "Data_Entry_2017_head.csv").read_text().splitlines()
    lines[3] = lines[3].replace("Cardiomegaly", "Cardiomegally", 1)  # an unknown finding
    fields = lines[4].split(",")
    lines[4] = ",".join(fields[:3] + ["P7"] + fields[4:])  # a Patient ID that is not an integer
    fields = lines[5].split(",")
    lines[5] = ",".join(fields[:4] + ["old"] + fields[5:])  # an age that is not one
    lines[6] = ",".join(lines[6].split(",")[:3])  # a short row
    bad = tmp_path / "Data_Entry_2017.csv"
    bad.write_text("\n".join(lines))
    skipped = SkipLog()
    table = chest_xray.read_metadata(bad, skipped)
    assert len(table) == 57 - 4
    reasons = [reason for _, reason in skipped.rows]
    assert reasons[0] == "bad metadata: Data_Entry_2017.csv line 4: unknown finding 'Cardiomegally'"
    assert reasons[1] == "bad metadata: Data_Entry_2017.csv line 5: Patient ID 'P7' is not an integer"
    assert reasons[2] == "bad metadata: Data_Entry_2017.csv line 6: Patient Age 'old' is not an age"
    assert reasons[3] == "bad metadata: Data_Entry_2017.csv line 7: 3 fields, expected at least 7"
    assert [path for path, _ in skipped.rows][:3] == [line.split(",")[0] for line in lines[3:6]]


def test_symlinked_image_folders_are_followed(tmp_path, real):
    elsewhere = tmp_path / "disk2" / "images"
    elsewhere.mkdir(parents=True)
    for png in (real / "nih" / "images").glob("*.png"):
        shutil.copy(png, elsewhere / png.name)
    root = tmp_path / "nih"
    root.mkdir()
    (root / "images_001").symlink_to(tmp_path / "disk2", target_is_directory=True)
    shutil.copy(real / "nih" / "Data_Entry_2017_head.csv", root / "Data_Entry_2017.csv")
    tables = task_of(compose("dataset=chest_xray")).index(root, SkipLog())
    assert sum(len(table) for table in tables.values()) == 24


@pytest.fixture
def real_tree(tmp_path, real):
    """The real fixture laid out as a user's partial download: Kaggle's images_001/images/ folders."""
    root = tmp_path / "nih"
    (root / "images_001" / "images").mkdir(parents=True)
    for png in (real / "nih" / "images").glob("*.png"):
        shutil.copy(png, root / "images_001" / "images" / png.name)
    shutil.copy(real / "nih" / "Data_Entry_2017_head.csv", root / "Data_Entry_2017.csv")
    return root


def test_index_skips_rows_without_images_and_keeps_all_24_real_pngs(real_tree):
    skipped = SkipLog()
    tables = task_of(compose("dataset=chest_xray")).index(real_tree, skipped)
    indexed = sum(len(table) for table in tables.values())
    assert indexed == 24
    assert len(skipped) == 57 - 24
    assert all(reason == "missing image file" for _, reason in skipped.rows)
    assert "00000009_000.png" in {path for path, _ in skipped.rows}


def test_patient_wise_split_never_shares_a_patient(real_tree):
    task = task_of(compose("dataset=chest_xray", "dataset.validation_fraction=0.3"))
    tables = task.index(real_tree, SkipLog())
    assert set(tables) == {"train", "validation"}
    assert len(tables["validation"]) > 0
    assert not set(tables["train"].patient_id) & set(tables["validation"].patient_id)


def test_official_lists_are_used_when_present(real_tree, real):
    shutil.copy(real / "nih" / "train_val_list.txt", real_tree / "train_val_list.txt")
    (real_tree / "test_list.txt").write_text("00000003_000.png\n")
    tables = task_of(compose("dataset=chest_xray")).index(real_tree, SkipLog())
    train_val = set(tables["train"].image) | set(tables["validation"].image)
    official = set((real / "nih" / "train_val_list.txt").read_text().split())
    assert train_val <= official
    assert set(tables["test"].image) == set(tables["test"].image) - official
    assert not set(tables["train"].patient_id) & set(tables["validation"].patient_id)


def test_every_real_png_decodes_to_one_channel_rgba_included(real):
    for png in sorted((real / "nih" / "images").glob("*.png")):
        image = Decode((64, 64), "resize").read(tf.constant(str(png)), 1)
        assert image.shape == (64, 64, 1) and image.dtype == tf.uint8
        assert int(tf.reduce_max(image)) > 100, png.name  # real content, not an empty decode
    rgba = Decode((32, 32), "resize").read(tf.constant(str(real / "nih" / "images" / "00000004_000.png")), 1)
    assert float(tf.math.reduce_std(tf.cast(rgba, tf.float32))) > 5


def test_embedded_sample_has_the_real_layout_and_is_deterministic(tmp_path, real, monkeypatch):
    from tf_harness.data.samples import chest_xray as generator
    monkeypatch.setattr(generator, "PATIENTS", 14)  # the same generator, fewer patients, for speed
    chest_xray.make_sample(tmp_path / "a", seed=0)
    chest_xray.make_sample(tmp_path / "b", seed=0)
    header = (tmp_path / "a" / "Data_Entry_2017.csv").read_text().splitlines()[0]
    assert header == (real / "nih" / "Data_Entry_2017_head.csv").read_text().splitlines()[0]
    assert (tmp_path / "a" / "Data_Entry_2017.csv").read_text() == (tmp_path / "b" / "Data_Entry_2017.csv").read_text()
    from PIL import Image
    assert Image.open(tmp_path / "a" / "images" / "00000004_000.png").mode == "RGBA"
    first = tmp_path / "a" / "images" / "00000001_000.png"
    assert Image.open(first).mode == "L" and Image.open(first).size == (1024, 1024)
    assert np.array_equal(np.asarray(Image.open(first)), np.asarray(Image.open(tmp_path / "b" / "images" / first.name)))
    tables = task_of(compose("dataset=chest_xray")).index(tmp_path / "a", SkipLog())
    assert set(tables) == {"train", "validation", "test"}
    visits = tables["train"].patient_id.value_counts()
    assert visits.max() > 1  # several visits per patient
    splits = [set(table.patient_id) for table in tables.values()]
    assert not (splits[0] & splits[1] or splits[0] & splits[2] or splits[1] & splits[2])


def test_too_many_skipped_examples_stop_the_run_with_one_clear_line(real_tree):
    """The real tree holds 24 of the CSV's 57 images: 33 skipped, 58% of the examples."""
    with pytest.raises(DatasetError, match=r"^33 of 57 examples were skipped \(33 missing image file\), more than "
                                           r"dataset.max_skipped_fraction=0.1; fix the data or raise"):
        tables_of(compose("dataset=chest_xray", f"dataset.root={real_tree}"))
    tables = tables_of(compose("dataset=chest_xray", f"dataset.root={real_tree}", "dataset.max_skipped_fraction=0.6"))
    assert sum(len(table) for table in tables.values()) == 24


def test_the_parsed_metadata_is_reused_until_the_csv_changes(real_tree, monkeypatch):
    """Parsing NIH's 112,120 rows takes seconds: a warm start reuses the parsed table, skipped rows included."""
    calls = []
    parse = chest_xray.read_metadata
    monkeypatch.setattr(chest_xray, "read_metadata", lambda *args: calls.append(args) or parse(*args))
    task = task_of(compose("dataset=chest_xray"))
    first_skipped, second_skipped = SkipLog(), SkipLog()
    first = task.index(real_tree, first_skipped)
    second = task.index(real_tree, second_skipped)
    assert len(calls) == 1
    assert all(first[split].equals(second[split]) for split in first) and second_skipped.rows == first_skipped.rows
    csv_path = real_tree / "Data_Entry_2017.csv"
    csv_path.write_text(csv_path.read_text() + "00000001_000.png,Hernia,9,1,58,M,PA,1,1,1,1,\n")
    task.index(real_tree, SkipLog())
    assert len(calls) == 2
