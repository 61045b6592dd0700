"""Warm start (trainer.init_checkpoint, trainer.init_exclude): a run starts from another run's weights where they
fit, with a fresh optimizer at global step 0, and says in one log line what it left out."""
import logging

import numpy as np
import pytest
import tensorflow as tf
from omegaconf import OmegaConf

from tests.conftest import compose, run_cli
from tests.refusals import assert_config_error, assert_names, raises_naming
from tf_harness.data.errors import ConfigError
from tf_harness.experiments.config import schema
from tf_harness.experiments.training import warm_start

TINY_ALEXNET = ("model=semi_alexnet", "pipeline.image_size=32", "pipeline.batch_size=4", "model.filters=[4,8,8,8,8]",
                "model.dense_units=8", "mode=train")
TINY_LFW = ("dataset=lfw_pairs", "pipeline.image_size=24", "pipeline.batch_size=8", "model.widths=[8,16]",
            "model.embedding_size=16", "model.head_units=8", "mode=train")
# The warm-started run trains one step at a rate too small to move a weight, so its checkpoint holds the trainable
# weights it started from (batch norm's moving statistics move regardless: they are not compared). Adam moves each
# weight by at most about the rate: a weight of 0 may become 1e-30, any other stays as it is in float32.
STILL = ("trainer.train_steps=1", "trainer.learning_rate=1e-30")


def _same(a, b):
    return a.shape == b.shape and np.allclose(a, b, rtol=0, atol=1e-25)


def _trained(run_dir, *args):
    result = run_cli(*args, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def _weights(run_dir):
    """{name: value} of the newest checkpoint's variables, by the names they were created with (conv2/kernel), read
    from the object graph; the optimizer's are under adam/."""
    prefix = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    reader = tf.train.load_checkpoint(prefix)
    from tensorflow.core.protobuf import trackable_object_graph_pb2
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return {attribute.full_name: reader.get_tensor(attribute.checkpoint_key) for node in graph.nodes
            for attribute in node.attributes if attribute.name == "VARIABLE_VALUE"}


def _trainable(weights):
    return {name for name in weights if name.endswith(("/kernel", "/bias", "/gamma", "/beta"))
            and not name.startswith("adam/")}


def _summary(run_dir):
    lines = [line for line in (run_dir / "run.log").read_text().splitlines() if "Warm start from" in line]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def det_run(tmp_path_factory):
    return _trained(tmp_path_factory.mktemp("det") / "run", "dataset=imagenet_det", *TINY_ALEXNET,
                    "trainer.train_steps=2")


@pytest.fixture(scope="module")
def lfw_run(tmp_path_factory):
    return _trained(tmp_path_factory.mktemp("lfw") / "run", *TINY_LFW, "trainer.train_steps=2")


@pytest.mark.slow  # whole training runs in subprocesses
def test_a_chest_run_starts_from_the_layers_of_a_det_run_that_fit(det_run, tmp_path):
    run_dir = _trained(tmp_path / "chest", "dataset=chest_xray", *TINY_ALEXNET, *STILL,
                       f"trainer.init_checkpoint={det_run}")
    source, warm = _weights(det_run), _weights(run_dir)
    # The global step and the optimizer started afresh: one step, one update, and ckpt-1 its only checkpoint.
    assert warm["global_step"] == 1 and warm["adam/iteration"] == 1 and source["adam/iteration"] == 2
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("*.index")) == ["ckpt-1.index"]
    # The first conv reads 1 channel here and 3 there, the head has 14 outputs here and 201 there.
    assert warm["conv1/kernel"].shape == (11, 11, 1, 4) and source["conv1/kernel"].shape == (11, 11, 3, 4)
    restored = _trainable(source) - {"conv1/kernel", "logits/kernel", "logits/bias"}
    assert {"conv2/kernel", "conv5/kernel", "conv1_bn/gamma", "fc6/kernel", "fc7/bias"} <= restored
    different = [name for name in sorted(restored) if not _same(source[name], warm[name])]
    assert not different, different
    assert _summary(run_dir).endswith(
        f"Warm start from {det_run}/checkpoints/ckpt-2: restored 28 of 31 model variables; excluded "
        "(trainer.init_exclude=null): 0; shape differs (checkpoint -> model): 3 (conv1/kernel 11x11x3x4 -> 11x11x1x4, "
        "logits/kernel 8x201 -> 8x14, logits/bias 201 -> 14); not in the checkpoint: 0; in the checkpoint only: 0; "
        "the optimizer and the global step start afresh")


@pytest.mark.slow  # end-to-end runs
def test_an_lfw_run_starts_from_every_weight_of_an_lfw_run(lfw_run, tmp_path):
    run_dir = _trained(tmp_path / "warm", *TINY_LFW, *STILL, f"trainer.init_checkpoint={lfw_run}/checkpoints/ckpt-2")
    source, warm = _weights(lfw_run), _weights(run_dir)
    names = _trainable(source)
    assert len(names) == 12 and names == _trainable(warm)
    different = [name for name in sorted(names) if not _same(source[name], warm[name])]
    assert not different, different
    assert "restored 16 of 16 model variables; excluded (trainer.init_exclude=null): 0; shape differs " \
           "(checkpoint -> model): 0; not in the checkpoint: 0; in the checkpoint only: 0;" in _summary(run_dir)


