"""The HParams dashboard shows the sweep: swept keys first with their domains, ints as ints, one session per run
directory under a short trial id, the metric columns the run's dataset writes, and how each job ended, read back
with TensorBoard's own reader."""
import numpy as np
import pytest
from hydra.types import RunMode
from omegaconf import OmegaConf
from tensorboard.plugins.hparams import api_pb2, metadata

from tests.conftest import compose, event_tags


def hydra_config(sweep_dir, choices, task_overrides, params=None):
    """A multirun job's Hydra settings, as HydraConfig.get() holds them, and its sweep's multirun.yaml."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save({"hydra": {"overrides": {"task": task_overrides}}}, sweep_dir / "multirun.yaml")
    return OmegaConf.create({"mode": RunMode.MULTIRUN, "sweep": {"dir": str(sweep_dir)},
                             "sweeper": {"params": params}, "runtime": {"choices": choices, "output_dir": "."}})


SINGLE = OmegaConf.create({"mode": RunMode.RUN, "runtime": {"choices": {}, "output_dir": "."}})  # a single run's


def record(run_dir, cfg, hydra_cfg):
    from tf_harness.data import TASKS
    from tf_harness.experiments.config.settings import Job, Settings
    from tf_harness.experiments.summaries import Summaries
    Summaries(str(run_dir)).hparams(Settings.from_config(cfg), TASKS[cfg.dataset.name].SPEC, Job.from_hydra(hydra_cfg))
    accumulator, _ = event_tags(run_dir)
    experiment = metadata.parse_experiment_plugin_data(
        accumulator.SummaryMetadata(metadata.EXPERIMENT_TAG).plugin_data.content)
    start = metadata.parse_session_start_info_plugin_data(
        accumulator.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content)
    return experiment, start


def test_the_swept_keys_lead_with_their_domains_and_ints_stay_ints(tmp_path):
    sweep = ["dataset=lfw_pairs", "experiment=smoke", "trainer.learning_rate=0.001,0.01", "pipeline.batch_size=4,16,8"]
    hydra_cfg = hydra_config(tmp_path / "sweep", {"dataset": "lfw_pairs"}, sweep,
                             params={"seed": "range(1,3)", "trainer.momentum": "interval(0.5, 0.99)"})
    cfg = compose("dataset=lfw_pairs", "experiment=smoke", "trainer.learning_rate=0.01", "pipeline.batch_size=16")
    experiment, start = record(tmp_path / "sweep" / "1", cfg, hydra_cfg)
    infos = {info.name: info for info in experiment.hparam_infos}
    swept = {"trainer.learning_rate", "pipeline.batch_size", "seed", "trainer.momentum"}
    assert {name for name, info in infos.items() if info.differs} == swept
    # Swept values: discrete; ints listed as ints, in numeric order.
    assert [v.number_value for v in infos["trainer.learning_rate"].domain_discrete.values] == [0.001, 0.01]
    assert [v.string_value for v in infos["pipeline.batch_size"].domain_discrete.values] == ["4", "8", "16"]
    assert [v.string_value for v in infos["seed"].domain_discrete.values] == ["1", "2"]
    # An interval sweep: an interval.
    assert (infos["trainer.momentum"].domain_interval.min_value,
            infos["trainer.momentum"].domain_interval.max_value) == (0.5, 0.99)
    # The run's values: its own; ints as their digits (TensorBoard prints numbers as `16.000`).
    assert start.hparams["trainer.learning_rate"].number_value == 0.01
    assert start.hparams["pipeline.batch_size"].string_value == "16"
    assert start.hparams["trainer.train_steps"].string_value == "4"
    assert start.hparams["trainer.momentum"].number_value == 0.9
    # The full config stays available, without a domain that would filter other runs out.
    assert {"model.name", "pipeline.image_size", "trainer.optimizer", "dataset.name"} <= set(infos)
    assert start.hparams["pipeline.image_size"].string_value == "32"
    assert not infos["model.name"].HasField("domain_discrete") and not infos["model.name"].differs


def test_a_swept_config_group_is_a_column_of_its_options(tmp_path):
    hydra_cfg = hydra_config(tmp_path / "sweep", {"dataset": "chest_xray", "model": "resnet_v2_50"},
                             ["dataset=chest_xray,lfw_pairs", "experiment=smoke"])
    experiment, start = record(tmp_path / "sweep" / "0", compose("dataset=chest_xray"), hydra_cfg)
    infos = {info.name: info for info in experiment.hparam_infos}
    assert infos["dataset"].differs
    assert [v.string_value for v in infos["dataset"].domain_discrete.values] == ["chest_xray", "lfw_pairs"]
    assert start.hparams["dataset"].string_value == "chest_xray"


def test_each_run_directory_is_its_own_session_under_a_short_trial_id_even_with_the_same_values(tmp_path):
    """The Trial ID column (10em) showed `/tmp/…` on every row; repeated sweeps with the same values stay apart."""
    starts = []
    for sweep in ("sweep-a", "2025-05-01/14-03-22_a1b2c3"):
        hydra_cfg = hydra_config(tmp_path / sweep, {"dataset": "lfw_pairs"}, ["seed=1,2"])
        starts.append(record(tmp_path / sweep / "0", compose("dataset=lfw_pairs", "seed=1"), hydra_cfg)[1])
    assert starts[0].hparams == starts[1].hparams
    # The job number first: the column shows about 16 characters.
    assert [start.group_name for start in starts] == ["0 · sweep-a", "0 · 14-03-22_a1b2c3"]


def test_a_single_run_s_trial_id_is_its_folder_name(tmp_path):
    run_dir = tmp_path / "2025-05-01" / "14-03-22_lfw_pairs_a1b2c3"
    _, start = record(run_dir, compose("dataset=lfw_pairs"), SINGLE)
    assert start.group_name == "14-03-22_lfw_pairs_a1b2c3"


def columns_of(experiment):
    return [(info.name.group, info.name.tag, info.dataset_type) for info in experiment.metric_infos]


VALIDATION, TRAIN, UNKNOWN = api_pb2.DATASET_VALIDATION, api_pb2.DATASET_TRAINING, api_pb2.DATASET_UNKNOWN
SHARED = [("validation", "loss", VALIDATION), ("train", "loss", TRAIN), ("", "exit_status", UNKNOWN)]


PROTOCOL = ["eer", "tar_at_far_1e-2", "tar_at_far_1e-3"]


@pytest.mark.parametrize("dataset, own, protocol", [("chest_xray", ["auc/mean"], []),
                                                    ("lfw_pairs", ["accuracy", "auc"], PROTOCOL),
                                                    ("imagenet_det", ["accuracy", "top5_accuracy"], [])])
def test_a_run_declares_only_the_metrics_its_dataset_writes(tmp_path, dataset, own, protocol):
    """Parallel coordinates draws no line for a run without a value in a ticked column: a single-dataset sweep drew
    none while every run declared `auc/mean` and `top5_accuracy`. TensorBoard ticks the first five columns: the
    metrics every evaluation writes; the protocol metrics, which only a whole split's evaluation writes, follow."""
    experiment, _ = record(tmp_path / dataset, compose(f"dataset={dataset}"), SINGLE)
    assert columns_of(experiment) == ([("validation", tag, VALIDATION) for tag in own] + SHARED
                                      + [("validation", tag, VALIDATION) for tag in protocol])
    assert len(own + SHARED) <= 5


