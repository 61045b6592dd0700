"""The NIH ChestX-ray14 module against the real metadata variants and real PNGs."""
import os
import shutil
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tf_harness.data import chest_xray
from tf_harness.data.errors import DatasetError
from tf_harness.data.images import Decode
from tf_harness.data.integrity.skipped import SkipLog
from tests.conftest import compose, tables_of, task_of
from tests.refusals import one_naming, raises_naming


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


def test_without_the_lists_a_test_fraction_holds_out_patients_as_the_test_split(real_tree):
    tables = task_of(compose("dataset=chest_xray", "dataset.test_fraction=0.25")).index(real_tree, SkipLog())
    assert set(tables) == {"train", "validation", "test"} and sum(map(len, tables.values())) == 24
    patients = {name: set(table.patient_id) for name, table in tables.items()}
    assert len(patients["test"]) == 2  # a quarter of the fixture's eight patients
    assert not patients["test"] & (patients["train"] | patients["validation"])
    assert "test" not in task_of(compose("dataset=chest_xray")).index(real_tree, SkipLog())  # none by default


# Patient 3's eight images: the real tree's images that the real train_val_list.txt leaves to the test list.
PATIENT_3 = [f"00000003_{k:03d}.png" for k in range(8)]


@pytest.fixture
def official_tree(real_tree, real):
    """The real tree with the official lists: the real train_val_list.txt, and a test_list.txt of patient 3."""
    shutil.copy(real / "nih" / "train_val_list.txt", real_tree / "train_val_list.txt")
    (real_tree / "test_list.txt").write_text("\n".join(PATIENT_3) + "\n")
    return real_tree


def test_official_lists_are_used_when_present(official_tree, real):
    skipped = SkipLog()
    tables = task_of(compose("dataset=chest_xray")).index(official_tree, skipped)
    train_val = set(tables["train"].image) | set(tables["validation"].image)
    official = set((real / "nih" / "train_val_list.txt").read_text().split())
    assert train_val <= official and len(train_val) == 24 - 8
    assert sorted(tables["test"].image) == PATIENT_3
    assert not set(tables["train"].patient_id) & set(tables["validation"].patient_id)
    assert {reason for _, reason in skipped.rows} == {"missing image file"}  # the CSV's rows beyond the 24 PNGs


def _cut(path, at):
    """Keeps the first `at` bytes of `path`, as a copy or download that stopped there leaves it."""
    path.write_bytes(path.read_bytes()[:at])


def test_a_csv_cut_short_skips_each_image_left_without_a_row(real_tree):
    """Every PNG is indexed or skipped once: the images below the cut are no row, the row cut in half is bad
    metadata, and together they stop the run with the max_skipped_fraction line."""
    csv_path = real_tree / "Data_Entry_2017.csv"
    _cut(csv_path, csv_path.read_bytes().index(b"00000005_000.png") + 30)  # after "00000005_000.png,No Finding,0,"
    skipped = SkipLog()
    tables = task_of(compose("dataset=chest_xray")).index(real_tree, skipped)
    indexed = sorted(image for table in tables.values() for image in table.image)
    assert indexed == ["00000001_000.png", "00000001_001.png", "00000001_002.png", "00000002_000.png", *PATIENT_3,
                       "00000004_000.png"]
    assert skipped.rows[0] == ("00000005_000.png", "bad metadata: Data_Entry_2017.csv line 15: cut short, the file "
                                                   "ends mid-row (4 fields where the row before has 11)")
    unnamed = [f"00000005_{k:03d}.png" for k in range(1, 8)] + ["00000006_000.png", "00000007_000.png",
                                                                 "00000008_000.png"]
    assert skipped.rows[1:] == [(str(real_tree / "images_001" / "images" / name), "no row in Data_Entry_2017.csv")
                                for name in unnamed]
    assert len(indexed) + len(skipped) == 24
    with raises_naming(DatasetError, "11 of 24 examples", "10 no row in Data_Entry_2017.csv", "1 bad metadata",
                       "dataset.max_skipped_fraction=0.1"):
        tables_of(compose("dataset=chest_xray", f"dataset.root={real_tree}"))


