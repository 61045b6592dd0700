"""Files replaced whole through a temporary file of this process (data/integrity/atomic_file.py)."""
import os
import pickle

import pytest

from tf_harness.data.integrity import atomic_file
from tf_harness.data.integrity.atomic_file import is_temporary, publish, replacing, temporary_of


def test_a_clean_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text("the previous content, longer than the new one\n")
    before = path.stat().st_ino
    with replacing(path) as f:
        f.write("new")
        assert path.read_text() == "the previous content, longer than the new one\n"  # a reader sees the old file
    assert path.read_text() == "new"
    assert path.stat().st_ino != before, "renamed over the file, not written into it"
    assert sorted(os.listdir(tmp_path)) == ["metrics.json"]


def test_a_new_file_is_made_and_a_str_path_is_taken(tmp_path):
    with replacing(str(tmp_path / "skipped.csv"), newline="") as f:
        f.write("path,reason\r\n")
    assert (tmp_path / "skipped.csv").read_bytes() == b"path,reason\r\n"
    assert sorted(os.listdir(tmp_path)) == ["skipped.csv"]


@pytest.mark.parametrize("existing", [True, False])
def test_an_error_while_writing_leaves_the_previous_file_and_no_temporary(tmp_path, existing):
    path = tmp_path / "job_outcome.json"
    if existing:
        path.write_text("an earlier outcome\n")
    with pytest.raises(OSError, match="No space left"):
        with replacing(path) as f:
            f.write("half an out")
            f.flush()
            assert temporary_of(path).read_text() == "half an out"
            raise OSError(28, "No space left on device")
    assert sorted(os.listdir(tmp_path)) == (["job_outcome.json"] if existing else [])
    if existing:
        assert path.read_text() == "an earlier outcome\n"


def test_a_failed_rename_removes_the_temporary(tmp_path):
    path = tmp_path / "manifest.json"
    path.mkdir()  # a folder in the file's place: the rename fails
    with pytest.raises(OSError):
        with replacing(path) as f:
            f.write("{}")
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"] and path.is_dir()


def test_the_temporary_is_hidden_beside_the_file_and_named_for_this_process(tmp_path):
    path = tmp_path / "metrics.json"
    with replacing(path) as f:
        seen = os.listdir(tmp_path)
        assert os.path.dirname(f.name) == str(tmp_path)
    assert seen == [f".metrics.json.{os.getpid()}.tmp"]
    assert temporary_of(path) == tmp_path / seen[0]


def test_another_processs_temporary_is_left_alone(tmp_path):
    """A trainer and its sidecar evaluator both write metrics.json; neither writes into the other's temporary."""
    other = tmp_path / f".metrics.json.{os.getpid() + 1}.tmp"
    other.write_text("another process's half file")
    with replacing(tmp_path / "metrics.json") as f:
        f.write("{}")
    assert other.read_text() == "another process's half file"
    assert (tmp_path / "metrics.json").read_text() == "{}"


def test_binary_mode_writes_bytes(tmp_path):
    path = tmp_path / "cache.pkl"
    with replacing(path, "wb") as f:
        pickle.dump({"verdicts": 1}, f)
    assert pickle.loads(path.read_bytes()) == {"verdicts": 1}


def test_only_write_modes_are_taken(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text("kept")
    for mode in ("a", "r+", "rb"):
        with pytest.raises(ValueError, match="not a write mode"):
            with replacing(path, mode):
                pass
    assert path.read_text() == "kept" and sorted(os.listdir(tmp_path)) == ["metrics.json"]


def test_the_temporaries_of_any_process_are_recognised_and_nothing_else():
    assert is_temporary(f".manifest.json.{os.getpid()}.tmp", of="manifest.json")
    assert is_temporary(".manifest.json.12345.tmp", of="manifest.json")
    for name in ("manifest.json", "manifest.json.tmp", ".manifest.json.tmp", ".manifest.json.12a.tmp",
                 ".manifestXjson.1.tmp", ".manifest.json.1.tmp.x", ".skipped.csv.1.tmp"):
        assert not is_temporary(name, of="manifest.json"), name


def test_two_writes_in_a_row_each_replace_the_file(tmp_path):
    """The second write reuses this process's temporary name, which the first left free."""
    path = tmp_path / "input_pipelines.json"
    for content in ("first", "second"):
        with replacing(path) as f:
            f.write(content)
    assert path.read_text() == "second" and sorted(os.listdir(tmp_path)) == ["input_pipelines.json"]


def test_a_writer_may_name_its_own_temporary(tmp_path):
    """One that a clean-up elsewhere knows, or one unique across hosts: it is used, and gone afterwards."""
    path, temporary = tmp_path / "entry.pb.sha256", tmp_path / ".entry.pb.sha256.1a2b3c4d.tmp"
    with replacing(path, temporary=temporary) as f:
        f.write("{}")
        assert sorted(os.listdir(tmp_path)) == [temporary.name]
    assert path.read_text() == "{}" and sorted(os.listdir(tmp_path)) == ["entry.pb.sha256"]
    with pytest.raises(OSError, match="No space left"):
        with replacing(path, temporary=str(temporary)) as f:
            f.write("half")
            raise OSError(28, "No space left on device")
    assert path.read_text() == "{}" and sorted(os.listdir(tmp_path)) == ["entry.pb.sha256"]


@pytest.mark.parametrize("fsync", [False, True])
def test_publish_renames_a_whole_file_over_its_place_flushing_it_first_when_asked(tmp_path, monkeypatch, fsync):
    path, temporary = tmp_path / "checkpoint", tmp_path / "checkpoint.tmp0f"
    path.write_text("the previous state")
    temporary.write_text("the new state")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(atomic_file.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}"))
                        or real_fsync(fd))
    publish(temporary, path, fsync=fsync)
    assert path.read_text() == "the new state" and sorted(os.listdir(tmp_path)) == ["checkpoint"]
    assert synced == ([str(temporary)] if fsync else [])


def test_a_publish_that_fails_removes_the_temporary_and_leaves_the_place_as_it_was(tmp_path):
    path, temporary = tmp_path / "shard-00000-of-00001.tfrecord", tmp_path / "shard-00000-of-00001.tfrecord.tmp"
    path.mkdir()  # a folder in the file's place: the rename fails
    temporary.write_bytes(b"records")
    with pytest.raises(IsADirectoryError):
        publish(temporary, path)
    assert sorted(os.listdir(tmp_path)) == [path.name] and path.is_dir()


def test_a_rename_that_a_folder_in_the_place_refuses_names_the_place_not_the_temporary(tmp_path):
    path = tmp_path / "metrics.json"
    path.mkdir()
    with pytest.raises(IsADirectoryError) as refused:
        with replacing(path) as f:
            f.write("{}")
    assert refused.value.filename == str(path) and refused.value.filename2 is None
    assert sorted(os.listdir(tmp_path)) == ["metrics.json"] and path.is_dir()
