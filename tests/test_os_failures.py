"""Expected OS failures give one line and exit 1, no traceback, and lose nothing: a full disk, a read-only
run or cache folder, a path too long.

Root ignores file modes, so the full and read-only folders are small tmpfs mounts (the tests run as root
here and in CI; without the right to mount they fail rather than pass untested).
"""
import errno
import os
import re
import subprocess
import sys
from contextlib import contextmanager

import pytest
import tensorflow as tf

from tf_harness.experiments.run_dir import checkpoints, os_errors
from tests.conftest import PROJECT, run_cli, wait_for_checkpoint
from tests.refusals import assert_error, assert_names

TINY = ("dataset=lfw_pairs", "pipeline.image_size=24", "pipeline.batch_size=8", "model.widths=[8,16]",
        "model.embedding_size=16", "model.head_units=8", "trainer.eval_steps=2", "trainer.log_every=1",
        "trainer.eval_every=100000")


@contextmanager
def tmpfs(path, size="64m", read_only=False):
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                             text=True)
    assert mounted.returncode == 0, f"these tests need to mount a tmpfs (run as root): {mounted.stderr}"
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_tensorflow_and_python_wordings_become_one_line():
    class NotFound(Exception):  # the way TensorFlow's OpErrors name their module
        __module__ = "tensorflow.python.framework.errors_impl"

    saved = NotFound("{{function_node __wrapped__SaveV2_dtypes_3_device_/job:localhost/replica:0/task:0/device:CPU:0}}"
                     " /run/checkpoints/ckpt-6_temp/part-00000-of-00001.data-00000-of-00001.tempstate1; No space left "
                     "on device [Op:SaveV2]")
    line = os_errors.describe(saved)
    assert_names(line, "No space left on device",
                 "/run/checkpoints/ckpt-6_temp/part-00000-of-00001.data-00000-of-00001.tempstate1", "resumes")
    assert "\n" not in line and "SaveV2" not in line
    wrapped = RuntimeError("while writing")
    wrapped.__cause__ = OSError(errno.EROFS, os.strerror(errno.EROFS), "/ro/run")
    assert_names(os_errors.describe(wrapped), "Read-only file system: /ro/run", "writable")
    # An op that names no path: the line says what happened without inventing one from the op's name.
    unnamed = NotFound("{{function_node __wrapped__CreateSummaryFileWriter_device_/job:localhost/replica:0/task:0/"
                       "device:CPU:0}} Not a directory [Op:CreateSummaryFileWriter] name: ")
    line = os_errors.describe(unnamed)
    assert_names(line, "Not a directory", "hydra.run.dir", "HARNESS_CACHE")
    assert "/" not in line and "CreateSummaryFileWriter" not in line
    assert_names(os_errors.describe(IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), "/run/metrics.json")),
                 "Is a directory: /run/metrics.json", "hydra.run.dir", "HARNESS_CACHE")
    # A want of a resource is named as such: a file grown past the limit on one file's size (ulimit -f; Python
    # ignores SIGXFSZ, so a write fails), no file handle left.
    for number, what in ((errno.EFBIG, "out of room under the file size limit (ulimit -f)"),
                         (errno.EMFILE, "out of file handles")):
        line = os_errors.describe(OSError(number, os.strerror(number), "/run/checkpoints"))
        assert line.startswith(what) and "/run/checkpoints" in line, line
    assert os_errors.describe(FileNotFoundError(errno.ENOENT, "No such file", "/x")) is None  # not expected: a bug
    assert os_errors.describe(ValueError("No space left on device")) is None


def test_a_path_too_long_exits_1_with_one_line(tmp_path):
    result = run_cli(*TINY, f"hydra.run.dir={tmp_path / ('x' * 300) / 'run'}", timeout=300)
    assert_error(result, 1, f"File name too long: {tmp_path}/xxx")


def test_a_read_only_run_folder_exits_1_with_one_line(tmp_path):
    with tmpfs(tmp_path / "ro", read_only=True) as read_only:
        result = run_cli(*TINY, f"hydra.run.dir={read_only / 'run'}", timeout=300)
    assert_error(result, 1, f"Read-only file system: {read_only / 'run'};", "writable")


