"""Heatmaps that localise: the share of true-positive overlays whose peak lies on the finding's patch, against chance.

On the embedded chest sample each finding is a bright square at a place of its own (data/samples/chest_xray.py),
so where a heatmap should peak is known. The benchmark trains the chest default (`python run.py
dataset=chest_xray`, unless --run names such a run), writes `mode=predict heatmaps=N` for the test split, and
counts, of the overlays whose class the image has, those whose peak (heatmaps/index.csv) lies on that class's
square. Chance is the square's share of the image: where a peak placed at random would land.

Two rows, from the same trained model and the same overlays: the heatmaps as experiments/evaluation/heatmaps.py makes
them, and, for comparison, plain Grad-CAM (channel weights, the mean gradient) at the model's last spatial map, written
here on its own.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import measure, record

NAME = "heatmaps"
PROJECT = Path(__file__).resolve().parent.parent


def _train(run_dir):
    result = subprocess.run([sys.executable, "run.py", "dataset=chest_xray", f"hydra.run.dir={run_dir}"],
                            cwd=PROJECT, capture_output=True, text=True, timeout=3600,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if result.returncode:
        raise RuntimeError(f"training the chest default exited {result.returncode}: {result.stderr[-2000:]}")


@contextlib.contextmanager
def _last_map_grad_cam():
    """experiments/evaluation/heatmaps.py's LayerCam computing plain Grad-CAM at the model's last spatial map
    instead."""
    import keras
    import tensorflow as tf

    from tf_harness.experiments.evaluation import heatmaps

    def last_map(model):
        for layer in reversed(model.layers):
            output = getattr(layer, "output", None)
            pool = isinstance(layer, (keras.layers.MaxPooling2D, keras.layers.AveragePooling2D))
            if not pool and output is not None and len(output.shape) == 4:
                return layer
        raise ValueError("no spatial layer")

    def grad_cam(self, images, classes):
        images = tf.convert_to_tensor(images, tf.float32)
        with tf.GradientTape() as tape:
            maps, logits = self.model(images, training=False)
            scores = tf.gather(tf.cast(logits, tf.float32), tf.constant(classes, tf.int32), batch_dims=1)
        gradients, maps = tf.cast(tape.gradient(scores, maps), tf.float32), tf.cast(maps, tf.float32)
        weights = tf.reduce_mean(gradients, axis=[1, 2], keepdims=True)
        cams = tf.nn.relu(tf.reduce_sum(maps * weights, axis=-1, keepdims=True))
        cams = cams / tf.maximum(tf.reduce_max(cams, axis=[1, 2, 3], keepdims=True), 1e-12)
        return tf.image.resize(cams, tf.shape(images)[1:3])[..., 0].numpy()

    kept = heatmaps.feature_layer, heatmaps.LayerCam.__call__
    heatmaps.feature_layer, heatmaps.LayerCam.__call__ = last_map, grad_cam
    try:
        yield
    finally:
        heatmaps.feature_layer, heatmaps.LayerCam.__call__ = kept


def localisation(run_dir):
    """(true-positive overlays, peaks on the finding's square) of the run's heatmaps/index.csv."""
    import pandas as pd

    from tf_harness.data.samples.chest_xray import _GRID, _PATCH, FINDINGS, SIZE

    index = pd.read_csv(Path(run_dir) / "heatmaps" / "index.csv")
    labels = pd.read_csv(Path(run_dir) / "predictions.csv").set_index("path")
    positives = on_square = 0
    for row in index.itertuples(index=False):
        if labels.loc[row.path, f"label/{row[2]}"] != 1:  # row[2]: the class
            continue
        positives += 1
        top, left = _GRID[FINDINGS.index(row[2])]
        # The peak's pixel centre, in the sample's own pixels.
        y, x = ((row.peak_row + 0.5) * SIZE / row.height, (row.peak_column + 0.5) * SIZE / row.width)
        on_square += top <= y < top + _PATCH and left <= x < left + _PATCH
    return positives, on_square


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks {NAME}", description=__doc__,
                                     formatter_class=measure.Help)
    parser.add_argument("--run", type=Path, help="a trained chest default run directory (default: train one)")
    parser.add_argument("--overlays", type=int, default=400,
                        help="heatmaps=N: enough to hold every finding of the test split (default 400)")
    args = parser.parse_args(argv)
    from tf_harness.data.samples.chest_xray import _PATCH, SIZE
    from tf_harness.experiments import api

    chance = (_PATCH / SIZE) ** 2
    with record.recorded(NAME, argv, devices=False), tempfile.TemporaryDirectory() as folder:
        run_dir = args.run or Path(folder) / "run"
        if args.run is None:
            print("training the chest default (python run.py dataset=chest_xray) ...", flush=True)
            _train(run_dir)
        rows = []
        for label, patched in (("experiments/evaluation/heatmaps.py (LayerCAM)", contextlib.nullcontext),
                               ("Grad-CAM at the last spatial map", _last_map_grad_cam)):
            with patched():
                api.run(["mode=predict", f"heatmaps={args.overlays}"], run_dir=str(run_dir))
            positives, on_square = localisation(run_dir)
            rows.append((label, positives, on_square))
        auc = json.loads((Path(run_dir) / "metrics.json").read_text()).get("auc/mean", float("nan"))
        print(f"\nchest default (ResNet-v2-152, 64 px), test split; the run's validation auc/mean {auc:.4f}; "
              f"chance = ({_PATCH}/{SIZE})^2 = {chance:.3f}\n")
        print("| heatmap | true-positive overlays | peak on the finding's square | share | share / chance |")
        print("|---|---|---|---|---|")
        for label, positives, on_square in rows:
            share = on_square / positives if positives else float("nan")
            print(f"| {label} | {positives} | {on_square} | {share:.1%} | {share / chance:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
