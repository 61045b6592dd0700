"""Input that never comes: a run says so while it waits, and a signal still ends it."""
import contextlib
import os
import signal
import threading
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from tf_harness.data.integrity.verification import check_files, problem
from tf_harness.experiments.run_dir import interrupts
from tests.refusals import assert_names


def _problem_within(path, seconds):
    """`problem(path)`, or "blocked" when it has not returned within `seconds`."""
    found = {}
    thread = threading.Thread(target=lambda: found.setdefault("problem", problem(path)), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():  # a writer lets the blocked open return, so the thread ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        return "blocked"
    return found["problem"]


def test_an_image_file_that_is_a_named_pipe_is_a_problem_not_a_wait(tmp_path):
    pipe = tmp_path / "Ana_Costa_0001.jpg"
    os.mkfifo(pipe)
    assert_names(_problem_within(pipe, 5), f"{pipe} ", "named pipe")
    whole = tmp_path / "whole.jpg"
    whole.write_bytes(b"\xff\xd8\xff\xe0" + b"\0" * 100 + b"\xff\xd9")
    problems, _ = check_files([str(pipe), str(whole)])
    assert list(problems) == [str(pipe)]
    assert_names(problems[str(pipe)], f"{pipe} ", "named pipe")


class _Never:
    """An input pipeline whose next batch never comes (until `release`)."""

    def __init__(self):
        self.release = threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        self.release.wait(30)
        raise StopIteration


def test_an_evaluation_waiting_for_a_batch_says_so_and_stops_at_a_signal(tmp_path, caplog, monkeypatch):
    from tf_harness.data.spec import DatasetSpec
    from tf_harness.experiments.evaluator import Evaluator
    from tf_harness.experiments.run_dir import blocking
    from tf_harness.experiments.summaries import Summaries

    monkeypatch.setattr(blocking, "INTERVAL", 1.0)
    monkeypatch.setattr(blocking, "GRACE", 0.5)  # what a held signal gives the wait: tests/test_faults.py times it
    spec = DatasetSpec(name="lfw_pairs", task="binary", class_names=("same",), channels=3)
    task = SimpleNamespace(SPEC=spec, protocol_metrics=lambda table, probabilities: {},
                           protocol_notes=lambda table: {})
    tables = {"validation": pd.DataFrame({"path_a": ["a", "b"], "path_b": ["c", "d"], "label": [[1], [0]]})}
    trainer = SimpleNamespace(step=4, averaged=contextlib.nullcontext)
    never = _Never()
    evaluator = Evaluator(task, trainer, tables, Summaries(str(tmp_path), ("validation",)), tmp_path, batch_size=2,
                          eval_steps=None, seed=0, input_fn=lambda split, rows=None: never,
                          note_unreadable=lambda: None)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    interrupts.install()
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    started = time.monotonic()
    try:
        timer.start()
        with pytest.raises(interrupts.Interrupted) as stopped:
            evaluator.evaluate()
    finally:
        timer.cancel()
        never.release.set()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert time.monotonic() - started < 15
    assert stopped.value.signum == signal.SIGTERM
    assert "waiting for evaluation input batch 1 of 1 for 1 s" in caplog.text
