"""Interrupts at any instant: a signal waits for the unit of work it lands in, an interrupted evaluation is
redone on resume, and runs stopped at random instants resume to the weights and summaries of an unbroken run
(benchmarks/faults.py, here with one trial per dataset and fault; the script runs the full count)."""
import importlib.util
import json
import logging
import os
import signal
import threading
import time
import weakref

import pytest

from tf_harness.experiments.run_dir import blocking, interrupts
from tests.conftest import PROJECT, event_tags, run_cli
from tests.refusals import assert_names

TINY = ("dataset=lfw_pairs", "pipeline.image_size=24", "pipeline.batch_size=8", "model.widths=[8,16]",
        "model.embedding_size=16", "model.head_units=8", "trainer.eval_steps=2", "trainer.log_every=1",
        "trainer.checkpoint_every=3", "trainer.eval_every=3")


@pytest.fixture
def handlers():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    interrupts.install()
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_signal_inside_a_deferred_block_is_raised_when_the_block_ends(handlers):
    done = []
    with pytest.raises(interrupts.Interrupted) as raised:
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            with interrupts.deferred():  # nested: raised at the outermost end
                done.append("inner")
            done.append("outer")
    assert done == ["inner", "outer"] and raised.value.signum == signal.SIGTERM
    with pytest.raises(interrupts.Interrupted):  # outside a block it stops at once
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10 ** 6):
            pass


def test_a_failing_deferred_block_keeps_its_own_error(handlers):
    with pytest.raises(ValueError):
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            raise ValueError("disk error")
    with interrupts.deferred():  # nothing stale is left for the next block
        pass


# Work that may block in C++ (experiments/run_dir/blocking.py), stood in for by a thread waiting on an event.

@pytest.fixture
def quick(monkeypatch):
    """Waiting lines every 0.4 s, a 0.2 s grace for a held signal, and the wait looking every 0.05 s."""
    monkeypatch.setattr(blocking, "INTERVAL", 0.4)
    monkeypatch.setattr(blocking, "GRACE", 0.2)
    monkeypatch.setattr(blocking, "_SLICE", 0.05)


@pytest.fixture
def blocked():
    """Work that never finishes on its own (`release.wait`); released when the test ends."""
    release = threading.Event()
    yield release.wait
    release.set()


def signal_soon(signum, after=0.3):
    threading.Timer(after, os.kill, (os.getpid(), signum)).start()


def test_waited_work_returns_its_value_or_raises_its_error_in_one_thread_kept_for_it():
    assert blocking.call(pow, 2, 10, what="a power") == 1024
    with pytest.raises(ZeroDivisionError):
        blocking.call(divmod, 1, 0, what="a division")
    first, second = (blocking.call(threading.get_ident, what="its thread") for _ in range(2))
    assert first == second != threading.get_ident()


def test_waited_work_lets_go_of_what_a_job_took_and_gave_once_it_returns():
    """The thread outlives each job: a run's last iterator, held by it, outlived the run."""
    class Held:
        pass

    argument = Held()
    result = blocking.call(lambda held: Held(), argument, what="a job")
    references = [weakref.ref(argument), weakref.ref(result)]
    del argument, result
    assert [reference() for reference in references] == [None, None]


def test_work_that_runs_long_says_so_at_an_interval_and_fails_past_its_bound(quick, blocked, caplog):
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=blocking.__name__):
        with pytest.raises(blocking.Stalled) as raised:
            blocking.call(blocked, what="the first training batch", hint="is a worker running?", timeout=1.0,
                          stalled=lambda: "no training batch in 1.0 s")
    assert str(raised.value) == "no training batch in 1.0 s"
    assert blocking.call(pow, 2, 3, what="the next work") == 8  # in a thread of its own
    assert 1.0 <= time.monotonic() - started < 2.5
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    for line in lines:
        assert_names(line, "the first training batch", "is a worker running?")


def test_a_wait_that_fails_leaves_the_unfinished_work_its_thread_and_the_next_call_another(quick, blocked):
    """A waiting line whose hint raised left the unfinished work in the thread every call shares, and the next
    call queued behind it."""
    def failing_hint():
        raise OSError("the dispatcher's address does not resolve")

    with pytest.raises(OSError, match="does not resolve"):
        blocking.call(blocked, what="the first training batch", hint=failing_hint)
    assert blocking.call(pow, 2, 3, what="the next work", timeout=2.0) == 8


def test_work_expected_to_take_long_says_so_only_past_what_it_takes(quick, caplog):
    with caplog.at_level(logging.WARNING, logger=blocking.__name__):
        assert blocking.call(time.sleep, 0.6, what="a loop", expected=0.4) is None
        with pytest.raises(blocking.Stalled):
            blocking.call(time.sleep, 2, what="the train loop at global step 7", expected=0.4, timeout=0.64)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1, lines
    assert_names(lines[0], "the train loop at global step 7", "0.4 s")


