"""The harness's Optuna sweeper (`hparams_search=optuna`): Hydra's Optuna sweeper, with the study kept in a database
and each job keyed by its trial.

Hydra finds sweepers only in the `hydra_plugins` namespace; experiments/cli.py's setup puts this folder's parent on
the path. The implementation, experiments/study_sweeper.py, is imported once a sweep starts (Optuna's import takes
seconds, and Hydra scans every plugin on every run). What it adds to Hydra's sweeper (whose search space, sampler
and results file it reuses):
- the study is created once, safely, before any trial starts, and a storage that cannot be opened is one
  `config error` line (experiments/study.py);
- each job's number is its trial's number, so a job runs in `<sweep>/<trial number>/` and a re-run of a stored
  study, whose new trials go on from the last number, never re-enters an earlier trial's run directory; the
  trial's user attr `run_dir` names that folder for the summary;
- a job that failed is a FAIL trial, not one of the worst value; a trial that its job already ended (the pruner
  stopped it: experiments/pruning.py) keeps the state the job gave.
"""
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper


class StudySweeper(OptunaSweeper):
    """hydra.sweeper._target_ of conf/hparams_search/optuna.yaml; takes the same settings as Hydra's."""

    def __init__(self, sampler, direction, storage, study_name, n_trials, n_jobs, search_space, custom_search_space,
                 params):  # noqa: D107  OptunaSweeper's, whose implementation this one extends
        from tf_harness.experiments.study_sweeper import StudySweeperImpl  # Optuna: only once a sweep starts
        self.sweeper = StudySweeperImpl(sampler, direction, storage, study_name, n_trials, n_jobs, search_space,
                                        custom_search_space, params)
