"""Shared test set-up: private folders for the cache and the benchmarks' results, the real fixtures and config
composition."""
import copy
import functools
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from tf_harness.experiments.config.settings import Settings

PROJECT = Path(__file__).resolve().parents[1]
CONF = PROJECT / "conf"
# Real sample files of the three datasets, kept in the repository (their origin and terms: NOTICE.md there).
REAL = PROJECT / "tests" / "fixtures" / "real"


@pytest.fixture(scope="session", autouse=True)
def private_folders(tmp_path_factory):
    """{variable: folder} of each folder the harness writes outside a run directory, fresh for the whole session
    and set in the environment, so that this process and its children write there: samples, indexes and
    verification results (HARNESS_CACHE), the results files of the benchmarks a test runs
    (HARNESS_BENCHMARK_RESULTS), never into the user's cache or the checkout's benchmarks/results/.

    The workers of one `pytest -n` share the cache's samples/ folder: the suite only reads the embedded samples,
    and data/samples makes one safely beside another process making it, as two runs sharing a cache do, so a
    worker reads what the other has made rather than making it again."""
    folders = {variable: tmp_path_factory.mktemp(name) for variable, name in
               (("HARNESS_CACHE", "harness-cache"), ("HARNESS_BENCHMARK_RESULTS", "benchmark-results"))}
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "samples"  # the folder of this run's workers
        shared.mkdir(exist_ok=True)
        (folders["HARNESS_CACHE"] / "samples").symlink_to(shared, target_is_directory=True)
    os.environ.update({variable: str(folder) for variable, folder in folders.items()})
    return folders


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """Runs trained once per session in this process (tests/shared_runs.py)."""
    from tests.shared_runs import SharedRuns
    return SharedRuns(tmp_path_factory.mktemp("shared-runs"))


@pytest.fixture
def real():
    """The real sample files of the three datasets."""
    require_real_fixtures()
    return REAL


def require_real_fixtures():
    """The real sample files are part of the test set-up: without them a test fails, never skips."""
    if not REAL.exists():
        pytest.fail(f"real fixtures not found at {REAL}: they are part of the repository; restore them with "
                    f"`git checkout -- tests/fixtures`")


def compose(*overrides):
    """The project's config composed as `python run.py` would, with `overrides`: the caller's own copy, which it
    may change."""
    from tf_harness.experiments import cli
    cli.register_resolvers()
    return copy.deepcopy(_composed(overrides))


@functools.cache
def _composed(overrides):
    """Each distinct tuple of overrides composed once per session: Hydra composes its config-group choices (and
    any override of Hydra's own node or a sweep), and the rest, plain values, are applied to a copy of that with
    Hydra's own override step, as Hydra applies them after the choices. Why: a composition parses conf/'s YAML
    afresh each time, and most tests differ from another only in values."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    sweep = any(override.is_sweep_override() for override in parsed)

    def plain(override):  # what Hydra's defaults list leaves to its override step
        return (not sweep and not override.is_hydra_override()
                and (isinstance(override.value(), dict) or not _group_exists(override.key_or_group)))

    values = [override for override in parsed if plain(override)]
    cfg = copy.deepcopy(_hydra_composed(tuple(override.input_line for override in parsed if not plain(override))))
    try:
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
    except OmegaConfBaseException as error:  # as Hydra's load_configuration turns them
        raise ConfigCompositionException() from error
    OmegaConf.set_struct(cfg, False)
    return cfg


@functools.cache
def _hydra_composed(overrides):
    """Hydra's compose of `overrides`, in struct mode as Hydra leaves it."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


@functools.cache
def _group_exists(name):
    """Whether Hydra's search path holds a config group `name` (conf/'s, or a plugin's)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return GlobalHydra.instance().config_loader().repository.group_exists(name)


def event_tags(logdir):
    """A run's TensorBoard events read back with TensorBoard's own reader: (accumulator, tags)."""
    from tensorboard.backend.event_processing import event_accumulator
    accumulator = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return accumulator, set(accumulator.Tags()["tensors"]) | set(accumulator.Tags()["scalars"])


def run_cli(*args, timeout=900, env=None, **kwargs):
    """Runs `python run.py args...` as a user would; returns the CompletedProcess. `env` adds variables."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable, "run.py", *args], cwd=PROJECT, capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)


def wait_for_checkpoint(process, checkpoints, step, seconds=300) -> int:
    """Waits until `process`, a training run, has saved a checkpoint of global step `step` or later into the folder
    `checkpoints`; returns the newest step saved. Fails if the process ends first or `seconds` pass. Why "or
    later": trainer.keep_checkpoints deletes older checkpoints, so on a busy machine a poll may never see `step`."""
    from tf_harness.experiments.run_dir.checkpoints import on_disk

    deadline = time.monotonic() + seconds
    while True:
        saved = list(on_disk(checkpoints))
        if saved and max(saved) >= step:
            return max(saved)
        if process.poll() is not None:
            pytest.fail(f"the run exited {process.returncode} before it saved ckpt-{step}: "
                        f"{(process.communicate()[1] or '')[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no checkpoint of step {step} or later in {checkpoints} after {seconds} s")
        time.sleep(0.2)


def task_of(cfg):
    """The Task a composed config names."""
    return Settings.from_config(cfg).task()


def tables_of(cfg, skipped=None):
    """The index tables of a composed config's dataset, as a run loads them."""
    from tf_harness.data.integrity.skipped import SkipLog
    from tf_harness.data.tables import load_tables
    return load_tables(task_of(cfg), cfg.dataset.root, cfg.pipeline.verify_images,
                       SkipLog() if skipped is None else skipped, cfg.dataset.max_skipped_fraction)


def make_input(cfg, table, training, split, context=None, model_dir=None):
    """input_fn for one split of a composed config, as the runner calls it."""
    from tf_harness.data.input_fn import input_fn
    return input_fn(task_of(cfg), table, Settings.from_config(cfg).input_pipeline(), split=split, training=training, context=context,
                    model_dir=model_dir)


def convert_shards(cfg):
    """`python -m tf_harness.data.tfrecords` with a composed config, in this process; returns the manifest."""
    from tf_harness.data.tfrecords.writer import convert
    from tf_harness.experiments.config.strategies import workers
    return convert(task_of(cfg), Settings.from_config(cfg).tfrecords(), int(cfg.seed), cfg.pipeline.verify_images,
                   cfg.dataset.max_skipped_fraction, workers()[0])


def read_shards(cfg, split, training, seed=0, table=None, context=None):
    """The (features, label) elements of a split's TFRecord shards, as the pipeline's tfrecord source reads them
    (before input_fn's shuffle)."""
    from tf_harness.data.tfrecords.reader import TFRecordRecords
    source = TFRecordRecords(task_of(cfg), table, split, training, Settings.from_config(cfg).tfrecords())
    return source.records(seed, context).map(source.load)


# A child process that holds a run directory's run lock, evaluator lock or both, until killed.
_HOLD = ("import sys, time; from tf_harness.experiments.run_dir import run_lock\n"
         "for name in sys.argv[2].split(','):\n"
         "    run_lock.hold(sys.argv[1]) if name == 'run' else run_lock.hold_evaluator(sys.argv[1])\n"
         "print('held', flush=True); time.sleep(600)")


@contextmanager
def lock_holder(run_dir, locks="run"):
    """A child process holding `run_dir`'s locks (`run`, `evaluator` or both, comma-separated); killed on exit."""
    process = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir), locks], cwd=PROJECT, stdout=subprocess.PIPE,
                               text=True, env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait()
