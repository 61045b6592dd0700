"""The harness's Optuna sweeper (`hparams_search=optuna`, config group hydra/sweeper: study), on Hydra's public
`Sweeper` interface.

Hydra finds sweepers only in the `hydra_plugins` namespace; experiments/cli.py's setup puts this folder's parent on
the path. Hydra scans every plugin on every run, so this module imports Hydra alone; the sweep itself,
experiments/sweeps/study_sweeper.py, imports Optuna once a sweep starts.
"""
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper


class StudySweeper(Sweeper):
    """hydra.sweeper._target_ of conf/hydra/sweeper/study.yaml; its keys are this constructor's arguments.
    `sampler` arrives as its config (the study's seed decides how it is made) and `params` as the search space's
    override strings by key."""

    def __init__(self, sampler, direction, storage, study_name, n_trials, n_jobs, params):  # noqa: D107
        self.settings = dict(sampler=sampler, direction=direction, storage=storage, study_name=study_name,
                             n_trials=n_trials, n_jobs=n_jobs, params=params)
        self.config = self.launcher = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments):
        from tf_harness.experiments.sweeps.study_sweeper import sweep  # Optuna: only once a sweep starts
        return sweep(self.config, self.launcher, self.settings, list(arguments))
