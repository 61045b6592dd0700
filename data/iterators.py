"""The project's iterators over tf.data input: `make_iterator(data)` is `iter(data)`, save that once the iterator is
garbage, TensorFlow's iterator behind it is destroyed in one daemon thread of this module, never in the thread
that let go of it (a function's return, a garbage collection, api.run's end).

Why: a tf.data iterator's destructor waits for the iterator's autotuning thread to end. That thread sleeps between
two optimisations for a period that doubles up to a minute, and the cancellation that should wake it can come
before it is marked done: the thread then sleeps out its period, and so does whoever dropped the iterator
(docs/input-pipeline.md#letting-go-of-an-iterator).
"""
import os
import queue
import threading

import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops


class _Dropping:
    """The daemon thread that destroys what `drop` is given: one per process, started by `start`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.started = None  # (pid, queue) of the process whose thread serves the queue

    def start(self) -> None:
        """Starts this process's thread unless it runs (a forked child starts its own). Why here and not at the
        first `drop`: a thread started inside a garbage collection may wait for ever on the interpreter's exit,
        and on a lock its own thread holds."""
        with self.lock:
            if self.started is None or self.started[0] != os.getpid():
                dropped = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(dropped,), name="tf_harness: dropped iterators",
                                 daemon=True).start()
                self.started = os.getpid(), dropped

    def drop(self, held: list, getpid=os.getpid) -> None:
        """Empties `held`, a list only this call's caller holds, in this process's thread; in a process without
        one (an iterator a forked child took from its parent), the caller's list is left to empty itself. Takes no
        lock, and SimpleQueue.put is reentrant: a garbage collection may call it anywhere, inside `start` too.
        `getpid` is bound as the module loads, as `_Iterator.__del__` binds `dropping`: at the interpreter's exit
        the module's globals may be gone before the last iterator is."""
        started = self.started
        if started is not None and started[0] == getpid():
            started[1].put(held)

    @staticmethod
    def _serve(dropped):
        while True:
            dropped.get().clear()  # the last reference: TensorFlow's destructor runs here


_DROPPING = _Dropping()


class _Iterator(iterator_ops.OwnedIterator):
    """A tf.data OwnedIterator whose resource, TensorFlow's iterator, is handed to the dropping thread on deletion."""

    def __del__(self, dropping=_DROPPING):
        dropping.drop([self.__dict__.pop("_iterator_resource", None)])  # the list holds the resource's one reference


def make_iterator(data):
    """An iterator over `data`: for a tf.data.Dataset, the one `iter(data)` makes (eager, outside tf.function), save
    for what the module's docstring says; any other iterable's own."""
    if not isinstance(data, tf.data.Dataset):
        return iter(data)
    _DROPPING.start()
    return _Iterator(data)
