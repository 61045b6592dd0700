"""mode=continuous_eval, the sidecar evaluator (experiments/sidecar.py): which checkpoint it evaluates and when it
stops, its own lock and log beside the trainer's, TF_CONFIG's evaluator task; and one run trained while it
evaluates, end to end."""
import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from tf_harness.data.errors import ConfigError
from tf_harness.experiments import sidecar
from tf_harness.experiments.config import schema, strategies
from tf_harness.experiments.run_dir import run_lock
from tests.conftest import PROJECT, compose, event_tags, lock_holder, run_cli
from tests.refusals import assert_names, one_naming, raises_naming

# A process that takes a run directory's locks through run_lock's own API and keeps them: argv[2] names which.
@pytest.fixture
def released():
    """Lets go of any lock a test took in this process."""
    yield
    run_lock.release()


def save(folder, step, value=1.0):
    """A real checkpoint `ckpt-<step>` in `folder`, holding `value`; returns its prefix."""
    import tensorflow as tf
    folder.mkdir(parents=True, exist_ok=True)
    prefix = folder / f"ckpt-{step}"
    tf.train.Checkpoint(step=tf.Variable(step, dtype=tf.int64), w=tf.Variable([value, 2.0])).write(str(prefix))
    return prefix


class Clock:
    """A fake clock whose sleep advances it and runs what the test scheduled for that moment."""

    def __init__(self, events=None):
        self.now, self.events = 0.0, sorted((events or {}).items())

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        while self.events and self.events[0][0] <= self.now:
            self.events.pop(0)[1]()


def watch(folder, final, timeout, evaluated=None, events=None):
    """A sidecar.Watch on `folder` with a fake clock, and the list its `evaluate` appends each (step) to."""
    clock, seen = Clock(events), []
    watcher = sidecar.Watch(folder, final, timeout, evaluated=evaluated, poll=1.0, clock=clock, sleep=clock.sleep)

    def evaluate(path, step):
        assert path.name == f"ckpt-{step}"
        seen.append(step)

    return watcher, evaluate, seen, clock


def test_the_newest_checkpoint_is_evaluated_and_the_ones_it_supersedes_passed_over(tmp_path, caplog):
    folder = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        save(folder, step)
    watcher, evaluate, seen, _ = watch(folder, final=10, timeout=None,
                                       events={3.0: lambda: [save(folder, 8), save(folder, 10)]})
    with caplog.at_level(logging.INFO, logger=sidecar.__name__):
        reason = watcher.run(evaluate)
    assert seen == [6, 10]
    assert reason == "Evaluated the final step 10 (trainer.train_steps=10); stopping"
    assert "Passing over ckpt-2, ckpt-4, superseded by ckpt-6" in caplog.text
    assert "Passing over ckpt-8, superseded by ckpt-10" in caplog.text


def test_a_checkpoint_the_trainer_removes_while_it_is_read_is_passed_over_once_and_quietly(tmp_path, caplog):
    """A trainer that keeps one checkpoint deletes each one as it saves the next, often while the sidecar restores
    it: one info line per such checkpoint, no warning, and neither TensorFlow's warnings nor a timeout naming it."""
    import tensorflow as tf

    folder = tmp_path / "checkpoints"
    save(folder, 2)

    class Trainer:
        """Restores like the trainer, but the trainer's keep_checkpoints deletes ckpt-2 as the restore reads it."""
        step = 4

        def checkpoint(self):
            checkpoint = tf.train.Checkpoint(step=tf.Variable(0, dtype=tf.int64), w=tf.Variable([0.0, 0.0]))
            restore = checkpoint.restore

            def restore_while_deleted(path):
                for file in folder.glob("ckpt-2.*"):
                    file.unlink()
                save(folder, 4)
                return restore(path)

            checkpoint.restore = restore_while_deleted
            return checkpoint

    evaluated = []
    watcher = sidecar.Watch(folder, 4, 10, poll=1.0, clock=Clock(), sleep=lambda seconds: None)
    with caplog.at_level(logging.INFO):
        reason = watcher.run(lambda path, step: sidecar._evaluate(Trainer(), type("Evaluator", (), {
            "evaluate": lambda self: evaluated.append(step)})(), path, step))
    assert reason == "Evaluated the final step 4 (trainer.train_steps=4); stopping" and evaluated == [4]
    passed = [r.getMessage() for r in caplog.records if "Passing over" in r.getMessage()]
    assert len(passed) == 1, passed
    assert_names(passed[0], folder / "ckpt-2", "trainer.keep_checkpoints")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_checkpoint_being_written_waits_for_its_files_and_a_non_finite_one_is_never_evaluated(tmp_path, caplog):
    folder = tmp_path / "checkpoints"
    save(folder, 2)
    data = next(folder.glob("ckpt-2.data-*"))
    saved_data = data.read_bytes()
    data.unlink()  # its index is there, its data file not yet: a save in progress
    save(folder, 4, value=float("nan"))
    watcher, evaluate, seen, clock = watch(folder, final=6, timeout=30,
                                           events={5.0: lambda: data.write_bytes(saved_data),
                                                   9.0: lambda: save(folder, 6)})
    with caplog.at_level(logging.INFO, logger=sidecar.__name__):
        reason = watcher.run(evaluate)
    assert seen == [2, 6] and reason.startswith("Evaluated the final step 6")
    assert clock.now < 30
    # The half-written one says nothing; the non-finite one says why, once, though it was looked at every poll.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert_names(warnings[0], "ckpt-4", "NaN")


