"""The input pipeline whose iterator each checkpoint holds: `checkpoints/input_pipelines.json`.

A re-entry may change pipeline.source, pipeline.cache, dataset.root and the strategy; a saved iterator restored
into another pipeline would fail, so a resume compares the checkpoint's pipeline with its own and, when they
differ, restarts the input stream (experiments/run_dir/directory.py). Nothing here imports TensorFlow.
"""
import json
import logging
from pathlib import Path

from tf_harness.data.integrity import reading
from tf_harness.data.integrity.writing import replacing

log = logging.getLogger(__name__)
INPUT_RECORD = "input_pipelines.json"


SIGNATURE_KEYS = ("dataset.root", "pipeline.source", "pipeline.cache", "pipeline.batch_size", "strategy")


def input_signature(settings, replicas, saved) -> dict | None:
    """What shapes the training input iterator; None when checkpoints leave the iterator out (`saved` false)."""
    if not saved:
        return None
    return {**{key: settings.value(key) for key in SIGNATURE_KEYS}, "replicas": int(replicas)}


def _input_records(checkpoint_dir, warn=False) -> list:
    """The records `note_input` keeps; none when the file is missing or unreadable (logged when `warn`)."""
    path = Path(checkpoint_dir) / INPUT_RECORD
    try:
        records = json.loads(reading.read_text(path))
    except FileNotFoundError:
        problem = "is missing"
    except (OSError, ValueError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        problem = f"cannot be read ({type(error).__name__})"
    else:
        if isinstance(records, list) and all(
                isinstance(record, dict) and type(record.get("after_step")) is int and "input" in record
                and isinstance(record["input"], (dict, type(None))) for record in records):
            return records
        problem = "does not hold input pipeline records"
    if warn:
        log.warning("%s %s: the checkpoint's input iterator is restored as this run's, and the file written again",
                    path, problem)
    return []


def saved_input(checkpoint_dir, step):
    """(known, signature): the input pipeline of the checkpoint at global `step`, from the record that
    `note_input` keeps; known is False in a run directory written before the record existed, or whose record
    cannot be read (logged)."""
    found = [record for record in _input_records(checkpoint_dir, warn=True) if record["after_step"] < step]
    return (True, found[-1]["input"]) if found else (False, None)


def note_input(checkpoint_dir, step, signature) -> None:
    """Records that checkpoints after global `step` hold the iterator of `signature` (None: no iterator)."""
    records = _input_records(checkpoint_dir)
    if records and records[-1]["input"] == signature:
        return
    records = [record for record in records if record["after_step"] < step] + [
        {"after_step": int(step), "input": signature}]
    path = Path(checkpoint_dir) / INPUT_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as f:
        f.write(json.dumps(records, indent=1))
