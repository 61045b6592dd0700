"""The damage matrix: every file and folder of a finished, exported, tested and predicted run directory, deleted,
emptied, garbled or (a file) replaced by a named pipe, then re-entered with the training command and with
`mode=evaluate`; each of its export's with `mode=export`, and each output of a test evaluation or of predict
(OUTPUTS) with the command that writes it again.

Each run ends one of two ways, and the outcomes make docs/run-directory.md's table "What each kind of damage does",
which the last test compares with what was observed here:

- exit 0, having resumed (or evaluated, or exported) from the newest intact checkpoint, and, where the damage
  touched something the run reads, a WARNING line in run.log saying what it found and what it did about it; an
  export it leaves is complete and loads;
- a non-zero exit with one line on stderr, the run directory left as it was: every file's bytes the same, but
  run.log (appended to) and `.hydra/reentry-*` (each re-entry's record).

Never a traceback or a hang (a run still going after CASE_SECONDS is stopped and counted one), never a checkpoint
file that was intact changed or gone, never `.hydra/config.yaml`, `hydra.yaml` or `overrides.yaml` rewritten.

The cases are found in the run directory itself, so a file the harness starts writing is damaged too. A file is
deleted, emptied, garbled and replaced by a named pipe (which stands for every special file: opened as a file, it
waits for a writer that never comes); a folder deleted and emptied. The files training and evaluation do not read back
(UNREAD) are damaged together, one case per damage, and so are the folders of the event files and the export; the
export's files and folders, which `mode=export` alone reads, are damaged one by one for it.

One finished run is trained once and copied for each run. A process that imports TensorFlow takes 5-15 s to start
on this project's 2-core machines, more than most runs take after it, so the runs are children forked from a server
process that has imported TensorFlow, Hydra and the project (every dataset's and model's module included) once,
and has run no TensorFlow op, so holds no thread pool; two servers, two runs at a time. Each child runs `python
run.py`'s own entry point (`tf_harness.run.command`) with the run's command line, its stdout and stderr in files,
and exits with its status, an unhandled exception printing its traceback as Python would; an export is checked
to serve in such a child too. The children run the code as it was when the servers started. `-s` prints the
runs' time and CPU seconds.
"""
import hashlib
import json
import os
import queue
import random
import re
import shutil
import signal
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
COMMANDS = {"train": (f"trainer.train_steps={MORE}",), "evaluate": ("mode=evaluate",), "export": ("mode=export",),
            "test": ("mode=evaluate", "split=test"), "predict": ("mode=predict",),
            "predict-validation": ("mode=predict", "split=validation")}
TRAINING_COMMANDS = ("train", "evaluate")  # what every case is re-entered with; an export's cases, with mode=export
# The outputs of a test evaluation and of predict: each is damaged on its own and re-entered with the command that
# writes it again (and, with the files no training reads back, with the training commands).
OUTPUTS = {"metrics_test.json": "test", "metrics_test.jsonl": "test", "predictions.csv": "predict",
           "predictions_validation.csv": "predict-validation"}
DAMAGES = ("delete", "empty", "garble", "pipe")
# A case that runs longer is stopped (SIGALRM) and counted a hang: a named pipe read without care waits for ever.
CASE_SECONDS = 300
# What a re-entry may change in a run directory it refuses: run.log (appended) and its own .hydra/reentry-*/.
MAY_CHANGE = re.compile(r"^(run\.log|\.hydra/reentry-[^/]+/.*)$")
# What no training or evaluating re-entry reads back: it appends to run.log, rewrites skipped.csv, writes event files
# of its own beside the old ones, replaces the session-end record, only locks .lock, keeps overrides.yaml as Hydra's
# record of the first command line, and leaves the export alone. These are damaged together, one case per damage, and
# so are the folders of the event files and the export.
EXPORT = re.compile(r"^export/")
UNREAD = re.compile(r"^(run\.log|skipped\.csv|\.lock|\.hydra/overrides\.yaml|(train|validation)/events\.out\.tfevents\..*"
                    r"|events\.out\.tfevents\..*\.session_end|export/.*|metrics_test\.jsonl?|predictions.*\.csv)$")
UNREAD_FOLDERS = ("train/", "validation/", "export/")
SAVED_HYDRA = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")
CHECKPOINT_FILE = re.compile(r"^checkpoints/ckpt-(\d+)\.(index|data-\d+-of-\d+)$")
PARALLEL = 2

