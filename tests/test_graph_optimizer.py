"""trainer.graph_optimizer: Grappler's options reach TensorFlow before anything is traced, one job's choice does
not leak into the next job of the same process, and a bad value is one line."""
import tensorflow as tf

from tf_harness.experiments.config import graph_optimizer, schema
from tests.conftest import compose
from tests.test_training_loop import make_trainer


def tensorflows_defaults():
    """Grappler's options as TensorFlow starts, whatever a Trainer built earlier in this process chose."""
    graph_optimizer.apply({})
    return tf.config.optimizer.get_experimental_options()


def test_apply_sets_the_options_and_gives_every_other_back_to_tensorflow():
    defaults = tensorflows_defaults()
    assert "constant_folding" not in defaults and defaults["disable_meta_optimizer"] is False
    graph_optimizer.apply({"constant_folding": False, "disable_meta_optimizer": True})
    chosen = tf.config.optimizer.get_experimental_options()
    assert chosen["constant_folding"] is False and chosen["disable_meta_optimizer"] is True
    graph_optimizer.apply({"layout_optimizer": False})  # the next job of a sweep, say
    options = tf.config.optimizer.get_experimental_options()
    assert options == {**defaults, "layout_optimizer": False}, options
    graph_optimizer.apply({})
    assert tf.config.optimizer.get_experimental_options() == defaults


def test_null_takes_the_devices_default_and_a_mapping_is_taken_as_given():
    assert graph_optimizer.resolve(None, accelerated=True) == {}  # a GPU or TPU: TensorFlow's defaults
    assert graph_optimizer.resolve(None, accelerated=False) == graph_optimizer.ON_CPU
    assert graph_optimizer.resolve({"remapping": False}, accelerated=False) == {"remapping": False}


def test_the_trainer_applies_the_configs_choice_before_it_traces():
    defaults = tensorflows_defaults()
    try:
        make_trainer("trainer.graph_optimizer={constant_folding:false,min_graph_nodes:-1}")
        options = tf.config.optimizer.get_experimental_options()
        assert options["constant_folding"] is False
        make_trainer("trainer.graph_optimizer={}")
        assert tf.config.optimizer.get_experimental_options() == defaults
        make_trainer()  # null, on this CPU
        assert tf.config.optimizer.get_experimental_options() == {**defaults, **graph_optimizer.ON_CPU}
    finally:
        graph_optimizer.apply({})


def test_a_bad_value_is_one_line_naming_the_key():
    for value in ("{bogus:true}", "{constant_folding:1}", "{min_graph_nodes:true}", "[constant_folding]", "fast"):
        problems = schema.problems(compose(f"trainer.graph_optimizer={value}"))
        assert len(problems) == 1 and problems[0].startswith("trainer.graph_optimizer="), problems
        assert "Grappler options" in problems[0] and "\n" not in problems[0]
    assert not schema.problems(compose("trainer.graph_optimizer={constant_folding:false,min_graph_nodes:-1}"))
