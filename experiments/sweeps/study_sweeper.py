"""The sweep of the harness's Optuna sweeper (experiments/plugins/hydra_plugins/tf_harness_sweeper.py), on Optuna
itself: it asks a study for trials, runs each as a job through Hydra's launcher, and tells the study how each ended.

- The search space is Hydra's override syntax (`choice`, `range`, `interval`, `tag(log, ...)`), one Optuna
  distribution per key; a plain value is passed to every trial as it is.
- The sweep folder's owner record is `multirun.yaml`, as a basic sweep's: the command line and the sweeper's
  settings (the study's name and storage among them), which experiments/sweeps/sweep_folder.py compares a later sweep
  into the folder with before any job runs.
- The study is made once (experiments/sweeps/study.py). Where this process made it, the sampler draws from the
configured
  seed; where it found it (a re-run, another process sharing it), the sampler is reseeded, so no two processes draw
  the same points.
- Each job's number is its trial's number, so a job runs in `<sweep>/<trial number>` (the trial's user attr
  `run_dir`), and the job finds its trial to report to (experiments/sweeps/pruning.py).
- A trial that was interrupted is retried, not left RUNNING: at the start of a sweep, a RUNNING trial whose folder
  is in this sweep folder (which this process holds alone, so no process runs it) or whose heartbeat stopped
  (another machine's sweep died) is failed and asked again with its parameters. A retry of this sweep folder's
  trial runs in the trial's own folder, resuming from its last checkpoint; one of another sweep folder's starts
  afresh in this one. One whose job had written its outcome while the study could not be told is told that
  outcome instead.
- A study that cannot be told how a job ended (its server gone) ends the sweep in one line: the job's folder keeps
  the result, and the same command again tells the study.
"""
import logging
import math
import os
import threading
from itertools import groupby
from pathlib import Path

from hydra.errors import HydraException
from omegaconf import OmegaConf

from tf_harness.data.integrity import writing
from tf_harness.experiments.sweeps import study as studies

log = logging.getLogger(__name__)
# A trial's sweeper records a heartbeat this often; one silent for GRACE_S belonged to a process that died.
HEARTBEAT_S = 20
GRACE_S = 120
# How often one trial is retried after being interrupted, before it stays failed.
MAX_RETRY = 3


def sweep(config, launcher, settings: dict, arguments: list) -> None:
    """Runs the sweep of `settings` (StudySweeper's) with the command line's sweep `arguments`."""
    import optuna


    space, fixed = search_space(_params(settings["params"]) + arguments)
    directions = _directions(settings["direction"])
    storage, name = settings["storage"], settings["study_name"]
    pruner = OmegaConf.select(config, "sweep.pruner", default=None)
    if pruner and not storage:
        raise HydraException(f"sweep.pruner={pruner} needs a stored study: set hydra.sweeper.storage (the "
                             "default of hparams_search=optuna), not null")
    sweep_dir = Path(os.path.abspath(str(config.hydra.sweep.dir)))
    sampler = _sampler(settings["sampler"])
    try:
        if storage:
            studies.refuse_written_password(OmegaConf.to_container(config.hydra.sweeper, resolve=False)["storage"])
            study, made = studies.create(str(storage), name, directions, space,
                                         heartbeat=(HEARTBEAT_S, GRACE_S, MAX_RETRY))
        else:
            study, made = optuna.create_study(study_name=name, directions=directions), True
    except studies.StorageError as error:
        raise HydraException(str(error)) from None
    _record_owner(config, sweep_dir)
    if not made:
        sampler.reseed_rng()
    study.sampler = sampler
    retried = _recover(study, sweep_dir, directions) if storage else 0
    if retried:
        log.info("%d interrupted trial(s) of study %s are asked again with their parameters", retried, name)

    to_go = settings["n_trials"]
    while to_go > 0:
        with studies.quiet():
            trials = [study.ask() for _ in range(min(to_go, settings["n_jobs"]))]
        jobs = [_job(trial, space, fixed, sweep_dir) for trial in trials]
        returns = []
        with _Heartbeat(study, trials):
            # One launch per run of consecutive trial numbers: the launcher numbers a launch's jobs from its first.
            for _, run in groupby(enumerate(zip(trials, jobs)), key=lambda item: item[1][0].number - item[0]):
                run = [pair for _, pair in run]
                returns += launcher.launch([overrides for _, overrides in run], initial_job_idx=run[0][0].number)
        for trial, ret in zip(trials, returns):
            _tell(study, trial, ret, len(directions))
        to_go -= len(trials)
    _save_results(study, directions, sweep_dir)


