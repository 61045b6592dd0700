"""The tf.distribute strategy named by `strategy.name`, and the cluster TF_CONFIG describes.

TF_CONFIG's task is read without TensorFlow (`workers`, `task_type`), so the run lock can be taken before it
starts; TensorFlow is imported where a strategy is made. A task of type `evaluator` (Estimator's evaluator)
is not one of the cluster's workers: it never joins MultiWorkerMirroredStrategy, takes no worker index, and
runs mode=continuous_eval on one device (experiments/sidecar.py).
"""
import json
import os

from tf_harness.data.errors import ConfigError
from tf_harness.experiments.config import schema

EVALUATOR = "evaluator"  # TF_CONFIG's task type of the process that evaluates beside the workers


def _split(kind, count, megabytes=None):
    """Splits the first device of `kind` ("CPU" or "GPU") into `count` logical devices, each of `megabytes` MiB
    where given (TensorFlow asks it of a GPU's); possible only before TensorFlow initialises it. Returns their
    names."""
    import tensorflow as tf

    device = tf.config.list_physical_devices(kind)[0]
    try:
        tf.config.set_logical_device_configuration(
            device, [tf.config.LogicalDeviceConfiguration(memory_limit=megabytes) for _ in range(count)])
    except RuntimeError:
        pass  # already initialised by an earlier job of this process (multirun)
    return [logical.name for logical in tf.config.list_logical_devices(kind)][:count]


def one_device():
    """A OneDeviceStrategy on the first GPU, or on the CPU where there is none."""
    import tensorflow as tf

    return tf.distribute.OneDeviceStrategy("/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0")


def make_strategy(strategy_cfg):
    """The tf.distribute.Strategy `strategy_cfg` names; one device on TF_CONFIG's evaluator task, whatever it names."""
    import tensorflow as tf

    name = "one_device" if is_evaluator() else strategy_cfg.name  # an evaluator never joins the cluster
    # Physical listing leaves the runtime uninitialised, so the CPU can still be split below.
    gpus = tf.config.list_physical_devices("GPU")
    if name == "auto":
        strategy = tf.distribute.MirroredStrategy() if len(gpus) > 1 else tf.distribute.get_strategy()
    elif name == "one_device":
        strategy = one_device()
    elif name == "mirrored":
        if not gpus:
            devices = _split("CPU", strategy_cfg.logical_cpus)
        elif strategy_cfg.logical_gpus:
            devices = _split("GPU", strategy_cfg.logical_gpus, strategy_cfg.logical_gpu_mb)
        else:
            devices = None  # every GPU, a replica on each
        strategy = tf.distribute.MirroredStrategy(devices)
    elif name == "multi_worker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        raise ConfigError(f"strategy={name} is unknown; choose one of {'|'.join(schema.STRATEGY_KEYS)}")
    return strategy


def is_chief(strategy) -> bool:
    """Only the chief writes checkpoints and summaries where others would clash."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    return resolver.task_type in ("chief", None) or (resolver.task_type == "worker" and resolver.task_id == 0
                                                     and "chief" not in resolver.cluster_spec().as_dict())


def _tf_config() -> tuple:
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    return config.get("cluster", {}), config.get("task", {})


def task_type():
    """TF_CONFIG's task type (`chief`, `worker`, `evaluator`), or None without one."""
    return _tf_config()[1].get("type")


def is_evaluator() -> bool:
    """Whether TF_CONFIG names this process the cluster's evaluator, which runs mode=continuous_eval."""
    return task_type() == EVALUATOR


def workers() -> tuple:
    """(number of training workers, this worker's index) from TF_CONFIG; (1, 0) without it. The index is None on
    the evaluator task, which is none of the workers."""
    cluster, task = _tf_config()
    if task.get("type") == EVALUATOR:
        return max(schema.worker_count(cluster), 1), None
    # MultiWorkerMirroredStrategy counts the chief as worker 0 when there is one.
    index = int(task.get("index", 0)) + (len(cluster.get("chief", [])) if task.get("type") == "worker" else 0)
    return max(schema.worker_count(cluster), 1), index


def input_context(strategy):
    """This worker's place among the input pipelines (a tf.distribute.InputContext): one per training worker."""
    import tensorflow as tf

    count, index = workers()
    return tf.distribute.InputContext(num_input_pipelines=count, input_pipeline_id=index,
                                      num_replicas_in_sync=strategy.num_replicas_in_sync)
