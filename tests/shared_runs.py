"""Runs trained once per test session, in this process, for every test that reads one.

`SharedRuns.trained(*overrides)` trains `overrides` into the session's folder the first time it is asked for them,
through experiments/api.py (the command line's own path: .hydra/, run.log, checkpoints, events, metrics.json), and
gives the same run directory to every later caller, which must not change it; `copy(*overrides, to=...)` gives a
copy a test may change. A test starts `python run.py` itself only where the process is what it tests.
"""
import shutil
import time
from pathlib import Path


# A tiny run of each dataset, at the smoke experiment's few steps: the runs tests share where the model is not
# what they test.
SMOKE = {
    "chest_xray": ("dataset=chest_xray", "experiment=smoke", "model=semi_alexnet", "model.filters=[2,2,2,2,2]",
                   "model.dense_units=4"),
    "lfw_pairs": ("dataset=lfw_pairs", "experiment=smoke", "model.widths=[2,2]", "model.embedding_size=4",
                  "model.head_units=4"),
    "imagenet_det": ("dataset=imagenet_det", "experiment=smoke", "model.filters=[2,2,2,2,2]", "model.dense_units=4"),
}


class SharedRuns:
    def __init__(self, root):
        self.root, self.runs = Path(root), {}

    def trained(self, *overrides) -> Path:
        """The run directory of `overrides`, trained once (api.run raises what the run raised)."""
        if overrides not in self.runs:
            from tf_harness.experiments import api

            run_dir, started = self.root / f"run-{len(self.runs)}", time.monotonic()
            api.run(list(overrides), run_dir=str(run_dir))
            print(f"shared run {run_dir.name} ({' '.join(overrides)}): trained in {time.monotonic() - started:.1f} s")
            self.runs[overrides] = run_dir
        return self.runs[overrides]

    def copy(self, *overrides, to) -> Path:
        """A copy at `to` of the run directory of `overrides`, for a test that changes it."""
        shutil.copytree(self.trained(*overrides), to)
        return Path(to)
