"""A sweep folder (hydra.sweep.dir) is written only by the sweep that owns it.

- One sweep at a time: a sweep holds `<sweep>/.sweep-lock` (data/integrity/locks.py, an flock the OS drops when
  the holder exits, however it exits) from its start to its end. A second sweep started into the folder meanwhile
  is refused as a whole, before any job runs.
- The folder's sweep: `multirun.yaml`, which the sweeper writes as the sweep starts, records its command line
  overrides and its sweeper: which one, and for the harness's Optuna sweeper the study's name and storage as
  written. A later sweep into the folder must be the same sweep: the same sweeper and study, and overrides that
  differ only in run-control keys (experiments/run_dir/reentry.py), such as a larger trainer.train_steps; any other
  difference is refused as a whole, so no job of it re-enters, and rewrites the records of, a job that sweep ran. A
  folder whose multirun.yaml is gone or unreadable owns no command line, and each job's own re-entry check stands.

A refusal is one `config error` line (exit 2), naming the folder and what tells the sweeps apart; a lock or record
that cannot be opened as a file (a folder or named pipe in its place) is one `error` line (exit 1). Nothing here
imports TensorFlow.
"""
import json
import os
import socket
import sys
import time
from pathlib import Path

import yaml

from tf_harness.data.integrity import locks, reading
from tf_harness.experiments.run_dir import os_errors
from tf_harness.experiments.run_dir.reentry import RUN_CONTROL

LOCK_NAME = ".sweep-lock"
RECORD = "multirun.yaml"


class Refused(Exception):
    """A sweep that may not write into its folder: the one line that says why."""


class SweepFolder:
    """The sweep folder this process's sweep holds."""

    def __init__(self, path: Path, lock, made: bool):
        self.path, self._lock, self._made = path, lock, made

    @classmethod
    def claim(cls, path: Path, overrides, sweeper=None) -> "SweepFolder":
        """Takes `path` for a sweep run with the command line `overrides`; raises SystemExit after one line on
        stderr (a callback's other exceptions Hydra only warns of): 2 when another sweep holds it or made it, 1 when
        the folder or its lock cannot be made or opened, or a folder, named pipe, socket or device stands in place
        of its lock or its multirun.yaml."""
        try:
            return cls.take(path, overrides, sweeper)
        except Refused as error:
            print(f"config error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        except OSError as error:  # before Hydra opens multirun.yaml to write it, and waits or fails
            line = os_errors.describe(error) or f"{error}; the sweep keeps its own file there: move it away"
            print(f"error: {line}", file=sys.stderr)
            raise SystemExit(1) from None

    @classmethod
    def take(cls, path: Path, overrides, sweeper=None) -> "SweepFolder":
        """`claim`, raising Refused. `sweeper`: the sweep's `sweeper_of` its config (None: not compared)."""
        made = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        lock = locks.take(path / LOCK_NAME)
        if lock is None:
            holder = _holder(path / LOCK_NAME)
            raise Refused(f"hydra.sweep.dir={path} is in use by the sweep of pid {holder.get('pid', '?')} on host "
                          f"{holder.get('host', '?')} (lock file {path / LOCK_NAME}); wait for it to finish, or "
                          f"name another hydra.sweep.dir")
        try:
            recorded, recorded_sweeper = _recorded(path / RECORD)
            other = differences(recorded, overrides)
            if not other and None not in (sweeper, recorded_sweeper) and sweeper != recorded_sweeper:
                other = f"its sweeper {_shown(recorded_sweeper)}, this one's {_shown(sweeper)}"
            if other:
                raise Refused(f"hydra.sweep.dir={path} holds another sweep ({other}): a sweep folder is written "
                              f"only by the sweep that made it; run that sweep's command again (it may change only "
                              f"run-control keys), or name another hydra.sweep.dir")
            os.ftruncate(lock.fd, 0)
            os.write(lock.fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                          "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode() + b"\n")
        except BaseException:
            lock.release()
            raise
        return cls(path, lock, made)

    def release(self, ran: bool = True) -> None:
        """Lets go of the folder. A sweep that made it and ran no job (a config error stopped it) removes it, when
        it holds nothing but the lock file."""
        self._lock.release()
        if not ran and self._made:
            try:
                if [entry.name for entry in self.path.iterdir()] == [LOCK_NAME]:
                    (self.path / LOCK_NAME).unlink()
                    self.path.rmdir()
            except OSError:
                pass  # something else is there now: it stays


def differences(recorded, overrides) -> str:
    """How the command line `overrides` differ from the `recorded` ones outside run-control keys:
    `key=<recorded> there, <new> here`, '' when they do not (or nothing is recorded)."""
    if recorded is None:
        return ""
    before, now = _by_key(recorded), _by_key(overrides)
    keys = sorted(key for key in before.keys() | now.keys()
                  if before.get(key) != now.get(key) and key not in RUN_CONTROL)
    return "; ".join(f"{key}={before.get(key, '(unset)')} there, {now.get(key, '(unset)')} here" for key in keys)


def _by_key(overrides) -> dict:
    """{key: value} of Hydra override strings (`+key=value`, `key=a,b`)."""
    pairs = (override.lstrip("+~").split("=", 1) for override in overrides)
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


def sweeper_of(hydra_sweeper) -> dict:
    """What tells one sweep's sweeper from another's, from a config's `hydra.sweeper` as a plain dict, unresolved:
    its class, and the study's name and storage as written."""
    target = str(hydra_sweeper.get("_target_", ""))
    return {"sweeper": target.rsplit(".", 1)[-1], "study_name": hydra_sweeper.get("study_name"),
            "storage": hydra_sweeper.get("storage")}


def _shown(sweeper: dict) -> str:
    from tf_harness.experiments.sweeps.study import shown
    words = [sweeper["sweeper"]] + [f"{key}={value if key != 'storage' else shown(str(value))}"
                                    for key, value in sweeper.items() if key != "sweeper" and value is not None]
    return " ".join(words)


def _recorded(path: Path) -> tuple:
    """(the task overrides, the sweeper_of) recorded in the sweep's multirun.yaml, each None where it is missing or
    unreadable; SpecialFileError or IsADirectoryError where a named pipe, socket, device or folder stands there."""
    try:
        record = yaml.safe_load(reading.read_text(path))
        overrides = record["hydra"]["overrides"]["task"]
    except (reading.SpecialFileError, IsADirectoryError):
        raise  # Hydra could not write the record there either
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError):
        return None, None
    sweeper = record["hydra"].get("sweeper")
    sweeper = sweeper_of(sweeper) if isinstance(sweeper, dict) else None
    if not (isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
        return None, sweeper
    return overrides, sweeper


def _holder(path: Path) -> dict:
    try:
        record = json.loads(reading.read_text(path) or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
