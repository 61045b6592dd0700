"""Smoke tests of the benchmarks: the throughput, host-loss and loop-overhead scripts run on a tiny setting
and print their rows and ratios, and the former entry point still dispatches to the two input scripts.

The benchmarks themselves are scripts (benchmarks/throughput.py, benchmarks/host_loss.py, ...), not
tests; this only checks that those three still run end to end against the real pipeline and trainer,
as a person would run them.
"""
import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(command):
    """The stdout of a benchmark's command line, run from the project root; it must exit 0."""
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_loop_benchmark(script, *args):
    """The stdout of a training-loop benchmark on LFW, which starts with the devices seen and ends with the load."""
    out = run_benchmark([sys.executable, f"benchmarks/{script}", "--datasets", "lfw_pairs", *args])
    assert f"command: python benchmarks/{script} --datasets lfw_pairs" in out
    assert "devices: ['/device:CPU:0'] []" in out and re.search(r"load average \(1 min\) after: \d+\.\d\d", out)
    return out


@pytest.mark.slow
def test_throughput_benchmark_runs_and_prints_ratios():
    command = [sys.executable, "benchmarks/throughput.py", "--datasets", "chest_xray", "--seconds", "0.3",
               "--repeats", "2", "--image-size", "default,32", "--batch-size", "8", "--only", "ceiling,a,c",
               "--quiet-wait", "0"]
    out = run_benchmark(command)
    # The ceiling is the independent minimal decode, not the project's own load.
    assert "| ceiling | minimal TF decode (read, decode, bilinear resize, uint8)" in out
    assert "| a | Python loop + PIL" in out
    assert "| c | input_fn, source=files" in out
    # The dataset's own size (conf/dataset/chest_xray.yaml) and the one asked for, each a table.
    assert "### chest_xray: 1024x1024 PNG sources -> 64x64 (default), batch 8" in out
    assert "### chest_xray: 1024x1024 PNG sources -> 32x32, batch 8" in out
    assert re.search(r"load average \(1 min\) \d+\.\d\d before, \d+\.\d\d after the rounds", out)
    # Every row: images/s, images per CPU-s, its ratio to c per CPU-s, cores per 1,000 images/s, load around it.
    assert "| images per CPU-s | ÷ c per CPU-s (min–max) | cores per 1,000 images/s |" in out
    row = r"\| {} \| [^|]+ \| [\d,]+ \| [\d,]+–[\d,]+ \| \d+\.\d\d \(\d+\.\d\d–\d+\.\d\d\) \| [\d,]+ \| " \
          r"\d+\.\d\d \(\d+\.\d\d–\d+\.\d\d\) \| \d+\.\d\d \| \d+\.\d\d \| \d+\.\d\d \| \d+\.\d–\d+\.\d \|"
    for key in ("ceiling", "a", "c"):
        assert len(re.findall(row.format(key), out)) == 2, key
    # Ratios are medians of per-round ratios, with their spread.
    assert re.search(r"c ÷ a +\d+\.\d\d   \(\d+\.\d\d–\d+\.\d\d over 2 rounds\)   target ≥ 3 ", out)
    assert re.search(r"c ÷ ceiling +\d+\.\d\d   \(\d+\.\d\d–\d+\.\d\d over 2 rounds\)", out)
    assert re.search(r"c ÷ ceiling per CPU-second +\d+\.\d\d   \(.* over 2 rounds\)   target ≥ 0\.9 ", out)
    assert "c ÷ b                      n/a (not measured)" in out
    # The summary: one column per dataset and size; ratios to c with their spread, and cores per 1,000 images/s.
    assert "## Which input source to use" in out
    assert "| input source | chest_xray 64x64 (default) | chest_xray 32x32 |" in out
    assert re.search(r"\| c: `input_fn`, `pipeline.source=files` \| 1 / 1 / \d+\.\d\d \| 1 / 1 / \d+\.\d\d \|", out)
    cell = r"\d+\.\d\d \(\d+\.\d\d–\d+\.\d\d\) / \d+\.\d\d \(\d+\.\d\d–\d+\.\d\d\) / \d+\.\d\d"
    assert re.search(rf"\| a: Python loop \+ PIL, `tf.constant` per batch \| {cell} \| {cell} \|", out)
    assert re.search(r"\| load average \(1 min\), before–after \| \d+\.\d\d–\d+\.\d\d \| \d+\.\d\d–\d+\.\d\d \|", out)
    assert "command: python benchmarks/throughput.py --datasets chest_xray" in out