SERVER = r"""
import atexit, json, os, signal, sys, traceback
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

def serves(folder):  # an export loaded by TensorFlow alone, its signature answering a request of one PNG pair
    model = tensorflow.saved_model.load(folder)
    png = tensorflow.io.encode_png(tensorflow.zeros([24, 24, 3], tensorflow.uint8))
    model.signatures["serving_default"](image_bytes_a=tensorflow.stack([png]), image_bytes_b=tensorflow.stack([png]))
    return 0

print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            signal.alarm(job["limit"])  # a hung run is ended by the OS: its default action needs no Python
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
            os.dup2(os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            sys.argv = ["run.py", *job.get("args", ())]
            try:
                status = serves(job["serves"]) if "serves" in job else run.command()
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
    """A process that has imported the project and TensorFlow, forking one child per command line (or export to
    serve)."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-c", SERVER], cwd=PROJECT, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        assert self.process.stdout.readline().strip() == "ready"

    def run(self, args, out_dir):
        """Runs `python run.py args...`; returns (exit status, stdout, stderr, CPU seconds)."""
        return self._job({"args": list(args)}, out_dir)

    def serves(self, folder, out_dir) -> str | None:
        """Why the export in `folder` does not serve, None when it does: TensorFlow loads it, in a child, and its
        signature answers a request of one PNG pair. The child's output goes to `out_dir`/serves/."""
        (out_dir / "serves").mkdir(exist_ok=True)
        status, _, stderr, _ = self._job({"serves": str(folder)}, out_dir / "serves")
        lines = stderr.strip().splitlines()
        return None if status == 0 else f"it does not serve ({lines[-1] if lines else status})"

    def _job(self, job, out_dir):
        job = {**job, "stdout": str(out_dir / "stdout"), "stderr": str(out_dir / "stderr"), "limit": CASE_SECONDS}
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        done = json.loads(self.process.stdout.readline())
        return (done["status"], (out_dir / "stdout").read_text(errors="replace"),
                (out_dir / "stderr").read_text(errors="replace"), done["cpu"])

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def hashes(run_dir) -> dict:
    """{relative path: sha256} of every file under `run_dir` (a folder: None, so an emptied one still counts; a named
    pipe: "named pipe", never opened)."""
    found = {}
    for path in sorted(Path(run_dir).rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        found[relative] = (hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else
                           "named pipe" if path.is_fifo() else None)
    return found


def label(target) -> str:
    """A file or folder of the run directory as the table names it: event files by their kind, a re-entry's record
    without its time."""
    target = re.sub(r"^\.hydra/reentry-[^/]+/", ".hydra/reentry-<time>/", target)
    name = target.rstrip("/").rpartition("/")[2]
    if not name.startswith("events.out.tfevents."):
        return target
    folder = target[:-len(name)]
    if folder:
        return f"{folder}events.out.tfevents.*"
    return "events.out.tfevents.* (session end)" if name.endswith(".session_end") else \
        "events.out.tfevents.* (HParams record)"


def cases_of(run_dir) -> list:
    """(targets, damage, commands) of every case: each file with each damage, each folder deleted and emptied
    (garbling is for a file's bytes), re-entered with the training commands; the files these do not read back, and
    their folders, damaged together, one case per damage; and the export's files and folders one by one, re-entered
    with mode=export. Of the files (and folders) the table names alike, the first in sorted order stands for all:
    the `.hydra/reentry-<time>/` record of the oldest re-entry, the export's, for those of the four."""
    files, folders, kinds = [], [], set()
    for path in sorted(Path(run_dir).rglob("*")):
        relative = path.relative_to(run_dir).as_posix() + ("/" if path.is_dir() else "")
        kind = label(relative)
        if kind not in kinds or UNREAD.match(relative):  # the first of a kind stands for the rest
            kinds.add(kind)
            (folders if path.is_dir() else files).append(relative)
    unread = tuple(path for path in files if UNREAD.match(path))
    cases = [((path,), how, TRAINING_COMMANDS) for path in files if path not in unread for how in DAMAGES]
    cases += [((path,), how, TRAINING_COMMANDS) for path in folders
              if path not in UNREAD_FOLDERS and not EXPORT.match(path) for how in DAMAGES[:2]]
    cases += [(unread, how, TRAINING_COMMANDS) for how in DAMAGES]
    cases += [(UNREAD_FOLDERS, how, TRAINING_COMMANDS) for how in DAMAGES[:2]]
    cases += [((path,), how, (OUTPUTS[path],)) for path in files if path in OUTPUTS for how in DAMAGES]
    cases += [((path,), how, ("export",)) for path in files if EXPORT.match(path) for how in DAMAGES]
    cases += [((path,), how, ("export",)) for path in folders if EXPORT.match(path) for how in DAMAGES[:2]]
    return cases


def damage(run_dir, target, how, seed) -> None:
    """Deletes, empties (a file to 0 bytes, a folder of all it holds), garbles (every byte of a file replaced by a
    random one) or replaces by a named pipe (a file) `target`."""
    path = run_dir / target.rstrip("/")
    if how == "pipe":
        path.unlink()
        os.mkfifo(path)
    elif how == "delete":
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
                           (r"\.hydra/config\.yaml (is|does|cannot)", "no readable saved config"),
                           (r"/(?P<name>[^/ ]+) is a named pipe, not a regular file", "{name} is a named pipe"),
                           (r"is there but is not a complete export", "not a complete export"),
                           (r"was exported from another checkpoint", "the export of another checkpoint"),
                           (r"a later version than global step", "a later export is there")):
        if re.search(pattern, line):
            ahead = re.search(r"ckpt-(\d+)", line)
            return words.format(n=ahead.group(1) if ahead else "?", **re.search(pattern, line).groupdict())
    return line[:80]


