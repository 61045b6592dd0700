"""A run's record for TensorBoard's HParams dashboard: the keys its sweep varies, their domains, the metric
columns, its trial id and how it ended.

How the dashboard reads a log dir (TensorBoard 2.21), and what each record does about it:

- It takes one run's `hparams_config` for the whole log dir, the first it finds, and ticks its first five metric
  columns; parallel coordinates draws a line only for a run that has a value in every ticked column. So a run
  declares only the metrics its dataset writes (its own first: a single-dataset log dir gets a line per run), and
  a sweep over `dataset` also declares the other swept datasets' metrics, so that the table has their columns
  whichever run is read first.
- It ticks the first five hyper-parameters, taking those marked as differing first. The keys the sweep varies are
  marked so; every other leaf of the config follows (the first of them fill up the five), for ticking in.
- It prints every number with five significant digits (`4.0000`). So an int is recorded as its digits, unless the
  sweep draws it from an interval, which needs a number.
- It groups runs by trial id, shown in the Trial ID column (10em: about 16 characters, the rest cut), and the default
  id is a hash of the values. So the trial id is a sweep job's number then its sweep folder's name, or a single
  run's folder name: what tells rows apart comes first, and repeated sweeps with the same values stay apart.
- Its filter offers a discrete domain's values as checkboxes, and unticking one hides the runs that have it. So
  swept keys declare a domain, the values the sweep lists or the interval it draws from, and the others none.
- It reads a session's status (Success, Failure: the Status filter) from a session-end record, the first one a run
  holds. So each job that ends writes one, and an `exit_status` scalar (the job's exit status, a metric column),
  into an event file of its own that replaces the previous job's (`mark_session`).

Nothing here imports TensorFlow: the sweep report (experiments/sweeps/sweep_report.py) marks sessions with it.
"""
import json
import logging
import os
import socket
import time
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, ListConfig
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hp  # what `api` exports, without importing TensorFlow
from tensorboard.summary.writer.record_writer import RecordWriter

from tf_harness.data.integrity import reading
from tf_harness.data.integrity.writing import replacing
from tf_harness.experiments.evaluation import metrics

log = logging.getLogger(__name__)
# The job's exit status (README's table), a scalar at the top of the run directory: a metric column.
EXIT_STATUS = "exit_status"
# The end of the file that holds a run's session-end record and exit status.
SESSION_END = ".session_end"


def sweep_domains(job) -> dict:
    """Each key the sweep varies: a list of the values it lists, (low, high) for an interval, or None for a
    glob (expanded against conf/). Empty outside a multirun. `job`: experiments/config/settings.py's Job, whose
    `sweep_overrides` are the sweep's own command line and its sweeper's `params` (hparams_search).
    """
    if job.single:
        return {}
    specs = list(job.sweep_overrides)
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


def _run_value(settings, job, key):
    """The run's value of a swept key: a config group's chosen option, or the setting's value."""
    choices = job.choices
    if key in choices:
        return choices[key]
    return settings.value(key.lstrip("+~"))


def hparams_and_values(settings, job):
    """The dashboard's hyper-parameters (swept keys first, with their domains), this run's values, and the swept
    keys' domains (`sweep_domains`)."""
    domains = sweep_domains(job)
    hparams, values = [], {}
    for key, domain in domains.items():
        value = _run_value(settings, job, key)
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
    for key, value in _leaves(settings.to_dict()):
        if key not in values:
            hparams.append(hp.HParam(key))
            values[key] = _shown(value, _kind([value]))
    return hparams, values, domains


def swept_tasks(domains) -> list:
    """The tasks of the datasets a sweep over `dataset` lists (every dataset for a glob); empty otherwise.
    Imports each one's Task (and so TensorFlow): call it in a job."""
    if "dataset" not in domains:
        return []
    from tf_harness.data import TASKS
    names = domains["dataset"] or list(TASKS)
    return list(dict.fromkeys(TASKS[name].SPEC.task for name in names if name in TASKS))


