"""The Optuna study a sweep keeps in a database (hydra.sweeper.storage): opened and created once, safely, by the
sweeping process before any trial starts; read back whole for the sweep's summary; and found again by a job, from
the storage and its trial number, to report its evaluations to (experiments/pruning.py).

A storage is a SQLAlchemy URL: `sqlite:///<sweep>/optuna.db` by default (conf/hparams_search/optuna.yaml), or a
PostgreSQL server (`postgresql+psycopg2://...`) that sweep processes on several machines share. One that cannot be
opened is one line naming the URL, its password hidden, with advice that fits what went wrong, and the attempt
leaves no half-made database: a SQLite file (and sweep folder) this process made is removed.

Why tables and study are made here and not by Optuna's sweeper: two processes that open a fresh PostgreSQL study at
once both create its tables, and one dies of a unique violation (Optuna's remedy: create the study first; a second
attempt finds the tables made). Nothing here imports TensorFlow.
"""
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from tf_harness.data.integrity import reading

log = logging.getLogger(__name__)
SQLITE = "sqlite:///"
# Where the harness's sweeper (experiments/plugins/) keeps each trial's run directory, among the trial's user attrs.
RUN_DIR_ATTR = "run_dir"
# Tries at making a storage's tables: each process that loses a race to make them tries again (four processes
# starting at once on a fresh PostgreSQL database needed more than two).
ATTEMPTS = 5


class StorageError(Exception):
    """A study storage that cannot be opened: the one line that says so."""


def absolute(url: str) -> str:
    """`url`, a SQLite file's relative path made absolute (from the working directory), so that every process of
    the sweep, whatever its working directory later, opens the same file."""
    if url.startswith(SQLITE) and not url[len(SQLITE):].startswith("/") and url[len(SQLITE):] not in ("", ":memory:"):
        return SQLITE + str(Path(url[len(SQLITE):]).absolute())
    return url


def shown(url: str) -> str:
    """`url` as a message shows it: its password hidden."""
    try:
        from sqlalchemy.engine import make_url
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001  not a URL SQLAlchemy can parse: shown as given, it holds no parsed password
        return url


def open_storage(url: str):
    """The Optuna RDB storage at `url`, its tables made (another attempt where other processes were making them at
    the same moment: a unique violation). Raises StorageError with the one line; a SQLite file, or the folders
    above it, that this attempt made are removed first."""
    import optuna
    import sqlalchemy.exc

    url = absolute(url)
    made = _sqlite_parts_missing(url)
    try:
        if url.startswith(SQLITE):
            reading.check(url[len(SQLITE):])  # SQLite would wait on a named pipe for ever
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return optuna.storages.RDBStorage(url)
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
                if attempt == ATTEMPTS:
                    raise
                time.sleep(0.2 * attempt)
    except Exception as error:  # noqa: BLE001  SQLAlchemy's, the driver's and Optuna's errors all become the line
        _remove(made)
        raise StorageError(refusal(url, error)) from None


def refusal(url: str, error: BaseException) -> str:
    """The config error line for the storage `url` that `error` kept from opening."""
    cause = getattr(error, "orig", None) or error
    why = " ".join(str(cause).split())[:200]
    text = f"{type(cause).__name__}: {why}" if why else type(cause).__name__
    low = why.lower()
    if isinstance(cause, ImportError) or "can't load plugin" in low:
        advice = ("its database driver is not installed: `pip install 'tf-harness[postgres]'` for PostgreSQL "
                  "(psycopg2), or name a sqlite:/// storage")
    elif "could not translate host" in low or "connection refused" in low or "could not connect" in low \
            or "timeout expired" in low:
        advice = "no database server answers there: start it, or correct the host and port"
    elif "password authentication" in low or ("database" in low and "does not exist" in low) \
            or "role" in low and "does not exist" in low:
        advice = "the server refused the user or database named: create them, or correct the URL"
    elif "not a database" in low or "malformed" in low or "no such table" in low or "no such column" in low:
        advice = "the file there is not an Optuna study database: move it away, or name another storage"
    elif "unable to open database file" in low:
        advice = "its folder cannot be made or written: name a writable path"
    elif "could not parse" in low or "argument" in type(cause).__name__.lower():
        advice = "write it as dialect+driver://user:password@host:port/database, or sqlite:///path/to/file.db"
    else:
        advice = "name another storage"
    return f"hydra.sweeper.storage={shown(url)} cannot be opened as a study storage ({text}); {advice}"


