"""A run called from Python (experiments/api.py), and actions added to the loop without touching the controller
(experiments/training/actions.py): from a plain Python process, as a notebook or another tool would."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PROJECT, lock_holder, run_cli
from tests.shared_runs import SMOKE as SHARED_SMOKE

# The script a user would write: train with an action of its own, evaluate again, then a config the schema refuses.
_SCRIPT = """
import json, sys
from tf_harness.experiments import api

light = "tensorflow" not in sys.modules and "hydra" not in sys.modules
from tf_harness.experiments.training.actions import Action  # the loop's actions: with the trainer, TensorFlow

class Recorder(Action):
    def __init__(self):
        self.loops, self.evaluations = [], []
    def after_loop(self, step, loop):
        self.loops.append([step, loop.steps, loop.loss])
    def after_evaluation(self, step, values):
        self.evaluations.append([step, values["loss"]])

run_dir, overrides = sys.argv[1], sys.argv[2:]
trained_with, evaluated_with = Recorder(), Recorder()
trained = api.run(overrides, run_dir=run_dir, actions=[trained_with])
evaluated = api.run(["mode=evaluate"], run_dir=run_dir, actions=[evaluated_with])
errors = []
for bad in (["dataset=lfw_pairs", "trainer.train_steps=banana"], ["dataset=no_such_dataset"]):
    try:
        api.run(bad, run_dir=run_dir + "-bad")
    except api.ConfigError as error:
        errors.append([type(error).__name__, str(error)])
print(json.dumps(dict(light=light, trained=trained, evaluated=evaluated, trained_with=vars(trained_with),
                      evaluated_with=vars(evaluated_with), errors=errors)))
"""
SMOKE = ["dataset=lfw_pairs", "experiment=smoke", "pipeline.image_size=24", "model.widths=[8,16]",
         "model.embedding_size=8", "model.head_units=8"]


def test_importing_the_api_starts_neither_tensorflow_nor_hydra():
    check = ("import sys\nimport tf_harness.experiments.api\n"
             "assert 'tensorflow' not in sys.modules and 'hydra' not in sys.modules, sorted(sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", check], cwd=PROJECT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    """The script's run, in a folder that is not the project's: what it printed, and its run directory."""
    folder = tmp_path_factory.mktemp("api")
    run_dir = folder / "run"
    result = subprocess.run([sys.executable, "-c", _SCRIPT, str(run_dir), *SMOKE], cwd=folder, capture_output=True,
                            text=True, timeout=900, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), run_dir


@pytest.mark.slow  # two runs
def test_a_run_from_python_trains_evaluates_again_and_writes_the_run_directory(script):
    out, run_dir = script
    assert out["light"]
    recorded = json.loads((run_dir / "metrics.json").read_text())
    assert out["trained"]["global_step"] == recorded["global_step"] == 4
    assert out["trained"]["loss"] == pytest.approx(recorded["loss"])
    # mode=evaluate re-entered the run: the saved config, the newest checkpoint, the same weights and sample.
    assert out["evaluated"]["global_step"] == 4
    assert out["evaluated"]["loss"] == pytest.approx(out["trained"]["loss"], rel=1e-5)
    # The run directory the command line writes: its record, and a re-entry's beside it, not over it.
    hydra = run_dir / ".hydra"
    assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= {path.name for path in hydra.iterdir()}
    assert "experiment=smoke" in (hydra / "overrides.yaml").read_text()
    assert len(list(hydra.glob("reentry-*/config.yaml"))) == 1
    assert (run_dir / "run.log").read_text().rstrip().endswith("run finished, exit status 0")
    assert list((run_dir / "checkpoints").glob("ckpt-4.index"))


@pytest.mark.slow  # shares the two runs above
def test_an_action_added_from_outside_is_called_with_each_step_and_evaluation(script):
    out, _ = script
    loops = out["trained_with"]["loops"]
    assert [step for step, _, _ in loops] == [1, 2, 3, 4] and all(steps == 1 for _, steps, _ in loops)
    assert all(loss > 0 for _, _, loss in loops)
    evaluations = out["trained_with"]["evaluations"]
    assert [step for step, _ in evaluations] == [2, 4]
    assert evaluations[-1][1] == pytest.approx(out["trained"]["loss"])
    assert out["evaluated_with"] == {"loops": [], "evaluations": [[4, pytest.approx(out["evaluated"]["loss"])]]}


@pytest.mark.slow  # shares the script's process
def test_a_config_error_raises_the_line_the_command_line_prints(script, tmp_path):
    out, run_dir = script
    (value_type, value_line), (group_type, group_line) = out["errors"]
    assert value_type == group_type == "RunConfigError"
    assert value_line.startswith("config error: ") and "trainer.train_steps=banana" in value_line
    assert group_line.startswith("config error: ") and "no_such_dataset" in group_line
    assert not run_dir.with_name("run-bad").exists()  # refused before anything was written
    cli = run_cli("dataset=lfw_pairs", "trainer.train_steps=banana", f"hydra.run.dir={tmp_path / 'bad'}")
    assert cli.returncode == 2 and cli.stderr.strip().splitlines()[-1] == value_line


def test_a_run_from_python_lets_go_of_its_run_directory_when_it_returns_or_raises(shared_runs, tmp_path):
    """A notebook's api.run kept the run directory's lock until the Python process exited: a command-line
    mode=evaluate on the folder was refused "in use by pid" meanwhile."""
    from tf_harness.experiments import api
    from tf_harness.experiments.training.actions import Action

    run_dir = shared_runs.copy(*SHARED_SMOKE["lfw_pairs"], to=tmp_path / "run")
    earlier = {id(iterator) for iterator in _input_iterators()}
    api.run(["trainer.train_steps=6"], run_dir=str(run_dir))  # trains on from the smoke run's 4 steps
    with lock_holder(run_dir):  # another process takes the lock at once
        pass
    # Nor are its input iterators, whose threads a later garbage collection would wait on, left alive.
    assert not [iterator for iterator in _input_iterators() if id(iterator) not in earlier]

    class Failing(Action):
        def after_loop(self, step, loop):
            raise RuntimeError("an action's own failure")

    with pytest.raises(Exception, match="an action's own failure"):
        api.run(["mode=train", "trainer.train_steps=8"], run_dir=str(run_dir), actions=[Failing()])
    with lock_holder(run_dir):
        pass


def _input_iterators():
    """The tf.data iterators this process holds, those only garbage collection would free included."""
    import gc

    from tensorflow.python.data.ops.iterator_ops import OwnedIterator
    return [thing for thing in gc.get_objects() if isinstance(thing, OwnedIterator)]