@pytest.mark.slow
def test_host_loss_benchmark_runs_and_prints_every_ceiling_and_each_loop():
    out = run_loop_benchmark("host_loss.py", "--loops", "1,2", "--jit", "false,true", "--steps", "2", "--rounds", "2",
                             "--override", "pipeline.batch_size=8", "--override", "pipeline.cache=memory")
    assert "lfw_pairs: model=siamese_cnn batch=8 image_size=48 cache=memory, 2 steps per row" in out, out
    spread = r"\d+\.\d{3} \(\d+\.\d{3}–\d+\.\d{3}\)"
    rows = {name: re.search(rf"\| {name} \| [\d.]+ \| \d+ \| \d+ \| \d\.\d{{3}} \| ({spread}) \| ({spread}) \|", out)
            for name in ("ceiling, 1 per call", "ceiling, 2 per call", "ceiling XLA, 2 per call", "loop 1, jit False",
                         "loop 2, jit False", "loop 1, jit True", "loop 2, jit True")}
    assert all(rows.values()), out
    # The fastest ceiling is each round's yardstick: one ceiling reads 1 in its best round, and none less.
    ceiling_minima = [float(re.search(r"\((\S+)–", rows[name][1])[1]) for name in rows if name.startswith("ceiling")]
    assert min(ceiling_minima) == 1.0, out
    assert re.search(rf"lfw_pairs: looping gains the bare step {spread}× in steps/s at 2 vs 1 per call, saving "
                     r"-?\d+\.\d\d \(-?\d+\.\d\d–-?\d+\.\d\d\) ms per step", out), out


@pytest.mark.slow
def test_loop_overhead_benchmark_runs_and_prints_each_part_added():
    out = run_loop_benchmark("loop_overhead.py", "--per-call", "2", "--jit", "false", "--steps", "4", "--rounds", "2",
                             "--override", "pipeline.batch_size=8")
    assert ("batch=8 image_size=48 cache=none, step jit_compile=False, 2 steps per call, 4 steps per row, "
            "2 rounds") in out, out
    ratio, added = r"\d+\.\d{3} \(\d+\.\d{3}–\d+\.\d{3}\)", r"-?\d+\.\d\d \(-?\d+\.\d\d–-?\d+\.\d\d\)"
    # The resident row is the yardstick: exactly 1 in every round, and nothing above it to add to.
    assert re.search(r"\| 1\. resident \| [\d.]+ \| \d+ \| \d+ \| — \| 1\.000 \(1\.000–1\.000\) \| — \|", out), out
    for name, clocked in (("2. + iterator", False), ("3. + clocks", True), ("4. + device condition", True),
                          ("5. + results", True), ("6. + pipeline", True), ("7. trainer", True)):
        wait = r"\d\.\d{3}" if clocked else "—"
        assert re.search(rf"\| {re.escape(name)} \| [\d.]+ \| \d+ \| \d+ \| {wait} \| {ratio} \| {added} \|", out), name


def test_pil_baselines_decode_jpegs_reduced_where_c_decodes_a_window(real, monkeypatch):
    """LFW keeps a central quarter of a 250x250 JPEG at 48x48: PIL's baselines ask libjpeg for half
    the scale (draft), the least that still leaves the kept window at least 48 pixels."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import measure
    from PIL import JpegImagePlugin

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
    pixels = measure.Bench.pil_image(bench, path)
    assert requests == [((96, 96), (125, 125))]
    ours = images.decode_and_resize(tf.io.read_file(str(path)), 3, (48, 48), "resize", 0.5).numpy()
    assert pixels.shape == ours.shape == (48, 48, 3)
    assert np.abs(pixels.astype(float) - ours).mean() < 2  # the same window and scale, another resampler (1.1)


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
