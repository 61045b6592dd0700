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
    """The daemon thread that destroys what `drop` is given, started by the first `drop` of this process."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pid, self.queue = None, None

    def drop(self, held: list) -> None:
        """Empties `held`, a list only this call's caller holds, in the thread."""
        with self.lock:
            if self.pid != os.getpid():  # the first call, or a forked child, whose parent's thread is not in it
                self.pid, self.queue = os.getpid(), queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self.queue,), name="tf_harness: dropped iterators",
                                 daemon=True).start()
            self.queue.put(held)

    @staticmethod
    def _serve(dropped):
        while True:
            dropped.get().clear()  # the last reference: TensorFlow's destructor runs here


_DROPPING = _Dropping()


class _Iterator(iterator_ops.OwnedIterator):
    """A tf.data OwnedIterator whose resource, TensorFlow's iterator, is handed to the dropping thread on deletion."""

    def __del__(self, dropping=_DROPPING):
        held = [self.__dict__.pop("_iterator_resource", None)]  # the resource's one reference from here on
        try:
            dropping.drop(held)
        except Exception:  # noqa: BLE001  the interpreter is shutting down: destroyed here, as TensorFlow's are
            held.clear()


def make_iterator(data):
    """An iterator over `data`: for a tf.data.Dataset, the one `iter(data)` makes (eager, outside tf.function), save
    for what the module's docstring says; any other iterable's own."""
    return _Iterator(data) if isinstance(data, tf.data.Dataset) else iter(data)