@pytest.mark.slow  # whole training runs in subprocesses
def test_init_exclude_leaves_the_head_fresh(lfw_run, tmp_path):
    run_dir = _trained(tmp_path / "warm", *TINY_LFW, *STILL, f"trainer.init_checkpoint={lfw_run}",
                       "trainer.init_exclude=logits")
    source, warm = _weights(lfw_run), _weights(run_dir)
    head = {"logits/kernel", "logits/bias"}
    assert all(not _same(source[name], warm[name]) for name in head)
    different = [name for name in sorted(_trainable(source) - head) if not _same(source[name], warm[name])]
    assert not different, different
    assert "restored 14 of 16 model variables; excluded (trainer.init_exclude=logits): 2 (logits/kernel, " \
           "logits/bias); shape differs" in _summary(run_dir)


def test_a_missing_init_checkpoint_is_one_config_error_line(tmp_path):
    from tf_harness.experiments import api
    missing = tmp_path / "nowhere" / "ckpt-6"
    with raises_naming(api.RunConfigError, f"trainer.init_checkpoint={missing} ", f"{missing}.index",
                       "<run>/checkpoints/ckpt-6"):
        api.run([*TINY_LFW, "trainer.train_steps=1", f"trainer.init_checkpoint={missing}"],
                run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # refused before the run recorded itself: no folder is left behind


@pytest.mark.slow  # whole training runs in subprocesses
def test_an_lfw_run_from_a_det_run_none_of_whose_variables_fit_is_refused_before_training(det_run, tmp_path):
    result = run_cli(*TINY_LFW, "trainer.train_steps=1", f"trainer.init_checkpoint={det_run}",
                     f"hydra.run.dir={tmp_path / 'run'}")
    assert_config_error(result, f"trainer.init_checkpoint={det_run}:", "16 variables", "model=siamese_cnn",
                        f"{det_run}/checkpoints/ckpt-2", alone=False)
    assert not (tmp_path / "run").exists()


# ----- in this process: where the init checkpoint comes from, what is matched -----------------------------------

def _checkpoint_of(model, prefix):
    tf.train.Checkpoint(model=model).write(str(prefix))
    return prefix


def test_a_warm_start_that_would_restore_nothing_is_a_config_error(tmp_path):
    """A DET run's semi-AlexNet shares no variable name with LFW's siamese CNN: the warm start would train from
    scratch, which nobody asking for one wants."""
    from tf_harness.data import imagenet_det, lfw_pairs
    from tf_harness.models import BUILDERS

    alexnet = BUILDERS["semi_alexnet"](compose("dataset=imagenet_det", *TINY_ALEXNET[:-1]).model,
                                       imagenet_det.SPEC, (32, 32))
    siamese = BUILDERS["siamese_cnn"](compose(*TINY_LFW[:-1]).model, lfw_pairs.SPEC, (24, 24))
    det = _checkpoint_of(alexnet, tmp_path / "det" / "ckpt-1")
    lfw = _checkpoint_of(siamese, tmp_path / "lfw" / "ckpt-1")

    def settings(init, exclude=None):
        return OmegaConf.create({"mode": "train", "model": {"name": "siamese_cnn"},
                                 "trainer": {"init_checkpoint": str(init), "init_exclude": exclude}})

    own = tmp_path / "run" / "checkpoints"
    with raises_naming(ConfigError, f"trainer.init_checkpoint={det}:", "16 variables", "model=siamese_cnn",
                       "2 differ in shape", "14 are not in the checkpoint", "conv1/kernel", "tower/conv0/kernel",
                       "trainer.init_checkpoint=null"):
        warm_start.check_fit(settings(det), own, siamese)
    warm_start.check_fit(settings(lfw), own, siamese)  # every variable fits
    with raises_naming(ConfigError, "16 are excluded", "trainer.init_exclude=."):
        warm_start.check_fit(settings(lfw, exclude="."), own, siamese)
    warm_start.check_fit(OmegaConf.merge(settings(det), {"mode": "evaluate"}), own, siamese)  # no warm start there
    own.mkdir(parents=True)
    (own / "ckpt-4.index").write_bytes(b"")  # the run's own checkpoint wins: the init checkpoint is not used
    warm_start.check_fit(settings(det), own, siamese)


def test_a_folder_without_checkpoints_or_an_unreadable_one_is_a_config_error(tmp_path):
    with raises_naming(ConfigError, f"trainer.init_checkpoint={tmp_path} ", "ckpt-N.index", tmp_path / "checkpoints"):
        warm_start.resolve((tmp_path / "checkpoints").mkdir() or tmp_path)
    (tmp_path / "checkpoints" / "ckpt-3.index").write_bytes(b"not a checkpoint")
    (tmp_path / "checkpoints" / "ckpt-3.data-00000-of-00001").write_bytes(b"nor this")
    with raises_naming(ConfigError, f"trainer.init_checkpoint={tmp_path}:", tmp_path / "checkpoints", "ckpt-3",
                       "cannot be read"):
        warm_start.resolve(tmp_path)
    with raises_naming(ConfigError, f"trainer.init_checkpoint={tmp_path / 'checkpoints' / 'ckpt-3'} ",
                       "cannot be read"):
        warm_start.resolve(tmp_path / "checkpoints" / "ckpt-3")


class _Variable:
    def __init__(self, path, shape):
        self.path, self.shape = path, shape


def test_the_plan_matches_by_name_and_shape_and_lists_every_variable_left_out():
    model = [_Variable("conv1/kernel", (3, 3, 1, 8)), _Variable("conv2/kernel", (3, 3, 8, 8)),
             _Variable("new/kernel", (8, 2)), _Variable("logits/kernel", (8, 2)), _Variable("logits/bias", (2,))]
    stored = [warm_start.Stored(name, key, shape) for name, key, shape in (
        ("conv1/kernel", "k1", (3, 3, 3, 8)), ("conv2/kernel", "k2", (3, 3, 8, 8)), ("old/kernel", "k3", (8, 8)),
        ("logits/kernel", "k4", (8, 5)), ("logits/bias", "k5", (5,)))]
    plan = warm_start.plan(model, stored, "^logits/")
    assert [(variable.path, entry.key) for variable, entry in plan.restored] == [("conv2/kernel", "k2")]
    assert plan.excluded == ["logits/kernel", "logits/bias"] and plan.missing == ["new/kernel"]
    assert plan.shape == [("conv1/kernel", (3, 3, 3, 8), (3, 3, 1, 8))] and plan.unused == ["old/kernel"]
    many = warm_start.Plan(missing=[f"dense{i}/kernel" for i in range(11)], total=11)
    assert "not in the checkpoint: 11 (dense0/kernel, dense1/kernel, dense2/kernel, dense3/kernel, dense4/kernel, " \
           "dense5/kernel, dense6/kernel, dense7/kernel and 3 more);" in warm_start.summary("ckpt-1", many)


def test_the_runs_own_checkpoint_wins_and_the_init_checkpoint_is_logged_as_ignored(caplog):
    cfg = OmegaConf.create({"trainer": {"init_checkpoint": "/gone/run", "init_exclude": None},
                            "model": {"name": "semi_alexnet", "pretrained": None},  # None: a model without it
                            "dataset": {"normalize": "unit_range"}})
    with caplog.at_level(logging.INFO, logger=warm_start.__name__):
        warm_start.start(cfg, model=None, latest="/run/checkpoints/ckpt-4")  # no model is touched, no path read
    [message] = caplog.messages
    assert_names(message, "trainer.init_checkpoint=/gone/run", "ignored", "/run/checkpoints/ckpt-4")


def test_the_init_checkpoint_is_checked_only_where_it_would_be_used(tmp_path):
    cfg = OmegaConf.create({"mode": "train", "trainer": {"init_checkpoint": "/gone/run", "init_exclude": None}})
    with raises_naming(ConfigError, "trainer.init_checkpoint=/gone/run ", "/gone/run.index"):
        warm_start.check(cfg, tmp_path / "checkpoints")
    warm_start.check(OmegaConf.merge(cfg, {"mode": "evaluate"}), tmp_path / "checkpoints")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-4.index").write_bytes(b"")  # the run's own: the init checkpoint is ignored
    warm_start.check(cfg, tmp_path / "checkpoints")


def test_pretrained_weights_with_another_normalisation_than_theirs_are_a_warning(caplog):
    cfg = OmegaConf.create({"trainer": {"init_checkpoint": None, "init_exclude": None},
                            "model": {"name": "resnet_v2_50", "pretrained": "imagenet"},
                            "dataset": {"normalize": "per_image_standardization"}})
    with caplog.at_level(logging.INFO, logger=warm_start.__name__):
        warm_start.start(cfg, model=None, latest=None)
    [message] = caplog.messages
    assert_names(message, "model.pretrained=imagenet", "dataset.normalize=unit_range",
                 "dataset.normalize=per_image_standardization")


def test_an_init_exclude_that_is_no_regular_expression_is_a_config_error(tmp_path):
    cfg = OmegaConf.create({"mode": "train_and_evaluate",
                            "trainer": {"init_checkpoint": str(tmp_path), "init_exclude": "logits["}})
    with raises_naming(ConfigError, "trainer.init_exclude=logits[ ", "regular expression"):
        warm_start.check(cfg, tmp_path / "checkpoints")


@pytest.mark.parametrize(("override", "named"), [
    ("trainer.init_exclude=5", ("trainer.init_exclude=5 ", "regular expression", "null")),
    ("trainer.init_checkpoint=''", ("trainer.init_checkpoint= ", "path", "null")),
])
def test_the_keys_are_typed(override, named):
    assert_names(schema.first_problem(compose("dataset=lfw_pairs", override), {}), *named)


def test_the_keys_are_not_run_control_keys():
    from tf_harness.experiments.run_dir import reentry
    assert not {"trainer.init_checkpoint", "trainer.init_exclude"} & set(reentry.RUN_CONTROL)