def test_a_signal_stops_blocked_work_at_once_outside_a_deferred_block(handlers, blocked):
    signal_soon(signal.SIGTERM)
    started = time.monotonic()
    with pytest.raises(blocking.Abandoned) as raised:
        blocking.call(blocked, what="the first training batch")
    assert time.monotonic() - started < 2
    assert raised.value.signum == signal.SIGTERM and raised.value.what == "the first training batch"
    assert interrupts.exit_status(raised.value) == 143


def test_a_signal_inside_a_deferred_block_lets_work_that_finishes_in_its_grace_land_whole(handlers, quick):
    landed = []
    signal_soon(signal.SIGINT, after=0.1)
    with pytest.raises(interrupts.Interrupted) as raised:
        with interrupts.deferred():
            landed.append(blocking.call(lambda: time.sleep(0.5) or "trained", what="a loop", expected=0.4))
            landed.append("saved")
    assert landed == ["trained", "saved"]
    assert raised.value.signum == signal.SIGINT and not isinstance(raised.value, blocking.Abandoned)


def test_a_signal_inside_a_deferred_block_abandons_work_still_blocked_after_its_grace(handlers, quick, blocked):
    landed = []
    signal_soon(signal.SIGTERM, after=0.1)
    started = time.monotonic()
    with pytest.raises(blocking.Abandoned) as raised:
        with interrupts.deferred():
            blocking.call(blocked, what="the train loop at global step 4", expected=0.1)
            landed.append("saved")
    # GRACE after the signal, which comes before twice what the work is expected to take.
    assert 0.4 <= time.monotonic() - started < 2.5
    assert landed == [] and raised.value.signum == signal.SIGTERM
    assert interrupts.held() is None  # nothing stale is left for the next block
    assert blocking.call(pow, 2, 3, what="the next work") == 8  # in a thread of its own


@pytest.mark.slow
def test_an_evaluation_never_recorded_is_redone_on_resume(tmp_path):
    # A checkpoint at an evaluation step with no evaluation recorded is what an interrupt during that
    # evaluation leaves; mode=train leaves it deterministically.
    first = run_cli(*TINY, "mode=train", "trainer.train_steps=3", f"hydra.run.dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (tmp_path / "metrics.json").exists()
    resumed = run_cli(*TINY, "mode=train_and_evaluate", "trainer.train_steps=6", f"hydra.run.dir={tmp_path}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Redoing the evaluation at global step 3" in resumed.stdout
    accumulator, _ = event_tags(tmp_path / "validation")
    assert [event.step for event in accumulator.Tensors("loss")] == [3, 6]
    # Re-running the finished run trains and evaluates nothing more.
    again = run_cli(*TINY, "mode=train_and_evaluate", "trainer.train_steps=6", f"hydra.run.dir={tmp_path}")
    assert again.returncode == 0, again.stderr[-3000:]
    accumulator, _ = event_tags(tmp_path / "validation")
    assert [event.step for event in accumulator.Tensors("loss")] == [3, 6]
    assert json.loads((tmp_path / "metrics.json").read_text())["global_step"] == 6


def _fault_script():
    spec = importlib.util.spec_from_file_location("faults", PROJECT / "benchmarks" / "faults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # 3 reference runs and 9 trials, each one or two runs
def test_runs_stopped_at_random_instants_resume_exactly(tmp_path):
    faults = _fault_script()
    counts = faults.run_trials(list(faults.DATASETS), ["SIGTERM", "SIGINT", "SIGKILL"], trials=1, seed=1,
                               work=tmp_path)
    failures = [failure for _, _, failed, _ in counts.values() for failure in failed]
    assert not failures, failures
    assert sum(run for _, run, _, _ in counts.values()) == 9


@pytest.mark.slow  # 1 reference run and 2 trials, each one or two runs
def test_runs_with_the_recipe_set_stopped_at_random_instants_resume_exactly(tmp_path):
    """The best checkpoint, early stopping, EMA weights, gradient accumulation and the random resized crop together
    (faults.RECIPES and FIELD_RECIPES)."""
    faults = _fault_script()
    counts = faults.run_trials(["lfw_pairs"], ["SIGTERM", "SIGKILL"], trials=1, seed=2, work=tmp_path, recipes=True)
    failures = [failure for _, _, failed, _ in counts.values() for failure in failed]
    assert not failures, failures
    reference = tmp_path / "lfw_pairs" / "reference"
    stopped = json.loads((reference / "metrics.json").read_text())
    assert stopped["stopped_early"] is True and stopped["global_step"] == 9  # the set stops between checkpoints
    assert (reference / "best.json").is_file()
