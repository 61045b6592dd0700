"""ImageNet DET: labels from the real XML schema and its quirks, robust decoding, the cached index, the sample."""
import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tf_harness.data import imagenet_det
from tf_harness.data.images import Decode
from tf_harness.data.integrity.skipped import SkipLog
from tf_harness.data.samples import imagenet_det as sample
from tf_harness.experiments.config.schema import first_problem
from tests.conftest import REAL, compose, event_tags, require_real_fixtures, run_cli

REAL_MAP_DET = REAL / "ilsvrc_det" / "map_det.txt"
AIRPLANE, APPLE = "n02691156", "n07739125"  # DET synsets 2 and 5 in devkit order
OUTSIDE = "n04592741"  # 'wing': an ImageNet synset that is not a DET one


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))


def xml(width, height, objects, reordered=False):
    """An annotation in the ILSVRC schema; objects are (wnid, xmin, ymin, xmax, ymax)."""
    size = f"<width>{width}</width><height>{height}</height>"
    boxes = []
    for wnid, xmin, ymin, xmax, ymax in objects:
        bndbox = f"<xmin>{xmin}</xmin><xmax>{xmax}</xmax><ymin>{ymin}</ymin><ymax>{ymax}</ymax>"
        if reordered:
            bndbox = f"<ymax>{ymax}</ymax><xmax>{xmax}</xmax><ymin>{ymin}</ymin><xmin>{xmin}</xmin>"
            boxes.append(f"<object><bndbox>{bndbox}</bndbox><name>{wnid}</name></object>")
        else:
            boxes.append(f"<object><name>{wnid}</name><bndbox>{bndbox}</bndbox></object>")
    if reordered:
        size = f"<height>{height}</height><width>{width}</width>"
        return f"<annotation>{''.join(boxes)}<size>{size}</size><filename>x</filename></annotation>"
    return f"<annotation><folder>f</folder><filename>x</filename><size>{size}</size>{''.join(boxes)}</annotation>"


