"""The benchmarks' one entry point, their layout, and smoke runs of each on tiny settings.

The benchmarks themselves are not tests: these check that `python -m benchmarks` lists every benchmark
module, that each runs end to end against the real pipeline and trainer and prints its rows in their
format, and that benchmarks/ keeps its rules (no sys.path, no benchmark imported by another). The fast
smoke runs call a benchmark's main(argv) in this process, as `python -m benchmarks NAME ...` does, since
TensorFlow is already started here; the longer runs of the other modes are marked slow.
"""
import ast
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import PROJECT

BENCHMARKS = PROJECT / "benchmarks"
NUMBER = r"-?\d+\.\d+"
SPREAD = rf"{NUMBER} \({NUMBER}–{NUMBER}\)"
# LFW's siamese CNN at 24x24, batch 4: a step of milliseconds, a trace of a few seconds.
TINY_LFW = ("--datasets", "lfw_pairs", "--override", "pipeline.batch_size=4", "--override", "pipeline.image_size=24")


@pytest.fixture(autouse=True)
def results_folder(tmp_path, monkeypatch):
    """Where the runs below write their results files: a temporary folder, not benchmarks/results/."""
    folder = tmp_path / "results"
    monkeypatch.setenv("HARNESS_BENCHMARK_RESULTS", str(folder))
    return folder


# ---------------------------------------------------------------------------------------------
# Layout: what a benchmark is, and the rules benchmarks/ keeps


def module_trees(folder):
    """{module name: its parsed source} of the package's modules, __init__ and __main__ left out."""
    return {path.stem: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(folder.glob("*.py"))
            if path.stem not in ("__init__", "__main__")}


def benchmark_modules(folder):
    """The modules that are benchmarks: those with a top-level main()."""
    return sorted(name for name, tree in module_trees(folder).items()
                  if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body))


