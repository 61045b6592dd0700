"""The damage matrix: every file and folder of a finished run directory, deleted, emptied or garbled, then re-entered
with the training command and with `mode=evaluate`.

Each run ends one of two ways, and the outcomes make docs/run-directory.md's table "What each kind of damage does",
which the last test compares with what was observed here:

- exit 0, having resumed (or evaluated) from the newest intact checkpoint, and, where the damage touched something
  the run reads, a WARNING line in run.log saying what it found and what it did about it;
- a non-zero exit with one line on stderr, the run directory left as it was: every file's bytes the same, but
  run.log (appended to) and `.hydra/reentry-*` (each re-entry's record).

Never a traceback, never a checkpoint file that was intact changed or gone, never `.hydra/config.yaml`,
`hydra.yaml` or `overrides.yaml` rewritten.

The cases are found in the run directory itself, so a file the harness starts writing is damaged too. A file is
deleted, emptied and garbled; a folder deleted and emptied. The files no run reads back (UNREAD) are damaged
together, one case per damage, and so are the folders of the event files: 42 cases, 84 runs.

One finished run is trained once and copied for each run. A process that imports TensorFlow takes 5-15 s to start
on this project's 2-core machines, more than most runs take after it, so the runs are children forked from a server
process that has imported TensorFlow, Hydra and the project (every dataset's and model's module included) once,
and has run no TensorFlow op, so holds no thread pool; two servers, two runs at a time. Each child runs `python
run.py`'s own entry point (`tf_harness.run.command`) with the run's command line, its stdout and stderr in files,
and exits with its status, an unhandled exception printing its traceback as Python would. The children run the
code as it was when the servers started. About 400 CPU seconds in all (printed with `-s`), 6-15 minutes on two
busy cores.
"""
import hashlib
import json
import os
import queue
import random
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import PROJECT, run_cli

pytestmark = pytest.mark.slow

# The tiniest training run that leaves every kind of file: checkpoints every 2 steps to step 4, evaluated.
TINY = ("dataset=lfw_pairs", "experiment=smoke", "pipeline.image_size=24", "pipeline.batch_size=8",
        "model.widths=[8,16]", "model.embedding_size=16", "model.head_units=8", "trainer.eval_steps=1")
TRAINED_TO, MORE = 4, 6
COMMANDS = {"train": (f"trainer.train_steps={MORE}",), "evaluate": ("mode=evaluate",)}
DAMAGES = ("delete", "empty", "garble")
# What a re-entry may change in a run directory it refuses: run.log (appended) and its own .hydra/reentry-*/.
MAY_CHANGE = re.compile(r"^(run\.log|\.hydra/reentry-[^/]+/.*)$")
# What no re-entry reads back: it appends to run.log, rewrites skipped.csv, writes event files of its own beside the
# old ones, replaces the session-end record, only locks .lock, and keeps overrides.yaml as Hydra's record of the first
# command line. These are damaged together, one case per damage, and so are the folders of the event files.
UNREAD = re.compile(r"^(run\.log|skipped\.csv|\.lock|\.hydra/overrides\.yaml|(train|validation)/events\.out\.tfevents\..*"
                    r"|events\.out\.tfevents\..*\.session_end)$")
UNREAD_FOLDERS = ("train/", "validation/")
SAVED_HYDRA = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")
CHECKPOINT_FILE = re.compile(r"^checkpoints/ckpt-(\d+)\.(index|data-\d+-of-\d+)$")
PARALLEL = 2

SERVER = r"""
import atexit, json, os, sys, traceback
sys.argv = ["run.py"]
from tf_harness.experiments import cli
cli.setup()  # first, as run.py does: the environment TensorFlow reads at import
import tensorflow, keras  # noqa: F401  imported, not started: no op has run, no thread pool exists
from tf_harness.experiments import runner  # noqa: F401
from tf_harness import run
from tf_harness.data import TASKS
from tf_harness.models import BUILDERS
for registry in (TASKS, BUILDERS):  # every dataset's and model's module too: each child runs this snapshot of the code
    for name in registry:
        registry[name]
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
            os.dup2(os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            sys.argv = ["run.py", *job["args"]]
            try:
                status = run.command()
            except SystemExit as stop:
                status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            except BaseException:  # what Python does with an exception nothing handled
                traceback.print_exc()
                status = 1
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    _, wait, usage = os.wait4(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(wait), "cpu": usage.ru_utime + usage.ru_stime}), flush=True)
"""


