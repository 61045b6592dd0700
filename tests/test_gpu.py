"""The gpu suite: what only a GPU can show. `python -m pytest -m gpu` runs it on a machine with one (docs/scaling.md,
"The gpu suite"); elsewhere each test skips with one line.

- the default run of each dataset;
- every 16-bit cell of the combination matrix (tests/matrix.py): trained, then evaluated, predicted with heatmaps,
  exported and reloaded, and resumed, as tests/test_matrix.py takes it on a CPU;
- the train step with and without XLA, batches fetched ahead, and batches prefetched to the GPU where checkpoints
  leave the input out;
- two replicas on one card split into two logical GPUs (strategy.logical_gpus): trained, evaluated, resumed
  exactly after SIGTERM, and set beside one replica on the same global batch.
"""
import json
import re
import statistics

import pytest

from tests import matrix
from tests.conftest import run_cli
from tests.test_faults import _fault_script
from tests.test_matrix import _check_step, _check_trained
from tf_harness.experiments import api

pytestmark = pytest.mark.gpu

SIXTEEN_BIT = [cell for cell in matrix.cells() if cell.dtype != "float32"]
TWO_GPUS = ("strategy=mirrored", "strategy.logical_gpus=2", "strategy.logical_gpu_mb=8192")
LFW = ("dataset=lfw_pairs", "experiment=smoke", "pipeline.image_size=32", "model.widths=[8,16]")


@pytest.fixture(autouse=True)
def a_gpu():
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("needs a GPU: TensorFlow sees none here")


@pytest.fixture(scope="session")
def trained_runs(shared_runs, tmp_path_factory):
    return matrix.TrainedRuns(shared_runs, tmp_path_factory.mktemp("matrix"))


def _finite_record(run_dir, name="metrics.json"):
    record = json.loads((run_dir / name).read_text())
    assert matrix.finite_numbers(record) > 2, record
    return record


def _examples_per_second(output) -> list:
    return [float(value) for value in re.findall(r"([\d.]+) examples/s", output)]


@pytest.mark.parametrize("dataset", ["lfw_pairs", "imagenet_det", "chest_xray"])
def test_the_default_run_of_each_dataset_trains_on_the_gpu(dataset, tmp_path):
    result = run_cli(f"dataset={dataset}", f"hydra.run.dir={tmp_path}", timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "each train step compiled with XLA" in result.stdout
    record = _finite_record(tmp_path)
    first = re.search(r"first step[^\n]*", result.stdout)
    print(f"{dataset}: {first.group(0) if first else ''}; examples/s {_examples_per_second(result.stdout)}; "
          f"{json.dumps(record)}")


@pytest.mark.parametrize("cell", SIXTEEN_BIT, ids=[cell.id for cell in SIXTEEN_BIT])
def test_a_16_bit_cell_trains_evaluates_predicts_with_heatmaps_exports_and_resumes(cell, trained_runs):
    _check_trained(cell, trained_runs.get(cell), step=4)
    walked, steps = trained_runs.walked(cell)
    for mode, overrides, returned in steps:
        _check_step(cell, walked, mode, overrides, returned)


@pytest.mark.parametrize("overrides", [("trainer.jit_compile=true",), ("trainer.jit_compile=false",),
                                       ("trainer.fetch_ahead=true",), ("trainer.fetch_ahead=false",),
                                       ("trainer.checkpoint_input=false", "trainer.steps_per_loop=4")],
                         ids=["xla", "no-xla", "fetch-ahead", "no-fetch-ahead", "prefetch-to-gpu"])
def test_the_step_and_its_input_options_train_on_the_gpu(overrides, tmp_path):
    returned = api.run([*LFW, "pipeline.dtype=float16", "trainer.train_steps=8", *overrides], run_dir=str(tmp_path))
    assert matrix.finite_numbers(returned) > 2 and returned["global_step"] == 8
    if "trainer.checkpoint_input=false" in overrides:
        assert "training batches are copied to /device:GPU:0" in \
            (tmp_path / "run.log").read_text()
        resumed = api.run([*LFW, "pipeline.dtype=float16", "trainer.train_steps=12", *overrides],
                          run_dir=str(tmp_path))
        assert resumed["global_step"] == 12
        assert "a resumed run starts its input stream over" in (tmp_path / "run.log").read_text()


@pytest.mark.parametrize("dataset", ["lfw_pairs", "chest_xray", "imagenet_det"])
def test_two_replicas_on_one_card_resume_exactly_after_sigterm(dataset, tmp_path):
    faults = _fault_script()
    counts = faults.run_trials([dataset], ["SIGTERM"], trials=1, seed=3, work=tmp_path, extra=TWO_GPUS)
    failures = [failure for _, _, failed, _ in counts.values() for failure in failed]
    assert not failures, failures
    reference = tmp_path / dataset / "reference"
    assert _finite_record(reference)["global_step"] == faults.STEPS


def test_two_replicas_take_the_global_batch_of_one_and_come_close_to_its_metrics(tmp_path):
    """Two logical GPUs against one, the same MirroredStrategy path and global batch: what the all-reduce costs a
    step (printed), and validation loss and accuracy near one replica's."""
    runs = {}
    for gpus in (1, 2):
        run_dir = tmp_path / f"{gpus}"
        result = run_cli(*LFW, "strategy=mirrored", f"strategy.logical_gpus={gpus}", "strategy.logical_gpu_mb=8192",
                         "deterministic=true", "trainer.train_steps=300", "trainer.log_every=50",
                         "trainer.eval_every=300", "trainer.steps_per_loop=10", f"hydra.run.dir={run_dir}")
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"with {gpus} replica(s)" in result.stdout
        batch = re.search(r"Built the train input pipeline: batches of (\d+)", result.stdout).group(1)
        runs[gpus] = (batch, _finite_record(run_dir), _examples_per_second(result.stdout)[1:])
    (one_batch, one, one_speed), (two_batch, two, two_speed) = runs[1], runs[2]
    print(f"examples/s, one logical GPU {statistics.median(one_speed):.1f} ({min(one_speed):.1f}-{max(one_speed):.1f}),"
          f" two {statistics.median(two_speed):.1f} ({min(two_speed):.1f}-{max(two_speed):.1f}); "
          f"metrics one {json.dumps(one)}; two {json.dumps(two)}")
    assert one_batch == two_batch
    assert abs(one["accuracy"] - two["accuracy"]) <= 0.15, (one, two)
    assert abs(one["loss"] - two["loss"]) <= 0.15 * one["loss"] + 0.05, (one, two)
