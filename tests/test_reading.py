"""The one door for reading: a named pipe, socket or device where the project expects one of its files is one
line naming the path and what it is, at once, never a wait; and the run directory's own files that the issue
named (checkpoints/checkpoint, metrics.json, .lock) go through it."""
import logging
import os
import re
import socket
import threading

import pytest

from tf_harness.data.errors import DatasetError
from tf_harness.data.integrity import locks, pickle_cache, reading
from tests.conftest import PROJECT
from tests.refusals import assert_names, raises_naming

SECONDS = 10  # a refusal is at once; a call that blocks on the pipe runs into this bound instead of hanging the suite


def within(call, *args, seconds=SECONDS):
    """`call(*args)`'s ("value", v) or ("error", e); ("blocked", None) when it has not returned within `seconds`."""
    found = {}

    def run():
        try:
            found["value"] = call(*args)
        except BaseException as error:  # noqa: BLE001  handed to the test
            found["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for path in args:  # a writer lets a blocked open of a named pipe return, so the thread ends
            if isinstance(path, (str, os.PathLike)) and os.path.exists(path) and reading.kind_of(
                    os.stat(path).st_mode) == "named pipe":
                os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
        return "blocked", None
    return ("error", found["error"]) if "error" in found else ("value", found.get("value"))


@pytest.fixture
def pipe(tmp_path):
    path = tmp_path / "metrics.json"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("call", [reading.read_bytes, reading.read_text, reading.open_file,
                                  lambda path: reading.open_descriptor(path, os.O_RDWR | os.O_CREAT)])
def test_a_named_pipe_is_refused_at_once_naming_its_path_and_kind(pipe, call):
    outcome, error = within(call, pipe)
    assert outcome == "error", outcome
    assert isinstance(error, reading.SpecialFileError)
    assert_names(str(error), f"{pipe} ", "named pipe")


def test_the_refusal_is_an_os_error_and_a_dataset_error(pipe):
    """Every caller that copes with an unreadable file copes with it; a command line reports it as one line."""
    with pytest.raises(OSError) as raised:
        reading.read_bytes(pipe)
    assert isinstance(raised.value, DatasetError) and raised.value.filename == str(pipe)


def test_a_socket_and_a_device_are_named_as_what_they_are(tmp_path):
    path = tmp_path / "best.json"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with raises_naming(reading.SpecialFileError, f"{path} ", "socket"):
            reading.read_bytes(path)
    with raises_naming(reading.SpecialFileError, "/dev/null ", "character device"):
        reading.read_bytes("/dev/null")


def test_a_pipe_put_there_after_the_stat_is_refused_by_the_second_look(pipe, monkeypatch):
    """The path is looked at again once opened (without blocking), which closes the gap between stat and open."""
    monkeypatch.setattr(reading, "check", lambda path: None)
    outcome, error = within(reading.read_bytes, pipe)
    assert outcome == "error" and isinstance(error, reading.SpecialFileError), (outcome, error)


def test_regular_files_folders_and_missing_files_read_as_open_would(tmp_path):
    (tmp_path / "a.txt").write_text("é\n")
    assert reading.read_text(tmp_path / "a.txt") == "é\n"
    with reading.open_file(tmp_path / "a.txt", "r") as file:
        assert file.read() == "é\n"
    with pytest.raises(IsADirectoryError) as folder:
        reading.read_bytes(tmp_path)
    assert folder.value.filename == str(tmp_path)
    with pytest.raises(FileNotFoundError):
        reading.read_bytes(tmp_path / "none")
    # A descriptor the door hands out blocks as usual (it was opened without blocking only to look).
    descriptor = reading.open_descriptor(tmp_path / "a.txt")
    try:
        assert os.get_blocking(descriptor)
    finally:
        os.close(descriptor)


def test_the_lock_file_a_named_pipe_is_one_line_not_an_os_error_22(tmp_path):
    from tf_harness.experiments.run_dir import run_lock

    os.mkfifo(tmp_path / ".lock")
    outcome, error = within(run_lock.hold, tmp_path)
    assert outcome == "error" and isinstance(error, reading.SpecialFileError), (outcome, error)
    assert_names(str(error), f"{tmp_path / '.lock'} ", "named pipe")
    assert within(locks.held_elsewhere, tmp_path / ".lock")[0] == "error"


def test_metrics_json_a_named_pipe_is_taken_as_no_evaluation(pipe, caplog):
    from tf_harness.experiments.evaluation.metrics_history import evaluated_step

    with caplog.at_level(logging.WARNING):
        assert within(evaluated_step, pipe.parent) == ("value", None)
    assert f"{pipe} cannot be read" in caplog.text and "named pipe" in caplog.text


def test_the_checkpoint_state_file_a_named_pipe_is_read_around_and_never_written_over(tmp_path, caplog):
    import tensorflow as tf

    from tf_harness.experiments.run_dir import checkpoints

    folder = tmp_path / "checkpoints"
    step = tf.Variable(2, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(step=step, weight=tf.Variable([1.0, 2.0]))
    checkpoint.write(str(folder / "ckpt-2"))
    os.mkfifo(folder / checkpoints.STATE)
    with caplog.at_level(logging.WARNING):
        assert within(checkpoints.newest_finite, folder) == ("value", str(folder / "ckpt-2"))
    assert "named pipe" in caplog.text
    # Training on would write the state file: the door refuses the pipe in one line, and leaves it there.
    outcome, error = within(lambda: checkpoints.Manager(checkpoint, folder, 3, step_counter=step,
                                                        restored=str(folder / "ckpt-2"), train_steps=4))
    assert outcome == "error" and isinstance(error, reading.SpecialFileError), (outcome, error)
    assert_names(str(error), f"{folder / checkpoints.STATE} ", "named pipe")
    assert (folder / checkpoints.STATE).is_fifo()
    assert sorted(path.name for path in folder.iterdir()) == ["checkpoint", "ckpt-2.data-00000-of-00001",
                                                              "ckpt-2.index"]


def test_a_cache_that_is_a_named_pipe_is_made_again(pipe):
    assert within(pickle_cache.read, pipe, "default") == ("value", "default")
    pickle_cache.write(pipe, {"made": "again"})
    assert pickle_cache.read(pipe) == {"made": "again"}


def test_the_input_record_and_best_json_named_pipes_read_as_none(tmp_path):
    from tf_harness.experiments.run_dir import input_record
    from tf_harness.experiments.training import recipes

    os.mkfifo(tmp_path / input_record.INPUT_RECORD)
    assert within(input_record._input_records, tmp_path) == ("value", [])
    os.mkfifo(tmp_path / "best.json")
    assert within(recipes._read_json, tmp_path / "best.json") == ("value", None)


def test_metrics_jsonl_a_named_pipe_is_refused_not_waited_on(tmp_path):
    from tf_harness.experiments.evaluation import metrics_history

    os.mkfifo(tmp_path / metrics_history.NAME)
    outcome, error = within(metrics_history.append, tmp_path, {"global_step": 1})
    assert outcome == "error" and isinstance(error, reading.SpecialFileError), (outcome, error)
    assert within(metrics_history.read, tmp_path) == ("value", [])


def _unblock(path):
    """Lets an open of the named pipe `path` that waits for a writer return (a failing test's thread then ends)."""
    os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))