def protocol_columns(dataset, domains) -> list:
    """The protocol metrics (experiments/evaluation/metrics.py `PROTOCOLS`) of `dataset` and of the datasets a sweep
    over
    `dataset` lists (`domains`, as `swept_tasks` reads them)."""
    from tf_harness.data import TASKS
    names = [dataset, *((domains["dataset"] or list(TASKS)) if "dataset" in domains else ())]
    return list(dict.fromkeys(tag for name in names for tag in metrics.protocol_names(name)))


def metric_columns(task, swept=(), protocol=()) -> list:
    """The task's validation metrics, validation and train loss, the exit status (`mark_session`), then the
    metrics of the other tasks in `swept` (a sweep over datasets) and the `protocol` metrics: no column that no run
    of the sweep writes. TensorBoard ticks the first five columns, and draws no line for a run without a value in a
    ticked one: the protocol metrics, which only an evaluation of a whole split writes, come after them."""
    own = metrics.names(task)
    others = dict.fromkeys(tag for other in swept for tag in metrics.names(other) if tag not in own)
    validation = dict(group="validation", dataset_type=hp.Metric.VALIDATION)
    return ([hp.Metric(tag, **validation) for tag in own]
            + [hp.Metric("loss", **validation), hp.Metric("loss", group="train", dataset_type=hp.Metric.TRAINING),
               hp.Metric(EXIT_STATUS, description="the job's exit status: 0 success, 1 failed, 2 config error")]
            + [hp.Metric(tag, **validation) for tag in [*others, *protocol]])


def trial_id(run_dir, job) -> str:
    """The run's Trial ID: a sweep job's number, then its sweep folder's name (`3 · 14-03-22_a1b2c3` for
    `14-03-22_a1b2c3/3`), or a single run's folder name. The 10em column shows the job number and the sweep's time;
    the default folders' names (time and a random id) never repeat, so repeated sweeps stay apart."""
    run_dir = Path(os.path.realpath(run_dir))
    if not job.single:
        sweep = Path(os.path.realpath(job.sweep_dir))
        if run_dir != sweep and run_dir.is_relative_to(sweep):
            return f"{run_dir.relative_to(sweep).as_posix()} · {sweep.name}"
    return run_dir.name


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


def has_record(run_dir) -> bool:
    """Whether the run directory holds its HParams record (the event file at its top that is not `mark_session`'s:
    that one alone, its record deleted, is no row)."""
    return any(not path.name.endswith(SESSION_END) for path in Path(run_dir).glob("events.out.tfevents.*"))


def _global_step(run_dir) -> int:
    """The global step of the run's last evaluation (metrics.json), 0 without one."""
    try:
        return int(json.loads(reading.read_text(Path(run_dir) / "metrics.json")).get("global_step") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def mark_session(run_dir, status) -> Path:
    """Records how the job that ran in `run_dir` ended: its session status (success for exit status 0, failure
    otherwise) and its `exit_status` scalar, in an event file of their own that replaces an earlier job's (the
    dashboard reads only a run's first session-end record). Written with TensorBoard's record writer, not
    TensorFlow's, and atomically. Returns the file."""
    run_dir, now = Path(run_dir), time.time()
    end = plugin_data_pb2.HParamsPluginData(session_end_info=plugin_data_pb2.SessionEndInfo(
        status=api_pb2.STATUS_SUCCESS if status == 0 else api_pb2.STATUS_FAILURE, end_time_secs=now))
    summary = summary_pb2.Summary()
    summary.value.add(tag=metadata.SESSION_END_INFO_TAG, metadata=metadata.create_summary_metadata(end),
                      tensor=metadata.NULL_TENSOR)
    summary.value.add(tag=EXIT_STATUS, simple_value=float(status))
    name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}{SESSION_END}"
    with replacing(run_dir / name, "wb") as f:
        writer = RecordWriter(f)
        writer.write(event_pb2.Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
        writer.write(event_pb2.Event(wall_time=now, step=_global_step(run_dir), summary=summary).SerializeToString())
        for earlier in run_dir.glob(f"events.out.tfevents.*{SESSION_END}"):  # the temporary's name is hidden
            earlier.unlink(missing_ok=True)
    return run_dir / name