def test_it_stops_after_eval_timeout_without_a_new_checkpoint_naming_what_it_could_not_evaluate(tmp_path):
    folder = tmp_path / "checkpoints"
    save(folder, 4)
    save(folder, 6, value=float("inf"))
    watcher, evaluate, seen, clock = watch(folder, final=12, timeout=1)
    reason = watcher.run(evaluate)
    assert seen == [4] and clock.now == pytest.approx(1.0)
    assert_names(reason, folder, "1 s", "trainer.eval_timeout", "global step 4", "trainer.train_steps=12", "ckpt-6")
    assert reason.endswith("; stopping")


def test_a_finished_run_whose_final_step_is_evaluated_stops_at_once(tmp_path):
    """eval_timeout does not apply: the final step's evaluation (metrics.json's global_step) is all there is to do."""
    folder = tmp_path / "checkpoints"
    for step in (4, 6):
        save(folder, step)
    watcher, evaluate, seen, clock = watch(folder, final=6, timeout=1, evaluated=6)
    assert watcher.run(evaluate) == ("The final step 6 (trainer.train_steps=6) is evaluated already (metrics.json); "
                                     "stopping")
    assert seen == [] and clock.now == 0


def test_a_checkpoint_that_cannot_be_restored_is_tried_again_only_once_its_files_change(tmp_path, caplog):
    folder = tmp_path / "checkpoints"
    save(folder, 2)
    save(folder, 4)
    clock, tries = Clock({3.0: lambda: save(folder, 4, value=3.0)}), []

    def evaluate(path, step):
        tries.append(step)
        return "it could not be restored (NotFoundError: gone)" if len(tries) == 1 else None

    watcher = sidecar.Watch(folder, 4, 10, poll=1.0, clock=clock, sleep=clock.sleep)
    with caplog.at_level(logging.WARNING, logger=sidecar.__name__):
        assert watcher.run(evaluate).startswith("Evaluated the final step 4")
    # ckpt-4 failed, ckpt-2 was taken meanwhile, and ckpt-4 again once it was written anew.
    assert tries == [4, 2, 4]
    one_naming(caplog.messages, "ckpt-4", "NotFoundError: gone")


def test_a_second_evaluator_is_refused_naming_the_holder_and_writes_nothing_into_the_run_logs(tmp_path, released):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log_file = run_dir / "run.log"
    log_file.write_text("the trainer's line\n")
    handler = logging.FileHandler(log_file)  # as Hydra's job logging opens run.log for the job
    logging.getLogger().addHandler(handler)
    try:
        with lock_holder(run_dir, "evaluator") as holder:
            with raises_naming(ConfigError, f"hydra.run.dir={run_dir} ", "evaluated by", f"pid {holder.pid}",
                               socket.gethostname(), run_dir / ".eval-lock", "mode=continuous_eval"):
                run_lock.hold_evaluator(run_dir)
            logging.getLogger("tf_harness").error("config error: ...")  # what cli logs next reaches no file
            assert handler not in logging.getLogger().handlers
            # The evaluator's lock is not the trainer's: a trainer starts beside it.
            assert run_lock.hold(run_dir) is True
        assert log_file.read_text() == "the trainer's line\n"
        assert run_lock.held(run_dir) and not run_lock.held(run_dir, run_lock.EVAL_LOCK_NAME)
        run_lock.hold_evaluator(run_dir)  # its holder gone, the lock is taken over
        assert json.loads((run_dir / ".eval-lock").read_text())["pid"] == os.getpid()
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def test_the_sidecar_refuses_a_directory_no_run_has_recorded_before_taking_its_lock(tmp_path, released):
    run_dir = tmp_path / "new"
    run_dir.mkdir()
    with raises_naming(ConfigError, "mode=continuous_eval", f"{run_dir} holds none"):
        sidecar.start(compose("mode=continuous_eval"), run_dir)
    assert not (run_dir / ".eval-lock").exists()


