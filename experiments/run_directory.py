"""The run directory is the source of truth: re-entering one runs its saved config.

A run directory is *recorded* once a run has written its HParams record (an event file at the top of
the directory) or a checkpoint: by then its config passed every check. Re-entering a recorded
directory (`hydra.run.dir=<run>` again):

- composes from the directory's saved `.hydra/config.yaml`, not from conf/: the command line's task
  overrides (`HydraConfig.get().overrides.task`, what the user typed, not conf/'s defaults) are
  applied on top of it;
- only run-control keys may differ from the saved config (RUN_CONTROL); any other difference is a
  config error naming the key, its requested and its saved value (exit 2, before TensorFlow starts);
- writes its own `.hydra/reentry-<time>/` (config.yaml: the config it ran with; overrides.yaml and
  hydra.yaml as Hydra writes them), so the training run's `.hydra/` is never overwritten. conf/hydra/
  default.yaml points `hydra.output_subdir` at `subdir()` for that.

- composes, for a group the command line does not name (dataset, model, experiment), the run's saved
  choice (`with_saved_choices`, applied to sys.argv by the cli before Hydra starts), so that a key only
  that dataset or model has (model.merge, dataset.fold) is compared rather than refused by Hydra;
- restarts the input stream, with a warning, when the pipeline of the checkpoint's saved iterator differs
  from its own (`checkpoints/input_pipelines.json`, kept by `note_input`).

A directory whose `.hydra/` holds only a config (a start that failed before recording anything, e.g.
on a bad value) is not recorded: the next run there starts afresh and Hydra rewrites `.hydra/`.

Nothing here imports TensorFlow.
"""
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

SAVED = Path(".hydra") / "config.yaml"
# Keys the command line may change on re-entry (docs/run-directory.md); `strategy` is the whole group.
RUN_CONTROL = ("mode", "trainer.train_steps", "trainer.eval_every", "trainer.eval_steps", "trainer.checkpoint_every",
               "trainer.log_every", "trainer.steps_per_loop", "trainer.jit_compile", "trainer.profile_steps",
               "dataset.root", "pipeline.source", "pipeline.cache", "pipeline.service")
# May change in these modes only: the checkpoint does not depend on them, but training's saved input
# iterator depends on the batch size, and training holds the evaluation pairs' people out.
EVALUATION_KEYS = ("pipeline.batch_size", "dataset.eval_pairs", "dataset.fold")
EVALUATION_MODES = ("evaluate", "predict", "export")
ALLOWED = ("mode, trainer.train_steps|eval_every|eval_steps|checkpoint_every|log_every|steps_per_loop|"
           "jit_compile|profile_steps, "
           "dataset.root, pipeline.source|cache|service, strategy and (for mode=evaluate|predict|export) "
           "pipeline.batch_size, dataset.eval_pairs|fold")
_ABSENT = object()

# The decision for each run directory, made once per process: Hydra reads hydra.output_subdir before it
# writes `.hydra/`, and the cli asks again afterwards, when the directory holds this run's own files.
_subdirs = {}


def has_hparams(run_dir) -> bool:
    """Whether the run directory holds an HParams record (experiments/summaries.py writes it, alone, at the
    top of the directory)."""
    return any(Path(run_dir).glob("events.out.tfevents.*"))


def recorded(run_dir) -> bool:
    """Whether a run has recorded itself in `run_dir`: its saved config, plus an HParams record or a checkpoint."""
    run_dir = Path(run_dir)
    return (run_dir / SAVED).is_file() and (
        has_hparams(run_dir) or any((run_dir / "checkpoints").glob("ckpt-*.index")))


def subdir(output_dir) -> str:
    """Where Hydra saves this run's config, relative to its run directory (hydra.output_subdir):
    `.hydra` for a new run, `.hydra/reentry-<time>` on re-entry."""
    key = str(Path(output_dir).resolve())
    if key not in _subdirs:
        name = ".hydra"
        if recorded(output_dir):
            name = f".hydra/reentry-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
            base, count = name, 1
            while (Path(output_dir) / name).exists():
                count += 1
                name = f"{base}-{count}"
        _subdirs[key] = name
    return _subdirs[key]


# Groups whose saved choice a re-entry's command line gets when it names none, so that Hydra composes
# the run's own keys (model.merge, dataset.fold, ...) and an override of one is compared, not refused by Hydra.
CHOSEN_GROUPS = ("dataset", "model", "experiment")


