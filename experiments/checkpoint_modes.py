"""mode=evaluate, predict and export: the modes that read a recorded checkpoint, the one `checkpoint=` names.

`main` reads top to bottom: the run assembled (experiments/assembly.py, as `Reading` says), restore, the mode,
close. The run lock is the trainer's (one process at a time in a run directory), and a directory without a
checkpoint is refused before anything is written (experiments/run_dir/directory.py `claim`).
"""
import logging

from tf_harness.data import TASKS
from tf_harness.data.errors import ConfigError
from tf_harness.experiments import assembly
from tf_harness.experiments.config.settings import Job, Settings
from tf_harness.experiments.evaluation import heatmaps
from tf_harness.experiments.serving import export
from tf_harness.experiments.training import recipes

log = logging.getLogger(__name__)

# The event files each mode writes: a predict or export leaves the run directory's events as they were.
MODES = {"evaluate": ("validation",), "predict": (), "export": ()}


class Reading(assembly.Role):
    """The role of the modes that read a recorded checkpoint (experiments/assembly.py): the chief writes the
    event files of its mode (`MODES`)."""

    def events(self, mode: str, writes: bool) -> tuple:
        return MODES[mode] if writes else ()


def main(settings: Settings, job: Job, actions=()):
    """Restores the checkpoint `checkpoint=` names and runs the mode on it; `actions`' `after_evaluation` follows
    an evaluation of the validation split. Returns what experiments/runner.py `run` says."""
    # Assembly: strategy, run directory (claimed), data, model, summaries, evaluator ---------------------------
    run = assembly.assemble(settings, job, Reading())
    modes = CheckpointModes(run, actions)

    # Restore: the checkpoint `checkpoint=latest|best|<step>` names --------------------------------------------
    modes.restore()

    # The mode ---------------------------------------------------------------------------------------------------
    {"evaluate": modes.evaluate, "predict": modes.predict, "export": modes.export}[settings.mode]()

    # Close ------------------------------------------------------------------------------------------------------
    return run.close()


class CheckpointModes:
    """Restores a recorded checkpoint, then evaluates, predicts or exports it."""

    def __init__(self, run: assembly.Run, actions=()):
        """`run`: as experiments/assembly.py assembles it; `actions` (experiments/training/actions.py): their
        `after_evaluation` follows an evaluation of the validation split."""
        self.run, self.actions = run, list(actions)

    def restore(self):
        """Restores the checkpoint that `checkpoint=latest|best|<step>` names: by default the run's newest
        restorable one."""
        run, split = self.run, self.run.settings.split
        name = run.task.SPEC.name
        if split is not None and split not in run.tables:  # the dataset has one, but not in this copy of it
            raise ConfigError(f"split={split}: dataset={name} has no {split} split under "
                              f"{run.settings.dataset.root or 'its sample'} (its test split is "
                              f"{TASKS.entries[name].test}: docs/datasets.md)")
        self.restored = recipes.chosen_checkpoint(run.settings.checkpoint, run.run_dir, run.settings.mode)
        run.trainer.checkpoint().restore(self.restored).expect_partial()
        log.info("Restored %s (global step %d)", self.restored, run.trainer.step)

    def evaluate(self):
        """Evaluates the restored weights, then calls the actions' `after_evaluation`. With split=test, the test
        split into metrics_test.json, which no action counts."""
        if self.run.settings.split == "test":
            return self.run.evaluator.evaluate("test")
        values = self.run.evaluator.evaluate()
        for action in self.actions:
            action.after_evaluation(self.run.trainer.step, values)
        return values

    def predict(self):
        run = self.run
        predictions = run.evaluator.predict(run.settings.split)
        if run.settings.heatmaps and predictions is not None:  # heatmaps=N: heatmaps of the N highest scores
            with run.trainer.averaged():
                heatmaps.write_top(run.task, run.trainer, predictions, run.settings.heatmaps, run.run_dir.model_dir)

    def export(self):
        with self.run.trainer.averaged():  # trainer.ema_decay: the averaged weights are what is served
            return export.export(self.run.task, self.run.trainer, self.run.run_dir, self.restored)
