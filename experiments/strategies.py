"""The tf.distribute strategy named by `strategy.name`, and the cluster TF_CONFIG describes."""
import json
import logging
import os

import tensorflow as tf

from tf_harness.data.errors import ConfigError
from tf_harness.experiments import schema

log = logging.getLogger(__name__)
NAMES = ("auto", "one_device", "mirrored", "multi_worker")


def _split_cpu(count):
    """Splits the CPU into `count` logical devices; possible only before TensorFlow initialises them."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        pass  # already initialised by an earlier job of this process (multirun)
    return [device.name for device in tf.config.list_logical_devices("CPU")][:count]


def make_strategy(strategy_cfg) -> tf.distribute.Strategy:
    name = strategy_cfg.name
    # Physical listing leaves the runtime uninitialised, so the CPU can still be split below.
    gpus = tf.config.list_physical_devices("GPU")
    if name == "auto":
        strategy = tf.distribute.MirroredStrategy() if len(gpus) > 1 else tf.distribute.get_strategy()
    elif name == "one_device":
        strategy = tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    elif name == "mirrored":
        devices = None if gpus else _split_cpu(strategy_cfg.logical_cpus)
        strategy = tf.distribute.MirroredStrategy(devices)
    elif name == "multi_worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        raise ConfigError(f"strategy={name} is unknown; choose one of {'|'.join(NAMES)}")
    log.info("Strategy %s with %d replica(s)", type(strategy).__name__, strategy.num_replicas_in_sync)
    return strategy


def is_chief(strategy) -> bool:
    """Only the chief writes checkpoints and summaries where others would clash."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    return resolver.task_type in ("chief", None) or (resolver.task_type == "worker" and resolver.task_id == 0
                                                     and "chief" not in resolver.cluster_spec().as_dict())


def workers() -> tuple:
    """(number of training workers, this worker's index) from TF_CONFIG; (1, 0) without it."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster, task = config.get("cluster", {}), config.get("task", {})
    # MultiWorkerMirroredStrategy counts the chief as worker 0 when there is one.
    index = int(task.get("index", 0)) + (len(cluster.get("chief", [])) if task.get("type") == "worker" else 0)
    return max(schema.worker_count(cluster), 1), index


def input_context(strategy) -> tf.distribute.InputContext:
    """This worker's place among the input pipelines: one per training worker."""
    count, index = workers()
    return tf.distribute.InputContext(num_input_pipelines=count, input_pipeline_id=index,
                                      num_replicas_in_sync=strategy.num_replicas_in_sync)
