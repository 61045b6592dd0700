"""The run directory is the source of truth: re-entering one runs its saved config.

A run directory is *recorded* once a run has written its HParams record (an event file at the top of
the directory) or a checkpoint: by then its config passed every check. Re-entering a recorded
directory (`hydra.run.dir=<run>` again):

- composes, for a group the command line does not name (dataset, model, experiment), the run's saved
  choice, so that a key only that dataset or model has (model.merge, dataset.fold) is compared rather
  than refused by Hydra;
- composes from the directory's saved `.hydra/config.yaml`, not from conf/: the command line's task
  overrides (`HydraConfig.get().overrides.task`, what the user typed, not conf/'s defaults) are
  applied on top of it;
- only run-control keys may differ from the saved config (RUN_CONTROL); any other difference is a
  config error naming the key, its requested and its saved value (exit 2, before TensorFlow starts);
- writes its own `.hydra/reentry-<time>/` (config.yaml: the config it ran with; overrides.yaml and
  hydra.yaml as Hydra writes them), so the training run's `.hydra/` is never overwritten. conf/hydra/
  default.yaml points `hydra.output_subdir` at `subdir()` for that;
- restarts the input stream, with a warning, when the pipeline of the checkpoint's saved iterator differs
  from its own (`checkpoints/input_pipelines.json`, kept by `note_input`).

The entry points (run.py, the TFRecord converter) resolve the config in two calls, one on each side of
Hydra's composition: `with_saved_choices` puts the saved choices on the command line before Hydra reads it,
and `resolve_config`, in each Hydra job, turns Hydra's composition into the config the job runs.

A directory whose `.hydra/` holds only a config (a start that failed before recording anything, e.g.
on a bad value) is not recorded: the next run there starts afresh and Hydra rewrites `.hydra/`.

The run directory never lies, and is never taken for another:

- `hydra.run.dir=` is read with Hydra's own override parser (`run_dir_argument`), so a quoted path
  (`'/data/a b/ü'`) names the same directory for this module as for Hydra;
- a directory that holds a run (an HParams record or checkpoint files) whose saved config is missing or
  unreadable is refused before Hydra starts (`unreadable_record`: one line naming the file, exit 1, nothing
  written), rather than composed from conf/ with `.hydra/` rewritten over it; an unreadable `.hydra/hydra.yaml`
  is logged, and the dataset and model the saved config names are composed (`saved_choices`);
- before a start writes anything, its checkpoints are checked (`check_checkpoints`): none restorable, or one that
  training on would overwrite, stops it with one line and the directory as it was;
- an unreadable `checkpoints/input_pipelines.json` is logged and read as no record.

Nothing here imports TensorFlow, but `check_checkpoints` (through experiments/run_dir/checkpoints.py), which the runner
calls once TensorFlow is running.
"""
import logging
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tf_harness.data.integrity import reading, writing
from tf_harness.experiments.config.config_keys import REENTRY, Reentry
from tf_harness.experiments.config.schema import EVALUATION_MODES

log = logging.getLogger(__name__)

SAVED = Path(".hydra") / "config.yaml"
# What the command line may change on re-entry (docs/run-directory.md), as experiments/config/config_keys.py declares
# each key: run-control keys, and those that may change for the evaluation modes only (the checkpoint does not depend on
# them, but training's saved input iterator depends on the batch size, and training holds the evaluation pairs'
# people out). `strategy` is a group chosen whole (strategy=mirrored): its keys go with the choice, and are left out.
RUN_CONTROL = tuple(key for key, rule in REENTRY.items()
                    if rule is Reentry.RUN_CONTROL and not key.startswith("strategy."))
EVALUATION_KEYS = tuple(key for key, rule in REENTRY.items() if rule is Reentry.EVALUATION)


def _grouped(keys) -> str:
    """`keys` as an error line names them, each group once: ``mode, trainer.train_steps|eval_every``."""
    groups = {}
    for key in keys:
        group, _, name = key.rpartition(".")
        groups.setdefault(group, []).append(name)
    return ", ".join(f"{group}.{'|'.join(names)}" if group else "|".join(names) for group, names in groups.items())


# What a refused re-entry says may change, in words: the two lists above and the strategy group.
ALLOWED = (f"{_grouped(RUN_CONTROL)}, strategy and (for mode={'|'.join(EVALUATION_MODES)}) "
           f"{_grouped(EVALUATION_KEYS)}")

_ABSENT = object()

