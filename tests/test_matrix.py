"""Every combination runs: each dataset x model family x pipeline.dtype, trained with every recipe that fits it,
then taken through every mode, and each combination a dataset refuses is refused in one line (tests/matrix.py
derives both tables from the declarations).

The cells train in this process, once per session, into shared run directories; each mode runs on a copy.
"""
import json
import math

import pandas as pd
import pytest

from tests import matrix
from tests.refusals import raises_naming
from tf_harness.data import TASKS
from tf_harness.experiments import api
from tf_harness.experiments import compare as compare_module
from tf_harness.experiments.evaluation import metrics
from tf_harness.experiments.config.config_keys import MODES, RECIPES
from tf_harness.experiments.evaluator import predicted_split
from tf_harness.models import BUILDERS

CELLS = matrix.cells()
REFUSED = matrix.refused()


@pytest.fixture(scope="session")
def trained_runs(shared_runs, tmp_path_factory):
    return matrix.TrainedRuns(shared_runs, tmp_path_factory.mktemp("matrix"))


def test_the_matrix_covers_every_pair_of_dataset_family_and_dtype_and_takes_every_recipe_and_mode():
    family = {name: BUILDERS.entries[name].path for name in BUILDERS}
    fitting = {(dataset, family[model]) for dataset in TASKS for model in BUILDERS
               if BUILDERS.entries[model].inputs == TASKS.inputs(dataset)}
    assert {(cell.dataset, family[cell.model]) for cell in CELLS} == fitting
    assert {(cell.dataset, cell.dtype) for cell in CELLS} == {(d, t) for d in TASKS for t in matrix.dtypes()}
    assert {(family[cell.model], cell.dtype) for cell in CELLS} == {(f, t) for f in set(family.values())
                                                                    for t in matrix.dtypes()}
    assert set(matrix.dtypes()) == {"float32", "float16", "bfloat16"}
    for dataset in TASKS:  # the default model's family in every dtype
        default = family[matrix.default_model(dataset)]
        assert {cell.dtype for cell in CELLS if cell.dataset == dataset and family[cell.model] == default} \
            == set(matrix.dtypes())
    assert {key for cell in CELLS for key in cell.recipes} == set(RECIPES)
    assert {key for _, _, key in REFUSED} >= {key for key, recipe in RECIPES.items() if recipe.fits}
    for cell in CELLS:  # every mode, the training one included, is a step of every cell
        assert {"train_and_evaluate"} | {mode for mode, _ in matrix.mode_steps(cell)} == set(MODES), cell.id
    print(f"{len(CELLS)} cells trained and taken through {len(MODES)} modes; {len(REFUSED)} combinations refused")


@pytest.mark.parametrize("dataset, overrides, named", REFUSED, ids=[f"{d}-{' '.join(o)}" for d, o, _ in REFUSED])
def test_a_combination_a_dataset_refuses_is_one_config_error_naming_its_key(dataset, overrides, named, tmp_path):
    with raises_naming(api.RunConfigError, named.partition("=")[0], f"dataset={dataset}"):
        api.run([f"dataset={dataset}", "experiment=smoke", *overrides], run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def _check_trained(cell, run_dir, step):
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["global_step"] <= step and matrix.finite_numbers(record) > 2
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert lines and all(matrix.finite_numbers(json.loads(line)) for line in lines)
    assert (run_dir / "skipped.csv").read_text().startswith("path,reason")
    assert list((run_dir / "checkpoints").glob("ckpt-*.index"))
    assert list((run_dir / "train").glob("events.out.tfevents.*"))
    assert list((run_dir / "validation").glob("events.out.tfevents.*"))
    if "trainer.keep_best" in cell.recipes:
        best = json.loads((run_dir / "best.json").read_text())
        for metric in metrics.protocol_names(cell.dataset)[:1]:  # the cell's trainer.best_metric (tests/matrix.py)
            values = {record["global_step"]: record[metric] for record in map(json.loads, lines)}
            chosen = min if metrics.lower_is_better(metric) else max
            assert best["metric"] == metric and values[best["global_step"]] == chosen(values.values()), (best, values)
    if "trainer.class_weights" in cell.recipes:
        assert (run_dir / "class_weights.json").is_file()
    import tensorflow as tf
    warned = "pipeline.dtype=float16 trains on CPU alone" in (run_dir / "run.log").read_text()
    assert warned == (cell.dtype == "float16" and not tf.config.list_logical_devices("GPU")), cell.id


def _check_step(cell, run_dir, mode, overrides, returned):
    where = f"{cell.id} {' '.join(overrides)}: "
    written = run_dir / ("metrics_test.json" if "split=test" in overrides else "metrics.json")
    matrix.finite_numbers(returned, where, notes=json.loads(written.read_text()) if written.is_file() else {})
    if mode == "train":
        assert returned["global_step"] == matrix.RESUMED_STEPS, where
        assert (run_dir / "checkpoints" / f"ckpt-{matrix.RESUMED_STEPS}.index").is_file(), where
    elif mode == "continuous_eval":
        assert returned["global_step"] == matrix.RESUMED_STEPS, where
        recorded = json.loads((run_dir / "metrics.json").read_text())
        assert recorded["global_step"] == matrix.RESUMED_STEPS and matrix.finite_numbers(recorded) > 2, where
    elif mode == "evaluate":
        record = json.loads(written.read_text())
        assert matrix.finite_numbers(record, where) > 2
        assert any(key.endswith("/ci95") for key in record), where
    elif mode == "predict":
        predictions = pd.read_csv(run_dir / "predictions.csv")
        scores = predictions[matrix.class_columns(predictions.columns)].to_numpy()
        assert len(predictions) and ((scores >= 0) & (scores <= 1)).all(), where
        if cell.single:
            index = pd.read_csv(run_dir / "heatmaps" / "index.csv")
            assert len(index) == matrix.HEATMAPS, where
            assert all((run_dir / "heatmaps" / name).is_file() for name in index.file), where
            assert index[["peak_row", "peak_column"]].notna().all().all(), where
    elif mode == "export":
        exported = sorted((run_dir / "export").iterdir())
        assert len(exported) == 1 and (exported[0] / "saved_model.pb").is_file(), where
        difference, rows = matrix.served_difference(exported[0], run_dir / "predictions.csv")
        print(f"{where}export reproduces {rows} rows of predictions.csv within {difference:.3g}")
        assert rows and difference <= matrix.BOUNDS[cell.dtype], where


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS, ids=[cell.id for cell in CELLS])
def test_a_cell_trains_with_its_recipes_and_every_mode_reads_it(cell, trained_runs):
    run_dir = trained_runs.get(cell)
    _check_trained(cell, run_dir, step=4)
    walked, steps = trained_runs.walked(cell)
    for mode, overrides, returned in steps:
        _check_step(cell, walked, mode, overrides, returned)


COMPARED = [cell for cell in CELLS if cell.dtype != "float32" and matrix.Cell(cell.dataset, cell.model, "float32") in CELLS]


@pytest.mark.slow
@pytest.mark.parametrize("cell", COMPARED, ids=[cell.id for cell in COMPARED])
def test_compare_reads_a_16_bit_cell_against_its_float32_one(cell, trained_runs, capsys):
    baseline = matrix.Cell(cell.dataset, cell.model, "float32")
    run_a, _ = trained_runs.walked(baseline)
    run_b, _ = trained_runs.walked(cell)
    split = predicted_split(cell.test_split)
    assert compare_module.main([str(run_a), str(run_b), "--split", split, "--resamples", "50"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[2:]]
    assert rows and all(math.isfinite(float(row[1])) and math.isfinite(float(row[2])) for row in rows)