# The search space -------------------------------------------------------------------------------------------------

def _params(params) -> list:
    """hydra.sweeper.params as override strings."""
    return [f"{key}={value}" for key, value in (params or {}).items()]


def search_space(overrides: list) -> tuple:
    """({key: Optuna distribution}, {key: fixed value as written}) of Hydra override strings; a key given twice
    takes its last."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    space, fixed = {}, {}
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element()
        space.pop(key, None), fixed.pop(key, None)
        if override.is_sweep_override():
            space[key] = _distribution(override)
        else:
            fixed[key] = override.get_value_element_as_str()
    return space, fixed


def _distribution(override):
    """The Optuna distribution of one sweep override."""
    from hydra.core.override_parser.types import Transformer
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value, key = override.value(), override.get_key_element()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    if override.is_range_sweep():
        if any(isinstance(bound, float) for bound in (value.start, value.stop, value.step)):
            return FloatDistribution(value.start, value.stop, step=value.step)
        return IntDistribution(int(value.start), int(value.stop), step=int(value.step))
    if override.is_interval_sweep():
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(value.start, value.end, log=log_scale)
    raise HydraException(f"hydra.sweeper.params: {key}={override.get_value_element_as_str()} is not a search space "
                         "the sweeper knows: use choice(...), range(...), interval(...) or tag(log, interval(...))")


def _directions(direction) -> list:
    names = list(direction) if OmegaConf.is_list(direction) or isinstance(direction, (list, tuple)) else [direction]
    names = [getattr(d, "name", d) for d in names]
    for d in names:
        if d not in ("maximize", "minimize"):
            raise HydraException(f"hydra.sweeper.direction={d}: not one of maximize, minimize")
    return names


def _sampler(conf):
    """The sampler of its config. The sweep reseeds it unless this process made the study (the module's
    docstring)."""
    from hydra.utils import instantiate

    if str(conf.get("_target_", "")).endswith("GridSampler"):
        raise HydraException("hydra/sweeper/sampler: the GridSampler is not supported by the harness's sweeper; "
                             "use -m with listed values (Hydra's basic sweeper) for a grid")
    return instantiate(conf)


# The folder and the trials ----------------------------------------------------------------------------------------

def _record_owner(config, sweep_dir: Path) -> None:
    """multirun.yaml, the sweep's command line and settings, as Hydra's basic sweeper writes it."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with writing.replacing(sweep_dir / "multirun.yaml") as file:
        file.write(OmegaConf.to_yaml(config))


def _job(trial, space: dict, fixed: dict, sweep_dir: Path) -> list:
    """The overrides of `trial`'s job: its parameters, the fixed values, and, for a retried trial of this sweep
    folder, its first folder, whose checkpoint it resumes from. A retried trial of another sweep folder (another
    process's, which died) starts afresh in this one: that folder is its own sweep's to write."""

    for key, distribution in space.items():
        trial._suggest(key, distribution)
    overrides = [f"{key}={value}" for key, value in {**trial.params, **fixed}.items()]
    first = Path(trial.user_attrs.get(studies.RUN_DIR_ATTR, "/"))
    if first.parent == sweep_dir:
        overrides.append(f"hydra.sweep.subdir={first.name}")
    else:
        trial.set_user_attr(studies.RUN_DIR_ATTR, str(sweep_dir / str(trial.number)))
    return overrides