def with_saved_choices(args) -> list:
    """The command line `args`, with the saved `dataset=`, `model=` and `experiment=` choices of the recorded
    run directory that `hydra.run.dir=` names added in front of those it does not name itself."""
    if any(arg in ("-m", "--multirun") for arg in args):
        return list(args)
    run_dirs = [arg.partition("=")[2] for arg in args if arg.startswith("hydra.run.dir=")]
    if not run_dirs or not recorded(run_dirs[-1]):
        return list(args)
    try:
        saved_hydra = OmegaConf.load(Path(run_dirs[-1]) / ".hydra" / "hydra.yaml")
        choices = OmegaConf.to_container(saved_hydra.hydra.runtime.choices)
    except Exception:  # noqa: BLE001  no readable hydra.yaml: compose as typed
        return list(args)
    named = {arg.lstrip("+~").partition("=")[0] for arg in args}
    added = [f"{group}={choices[group]}" for group in CHOSEN_GROUPS
             if group not in named and isinstance(choices.get(group), str)]
    return added + list(args)


def _show(value):
    from tf_harness.experiments.schema import show
    if value is _ABSENT:
        return "(unset)"
    return show(value)


def _value(cfg, key):
    """The value at `key`, resolved where it resolves (as written otherwise); _ABSENT when there is none."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=_ABSENT) if parent else cfg
    if not isinstance(node, DictConfig) or leaf not in node:
        return _ABSENT
    try:
        value = node[leaf]
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except Exception:  # noqa: BLE001  an interpolation that does not resolve: compare as written
        return OmegaConf.to_container(node)[leaf]


def _allowed(key, mode) -> bool:
    if key == "strategy" or key.startswith("strategy.") or key in RUN_CONTROL:
        return True
    return key in EVALUATION_KEYS and mode in EVALUATION_MODES


def compose(cfg, run_dir, overrides, choices, saved_choices=None):
    """The config a re-entry runs: the saved one with the command line's allowed `overrides` applied.

    `cfg`: the config Hydra composed from conf/ and the command line; `overrides`: the task overrides as
    typed; `choices`: the group choices of this composition; `saved_choices`: those of the saved run (from
    its .hydra/hydra.yaml), when known. Returns (config, None), or (None, one line naming the key that
    may not change).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = Path(run_dir) / SAVED
    saved = OmegaConf.load(path)
    merged = OmegaConf.load(path)
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    mode_override = [o for o in parsed if o.key_or_group == "mode" and not o.is_delete()]
    mode = _value(cfg, "mode") if mode_override else _value(saved, "mode")

    def differs(key, requested, was, where=path):
        return (f"{key}={_show(requested)} differs from the run directory's saved {key}={_show(was)} ({where}); "
                f"on re-entry only {ALLOWED} may change; choose a new hydra.run.dir for another config")

    for override in parsed:
        key = override.key_or_group
        if key in choices and not override.package:  # a group choice, e.g. dataset=lfw_pairs or strategy=mirrored
            if key == "strategy":
                merged.strategy = cfg.strategy
                continue
            requested = choices[key]
            if saved_choices is not None and key in saved_choices:
                was, where = saved_choices[key], Path(run_dir) / ".hydra" / "hydra.yaml"
            else:
                was, where = _value(saved, f"{key}.name"), path
            if requested != was:
                return None, differs(key, requested, was, where)
            continue
        if override.is_delete():
            requested = _ABSENT
        else:
            requested = _value(cfg, key)
        was = _value(saved, key)
        if requested == was:
            continue
        if not _allowed(key, mode):
            return None, differs(key, requested, was)
        if requested is _ABSENT:
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(merged, parent) if parent else merged
            node.pop(leaf, None)
        else:
            OmegaConf.update(merged, key, OmegaConf.select(cfg, key), merge=False, force_add=True)
    # Keys added to the harness since the run was saved take today's defaults.
    from tf_harness.experiments.schema import KEYS
    for key in KEYS:
        if _value(merged, key) is _ABSENT and _value(cfg, key) is not _ABSENT:
            OmegaConf.update(merged, key, OmegaConf.select(cfg, key), merge=False, force_add=True)
    return merged, None


