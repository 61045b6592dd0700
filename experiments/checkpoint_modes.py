"""mode=evaluate, predict and export: the modes that read a recorded checkpoint, the one `checkpoint=` names.

`main` reads top to bottom: settings, run directory (claim it), data, model, restore, the mode, close. The
run lock is the trainer's (one process at a time in a run directory), and a directory without a checkpoint is
refused before anything is written (experiments/run_dir/directory.py `claim`).
"""
import logging
from pathlib import Path

from tf_harness.data import TASKS
from tf_harness.data.errors import ConfigError
from tf_harness.experiments import sections
from tf_harness.experiments.config import strategies
from tf_harness.experiments.evaluation import heatmaps
from tf_harness.experiments.run_dir import interrupts
from tf_harness.experiments.run_dir.directory import claim
from tf_harness.experiments.serving import export
from tf_harness.experiments.startup import StartupClock
from tf_harness.experiments.training import recipes, xla_cache

log = logging.getLogger(__name__)

# The event files each mode writes: a predict or export leaves the run directory's events as they were.
MODES = {"evaluate": ("validation",), "predict": (), "export": ()}


def main(settings, job, actions=()):
    """Restores the checkpoint `checkpoint=` names and runs the mode on it; `actions`' `after_evaluation` follows
    an evaluation of the validation split. Returns what experiments/runner.py `run` says."""
    # Settings ---------------------------------------------------------------------------------------------------
    clock = StartupClock()
    model_dir = Path(job.run_dir)
    sections.fresh_state(settings)
    strategy = strategies.make_strategy(settings.strategy)
    policy = sections.precision(settings, strategy)

    # Run directory: claim it ------------------------------------------------------------------------------------
    # The run lock, a killed run's leftovers, and the refusal of a directory without a checkpoint, before anything
    # is written. From here on SIGINT and SIGTERM end the run (exit 130/143).
    interrupts.install()
    run_dir = claim(settings, model_dir)
    xla_cache.report()
    sections.log_start(settings, strategy, policy, f"Run directory: {model_dir}")
    writes = sections.share(run_dir, strategy)

    # Data: index once, in Python --------------------------------------------------------------------------------
    task, pipeline = settings.task(), settings.input_pipeline()
    tables, skipped = sections.index(settings, task, pipeline, settings.mode, clock)

    # Model: network, optimizer and global step ---------------------------------------------------------------
    trainer = sections.build(settings, task, strategy, clock)
    sections.first_files(settings, task, tables, skipped, model_dir, writes)
    summaries = sections.summaries(settings, task, job, model_dir, MODES[settings.mode] if writes else (), writes)
    note_unreadable = sections.UnreadableFiles(skipped, model_dir, writes)
    note_unreadable()  # what an earlier life of this run found
    evaluator = sections.evaluator(settings, task, trainer, tables, pipeline, summaries, run_dir, note_unreadable)
    modes = CheckpointModes(settings, task, trainer, evaluator, run_dir, tables, actions)
    objective = recipes.Recipes(settings.trainer, task.SPEC, trainer, run_dir)  # trainer.objective: last or best

    # Restore: the checkpoint `checkpoint=latest|best|<step>` names --------------------------------------------
    modes.restore()

    # The mode ---------------------------------------------------------------------------------------------------
    {"evaluate": modes.evaluate, "predict": modes.predict, "export": modes.export}[settings.mode]()

    # Close ------------------------------------------------------------------------------------------------------
    return sections.close(summaries, evaluator, objective, trainer)


class CheckpointModes:
    """Restores a recorded checkpoint, then evaluates, predicts or exports it."""

    def __init__(self, settings, task, trainer, evaluator, run_dir, tables, actions=()):
        """`actions` (experiments/training/actions.py): their `after_evaluation` follows an evaluation of the validation
        split."""
        self.settings, self.task, self.spec, self.trainer = settings, task, task.SPEC, trainer
        self.evaluator, self.run_dir, self.tables, self.actions = evaluator, run_dir, tables, list(actions)

    def restore(self):
        """Restores the checkpoint that `checkpoint=latest|best|<step>` names: by default the run's newest
        restorable one."""
        split = self.settings.split
        if split is not None and split not in self.tables:  # the dataset has one, but not in this copy of it
            raise ConfigError(f"split={split}: dataset={self.spec.name} has no {split} split under "
                              f"{self.settings.dataset.root or 'its sample'} (its test split is "
                              f"{TASKS.entries[self.spec.name].test}: docs/datasets.md)")
        self.restored = recipes.chosen_checkpoint(self.settings.checkpoint, self.run_dir, self.settings.mode)
        self.trainer.checkpoint().restore(self.restored).expect_partial()
        log.info("Restored %s (global step %d)", self.restored, self.trainer.step)

    def evaluate(self):
        """Evaluates the restored weights, then calls the actions' `after_evaluation`. With split=test, the test
        split into metrics_test.json, which no action counts."""
        if self.settings.split == "test":
            return self.evaluator.evaluate("test")
        values = self.evaluator.evaluate()
        for action in self.actions:
            action.after_evaluation(self.trainer.step, values)
        return values

    def predict(self):
        predictions = self.evaluator.predict(self.settings.split)
        if self.settings.heatmaps and predictions is not None:  # heatmaps=N: heatmaps of the N highest scores
            with self.trainer.averaged():
                heatmaps.write_top(self.task, self.trainer, predictions, self.settings.heatmaps,
                                   self.run_dir.model_dir)

    def export(self):
        with self.trainer.averaged():  # trainer.ema_decay: the averaged weights are what is served
            return export.export(self.task, self.trainer, self.run_dir, self.restored)