def test_a_last_row_cut_anywhere_is_skipped_or_keeps_its_whole_label(tmp_path, real):
    text = (real / "nih" / "Data_Entry_2017_head.csv").read_bytes()
    last = text.rstrip(b"\n").rindex(b"\n") + 1
    whole = chest_xray.read_metadata(real / "nih" / "Data_Entry_2017_head.csv").iloc[-1]
    cut = tmp_path / "Data_Entry_2017.csv"
    kept = 0
    for at in range(last + 1, len(text)):  # every cut inside the last row, up to its line break
        cut.write_bytes(text[:at])
        skipped = SkipLog()
        table = chest_xray.read_metadata(cut, skipped)
        assert len(table) + len(skipped) == 57
        if len(skipped):
            assert len(table) == 56 and "cut short, the file ends mid-row" in skipped.rows[0][1], text[last:at]
        else:  # cut in the last field, the pixel spacing: the label and all the fields the index uses are whole
            assert table.iloc[-1].image == whole.image and table.iloc[-1].label == whole.label
            kept += 1
    assert kept == 6  # the last field empty, "0", "0.", "0.1", "0.16", and the whole row without its line break


@pytest.mark.parametrize("which, cut_in, neither", [
    ("train_val_list.txt", "00000005_002.png", [f"00000005_{k:03d}.png" for k in range(2, 8)]
     + ["00000006_000.png", "00000007_000.png", "00000008_000.png"]),
    ("test_list.txt", "00000003_005.png", PATIENT_3[5:]),
])
def test_a_list_cut_short_skips_the_images_in_neither_list_never_moves_them(official_tree, which, cut_in, neither):
    path = official_tree / which
    _cut(path, path.read_bytes().index(cut_in.encode()) + 5)
    skipped = SkipLog()
    tables = task_of(compose("dataset=chest_xray")).index(official_tree, skipped)
    in_neither = [(path, reason) for path, reason in skipped.rows if reason != "missing image file"]
    assert in_neither == [(str(official_tree / "images_001" / "images" / name),
                           "in neither train_val_list.txt nor test_list.txt") for name in neither]
    assert set(tables["test"].image) == set(PATIENT_3) - set(neither)
    assert sum(len(table) for table in tables.values()) + len(neither) == 24


def test_an_image_in_both_lists_is_an_error(official_tree):
    with open(official_tree / "test_list.txt", "a") as f:
        f.write("00000005_001.png\n")
    with raises_naming(DatasetError, "train_val_list.txt", "test_list.txt", "share 1 image names",
                       "00000005_001.png"):
        task_of(compose("dataset=chest_xray")).index(official_tree, SkipLog())


@pytest.mark.parametrize("there, absent", [("train_val_list.txt", "test_list.txt"),
                                           ("test_list.txt", "train_val_list.txt")])
def test_one_official_list_alone_takes_its_complement_as_the_other_split_and_says_so(official_tree, there, absent,
                                                                                      caplog):
    """As before, the images not in the one list are the other split; the warning says that an image lost from a
    list cut short cannot be caught without the absent list."""
    (official_tree / absent).unlink()
    skipped = SkipLog()
    tables = task_of(compose("dataset=chest_xray")).index(official_tree, skipped)
    assert sorted(tables["test"].image) == PATIENT_3
    assert sum(len(tables[name]) for name in ("train", "validation")) == 24 - 8
    assert {reason for _, reason in skipped.rows} == {"missing image file"}
    other = "test" if there == "train_val_list.txt" else "training/validation"
    count = 8 if there == "train_val_list.txt" else 16
    one_naming(caplog.messages, f"{absent} is absent", f"{count} of 24 images", there, f"the {other} split")


def test_an_empty_train_val_list_is_an_error_not_an_empty_training_split(official_tree):
    (official_tree / "train_val_list.txt").write_bytes(b"")
    with raises_naming(DatasetError, "none of the 24 indexed images", "train_val_list.txt (0 names)",
                       "nothing to train on"):
        task_of(compose("dataset=chest_xray")).index(official_tree, SkipLog())


