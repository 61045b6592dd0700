"""Start-up at the real datasets' size: trees as large as NIH ChestX-ray14 and ILSVRC DET, made of hard links.

    python -m benchmarks real_size [FOLDER] [--nih 112120] [--det 450000] [--only nih|det] [--phases-only]

Builds, in FOLDER (default /tmp/tf-harness-real-size), a NIH tree of 112,120
``Data_Entry_2017.csv`` rows and PNGs in Kaggle's ``images_001/images/`` ...
folders, and an ILSVRC tree of 450,000 DET images with their XML annotations,
every file a hard link to a file of the embedded samples (so the trees take
almost no disk). Then it runs ``python run.py`` on each, with a small model so
that start-up is what is measured, and prints each run's ``Time to the first
step`` with its laps, how many image files it checked, its peak RSS, and the
load average before and after:

- first: a cold cache (no index, no verification records);
- second: the same again, everything cached;
- changed (NIH): one PNG replaced by a truncated copy, which must be the only file checked;
- added (NIH): one PNG and its CSV row added, likewise.

Then, in a process of their own, the index and verification alone (wall and CPU
seconds) of a cold and a warm start; ``--phases-only`` measures just these (on the trees
built now, or kept from an earlier run at the same size).

This process never imports TensorFlow: every start measured is a process of its own.
"""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import measure, record

NAME = "real_size"
PROJECT = Path(__file__).resolve().parents[1]
WNIDS = [line.split()[0] for line in (PROJECT / "data" / "imagenet_det_synsets.txt").read_text().splitlines() if line]
# Generates an embedded sample the trees link to, where absent, in a process of its own (importing the data
# package would start TensorFlow here).
MAKE_SAMPLE = """
import sys
from tf_harness.data import TASKS
from tf_harness.data.samples import sample_root
sample_root(sys.argv[1], TASKS[sys.argv[1]].make_sample)
"""

NIH_FOLDERS = 12  # images_001 ... images_012, as Kaggle ships them
# Small settings for the model part, so that the input's start-up is what is measured.
RUN = ("model=semi_alexnet", "pipeline.image_size=32", "pipeline.batch_size=8", "mode=train", "trainer.train_steps=1",
       "trainer.log_every=1", "trainer.checkpoint_every=1")
# (tree, run): (what, at most seconds); the targets on a 2-core machine.
TARGETS = {("nih", "first"): ("first_step", 60.0), ("nih", "second"): ("first_step", 10.0),
           ("det", "second"): ("index", 3.0)}
FIRST_STEP = re.compile(r"Time to the first step: ([\d.]+) s \((.*)\)")
VERIFIED = re.compile(r"Verified (\d+) image files: (\d+) checked now")


def link(source, target):
    try:
        os.link(source, target)
    except FileExistsError:
        pass


