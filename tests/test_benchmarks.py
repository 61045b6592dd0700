"""Smoke test of the input-pipeline benchmark: the script runs on a tiny setting and prints its ratios.

The benchmark itself is a script (benchmarks/pipeline.py), not a test; this only checks that
it still runs end to end against the real pipeline, as a person would run it.
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pipeline_benchmark_runs_and_prints_ratios():
    command = [sys.executable, "benchmarks/pipeline.py", "--datasets", "chest_xray", "--seconds", "0.5",
               "--repeats", "1", "--image-size", "32", "--batch-size", "8", "--only", "a,c", "--quiet-wait", "0"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "| a | Python loop + PIL" in out
    assert "| c | input_fn, source=files" in out
    assert "c ÷ a" in out and "target ≥ 3" in out
    assert "c ÷ ceiling                n/a (not measured)" in out
    assert "## Which input source to use" in out
    assert "command: python benchmarks/pipeline.py --datasets chest_xray" in out
