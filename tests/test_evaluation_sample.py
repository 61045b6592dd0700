"""trainer.eval_steps scores a fixed, seeded, stratified sample of the validation split, whatever the batch size."""
import hashlib
import json

import numpy as np
import pytest
import tensorflow as tf

from tf_harness.data.evaluation_sample import EXAMPLES_PER_STEP
from tf_harness.data.input_fn import input_fn
from tf_harness.experiments.config.settings import Settings
from tf_harness.experiments.evaluator import Evaluator
from tf_harness.experiments.summaries import Summaries
from tf_harness.experiments.training.trainer import Trainer
from tests.conftest import compose, run_cli, tables_of, task_of

# A tiny LFW run. The dev_test pairs (the validation split) come ordered by class: the first 100 are same-person
# pairs, so the head of the split is all one class.
TINY_LFW = ("dataset=lfw_pairs", "pipeline.image_size=24", "model.widths=[8,16]", "model.embedding_size=16",
            "model.head_units=8", "trainer.eval_steps=1")


class ScoredExamples:
    """An eval step that records what each evaluation scores: per counted example, a digest of its two faces
    (which pair it is) and its label."""

    def __init__(self, eval_step):
        self.eval_step, self.examples = eval_step, []

    def __call__(self, features, labels, weights):
        for face_a, face_b, label, weight in zip(*features, labels, weights):
            if weight > 0:
                pair = hashlib.sha256(face_a.numpy().tobytes() + face_b.numpy().tobytes()).hexdigest()
                self.examples.append((pair, int(label.numpy()[0])))
        return self.eval_step(features, labels, weights)


def evaluations(tmp_path, batch_size, times):
    """The examples each of `times` evaluations scores, and the last one's metrics, at `batch_size`."""
    cfg = compose(*TINY_LFW, f"pipeline.batch_size={batch_size}")
    task, tables = task_of(cfg), tables_of(cfg)
    tf.keras.utils.set_random_seed(cfg.seed)
    settings = Settings.from_config(cfg)
    trainer = Trainer(settings, task.SPEC, tf.distribute.get_strategy(), task.decode.size, loss=task.loss)
    model_dir = tmp_path / f"batch-{batch_size}"
    model_dir.mkdir()
    pipeline = settings.input_pipeline()

    def split_input(split, rows=None):
        return input_fn(task, tables[split], pipeline, split=split, training=False, model_dir=model_dir, rows=rows)

    estimator = Evaluator(task, trainer, tables, Summaries(str(model_dir)), model_dir, batch_size=batch_size,
                          eval_steps=settings.trainer.eval_steps, seed=pipeline.seed, input_fn=split_input,
                          note_unreadable=lambda: None)
    scored, values = [], None
    for _ in range(times):
        trainer.eval_step = ScoredExamples(trainer.eval_step)
        values = estimator.evaluate()
        scored.append(trainer.eval_step.examples)
        trainer.eval_step = trainer.eval_step.eval_step
    return scored, values, len(tables["validation"])


@pytest.fixture(scope="module")
def by_batch_size(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("evaluation-sample")
    return {batch_size: evaluations(tmp_path, batch_size, times) for batch_size, times in ((4, 2), (8, 1))}


def test_a_small_lfw_sample_holds_both_classes_and_its_accuracy_and_auc_are_defined(by_batch_size):
    (scored, _), values, whole = by_batch_size[4]
    labels = [label for _, label in scored]
    assert len(scored) == EXAMPLES_PER_STEP < whole
    assert labels.count(1) == labels.count(0) == EXAMPLES_PER_STEP // 2  # as balanced as the split
    assert np.isfinite(values["accuracy"]) and np.isfinite(values["auc"]), values


def test_the_sample_is_the_same_at_every_evaluation_and_batch_size(by_batch_size):
    (first, second), _, _ = by_batch_size[4]
    (wider,), _, _ = by_batch_size[8]
    assert len({pair for pair, _ in first}) == len(first) == EXAMPLES_PER_STEP  # each example scored once
    assert first == second == wider


@pytest.mark.slow  # a training process
def test_run_log_says_how_many_validation_examples_were_scored(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(*TINY_LFW, "pipeline.batch_size=8", "trainer.train_steps=1", "trainer.eval_every=1",
                     f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run_dir / "run.log").read_text()
    assert (f"Evaluated {EXAMPLES_PER_STEP} of 200 validation examples (trainer.eval_steps=1: 1 x {EXAMPLES_PER_STEP}, "
            f"a sample stratified by class, drawn with seed={compose(*TINY_LFW).seed}") in log, log[-3000:]
    assert "protocol metrics of lfw_pairs are defined on the whole split and left out" in log
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert (metrics["examples"], metrics["split_examples"]) == (EXAMPLES_PER_STEP, 200)
    assert metrics["accuracy"] is not None and metrics["auc"] is not None, metrics
