"""The run directory is the source of truth: a re-entry runs its saved config, changed only in run-control keys."""
import csv
import shutil
import time

import pytest

from tests.conftest import event_tags, run_cli
from tests.refusals import assert_config_error

# Non-default settings: a plain `hydra.run.dir=<run> mode=predict` composes chest_xray with a ResNet at 224.
TRAINED = ("dataset=lfw_pairs", "experiment=smoke", "model.merge=pixel_difference", "pipeline.image_size=32")


@pytest.fixture(scope="module")
def run_dir(shared_runs, tmp_path_factory):
    """A copy of the session's run of TRAINED, trained in-process: the re-entries below are what is tested."""
    return shared_runs.copy(*TRAINED, to=tmp_path_factory.mktemp("truth") / "run")


def saved_hydra(run_dir):
    return {name: (run_dir / ".hydra" / name).read_bytes() for name in ("config.yaml", "overrides.yaml", "hydra.yaml")}


@pytest.mark.parametrize("override, key, requested, saved", [
    ("pipeline.image_size=48", "pipeline.image_size", "48", "32"),
    ("model.merge=embedding", "model.merge", "embedding", "pixel_difference"),
    ("pipeline.dtype=float16", "pipeline.dtype", "float16", "float32"),
    ("trainer.learning_rate=0.01", "trainer.learning_rate", "0.01", "0.001"),
    ("pipeline.batch_size=8", "pipeline.batch_size", "8", "4"),  # a resume: the saved iterator's batch
])
def test_a_checkpoint_affecting_change_exits_2_naming_key_saved_and_requested(run_dir, override, key, requested,
                                                                              saved):
    before = saved_hydra(run_dir)
    start = time.monotonic()
    # Without dataset=lfw_pairs on the line: the run directory's own dataset and model keys are composed.
    result = run_cli(override, f"hydra.run.dir={run_dir}")
    assert time.monotonic() - start < 20  # before TensorFlow starts
    assert_config_error(result, f"{key}={requested} ", f"saved {key}={saved} ", run_dir / ".hydra" / "config.yaml",
                        alone=False)
    assert saved_hydra(run_dir) == before


def test_another_dataset_on_re_entry_exits_2(run_dir):
    result = run_cli("dataset=chest_xray", f"hydra.run.dir={run_dir}")
    assert_config_error(result, "dataset=chest_xray ", "saved dataset=lfw_pairs", alone=False)


def test_predict_with_nothing_else_on_the_line_uses_the_saved_config(run_dir):
    from tf_harness.experiments import api
    before = saved_hydra(run_dir)
    # `python run.py hydra.run.dir=<run> mode=predict pipeline.batch_size=3`, in this process.
    api.run(["mode=predict", "pipeline.batch_size=3"], run_dir=str(run_dir))
    with open(run_dir / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and list(rows[0]) == ["path_a", "path_b", "fold", "same", "label", "global_step", "split"]
    assert {row["label"] for row in rows} <= {"0", "1"} and {row["global_step"] for row in rows} == {"4"}
    assert saved_hydra(run_dir) == before  # the training run's .hydra/ is intact
    # The re-entry keeps its own record: the config it ran with and its command line's overrides.
    reentries = sorted((run_dir / ".hydra").glob("reentry-*"))
    assert reentries
    latest = reentries[-1]
    assert "mode=predict" in (latest / "overrides.yaml").read_text()
    ran = (latest / "config.yaml").read_text()
    assert "merge: pixel_difference" in ran and "mode: predict" in ran and "batch_size: 3" in ran


@pytest.mark.slow  # a resumed training process
def test_resume_keeps_the_original_hydra_and_writes_one_hparams_record(run_dir):
    before = saved_hydra(run_dir)
    result = run_cli(*TRAINED, "trainer.train_steps=6", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resumed from" in result.stdout and "at global step 4" in result.stdout
    assert "without its input iterator" not in result.stdout  # the same pipeline: the iterator is restored
    assert saved_hydra(run_dir) == before
    accumulator, tags = event_tags(run_dir)
    assert "_hparams_/session_start_info" in tags
    assert len(accumulator.Tensors("_hparams_/session_start_info")) == 1
    assert len([path for path in run_dir.glob("events.out.tfevents.*") if path.suffix != ".session_end"]) == 1


@pytest.mark.slow
def test_a_resume_into_another_input_pipeline_restarts_the_input_stream(tmp_path):
    run_dir = tmp_path / "run"
    # A memory cache's iterator is left out of checkpoints (data/caching.py); without a cache it is saved.
    result = run_cli(*TRAINED, "pipeline.cache=memory", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    result = run_cli(f"hydra.run.dir={run_dir}", "pipeline.cache=none", "trainer.train_steps=6")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "without its input iterator: the input stream starts over" in result.stdout
    assert "at global step 4" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("quote", ["'", '"'])
def test_a_run_directory_named_with_hydras_quoting_reenters_as_unquoted(run_dir, tmp_path, quote):
    # A path with a space and a non-ASCII character, which Hydra takes only quoted.
    copy = tmp_path / "a b" / "ü"
    shutil.copytree(run_dir, copy)
    before = saved_hydra(copy)
    result = run_cli(f"hydra.run.dir={quote}{copy}{quote}", "mode=evaluate", "dataset.eval_pairs=dev_test")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"Restored {copy}/checkpoints/ckpt-" in result.stdout
    assert saved_hydra(copy) == before
    reentry = sorted((copy / ".hydra").glob("reentry-*"))[-1]
    assert (reentry / "overrides.yaml").read_text().startswith("- dataset=lfw_pairs\n- model=siamese_cnn\n")
