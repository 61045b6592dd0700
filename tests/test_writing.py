"""Files replaced whole through a temporary file of this process (data/integrity/writing.py)."""
import logging
import os
import pickle
import re
import socket

import pytest

from tf_harness.data.integrity import reading, writing
from tf_harness.data.integrity.writing import is_temporary, publish, replacing, temporary_of
from tests.conftest import PROJECT
from tests.refusals import assert_names
from tests.test_reading import within


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
    monkeypatch.setattr(writing.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}"))
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


def _replaced(path, text="{}"):
    with replacing(path) as file:
        file.write(text)


def _appended(path):
    with writing.appending(path) as file:
        file.write("a line\n")


def _created(path):
    with writing.creating(path) as file:
        file.write("{}")


def _logged(path):
    handler = writing.LogFile(path)
    handler.emit(logging.makeLogRecord({"msg": "a line"}))
    handler.close()


WRITERS = {"replacing": _replaced, "appending": _appended, "log file": _logged,
           "publish": lambda path: publish(_temporary_with(path, "new"), path),
           "write_text": lambda path: writing.write_text(path, "new"),
           "write_bytes": lambda path: writing.write_bytes(path, b"new")}


def _temporary_with(path, text):
    temporary = path.with_name(f".{path.name}.given.tmp")
    temporary.write_text(text)
    return temporary


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("kind", ["named pipe", "socket", "folder"])
def test_what_is_not_a_regular_file_in_a_files_place_is_refused_at_once_and_left_there(tmp_path, writer, kind):
    """A named pipe there made a plain open wait for ever; a rename over it lost what someone else put there."""
    path = tmp_path / "predictions.csv"
    if kind == "named pipe":
        os.mkfifo(path)
    elif kind == "folder":
        (path / "kept").mkdir(parents=True)
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
    outcome, error = within(WRITERS[writer], path)
    assert outcome == "error" and isinstance(error, reading.SpecialFileError), (outcome, error)
    assert_names(str(error), f"{path} is a {kind}, not a regular file")
    assert isinstance(error, IsADirectoryError) == (kind == "folder")
    assert os.path.exists(path) and not path.is_file() and sorted(os.listdir(tmp_path)) == ["predictions.csv"]


@pytest.mark.parametrize("writer", ["replacing", "write_text"])
def test_a_named_pipe_in_the_temporarys_place_is_refused_not_waited_on(tmp_path, writer):
    path = tmp_path / "metrics.json"
    os.mkfifo(temporary_of(path))
    outcome, error = within(WRITERS[writer], path)
    assert outcome == "error" and isinstance(error, reading.SpecialFileError), (outcome, error)
    assert_names(str(error), f"{temporary_of(path)} is a named pipe")
    assert not path.exists()


def test_creating_refuses_anything_in_the_place_without_waiting(tmp_path):
    path = tmp_path / "record.json"
    os.mkfifo(path)
    outcome, error = within(_created, path)
    assert outcome == "error" and isinstance(error, FileExistsError), (outcome, error)
    _created(tmp_path / "new.json")
    assert (tmp_path / "new.json").read_text() == "{}"


def test_appending_adds_to_a_regular_file_and_makes_a_missing_one(tmp_path):
    path = tmp_path / "run.log"
    _appended(path)
    _appended(path)
    _logged(path)
    assert path.read_text() == "a line\na line\na line\n"
    with writing.appending(path, "ab", buffering=0) as file:
        assert file.name == str(path)
    with pytest.raises(ValueError, match="not an append mode"):
        writing.appending(path, "w")


# A write by path past the door: pathlib's, pandas', OmegaConf's, PIL's and logging's writers, `open` to write.
PAST_THE_DOOR = re.compile(r"(?<!writing)\.write_(?:text|bytes)\(|\.to_csv\((?!f\b|file\b)|"
                           r"OmegaConf\.save\([^,]+,\s*(?!\s|f\b|file\b)|"
                           r"(?<![\w.])open\([^)]*[\"'][wax]b?\+?[\"']|os\.fdopen\(|logging\.FileHandler\(|"
                           r"\.save\((?:path|image_path|\w+_path)\b")


def test_no_module_of_the_project_writes_a_file_past_the_door():
    """Every file the project's code writes by its path goes through data/integrity/writing.py; what TensorFlow
    writes itself (checkpoints, event files, a SavedModel, TFRecord shards) is not matched."""
    sources = [PROJECT / "run.py", PROJECT / "compare.py"]
    sources += [path for folder in ("experiments", "data", "models") for path in sorted((PROJECT / folder).rglob("*.py"))
                if path.name != "writing.py"]
    found = [f"{path.relative_to(PROJECT)}:{number}: {line.strip()}" for path in sources
             for number, line in enumerate(path.read_text().splitlines(), 1) if PAST_THE_DOOR.search(line)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("kind", ["named pipe", "folder"])
def test_a_place_a_re_entry_writes_or_locks_is_refused_before_hydra_starts(tmp_path, kind):
    """Each file a run writes at a fixed name in its run directory (its log, lock, records, checkpoint state,
    predictions) is looked at before Hydra starts: a refusal at the write would come mid-run, after training."""
    from tf_harness.experiments.run_dir import reentry

    for name in reentry._WRITTEN:
        run_dir = tmp_path / f"run-{len(os.listdir(tmp_path))}"
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(run_dir / name) if kind == "named pipe" else (run_dir / name).mkdir()
        line = reentry.unreadable_record([f"hydra.run.dir={run_dir}"])
        assert_names(line, f"{run_dir / name} is a {kind}, not a regular file", "move it away")
        assert (run_dir / name).exists() and not (run_dir / name).is_file()


def test_the_places_looked_at_first_are_the_names_the_writers_use():
    from tf_harness.experiments import evaluator as evaluation
    from tf_harness.experiments.evaluation import heatmaps, metrics_history
    from tf_harness.experiments.run_dir import checkpoints, input_record, reentry, run_lock
    from tf_harness.experiments.training import recipes

    used = {run_lock.LOCK_NAME, run_lock.EVAL_LOCK_NAME, metrics_history.NAME, recipes.RECORD,
            f"checkpoints/{checkpoints.STATE}", f"checkpoints/{input_record.INPUT_RECORD}", "metrics.json",
            f"{heatmaps.FOLDER}/{heatmaps.INDEX}", "skipped.csv", "run.log"}
    used |= {name for split in evaluation.BESIDE for name in (evaluation.BESIDE[split],
                                                              evaluation.BESIDE[split] + "l")}
    used |= {evaluation.predictions_file(split, has_test=True) for split in ("test", "validation")}
    assert used == set(reentry._WRITTEN)