@pytest.mark.parametrize("dataset", ["chest_xray", "lfw_pairs", "imagenet_det"])
def test_the_declared_metrics_are_those_every_evaluation_writes_headline_first(dataset):
    """The columns follow experiments/evaluation/metrics.py: each one is in every evaluation's values, the first is the
    headline metric (what a sweep compares)."""
    from tf_harness.data import TASKS
    from tf_harness.experiments.evaluation import metrics
    spec = TASKS[dataset].SPEC
    rng = np.random.default_rng(0)
    classes = len(spec.class_names)
    labels = (rng.integers(0, 2, (64, classes)) if spec.task == "multilabel" else
              rng.integers(0, 2, 64) if spec.task == "binary" else rng.integers(0, classes, 64))
    written = metrics.evaluate(spec.task, spec.class_names, labels, rng.normal(size=(64, classes)))
    assert set(metrics.names(spec.task)) <= set(written)
    assert metrics.names(spec.task)[0] == metrics.headline(spec.task)


def test_a_sweep_over_datasets_declares_each_swept_dataset_s_metrics_own_first(tmp_path):
    """TensorBoard takes the first run's columns for the whole log dir: each dataset's keep a column."""
    hydra_cfg = hydra_config(tmp_path / "sweep", {"dataset": "chest_xray"}, ["dataset=chest_xray,lfw_pairs"])
    experiment, _ = record(tmp_path / "sweep" / "0", compose("dataset=chest_xray"), hydra_cfg)
    assert columns_of(experiment) == [("validation", "auc/mean", VALIDATION)] + SHARED + [
        ("validation", tag, VALIDATION) for tag in ["accuracy", "auc", *PROTOCOL]]


def test_a_job_s_end_is_its_session_status_and_exit_status_and_the_last_job_s_counts(tmp_path):
    """The dashboard reads a run's first session-end record: a later job's replaces the earlier one's."""
    from tf_harness.experiments.sweeps.hparams import EXIT_STATUS, SESSION_END, mark_session
    run_dir = tmp_path / "run"
    record(run_dir, compose("dataset=lfw_pairs"), SINGLE)
    (run_dir / "metrics.json").write_text('{"global_step": 4}')
    for status, expected in ((1, api_pb2.STATUS_FAILURE), (0, api_pb2.STATUS_SUCCESS)):
        mark_session(run_dir, status)
        accumulator, tags = event_tags(run_dir)
        end = metadata.parse_session_end_info_plugin_data(
            accumulator.SummaryMetadata(metadata.SESSION_END_INFO_TAG).plugin_data.content)
        assert end.status == expected
        assert [(event.step, event.value) for event in accumulator.Scalars(EXIT_STATUS)] == [(4, status)]
        assert len(list(run_dir.glob(f"events.out.tfevents.*{SESSION_END}"))) == 1
    assert not list(run_dir.glob(".*partial"))
    # The session-end file alone is no HParams record: a re-entry writes a deleted record again.
    from tf_harness.experiments.sweeps.hparams import has_record
    assert has_record(run_dir)
    for path in run_dir.glob("events.out.tfevents.*"):
        if not path.name.endswith(SESSION_END):
            path.unlink()
    assert not has_record(run_dir)


def test_a_single_run_marks_nothing_as_swept(tmp_path):
    experiment, _ = record(tmp_path / "run", compose("dataset=lfw_pairs"),
                           SINGLE)
    assert not any(info.differs for info in experiment.hparam_infos)


def test_a_sweep_spec_that_does_not_parse_marks_nothing_and_does_not_stop_the_run(tmp_path, caplog):
    hydra_cfg = hydra_config(tmp_path / "sweep", {"dataset": "lfw_pairs"}, ["trainer.learning_rate=choice(0.1,"])
    experiment, start = record(tmp_path / "sweep" / "0", compose("dataset=lfw_pairs"), hydra_cfg)
    assert not any(info.differs for info in experiment.hparam_infos)
    assert start.hparams["trainer.learning_rate"].number_value == 0.001
    assert "do not parse" in caplog.text
