"""metrics.jsonl: every evaluation of a run, one JSON object a line, in the order they were made; and metrics.json,
the last evaluation alone (`write_metrics`, `evaluated_record`).

metrics.json holds the last evaluation only; metrics.jsonl beside it keeps them all, each with its `global_step`
and `time` (seconds since the epoch). So do `metrics_test.jsonl` and `metrics_validation.jsonl` for the records
kept beside metrics.json (a test split's, an older checkpoint's): each evaluation of them, whichever checkpoint.
A run that is re-entered (resumed, `mode=evaluate`, the sidecar evaluator) appends to the file it finds. Each
line is written with one append, flushed to disk, so a kill leaves at worst its last line cut short: the next
append starts on a new line, and a reader skips a line that is not a JSON object, with a warning, never failing
the run.

A step may appear twice: an evaluation killed after its line was written is redone on resume, and a run resumed
from a checkpoint older than its last evaluations evaluates those steps again. The last line of a step is the
evaluation that counts.

Nothing here imports TensorFlow.
"""
import json
import logging
import math
import os
import time
from pathlib import Path

from tf_harness.data.integrity import reading, writing
from tf_harness.data.integrity.writing import replacing

log = logging.getLogger(__name__)

NAME = "metrics.jsonl"


def _clean(values: dict) -> dict:
    """NaN as null, as metrics.json writes it; numpy scalars as Python numbers."""
    clean = {}
    for key, value in values.items():
        if hasattr(value, "item") and not isinstance(value, (str, bytes)):
            value = value.item()
        clean[key] = None if isinstance(value, float) and math.isnan(value) else value
    return clean


def append(model_dir, record: dict, now=time.time, name=NAME) -> None:
    """Appends one evaluation's `record` (its metrics, `global_step` and counts) to `<model_dir>/<name>`
    (metrics.jsonl, or the history of a record kept beside metrics.json: `metrics_test.jsonl`), with its `time`."""
    path = Path(model_dir) / name
    line = json.dumps({**_clean(record), "time": now()}, sort_keys=True) + "\n"
    with writing.appending(path, "ab", buffering=0) as file:
        size = os.fstat(file.fileno()).st_size
        if size and _last_byte(path, size) != b"\n":  # a line cut short by a kill stays a line of its own
            line = "\n" + line
        file.write(line.encode("utf-8"))
        os.fsync(file.fileno())


def _last_byte(path, size) -> bytes:
    with reading.open_file(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1)


def read(model_dir) -> list:
    """The evaluations in `<model_dir>/metrics.jsonl`, oldest first; [] when there is none. A line that is not a
    JSON object with an integer `global_step` is skipped, and the skips are logged in one warning."""
    path = Path(model_dir) / NAME
    try:
        data = reading.read_bytes(path)
    except FileNotFoundError:
        return []
    except OSError as error:
        log.warning("%s cannot be read (%s); taking it as no evaluation history", path, error.strerror or error)
        return []
    records, damaged = [], []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            record = None
        step = record.get("global_step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            damaged.append(number)
            continue
        records.append(record)
    if damaged:
        shown = ", ".join(str(number) for number in damaged[:5]) + (" ..." if len(damaged) > 5 else "")
        log.warning("%s: skipped %d damaged line(s) (line %s): not an evaluation record", path, len(damaged), shown)
    return records


def evaluated_step(model_dir):
    """The global step of the evaluation metrics.json holds; None when there is none yet, or when the file cannot be
    read (logged: the evaluation is redone, and the file written again)."""
    record = evaluated_record(model_dir)
    return None if record is None else record["global_step"]


def evaluated_record(model_dir):
    """The evaluation metrics.json holds, with its int `global_step`; None as for `evaluated_step`."""
    path = os.path.join(model_dir, "metrics.json")
    try:
        values = json.loads(reading.read_text(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        problem = f"cannot be read ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
    else:
        step = values.get("global_step") if isinstance(values, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            return values
        problem = "holds no global_step"
    log.warning("%s %s: taking it as no evaluation; the next one writes it again", path, problem)
    return None


def write_metrics(model_dir, values: dict, name="metrics.json"):
    """Writes metrics.json (or `name` beside it: metrics_test.json, say) atomically, so a reader never sees half a
    file. The temporary file is this process's own: a sidecar evaluator writes metrics.json beside the trainer."""
    path = os.path.join(model_dir, name)
    clean = {key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in values.items()}
    with replacing(path) as f:
        json.dump(clean, f, indent=2, sort_keys=True)