def test_a_test_list_alone_holding_every_image_is_an_error(official_tree):
    (official_tree / "train_val_list.txt").unlink()
    (official_tree / "test_list.txt").write_text("\n".join(p.name for p in official_tree.rglob("*.png")))
    with raises_naming(DatasetError, "all 24 indexed images", "test_list.txt", "nothing to train on",
                       "train_val_list.txt"):
        task_of(compose("dataset=chest_xray")).index(official_tree, SkipLog())


def _byte_ff(path, at):
    data = bytearray(path.read_bytes())
    data[at] = 0xFF
    path.write_bytes(bytes(data))


def _directory(path):
    path.unlink()
    path.mkdir()


def _dangling_link(path):
    path.unlink()
    path.symlink_to(path.parent / "nowhere")


def _fifo(path):
    """A FIFO in the file's place. Reading it waits for a writer: one comes after 10 s and closes at once, so a
    reader that was not refused ends with an empty file instead of hanging the test."""
    path.unlink()
    os.mkfifo(path)

    def writer():
        time.sleep(10)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO: no reader is waiting
        except OSError:
            pass
    threading.Thread(target=writer, daemon=True).start()


@pytest.mark.parametrize("name, damage, message", [
    ("Data_Entry_2017.csv", _fifo, r"^.*Data_Entry_2017.csv is a named pipe, not a regular file; "
                                   r"restore Data_Entry_2017.csv from the release$"),
    ("train_val_list.txt", _fifo, r"^.*train_val_list.txt is a named pipe, not a regular file; "
                                  r"restore it from the release"),
    ("Data_Entry_2017.csv", lambda path: _byte_ff(path, 500),
     r"Data_Entry_2017.csv:7: byte 500 \(0xff\) is not UTF-8 text; the file is damaged, restore Data_Entry_2017.csv "
     r"from the release$"),
    ("Data_Entry_2017.csv", _dangling_link,
     r"^.*Data_Entry_2017.csv cannot be read \(No such file or directory\); restore Data_Entry_2017.csv from the "
     r"release$"),
    ("train_val_list.txt", lambda path: _byte_ff(path, 40),
     r"train_val_list.txt:3: byte 40 \(0xff\) is not UTF-8 text; the file is damaged, restore it from the release, "
     r"or remove both train_val_list.txt and test_list.txt to split patient-wise$"),
    ("train_val_list.txt", _directory,
     r"^.*train_val_list.txt cannot be read \(Is a directory\); restore it from the release, or remove both"),
    ("test_list.txt", _dangling_link, r"^.*test_list.txt cannot be read \(No such file or directory\); restore it"),
    ("test_list.txt", _directory, r"^.*test_list.txt cannot be read \(Is a directory\); restore it from the release, "
                                  r"or remove both"),
])
def test_a_metadata_file_that_cannot_be_read_is_one_clear_error(official_tree, name, damage, message):
    damage(official_tree / name)
    with pytest.raises(DatasetError, match=message):
        tables_of(compose("dataset=chest_xray", f"dataset.root={official_tree}"))


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
    with raises_naming(DatasetError, "33 of 57 examples", "(33 missing image file)", "dataset.max_skipped_fraction=0.1"):
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


def test_another_pickle_in_place_of_the_metadata_cache_is_made_again(tmp_path, real_tree, monkeypatch):
    """A cache file holding some other pickle (another version's, a copy) is parsed again, not unpacked."""
    import pickle
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    csv_path, first_rows = real_tree / "Data_Entry_2017.csv", SkipLog()
    first = chest_xray.cached_metadata(csv_path, first_rows)
    (cache,) = (tmp_path / "cache" / "index").glob("chest_xray-*.pkl")
    cache.write_bytes(pickle.dumps(("another", "layout")))
    again = chest_xray.cached_metadata(csv_path, SkipLog())
    assert again.equals(first)