def imported_modules(tree):
    """Every benchmarks.X a module imports (`from benchmarks import X`, `import benchmarks.X`, `from benchmarks.X
    import ...`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[1] for alias in node.names if alias.name.startswith("benchmarks."))
    return names


def benchmarks_imported_as_libraries(folder):
    """'A imports B' for every module that imports a benchmark module other than itself."""
    runnable = set(benchmark_modules(folder))
    return sorted(f"{name} imports {other}" for name, tree in module_trees(folder).items()
                  for other in imported_modules(tree) & runnable if other != name)


def files_naming_sys_path(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()
                  and "__pycache__" not in path.parts and "sys.path" in path.read_text(errors="replace"))


def listed(output):
    """The benchmark names `python -m benchmarks` lists, with their descriptions."""
    return dict(re.findall(r"^  (\w+) +(\S.*)$", output.split("benchmarks:\n", 1)[1], re.MULTILINE))


def test_python_m_benchmarks_lists_every_benchmark_module_with_a_description():
    done = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=PROJECT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    names = listed(done.stdout)
    assert sorted(names) == benchmark_modules(BENCHMARKS), done.stdout
    assert all(len(description) > 20 for description in names.values()), names
    unknown = subprocess.run([sys.executable, "-m", "benchmarks", "nonesuch"], cwd=PROJECT, capture_output=True,
                             text=True, timeout=60)
    assert unknown.returncode == 2 and "no benchmark named 'nonesuch'" in unknown.stderr


def test_no_file_under_benchmarks_names_sys_path():
    assert files_naming_sys_path(BENCHMARKS) == []


def test_no_module_imports_a_benchmark_as_a_library():
    assert benchmarks_imported_as_libraries(BENCHMARKS) == []


def test_the_layout_checks_can_fail(tmp_path):
    """The helpers above see a benchmark left out of the listing, a sys.path, and a benchmark imported by
    another, in a planted package."""
    (tmp_path / "__main__.py").write_text("")
    main = "\n\ndef main(argv):\n    pass\n"
    (tmp_path / "alpha.py").write_text('"""Alpha."""\nimport sys\nsys.path.insert(0, ".")' + main)
    (tmp_path / "beta.py").write_text('"""Beta."""\nfrom benchmarks import alpha, measure' + main)
    (tmp_path / "measure.py").write_text('"""Shared."""\nimport benchmarks.beta\n')
    assert benchmark_modules(tmp_path) == ["alpha", "beta"]
    assert files_naming_sys_path(tmp_path) == ["alpha.py"]
    assert benchmarks_imported_as_libraries(tmp_path) == ["beta imports alpha", "measure imports beta"]
    assert sorted(listed("benchmarks:\n  alpha  Alpha, the first.\n")) == ["alpha"]


@pytest.mark.parametrize("name", benchmark_modules(BENCHMARKS))
def test_each_benchmark_shows_its_options_without_starting_tensorflow(name):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "benchmarks", name, "--help"], cwd=PROJECT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"usage: python -m benchmarks {name}")
    assert "tensorflow" not in done.stderr  # -X importtime lists every module imported on stderr
    listing = subprocess.run([sys.executable, "-X", "importtime", "-m", "benchmarks"], cwd=PROJECT,
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and "tensorflow" not in listing.stderr


@pytest.mark.parametrize("name", benchmark_modules(BENCHMARKS))
def test_each_benchmark_shows_its_options(name, capsys):
    with pytest.raises(SystemExit) as exited:
        run_main(name, "--help")
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m benchmarks {name}") and "--" in out


# ---------------------------------------------------------------------------------------------
# Smoke runs


def run_main(name, *argv):
    """Runs benchmark `name` as `python -m benchmarks name argv...` does; returns its exit status."""
    from benchmarks import __main__ as entry

    return entry.main([name, *argv])


def run_benchmark(capsys, name, *argv):
    """The output of benchmark `name`, which must exit 0, frame it with its command and the load, and write it
    to one results file with that command."""
    assert run_main(name, *argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"command: python -m benchmarks {name} {argv[0]}"), out[:500]
    assert re.search(r"load average \(1 min\) before: \d+\.\d\d; cores: \d+", out), out
    assert re.search(r"load average \(1 min\) after: \d+\.\d\d", out), out
    written = re.findall(r"^results: (\S+)$", out, re.MULTILINE)
    assert len(written) == 1, out
    record = json.loads(Path(written[0]).read_text(encoding="utf-8"))
    assert record["benchmark"] == name and out.startswith(f"command: {record['command']}\n")
    return out


def test_a_run_writes_the_machine_the_command_and_its_figures_to_one_results_file(results_folder, capsys):
    """record.recorded frames a run: header, footer, and one JSON file with the machine, date, load average,
    command and the tables and lines it printed; a second run in the same second gets a file of its own, and a
    run that raises writes none."""
    from benchmarks import measure, record

    for _ in range(2):
        with record.recorded("fake", ["--rounds", "1"], devices=False):
            print("lfw_pairs: 2 rounds\n| row | steps/s |\n|---|---|\n| loop 1 | 12.5 |\n\nratio 1.02 (0.98–1.10)")
    with pytest.raises(RuntimeError), record.recorded("fake", [], devices=False):
        raise RuntimeError("cut short")
    out = capsys.readouterr().out
    paths = sorted(results_folder.glob("*-fake*.json"))
    assert len(paths) == 2 and re.fullmatch(r"\d{4}-\d\d-\d\d-\d{6}-fake(-1)?\.json", paths[0].name), paths
    assert f"results: {paths[0]}" in out
    result = json.loads(paths[0].read_text(encoding="utf-8"))
    assert result["command"] == "python -m benchmarks fake --rounds 1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", result["date"])
    assert result["machine"]["cores"] == measure.CORES and result["machine"]["cpu"]
    assert isinstance(result["machine"]["gpus"], list)
    assert set(result["load_average_1min"]) == {"before", "after"}
    assert result["figures"]["tables"] == [{"title": "lfw_pairs: 2 rounds", "columns": ["row", "steps/s"],
                                            "rows": [["loop 1", "12.5"]]}]
    assert result["figures"]["lines"] == ["lfw_pairs: 2 rounds", "ratio 1.02 (0.98–1.10)"]


def test_a_results_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    from benchmarks import record

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HARNESS_BENCHMARK_RESULTS", str(tmp_path / "file" / "results"))
    with record.recorded("fake", [], devices=False):
        print("figures")
    captured = capsys.readouterr()
    assert "results:" not in captured.out and "figures" in captured.out
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith("results not written: ")


def step_rows(out, names, extra=None):
    """The table rows of `names`: steps/s, images/s, images per CPU-s, input wait, two ratios with spreads."""
    cell = {None: "", "spread": rf" {SPREAD} \|", "added": rf" (?:—|{SPREAD}) \|"}[extra]
    rows = {}
    for name, clocked in names.items():
        wait = r"\d\.\d{3}" if clocked else "—"
        rows[name] = re.search(rf"^\| {re.escape(name)} \| [\d.]+ \| \d+ \| [\d.]+ \| {wait} \| ({SPREAD}) \| "
                               rf"{SPREAD} \|{cell}$", out, re.MULTILINE)
    assert all(rows.values()), (out, [name for name, row in rows.items() if not row])
    return rows


def test_a_row_timed_against_itself_reads_one_under_a_clock_tick():
    """Wall times come from perf_counter and are taken as they are, even under the CPU clock's 10 ms tick;
    only a CPU time of 0 (shorter than a tick) counts as one tick."""
    from benchmarks.measure import Timing, timing_ratios
    runs = [Timing(0.004, 0.0, None), Timing(0.0095, 0.01, None)]
    assert timing_ratios(runs, runs) == [1.0, 1.0]
    assert timing_ratios([Timing(0.006, 0.01, None)], runs[:1]) == [pytest.approx(1.5)]
    assert timing_ratios([Timing(0.006, 0.02, None)], runs[:1], "cpu") == [pytest.approx(2.0)]


@pytest.mark.slow  # end-to-end runs
def test_steps_cost_runs_the_yardstick_step_and_loops(capsys):
    out = run_benchmark(capsys, "steps", "cost", *TINY_LFW, "--steps", "2", "--rounds", "1", "--loops", "2")
    assert "devices: ['/device:CPU:0']" in out
    assert re.search(r"^keras: first call [\d.]+ s \([\d.]+ CPU-s\), the second", out, re.MULTILINE), out
    assert ("lfw_pairs: model=siamese_cnn batch=4 image_size=24 cache=none, step jit_compile=False, 4 cached "
            "batches, 2 steps per row, 1 rounds") in out
    assert "| time per step ÷ keras (min–max) | CPU per step ÷ keras (min–max) |" in out
    rows = step_rows(out, {"keras": False, "step": False, "loop 2": True})
    assert rows["keras"][1] == "1.000 (1.000–1.000)"  # the base row, against itself


def test_input_throughput_runs_the_pil_baseline_and_the_pipeline(capsys):
    out = run_benchmark(capsys, "input", "--datasets", "chest_xray", "--image-size", "16", "--batch-size", "4",
                        "--seconds", "0.05", "--rounds", "1", "--quiet-wait", "0", "--only", "a,c")
    assert "### chest_xray: 1024x1024 PNG sources -> 16x16, batch 4" in out
    row = r"\| {} \| [^|]+ \| [\d,]+ \| [\d,]+–[\d,]+ \| {} \| [\d,]+ \| {} \| \d+\.\d\d \| \d+\.\d\d \| " \
          r"\d+\.\d\d \| \d+\.\d–\d+\.\d \|"
    assert re.search(row.format("a", SPREAD, SPREAD), out), out
    assert re.search(row.format("c", r"1\.00 \(1\.00–1\.00\)", r"1\.00 \(1\.00–1\.00\)"), out), out
    assert re.search(r"c ÷ a +\d+\.\d\d   \(\d+\.\d\d–\d+\.\d\d over 1 rounds\)   target ≥ 3 ", out), out
    assert "c ÷ ceiling                n/a (not measured)" in out
    assert re.search(r"\| a: Python loop \+ PIL, `tf.constant` per batch \| [^|]+ / [^|]+ / \d+\.\d\d \|", out)


@pytest.mark.slow  # end-to-end runs
def test_input_throughput_sets_lfws_image_table_against_its_file_pipeline(capsys):
    """LFW's row c decodes the pairs' files (pipeline.image_table_mb=0); row f gathers them from the image table."""
    out = run_benchmark(capsys, "input", "--datasets", "lfw_pairs", "--image-size", "16", "--batch-size", "4",
                        "--seconds", "0.05", "--rounds", "1", "--quiet-wait", "0", "--only", "c,f")
    row = r"^\| {} \| {} \| [\d,]+ \| [\d,]+–[\d,]+ \| [\d,]+ \| {} \| [\d,]+ \| {} \| "
    one = r"1\.00 \(1\.00–1\.00\)"
    assert re.search(row.format("c", re.escape("input_fn, source=files (decode in tf.data)"), one, one), out,
                     re.MULTILINE), out
    assert re.search(row.format("f", "input_fn, cache=memory: pairs gathered from the image table [^|]+", SPREAD,
                                SPREAD), out, re.MULTILINE), out


@pytest.mark.slow  # end-to-end runs
def test_steps_variants_sets_the_trainer_with_the_image_table_against_the_file_pipeline(capsys):
    out = run_benchmark(capsys, "steps", "variants", *TINY_LFW, "--steps", "2", "--rounds", "1")
    assert ("lfw_pairs: model=siamese_cnn batch=4 image_size=24 cache=none, loop 1, step jit_compile=False; rows "
            "files: pipeline.image_table_mb=0; table: the config as it is, 2 steps per row, 1 rounds") in out, out
    rows = step_rows(out, {"files": True, "table": True}, "spread")
    assert rows["files"][1] == "1.000 (1.000–1.000)"  # the base row, against itself


def against_rows(out, keys, base):
    row = r"^\| {} \| [^|]+ \| [\d,]+ \([\d,]+–[\d,]+\) \| {} \| [\d,]+ \([\d,]+–[\d,]+\) \| {} \| \d+\.\d\d \| " \
          r"\d+\.\d–\d+\.\d \|$"
    one = r"1\.00 \(1\.00–1\.00\)"
    for key in keys:
        ratio = one if key == base else SPREAD
        assert re.search(row.format(key, ratio, ratio), out, re.MULTILINE), (key, out)


def test_input_resize_runs_the_ceiling_the_previous_shrink_and_the_project(capsys):
    out = run_benchmark(capsys, "input", "resize", "--image-size", "16", "--rounds", "1", "--batches", "1")
    assert re.search(r"24 files from \S+tests/fixtures/real/nih/images/\*\.png, to 16x16, batch 8; 1 paired rounds",
                     out), out
    assert "| row | what | images/s (min–max) | ÷ ceiling (min–max) | images per CPU-s (min–max) |" in out
    against_rows(out, ["ceiling", "previous", "project"], "ceiling")


def test_input_guard_runs_both_loads(capsys):
    out = run_benchmark(capsys, "input", "guard", "--datasets", "lfw_pairs", "--image-size", "16", "--batch-size",
                        "4", "--rounds", "1", "--batches", "1")
    assert "### lfw_pairs: 16x16, batch 4; 1 paired rounds" in out
    against_rows(out, ["plain", "guarded"], "plain")


def test_input_augment_runs_the_flips_the_crop_and_the_mixing(capsys):
    out = run_benchmark(capsys, "input", "augment", "--image-size", "16", "--batch-size", "4", "--rounds", "1",
                        "--batches", "1")
    assert "augmentation of a 4x16x16x3 uint8 batch, traced; 1 paired rounds" in out
    against_rows(out, ["flips", "crop", "mix"], "flips")


def test_input_release_times_letting_go_of_both_rows_iterators(capsys):
    out = run_benchmark(capsys, "input", "release", "--datasets", "lfw_pairs", "--image-size", "16", "--batch-size",
                        "4", "--rounds", "1", "--seconds", "0.05")
    assert "### lfw_pairs: 16x16, batch 4; 1 paired rounds of 0.05 s of batches" in out
    for key in ("iter", "project"):
        assert re.search(rf"^\| {key} \| \d+\.\d{{3}} \| \d+\.\d{{3}} \| \d+\.\d\d \| [01] of 1 \| \d+\.\d\d \|$", out,
                         re.MULTILINE), out


def test_service_runs_the_local_row(capsys):
    out = run_benchmark(capsys, "service", "--workers", "0", "--rounds", "1", "--seconds", "0.1", "--batch-size", "4",
                        "--image-size", "16")
    assert "chest_xray, 16 px, batch 4" in out and "1 paired rounds" in out
    values = re.search(r"^  file pipeline, read here +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$", out, re.MULTILINE)
    assert values and all(float(value) > 0 for value in values.groups()), out


@pytest.mark.slow  # end-to-end runs
def test_real_size_builds_a_tree_and_times_its_data_phases(capsys, tmp_path):
    out = run_benchmark(capsys, "real_size", str(tmp_path), "--only", "nih", "--nih", "40", "--phases-only")
    assert re.search(rf"^nih: 40 images linked in {tmp_path}/nih", out, re.MULTILINE), out
    assert len(list((tmp_path / "nih").rglob("*.png"))) == 40
    for start in ("cold", "warm"):
        assert re.search(rf"^nih {start} data phases alone \(load [\d.]+ → [\d.]+\): index [\d.]+ s wall, [\d.]+ "
                         r"CPU-s, verify [\d.]+ s wall, [\d.]+ CPU-s$", out, re.MULTILINE), out


@pytest.mark.slow  # a training process
def test_faults_makes_its_reference_run(capsys, tmp_path):
    out = run_benchmark(capsys, "faults", "--datasets", "lfw_pairs", "--faults", "SIGTERM", "--trials", "0",
                        "--work", str(tmp_path))
    assert re.search(r"^lfw_pairs: reference run [\d.]+ s, \d+ instants to draw from$", out, re.MULTILINE), out
    assert "| dataset | fault | resumed exactly | exit statuses seen |" in out
    assert "| lfw_pairs | SIGTERM | 0/0 |  |" in out
    assert (tmp_path / "lfw_pairs" / "reference" / "checkpoints").is_dir()


# ---------------------------------------------------------------------------------------------
# The other modes, on tiny settings but with several traces or processes each


@pytest.mark.slow  # two XLA compiles in fresh processes
def test_compile_cache_smoke_on_a_tiny_model(capsys):
    tiny = ["dataset=lfw_pairs", "experiment=smoke", "mode=train", "trainer.train_steps=1", "pipeline.image_size=24",
            "model.widths=[8,16]", "model.embedding_size=16", "model.head_units=8"]
    out = run_benchmark(capsys, "compile_cache", "--rounds", "1", *(f"--override={o}" for o in tiny))
    assert re.search(r"round 1: cold first step .*cache held 0\), warm .*cache held [1-9]", out), out
    assert re.search(r"first loop, warm ÷ cold +\d+\.\d\d", out), out


@pytest.mark.slow  # two whole runs of the default smoke run, three when the samples are not generated yet
def test_compile_cache_runs_a_cold_and_a_warm_run_and_compares_their_first_loops(capsys):
    out = run_benchmark(capsys, "compile_cache", "--rounds", "1")
    match = re.search(r"round 1: cold first step [\d.]+ s \(first loop ([\d.]+) s, [\d.]+ CPU-s, cache held 0\), "
                      r"warm [\d.]+ s \(first loop ([\d.]+) s, [\d.]+ CPU-s, cache held (\d+)\)", out)
    assert match and int(match.group(3)) >= 1, out  # the warm run found the cold run's program
    assert re.search(r"first loop, warm ÷ cold +\d+\.\d\d +\(.*over 1 rounds\) +target ≤ 0\.5 +(PASS|MISS)", out), out


@pytest.mark.slow
def test_steps_host_loss_prints_every_ceiling_and_each_loop(capsys):
    out = run_benchmark(capsys, "steps", "host-loss", *TINY_LFW, "--loops", "1,2", "--jit", "false,true", "--steps",
                        "2", "--rounds", "2", "--override", "pipeline.cache=memory")
    assert "lfw_pairs: model=siamese_cnn batch=4 image_size=24 cache=memory, 2 steps per row, 2 rounds" in out, out
    rows = step_rows(out, {"ceiling, 1 per call": False, "ceiling, 2 per call": False,
                           "ceiling XLA, 2 per call": False, "loop 1, jit False": True, "loop 2, jit False": True,
                           "loop 1, jit True": True, "loop 2, jit True": True}, "spread")
    # The fastest ceiling is each round's yardstick: one ceiling reads 1 in its best round, and none less.
    minima = [float(re.search(r"\((\S+)–", row[1])[1]) for name, row in rows.items() if name.startswith("ceiling")]
    assert min(minima) == 1.0, out
    assert re.search(rf"lfw_pairs: looping gains the bare step {SPREAD}× in steps/s at 2 vs 1 per call, saving "
                     rf"{SPREAD} ms per step", out), out


@pytest.mark.slow  # end-to-end runs
def test_steps_host_loss_runs_a_trainer_per_variant_beside_the_ceilings(capsys):
    """host-loss --variant: the trainer's loop once per variant, each under its own overrides, against one set of
    ceilings (how trainer.fetch_ahead is weighed on a GPU)."""
    out = run_benchmark(capsys, "steps", "host-loss", *TINY_LFW, "--loops", "2", "--jit", "false", "--steps", "2",
                        "--rounds", "1", "--variant", "base:", "--variant", "ahead:trainer.fetch_ahead=true")
    step_rows(out, {"ceiling, 2 per call": False, "ceiling XLA, 2 per call": False,
                    "loop 2, jit False [base]": True, "loop 2, jit False [ahead]": True}, "spread")
    assert "loop 2, jit False |" not in out, out  # no row outside the variants


@pytest.mark.slow
def test_steps_overhead_prints_each_part_added(capsys):
    out = run_benchmark(capsys, "steps", "overhead", *TINY_LFW, "--per-call", "2", "--jit", "false", "--steps", "4",
                        "--rounds", "2")
    assert "cache=none, step jit_compile=False, 2 steps per call, 4 steps per row, 2 rounds" in out, out
    rows = step_rows(out, {"1. resident": False, "2. + iterator": False, "3. + clocks": True, "4. + results": True,
                           "5. + pipeline": True, "3. + device condition": True, "6. trainer": True,
                           "6. trainer, fetching ahead": True}, "added")
    assert "prefetched to the device" not in out  # with a GPU only
    assert rows["1. resident"][1] == "1.000 (1.000–1.000)" and rows["1. resident"][0].endswith("| — |")
    assert all(not row[0].endswith("| — |") for name, row in rows.items() if name != "1. resident")


@pytest.mark.slow
def test_steps_per_loop_prints_the_ratio_and_the_time_saved(capsys):
    out = run_benchmark(capsys, "steps", "per-loop", *TINY_LFW, "--loops", "1,2", "--steps", "lfw_pairs=2",
                        "--rounds", "2")
    step_rows(out, {"loop 1": True, "loop 2": True}, "spread")
    assert re.search(rf"lfw_pairs: a step at 2 per loop takes [\d.]+ ms; 2 vs 1 per loop saved {SPREAD} ms per step",
                     out), out


@pytest.mark.slow
def test_steps_first_calls_times_each_row_in_a_process_of_its_own():
    done = subprocess.run([sys.executable, "-m", "benchmarks", "steps", "--first-calls", "1", *TINY_LFW, "--loops",
                           "2"], cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("keras", "step", "loop 2"):
        assert re.search(rf"^\| {name} \| [\d.]+ \| {SPREAD} \| {SPREAD} \|$", done.stdout, re.MULTILINE), done.stdout


@pytest.mark.slow  # three fresh processes
def test_steps_first_calls_weighs_each_variant_against_one_yardstick():
    done = subprocess.run([sys.executable, "-m", "benchmarks", "steps", "first-calls", *TINY_LFW, "--loops", "1",
                           "--rounds", "1", "--variant", "on:trainer.graph_optimizer={}",
                           "--variant", "off:trainer.graph_optimizer={disable_meta_optimizer:true}"],
                          cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| ([^|]+) \| [\d.]+ \| " + SPREAD + r" \| " + SPREAD + r" \|$", done.stdout, re.MULTILINE)
    assert [row.strip() for row in rows] == ["keras", "loop 1 [on]", "loop 1 [off]"], done.stdout


@pytest.mark.slow
def test_input_throughput_measures_the_independent_ceiling_and_every_size(capsys):
    out = run_benchmark(capsys, "input", "throughput", "--datasets", "chest_xray", "--seconds", "0.3", "--rounds", "2",
                        "--image-size", "default,32", "--batch-size", "8", "--only", "ceiling,a,c,f",
                        "--quiet-wait", "0")
    # The ceiling is the independent minimal decode, not the project's own load.
    assert "| ceiling | minimal TF decode (read, decode, bilinear resize, uint8)" in out
    assert "### chest_xray: 1024x1024 PNG sources -> 64x64 (default), batch 8" in out
    assert "### chest_xray: 1024x1024 PNG sources -> 32x32, batch 8" in out
    assert re.search(r"load average \(1 min\) \d+\.\d\d before, \d+\.\d\d after the rounds", out)
    row = r"\| {} \| [^|]+ \| [\d,]+ \| [\d,]+–[\d,]+ \| \d+\.\d\d \(\d+\.\d\d–\d+\.\d\d\) \| [\d,]+ \| " \
          r"\d+\.\d\d \(\d+\.\d\d–\d+\.\d\d\) \| \d+\.\d\d \| \d+\.\d\d \| \d+\.\d\d \| \d+\.\d–\d+\.\d \|"
    for key in ("ceiling", "a", "c", "f"):
        assert len(re.findall(row.format(key), out)) == 2, key
    assert re.search(r"c ÷ ceiling per CPU-second +\d+\.\d\d   \(.* over 2 rounds\)   target ≥ 0\.9 ", out)
    assert "| input source | chest_xray 64x64 (default) | chest_xray 32x32 |" in out
    load = r"\d+\.\d\d–\d+\.\d\d"
    assert re.search(rf"\| load average \(1 min\), before–after \| {load} \| {load} \|", out)


@pytest.mark.slow
def test_input_starvation_prints_both_feeds_and_the_verdicts(capsys):
    out = run_benchmark(capsys, "input", "starvation", "--datasets", "chest_xray", "--steps", "2", "--model",
                        "semi_alexnet", "--batch-size", "4", "--image-size", "32")
    for title in ("real pipeline (input_fn, files)", "one cached batch repeated"):
        assert re.search(rf"^\| {re.escape(title)} \| [\d.]+ \| [\d.]+–[\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", out,
                         re.MULTILINE), out
    assert re.search(r"real ÷ cached step time +\d+\.\d\d   \(.* over \d+ blocks\)   target ≤ 1\.05", out), out


# ---------------------------------------------------------------------------------------------
# A baseline's detail


def test_pil_baselines_decode_jpegs_reduced_where_c_decodes_a_window(real, monkeypatch):
    """LFW keeps a central quarter of a 250x250 JPEG at 48x48: PIL's baselines ask libjpeg for half
    the scale (draft), the least that still leaves the kept window at least 48 pixels."""
    from PIL import JpegImagePlugin

    from benchmarks import input_baselines
    from tf_harness.data import images

    requests = []
    draft = JpegImagePlugin.JpegImageFile.draft

    def spy(image, mode, size, *args):
        result = draft(image, mode, size, *args)
        requests.append((size, image.size))
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", spy)
    bench = types.SimpleNamespace(size=(48, 48), spec=types.SimpleNamespace(channels=3), crop_fraction=0.5,
                                  method="resize")
    path = sorted((real / "lfw").glob("*.jpg"))[0]
    pixels = input_baselines.pil_image(bench, path)
    assert requests == [((96, 96), (125, 125))]
    ours = images.decode_and_resize(tf.io.read_file(str(path)), 3, (48, 48), "resize", 0.5).numpy()
    assert pixels.shape == ours.shape == (48, 48, 3)
    assert np.abs(pixels.astype(float) - ours).mean() < 2  # the same window and scale, another resampler (1.1)
