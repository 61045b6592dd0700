"""Interrupts at any instant: a signal waits for the unit of work it lands in, an interrupted evaluation is
redone on resume, and runs stopped at random instants resume to the weights and summaries of an unbroken run
(benchmarks/faults.py, here with one trial per dataset and fault; the script runs the full count)."""
import importlib.util
import json
import os
import signal

import pytest

from tf_harness.experiments.run_dir import interrupts
from tests.conftest import PROJECT, event_tags, run_cli

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
    """The best checkpoint, early stopping, EMA weights and gradient accumulation together (faults.RECIPES)."""
    faults = _fault_script()
    counts = faults.run_trials(["lfw_pairs"], ["SIGTERM", "SIGKILL"], trials=1, seed=2, work=tmp_path, recipes=True)
    failures = [failure for _, _, failed, _ in counts.values() for failure in failed]
    assert not failures, failures
    reference = tmp_path / "lfw_pairs" / "reference"
    stopped = json.loads((reference / "metrics.json").read_text())
    assert stopped["stopped_early"] is True and stopped["global_step"] == 9  # the set stops between checkpoints
    assert (reference / "best.json").is_file()
