"""Grappler, TensorFlow's graph optimizer, as `trainer.graph_optimizer` sets it (docs/training-loop.md).

Every traced function (the train loop or step, the eval step) is optimized by Grappler when it is first called;
for ResNet-v2-152 that is much of the time to the first step. Its passes are switched with
`tf.config.optimizer.set_experimental_options`, whose keys `trainer.graph_optimizer` takes. Which passes pay
for themselves depends on the device: on a CPU they are chosen from `python -m benchmarks steps first-calls`
and `steps variants` (docs/benchmarks.md); with a GPU or TPU, where the layout optimizer and remapping fuse
kernels that a CPU measurement cannot judge, TensorFlow's defaults stay.

Imports no TensorFlow at the top: experiments/config/schema.py reads OPTIONS before TensorFlow starts.
"""

# tf.config.optimizer.set_experimental_options's keys: each takes true or false (null: TensorFlow's default),
# min_graph_nodes an integer (functions with fewer nodes are left as traced).
OPTIONS = ("layout_optimizer", "constant_folding", "shape_optimization", "remapping", "arithmetic_optimization",
           "dependency_optimization", "loop_optimization", "function_optimization", "debug_stripper",
           "disable_model_pruning", "scoped_allocator_optimization", "pin_to_host_optimization",
           "implementation_selector", "auto_mixed_precision", "disable_meta_optimizer", "min_graph_nodes")
# trainer.graph_optimizer=null on CPU alone: no Grappler pass. There the passes cost the first call much of its
# CPU time and buy the steady step nothing beyond the noise (docs/training-loop.md).
ON_CPU = {"disable_meta_optimizer": True}


# What trainer.graph_optimizer takes, and what its null means, for experiments/config/schema.py's one-line errors.
NULL = "TensorFlow's defaults with a GPU or TPU, no pass on CPU alone"
ALLOWED = ("a mapping of Grappler options (" + "|".join(OPTIONS) + ") to true, false or null (min_graph_nodes: an "
           "integer), e.g. {constant_folding:false}")


def accepts(options) -> bool:
    """Whether `options` is a mapping of known options, each to null or a value of its type."""
    return isinstance(options, dict) and all(name in OPTIONS and _of_its_type(name, setting)
                                             for name, setting in options.items())


def _of_its_type(name, setting) -> bool:
    if setting is None:  # TensorFlow's default
        return True
    if name == "min_graph_nodes":
        return isinstance(setting, int) and not isinstance(setting, bool)
    return isinstance(setting, bool)


def resolve(options, accelerated: bool) -> dict:
    """`trainer.graph_optimizer` as a dict: the options given, or for null the device's default."""
    if options is not None:
        return dict(options)
    return {} if accelerated else dict(ON_CPU)


def apply(options: dict) -> None:
    """Sets Grappler's options for the functions traced from here on: `options`, and TensorFlow's default for
    every other one, since the jobs of a sweep share one process and one job's choice must not leak into the
    next (None restores a default)."""
    import tensorflow as tf

    current = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({**{key: None for key in current}, **options})