def run_case(server, base, work, targets, how, command):
    """Damages a copy of `base` and re-enters it with `command`; returns what happened and what went wrong."""
    name = re.sub(r"[^A-Za-z0-9.-]+", "_", "+".join(targets) if len(targets) < 3 else
                  "unread-folders" if tuple(targets) == UNREAD_FOLDERS else "unread")
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
    if status == -signal.SIGALRM:
        problems.append(f"it hung: stopped after {CASE_SECONDS} s")
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
        found = re.findall(r"(?:Resumed from|Restored|Exported) \S*/ckpt-(\d+)|global step (\d+) was exported before",
                           stdout)
        step = int(next(filter(None, found[-1]))) if found else None
        if step != newest:
            problems.append(f"restored {step}, not the newest intact checkpoint, {newest}")
        if command == "train":
            outcome = f"resumes from ckpt-{step}" if step is not None else "trains from step 0"
        elif command in ("evaluate", "test"):
            outcome = f"evaluates ckpt-{step}"
        elif command.startswith("predict"):
            outcome = f"predicts with ckpt-{step}"
        else:
            outcome = f"exports ckpt-{step}" if "Exported" in stdout else f"keeps export/{step}"
            unloadable = server.serves(run_dir / "export" / str(step), case)
            if unloadable:
                problems.append(f"export/{step} is left, and {unloadable}")
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
    """A finished run: trained to step 4 with checkpoints every 2 steps, evaluated, and exported; its test split
    evaluated, and each split predicted; each command in a child of one server, as the cases are."""
    run_dir = tmp_path_factory.mktemp("damage") / "base"
    server = Server()
    try:
        for name, args in [("train", (*TINY, f"trainer.train_steps={TRAINED_TO}", "trainer.checkpoint_every=2")),
                           *((command, COMMANDS[command]) for command in ("export", "test", "predict",
                                                                          "predict-validation"))]:
            out = run_dir.parent / name  # the command's stdout and stderr
            out.mkdir()
            status, _, stderr, _ = server.run([*args, f"hydra.run.dir={run_dir}"], out)
            assert status == 0, stderr[-3000:]
        assert (run_dir / "metrics.json").is_file() and (run_dir / "checkpoints" / f"ckpt-{TRAINED_TO}.index").is_file()
        assert server.serves(run_dir / "export" / str(TRAINED_TO), run_dir.parent) is None
    finally:
        server.close()
    assert {path for path in OUTPUTS if (run_dir / path).is_file()} == set(OUTPUTS)
    return run_dir