def _sqlite_parts_missing(url: str) -> list:
    """The SQLite file of `url` and the folders above it that do not exist yet, deepest first ([] otherwise)."""
    if not url.startswith(SQLITE):
        return []
    path = Path(url[len(SQLITE):])
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _remove(paths) -> None:
    """Removes what this process made of a failed SQLite storage: the file, then each folder left empty."""
    for path in paths:
        try:
            path.rmdir() if path.is_dir() else path.unlink(missing_ok=True)
        except OSError:
            return  # a folder that now holds something of another process's stays


def prepare_folder(url: str) -> None:
    """Makes the folder of a SQLite storage (the sweep folder, by default), which SQLite does not make itself."""
    parts = _sqlite_parts_missing(absolute(url))
    if len(parts) > 1:
        parts[1].mkdir(parents=True, exist_ok=True)


def create(url: str, name: str, directions, sampler=None):
    """The study `name` in the storage at `url`, made once: created, or loaded where it exists (another process
    made it first). Raises StorageError for a storage that cannot be opened."""
    import optuna

    made = _sqlite_parts_missing(absolute(url))
    prepare_folder(url)
    try:
        storage = open_storage(url)
    except StorageError:
        _remove(made)
        raise
    try:
        return optuna.create_study(storage=storage, study_name=name, sampler=sampler, directions=list(directions),
                                   load_if_exists=True)
    except Exception as error:  # noqa: BLE001  a study of this name with other directions, a server gone away
        _remove(made)
        raise StorageError(refusal(url, error)) from None


@dataclass(frozen=True)
class JobTrial:
    """Where one job's trial is: its study's storage URL and name, and its trial number."""

    storage: str
    study_name: str
    number: int

    def open(self, pruner=None):
        """(the study, loaded with `pruner`, and the job's optuna.trial.Trial)."""
        import optuna

        study = optuna.load_study(study_name=self.study_name, storage=open_storage(self.storage), pruner=pruner)
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, self.number)
        return study, optuna.trial.Trial(study, trial_id)


def summary_line(study, direction: str) -> str:
    """`study <name>: N trials, C complete, P pruned, F failed[, R running]; best <value> in trial <n> (<params>):
    <run directory>` over every trial of `study`, whichever sweep process and re-run made it."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    counts = {state: sum(1 for t in trials if t.state == state) for state in TrialState}
    head = (f"study {study.study_name}: {len(trials)} trial{'' if len(trials) == 1 else 's'}, "
            f"{counts[TrialState.COMPLETE]} complete, {counts[TrialState.PRUNED]} pruned, "
            f"{counts[TrialState.FAIL]} failed")
    head += f", {counts[TrialState.RUNNING]} running" if counts[TrialState.RUNNING] else ""
    done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)]
    if not done:
        return f"{head}; no trial completed with a value"
    best = (max if direction == "maximize" else min)(done, key=lambda t: t.value)
    params = " ".join(f"{key}={value}" for key, value in best.params.items())
    where = best.user_attrs.get(RUN_DIR_ATTR, "?")
    return f"{head}; best {best.value:.4f} in trial {best.number} ({params}): {where}"


def job_trial(hydra_config):
    """The JobTrial of a job of the harness's sweeper with a stored study (its job number is its trial number), from
    the job's Hydra config; None for any other run."""
    from hydra.types import RunMode

    sweeper = hydra_config.sweeper
    storage = sweeper.get("storage") if "storage" in sweeper else None
    if hydra_config.mode != RunMode.MULTIRUN or not str(sweeper.get("_target_", "")).endswith(".StudySweeper") \
            or not isinstance(storage, str) or not storage:
        return None
    return JobTrial(absolute(storage), str(sweeper.get("study_name")), int(hydra_config.job.num))