# The decision for each run directory, made once per process: Hydra reads hydra.output_subdir before it
# writes `.hydra/`, and the cli asks again afterwards, when the directory holds this run's own files.
_subdirs = {}
# The same run directories as Hydra named them (hydra.runtime.output_dir), in the order it asked.
_named = {}


def has_hparams(run_dir) -> bool:
    """Whether the run directory holds an HParams record (experiments/summaries.py writes it, alone, at the
    top of the directory)."""
    return any(Path(run_dir).glob("events.out.tfevents.*"))


def recorded(run_dir) -> bool:
    """Whether a run has recorded itself in `run_dir`: its saved config, plus an HParams record or a checkpoint."""
    run_dir = Path(run_dir)
    return (run_dir / SAVED).is_file() and (
        has_hparams(run_dir) or any((run_dir / "checkpoints").glob("ckpt-*.index")))


def new_process_run() -> None:
    """Forgets the decisions of `subdir`: a process that runs one job after another in the same run directory
    (experiments/api.py) decides afresh for each, as a new process would."""
    _subdirs.clear()
    _named.clear()


def subdir(output_dir) -> str:
    """Where Hydra saves this run's config, relative to its run directory (hydra.output_subdir):
    `.hydra` for a new run, `.hydra/reentry-<time>` on re-entry."""
    key = str(Path(output_dir).resolve())
    if key not in _subdirs:
        name = ".hydra"
        # A run whose saved config is gone or unreadable too (a sweep's job: the cli refuses a single run before
        # Hydra starts): its `.hydra/` is not written afresh from conf/, and resolve_config refuses the job.
        if recorded(output_dir) or _has_run(output_dir):
            name = f".hydra/reentry-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
            base, count = name, 1
            while (Path(output_dir) / name).exists():
                count += 1
                name = f"{base}-{count}"
        _subdirs[key] = name
        _named[key] = Path(output_dir)
    return _subdirs[key]


def newest_record_folder():
    """(run directory, folder): the run directory of this process's newest Hydra job and the folder where Hydra
    saves its config there, once Hydra has asked `subdir` for it (before writing to it); (None, None) before. What the
    cli names when one of those writes fails without naming its file."""
    if not _named:
        return None, None
    key = next(reversed(_named))
    return _named[key], _named[key] / _subdirs[key]


# Groups whose saved choice a re-entry's command line gets when it names none, so that Hydra composes
# the run's own keys (model.merge, dataset.fold, ...) and an override of one is compared, not refused by Hydra.
CHOSEN_GROUPS = ("dataset", "model", "experiment")


def run_dir_argument(args):
    """The run directory the command line's last `hydra.run.dir=` names, read with Hydra's own override parser
    (so `hydra.run.dir='/tmp/a b/ü'` or `"..."` names `/tmp/a b/ü`, as it does for Hydra); None when it names none.
    A value Hydra's parser does not take is returned as typed: Hydra itself refuses it, in one line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values = [arg.partition("=")[2] for arg in args if arg.startswith("hydra.run.dir=")]
    if not values:
        return None
    try:
        value = OverridesParser.create().parse_override(f"hydra.run.dir={values[-1]}").value()
    except Exception:  # noqa: BLE001  e.g. unquoted non-ASCII characters: Hydra reports it
        return values[-1]
    return value if isinstance(value, str) else values[-1]


def _has_run(run_dir) -> bool:
    """Whether `run_dir` holds what only a run writes: an HParams record or checkpoint files."""
    run_dir = Path(run_dir)
    return has_hparams(run_dir) or any((run_dir / "checkpoints").glob("ckpt-*"))


def config_problem(path):
    """What is wrong with the saved config at `path`, in a few words; None when it reads as a run's config."""
    path = Path(path)
    try:
        text = reading.read_text(path)
    except FileNotFoundError:
        return "is missing"
    except UnicodeDecodeError:
        return "is not text (not UTF-8)"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if not text.strip():
        return "is empty"
    try:
        cfg = OmegaConf.create(text)
    except Exception as error:  # noqa: BLE001  yaml's errors, OmegaConf's
        return f"is not valid YAML ({' '.join(str(error).split())[:160]})"
    if not isinstance(cfg, DictConfig):
        return "does not hold a config (a mapping of keys)"
    if not isinstance(value_of(cfg, "dataset.name"), str):  # every run's config names its dataset
        return "does not hold a run's config (no dataset.name)"
    return None


