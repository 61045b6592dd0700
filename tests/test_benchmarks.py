"""Smoke tests of the input benchmarks: the throughput script runs on a tiny setting and prints its
rows and ratios, and the former entry point still dispatches to the two scripts.

The benchmarks themselves are scripts (benchmarks/throughput.py, benchmarks/starvation.py), not
tests; this only checks that the throughput one still runs end to end against the real pipeline,
as a person would run it.
"""
import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_throughput_benchmark_runs_and_prints_ratios():
    command = [sys.executable, "benchmarks/throughput.py", "--datasets", "chest_xray", "--seconds", "0.5",
               "--repeats", "1", "--image-size", "32", "--batch-size", "8", "--only", "ceiling,a,c",
               "--quiet-wait", "0"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    # The ceiling is the independent minimal decode, not the project's own load.
    assert "| ceiling | minimal TF decode (read, decode, bilinear resize, uint8)" in out
    assert "| a | Python loop + PIL" in out
    assert "| c | input_fn, source=files" in out
    assert "images per CPU-s" in out
    assert re.search(r"load average \(1 min\) \d+\.\d\d before, \d+\.\d\d after the rounds", out)
    # Ratios are medians of per-round ratios, with their spread.
    assert re.search(r"c ÷ a +\d+\.\d\d   \(\d+\.\d\d–\d+\.\d\d over 1 rounds\)   target ≥ 3 ", out)
    assert re.search(r"c ÷ ceiling +\d+\.\d\d   \(\d+\.\d\d–\d+\.\d\d over 1 rounds\)", out)
    assert "c ÷ b                      n/a (not measured)" in out
    assert "## Which input source to use" in out
    assert re.search(r"\| c: input_fn, source=files .* \| [\d,]+ \(1\.00×; [\d,]+/CPU-s\) \|", out)
    assert "command: python benchmarks/throughput.py --datasets chest_xray" in out


def test_former_entry_point_dispatches(monkeypatch):
    calls = []
    for name in ("throughput", "starvation"):
        fake = types.ModuleType(name)
        fake.main = lambda argv, program, name=name: calls.append((name, argv, program)) or 0
        monkeypatch.setitem(sys.modules, name, fake)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the wrapper puts benchmarks/ on it
    spec = importlib.util.spec_from_file_location("benchmarks_pipeline", ROOT / "benchmarks" / "pipeline.py")
    pipeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipeline)
    pipeline.main(["--datasets", "lfw_pairs"])
    pipeline.main(["--steps", "3", "--starvation"])
    assert calls == [("throughput", ["--datasets", "lfw_pairs"], "benchmarks/pipeline.py"),
                     ("starvation", ["--steps", "3"], "benchmarks/pipeline.py --starvation")]
