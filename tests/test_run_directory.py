"""What a run directory survives: a second process on it, killed saves and generations, signals; and what it never
does: take a damaged record for a new run, misread a quoted path, trip over a loop in a dataset tree, or print a
traceback for a signal after its end."""
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tf_harness.data.errors import ConfigError
from tf_harness.data.samples import sample_root, staging
from tf_harness.experiments.run_dir import leftovers, run_lock
from tests.conftest import PROJECT, lock_holder, run_cli, wait_for_checkpoint
from tests.refusals import assert_config_error, assert_error, one_naming, raises_naming

# A process that takes a run directory's lock through the runner's own API and keeps it.
# A lfw_pairs run small enough to start training within seconds (the siamese CNN traces fast).
TINY = ("dataset=lfw_pairs", "experiment=smoke", "trainer.log_every=1")


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def released():
    """Lets go of any lock a test took in this process."""
    yield
    run_lock.release()


def test_second_process_on_a_run_directory_exits_2_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    with lock_holder(run_dir) as holder:
        started = time.time()
        result = run_cli(*TINY, "trainer.train_steps=1000", f"hydra.run.dir={run_dir}", timeout=300)
        elapsed = time.time() - started
    assert_config_error(result, f"hydra.run.dir={run_dir} ", f"pid {holder.pid} ", socket.gethostname(), alone=False)
    # Refused before any work: nothing trained or written by the run (Hydra's own .hydra/ aside).
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "train").exists()
    assert elapsed < 120, f"took {elapsed:.0f} s to refuse"


