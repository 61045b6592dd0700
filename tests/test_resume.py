"""Exact resume: a run stopped and resumed ends with the weights of one that never stopped, bit for bit."""
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import run_cli

SMALL = ("pipeline.batch_size=4", "trainer.checkpoint_every=3", "trainer.eval_every=100", "trainer.eval_steps=1",
         "deterministic=true")
# Each dataset's default model, at small image sizes.
CASES = {
    "imagenet_det": ("dataset=imagenet_det", "pipeline.image_size=64"),  # semi-AlexNet with dropout 0.5
    "lfw_pairs": ("dataset=lfw_pairs", "pipeline.image_size=32"),
    # No cache holds LFW's drawn training pairs, so its checkpoints keep the input iterator even so.
    "lfw_pairs, pipeline.cache=memory": ("dataset=lfw_pairs", "pipeline.image_size=32", "pipeline.cache=memory"),
    "chest_xray": ("dataset=chest_xray", "pipeline.image_size=32"),
    # Loops of 2, cut at the checkpoints every 3 steps: loops of 2, 1, 2, 1.
    "lfw_pairs, trainer.fetch_ahead=true": ("dataset=lfw_pairs", "pipeline.image_size=32", "trainer.steps_per_loop=2"),
    # The field's recipes: drawn by the step in the train step, or read from the run's class_weights.json on resume.
    "imagenet_det, the field's recipes": ("dataset=imagenet_det", "pipeline.image_size=64",
                                          "pipeline.random_resized_crop={scale:[0.25,1]}", "pipeline.mixup_alpha=0.2",
                                          "pipeline.cutmix_alpha=1.0", "trainer.label_smoothing=0.1"),
    "chest_xray, trainer.class_weights=balanced": ("dataset=chest_xray", "model=semi_alexnet", "pipeline.image_size=32",
                                                   "trainer.class_weights=balanced",
                                                   "pipeline.random_resized_crop={scale:[0.25,1]}"),
}
# The cases that train semi-AlexNet, whose dropout is the one random layer.
DROPOUT = {"imagenet_det", "imagenet_det, the field's recipes", "chest_xray, trainer.class_weights=balanced"}
# The stopped and resumed runs only: a batch fetched ahead past a loop's last step would shift their batches
# against the unbroken run's, which fetches each in turn.
STOPPED_ONLY = {"lfw_pairs, trainer.fetch_ahead=true": ("trainer.fetch_ahead=true",)}


def _final_weights(run_dir):
    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    names = [name for name, _ in tf.train.list_variables(str(run_dir / "checkpoints"))
             if name.startswith(("model/", "optimizer/", "random_state/"))]
    return {name: reader.get_tensor(name) for name in names}


@pytest.mark.slow  # three runs each; the chest default (ResNet-v2-152) compiles for about a minute
@pytest.mark.parametrize("dataset", list(CASES))
def test_a_resumed_run_ends_with_the_weights_of_an_unbroken_one(tmp_path, dataset):
    args = [*CASES[dataset], *SMALL]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    for run_dir, budgets, only in ((straight, [6], ()), (stopped, [3, 6], STOPPED_ONLY.get(dataset, ()))):
        for steps in budgets:
            result = run_cli(*args, *only, f"trainer.train_steps={steps}", f"hydra.run.dir={run_dir}")
            assert result.returncode == 0, result.stderr[-3000:]
    expected, resumed = _final_weights(straight), _final_weights(stopped)
    assert set(expected) == set(resumed) and any(name.startswith("random_state/") for name in expected) == (
        dataset in DROPOUT)
    different = [name for name in expected if not np.array_equal(expected[name], resumed[name])]
    assert not different, different