class Server:
    """A process that has imported the project and TensorFlow, forking one child per command line."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-c", SERVER], cwd=PROJECT, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        assert self.process.stdout.readline().strip() == "ready"

    def run(self, args, out_dir):
        """Runs `python run.py args...`; returns (exit status, stdout, stderr, CPU seconds)."""
        job = {"args": list(args), "stdout": str(out_dir / "stdout"), "stderr": str(out_dir / "stderr")}
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        done = json.loads(self.process.stdout.readline())
        return (done["status"], (out_dir / "stdout").read_text(errors="replace"),
                (out_dir / "stderr").read_text(errors="replace"), done["cpu"])

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def hashes(run_dir) -> dict:
    """{relative path: sha256} of every file under `run_dir` (a folder: None, so an emptied one still counts)."""
    found = {}
    for path in sorted(Path(run_dir).rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        found[relative] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return found


def label(target) -> str:
    """A file or folder of the run directory as the table names it: event files by their kind."""
    name = target.rstrip("/").rpartition("/")[2]
    if not name.startswith("events.out.tfevents."):
        return target
    folder = target[:-len(name)]
    if folder:
        return f"{folder}events.out.tfevents.*"
    return "events.out.tfevents.* (session end)" if name.endswith(".session_end") else \
        "events.out.tfevents.* (HParams record)"


def cases_of(run_dir) -> list:
    """(targets, damage) of every case: each file with each damage, each folder deleted and emptied (garbling is
    for a file's bytes); the files no run reads back, and their folders, damaged together, one case per damage."""
    files, folders = [], []
    for path in sorted(Path(run_dir).rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        (folders if path.is_dir() else files).append(relative + "/" if path.is_dir() else relative)
    unread = tuple(path for path in files if UNREAD.match(path))
    cases = [((path,), how) for path in files if path not in unread for how in DAMAGES]
    cases += [((path,), how) for path in folders if path not in UNREAD_FOLDERS for how in DAMAGES[:2]]
    cases += [(unread, how) for how in DAMAGES]
    cases += [(UNREAD_FOLDERS, how) for how in DAMAGES[:2]]
    return cases


def damage(run_dir, target, how, seed) -> None:
    """Deletes, empties (a file to 0 bytes, a folder of all it holds) or garbles (every byte of a file replaced by a
    random one) `target`."""
    path = run_dir / target.rstrip("/")
    if how == "delete":
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    elif how == "empty":
        if path.is_dir():
            for child in list(path.iterdir()):
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        else:
            path.write_bytes(b"")
    else:
        rng = random.Random(seed)
        path.write_bytes(bytes(rng.getrandbits(8) for _ in range(path.stat().st_size)))


def touched_by(intact, targets) -> set:
    """The files of the intact run directory that damaging `targets` touched."""
    return {path for path, digest in intact.items() if digest is not None and any(
        path.startswith(target) if target.endswith("/") else path == target for target in targets)}


def checkpoint_steps(paths) -> set:
    return {int(CHECKPOINT_FILE.match(path).group(1)) for path in paths if CHECKPOINT_FILE.match(path)}


def short_reason(line) -> str:
    """A few words for the table about a refusal's one line."""
    for pattern, words in ((r"whose index is missing, ahead of global step", "would overwrite ckpt-{n}'s data file"),
                           (r"is ahead of global step", "would overwrite ckpt-{n}"),
                           (r"no checkpoint in .* can be restored", "no checkpoint can be restored"),
                           (r"needs a checkpoint", "no checkpoint"),
                           (r"\.hydra/config\.yaml (is|does)", "no readable saved config")):
        if re.search(pattern, line):
            ahead = re.search(r"ckpt-(\d+)", line)
            return words.format(n=ahead.group(1) if ahead else "?")
    return line[:80]


def run_case(server, base, work, targets, how, command):
    """Damages a copy of `base` and re-enters it with `command`; returns what happened and what went wrong."""
    name = re.sub(r"[^A-Za-z0-9.-]+", "_", "+".join(targets) if len(targets) < 3 else "unread")
    case = work / f"{name}-{how}-{command}"
    run_dir = case / "run"
    shutil.copytree(base, run_dir, symlinks=True)
    intact = hashes(run_dir)
    for target in targets:
        damage(run_dir, target, how, seed=f"{target}:{how}")
    touched = touched_by(intact, targets)
    before = hashes(run_dir)
    log_before = (run_dir / "run.log").read_bytes() if (run_dir / "run.log").is_file() else b""
    started = time.monotonic()
    status, stdout, stderr, cpu = server.run([f"hydra.run.dir={run_dir}", *COMMANDS[command]], case)
    seconds = time.monotonic() - started
    after = hashes(run_dir)
    log_after = (run_dir / "run.log").read_bytes() if (run_dir / "run.log").is_file() else b""
    appended = (log_after[len(log_before):] if log_after.startswith(log_before) else log_after).decode(
        errors="replace")
    warnings = [line.partition("[WARNING] - ")[2] for line in appended.splitlines() if "[WARNING] - " in line]
    problems = []
    if "Traceback" in stderr:
        problems.append("a traceback on stderr")
    # Checkpoint files that were intact before: byte for byte the same after (the run may add newer ones).
    for path, digest in intact.items():
        if CHECKPOINT_FILE.match(path) and path not in touched and after.get(path) != digest:
            problems.append(f"{path} {'is gone' if path not in after else 'changed'}")
    for path in SAVED_HYDRA:
        if after.get(path) != before.get(path):
            problems.append(f"{path} rewritten")
    intact_steps = checkpoint_steps(intact) - checkpoint_steps(touched)
    newest = max(intact_steps) if intact_steps else None
    if status == 0:
        found = re.findall(r"(?:Resumed from|Restored) \S*/ckpt-(\d+)", stdout)
        step = int(found[-1]) if found else None
        if step != newest:
            problems.append(f"restored {step}, not the newest intact checkpoint, {newest}")
        if command == "train":
            outcome = f"resumes from ckpt-{step}" if step is not None else "trains from step 0"
        else:
            outcome = f"evaluates ckpt-{step}"
        if warnings:
            outcome += " (logged)"
    else:
        lines = stderr.strip().splitlines()
        last = lines[-1] if lines else ""
        if not re.match(r"^(config )?error: ", last):
            problems.append(f"exit {status} without an error line (last: {last[:200]!r})")
        changed = sorted(path for path in set(before) | set(after)
                         if not MAY_CHANGE.match(path) and before.get(path) != after.get(path))
        if changed:
            problems.append(f"exit {status} but changed {', '.join(changed)}")
        outcome = f"exit {status}: {short_reason(last)}"
    return {"targets": list(targets), "how": how, "command": command, "status": status, "outcome": outcome,
            "warnings": warnings, "problems": problems, "seconds": round(seconds, 1), "cpu": round(cpu, 1),
            "case": str(case), "last_line": (stderr.strip().splitlines() or [""])[-1]}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished run: trained to step 4 with checkpoints every 2 steps, evaluated."""
    run_dir = tmp_path_factory.mktemp("damage") / "base"
    result = run_cli(*TINY, f"trainer.train_steps={TRAINED_TO}", "trainer.checkpoint_every=2",
                     f"hydra.run.dir={run_dir}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "metrics.json").is_file() and (run_dir / "checkpoints" / f"ckpt-{TRAINED_TO}.index").is_file()
    return run_dir


@pytest.fixture(scope="module")
def observed(base, tmp_path_factory):
    """Every case's outcome, two at a time; the time and table printed (pytest -s)."""
    work = tmp_path_factory.mktemp("cases")
    runs = [(targets, how, command) for targets, how in cases_of(base) for command in COMMANDS]
    # The longest first (a training run on what it resumes from), so that the two servers finish together.
    runs.sort(key=lambda run: run[2] != "train")
    servers = queue.Queue()
    for _ in range(PARALLEL):
        servers.put(Server())
    started = time.monotonic()

    def one(run):
        server = servers.get()
        try:
            return run_case(server, base, work, *run)
        finally:
            servers.put(server)

    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            results = list(pool.map(one, runs))
    finally:
        while not servers.empty():
            servers.get().close()
    print(f"\n{len(cases_of(base))} cases, {len(runs)} runs in {time.monotonic() - started:.0f} s "
          f"({sum(r['cpu'] for r in results):.0f} CPU s)")
    print(table(results))
    (work / "observed.json").write_text(json.dumps(results, indent=1))
    return results


def table(results) -> str:
    """docs/run-directory.md's table: a row per file or folder, a column per damage, each cell what the training
    command and `mode=evaluate` did; † marks the files (and folders) that were damaged together."""
    rows = {}
    for result in results:
        for target in result["targets"]:
            name = f"`{label(target)}`" + (" †" if len(result["targets"]) > 1 else "")
            rows.setdefault(name, {}).setdefault(result["how"], {})[result["command"]] = result["outcome"]
    lines = ["| damaged | deleted | emptied | garbled |", "|---|---|---|---|"]
    for name in sorted(rows, key=lambda name: (name.endswith("†"), name.strip("`").lower())):
        cells = rows[name]
        shown = ["<br>".join(f"{command}: {cells[how][command]}" for command in COMMANDS) if how in cells else "—"
                 for how in DAMAGES]
        lines.append(f"| {name} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def test_every_damage_ends_in_a_resume_or_one_line_leaving_the_directory_as_it_was(observed):
    failures = [f"{'+'.join(r['targets'])} {r['how']}, {r['command']}: {'; '.join(r['problems'])} ({r['case']})"
                for r in observed if r["problems"]]
    assert not failures, "\n".join(failures)


def test_damage_to_what_a_run_reads_is_logged_where_it_goes_on(observed):
    """A resume or evaluation past damage to what it reads says so in run.log: the newest checkpoint's files, the
    state file, the saved Hydra settings, and for training the input pipeline record and metrics.json."""
    read = {"train": re.compile(r"^(checkpoints/(checkpoint|ckpt-4\..*|input_pipelines\.json|)|\.hydra/hydra\.yaml)$"),
            "evaluate": re.compile(r"^(checkpoints/(checkpoint|ckpt-4\..*|)|\.hydra/hydra\.yaml)$")}
    silent = [f"{r['targets'][0]} {r['how']}, {r['command']}" for r in observed
              if r["status"] == 0 and len(r["targets"]) == 1 and read[r["command"]].match(r["targets"][0])
              and not r["warnings"]]
    assert not silent, "\n".join(silent)


def test_the_docs_table_is_what_was_observed(observed):
    docs = (PROJECT / "docs" / "run-directory.md").read_text()
    section = docs.partition("## What each kind of damage does")[2]
    documented = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert documented == table(observed), f"docs/run-directory.md's table is not what was observed:\n{table(observed)}"