def effective(cfg):
    """(config, problem): the config this Hydra job runs, and the one line to report when the command line
    changes what a re-entered run directory's saved config fixes. `cfg` itself outside a re-entry."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return cfg, None
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if subdir(run_dir) == ".hydra":
        return cfg, None
    saved_choices = None
    try:
        saved_hydra = OmegaConf.load(run_dir / ".hydra" / "hydra.yaml")
        saved_choices = OmegaConf.to_container(saved_hydra.hydra.runtime.choices)
    except Exception:  # noqa: BLE001  no readable hydra.yaml: fall back to each group's name key
        pass
    merged, problem = compose(cfg, run_dir, hydra_cfg.overrides.task, dict(hydra_cfg.runtime.choices),
                              saved_choices)
    if problem:
        return None, problem
    OmegaConf.set_struct(merged, True)
    # This re-entry's own record: the config it runs, beside the overrides Hydra saved.
    if hydra_cfg.output_subdir:
        OmegaConf.save(merged, run_dir / hydra_cfg.output_subdir / "config.yaml")
    return merged, None


# What Hydra itself writes into a new run directory before the job starts, and the run lock the runner takes
# first: a directory holding nothing else holds nothing of a run.
_HYDRA_ONLY = {".hydra", "run.log", ".lock"}
_HYDRA_FILES = {"config.yaml", "hydra.yaml", "overrides.yaml"}


def existing_ancestor(args):
    """The nearest folder that already exists on the path the command line's `hydra.run.dir=` names (the
    folder itself when it exists); None when the command line names none. Read before Hydra creates it."""
    run_dirs = [arg.partition("=")[2] for arg in args if arg.startswith("hydra.run.dir=")]
    if not run_dirs:
        return None
    path = Path(run_dirs[-1].strip("'\"")).absolute()
    while not _exists(path) and path != path.parent:
        path = path.parent
    return path


def _exists(path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long, say: it cannot exist; Hydra reports the error as it makes the folder
        return False


def discard_failed_start(run_dir, existing) -> bool:
    """Removes the run directory of a start that failed before it ran, so a typo leaves no folder behind.

    Only a directory this process created goes: `existing` is what `existing_ancestor` found before Hydra
    started (None when conf/'s dated pattern named the directory, new by its random id), and the
    directory must hold only Hydra's own `.hydra/` files, run.log and the run lock. Empty folders above it
    that this process created go too. Returns whether it removed anything.
    """
    import shutil

    run_dir = Path(run_dir).absolute()
    if existing is not None and existing not in run_dir.parents:
        return False  # the folder was there before this process (or is not the one named): none of it is ours
    try:
        entries = {path.name for path in run_dir.iterdir()}
        hydra = run_dir / ".hydra"
        hydra_files = {path.name for path in hydra.iterdir()} if hydra.is_dir() else set()
    except OSError:
        return False
    if not entries <= _HYDRA_ONLY or not hydra_files <= _HYDRA_FILES:
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    # Empty folders above it that this process made: those below the one that existed, or conf/'s dated folder.
    if existing is not None:
        above = [parent for parent in run_dir.parents if existing in parent.parents]
    else:
        above = [run_dir.parent] if run_dir.parent != Path.cwd().absolute() else []
    for parent in above:
        try:
            parent.rmdir()  # only an empty folder goes
        except OSError:
            break
    return not run_dir.exists()


# The input pipeline whose iterator each checkpoint holds. A re-entry may change pipeline.source, pipeline.cache,
# dataset.root and the strategy; a saved iterator restored into another pipeline would fail, so a resume compares
# the checkpoint's pipeline with its own and, when they differ, restarts the input stream (runner.py).
INPUT_RECORD = "input_pipelines.json"


def input_signature(cfg, replicas, saved) -> dict | None:
    """What shapes the training input iterator; None when checkpoints leave the iterator out (`saved` false)."""
    if not saved:
        return None
    return {"dataset.root": _value(cfg, "dataset.root"), "pipeline.source": _value(cfg, "pipeline.source"),
            "pipeline.cache": _value(cfg, "pipeline.cache"), "pipeline.batch_size": _value(cfg, "pipeline.batch_size"),
            "strategy": _value(cfg, "strategy"), "replicas": int(replicas)}


def _input_records(checkpoint_dir) -> list:
    import json
    try:
        return json.loads((Path(checkpoint_dir) / INPUT_RECORD).read_text())
    except (OSError, ValueError):
        return []


def saved_input(checkpoint_dir, step):
    """(known, signature): the input pipeline of the checkpoint at global `step`, from the record that
    `note_input` keeps; known is False in a run directory written before the record existed."""
    found = [record for record in _input_records(checkpoint_dir) if record["after_step"] < step]
    return (True, found[-1]["input"]) if found else (False, None)


def note_input(checkpoint_dir, step, signature) -> None:
    """Records that checkpoints after global `step` hold the iterator of `signature` (None: no iterator)."""
    import json
    records = _input_records(checkpoint_dir)
    if records and records[-1]["input"] == signature:
        return
    records = [record for record in records if record["after_step"] < step] + [
        {"after_step": int(step), "input": signature}]
    path = Path(checkpoint_dir) / INPUT_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(records, indent=1))
    path.with_suffix(".tmp").replace(path)