def test_a_run_folder_that_is_a_file_exits_1_with_one_line(tmp_path):
    (tmp_path / "run").write_text("a file")
    result = run_cli(*TINY, f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    assert_error(result, 1, f"File exists: {tmp_path / 'run'};")
    assert (tmp_path / "run").read_text() == "a file"


def test_a_folder_where_the_lock_file_must_be_exits_1_with_one_line(tmp_path):
    (tmp_path / "run" / ".lock").mkdir(parents=True)
    result = run_cli(*TINY, f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    assert_error(result, 1, f"{tmp_path / 'run' / '.lock'} is a folder, not a regular file", "move it away")
    assert (tmp_path / "run" / ".lock").is_dir()


@pytest.mark.slow  # TensorFlow starts before the event files are written
def test_a_file_where_an_event_folder_must_be_exits_1_naming_it(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train").write_text("a file")
    result = run_cli(*TINY, "trainer.train_steps=2", f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    assert_error(result, 1, f"File exists: {tmp_path / 'run' / 'train'};")
    assert (tmp_path / "run" / "train").read_text() == "a file"


@pytest.mark.slow  # TensorFlow starts before the cache is written
def test_a_cache_folder_that_is_a_file_exits_1_with_one_line(tmp_path):
    (tmp_path / "cache").write_text("a file")
    result = run_cli(*TINY, "trainer.train_steps=2", f"hydra.run.dir={tmp_path / 'run'}", timeout=300,
                     env={"HARNESS_CACHE": str(tmp_path / "cache")})
    assert_error(result, 1, f"Not a directory: {tmp_path / 'cache'}")
    assert (tmp_path / "cache").read_text() == "a file"


@pytest.mark.slow  # TensorFlow starts before the cache is written
def test_a_read_only_cache_folder_exits_1_with_one_line(tmp_path):
    with tmpfs(tmp_path / "ro", read_only=True) as read_only:
        result = run_cli(*TINY, "trainer.train_steps=2", f"hydra.run.dir={tmp_path / 'run'}", timeout=300,
                         env={"HARNESS_CACHE": str(read_only / "cache")})
    assert_error(result, 1, f"Read-only file system: {read_only / 'cache'}")


def fill(disk):
    """Writes a file until the disk is full."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC


def test_a_full_disk_before_there_is_a_checkpoint_says_where_to_run_instead():
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a write to a file opened earlier names none
    fresh = os_errors.describe(full, where="/run/.hydra", resumable=False)
    assert_names(fresh, "No space left on device: /run/.hydra;", "hydra.run.dir")
    assert "resumes" not in fresh
    assert_names(os_errors.describe(full, where="/run/.hydra"), "No space left on device: /run/.hydra;", "resumes")
    named = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/run/skipped.csv")
    assert_names(os_errors.describe(named, where="/run", resumable=False), "No space left on device: /run/skipped.csv;")


def test_a_run_started_on_a_full_disk_exits_1_naming_where_and_leaves_no_folder(tmp_path):
    with tmpfs(tmp_path / "disk", size="64k") as disk:
        fill(disk)
        result = run_cli(*TINY, f"hydra.run.dir={disk / 'run'}", timeout=300)
        assert "resumes" not in assert_error(result, 1, f"No space left on device: {disk / 'run' / '.hydra'};",
                                             "hydra.run.dir")
        assert not (disk / "run").exists()


def test_the_run_files_written_first_name_themselves_on_a_full_disk(tmp_path):
    """The run lock and skipped.csv are written by Python, whose failed write names no file."""
    from tf_harness.data.integrity.writing import replacing
    from tf_harness.experiments.run_dir import run_lock

    with tmpfs(tmp_path / "disk", size="64k") as disk:
        (disk / "run").mkdir()
        fill(disk)
        with pytest.raises(OSError) as raised:
            run_lock.hold(disk / "run")
        assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(disk / "run" / ".lock")
        assert not run_lock.held(disk / "run")
        with pytest.raises(OSError) as raised:
            with replacing(disk / "run" / "skipped.csv") as file:
                file.write("path,reason\n" * 10_000)
        assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(disk / "run" / "skipped.csv")


def test_a_save_that_runs_out_of_room_at_any_point_leaves_no_part_of_itself(tmp_path, caplog):
    """The disk fills at each point of a save in turn, a page of room more each time: while the shards are
    staged, while the merged index is written beside the moved data (the index is left cut short), and not at
    all. Each failed save leaves the folder as it was, so resume finds ckpt-1 and nothing stands ahead of it."""
    with tmpfs(tmp_path / "disk", size="4m") as disk:
        step = tf.Variable(0, dtype=tf.int64)
        checkpoint = tf.train.Checkpoint(weights=tf.Variable(tf.zeros([100_000])), step=step)
        page, failed = os.statvfs(disk).f_bsize, []
        for extra_pages in range(-2, 6):
            subprocess.run(["rm", "-rf", str(disk / "checkpoints"), str(disk / "filler")], check=True)
            manager = checkpoints.Manager(checkpoint, disk / "checkpoints", 3, step_counter=step)
            manager.save(checkpoint_number=1)
            kept = sorted(path.name for path in (disk / "checkpoints").iterdir())
            fill(disk)
            data = (disk / "checkpoints" / "ckpt-1.data-00000-of-00001").stat().st_size
            room = (data // page + extra_pages) * page
            os.truncate(disk / "filler", max(0, (disk / "filler").stat().st_size - room))
            try:
                manager.save(checkpoint_number=2)
            except tf.errors.ResourceExhaustedError:
                failed.append(extra_pages)
                assert sorted(path.name for path in (disk / "checkpoints").iterdir()) == kept, extra_pages
                assert checkpoints.newest_finite(disk / "checkpoints") == str(disk / "checkpoints" / "ckpt-1")
                assert checkpoints.state_problem(disk / "checkpoints") is None
            else:
                assert checkpoints.problem(disk / "checkpoints" / "ckpt-2") is None
                break
        # It failed both while staging and after moving the data (removing the index cut short), then had room.
        assert len(failed) >= 3 and extra_pages not in failed, failed
        assert "Removed the files of the failed save of" in caplog.text and "ckpt-2.index" in caplog.text


@pytest.mark.slow
def test_a_full_disk_keeps_the_newest_checkpoint_and_the_run_resumes_once_there_is_room(tmp_path):
    with tmpfs(tmp_path / "disk") as disk:
        run_dir = disk / "run"
        args = [*TINY, "trainer.checkpoint_every=2", f"hydra.run.dir={run_dir}"]
        process = subprocess.Popen([sys.executable, "run.py", *args, "trainer.train_steps=100000"], cwd=PROJECT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        wait_for_checkpoint(process, run_dir / "checkpoints", 4)
        fill(disk)
        _, stderr = process.communicate(timeout=300)
        result = subprocess.CompletedProcess(process.args, process.returncode, "", stderr)
        assert_error(result, 1, "No space left on device: ")
        # The save under way when the disk filled is complete, or none of it is left (it would refuse the resume).
        newest = checkpoints.newest_finite(run_dir / "checkpoints")
        saved = int(newest.rpartition("-")[2])
        assert saved >= 4
        assert not [path for path in (run_dir / "checkpoints").glob("ckpt-*")
                    if int(re.match(r"ckpt-(\d+)", path.name).group(1)) > saved]

        (disk / "filler").unlink()
        resumed = run_cli(*args, f"trainer.train_steps={saved + 2}")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"Resumed from {run_dir / 'checkpoints' / f'ckpt-{saved}'} at global step {saved}" in resumed.stdout
        assert not list((run_dir / "checkpoints").glob("*_temp"))  # the failed save's staging folder is gone


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs procfs, which makes no folders of a user's")
@pytest.mark.parametrize("run_dir, refused", [("/proc/tf-harness-run", "/proc/tf-harness-run"),
                                              ("/proc/tf-harness-run/a/b", "/proc/tf-harness-run")])
def test_a_run_directory_on_a_file_system_that_makes_no_folders_is_one_line(run_dir, refused):
    result = run_cli("dataset=lfw_pairs", "experiment=smoke", f"hydra.run.dir={run_dir}", timeout=120)
    assert_error(result, 1, f"No such file or directory: {refused};", "hydra.run.dir")


def test_only_the_run_directorys_own_missing_folder_is_an_expected_failure(tmp_path):
    missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(tmp_path / "run"))
    assert os_errors.describe(missing, run_dir=str(tmp_path / "run" / "a")) is not None
    assert os_errors.describe(missing, run_dir=str(tmp_path / "other")) is None  # a bug's missing file stays one
    assert os_errors.describe(missing) is None
