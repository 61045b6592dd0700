"""The combination matrix: every dataset x each model family that fits it x every pipeline.dtype, trained with every
recipe that fits the dataset, then taken through every mode; and the combinations a dataset refuses.

Everything here is derived from the declarations, so that a new dataset (TASKS), model family (BUILDERS), dtype
(`pipeline.dtype`'s choices), recipe (a key declared with `recipe=`) or mode (MODES) joins the matrix with no new
test:

- a cell is (dataset, the cheapest model of a family whose inputs fit it, dtype), the cells covering every pair of
  the three (`cells`); it trains with every recipe whose `fits` takes the dataset's kind of task switched on at its
  declared `on` value, and is taken through every mode;
- a refused cell is a recipe on a dataset of a kind it does not fit, a model whose inputs the dataset does not
  give, or heatmaps on a dataset of pairs: each is the one config-error line naming the key.

`TrainedRuns` trains each cell once per test session, in this process, through the session's shared runs
(tests/shared_runs.py: experiments/api.py, the command line's own path), so that every test reading it shares it.
"""
import csv
import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import yaml

from tf_harness.data import TASKS
from tf_harness.experiments.config.config_keys import DECLARED, MIN_RESAMPLES, MODES, RECIPES
from tf_harness.experiments.evaluation import metrics
from tf_harness.models import BUILDERS

CONF = Path(__file__).resolve().parents[1] / "conf"

# A tiny network of each model family, at the smoke experiment's 32 px: a cell is about the plumbing, not a model.
TINY = {
    "tf_harness.models.semi_alexnet:build": ("model.filters=[2,2,2,2,2]", "model.dense_units=4"),
    "tf_harness.models.siamese_cnn:build": ("model.widths=[2,2]", "model.embedding_size=4", "model.head_units=4"),
    "tf_harness.models.resnet_v2:build": (),  # keras.applications' ResNet-v2: 32 px is its smallest image
}
# How far an export's probabilities may be from predictions.csv's, per pipeline.dtype (docs/serving.md): in float16
# the dtype's own epsilon (2**-10), since its sums round in another order at another batch size.
TOLERANCE = 1e-4
BOUNDS = {"float32": TOLERANCE, "float16": 1e-3, "bfloat16": 5e-3}
# Every cell: the smoke experiment's few steps, few bootstrap resamples, a checkpoint at each evaluation.
COMMON = ("experiment=smoke", f"evaluation.bootstrap={MIN_RESAMPLES}")
HEATMAPS = 3  # overlays mode=predict writes where the dataset has single images
RESUMED_STEPS = 6  # mode=train goes on from the smoke experiment's 4 steps to this


def dtypes() -> tuple:
    return DECLARED["pipeline.dtype"].metadata["check"].choices


def families(dataset) -> list:
    """The first model (registry order: the smallest) of each model family whose inputs fit `dataset`, the family
    of the dataset's default model first."""
    chosen = {}
    for name, entry in BUILDERS.entries.items():
        if entry.inputs == TASKS.inputs(dataset):
            chosen.setdefault(entry.path, name)
    default = BUILDERS.entries[default_model(dataset)].path
    return [chosen[default], *(name for path, name in chosen.items() if path != default)]


def default_model(dataset) -> str:
    """The model conf/dataset/<dataset>.yaml chooses."""
    defaults = yaml.safe_load((CONF / "dataset" / f"{dataset}.yaml").read_text())["defaults"]
    return next(entry["override /model"] for entry in defaults if isinstance(entry, dict) and "override /model" in entry)


def fitting_recipes(dataset) -> tuple:
    """The recipe keys that fit `dataset`'s kind of task."""
    kind = TASKS.entries[dataset].task
    return tuple(key for key, recipe in RECIPES.items() if not recipe.fits or kind in recipe.fits)


def override(key, value) -> str:
    """`key=value` as the command line writes it (mappings and lists in Hydra's flow syntax)."""
    def shown(item):
        if isinstance(item, bool):
            return str(item).lower()
        if isinstance(item, dict):
            return "{" + ",".join(f"{name}:{shown(inner)}" for name, inner in item.items()) + "}"
        if isinstance(item, list):
            return "[" + ",".join(shown(inner) for inner in item) + "]"
        return str(item)
    return f"{key}={shown(value)}"


@dataclasses.dataclass(frozen=True)
class Cell:
    dataset: str
    model: str
    dtype: str

    @property
    def id(self) -> str:
        return f"{self.dataset}-{self.model}-{self.dtype}"

    @property
    def recipes(self) -> tuple:
        return fitting_recipes(self.dataset)

    @property
    def single(self) -> bool:
        return TASKS.inputs(self.dataset) == "single"

    @property
    def test_split(self) -> bool:
        return TASKS.entries[self.dataset].test is not None

    def overrides(self) -> list:
        return [f"dataset={self.dataset}", f"model={self.model}", *COMMON, *TINY[BUILDERS.entries[self.model].path],
                f"pipeline.dtype={self.dtype}", *(override(key, RECIPES[key].on) for key in self.recipes),
                *self.protocol_best()]

    def protocol_best(self) -> list:
        """A dataset's first protocol metric as trainer.best_metric, measured on the whole validation split."""
        names = metrics.protocol_names(self.dataset)
        return [f"trainer.best_metric={names[0]}", "trainer.eval_steps=null"] if names else []