# The run directory's files a run opens in place (appends to or locks) rather than replaces, and what for. A special
# file there can be neither used nor replaced, and found later (Hydra appends to run.log before the run's code starts)
# the refusal would come after the start has written its records, or the run trained: so it is refused first.
# The files a re-entry locks or writes at a fixed name in its run directory, and what for: a named pipe, socket,
# device or folder in one's place is refused before Hydra starts, rather than at the write, mid-run.
_WRITTEN = {"run.log": "the run's log is written there", ".lock": "the run's lock is taken there",
            ".eval-lock": "the evaluator's lock is taken there", "metrics.jsonl": "each evaluation is appended there",
            "metrics.json": "each evaluation is written there", "best.json": "the best evaluation is written there",
            "skipped.csv": "the skipped examples are listed there",
            "checkpoints/checkpoint": "the checkpoint state is written there",
            "checkpoints/input_pipelines.json": "each checkpoint's input pipeline is recorded there",
            **{name: "an evaluation of its split is written there" for name in (
                "metrics_test.json", "metrics_test.jsonl", "metrics_validation.json", "metrics_validation.jsonl")},
            **{name: "mode=predict writes there" for name in (
                "predictions.csv", "predictions_validation.csv", "heatmaps/index.csv")}}


def unreadable_record(args):
    """The one line to report, before Hydra starts, when the command line re-enters a run directory whose saved
    config is missing or unreadable while the directory holds a run (an HParams record or checkpoint files):
    composing from conf/ instead would rewrite `.hydra/` and train or evaluate another config over the run's
    checkpoints; or where a file it writes or locks (`_WRITTEN`) is a named pipe, socket, device or folder. None
    otherwise (a new or unrecorded directory, a readable config, a sweep)."""
    if any(arg in ("-m", "--multirun") for arg in args):
        return None
    run_dir = run_dir_argument(args)
    if run_dir is None or not Path(run_dir).is_dir():
        return None
    for name, use in _WRITTEN.items():
        try:
            writing.check_place(Path(run_dir) / name)
        except OSError as error:
            return f"{error}; {use}: move it away"
    if not _has_run(run_dir):
        return None
    path = Path(run_dir) / SAVED
    problem = config_problem(path)
    if problem is None:
        return None
    return _held_run(run_dir, problem)


def _held_run(run_dir, problem) -> str:
    """The line refusing `run_dir`, which holds a run, because its saved config `problem` ("is missing", ...)."""
    held = "checkpoints" if any((Path(run_dir) / "checkpoints").glob("ckpt-*")) else "an HParams record"
    return (f"{Path(run_dir) / SAVED} {problem}, but {run_dir} holds a run ({held}): it is not started afresh over it; "
            f"put the run's saved config back, or choose a new hydra.run.dir")


def _load(path):
    """The YAML file at `path` as an OmegaConf config, opened through the door (a named pipe there is refused)."""
    return OmegaConf.create(reading.read_text(path))


def saved_choices(run_dir):
    """(choices, trouble): the group choices of the run saved in `run_dir` (`.hydra/hydra.yaml`'s
    hydra.runtime.choices), and None; or, when that file is missing or unreadable, the dataset and model that
    its saved config names, and what was wrong with the file, in a few words."""
    path = Path(run_dir) / ".hydra" / "hydra.yaml"
    try:
        choices = OmegaConf.to_container(_load(path).hydra.runtime.choices)
        if isinstance(choices, dict):
            return choices, None
        trouble = "holds no group choices"
    except FileNotFoundError:
        trouble = "is missing"
    except Exception as error:  # noqa: BLE001  not text, not YAML, not Hydra's settings
        trouble = f"cannot be read ({type(error).__name__})"
    try:
        saved = _load(Path(run_dir) / SAVED)
        choices = {group: value_of(saved, f"{group}.name") for group in ("dataset", "model")}
        return {group: name for group, name in choices.items() if isinstance(name, str)}, trouble
    except Exception:  # noqa: BLE001  unreadable_record has refused such a directory already
        return {}, trouble


def with_saved_choices(args) -> list:
    """The command line `args`, with the saved `dataset=`, `model=` and `experiment=` choices of the recorded
    run directory that `hydra.run.dir=` names added in front of those it does not name itself (with an unreadable
    `.hydra/hydra.yaml`, the dataset and model its saved config names)."""
    if any(arg in ("-m", "--multirun") for arg in args):
        return list(args)
    run_dir = run_dir_argument(args)
    if run_dir is None or not recorded(run_dir):
        return list(args)
    choices, _ = saved_choices(run_dir)
    named = {arg.lstrip("+~").partition("=")[0] for arg in args}
    added = [f"{group}={choices[group]}" for group in CHOSEN_GROUPS
             if group not in named and isinstance(choices.get(group), str)]
    return added + list(args)