def write_image(path, mode="RGB", image_format="JPEG", size=(40, 30), colour=(200, 30, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", size, colour).convert(mode)
    image.save(path, format=image_format)


def make_tree(root, train, val=None):
    """An ILSVRC tree from {relative stem: XML text or None (no XML)} per split."""
    for split, examples in (("train", train), ("val", val or {"ILSVRC2013_val_00000001": xml(40, 30, [])})):
        for stem, annotation in examples.items():
            write_image(root / "ILSVRC" / "Data" / "DET" / split / f"{stem}.JPEG")
            if annotation is not None:
                xml_path = root / "ILSVRC" / "Annotations" / "DET" / split / f"{stem}.xml"
                xml_path.parent.mkdir(parents=True, exist_ok=True)
                xml_path.write_text(annotation)
    return root


def labels_of(root, skipped=None):
    """{image stem: label} of every indexed image, train and validation."""
    tables = det_task().index(root, skipped if skipped is not None else SkipLog())
    return {Path(path).stem: label for table in tables.values() for path, label in zip(table.path, table.label)}


def label(wnid):
    return imagenet_det.WNIDS.index(wnid)


def test_synsets_are_the_200_of_the_real_devkit_list_in_order():
    packaged = imagenet_det.read_synsets()
    assert len(packaged) == 200 and len(set(imagenet_det.WNIDS)) == 200
    require_real_fixtures()
    assert packaged == imagenet_det.read_synsets(REAL_MAP_DET)
    lines = REAL_MAP_DET.read_text().split("\n")
    assert [line.split()[0] for line in lines if line.strip()] == list(imagenet_det.WNIDS)
    assert packaged[1] == (AIRPLANE, "airplane") and packaged[4] == (APPLE, "apple")
    assert imagenet_det.SPEC.task == "multiclass"
    assert imagenet_det.SPEC.class_names[-1] == "background"
    assert imagenet_det.SPEC.num_outputs == imagenet_det.BACKGROUND + 1 == 201


def test_synset_list_out_of_order_is_an_error(tmp_path):
    path = tmp_path / "map_det.txt"
    path.write_text("n02672831 1 accordion\nn02219486 3 ant\n")
    with pytest.raises(imagenet_det.DatasetError, match="out of order"):
        imagenet_det.read_synsets(path)


def test_children_are_found_by_tag_in_any_order(tmp_path):
    root = make_tree(tmp_path / "tree", {
        "ILSVRC2014_train_0000/usual": xml(100, 80, [(APPLE, 10, 10, 30, 30), (AIRPLANE, 0, 0, 90, 70)]),
        "ILSVRC2014_train_0000/reordered": xml(100, 80, [(APPLE, 10, 10, 30, 30), (AIRPLANE, 0, 0, 90, 70)],
                                                reordered=True),
    })
    labels = labels_of(root)
    assert labels["usual"] == labels["reordered"] == label(AIRPLANE)


def test_largest_box_names_the_image_wherever_it_is_listed(tmp_path):
    root = make_tree(tmp_path / "tree", {
        "ILSVRC2014_train_0000/apple_last": xml(100, 80, [(AIRPLANE, 0, 0, 20, 20), (APPLE, 10, 10, 60, 60)]),
        "ILSVRC2014_train_0000/apple_first": xml(100, 80, [(APPLE, 10, 10, 60, 60), (AIRPLANE, 0, 0, 20, 20)]),
        "ILSVRC2014_train_0000/one": xml(100, 80, [(AIRPLANE, 5, 5, 15, 15)]),
    })
    labels = labels_of(root)
    assert labels["apple_last"] == labels["apple_first"] == label(APPLE)
    assert labels["one"] == label(AIRPLANE)


def test_boxes_are_clipped_to_the_image_before_comparing(tmp_path):
    # Unclipped, the airplane box is 1000x80; inside the 100x80 image only 10x80 of it shows.
    root = make_tree(tmp_path / "tree", {
        "ILSVRC2014_train_0000/clipped": xml(100, 80, [(AIRPLANE, 90, 0, 1090, 80), (APPLE, 10, 10, 60, 60)]),
        "ILSVRC2014_train_0000/negative_corner": xml(100, 80, [(AIRPLANE, -500, -500, 5, 5), (APPLE, 10, 10, 30, 30)]),
        "ILSVRC2014_train_0000/outside": xml(100, 80, [(APPLE, 10, 10, 12, 12), (AIRPLANE, 200, 0, 300, 80)]),
    })
    labels = labels_of(root)
    assert labels["clipped"] == label(APPLE)
    assert labels["negative_corner"] == label(APPLE)
    assert labels["outside"] == label(APPLE)  # a box wholly outside the image shows nothing


def test_background_covers_no_xml_no_objects_and_unknown_synsets(tmp_path):
    root = make_tree(tmp_path / "tree", {
        "ILSVRC2013_train_extra0/ILSVRC2013_train_00000001": None,
        "ILSVRC2013_train/n02691156/n02691156_1": xml(100, 80, []),
        "ILSVRC2014_train_0000/outside_largest": xml(100, 80, [(OUTSIDE, 0, 0, 90, 70), (APPLE, 0, 0, 10, 10)]),
        "ILSVRC2014_train_0000/outside_smaller": xml(100, 80, [(OUTSIDE, 0, 0, 10, 10), (APPLE, 0, 0, 90, 70)]),
    })
    labels = labels_of(root)
    background = imagenet_det.BACKGROUND
    assert labels["ILSVRC2013_train_00000001"] == background
    assert labels["n02691156_1"] == background
    assert labels["outside_largest"] == background
    assert labels["outside_smaller"] == label(APPLE)


@pytest.mark.parametrize("bad", ["<annotation><size><width>100</width>", "<annotation><object></annotation>",
                                 xml(100, 80, [(APPLE, "ten", 0, 50, 50)]),
                                 "<annotation><object><name>n07739125</name></object></annotation>"])
def test_malformed_xml_is_skipped_and_listed(tmp_path, bad):
    root = make_tree(tmp_path / "tree", {
        "ILSVRC2014_train_0000/good": xml(100, 80, [(APPLE, 0, 0, 50, 50)]),
        "ILSVRC2014_train_0000/bad": bad,
    })
    skipped = SkipLog()
    labels = labels_of(root, skipped)
    assert "bad" not in labels and labels["good"] == label(APPLE)
    assert [Path(path).name for path, _ in skipped.rows] == ["bad.xml"]
    assert skipped.rows[0][1].startswith("malformed XML")


def test_splits_come_from_the_train_and_val_folders(tmp_path):
    root = make_tree(tmp_path / "tree", {"ILSVRC2014_train_0000/a": xml(40, 30, [(APPLE, 0, 0, 9, 9)])},
                     val={"ILSVRC2013_val_00000001": xml(40, 30, [(AIRPLANE, 0, 0, 9, 9)]),
                          "ILSVRC2013_val_00000002": xml(40, 30, [])})
    tables = det_task().index(root, SkipLog())
    assert sorted(tables) == ["train", "validation"]
    assert [Path(p).name for p in tables["train"].path] == ["a.JPEG"]
    assert sorted(tables["validation"].label) == [label(AIRPLANE), imagenet_det.BACKGROUND]
    assert all(Path(p).is_absolute() and Path(p).exists() for p in tables["validation"].path)
    # Accepts the ILSVRC folder itself as the root too.
    assert len(det_task().index(root / "ILSVRC", SkipLog())["validation"]) == 2


def test_a_folder_without_the_ilsvrc_tree_is_a_dataset_error(tmp_path):
    with pytest.raises(imagenet_det.DatasetError, match="ILSVRC/Data/DET"):
        det_task().index(tmp_path, SkipLog())


def counting_parses(monkeypatch):
    calls = []
    parse = imagenet_det.parse_annotation

    def counted(path):
        calls.append(path)
        return parse(path)

    monkeypatch.setattr(imagenet_det, "parse_annotation", counted)
    return calls


def test_an_unchanged_tree_reuses_the_cached_index(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "tree", {
        "ILSVRC2014_train_0000/a": xml(100, 80, [(APPLE, 0, 0, 50, 50)]),
        "ILSVRC2014_train_0000/bad": "<annotation>",
    })
    calls = counting_parses(monkeypatch)
    first_skipped, second_skipped = SkipLog(), SkipLog()
    first = labels_of(root, first_skipped)
    assert len(calls) == 3  # two train XMLs and one validation XML
    assert list((tmp_path / "cache" / "index").glob("imagenet_det-*.pkl"))
    second = labels_of(root, second_skipped)
    assert len(calls) == 3, "the second index parsed XML again"
    assert second == first
    assert second_skipped.rows == first_skipped.rows and len(second_skipped) == 1


def test_other_pickles_in_place_of_the_index_caches_are_made_again(tmp_path):
    """The folder record and the index hold some other pickle (another version's, a copy): indexed again."""
    import pickle
    root = make_tree(tmp_path / "tree", {"ILSVRC2014_train_0000/a": xml(100, 80, [(APPLE, 0, 0, 50, 50)])})
    first = labels_of(root)
    caches = sorted((tmp_path / "cache" / "index").glob("imagenet_det-*.pkl"))
    assert len(caches) == 2  # the folder record and the index
    for foreign in (["not", "a", "dict"], {"tables": None}):
        for cache in caches:
            cache.write_bytes(pickle.dumps(foreign))
        assert labels_of(root) == first


@pytest.mark.parametrize("change", ["replace_xml", "rewrite_xml_and_touch_folder", "add_image", "remove_xml"])
def test_a_changed_tree_is_indexed_again(tmp_path, monkeypatch, change):
    """A warm start compares folder mtimes only: replacing, adding or removing a file changes its folder's; a file
    rewritten in place does not, and is picked up once its folder is touched."""
    root = make_tree(tmp_path / "tree", {"ILSVRC2014_train_0000/a": xml(100, 80, [(APPLE, 0, 0, 50, 50)])})
    calls = counting_parses(monkeypatch)
    assert labels_of(root)["a"] == label(APPLE)
    xml_path = root / "ILSVRC" / "Annotations" / "DET" / "train" / "ILSVRC2014_train_0000" / "a.xml"
    if change == "replace_xml":
        replacement = xml_path.with_suffix(".new")
        replacement.write_text(xml(100, 80, [(AIRPLANE, 0, 0, 50, 50)]))
        os.replace(replacement, xml_path)
        os.utime(xml_path.parent, ns=(1, 1))  # a different mtime even on coarse-grained file systems
    elif change == "rewrite_xml_and_touch_folder":
        xml_path.write_text(xml(100, 80, [(AIRPLANE, 0, 0, 50, 50)]))
        os.utime(xml_path, ns=(1, 1))
        assert labels_of(root)["a"] == label(APPLE), "an in-place rewrite was noticed without a folder change"
        os.utime(xml_path.parent, ns=(2, 2))
    elif change == "add_image":
        write_image(root / "ILSVRC" / "Data" / "DET" / "train" / "ILSVRC2013_train_extra0" / "n.JPEG")
    else:
        xml_path.unlink()
    parsed_before = len(calls)
    labels = labels_of(root)
    assert len(calls) > parsed_before or change == "remove_xml"
    expected = {"replace_xml": label(AIRPLANE), "rewrite_xml_and_touch_folder": label(AIRPLANE), "add_image": label(APPLE), "remove_xml": imagenet_det.BACKGROUND}
    assert labels["a"] == expected[change]
    assert ("n" in labels) == (change == "add_image")


def det_task(image_size=(24, 32)):
    return imagenet_det.ImagenetDet(Decode(image_size, "crop_or_pad"), seed=0)


@pytest.mark.parametrize("mode, image_format", [("L", "JPEG"), ("CMYK", "JPEG"), ("RGB", "PNG"), ("RGBA", "PNG")])
def test_odd_files_named_jpeg_decode_to_rgb(tmp_path, mode, image_format):
    path = tmp_path / "odd.JPEG"
    colour = (40, 90, 220)
    write_image(path, mode, image_format, size=(40, 30), colour=colour)
    record = {"path": imagenet_det.tf.constant(str(path)), "label": imagenet_det.tf.constant(7, "int64")}
    image, label_ = det_task().load(record)
    image = image.numpy()
    assert image.shape == (24, 32, 3) and image.dtype == np.uint8 and int(label_) == 7
    centre = image[12, 16].astype(int)
    if mode == "L":
        assert centre[0] == centre[1] == centre[2]
    else:  # the colour survives: blue stays the strongest channel, red the weakest
        assert np.abs(centre - colour).max() < 30, centre


def test_crop_or_pad_keeps_scale(tmp_path):
    path = tmp_path / "small.JPEG"
    write_image(path, size=(20, 10), colour=(255, 255, 255))
    record = {"path": imagenet_det.tf.constant(str(path)), "label": imagenet_det.tf.constant(0, "int64")}
    image = det_task((30, 40)).load(record)[0].numpy()
    # Zero padding around a 10x20 white centre: not stretched to fill the frame.
    assert image[0, 0].max() == 0 and image[15, 20].min() > 200
    assert (image.max(axis=-1) > 200).sum() == pytest.approx(10 * 20, abs=30)


@pytest.fixture(scope="module")
def sample_tree():
    """The session's embedded sample, as a run with dataset.root unset finds it; the tests here only read it."""
    from tf_harness.data.samples import sample_root
    return sample_root("imagenet_det", sample.make_sample)


def file_digests(root):
    """{path: sha256} of the files a generation writes (the cache's manifest of them left out)."""
    from tf_harness.data.samples import MANIFEST
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}


def test_sample_is_deterministic(sample_tree, tmp_path):
    sample.make_sample(tmp_path / "again", seed=0)
    assert file_digests(tmp_path / "again") == file_digests(sample_tree)


def test_sample_has_the_real_layout_and_every_quirk(sample_tree):
    ilsvrc = sample_tree / "ILSVRC"
    train = ilsvrc / "Data" / "DET" / "train"
    assert sorted(p.name for p in train.iterdir()) == [
        "ILSVRC2013_train", "ILSVRC2013_train_extra0", "ILSVRC2013_train_extra1",
        "ILSVRC2014_train_0000", "ILSVRC2014_train_0001"]
    for wnid in sample.CLASSES:
        assert wnid in imagenet_det.WNIDS
        assert list((train / "ILSVRC2013_train" / wnid).glob(f"{wnid}_*.JPEG"))
    assert sample.OUTSIDE_WNID not in imagenet_det.WNIDS
    assert not list((ilsvrc / "Annotations" / "DET" / "train").glob("ILSVRC2013_train_extra*/*.xml"))
    assert list((ilsvrc / "Data" / "DET" / "val").glob("ILSVRC2013_val_*.JPEG"))

    modes = Counter()
    for path in ilsvrc.joinpath("Data").rglob("*.JPEG"):
        with Image.open(path) as image:
            modes[(image.format, image.mode)] += 1
    assert modes[("JPEG", "L")] == 1 and modes[("JPEG", "CMYK")] == 1 and modes[("PNG", "RGB")] == 1

    texts = [p.read_text() for p in ilsvrc.joinpath("Annotations").rglob("*.xml")]
    assert any(t.index("<size>") > t.index("<object>") for t in texts if "<object>" in t)  # reordered children
    assert any("<object>" not in t for t in texts)  # no object
    past_edge = 0
    for path in ilsvrc.joinpath("Annotations").rglob("*.xml"):
        try:
            width, height, objects = imagenet_det.parse_annotation(path)
        except Exception:
            continue
        past_edge += any(xmax > width or ymax > height for _, _, _, xmax, ymax in objects)
    assert past_edge >= 5


def test_sample_indexes_with_one_skip_and_every_class(sample_tree):
    skipped = SkipLog()
    tables = det_task().index(sample_tree, skipped)
    assert len(skipped) == 1 and skipped.rows[0][1].startswith("malformed XML")
    expected = {label(wnid) for wnid in sample.CLASSES} | {imagenet_det.BACKGROUND}
    for table in tables.values():
        assert set(table.label) == expected
    assert len(tables["train"]) > 300 and len(tables["validation"]) >= 100


def test_sample_signal_is_the_largest_objects_colour(sample_tree):
    """The colour at the centre of the largest box matches its class, so there is something to learn."""
    checked = 0
    for xml_path in sorted((sample_tree / "ILSVRC" / "Annotations" / "DET" / "val").glob("*.xml"))[:30]:
        width, height, objects = imagenet_det.parse_annotation(xml_path)
        if imagenet_det.largest_object_label(width, height, objects) == imagenet_det.BACKGROUND:
            continue
        image_path = Path(str(xml_path).replace("Annotations", "Data")).with_suffix(".JPEG")
        pixels = np.asarray(Image.open(image_path).convert("RGB"), float)
        wnid, xmin, ymin, xmax, ymax = max(
            objects, key=lambda o: (min(o[3], width) - max(o[1], 0)) * (min(o[4], height) - max(o[2], 0)))
        centre = pixels[int((ymin + min(ymax, height)) / 2), int((xmin + min(xmax, width)) / 2)]
        # Each object's brightness varies, so compare with every class colour at its best-fitting brightness.
        def distance(colour):
            colour = np.asarray(colour, float)
            scale = np.clip(centre @ colour / (colour @ colour), 0.7, 1.05)
            return np.abs(centre - scale * colour).max()

        nearest = min(sample.CLASSES, key=lambda name: distance(sample.CLASSES[name]))
        assert nearest == wnid, (xml_path, centre)
        checked += 1
    assert checked >= 15


def test_config_defaults():
    cfg = compose("dataset=imagenet_det")
    assert first_problem(cfg) is None
    assert cfg.model.name == "semi_alexnet" and cfg.dataset.root is None
    assert list(cfg.pipeline.image_size) == [415, 482]  # height, width: 415x482 images
    assert cfg.dataset.normalize == "per_image_standardization" and cfg.dataset.resize == "crop_or_pad"
    assert cfg.dataset.flip is True
    assert first_problem(compose("dataset=imagenet_det", "model=siamese_cnn")).startswith("model=siamese_cnn takes ")


def assert_run_dir(run_dir, global_step):
    assert list((run_dir / "checkpoints").glob(f"ckpt-{global_step}.index"))
    assert {"loss", "input_wait_fraction"} <= event_tags(run_dir / "train")[1]
    assert {"loss", "accuracy", "top5_accuracy"} <= event_tags(run_dir / "validation")[1]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_step"] == global_step
    skipped = (run_dir / "skipped.csv").read_text()
    assert "ILSVRC2014_train_00000002.xml" in skipped and "malformed XML" in skipped
    return metrics


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cli_tiny_run_on_the_sample(tmp_path, dtype):
    run_dir = tmp_path / "run"
    result = run_cli("dataset=imagenet_det", "trainer.train_steps=2", "trainer.eval_every=2",
                     "trainer.eval_steps=2", "pipeline.batch_size=2", "pipeline.image_size=[64,80]",
                     f"pipeline.dtype={dtype}", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "embedded imagenet_det sample" in result.stderr + result.stdout
    metrics = assert_run_dir(run_dir, 2)
    # trainer.eval_steps=2: a sample of 2 x 32 of the validation images, whatever the batch size
    assert metrics["examples"] == 64 < metrics["split_examples"]
    assert 0 <= metrics["accuracy"] <= metrics["top5_accuracy"] <= 1


@pytest.mark.slow
def test_cli_default_run_learns_the_largest_object(tmp_path):
    """`python run.py dataset=imagenet_det` as a user types it: well above chance within its step budget."""
    run_dir = tmp_path / "run"
    result = run_cli("dataset=imagenet_det", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = assert_run_dir(run_dir, compose("dataset=imagenet_det").trainer.train_steps)
    tables = det_task().index(sample_root_of(result), SkipLog())
    chance = 1 / tables["validation"].label.nunique()
    assert metrics["examples"] == len(tables["validation"])
    assert metrics["accuracy"] >= 2 * chance, metrics


def sample_root_of(result):
    """The sample folder that a run logged it was using."""
    for line in (result.stderr + result.stdout).splitlines():
        if "using the embedded imagenet_det sample at " in line:
            return Path(line.split(" sample at ")[-1].strip())
    raise AssertionError("the run did not log the embedded sample it used")