CLUSTER = {"chief": ["host0:2222"], "worker": ["host1:2222"]}
EVALUATOR = {"cluster": CLUSTER, "task": {"type": "evaluator", "index": 0}}


def test_tf_configs_evaluator_task_is_no_worker_and_runs_the_sidecar_on_one_device(tmp_path, monkeypatch, released):
    """Estimator's evaluator: named in TF_CONFIG's task, never in its cluster; it takes no worker index and no run
    lock, joins no MultiWorkerMirroredStrategy and runs mode=continuous_eval whatever mode its command line says."""
    import tensorflow as tf

    cfg = compose("dataset=lfw_pairs", "strategy=multi_worker", "mode=train")
    monkeypatch.setenv("TF_CONFIG", json.dumps(EVALUATOR))
    assert schema.first_problem(cfg, {"TF_CONFIG": json.dumps(EVALUATOR)}) is None
    assert strategies.task_type() == "evaluator" and strategies.is_evaluator()
    assert strategies.workers() == (2, None)  # the chief and the worker train; the evaluator is neither
    assert sidecar.wanted(cfg)
    assert run_lock.hold(tmp_path) is False and not (tmp_path / run_lock.LOCK_NAME).exists()

    def joined(*args, **kwargs):
        raise AssertionError("the evaluator joined the cluster's MultiWorkerMirroredStrategy")

    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", joined)
    strategy = strategies.make_strategy(cfg.strategy)
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy) and strategy.num_replicas_in_sync == 1

    # The cluster's own tasks are unchanged: the chief is worker 0, a worker counts after it; neither evaluates.
    for task, index in (({"type": "chief", "index": 0}, 0), ({"type": "worker", "index": 0}, 1)):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": CLUSTER, "task": task}))
        assert strategies.workers() == (2, index) and not sidecar.wanted(cfg)
    assert sidecar.wanted(OmegaConf.merge(cfg, {"mode": "continuous_eval"}))


@pytest.mark.parametrize("task, named", [
    ({"type": "evaluator", "index": 1}, ("TF_CONFIG", "index=1", "evaluator")),
    ({"type": "ps", "index": 0}, ("TF_CONFIG", "type=ps", "chief|worker")),
])
def test_a_tf_config_task_outside_the_cluster_other_than_one_evaluator_is_refused(task, named):
    cfg = compose("dataset=lfw_pairs", "strategy=multi_worker")
    problem = schema.first_problem(cfg, {"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": task})})
    assert_names(problem, *named)
    assert problem.startswith(named[0]) and "\n" not in problem, problem


# The run of the slow test: LFW pairs, tiny images, a checkpoint every 2 steps. trainer.jit_compile=false: with it
# unset, cli.guarded logs the XLA cache's folder (one line) into the job's run.log before the run's own code starts,
# in every process started into the directory (docs/run-directory.md); off, only the trainer writes there.
TRAIN = ("dataset=lfw_pairs", "experiment=smoke", "mode=train", "trainer.checkpoint_every=2", "trainer.log_every=2",
         "trainer.jit_compile=false")


