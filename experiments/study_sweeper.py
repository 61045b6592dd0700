"""The implementation of the harness's Optuna sweeper (experiments/plugins/hydra_plugins/tf_harness_sweeper.py, the
plugin Hydra finds): Hydra's Optuna sweeper's search space, sampler and results file, with the study created once
in its storage, each job numbered by its trial, and a trial its job pruned left PRUNED. Imported only when a sweep
with it starts: Optuna's import takes seconds, and Hydra scans every plugin on every run.
"""
import os
from itertools import groupby

from hydra.errors import HydraException
from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl, create_params_from_overrides
from omegaconf import OmegaConf


class StudySweeperImpl(OptunaSweeperImpl):
    """Hydra's OptunaSweeperImpl with its sweep loop replaced (the module's docstring)."""

    def sweep(self, arguments):
        import optuna

        from tf_harness.experiments import study as studies

        self._process_searchspace_config()
        params = self._parse_sweeper_params_config() + list(arguments)
        space, fixed = create_params_from_overrides(params)
        for name in fixed:
            space.pop(name, None)
        directions = self._get_directions()
        if getattr(self.sampler, "func", None) is optuna.samplers.GridSampler:
            raise HydraException("hparams_search=optuna: the GridSampler is not supported by the harness's sweeper; "
                                 "use -m with listed values (Hydra's basic sweeper) for a grid")
        pruner = OmegaConf.select(self.config, "sweep.pruner", default=None)
        if pruner and not self.storage:
            raise HydraException(f"sweep.pruner={pruner} needs a stored study: set hydra.sweeper.storage (the "
                                 "default of hparams_search=optuna), not null")
        sweep_dir = os.path.abspath(str(self.config.hydra.sweep.dir))
        stored = None  # the storage read past the study's cache: what a job told its trial
        if self.storage:
            try:
                study = studies.create(str(self.storage), self.study_name, directions, self.sampler)
                stored = studies.open_storage(str(self.storage))
            except studies.StorageError as error:
                raise HydraException(str(error)) from None
        else:
            study = optuna.create_study(study_name=self.study_name, sampler=self.sampler, directions=directions)
        if study.trials and hasattr(study.sampler, "reseed_rng"):
            study.sampler.reseed_rng()  # a seeded sampler would draw again the points it drew for the first run
        to_go = self.n_trials
        while to_go > 0:
            trials = [study.ask() for _ in range(min(to_go, self.n_jobs))]
            overrides = self._configure_trials(trials, space, fixed)
            for trial in trials:
                trial.set_user_attr(studies.RUN_DIR_ATTR, os.path.join(sweep_dir, str(trial.number)))
            returns = []
            # One launch per run of consecutive trial numbers: the launcher numbers a launch's jobs from its first.
            pairs = list(zip(trials, overrides))
            for _, run in groupby(enumerate(pairs), key=lambda item: item[1][0].number - item[0]):
                run = [pair for _, pair in run]
                returns += self.launcher.launch([o for _, o in run], initial_job_idx=run[0][0].number)
            for trial, ret in zip(trials, returns):
                _tell(study, stored, trial, ret, len(directions))
            to_go -= len(trials)
        self._save_results(study, directions)

    def _save_results(self, study, directions):
        """optimization_results.yaml in the sweep folder, as Hydra's sweeper writes it, over the whole study."""
        if len(directions) < 2:
            try:
                best = study.best_trial
            except ValueError:  # no trial completed (all pruned or failed)
                return
            results = {"name": "optuna", "best_params": best.params, "best_value": best.value}
        else:
            results = {"name": "optuna", "solutions": [{"params": t.params, "values": t.values}
                                                       for t in study.best_trials]}
        OmegaConf.save(OmegaConf.create(results), f"{self.config.hydra.sweep.dir}/optimization_results.yaml")


def _tell(study, stored, trial, ret, objectives) -> None:
    """Tells `study` how the job `ret` of `trial` ended: its value, or FAIL for a failed job; a trial its job
    already ended (pruned) in the storage `stored` is left as the job told it."""
    from optuna.trial import TrialState

    if stored is not None and stored.get_trial(trial._trial_id).state.is_finished():
        return
    try:
        value = ret.return_value  # raises what the job raised, as Hydra's sweeper lets it
        values = [float(value)] if objectives == 1 else [float(v) for v in value]
    except Exception:
        study.tell(trial, state=TrialState.FAIL)
        raise
    if getattr(value, "status", 0):  # a failed job (experiments/cli.py's Outcome): no value of its parameters
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, values=values)
