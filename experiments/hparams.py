"""A run's record for TensorBoard's HParams dashboard: the keys its sweep varies, their domains, the metric columns.

How the dashboard reads a log dir (TensorBoard 2.21), and what each record does about it:

- It takes one run's `hparams_config` for the whole log dir, the first it finds. So every run declares every
  task's metric columns, its own first, and a log dir holding several datasets keeps each one's columns.
- It ticks the first five hyper-parameters, taking those marked as differing first. The keys the sweep varies are
  marked so; every other leaf of the config follows (the first of them fill up the five), for ticking in.
- It prints every number with five significant digits (`4.0000`). So an int is recorded as its digits, unless the
  sweep draws it from an interval, which needs a number.
- It groups runs by trial id, and the default id is a hash of the values. So the run directory is the trial id,
  and repeated sweeps with the same values stay apart.
- Its filter offers a discrete domain's values as checkboxes, and unticking one hides the runs that have it. So
  swept keys declare a domain, the values the sweep lists or the interval it draws from, and the others none.
"""
import logging
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob
from hydra.errors import OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf
from tensorboard.plugins.hparams import api as hp
from tensorboard.plugins.hparams import plugin_data_pb2

log = logging.getLogger(__name__)
# The validation metrics each task reports (experiments/metrics.py), as dashboard columns.
TASK_METRICS = {"multilabel": ("auc/mean",), "binary": ("accuracy",), "multiclass": ("accuracy", "top5_accuracy")}


def sweep_domains(hydra_cfg) -> dict:
    """Each key the sweep varies: a list of the values it lists, (low, high) for an interval, or None for a
    glob (expanded against conf/). Empty outside a multirun.

    The sweep's own command line is in the sweep directory's multirun.yaml (a job's overrides hold its own
    values only); a sweeper's `params` (hparams_search) are in the job's config too.
    """
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return {}
    specs = [f"{key}={value}" for key, value in (hydra_cfg.sweeper.get("params") or {}).items()]
    multirun = Path(hydra_cfg.sweep.dir) / "multirun.yaml"
    if multirun.is_file():
        specs += list(OmegaConf.load(multirun).hydra.overrides.task)
    try:
        overrides = OverridesParser.create().parse_overrides(specs)
    except OverrideParseException as error:  # the sweeper parsed them already; a dashboard nicety must not stop a run
        log.warning("HParams: the sweep's overrides do not parse (%s); no key is marked as swept", error)
        return {}
    domains = {}
    for override in overrides:
        if not override.is_sweep_override():
            continue
        if override.is_interval_sweep():
            domains[override.key_or_group] = (override.value().start, override.value().end)
        elif isinstance(override.value(), Glob):
            domains[override.key_or_group] = None
        else:
            domains[override.key_or_group] = list(override.sweep_iterator())
    return domains


def _kind(values) -> type:
    """The one type a key's values are recorded as: bool, int (as digits), float, or str for anything else."""
    for kind in (bool, int, float):
        if all(isinstance(value, kind) and (kind is bool or not isinstance(value, bool)) for value in values):
            return kind
    if all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
        return float
    return str


def _shown(value, kind, interval=False):
    if kind is float or (kind is int and interval):
        return value if kind is int else float(value)
    if kind is bool:
        return value
    if isinstance(value, (list, tuple, ListConfig)):
        return str(list(value))
    return "null" if value is None else str(value)  # ints too: digits, not `4.0000`


def _leaves(node, prefix=""):
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, (dict, DictConfig)):
            yield from _leaves(value, f"{name}.")
        else:
            yield name, value


def _run_value(cfg, hydra_cfg, key):
    """The run's value of a swept key: a config group's chosen option, or the config's value."""
    choices = hydra_cfg.runtime.choices
    if key in choices:
        return choices[key]
    return OmegaConf.select(cfg, key.lstrip("+~"))


def hparams_and_values(cfg, hydra_cfg):
    """The dashboard's hyper-parameters (swept keys first, with their domains) and this run's values."""
    domains = sweep_domains(hydra_cfg)
    hparams, values = [], {}
    for key, domain in domains.items():
        value = _run_value(cfg, hydra_cfg, key)
        interval = isinstance(domain, tuple)
        kind = _kind(list(domain or []) + [value])
        if interval:
            low, high = domain
            hparam = hp.HParam(key, hp.IntInterval(low, high) if kind is int else hp.RealInterval(float(low),
                                                                                                   float(high)))
        elif domain:
            hparam = hp.HParam(key, hp.Discrete(set(_shown(item, kind) for item in domain)))
        else:
            hparam = hp.HParam(key)
        hparams.append(hparam)
        values[key] = _shown(value, kind, interval)
    for key, value in _leaves(OmegaConf.to_container(cfg, resolve=True)):
        if key not in values:
            hparams.append(hp.HParam(key))
            values[key] = _shown(value, _kind([value]))
    return hparams, values, set(domains)


def metric_columns(task) -> list:
    """The task's validation metrics, validation and train loss, then the other tasks' metrics."""
    own = TASK_METRICS[task]
    others = dict.fromkeys(tag for tags in TASK_METRICS.values() for tag in tags if tag not in own)
    validation = dict(group="validation", dataset_type=hp.Metric.VALIDATION)
    return ([hp.Metric(tag, **validation) for tag in own]
            + [hp.Metric("loss", **validation), hp.Metric("loss", group="train", dataset_type=hp.Metric.TRAINING)]
            + [hp.Metric(tag, **validation) for tag in others])


def config_pb(hparams, metrics, swept):
    """`hp.hparams_config_pb` with the swept keys marked as differing (the API has no argument for it), and
    int domains listed in numeric order."""
    summary = hp.hparams_config_pb(hparams=hparams, metrics=metrics)
    content = summary.value[0].metadata.plugin_data
    data = plugin_data_pb2.HParamsPluginData.FromString(content.content)
    for info in data.experiment.hparam_infos:
        info.differs = info.name in swept
        listed = [value.string_value for value in info.domain_discrete.values]
        if listed and all(item.lstrip("-").isdigit() for item in listed):
            info.domain_discrete.Clear()
            info.domain_discrete.extend(sorted(listed, key=int))
    content.content = data.SerializeToString()
    return summary
