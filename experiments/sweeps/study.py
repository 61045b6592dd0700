"""The Optuna study a sweep keeps in a database (hydra.sweeper.storage): opened and created once, safely, by the
sweeping process before any trial starts; read back whole for the sweep's summary; and found again by a job, from
the storage and its trial number, to report its evaluations to (experiments/sweeps/pruning.py).

A storage is a SQLAlchemy URL: `sqlite:///<sweep>/optuna.db` by default (conf/hparams_search/optuna.yaml), or a
PostgreSQL server (`postgresql+psycopg2://...`) that sweep processes on several machines share. One that cannot be
opened, or a study that does not fit the sweep (other directions, another search space), is one line naming the
URL, its password hidden, with advice that fits what went wrong, and the attempt leaves no half-made database: a
SQLite file (and sweep folder) this process made is removed, unless another process made a study in it meanwhile.

Why tables and study are made here, with retries: two processes that open a fresh database at once both create its
tables, and one dies of a unique violation, a table made meanwhile, or SQLite's lock; a second attempt finds them
made. Nothing here imports TensorFlow.
"""
import contextlib
import logging
import math
import os
import re
import time
import warnings
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
# A SQLite file this young and empty is another process's, making its tables.
YOUNG_S = 5
# The study's user attr that records its search space.
SPACE_ATTR = "search_space"


class StorageError(Exception):
    """A study storage that cannot be opened, or a study that does not fit the sweep: the one line that says so."""


class StudyUnreachable(Exception):
    """A study that could not be told how a job ended: the one line that says so (exit 1)."""


def absolute(url: str) -> str:
    """`url`, a SQLite file's relative path made absolute (from the working directory), so that every process of
    the sweep, whatever its working directory later, opens the same file."""
    if url.startswith(SQLITE) and not url[len(SQLITE):].startswith("/") and url[len(SQLITE):] not in ("", ":memory:"):
        return SQLITE + str(Path(url[len(SQLITE):]).absolute())
    return url


def shown(text: str) -> str:
    """`text`, a URL or a message that names some, as a message shows it: each URL's password hidden, everything
    between its user's `:` and its host's `@`, whether or not the URL parses (a password with an unencoded `@`
    included)."""
    return re.sub(r"(://[^:/@\s'\"]*:)\S*@", r"\1***@", text)


@contextlib.contextmanager
def quiet():
    """Without Optuna's warnings that heartbeats are "experimental" and meant for Study.optimize: the harness's
    sweeper asks and tells its trials, and records their heartbeats itself (experiments/sweeps/study_sweeper.py)."""
    import optuna
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def storage_errors() -> tuple:
    """The exceptions a storage raises where its database fails: SQLAlchemy's and Optuna's storage errors."""
    import optuna
    import sqlalchemy.exc
    return sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError


def open_storage(url: str, heartbeat=None):
    """The Optuna RDB storage at `url`, its tables made (another attempt where other processes were making them at
    the same moment: a unique violation, or SQLite's database is locked). `heartbeat`: create's. Raises
    StorageError with the one line; a SQLite file, or the folders above it, that this attempt made are removed
    first."""
    import optuna

    url = absolute(url)
    made = _sqlite_parts_missing(url)
    try:
        if url.startswith(SQLITE):
            _check_database_file(Path(url[len(SQLITE):]))
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with quiet():
                    options = {}
                    if heartbeat:
                        interval, grace, retries = heartbeat
                        options = dict(heartbeat_interval=interval, grace_period=grace,
                                       heartbeat_stale_trial_callback=retry_callback(retries))
                    return optuna.storages.RDBStorage(url, **options)
            except storage_errors() as error:
                if attempt == ATTEMPTS or not _racing(error):
                    raise
                time.sleep(0.2 * attempt)
    except Exception as error:  # noqa: BLE001  SQLAlchemy's, the driver's and Optuna's errors all become the line
        _remove(made)
        raise StorageError(refusal(url, error)) from None


def retry_callback(retries: int):
    """Optuna's callback that asks a failed trial again with its parameters, at most `retries` times."""
    import optuna
    with quiet():
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=retries)


def _racing(error) -> bool:
    """Whether `error` is another process writing the same tables or study this instant: a unique violation, a
    table made meanwhile, or SQLite's lock (each of which Optuna may report as its StorageInternalError)."""
    import sqlalchemy.exc
    causes = [error, error.__cause__, error.__context__]
    if any(isinstance(cause, (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError)) for cause in causes):
        return True
    return any(word in str(cause).lower() for cause in causes if cause is not None
               for word in ("locked", "already exists"))


def _check_database_file(path: Path) -> None:
    """Raises StorageError where a SQLite storage's file is there but cannot be a study database: a folder or a
    special file in its place (SQLite would wait on a named pipe for ever), or an empty file (a damaged database:
    SQLite would make a new study over it, leaving the sweep's earlier trial folders without theirs)."""
    if not os.path.lexists(path):
        return
    if path.is_dir():
        raise StorageError(f"hydra.sweeper.storage={SQLITE}{path} is a folder, not a database file: move it away, "
                           "or name another storage")
    reading.check(path)
    for _ in range(ATTEMPTS):  # a file another process made this instant is empty until it makes the tables
        if path.stat().st_size or time.time() - path.stat().st_mtime > YOUNG_S:
            break
        time.sleep(YOUNG_S / ATTEMPTS)
    if path.stat().st_size == 0:
        raise StorageError(f"hydra.sweeper.storage={SQLITE}{path} is an empty file, not a study database: it is "
                           "damaged; move it away (the study it held is lost), or name another storage")


