"""The HParams dashboard shows the sweep: swept keys first with their domains, ints as ints, one session per run
directory, and every task's metric columns, read back with TensorBoard's own reader."""
from hydra.types import RunMode
from omegaconf import OmegaConf
from tensorboard.plugins.hparams import api_pb2, metadata

from tests.conftest import compose, event_tags


def hydra_config(sweep_dir, choices, task_overrides, params=None):
    """A multirun job's Hydra settings, as HydraConfig.get() holds them, and its sweep's multirun.yaml."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save({"hydra": {"overrides": {"task": task_overrides}}}, sweep_dir / "multirun.yaml")
    return OmegaConf.create({"mode": RunMode.MULTIRUN, "sweep": {"dir": str(sweep_dir)},
                             "sweeper": {"params": params}, "runtime": {"choices": choices}})


def record(run_dir, task, cfg, hydra_cfg):
    from tf_harness.experiments.summaries import Summaries
    Summaries(str(run_dir)).hparams(cfg, task, hydra_cfg)
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
    experiment, start = record(tmp_path / "sweep" / "1", "binary", cfg, hydra_cfg)
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
    experiment, start = record(tmp_path / "sweep" / "0", "multilabel", compose("dataset=chest_xray"), hydra_cfg)
    infos = {info.name: info for info in experiment.hparam_infos}
    assert infos["dataset"].differs
    assert [v.string_value for v in infos["dataset"].domain_discrete.values] == ["chest_xray", "lfw_pairs"]
    assert start.hparams["dataset"].string_value == "chest_xray"


def test_each_run_directory_is_its_own_session_even_with_the_same_values(tmp_path):
    starts = []
    for sweep in ("sweep-a", "sweep-b"):
        hydra_cfg = hydra_config(tmp_path / sweep, {"dataset": "lfw_pairs"}, ["seed=1,2"])
        starts.append(record(tmp_path / sweep / "0", "binary", compose("dataset=lfw_pairs", "seed=1"), hydra_cfg)[1])
    assert starts[0].hparams == starts[1].hparams
    assert starts[0].group_name == str(tmp_path / "sweep-a" / "0")
    assert starts[1].group_name == str(tmp_path / "sweep-b" / "0")


def test_every_run_declares_every_task_metric_own_first_with_its_run_group(tmp_path):
    """TensorBoard reads one run's columns for a whole log dir: a log dir with two datasets keeps both."""
    hydra_cfg = OmegaConf.create({"mode": RunMode.RUN})
    columns = {}
    for dataset, task in (("chest_xray", "multilabel"), ("lfw_pairs", "binary"), ("imagenet_det", "multiclass")):
        experiment, _ = record(tmp_path / dataset, task, compose(f"dataset={dataset}"), hydra_cfg)
        columns[dataset] = [(info.name.group, info.name.tag, info.dataset_type) for info in experiment.metric_infos]
    validation, train = api_pb2.DATASET_VALIDATION, api_pb2.DATASET_TRAINING
    assert columns["chest_xray"] == [("validation", "auc/mean", validation), ("validation", "loss", validation),
                                     ("train", "loss", train), ("validation", "accuracy", validation),
                                     ("validation", "top5_accuracy", validation)]
    assert columns["lfw_pairs"][:3] == [("validation", "accuracy", validation), ("validation", "loss", validation),
                                        ("train", "loss", train)]
    assert columns["imagenet_det"][:2] == [("validation", "accuracy", validation),
                                           ("validation", "top5_accuracy", validation)]
    # The dashboard shows the first five metric columns: all of them.
    assert all(sorted(found) == sorted(columns["chest_xray"]) and len(found) == 5 for found in columns.values())


def test_a_single_run_marks_nothing_as_swept(tmp_path):
    experiment, _ = record(tmp_path / "run", "binary", compose("dataset=lfw_pairs"),
                           OmegaConf.create({"mode": RunMode.RUN}))
    assert not any(info.differs for info in experiment.hparam_infos)


def test_a_sweep_spec_that_does_not_parse_marks_nothing_and_does_not_stop_the_run(tmp_path, caplog):
    hydra_cfg = hydra_config(tmp_path / "sweep", {"dataset": "lfw_pairs"}, ["trainer.learning_rate=choice(0.1,"])
    experiment, start = record(tmp_path / "sweep" / "0", "binary", compose("dataset=lfw_pairs"), hydra_cfg)
    assert not any(info.differs for info in experiment.hparam_infos)
    assert start.hparams["trainer.learning_rate"].number_value == 0.001
    assert "do not parse" in caplog.text
