"""How the train loop takes its batches from the input iterator, and times its wait for them.

input_wait_fraction, for any loop length: inside the loop, each step's batch request is timed by clock
ops on either side of it (`tf.timestamp()`). A step's wait is how long it sat idle for its batch: what
the host's `next(iterator)` timed when every step was its own call. The fraction is the loop's summed
waits over the loop's wall time on the host (the call, the loop's own overhead and the read of its
results included).

- `fetch` (the default): a step asks for its batch only after the previous step (its update included)
  has finished, and its wait is how long the request took.
- `fetch_early` (`trainer.fetch_ahead`): the next step's batch is fetched while the current step runs,
  ordered after nothing in it; the next step's wait is how long after the current step was done its batch
  was still missing. The batch stays on the host until its step takes it: the loop carries it to the next
  iteration through a Switch op, and TensorFlow's Switch has no GPU kernel for uint8 images, so a batch
  copied to the GPU early would be copied back to the host and out again every step.
"""
import time

import tensorflow as tf


def _host_clock():
    return tf.reshape(tf.numpy_function(time.perf_counter, [], tf.float64, stateful=True), [])


class LoopInput:
    """The batch fetches of a traced train loop, with their clocks."""

    def __init__(self, deterministic):
        # tf.timestamp refuses to run under op determinism; a host clock called from the graph does not.
        self.clock = _host_clock if deterministic else tf.timestamp

    def fetch(self, iterator, after):
        """The next batch, asked for only once `after` has run, and how long the request took: the step's wait."""
        with tf.control_dependencies([after]):
            asked_at = self.clock()
        with tf.control_dependencies([asked_at]):
            batch = next(iterator)
        with tf.control_dependencies(tf.nest.flatten(batch)):
            fetched_at = self.clock()
        # ...and start the step only after that timestamp, or it may queue behind the step's own ops.
        with tf.control_dependencies([fetched_at]):
            batch = tf.nest.map_structure(tf.identity, batch)
        return batch, fetched_at - asked_at

    def fetch_early(self, iterator):
        """The next batch, and the time it was there."""
        batch = next(iterator)
        with tf.control_dependencies(tf.nest.flatten(batch)):
            return batch, self.clock()
