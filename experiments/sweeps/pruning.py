"""Pruning (sweep.pruner): a training job that is a trial of a stored Optuna study reports each evaluation's value
to its trial, and stops where Optuna's pruner says the trial loses.

One action of the training loop, called after an evaluation as early stopping is (experiments/training/recipes.py):
`evaluated(values, step)`, then the loop ends once `stopped`. A pruned run saves the step it stopped at, its
metrics.json says `pruned: true`, the study records the trial PRUNED, and the job exits 0. A pruned trial's run
directory entered again (a requeued job) has nothing left to train.

Why the job finds its own trial: a Hydra sweeper hands a job its parameters only, never its trial (hydra issue
1954). The harness's sweeper numbers each job by its trial (experiments/sweeps/study_sweeper.py), so the job opens the
study's storage and takes the trial of its number (experiments/sweeps/study.py's JobTrial). A study that stops answering
never fails the job: it trains on, unpruned, and the sweep tells the study its result.
"""
import json
import logging
import math
from pathlib import Path

from tf_harness.data.integrity import reading
from tf_harness.data.integrity.writing import replacing
from tf_harness.experiments.run_dir import interrupts

log = logging.getLogger(__name__)


def pruner(name: str):
    """Optuna's pruner that sweep.pruner names, with its defaults."""
    import optuna

    return {"median": optuna.pruners.MedianPruner, "hyperband": optuna.pruners.HyperbandPruner}[name]()


class Pruning:
    """The pruning action of one training run: with `name` (sweep.pruner) None or no `trial`, it never stops."""

    def __init__(self, name, trial, objective, model_dir: Path, chief: bool):
        """`trial`: the job's study.JobTrial; `objective(values)`: the value the job reports for an evaluation's
        `values` (experiments/training/recipes.py); metrics.json in `model_dir` records a pruned run (by the
        `chief`)."""
        self.stopped = False
        self._trial = None
        self._objective, self._model_dir, self._chief = objective, model_dir, chief
        if name is None:
            return
        if trial is None:  # a trial's run directory entered again as a single run, say
            log.info("sweep.pruner=%s prunes the trials of a stored Optuna study; this run is not one, and runs "
                     "to its end", name)
            return
        from optuna.trial import TrialState

        from tf_harness.experiments.sweeps import study as studies
        self._number = trial.number
        try:
            self._study, self._trial = trial.open(pruner(name))
            pruned = self._study._storage.get_trial(self._trial._trial_id).state == TrialState.PRUNED
        except (studies.StorageError, *studies.storage_errors()) as error:
            self._unreachable(error)
            return
        if pruned:
            self.stopped = True
            log.info("Trial %d of study %s was pruned; nothing to train", trial.number, trial.study_name)

    def evaluated(self, values, step) -> None:
        """Reports the evaluation at global `step` (its `values`) to the trial; stops the run where the pruner
        says so."""
        if self._trial is None or self.stopped:
            return
        value = self._objective(values)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        from optuna.trial import TrialState

        from tf_harness.experiments.sweeps import study as studies
        with interrupts.deferred():  # the report, the decision and its record, together
            try:
                self._trial.report(float(value), step)
                if not self._trial.should_prune():
                    return
            except studies.storage_errors() as error:
                self._unreachable(error)
                return
            self.stopped = True
            self._note(step)
            try:
                self._study.tell(self._number, state=TrialState.PRUNED)
            except studies.storage_errors() as error:  # metrics.json says pruned; the sweep's re-run tells it
                log.warning("Could not tell the study that trial %d is pruned: %s", self._number, error)
        log.info("Pruned at global step %d: the pruner stops trial %d (value %.4f); the run saves and exits 0",
                 step, self._number, value)

    def _unreachable(self, error) -> None:
        """The study's database does not answer: the run trains on to its end, unpruned, rather than fail."""
        log.warning("The study of trial %d cannot be reached (%s); this run trains to its end without pruning, and "
                    "the sweep tells the study its result", self._number, " ".join(str(error).split())[:200])
        self._trial = None

    def _note(self, step) -> None:
        """metrics.json, holding the evaluation at `step`, records that the pruner stopped the run there."""
        path = self._model_dir / "metrics.json"
        try:
            values = json.loads(reading.read_text(path))
        except (OSError, ValueError):
            return
        if not self._chief or not isinstance(values, dict) or values.get("global_step") != step:
            return
        values.update(pruned=True)
        with replacing(path) as f:
            json.dump(values, f, indent=2, sort_keys=True)
