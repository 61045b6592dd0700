"""data/iterators.py: the project's tf.data iterators are destroyed in a thread of their own, not in the thread that
lets go of them."""
import gc
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf

from tensorflow.python.data.ops.iterator_ops import OwnedIterator

from tf_harness.data import iterators
from tf_harness.data.iterators import make_iterator
from tests.conftest import PROJECT

DROPPING = "tf_harness: dropped iterators"


def _data():
    """An autotuned pipeline: its iterators start tf.data's autotuning thread, which their destructor waits for."""
    return tf.data.Dataset.range(1000).map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE)


def _destroyed_in(make, let_go, monkeypatch):
    """The name of the thread in which TensorFlow's iterator behind `make(data)` is destroyed, once `let_go`, given
    a one-element list holding the iterator (a few batches drawn), has dropped every reference to it."""
    where, done = [], threading.Event()

    def destroyed():
        where.append(threading.current_thread().name)
        done.set()

    handed_over = iterators._DROPPING.drop

    def watched(held):  # watched from the hand-over on: a garbage collection clears the weak references made before
        weakref.finalize(held[0], destroyed)
        handed_over(held)

    monkeypatch.setattr(iterators._DROPPING, "drop", watched)
    held = [make(_data())]
    for _ in range(3):
        next(held[0])
    if type(held[0]) is OwnedIterator:  # TensorFlow's own, which hands nothing over
        weakref.finalize(held[0]._iterator_resource, destroyed)
    let_go(held)
    assert done.wait(60), "TensorFlow's iterator was never destroyed"
    return where[0]


def _returned(held):
    held.clear()


def _collected(held):
    """Drops the iterator into a reference cycle, which only a garbage collection frees, then collects it."""
    cycle = {"iterator": held.pop()}
    cycle["self"] = cycle
    del cycle
    gc.collect()


@pytest.mark.parametrize("let_go", [_returned, _collected], ids=["returned", "collected"])
def test_an_iterator_let_go_of_is_destroyed_in_the_dropping_thread_not_the_callers(let_go, monkeypatch):
    assert _destroyed_in(make_iterator, let_go, monkeypatch) == DROPPING
    assert _destroyed_in(iter, let_go, monkeypatch) == threading.current_thread().name  # where it is dropped


def test_the_iterator_gives_and_checkpoints_what_tensorflows_gives(tmp_path):
    assert [int(x) for x in make_iterator(_data().take(5))] == [0, 2, 4, 6, 8]
    iterator = make_iterator(_data())
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    next(iterator)
    saved = checkpoint.save(str(tmp_path / "ckpt"))
    expected = [next(iterator).numpy() for _ in range(3)]
    checkpoint.restore(saved).assert_consumed()
    np.testing.assert_array_equal([next(iterator).numpy() for _ in range(3)], expected)


_LEFT_TO_THE_EXIT = """
import tensorflow as tf
from tf_harness.data.iterators import make_iterator
data = tf.data.Dataset.range(10**9).map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE)
cycle = {"iterator": make_iterator(data)}
next(cycle["iterator"])
cycle["self"] = cycle
print("made", flush=True)
"""


def test_a_process_whose_iterators_only_its_exit_collects_exits():
    """The first iterator a process lets go of may be collected only as the interpreter exits (a run that fails
    before any other is let go of): its exit is not held up by the dropping thread."""
    done = subprocess.run([sys.executable, "-c", _LEFT_TO_THE_EXIT], cwd=PROJECT, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout) == (0, "made\n"), done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