def _recover(study, sweep_dir: Path, directions) -> int:
    """Fails and retries the trials of `study` that were interrupted (the module's docstring); returns how many
    were retried."""
    import optuna
    from optuna.trial import TrialState

    from tf_harness.experiments.sweeps.sweep_report import OUTCOME, read_outcome

    with studies.quiet():
        optuna.storages.fail_stale_trials(study)  # heartbeats stopped: the callback retries them
    retry = studies.retry_callback(MAX_RETRY)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        run_dir = Path(trial.user_attrs.get(studies.RUN_DIR_ATTR, "/"))
        if run_dir.parent != sweep_dir:
            continue  # another sweep folder's: its process may be alive
        outcome = read_outcome(run_dir / OUTCOME) if (run_dir / OUTCOME).exists() else None
        if outcome and outcome["status"] == 0 and _finite(outcome["value"]) and len(directions) == 1:
            study.tell(trial.number, values=[float(outcome["value"])])
            log.info("Trial %d of study %s had ended with %s; the study is told so now", trial.number,
                     study.study_name, outcome["value"])
            continue
        study.tell(trial.number, state=TrialState.FAIL)
        retry(study, study._storage.get_trial(trial._trial_id))
    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Heartbeat:
    """Records a heartbeat of each trial while its job runs, where the study's storage keeps them."""

    def __init__(self, study, trials):
        self._storage, self._ids = study._storage, [trial._trial_id for trial in trials]
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if getattr(self._storage, "get_heartbeat_interval", lambda: None)():
            self._beat()
            self._thread = threading.Thread(target=self._run, name="study-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self):
        while not self._stop.wait(HEARTBEAT_S):
            self._beat()

    def _beat(self):
        for trial_id in self._ids:
            try:
                self._storage.record_heartbeat(trial_id)
            except Exception as error:  # noqa: BLE001  a server gone away: the tell that follows says so
                log.debug("heartbeat of trial %d not recorded: %s", trial_id, error)


def _tell(study, trial, ret, objectives: int) -> None:
    """Tells `study` how `trial`'s job (`ret`) ended: its value, or FAIL for a failed job; a trial its job ended
    already (pruned) keeps the state the job gave. A study that cannot be told raises studies.StudyUnreachable."""
    from optuna.trial import TrialState


    try:
        if study._storage.get_trial(trial._trial_id).state.is_finished():
            return
        try:
            value = ret.return_value  # raises what the job raised
        except Exception:
            study.tell(trial, state=TrialState.FAIL)
            raise
        values = [float(value)] if objectives == 1 else [float(v) for v in value]
        if getattr(value, "status", 0):  # a failed job (experiments/cli.py's Outcome): no value of its parameters
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, values=values)
    except studies.storage_errors() as error:
        raise studies.StudyUnreachable(
            f"study {study.study_name} could not be told how trial {trial.number} ended "
            f"({type(error).__name__}: {' '.join(str(error).split())[:160]}); its job's folder "
            f"{trial.user_attrs.get(studies.RUN_DIR_ATTR, '?')} keeps the result: run the same command again once "
            "the study's database answers, and it is told") from None


def _save_results(study, directions, sweep_dir: Path) -> None:
    """optimization_results.yaml in the sweep folder over the whole study: the best trial's parameters and value,
    or the Pareto front of a study of several objectives."""
    if len(directions) < 2:
        try:
            best = study.best_trial
        except ValueError:  # no trial completed (all pruned or failed)
            return
        results = {"name": "optuna", "best_params": best.params, "best_value": best.value}
    else:
        results = {"name": "optuna", "solutions": [{"params": t.params, "values": t.values}
                                                   for t in study.best_trials]}
    with writing.replacing(sweep_dir / "optimization_results.yaml") as file:
        file.write(OmegaConf.to_yaml(OmegaConf.create(results)))