def test_lock_of_a_live_process_is_refused_and_a_dead_ones_taken_over(tmp_path, released):
    run_dir = tmp_path / "run"
    with lock_holder(run_dir) as holder:
        with pytest.raises(ConfigError, match=f"in use by pid {holder.pid} on host"):
            run_lock.hold(run_dir)
        holder.send_signal(signal.SIGKILL)  # dies without releasing anything itself
        holder.wait()
        assert run_lock.hold(run_dir)
    assert json.loads((run_dir / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()


def test_stale_lock_file_content_does_not_block(tmp_path, released):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / run_lock.LOCK_NAME).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
    assert run_lock.hold(run_dir)
    assert json.loads((run_dir / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    # A second multirun job of the same process gives the first directory back.
    assert run_lock.hold(tmp_path / "next")
    assert (run_dir / run_lock.LOCK_NAME).read_text() == ""


@pytest.mark.parametrize("task, chief", [({"type": "worker", "index": 0}, True),
                                         ({"type": "worker", "index": 1}, False),
                                         ({"type": "chief", "index": 0}, True)])
def test_under_multi_worker_only_the_chief_takes_the_lock(tmp_path, monkeypatch, released, task, chief):
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    if task["type"] == "chief":
        cluster["chief"] = ["localhost:3"]
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    run_dir = tmp_path / "run"
    with lock_holder(run_dir):
        if chief:
            with pytest.raises(ConfigError, match="is in use by pid"):
                run_lock.hold(run_dir)
        else:
            assert run_lock.hold(run_dir) is False


def test_a_killed_saves_staging_folder_is_removed_on_the_next_start(tmp_path, caplog):
    """Kills a real TensorFlow save mid-way, so the leftover is whatever this TF version leaves."""
    checkpoints = tmp_path / "run" / "checkpoints"
    saver = ("import sys, tensorflow as tf\n"
             "manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(tf.zeros([16, 1024, 1024]))), "
             "sys.argv[1], max_to_keep=2)\n"
             "for step in range(1000):\n    manager.save(checkpoint_number=step)\n")
    process = subprocess.Popen([sys.executable, "-c", saver, str(checkpoints)], cwd=PROJECT,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not list(checkpoints.glob("*_temp")) and time.time() < deadline and process.poll() is None:
        time.sleep(0.01)
    process.kill()
    process.wait()
    temp = list(checkpoints.glob("*_temp"))
    assert temp, "the save was never caught mid-way"
    kept = sorted(p.name for p in checkpoints.iterdir() if p not in temp)
    (checkpoints / "checkpoint.tmp0123456789abcdef").write_text("half a state file")
    with caplog.at_level(logging.INFO, logger="tf_harness.experiments.run_dir.leftovers"):
        removed = leftovers.remove(checkpoints.parent)
    assert sorted(removed) == sorted([*temp, checkpoints / "checkpoint.tmp0123456789abcdef"])
    assert sorted(p.name for p in checkpoints.iterdir()) == kept  # complete checkpoints untouched
    assert all(str(path) in caplog.text for path in removed)


def test_stale_sample_staging_folders_are_removed_live_and_foreign_ones_kept(tmp_path, caplog):
    host = socket.gethostname()
    dead = tmp_path / f".lfw_pairs.{dead_pid()}@{host}.abcd1234"
    live = tmp_path / f".lfw_pairs.{os.getpid()}@{host}.abcd1234"
    foreign = tmp_path / f".lfw_pairs.{dead_pid()}@another-host.example.abcd1234"
    old_unowned, new_unowned = tmp_path / ".chest_xray-k2j4_x9q", tmp_path / ".chest_xray-abcdefgh"
    sample = tmp_path / "chest_xray-v2"
    for path in (dead, live, foreign, old_unowned, new_unowned, sample):
        (path / "data").mkdir(parents=True)
    (dead / staging.LOCK).touch()  # a lock file nobody holds: its generator is gone (tests/test_samples.py)
    hour_ago = time.time() - 2 * staging.UNOWNED_AGE_S
    os.utime(old_unowned, (hour_ago, hour_ago))
    with caplog.at_level(logging.INFO, logger="tf_harness.data.samples.staging"):
        removed = staging.remove_stale(tmp_path)
    assert sorted(removed) == sorted([dead, old_unowned])
    assert all(path.exists() for path in (live, foreign, new_unowned, sample))
    assert str(dead) in caplog.text


def test_sample_generation_stages_under_its_pid_and_clears_dead_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    samples = tmp_path / "samples"
    stale = samples / f".toy.{dead_pid()}@{socket.gethostname()}.abcd1234"
    (stale / "data").mkdir(parents=True)
    (stale / staging.LOCK).touch()  # a lock file nobody holds: its generator is gone
    seen = []

    def make_toy(root, seed):
        seen.append(root.parent.name)
        root.mkdir()
        (root / "file.txt").write_text("x")

    root = sample_root("toy", make_toy)
    assert (root / "file.txt").exists() and not stale.exists()
    assert seen[0].startswith(f".toy.{os.getpid()}@{socket.gethostname()}.")
    assert [p.name for p in samples.iterdir()] == [root.name]  # its own staging folder is gone too


@pytest.mark.slow
@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_saves_a_checkpoint_and_exits_128_plus_signum(tmp_path, signum, status):
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.train_steps=100000", "trainer.checkpoint_every=2", "trainer.eval_every=100000",
            f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen([sys.executable, "run.py", *args], cwd=PROJECT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    wait_for_checkpoint(process, run_dir / "checkpoints", 2)  # the loop is training
    time.sleep(1)  # a few more steps, so the interrupt's save is not the step-2 one
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == status, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == f"interrupted by {signal.Signals(signum).name}"
    line = next(line for line in stdout.splitlines() if "Interrupted at global step" in line)
    step = int(line.split("Interrupted at global step ")[1].split(";")[0])
    assert step >= 2 and (run_dir / "checkpoints" / f"ckpt-{step}.index").exists()


# The run directory never lies: a damaged record, a quoted path, a tree with a loop, a signal after the end.

def hashes(run_dir) -> dict:
    """{relative path: sha256} of every file under `run_dir` but run.log (which a refusal may append to)."""
    import hashlib
    return {path.relative_to(run_dir).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(run_dir.rglob("*")) if path.is_file() and path.name != "run.log"}


def recorded_run(run_dir, config="mode: train_and_evaluate\ndataset:\n  name: lfw_pairs\nmodel:\n  name: siamese_cnn\n"):
    """A run directory as a finished LFW run leaves it, as far as re-entry reads it before TensorFlow starts."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(config)
    (run_dir / ".hydra" / "hydra.yaml").write_text(
        "hydra:\n  runtime:\n    choices:\n      dataset: lfw_pairs\n      model: siamese_cnn\n      experiment: smoke\n")
    (run_dir / ".hydra" / "overrides.yaml").write_text("- dataset=lfw_pairs\n- experiment=smoke\n")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "ckpt-4.index").write_bytes(b"an index")
    (run_dir / "checkpoints" / "ckpt-4.data-00000-of-00001").write_bytes(b"the tensors")
    (run_dir / "events.out.tfevents.1.host.2.v2").write_bytes(b"the HParams record")
    (run_dir / "run.log").write_text("[2026-01-01 00:00:00,000][tf_harness.experiments.cli][ERROR] - run finished, "
                                     "exit status 0\n")
    return run_dir


@pytest.mark.parametrize("quoted", ["'{}'", '"{}"'])
def test_a_quoted_run_directory_is_read_as_hydra_reads_it(tmp_path, quoted):
    from tf_harness.experiments.run_dir import reentry
    run_dir = recorded_run(tmp_path / "a b" / "ü")
    args = [f"hydra.run.dir={quoted.format(run_dir)}", "mode=evaluate", "dataset.eval_pairs=dev_test"]
    assert reentry.run_dir_argument(args) == str(run_dir)
    assert reentry.with_saved_choices(args) == ["dataset=lfw_pairs", "model=siamese_cnn", "experiment=smoke",
                                                      *args]
    assert reentry.existing_ancestor(args) == run_dir
    escaped = [f"hydra.run.dir={tmp_path}/a\\ b/new"]
    assert reentry.run_dir_argument(escaped) == f"{tmp_path}/a b/new"
    assert reentry.existing_ancestor(escaped) == tmp_path / "a b"


def test_a_refused_re_entry_names_every_key_that_may_change():
    """ALLOWED, the words of a refused re-entry, is made from the lists that decide what may change."""
    from tf_harness.experiments.run_dir import reentry

    assert reentry._grouped(("mode", "trainer.a", "trainer.b", "dataset.root")) == "mode, trainer.a|b, dataset.root"
    general, _, evaluation = reentry.ALLOWED.partition(f" and (for mode={'|'.join(reentry.EVALUATION_MODES)}) ")
    assert evaluation, reentry.ALLOWED
    for keys, text in ((reentry.RUN_CONTROL, general), (reentry.EVALUATION_KEYS, evaluation)):
        for key in keys:
            group, _, name = key.rpartition(".")
            assert re.search(rf"(^|, ){re.escape(group + '.') if group else ''}([\w|]+\|)?{name}(\||,|$)", text), key
    assert general.endswith(", strategy")


def test_an_unreadable_hydra_yaml_composes_the_dataset_and_model_of_the_saved_config(tmp_path):
    from tf_harness.experiments.run_dir import reentry
    run_dir = recorded_run(tmp_path / "run")
    (run_dir / ".hydra" / "hydra.yaml").write_bytes(bytes(range(256)))
    args = [f"hydra.run.dir={run_dir}", "mode=evaluate"]
    assert reentry.with_saved_choices(args) == ["dataset=lfw_pairs", "model=siamese_cnn", *args]
    choices, trouble = reentry.saved_choices(run_dir)
    assert choices == {"dataset": "lfw_pairs", "model": "siamese_cnn"} and trouble.startswith("cannot be read")


@pytest.mark.parametrize("damage, problem, command", [
    ("delete", "is missing", "trainer.train_steps=6"),
    ("delete", "is missing", "mode=evaluate"),
    ("delete", "is missing", "dataset=chest_xray"),  # composed from conf/, it rewrote the saved config to its own
    ("delete .hydra", "is missing", "trainer.train_steps=6"),
    ("", "is empty", "trainer.train_steps=6"),
    ("pipeline: [a, b\nmodel: {", "is not valid YAML", "mode=evaluate"),
    (bytes(range(128, 256)), "is not text (not UTF-8)", "trainer.train_steps=6"),
    ("- a list\n- not a config\n", "does not hold a config", "trainer.train_steps=6"),
    ("trainer:\n  train_steps: 4\n", "does not hold a run's config (no dataset.name)", "trainer.train_steps=6"),
])
def test_a_run_directory_whose_saved_config_is_missing_or_unreadable_is_refused_in_one_line(tmp_path, damage, problem,
                                                                                            command):
    run_dir = recorded_run(tmp_path / "run")
    saved = run_dir / ".hydra" / "config.yaml"
    if damage == "delete":
        saved.unlink()
    elif damage == "delete .hydra":
        shutil.rmtree(run_dir / ".hydra")
    else:
        saved.write_bytes(damage if isinstance(damage, bytes) else damage.encode())
    before = hashes(run_dir)
    result = run_cli(f"hydra.run.dir={run_dir}", command, timeout=120)
    line = assert_error(result, 1, f"{run_dir} holds a run (checkpoints)", alone=True)
    assert line.startswith(f"error: {saved} {problem}"), line
    assert hashes(run_dir) == before  # nothing written, .hydra/ above all
    assert (run_dir / "run.log").read_text().splitlines()[-1].endswith("run failed, exit status 1")


def test_a_saved_config_is_not_required_where_no_run_was_recorded(tmp_path):
    from tf_harness.experiments.run_dir import reentry
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)  # a start that failed before it recorded anything
    assert reentry.unreadable_record([f"hydra.run.dir={run_dir}"]) is None
    assert reentry.unreadable_record([f"hydra.run.dir={tmp_path / 'new'}"]) is None
    recorded_run(tmp_path / "sweep")
    (tmp_path / "sweep" / ".hydra" / "config.yaml").unlink()
    assert reentry.unreadable_record(["-m", f"hydra.run.dir={tmp_path / 'sweep'}"]) is None


@pytest.mark.parametrize("content, problem", [
    (b"", "cannot be read (JSONDecodeError"),
    (bytes(range(128, 256)), "cannot be read (UnicodeDecodeError"),
    (b"[1, 2]", "holds no global_step"),
    (b'{"global_step": "4"}', "holds no global_step"),
])
def test_an_unreadable_metrics_json_is_no_evaluation_and_says_so(tmp_path, caplog, content, problem):
    from tf_harness.experiments.evaluation.metrics_history import evaluated_step
    (tmp_path / "metrics.json").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.summaries"):
        assert evaluated_step(tmp_path) is None
    assert f"{tmp_path / 'metrics.json'} {problem}" in caplog.text
    (tmp_path / "metrics.json").write_text('{"global_step": 4, "loss": 0.5}')
    assert evaluated_step(tmp_path) == 4


@pytest.mark.parametrize("content, named", [
    (bytes(range(128, 256)), ("cannot be read", "UnicodeDecodeError")),
    (b"{}", ("input pipeline records",)),
    (b'[{"after": 0}]', ("input pipeline records",)),
    (b'[{"after_step": "0", "input": null}]', ("input pipeline records",)),
])
def test_an_unreadable_input_pipeline_record_is_no_record_and_says_so(tmp_path, caplog, content, named):
    from tf_harness.experiments.run_dir import input_record
    (tmp_path / input_record.INPUT_RECORD).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.run_dir.reentry"):
        assert input_record.saved_input(tmp_path, 4) == (False, None)
    one_naming(caplog.messages, f"{tmp_path / input_record.INPUT_RECORD} ", *named)
    input_record.note_input(tmp_path, 4, {"pipeline.source": "files"})  # written again, whole
    assert input_record.saved_input(tmp_path, 6) == (True, {"pipeline.source": "files"})


def test_a_lock_holder_that_exits_leaves_the_lock_file_empty(tmp_path):
    run_dir = tmp_path / "run"
    hold = "import sys; from tf_harness.experiments.run_dir import run_lock; run_lock.hold(sys.argv[1])"
    subprocess.run([sys.executable, "-c", hold, str(run_dir)], cwd=PROJECT, check=True, timeout=120,
                   env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    assert (run_dir / run_lock.LOCK_NAME).read_bytes() == b""


def test_checkpoint_files_ahead_of_the_restored_one_refuse_training_before_anything_is_written(tmp_path, caplog):
    import tensorflow as tf
    from tf_harness.experiments.run_dir import checkpoints
    folder = tmp_path / "checkpoints"
    variable = tf.Variable([1.0, 2.0])
    tf.train.Checkpoint(v=variable).write(str(folder / "ckpt-2"))
    tf.train.Checkpoint(v=variable).write(str(folder / "ckpt-4"))
    (folder / "ckpt-4.index").unlink()  # its data file stays: a save of step 4 would overwrite it
    checkpoints.check_before_start(folder, "evaluate", 6)  # evaluation writes no checkpoint
    checkpoints.check_before_start(folder, "train", 3)  # training stops short of it
    with raises_naming(checkpoints.CheckpointAheadError, "ckpt-4.data-00000-of-00001", "index", "global step 2"):
        checkpoints.check_before_start(folder, "train_and_evaluate", 6)
    tf.train.Checkpoint(v=variable).write(str(folder / "ckpt-4"))
    (folder / "ckpt-4.index").write_bytes(b"garbled")
    with caplog.at_level(logging.WARNING, logger="tf_harness.experiments.run_dir.checkpoints"):
        checkpoints.check_before_start(folder, "evaluate", 6)
        assert "Not restoring" not in caplog.text  # logged once, by the restore itself
        with raises_naming(checkpoints.CheckpointAheadError, "ckpt-4", "global step 2") as refused:
            checkpoints.check_before_start(folder, "train", 6)
    assert refused.value.before_start  # the job changed nothing: cli's Outcome.ran is False
    one_naming(caplog.messages, f"Not restoring {folder / 'ckpt-4'}")  # why, beside the one line


def test_a_tree_with_symbolic_link_loops_is_indexed_once_each_loop_skipped_and_logged(tmp_path, caplog):
    from tf_harness.data import chest_xray, imagenet_det, lfw_pairs
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.png").write_bytes(b"png")
    (root / "a" / "y.JPEG").write_bytes(b"jpeg")
    (root / "loop").symlink_to("loop")  # a link to itself: following it fails
    (root / "a" / "up").symlink_to("..")  # a cycle
    (root / "self").symlink_to(".")
    with caplog.at_level(logging.WARNING):
        assert chest_xray.list_tree(root) == ({"x.png": str(root / "a" / "x.png")}, {})
        assert [row[0] for row in imagenet_det._list_files(root, (".jpeg",), {})] == ["a/y.JPEG"]
    for link, why in ((root / "loop", "symbolic links"), (root / "self", f"leads to {root}")):
        logged = [message for message in caplog.messages if message.startswith(f"Skipped {link}:")]
        assert len(logged) == 2 and all(why in message for message in logged), logged  # once by each listing
    lfw = tmp_path / "lfw"
    (lfw / "Ann").mkdir(parents=True)
    (lfw / "Ann" / "Ann_0001.jpg").write_bytes(b"jpeg")
    (lfw / "loop").symlink_to("loop")
    (lfw / "Ann" / "up").symlink_to("..")
    assert lfw_pairs.list_images(lfw) == {("Ann", 1): str(lfw / "Ann" / "Ann_0001.jpg")}


@pytest.mark.parametrize("name", ["pairs.txt", "pairsDevTest.txt"])
def test_a_pairs_file_with_a_byte_order_mark_is_read(tmp_path, name):
    from tf_harness.data.lfw_pairs import read_pairs
    path = tmp_path / name
    path.write_text("1\nAnn\t1\t2\nAnn\t1\tBob\t1\n", encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    pairs = read_pairs(path)
    assert pairs[["name_a", "number_a", "name_b", "number_b", "label"]].values.tolist() == [
        ["Ann", 1, "Ann", 2, 1], ["Ann", 1, "Bob", 1, 0]]


@pytest.fixture
def signals():
    """Makes SIGINT raise Interrupted in this (main) thread, as a run does; restores Python's handler afterwards."""
    from tf_harness.experiments.run_dir import interrupts
    interrupts.install()
    yield interrupts
    interrupts._pending.clear()
    interrupts._finished = False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _SignalsItself:
    def __del__(self):  # as tqdm's __del__ runs, whenever the collector runs it
        os.kill(os.getpid(), signal.SIGINT)


def test_a_signal_in_a_finalizer_is_held_and_raised_before_the_outcome_is_logged(signals, capsys):
    _SignalsItself()  # dropped at once: its __del__ runs here
    assert "Exception ignored" not in capsys.readouterr().err  # Python would print it, with a traceback, and go on
    with pytest.raises(signals.Interrupted, match="SIGINT"):
        signals.raise_held()
    _SignalsItself()
    with pytest.raises(signals.Interrupted):
        with signals.deferred():  # or at the end of the next deferred block
            pass


def test_a_signal_after_the_outcome_is_logged_changes_nothing_until_the_next_job(signals):
    signals.finished()
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    signals.raise_held()  # held: the status logged stands
    with pytest.raises(signals.Interrupted, match="SIGINT"):
        signals.started()  # a sweep's next job stops with it


def test_a_signal_inside_an_extension_modules_import_exits_as_that_signal(signals, monkeypatch, capsys):
    """An extension module that fails as it initialises raises ImportError("initialization failed") from the
    exception, a signal's included: SIGINT in TensorFlow's import exited 1 with a traceback."""
    from tf_harness.experiments import cli
    monkeypatch.setattr(sys, "argv", ["run.py", "dataset=lfw_pairs"])
    monkeypatch.setattr(cli, "_status", 0)

    def importing(error):
        def main():
            try:
                raise error
            except BaseException as cause:
                raise ImportError("initialization failed") from cause
        return main

    assert cli.exit_code(importing(signals.Interrupted(signal.SIGINT))) == 130
    assert capsys.readouterr().err.splitlines() == ["interrupted by SIGINT"]
    signals.install()
    with pytest.raises(ImportError):  # an import that failed for its own reasons is still a bug, with its traceback
        cli.exit_code(importing(ValueError("not a signal")))


@pytest.mark.slow
def test_sigint_after_the_run_finished_exits_with_its_logged_status_and_no_traceback(tmp_path):
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.train_steps=2", "trainer.eval_steps=1", f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen([sys.executable, "run.py", *args], cwd=PROJECT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    deadline = time.time() + 300
    log = run_dir / "run.log"
    while process.poll() is None and time.time() < deadline:
        if log.is_file() and "run finished, exit status 0" in log.read_text(errors="replace"):
            break
        time.sleep(0.005)
    sent = 0
    while process.poll() is None:  # Ctrl-C, again and again, until the process is gone: its shutdown included
        process.send_signal(signal.SIGINT)
        sent += 1
        time.sleep(0.01)
    stderr = process.communicate(timeout=120)[1]
    assert sent, "the run ended before a signal was sent"
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    assert log.read_text().splitlines()[-1].endswith("run finished, exit status 0")


def test_the_run_directorys_records_are_written_through_temporary_files_of_this_process_alone(tmp_path):
    """A trainer and its sidecar evaluator both write metrics.json: neither may write over the other's half-written
    temporary file, nor over a file of that name that someone else left."""
    from tf_harness.data.integrity.skipped import SkipLog
    from tf_harness.experiments.evaluation.metrics_history import write_metrics
    from tf_harness.experiments.run_dir import input_record
    others = [tmp_path / "metrics.json.tmp", tmp_path / "skipped.csv.tmp", tmp_path / "input_pipelines.tmp"]
    for path in others:
        path.write_text("another process's")
    write_metrics(str(tmp_path), {"global_step": 4, "loss": 0.5})
    SkipLog().write(str(tmp_path / "skipped.csv"))
    input_record.note_input(tmp_path, 4, "a signature")
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 4
    assert (tmp_path / "skipped.csv").read_text().splitlines() == ["path,reason"]
    assert json.loads((tmp_path / input_record.INPUT_RECORD).read_text()) == [{"after_step": 4, "input": "a signature"}]
    assert all(path.read_text() == "another process's" for path in others)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [*(path.name for path in others), "metrics.json", "skipped.csv", input_record.INPUT_RECORD])
