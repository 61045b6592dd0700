"""The input_fn factory and the traced steps it feeds."""
import numpy as np
import pytest
import tensorflow as tf

from data.input_fn import input_fn, load_tables
from data.skipped import SkipLog
from experiments.trainer import Trainer
from tests.conftest import compose

OVERRIDES = ("dataset=chest_xray", "model=resnet_v2_50", "pipeline.image_size=32", "pipeline.batch_size=8")


@pytest.fixture(scope="module")
def cfg():
    return compose(*OVERRIDES)


@pytest.fixture(scope="module")
def tables(cfg):
    return load_tables(cfg, SkipLog())


def test_train_and_validation_share_one_element_spec(cfg, tables):
    train = input_fn(cfg, tables["train"], training=True, split="train")
    validation = input_fn(cfg, tables["validation"], training=False, split="validation")
    assert train.element_spec == validation.element_spec
    features, labels, weights = train.element_spec
    # uint8: the steps augment and normalise on the device (data/preprocessing.py).
    assert features.shape == (8, 32, 32, 1) and features.dtype == tf.uint8
    assert labels.shape == (8, 14) and weights.shape == (8,)


def test_evaluation_sees_every_example_exactly_once(cfg, tables):
    table = tables["validation"]
    assert len(table) % 8, "the sample's validation split should not be a multiple of the batch"
    validation = input_fn(cfg, table, training=False, split="validation")
    labels = np.concatenate([batch_labels[batch_weights > 0] for _, batch_labels, batch_weights
                             in validation.as_numpy_iterator()])
    assert len(labels) == len(table)
    np.testing.assert_array_equal(labels, np.asarray(table.label.tolist(), np.float32))


def test_the_training_stream_is_seeded(tables):
    cfg = compose(*OVERRIDES, "deterministic=true")
    first = next(iter(input_fn(cfg, tables["train"], training=True, split="train", seed=1)))
    again = next(iter(input_fn(cfg, tables["train"], training=True, split="train", seed=1)))
    other = next(iter(input_fn(cfg, tables["train"], training=True, split="train", seed=2)))
    assert first[0].numpy().max() > first[0].numpy().min()
    np.testing.assert_array_equal(first[0].numpy(), again[0].numpy())
    np.testing.assert_array_equal(first[1].numpy(), again[1].numpy())
    assert not np.array_equal(first[1].numpy(), other[1].numpy())


def test_no_python_runs_per_example(cfg, tables):
    """The pipeline's graph holds no py_function / from_generator ops."""
    pipeline = input_fn(cfg, tables["train"], training=True, split="train")
    graph = tf.raw_ops.DatasetToGraphV2(input_dataset=pipeline._variant_tensor).numpy().decode("latin-1")
    for op in ("EagerPyFunc", "PyFunc", "GeneratorDataset"):
        assert f'op: "{op}"' not in graph


def test_train_and_eval_steps_are_traced_once_across_epochs_and_evaluations(cfg, tables):
    from data.chest_xray import SPEC
    trainer = Trainer(cfg, SPEC, tf.distribute.get_strategy(), (32, 32))
    train = iter(input_fn(cfg, tables["train"], training=True, split="train"))
    validation = input_fn(cfg, tables["validation"], training=False, split="validation")
    steps_per_epoch = len(tables["train"]) // 8
    for _ in range(steps_per_epoch + 2):  # crosses an epoch boundary
        trainer.train_step(*next(train))
    for _ in range(2):  # two evaluations, each over the whole split, the last batch padded
        for batch in validation:
            trainer.eval_step(*batch)
    assert trainer.train_step.experimental_get_tracing_count() == 1
    assert trainer.eval_step.experimental_get_tracing_count() == 1
    assert trainer.step == steps_per_epoch + 2
