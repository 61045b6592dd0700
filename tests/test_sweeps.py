"""Sweeps that tell the truth: under every launcher, one failed job leaves the others to finish, and the sweep
exits nonzero with a summary naming each failed job, its overrides, its run directory and its error line."""
import json

import pytest

from tests.conftest import run_cli

SMOKE = ("dataset=lfw_pairs", "experiment=smoke")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib", "submitit_local"])
def test_a_sweep_with_a_failed_job_finishes_the_others_then_names_it(tmp_path, launcher):
    result = run_cli("-m", f"hydra/launcher={launcher}", *SMOKE, "dataset.root=/nonexistent/root,null",
                     f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 2, result.stderr[-3000:]
    assert json.loads((tmp_path / "1" / "metrics.json").read_text())["global_step"] == 4
    summary = result.stderr[result.stderr.index("1 of 2 jobs failed:"):].splitlines()
    error = "config error: dataset.root=/nonexistent/root is not an existing directory"
    assert summary[1].startswith(f"  job 0 (dataset=lfw_pairs experiment=smoke dataset.root=/nonexistent/root) "
                                 f"in {tmp_path / '0'}: {error}"), summary
    assert len(summary) == 2


@pytest.mark.slow
def test_a_sweep_whose_jobs_all_succeed_exits_0_under_joblib_and_says_nothing_of_failures(tmp_path):
    result = run_cli("-m", "hydra/launcher=joblib", *SMOKE, "trainer.train_steps=1", "trainer.eval_steps=1",
                     "seed=1,2", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "jobs failed" not in result.stderr
    for job in ("0", "1"):
        assert json.loads((tmp_path / job / "job_outcome.json").read_text())["status"] == 0


def test_a_failed_joblib_job_is_not_exit_0(tmp_path):
    """The joblib launcher used to exit 0 when a job failed: its jobs ran in other processes."""
    result = run_cli("-m", "hydra/launcher=joblib", *SMOKE, "dataset.root=/nonexistent/a,/nonexistent/b",
                     f"hydra.sweep.dir={tmp_path}", timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "2 of 2 jobs failed:" in result.stderr
    job = f"job 1 (dataset=lfw_pairs experiment=smoke dataset.root=/nonexistent/b) in {tmp_path / '1'}: config error:"
    assert job in result.stderr


@pytest.mark.slow
def test_an_optuna_sweep_names_its_best_trial_and_its_value(tmp_path):
    """3 TPE trials (seeded) on tiny LFW, each maximising the validation accuracy its job returns."""
    import yaml
    result = run_cli("-m", "hparams_search=optuna", *SMOKE, "trainer.train_steps=2", "trainer.eval_steps=2",
                     "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    best = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == {"trainer.learning_rate", "pipeline.batch_size"}
    trials = {}
    for job in ("0", "1", "2"):
        listed = yaml.safe_load((tmp_path / job / ".hydra" / "overrides.yaml").read_text())
        overrides = dict(override.split("=", 1) for override in listed)
        trials[job] = ({key: yaml.safe_load(overrides[key]) for key in best["best_params"]},
                       json.loads((tmp_path / job / "metrics.json").read_text())["accuracy"])
    matching = [accuracy for params, accuracy in trials.values() if params == best["best_params"]]
    assert matching and matching[0] == best["best_value"]
    assert best["best_value"] == max(accuracy for _, accuracy in trials.values())