def start_cli(tmp_path, name, *args):
    """`python run.py args...` started in the background, its stdout and stderr in `tmp_path`/<name>.out and .err."""
    with open(tmp_path / f"{name}.out", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
        return subprocess.Popen([sys.executable, "run.py", *args], cwd=PROJECT, stdout=out, stderr=err, text=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def finish(process, tmp_path, name, timeout=900):
    """(exit status, stdout, stderr) of a process start_cli started, once it has exited."""
    try:
        process.wait(timeout=timeout)
    finally:
        process.kill()
    return process.returncode, (tmp_path / f"{name}.out").read_text(), (tmp_path / f"{name}.err").read_text()


def wait_for(text, path, process, timeout=600):
    """Waits until the file at `path` holds `text`, while `process` runs."""
    deadline = time.time() + timeout
    while not (path.exists() and text in path.read_text()):
        assert process.poll() is None, f"exited {process.returncode} before {path} held {text!r}"
        assert time.time() < deadline, f"{path} did not hold {text!r} within {timeout} s"
        time.sleep(0.5)


@pytest.mark.slow
def test_the_sidecar_evaluates_checkpoints_as_a_trainer_writes_them_and_stops_after_the_final_step(tmp_path):
    run_dir = tmp_path / "run"
    started = time.time()
    first = run_cli(*TRAIN, "trainer.train_steps=2", f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr[-3000:]
    run_log = (run_dir / "run.log").read_text()

    # Refused, both, in one line each naming the holder, writing nothing into run.log or eval.log.
    with lock_holder(run_dir, "run,evaluator") as holder:
        refused = [start_cli(tmp_path, "second_evaluator", f"hydra.run.dir={run_dir}", "mode=continuous_eval"),
                   start_cli(tmp_path, "second_trainer", f"hydra.run.dir={run_dir}", "trainer.train_steps=12")]
        for process, name, what in zip(refused, ("second_evaluator", "second_trainer"), ("evaluated", "in use")):
            status, _, err = finish(process, tmp_path, name, timeout=300)
            assert status == 2, err[-3000:]
            assert err.strip().splitlines()[-1].startswith(
                f"config error: hydra.run.dir={run_dir} is {what} by pid {holder.pid} on host {socket.gethostname()}")
    assert (run_dir / "run.log").read_text() == run_log and not (run_dir / "eval.log").exists()
    refusals = time.time()

    # The sidecar evaluates ckpt-2, then, while the trainer goes on to step 12, the newest checkpoint as they come.
    evaluator = start_cli(tmp_path, "sidecar", f"hydra.run.dir={run_dir}", "mode=continuous_eval",
                          "trainer.train_steps=12", "trainer.eval_timeout=600")
    wait_for("Evaluation at global step 2 on", run_dir / "eval.log", evaluator)
    trainer = start_cli(tmp_path, "trainer", *TRAIN, "trainer.train_steps=12", f"hydra.run.dir={run_dir}")
    status, _, err = finish(trainer, tmp_path, "trainer")
    assert status == 0, err[-3000:]
    status, out, err = finish(evaluator, tmp_path, "sidecar")
    assert status == 0, err[-3000:]
    finished = time.time()

    eval_log = (run_dir / "eval.log").read_text()
    evaluations = [line for line in eval_log.splitlines() if "Evaluation at global step" in line]
    assert len(evaluations) >= 2 and "Evaluation at global step 2 on" in evaluations[0], eval_log[-3000:]
    assert "Evaluation at global step 12 on" in evaluations[-1]
    assert "Evaluated the final step 12 (trainer.train_steps=12); stopping" in eval_log.splitlines()[-2]
    assert eval_log.splitlines()[-1].endswith("run finished, exit status 0")
    assert "Evaluated the final step 12" in out  # the terminal gets the line too
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 12
    validation, _ = event_tags(run_dir / "validation")
    steps = sorted({event.step for event in validation.Tensors("loss")})
    assert len(steps) >= 2 and steps[0] == 2 and steps[-1] == 12, steps

    # run.log: the two training starts' lines, none of the sidecar's nor of the refused starts'.
    lines = (run_dir / "run.log").read_text().splitlines()
    assert sum(line.endswith("][INFO] - Config:") for line in lines) == 2
    assert [line.rpartition(" - ")[2] for line in lines if "exit status" in line] == ["run finished, exit status 0"] * 2
    assert not [line for line in lines if "][tf_harness.experiments.sidecar][" in line or line.partition("] - ")[2]
                .startswith(("Evaluation at", "Restored", "config error", "mode=continuous_eval"))]
    print(f"first run {refusals - started:.0f} s (refusals included); trainer and sidecar {finished - refusals:.0f} s")


@pytest.mark.slow
def test_a_sidecar_beside_a_trainer_that_keeps_one_checkpoint_passes_each_over_once_and_quietly(tmp_path):
    """The reported case, end to end: beside a trainer keeping one checkpoint, the sidecar logged 63 "could not be
    restored" lines and 182 TensorFlow warnings in one run."""
    run_dir = tmp_path / "run"
    keep_one = ("trainer.keep_checkpoints=1", "trainer.checkpoint_every=1", "trainer.log_every=1")
    first = run_cli(*TRAIN, *keep_one, "trainer.train_steps=2", f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr[-3000:]
    evaluator = start_cli(tmp_path, "sidecar", f"hydra.run.dir={run_dir}", "mode=continuous_eval",
                          "trainer.train_steps=40", "trainer.eval_timeout=600")
    wait_for("Evaluation at global step 2 on", run_dir / "eval.log", evaluator)
    trainer = start_cli(tmp_path, "trainer", *TRAIN, *keep_one, "trainer.train_steps=40", f"hydra.run.dir={run_dir}")
    status, _, err = finish(trainer, tmp_path, "trainer")
    assert status == 0, err[-3000:]
    status, _, err = finish(evaluator, tmp_path, "sidecar")
    assert status == 0, err[-3000:]
    lines = (run_dir / "eval.log").read_text().splitlines()
    assert "Evaluation at global step 40 on" in "\n".join(lines)
    passed = [line.partition("] - ")[2] for line in lines if "Passing over" in line]
    assert len(passed) == len(set(passed)), passed  # once per checkpoint at most
    assert not [line for line in lines if "[WARNING]" in line or "could not be restored" in line], lines
    assert not [line for line in err.splitlines() if "WARNING" in line or "Traceback" in line], err[-3000:]


def test_the_sidecar_never_replaces_the_evaluation_of_a_later_step_in_metrics_json(tmp_path, caplog):
    """Beside a train_and_evaluate trainer, the sidecar may evaluate an older checkpoint after the trainer evaluated a
    newer one: metrics.json keeps the newest evaluation, and the trainer's own evaluations always write it."""
    from types import SimpleNamespace

    import pandas as pd
    import tensorflow as tf

    from tf_harness.data.spec import DatasetSpec
    from tf_harness.experiments.evaluation.metrics_history import evaluated_step, write_metrics
    from tf_harness.experiments.evaluator import Evaluator
    from tf_harness.experiments.summaries import Summaries

    spec = DatasetSpec(name="lfw_pairs", task="binary", class_names=("same",), channels=3)
    task = SimpleNamespace(SPEC=spec, protocol_metrics=lambda table, probabilities: {},
                           protocol_notes=lambda table: {})
    tables = {"validation": pd.DataFrame({"path_a": ["a", "b"], "path_b": ["c", "d"], "label": [[1], [0]]})}
    import contextlib
    trainer = SimpleNamespace(step=110, averaged=contextlib.nullcontext, eval_step=lambda features, labels, weights: (
        tf.constant(1.0), tf.constant([[2.0], [-2.0]])))
    batch = (tf.zeros([2, 1]), tf.constant([[1], [0]]), tf.ones([2]))

    def evaluator(beside):
        return Evaluator(task, trainer, tables, Summaries(str(tmp_path), ("validation",)), tmp_path, batch_size=2,
                         eval_steps=None, seed=0, input_fn=lambda split, rows=None: [batch],
                         note_unreadable=lambda: None, beside=beside)

    write_metrics(tmp_path, {"global_step": 130, "accuracy": 0.5})  # the trainer's evaluation at step 130
    with caplog.at_level(logging.INFO):
        evaluator(beside=True).evaluate()
    assert evaluated_step(tmp_path) == 130
    one_naming(caplog.messages, "metrics.json", "130")
    trainer.step = 140
    evaluator(beside=True).evaluate()
    assert evaluated_step(tmp_path) == 140
    trainer.step = 120
    evaluator(beside=False).evaluate()  # the trainer's own (a resumed run evaluating again) always writes
    assert evaluated_step(tmp_path) == 120


def test_a_trainer_that_stopped_early_is_not_waited_for_once_its_last_step_is_evaluated(tmp_path):
    """A sidecar beside a run that early stopping ended waited trainer.eval_timeout (an hour by default) for a final
    step that never comes."""
    folder = tmp_path / "checkpoints"
    save(folder, 2)
    (tmp_path / "metrics.json").write_text(json.dumps({"global_step": 2, "loss": 1.0}))
    stopped = sidecar.StoppedEarly(folder)
    events = {3.0: lambda: (tmp_path / "metrics.json").write_text(
        json.dumps({"global_step": 2, "loss": 1.0, "stopped_early": True}))}
    watcher, evaluate, seen, clock = watch(folder, 10, 60, events=events)
    watcher.stopped = stopped
    reason = watcher.run(evaluate)
    assert seen == [2] and 3.0 <= clock.now < 60
    assert_names(reason, "global step 2", "trainer.early_stopping")