@pytest.fixture(scope="module")
def observed(base, tmp_path_factory):
    """Every case's outcome, two at a time; the time and table printed (pytest -s)."""
    work = tmp_path_factory.mktemp("cases")
    runs = [(targets, how, command) for targets, how, commands in cases_of(base) for command in commands]
    # The longest first (a training run on what it resumes from), so that the two servers finish together.
    runs.sort(key=lambda run: run[2] != "train")
    return observe(runs, lambda server, run: run_case(server, base, work, *run), work, table)


def table(results) -> str:
    """docs/run-directory.md's table: a row per file or folder, a column per damage, each cell what the training
    command and `mode=evaluate` did; † marks the files (and folders) that were damaged together."""
    rows = {}
    for result in results:
        for target in result["targets"]:
            name = f"`{label(target)}`" + (" †" if len(result["targets"]) > 1 else "")
            rows.setdefault(name, {}).setdefault(result["how"], {})[result["command"]] = result["outcome"]
    lines = ["| damaged | deleted | emptied | garbled | named pipe |", "|---|---|---|---|---|"]
    for name in sorted(rows, key=lambda name: (name.endswith("†"), name.strip("`").lower())):
        cells = rows[name]
        shown = ["<br>".join(f"{command}: {cells[how][command]}" for command in COMMANDS if command in cells[how])
                 if how in cells else "—" for how in DAMAGES]
        lines.append(f"| {name} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def test_every_damage_ends_in_a_resume_or_one_line_leaving_the_directory_as_it_was(observed):
    failures = [f"{'+'.join(r['targets'])} {r['how']}, {r['command']}: {'; '.join(r['problems'])} ({r['case']})"
                for r in observed if r["problems"]]
    assert not failures, "\n".join(failures)


def test_damage_to_what_a_run_reads_is_logged_where_it_goes_on(observed):
    """A resume or evaluation past damage to what it reads says so in run.log: the newest checkpoint's files, the
    state file, the saved Hydra settings, and for training the input pipeline record and metrics.json; an export
    kept past damage to its files, too."""
    read = {"train": re.compile(r"^(checkpoints/(checkpoint|ckpt-4\..*|input_pipelines\.json|)|\.hydra/hydra\.yaml)$"),
            "evaluate": re.compile(r"^(checkpoints/(checkpoint|ckpt-4\..*|)|\.hydra/hydra\.yaml)$"),
            "export": re.compile(r"^export/4/(saved_model\.pb|fingerprint\.pb|assets\.extra/.*|variables/.*)$")}
    silent = [f"{r['targets'][0]} {r['how']}, {r['command']}" for r in observed
              if r["status"] == 0 and len(r["targets"]) == 1 and r["command"] in read
              and read[r["command"]].match(r["targets"][0])
              and not r["warnings"]]
    assert not silent, "\n".join(silent)


def documented(doc, heading) -> str:
    """The table under `heading` in docs/`doc`, up to the next section."""
    section = (PROJECT / "docs" / doc).read_text().partition(f"## {heading}")[2].partition("\n## ")[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def test_the_docs_table_is_what_was_observed(observed):
    assert documented("run-directory.md", "What each kind of damage does") == table(observed), f"docs/run-directory.md's table is not what was observed:\n{table(observed)}"


# A sweep folder: what the sweep itself keeps beside its jobs' run directories (the rows above cover those), damaged
# the same ways, and the same sweep run again into it. It reports each job truthfully or exits with one line.
SWEEP = ("-m", *TINY, "trainer.train_steps=2", "seed=1,2")
SWEEP_OWN = re.compile(r"^(multirun\.yaml|\.sweep-lock|\d+/(job_outcome|metrics)\.json|\d+/)$")
SUMMARY = re.compile(r"^(\d+) jobs? ran, (\d+) failed; best (\S+) (\d\.\d{4}) (?:\[\d\.\d{4}, \d\.\d{4}\] \(95% bootstrap "
                     r"over [^)]+\)|\(no interval: [^)]+\)) in job (\d+)(?: \((.*)\))?: (.+)$")
JOB_CHECKPOINT_FILE = re.compile(r"^\d+/checkpoints/ckpt-\d+\.(index|data-\d+-of-\d+)$")


@pytest.fixture(scope="module")
def sweep_base(tmp_path_factory):
    """A finished sweep of two jobs."""
    folder = tmp_path_factory.mktemp("sweep") / "base"
    result = run_cli(*SWEEP, f"hydra.sweep.dir={folder}", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert SUMMARY.match(result.stderr.strip().splitlines()[-1]), result.stderr[-3000:]
    return folder


def sweep_cases_of(folder) -> list:
    """(targets, damage) of each of the sweep's own files (each damage) and its job folders (deleted, emptied)."""
    cases = []
    for path in sorted(Path(folder).rglob("*")):
        relative = path.relative_to(folder).as_posix() + ("/" if path.is_dir() else "")
        if SWEEP_OWN.match(relative):
            cases += [((relative,), how) for how in (DAMAGES[:2] if path.is_dir() else DAMAGES)]
    return cases


def truthful(folder, line) -> str | None:
    """What the summary line `line` gets wrong about the jobs' metrics.json after the sweep; None when nothing."""
    match = SUMMARY.match(line)
    if match is None:
        return f"no summary line (last: {line[:200]!r})"
    metric, value, best = match.group(3), float(match.group(4)), int(match.group(5))
    values = {}
    for job in sorted(path for path in Path(folder).iterdir() if path.name.isdigit()):
        if (job / "metrics.json").is_fifo():  # never opened: it would wait
            return f"job {job.name}'s metrics.json is left a named pipe"
        try:
            values[int(job.name)] = json.loads((job / "metrics.json").read_text())[metric]
        except (OSError, ValueError, KeyError) as error:
            return f"job {job.name}'s metrics.json does not read back ({type(error).__name__})"
    if round(values.get(best, float("nan")), 4) != value or max(values.values()) != values[best]:
        return f"it names job {best} with {value:.4f}; the jobs' metrics.json hold {values}"
    return None


def run_sweep_case(server, base, work, targets, how):
    """Damages a copy of the sweep `base` and runs the sweep into it again; returns what happened."""
    case = work / re.sub(r"[^A-Za-z0-9.-]+", "_", f"{'+'.join(targets)}-{how}")
    folder = case / "sweep"
    shutil.copytree(base, folder, symlinks=True)
    intact = hashes(folder)
    for target in targets:
        damage(folder, target, how, seed=f"{target}:{how}")
    touched = touched_by(intact, targets)
    status, _, stderr, cpu = server.run([*SWEEP, f"hydra.sweep.dir={folder}"], case)
    after = hashes(folder)
    lines = stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    problems = [f"it hung: stopped after {CASE_SECONDS} s"] if status == -signal.SIGALRM else []
    problems += ["a traceback on stderr"] if "Traceback" in stderr else []
    problems += [f"{path} {'is gone' if path not in after else 'changed'}" for path, digest in intact.items()
                 if JOB_CHECKPOINT_FILE.match(path) and path not in touched and after.get(path) != digest]
    if status == 0:
        untrue = truthful(folder, last)
        problems += [f"the summary is untrue: {untrue}"] if untrue else []
        retrained = sorted(path.partition("/")[0] for path in touched if JOB_CHECKPOINT_FILE.match(path))
        outcome = "reports each job" + (f", job {retrained[0]} trained again" if retrained else "")
    else:  # one line before any job ran, or a job's own line in the report of the jobs that failed
        failed = re.search(r"^  job (\d+) \(.*\) in \S+: ((?:config )?error: .*)$", stderr, re.M)
        if re.match(r"^(config )?error: ", last):
            outcome = f"exit {status}: {short_reason(last)}"
        elif failed:
            outcome = f"exit {status}: job {failed[1]} fails, {short_reason(failed[2])}"
        else:
            problems.append(f"exit {status} without an error line (last: {last[:200]!r})")
            outcome = f"exit {status}: {short_reason(last)}"
    return {"targets": list(targets), "how": how, "status": status, "outcome": outcome, "problems": problems,
            "cpu": round(cpu, 1), "case": str(case), "last_line": last}


@pytest.fixture(scope="module")
def sweep_observed(sweep_base, tmp_path_factory):
    """Every sweep case's outcome, two at a time; the table printed (pytest -s)."""
    work = tmp_path_factory.mktemp("sweep-cases")
    return observe(sweep_cases_of(sweep_base), lambda server, case: run_sweep_case(server, sweep_base, work, *case),
                   work, sweep_table)


def observe(cases, run_one, work, make_table) -> list:
    """Runs `run_one(server, case)` for every case, two at a time on forked servers; prints the time and table."""
    servers = queue.Queue()
    for _ in range(PARALLEL):
        servers.put(Server())
    started = time.monotonic()

    def one(case):
        server = servers.get()
        try:
            return run_one(server, case)
        finally:
            servers.put(server)

    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            results = list(pool.map(one, cases))
    finally:
        while not servers.empty():
            servers.get().close()
    print(f"\n{len(cases)} runs in {time.monotonic() - started:.0f} s ({sum(r['cpu'] for r in results):.0f} CPU s)")
    print(make_table(results))
    (work / "observed.json").write_text(json.dumps(results, indent=1))
    return results


def single_table(results, name=lambda target: target, damages=DAMAGES) -> str:
    """A table of one command's cases: a row per damaged file or folder as `name` calls it, a column per damage."""
    rows = {}
    for result in results:
        rows.setdefault(f"`{name(result['targets'][0])}`", {})[result["how"]] = result["outcome"]
    headings = {"delete": "deleted", "empty": "emptied", "garble": "garbled", "pipe": "named pipe"}
    lines = ["| damaged | " + " | ".join(headings[how] for how in damages) + " |", "|---" * (len(damages) + 1) + "|"]
    for row in sorted(rows):
        lines.append(f"| {row} | " + " | ".join(rows[row].get(how, "—") for how in damages) + " |")
    return "\n".join(lines)


def sweep_table(results) -> str:
    """docs/sweeps-and-review.md's table: a row per file or folder of the sweep, a column per damage."""
    return single_table(results)


def test_every_damage_to_a_sweep_folder_ends_in_a_true_report_or_one_line(sweep_observed):
    failures = [f"{'+'.join(r['targets'])} {r['how']}: {'; '.join(r['problems'])} ({r['case']})"
                for r in sweep_observed if r["problems"]]
    assert not failures, "\n".join(failures)


def test_the_sweep_docs_table_is_what_was_observed(sweep_observed):
    assert documented("sweeps-and-review.md", "What each kind of damage to a sweep folder does") == sweep_table(sweep_observed), \
        f"docs/sweeps-and-review.md's table is not what was observed:\n{sweep_table(sweep_observed)}"


# The XLA cache: each file and folder of the compiled programs a `trainer.jit_compile=true` run left in the cache home,
# damaged the same ways, and the same run started again in a new run directory. Fresh processes: TensorFlow reads
# where the cache is as it starts. It trains to the same numbers, names a damaged entry once in run.log, and leaves
# the cache whole.
XLA_RUN = (*TINY, "trainer.train_steps=2", "trainer.jit_compile=true")


@pytest.fixture(scope="module")
def xla_base(tmp_path_factory):
    """A cache home holding the samples and the compiled programs of one jit run, and that run's directory."""
    home = tmp_path_factory.mktemp("xla") / "base"
    result = run_cli(*XLA_RUN, f"hydra.run.dir={home / 'run'}", env={"HARNESS_CACHE": str(home / "cache")},
                     timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((home / "cache").glob("xla/tf-*/*/*.pb")), "the run left no compiled program"
    return home


def xla_cases_of(home) -> list:
    """(target, damage): each file of the cache's xla/ folder with each damage, each folder deleted and emptied."""
    cases = []
    for path in [home / "cache" / "xla", *sorted((home / "cache").glob("xla/**/*"))]:
        relative = path.relative_to(home / "cache").as_posix() + ("/" if path.is_dir() else "")
        cases += [(relative, how) for how in (DAMAGES[:2] if path.is_dir() else DAMAGES)]
    return cases


def whole_entries(cache) -> str | None:
    """What is wrong with the cache's entries: one without a record that matches its bytes; None when all match."""
    for entry in cache.glob("xla/tf-*/*/*.pb"):
        for path in (entry, entry.with_name(entry.name + ".sha256")):
            if path.exists() and not (path.is_file() or path.is_dir()):
                return f"{path.name} is a special file, left in the cache"  # never opened: it would wait
        try:
            record = json.loads(entry.with_name(entry.name + ".sha256").read_text())
        except (OSError, ValueError) as error:
            return f"{entry.name} has no readable record ({type(error).__name__})"
        if record != {"bytes": entry.stat().st_size, "sha256": hashlib.sha256(entry.read_bytes()).hexdigest()}:
            return f"{entry.name} does not match its record"
    return None


def run_xla_case(home, work, target, how):
    case = work / re.sub(r"[^A-Za-z0-9.-]+", "_", f"{target or 'intact'}-{how}")
    cache = case / "cache"
    cache.mkdir(parents=True)
    for part in (home / "cache").iterdir():  # the samples shared, the compiled programs a copy of their own
        (shutil.copytree(part, cache / part.name) if part.name == "xla" else (cache / part.name).symlink_to(part))
    if target is not None:
        damage(cache, target, how, seed=f"{target}:{how}")
    try:
        result = run_cli(*XLA_RUN, f"hydra.run.dir={case / 'run'}", env={"HARNESS_CACHE": str(cache)},
                         timeout=CASE_SECONDS)
    except subprocess.TimeoutExpired:
        return {"targets": [target], "how": how, "status": None, "outcome": "hangs", "warnings": [],
                "problems": [f"it hung: stopped after {CASE_SECONDS} s"], "case": str(case)}
    log = (case / "run" / "run.log").read_text(errors="replace") if (case / "run" / "run.log").is_file() else ""
    warnings = [line.partition("[WARNING] - ")[2] for line in log.splitlines() if "[WARNING] - " in line]
    problems = ["a traceback on stderr"] if "Traceback" in result.stderr else []
    if result.returncode != 0:
        problems.append(f"exit {result.returncode}: {(result.stderr.strip().splitlines() or [''])[-1][:200]}")
    else:
        metrics = [json.loads((folder / "metrics.json").read_text()) for folder in (home / "run", case / "run")]
        if metrics[0] != metrics[1]:
            problems.append(f"metrics.json differs from the first run's: {metrics[1]} and {metrics[0]}")
    problems += [f"the cache is left damaged: {wrong}"] if (wrong := whole_entries(cache)) else []
    found = re.search(r"XLA programs are cached in \S+ \((\d+) there already\)", log)
    outcome = f"exit {result.returncode}" if result.returncode else (
        "loads the program" if found and found.group(1) != "0" else "compiles it again")
    return {"targets": [target], "how": how, "status": result.returncode, "outcome":
            outcome + (" (logged)" if warnings else ""), "warnings": warnings, "problems": problems, "case": str(case)}


@pytest.fixture(scope="module")
def xla_observed(xla_base, tmp_path_factory):
    """Every case's outcome, and first the cache as the first run left it (its `targets` [None])."""
    work = tmp_path_factory.mktemp("xla-cases")
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda case: run_xla_case(xla_base, work, *case),
                                [(None, "intact"), *xla_cases_of(xla_base)]))
    print(xla_table(results[1:]))
    return results


def xla_table(results) -> str:
    """docs/run-directory.md's table of the XLA cache: a row per file or folder, named by its kind."""
    def kind(target):
        target = re.sub(r"^xla/tf-[^/]+/", "xla/tf-<version>/", target)
        target = re.sub(r"^xla/tf-<version>/[0-9a-f]+/", "xla/tf-<version>/<machine>/", target)
        return re.sub(r"/[^/]+\.pb", "/<entry>.pb", target)
    return single_table(results, kind)


def test_every_damage_to_the_xla_cache_trains_the_same_and_leaves_it_whole(xla_observed):
    assert xla_observed[0]["outcome"] == "loads the program", xla_observed[0]  # the cache serves a run untouched
    failures = [f"{r['targets'][0]} {r['how']}: {'; '.join(r['problems'])} ({r['case']})"
                for r in xla_observed if r["problems"]]
    assert not failures, "\n".join(failures)


def test_damage_to_a_cached_program_is_logged(xla_observed):
    silent = [f"{r['targets'][0]} {r['how']}" for r in xla_observed[1:]
              if r["targets"][0].endswith((".pb", ".sha256")) and r["how"] != "delete" and not r["warnings"]]
    assert not silent, "\n".join(silent)


def test_the_xla_docs_table_is_what_was_observed(xla_observed):
    assert documented("run-directory.md", "What each kind of damage to the XLA cache does") == xla_table(xla_observed[1:]), \
        f"docs/run-directory.md's XLA table is not what was observed:\n{xla_table(xla_observed[1:])}"