@pytest.mark.parametrize("name", [".hydra/config.yaml", "predictions.csv"])
def test_compare_refuses_a_named_pipe_in_a_runs_place_in_one_line(tmp_path, name):
    from tf_harness.experiments import compare

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("dataset:\n  name: lfw_pairs\n")
    (tmp_path / name).unlink(missing_ok=True)
    os.mkfifo(tmp_path / name)
    outcome, error = within(compare.read_run, tmp_path, "test")
    if outcome == "blocked":
        _unblock(tmp_path / name)
    assert outcome == "error" and isinstance(error, compare.Refused), (outcome, error)
    assert f"{tmp_path / name} cannot be read (is a named pipe" in str(error)


@pytest.mark.parametrize("name", ["multirun.yaml", ".sweep-lock"])
@pytest.mark.parametrize("make, said", [(os.mkfifo, "is a named pipe"), (os.mkdir, "Is a directory")])
def test_a_pipe_or_folder_in_a_sweep_folders_record_or_lock_is_one_line_before_hydra_writes(tmp_path, capsys, name,
                                                                                             make, said):
    """A folder at .sweep-lock escaped the callback as an exception Hydra only warns of: the sweep ran unlocked."""
    from tf_harness.experiments.sweeps.sweep_folder import SweepFolder

    make(tmp_path / name)
    outcome, error = within(SweepFolder.claim, tmp_path, ["seed=1,2"])
    if outcome == "blocked":
        _unblock(tmp_path / name)
    assert outcome == "error" and isinstance(error, SystemExit) and error.code == 1, (outcome, error)
    printed = capsys.readouterr().err
    assert printed.count("\n") == 1 and printed.startswith("error: ") and str(tmp_path / name) in printed, printed
    assert said in printed, printed