def sample_folder(dataset) -> Path:
    """The dataset's embedded sample, where tf_harness.data.samples.cache_home finds it; generated if absent."""
    cache = Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "tf-harness"))
    folder = cache / "samples" / f"{dataset}-v2"
    if not folder.is_dir():
        subprocess.run([sys.executable, "-c", MAKE_SAMPLE, dataset], cwd=PROJECT, check=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    return folder


def build_nih(root: Path, entries: int) -> None:
    """A NIH tree of `entries` rows: each PNG links to a sample PNG, each row copies that sample's row."""
    done = root / ".complete"  # removed when a run changes or adds a file
    if done.exists() and int(done.read_text()) == entries:
        return
    sample = sample_folder("chest_xray")
    with open(sample / "Data_Entry_2017.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    shutil.rmtree(root, ignore_errors=True)  # a previous run changed and added files
    folders = [root / f"images_{k + 1:03d}" / "images" for k in range(NIH_FOLDERS)]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    table, test = [], []
    for i in range(entries):
        patient, follow_up = i // 4 + 1, i % 4  # NIH has about 3.6 images per patient
        row = rows[i % len(rows)]
        name = f"{patient:08d}_{follow_up:03d}.png"
        link(sample / "images" / row[0], folders[i * NIH_FOLDERS // entries] / name)
        table.append([name, row[1], str(follow_up), str(patient), *row[4:]])
        if patient % 5 == 0:
            test.append(name)
    with open(root / "Data_Entry_2017.csv", "w", newline="") as f:
        csv.writer(f).writerows([header, *table])
    names = {row[0] for row in table}
    (root / "test_list.txt").write_text("\n".join(test) + "\n")
    (root / "train_val_list.txt").write_text("\n".join(sorted(names - set(test))) + "\n")
    done.write_text(str(entries))


def build_det(root: Path, images: int) -> None:
    """An ILSVRC tree of `images` DET images, each with an XML, linked to the sample's annotated images."""
    done = root / ".complete"
    if done.exists() and int(done.read_text()) == images:
        return
    sample = sample_folder("imagenet_det") / "ILSVRC"
    pairs = sorted((path, sample / "Annotations" / "DET" / path.relative_to(sample / "Data" / "DET").with_suffix(
        ".xml")) for path in (sample / "Data" / "DET").rglob("*.JPEG"))
    pairs = [(image, xml) for image, xml in pairs if xml.exists()]
    val = images // 22  # ILSVRC 2014: 20,121 validation images beside 456,567 for training
    wnid_images = (images - val) * 88 // 100
    layout = [(f"train/ILSVRC2013_train/{WNIDS[i % len(WNIDS)]}", f"{WNIDS[i % len(WNIDS)]}_{i:08d}")
              for i in range(wnid_images)]
    layout += [(f"train/ILSVRC2014_train_{i // 10_000:04d}", f"ILSVRC2014_train_{i:08d}")
               for i in range(images - val - wnid_images)]
    layout += [("val", f"ILSVRC2013_val_{i:08d}") for i in range(val)]
    made = set()
    for i, (folder, stem) in enumerate(layout):
        if folder not in made:
            for kind in ("Data", "Annotations"):
                (root / "ILSVRC" / kind / "DET" / folder).mkdir(parents=True, exist_ok=True)
            made.add(folder)
        image, xml = pairs[i % len(pairs)]
        link(image, root / "ILSVRC" / "Data" / "DET" / folder / f"{stem}.JPEG")
        link(xml, root / "ILSVRC" / "Annotations" / "DET" / folder / f"{stem}.xml")
    done.write_text(str(images))


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def run(dataset, root: Path, cache: Path, run_dir: Path) -> dict:
    """One `python run.py` to the end; its first-step line, laps, files checked, peak RSS and load averages."""
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "run.py", f"dataset={dataset}", f"dataset.root={root}", *RUN, f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, HARNESS_CACHE=str(cache), TF_CPP_MIN_LOG_LEVEL="2")
    before = load_average()
    started = time.perf_counter()
    with open(run_dir.with_suffix(".log"), "w") as log:
        process = subprocess.Popen(command, cwd=PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)  # the child's own rusage: its peak RSS and CPU time
    process.returncode = os.waitstatus_to_exitcode(status)
    output = run_dir.with_suffix(".log").read_text()
    if process.returncode:
        sys.exit(f"{' '.join(command)} exited {process.returncode}:\n{output[-3000:]}")
    total, laps = FIRST_STEP.search(output).groups()
    checked = VERIFIED.search(output)
    return {"first_step": float(total), "wall": time.perf_counter() - started,
            "laps": dict(re.fullmatch(r"(.+) ([\d.]+) s", lap).groups() for lap in laps.split(", ")),
            "checked": f"{checked.group(2)} of {checked.group(1)}" if checked else "-",
            "rss_mb": usage.ru_maxrss / 1024, "cpu": usage.ru_utime + usage.ru_stime, "load": f"{before} → {load_average()}"}


# A start's data phases alone, in a fresh process: wall and CPU seconds of the index and the verification.
PHASES = """
import json, sys, time
from benchmarks import data_api
name, root = sys.argv[1:3]
index, verify = data_api.start_phases(name, root, 32)
laps = {}
for phase in ("index", "verify"):
    wall, cpu = time.perf_counter(), time.process_time()
    tables = index() if phase == "index" else verify(tables)
    laps[phase] = (time.perf_counter() - wall, time.process_time() - cpu)
print(json.dumps(laps))
"""


def data_phases(dataset, root: Path, cache: Path) -> dict:
    """{phase: (wall s, CPU s)} of the index and verification with `cache`, measured in a process of their own."""
    env = dict(os.environ, HARNESS_CACHE=str(cache), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-c", PHASES, dataset, str(root)], cwd=PROJECT, env=env,
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


def print_phases(tree, dataset, root: Path, folder: Path) -> None:
    """Prints the data phases of a cold start (an empty cache) and then of a warm one (the same cache again)."""
    cache = folder / f"cache-{tree}-phases"
    shutil.rmtree(cache, ignore_errors=True)
    for start in ("cold", "warm"):
        before = load_average()
        phases = data_phases(dataset, root, cache)
        print(f"{tree} {start} data phases alone (load {before} → {load_average()}): "
              + ", ".join(f"{phase} {wall:.2f} s wall, {cpu:.2f} CPU-s" for phase, (wall, cpu) in phases.items()),
              flush=True)


def change_one_nih_file(root: Path) -> None:
    """Replaces one PNG by a truncated copy (a new file: the others share its inode)."""
    (root / ".complete").unlink(missing_ok=True)
    path = next((root / "images_001" / "images").iterdir())
    content = path.read_bytes()
    path.unlink()
    path.write_bytes(content[:len(content) // 2])


def add_one_nih_file(root: Path) -> None:
    """Adds one PNG and its row to Data_Entry_2017.csv."""
    (root / ".complete").unlink(missing_ok=True)
    folder = root / f"images_{NIH_FOLDERS:03d}" / "images"
    shutil.copy(next(folder.iterdir()), folder / "99999999_000.png")
    with open(root / "Data_Entry_2017.csv", "a", newline="") as f:
        csv.writer(f).writerow(["99999999_000.png", "No Finding", "0", "99999999", "50", "F", "PA", "2500", "2048",
                                "0.143", "0.143"])


def print_table(results) -> None:
    phases = ("imports", "index", "verify", "build", "input_fn")
    print("| tree | run | to the first step | " + " | ".join(phases) + " | first loop | files checked | peak RSS | "
          "CPU-s, whole run | load (1 min) |")
    print("|---" * (len(phases) + 9) + "|")
    for (tree, name), result in results.items():
        laps = result["laps"]
        loop = next(seconds for phase, seconds in laps.items() if phase.startswith("first loop"))
        verdicts = {"first_step": "", "index": ""}
        if (tree, name) in TARGETS:
            what, bound = TARGETS[tree, name]
            seconds = result["first_step"] if what == "first_step" else float(laps["index"])
            verdicts[what] = f" ({'≤' if seconds <= bound else '>'} {bound:.0f} s)"
        print(f"| {tree} | {name} | {result['first_step']:.1f} s{verdicts['first_step']} | "
              + " | ".join(f"{laps.get(phase, '-')} s{verdicts.get(phase, '')}" for phase in phases)
              + f" | {loop} s | {result['checked']} | {result['rss_mb']:.0f} MB | {result['cpu']:.0f} | {result['load']} |")


def runs(tree, dataset, root, folder) -> dict:
    """The tree's runs from a cold cache: first, second, and on NIH one file changed, then one added."""
    cache = folder / f"cache-{tree}"
    shutil.rmtree(cache, ignore_errors=True)  # a cold start: no index, no verification records
    cache.mkdir(parents=True)
    steps = [("first", None), ("second", None)]
    if tree == "nih":
        steps += [("changed", change_one_nih_file), ("added", add_one_nih_file)]
    results = {}
    for name, change in steps:
        if change:
            change(root)
        results[tree, name] = run(dataset, root, cache, folder / f"run-{tree}-{name}")
        print(f"{tree} {name}: {results[tree, name]}", flush=True)
    return results


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME}", description=__doc__,
                                     formatter_class=measure.Help)
    parser.add_argument("folder", nargs="?", default="/tmp/tf-harness-real-size", type=Path)
    parser.add_argument("--nih", type=int, default=112_120, help="NIH rows and PNGs")
    parser.add_argument("--det", type=int, default=450_000, help="DET images (each with an XML)")
    parser.add_argument("--only", choices=("nih", "det"))
    parser.add_argument("--phases-only", action="store_true",
                        help="only the data phases of a cold and a warm start, no python run.py")
    args = parser.parse_args(argv)
    with record.recorded(NAME, argv, devices=False):  # TensorFlow runs in the children only
        results = {}
        for tree, dataset, build, size in (("nih", "chest_xray", build_nih, args.nih),
                                           ("det", "imagenet_det", build_det, args.det)):
            if args.only not in (None, tree):
                continue
            root = args.folder / tree
            started = time.perf_counter()
            build(root, size)
            print(f"{tree}: {size:,} images linked in {root} ({time.perf_counter() - started:.0f} s)", flush=True)
            if not args.phases_only:
                results.update(runs(tree, dataset, root, args.folder))
            print_phases(tree, dataset, root, args.folder)
        if results:
            print_table(results)
    return 0