def refusal(url: str, error: BaseException) -> str:
    """The config error line for the storage `url` that `error` kept from opening."""
    cause = getattr(error, "orig", None) or error
    why = shown(" ".join(str(cause).split()))[:200]
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
    """Removes what this process made of a failed SQLite storage: the file, unless another process has made a study
    in it meanwhile, then each folder left empty."""
    if paths and _holds_a_study(paths[0]):
        return
    for path in paths:
        try:
            path.rmdir() if path.is_dir() else path.unlink(missing_ok=True)
        except OSError:
            return  # a folder that now holds something of another process's stays


def _holds_a_study(path: Path) -> bool:
    """Whether the SQLite file at `path` holds a study (another process's, made while this one failed)."""
    import sqlite3
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as database:
            return database.execute("SELECT count(*) FROM studies").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def prepare_folder(url: str) -> None:
    """Makes the folder of a SQLite storage (the sweep folder, by default), which SQLite does not make itself."""
    parts = _sqlite_parts_missing(absolute(url))
    if len(parts) > 1:
        parts[1].mkdir(parents=True, exist_ok=True)


def create(url: str, name: str, directions, space=None, heartbeat=None):
    """(the study `name` in the storage at `url`, True where this call made it): created, or loaded where it
    exists (a re-run, or another process made it first). `space`, {key: Optuna distribution}, is recorded with a
    study made here and must match a found one's record, as its directions must. `heartbeat`: (interval_s, grace_s,
    max_retry) for trials the sweeper keeps alive (experiments/sweeps/study_sweeper.py). Raises StorageError for a
    storage that cannot be opened or a study that does not fit."""
    import optuna

    made = _sqlite_parts_missing(absolute(url))
    prepare_folder(url)
    try:
        storage = open_storage(url, heartbeat)
    except StorageError:
        _remove(made)
        raise
    for attempt in range(1, ATTEMPTS + 1):
        try:
            try:
                study = optuna.create_study(storage=storage, study_name=name, directions=list(directions))
                study.set_user_attr(SPACE_ATTR, _recorded(space or {}))
                return study, True
            except optuna.exceptions.DuplicatedStudyError:
                study = optuna.load_study(storage=storage, study_name=name)
                break
        except Exception as error:  # noqa: BLE001  a server gone away, a garbled database
            if attempt < ATTEMPTS and _racing(error):
                time.sleep(0.2 * attempt)
                continue
            _remove(made)
            raise StorageError(refusal(url, error)) from None
    _check_fits(study, url, list(directions), _recorded(space or {}))
    return study, False


def _recorded(space) -> dict:
    """{key: the distribution as Optuna writes it}: the search space as a study records it, readable in the
    dashboard."""
    return {key: repr(distribution) for key, distribution in sorted(space.items())}


def _check_fits(study, url, directions, space) -> None:
    """Raises StorageError where the found `study` was made with other directions or another search space."""
    stored = [d.name.lower() for d in study.directions]
    advice = "name a new hydra.sweeper.study_name for a study of this one's, or run the stored study's own"
    if stored != directions:
        raise StorageError(f"study {study.study_name} in {shown(url)} was made to {' '.join(stored)}, not "
                           f"{' '.join(directions)}: {advice}")
    recorded = study.user_attrs.get(SPACE_ATTR)
    if isinstance(recorded, dict) and recorded != space:
        keys = sorted(key for key in recorded.keys() | space.keys() if recorded.get(key) != space.get(key))
        named = "; ".join(f"{key}: {_shown_distribution(recorded.get(key))} there, "
                          f"{_shown_distribution(space.get(key))} here" for key in keys)
        raise StorageError(f"study {study.study_name} in {shown(url)} searches another space ({named}): {advice}")


def _shown_distribution(recorded) -> str:
    return "(unset)" if recorded is None else str(recorded)


def refuse_written_password(raw) -> None:
    """Raises StorageError where the storage URL as written in the config (`raw`, before interpolation) holds its
    password: Hydra writes the config into every job's .hydra/ and the sweep's multirun.yaml."""
    if not isinstance(raw, str) or raw.startswith(SQLITE):
        return
    try:
        from sqlalchemy.engine import make_url
        password = make_url(raw).password
    except Exception:  # noqa: BLE001  not parsable: open_storage says so
        return
    if password and "${" not in str(password):
        raise StorageError(f"hydra.sweeper.storage={shown(raw)} writes its password into every job's .hydra/ "
                           "folder and the sweep's multirun.yaml: take it from the environment "
                           "(user:${oc.env:STUDY_PASSWORD}@host), or leave it out for libpq's PGPASSWORD or "
                           "~/.pgpass")


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


def job_trial(trial):
    """The JobTrial of a job of the harness's sweeper with a stored study (its job number is its trial number), from
    settings.Job's `trial`, (storage, study name, trial number); None for any other run."""
    if trial is None:
        return None
    storage, study_name, number = trial
    return JobTrial(absolute(storage), study_name, number)