def test_the_pruned_note_leaves_a_named_pipe_in_place_of_metrics_json_unread(tmp_path):
    from tf_harness.experiments.sweeps.pruning import Pruning

    os.mkfifo(tmp_path / "metrics.json")
    outcome, error = within(Pruning(None, None, None, tmp_path, True)._note, 3)
    if outcome == "blocked":
        _unblock(tmp_path / "metrics.json")
    assert (outcome, error) == ("value", None)


# A read by path past the door: pathlib's, OmegaConf's, pandas', json's and numpy's loaders, a bare `open` to read.
PAST_THE_DOOR = re.compile(r"\.read_(?:text|bytes)\(\)|OmegaConf\.load\(|pd\.read_csv\((?!file\b)|json\.load\(|"
                           r"np\.load\(|(?<![\w.])open\([^,()]+(?:,\s*[\"']r[bt]?[\"'])?\)")


def test_no_module_of_the_project_reads_a_file_past_the_door():
    """Every file the project's code opens by its path to read goes through data/integrity/reading.py; writes,
    and reads of what is already open, are not matched."""
    sources = [PROJECT / "run.py", PROJECT / "compare.py"]
    sources += [path for folder in ("experiments", "data", "models") for path in sorted((PROJECT / folder).rglob("*.py"))
                if "integrity" not in path.parts]
    found = [f"{path.relative_to(PROJECT)}:{number}: {line.strip()}" for path in sources
             for number, line in enumerate(path.read_text().splitlines(), 1) if PAST_THE_DOOR.search(line)]
    assert not found, "\n".join(found)


def test_a_named_pipe_in_place_of_a_sqlite_study_is_one_line(tmp_path):
    import optuna  # noqa: F401  imported before the bound, which is for the wait alone
    from tf_harness.experiments.sweeps import study

    os.mkfifo(tmp_path / "optuna.db")
    outcome, error = within(study.open_storage, f"sqlite:///{tmp_path / 'optuna.db'}")
    if outcome == "blocked":
        _unblock(tmp_path / "optuna.db")
    assert outcome == "error" and isinstance(error, study.StorageError), (outcome, error)
    assert f"{tmp_path / 'optuna.db'} is a named pipe" in str(error) and "\n" not in str(error)


def _table(path):
    import pandas as pd

    pd.DataFrame({"path": ["/data/a.png", "/data/b.png"], "Mass": [0.25, 0.5], "split": ["test", "test"]}).to_csv(
        path, index=False)
    return path.read_bytes()


@pytest.mark.parametrize("damage, why", [
    (lambda whole: whole[:len(whole) - 9], "line 3 has 2 of its 3 fields"),
    (lambda whole: b"", "empty"),
    (lambda whole: whole.replace(b"Mass", b"M\xffss"), "not UTF-8"),
    (lambda whole: whole + b"/data/c.png,0.75,test,extra\n", "line 4 has 4 of its 3 fields"),
])
def test_a_csv_read_back_that_a_whole_write_would_not_leave_is_one_line_naming_it(tmp_path, damage, why):
    """predictions.csv cut mid-row made compare end in a TypeError; each reader of its own CSVs judged damage
    its own way, or not at all."""
    path = tmp_path / "predictions.csv"
    path.write_bytes(damage(_table(path)))
    with raises_naming(reading.DamagedTableError, f"{path} is damaged", why) as raised:
        reading.read_csv(path)
    assert isinstance(raised.value, DatasetError) and "\n" not in str(raised.value)


def test_a_whole_csv_reads_back_as_written_and_a_missing_column_asked_for_is_named(tmp_path):
    path = tmp_path / "index.csv"
    _table(path)
    table = reading.read_csv(path, dtype={"path": str})
    assert list(table.columns) == ["path", "Mass", "split"] and table.Mass.tolist() == [0.25, 0.5]
    with raises_naming(reading.DamagedTableError, f"{path} is damaged", "file"):
        reading.read_csv(path, usecols=["file"])
    os.mkfifo(tmp_path / "pipe.csv")
    assert within(reading.read_csv, tmp_path / "pipe.csv")[0] == "error"