def cells() -> list:
    """A covering of every pair of (dataset, model family, dtype): each dataset's default family with every dtype,
    and each other family that fits it once, with a 16-bit dtype taken in turn. Every mode runs in every cell."""
    found, turn = [], 0
    for dataset in TASKS:
        default, *others = families(dataset)
        found += [Cell(dataset, default, dtype) for dtype in dtypes()]
        for model in others:
            sixteen = [dtype for dtype in dtypes() if dtype != "float32"]
            found.append(Cell(dataset, model, sixteen[turn % len(sixteen)]))
            turn += 1
    return found


def refused() -> list:
    """(dataset, the overrides, the key the refusal names) of each combination a dataset refuses."""
    found = []
    for dataset in TASKS:
        kind = TASKS.entries[dataset].task
        for key, recipe in RECIPES.items():
            if recipe.fits and kind not in recipe.fits:
                found.append((dataset, [override(key, recipe.on)], key))
        for model, entry in BUILDERS.entries.items():
            if entry.inputs != TASKS.inputs(dataset):
                found.append((dataset, [f"model={model}"], f"model={model}"))
        if TASKS.inputs(dataset) != "single":
            found.append((dataset, ["mode=predict", f"heatmaps={HEATMAPS}"], f"heatmaps={HEATMAPS}"))
    return found


# The modes a cell is taken through after its training, in order, each with its overrides. A mode declared in
# config_keys.MODES that is not here fails tests/test_matrix.py's completeness test.
def mode_steps(cell) -> list:
    """(mode, overrides) after train_and_evaluate: train goes on to RESUMED_STEPS, continuous_eval evaluates that
    unevaluated checkpoint, evaluate reads each split, predict writes heatmaps where it can, export last."""
    steps = [("train", [f"trainer.train_steps={RESUMED_STEPS}"]),
             ("continuous_eval", [f"trainer.train_steps={RESUMED_STEPS}", "trainer.eval_timeout=60"]),
             ("evaluate", []),
             *([("evaluate", ["split=test"])] if cell.test_split else []),
             ("predict", [f"heatmaps={HEATMAPS}"] if cell.single else []),
             ("export", [])]
    return [(mode, [f"mode={mode}", *extra]) for mode, extra in steps]


def finite_numbers(record, where="", notes=None):
    """Asserts that every number in a metrics record (nested lists included) is finite, but a null or NaN (or its
    `/std`) whose record (or `notes`, the record of the same evaluation) says why (`<name>/null_because`); returns
    how many."""
    notes = record if notes is None else notes
    count = 0
    for name, value in record.items():
        if (value is None or value != value) and f"{name.removesuffix('/std')}/null_because" in notes:
            continue
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                assert math.isfinite(item), f"{where}{name}={value} is not finite"
                count += 1
    return count


def class_columns(columns) -> list:
    """The columns of a predictions.csv that hold a class's probability: all but the paths, what describes the
    example and the labels."""
    described = ("path", "path_a", "path_b", "global_step", "split", "fold", "patient_id")
    return [column for column in columns if column not in described and not column.startswith("label")]


def served_difference(export_dir, predictions_csv) -> tuple:
    """(the largest absolute difference between the export's probabilities for predictions.csv's files and the
    file's own, rows compared), the export loaded with TensorFlow alone."""
    import tensorflow as tf

    serve = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    with open(predictions_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    inputs = sorted(serve.structured_input_signature[1])
    columns = {"image_bytes": "path", "image_bytes_a": "path_a", "image_bytes_b": "path_b"}
    classes = class_columns(rows[0])
    expected = np.array([[float(row[c]) for c in classes] for row in rows])
    kept = ~np.isnan(expected).any(axis=1)
    feed = {name: tf.constant([Path(row[columns[name]]).read_bytes() for row, keep in zip(rows, kept) if keep])
            for name in inputs}
    got = serve(**feed)["probabilities"].numpy()
    return float(np.abs(got - expected[kept]).max()), int(kept.sum())


class TrainedRuns:
    """Each cell's run, trained once in the session's shared runs (tests/shared_runs.py): `get` returns its run
    directory, which no test changes; `walked` a copy of it taken through mode_steps, with what each step returned."""

    def __init__(self, shared, root):
        self.shared, self.root, self.walks = shared, Path(root), {}

    def get(self, cell) -> Path:
        return self.shared.trained(*cell.overrides())

    def walked(self, cell) -> tuple:
        """(the copy's run directory, [(mode, overrides, the metrics api.run returned)]). A step that raises
        raises here, naming the step."""
        if cell not in self.walks:
            from tf_harness.experiments import api
            copy = self.shared.copy(*cell.overrides(), to=self.root / cell.id)
            done = []
            for mode, overrides in mode_steps(cell):
                try:
                    started = time.monotonic()
                    done.append((mode, overrides, api.run(overrides, run_dir=str(copy))))
                    print(f"{cell.id}: {' '.join(overrides)} in {time.monotonic() - started:.1f} s")
                except Exception as error:
                    raise AssertionError(f"{cell.id}: {' '.join(overrides)} failed: {error}") from error
            self.walks[cell] = copy, done
        return self.walks[cell]