def _show(value):
    from tf_harness.experiments.config.schema import show
    if value is _ABSENT:
        return "(unset)"
    return show(value)


def value_of(cfg, key):
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
    """Whether re-entry may change `key` in `mode`, by its declared rule (`strategy`: the group's choice)."""
    rule = Reentry.RUN_CONTROL if key == "strategy" else REENTRY.get(key, Reentry.FIXED)
    return rule is Reentry.RUN_CONTROL or (rule is Reentry.EVALUATION and mode in EVALUATION_MODES)


def compose(cfg, run_dir, overrides, choices, saved_choices=None):
    """The config a re-entry runs: the saved one with the command line's allowed `overrides` applied.

    `cfg`: the config Hydra composed from conf/ and the command line; `overrides`: the task overrides as
    typed; `choices`: the group choices of this composition; `saved_choices`: those of the saved run (from
    its .hydra/hydra.yaml), when known. Returns (config, None), or (None, one line naming the key that
    may not change).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    path = Path(run_dir) / SAVED
    saved = _load(path)
    merged = _load(path)
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    mode_override = [o for o in parsed if o.key_or_group == "mode" and not o.is_delete()]
    mode = value_of(cfg, "mode") if mode_override else value_of(saved, "mode")

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
                was, where = value_of(saved, f"{key}.name"), path
            if was is _ABSENT:  # not recorded (an experiment, without a readable hydra.yaml): its keys are compared
                continue
            if requested != was:
                return None, differs(key, requested, was, where)
            continue
        if override.is_delete():
            requested = _ABSENT
        else:
            requested = value_of(cfg, key)
        was = value_of(saved, key)
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
    from tf_harness.experiments.config.schema import KEYS, OPTION_KEYS
    for key in (*KEYS, *OPTION_KEYS):  # a dataset's or model's own keys too (dataset.test_fraction, say)
        if value_of(merged, key) is _ABSENT and value_of(cfg, key) is not _ABSENT:
            OmegaConf.update(merged, key, OmegaConf.select(cfg, key), merge=False, force_add=True)
    return merged, None


def resolve_config(cfg):
    """(config, problem): the config this Hydra job runs, from `cfg`, the one Hydra composed: on re-entering a
    recorded run directory, its saved config with the command line's overrides applied, or None and the one line
    to report when the command line changes what the saved config fixes; `cfg` itself otherwise."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return cfg, None
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    if subdir(run_dir) == ".hydra":
        return cfg, None
    problem = config_problem(run_dir / SAVED)
    if problem and _has_run(run_dir):  # cli refuses a single run's before Hydra starts; a sweep's job is refused here
        return None, _held_run(run_dir, problem)
    if problem:  # it may have changed since the cli looked
        return None, f"{run_dir / SAVED} {problem}; put the run's saved config back, or choose a new hydra.run.dir"
    choices, trouble = saved_choices(run_dir)
    if trouble:
        log.warning(
            "%s %s: composing the run's saved config with the dataset and model it names (%s)",
            run_dir / ".hydra" / "hydra.yaml", trouble, ", ".join(f"{group}={name}" for group, name in choices.items()))
    known_choices = choices if not trouble else None
    merged, problem = compose(cfg, run_dir, hydra_cfg.overrides.task, dict(hydra_cfg.runtime.choices),
                              known_choices)
    if problem:
        return None, problem
    OmegaConf.set_struct(merged, True)
    # This re-entry's own record: the config it runs, beside the overrides Hydra saved.
    if hydra_cfg.output_subdir:
        with writing.replacing(run_dir / hydra_cfg.output_subdir / "config.yaml") as file:
            OmegaConf.save(merged, file)
    return merged, None


# What Hydra itself writes into a new run directory before the job starts, and the run lock the runner takes
# first: a directory holding nothing else holds nothing of a run.
_HYDRA_ONLY = {".hydra", "run.log", ".lock"}
_HYDRA_FILES = {"config.yaml", "hydra.yaml", "overrides.yaml"}


def existing_ancestor(args):
    """The nearest folder that already exists on the path the command line's `hydra.run.dir=` names (the
    folder itself when it exists); None when the command line names none. Read before Hydra creates it."""
    run_dir = run_dir_argument(args)
    if run_dir is None:
        return None
    path = Path(run_dir).absolute()
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
