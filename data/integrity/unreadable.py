"""Image files that fail to read or decode mid-run: left out, never fatal, and listed in skipped.csv.

The two-ends check (data/integrity/verification.py) finds truncated files and non-images up front, but a file
whose two ends are whole can still be damaged inside (a bad disk block, a broken copy), and only a
full decode finds that, which for a whole release up front would cost CPU-minutes (docs/input-pipeline.md).
So the decode itself is the check. `guard` runs each record's load in a one-element dataset of its own with
`ignore_errors`, so that a load that fails gives a blank element of weight 0 instead of an error that
ends the iterator. Evaluation keeps that row, counting for nothing, so table order holds; training
leaves it out. The failing record's paths are written from the graph, one small file per record in
the run's report folder, and the runner turns them into skipped.csv rows (`collect`), with the
reason found on the host. No Python runs per example: only per failed one, on the host. The guard
costs CPU, so input_fn uses it where every record must decode (evaluation) and, in training, for
each file's first decode only (data/input_fn.py, `_loaded`).
"""
import logging
import os
import re
from pathlib import Path

import tensorflow as tf

from tf_harness.data.errors import DatasetError
from tf_harness.data.integrity import reading, resources
from tf_harness.data.integrity.verification import problem

# Training stops, naming this module's message, after this many failed records in a row (or a whole
# guarded pass of fewer): a load that fails on every record (the wrong kind of files, a bug) would
# otherwise leave a filter waiting forever.
MAX_FAILED_IN_A_ROW = 1000
FAILED_IN_A_ROW = "records in a row failed to read or decode"
# A report is named by the hash of the paths it lists (`guard`): a file whose name is not the hash of its
# content was not written whole by a pipeline, and is not taken for one.
_REPORT_NAME = re.compile(r"(\d+)\.txt")
_HASH_BUCKETS = 2 ** 62
# Report files logged as ignored, by (path, size, mtime): each once, until it changes.
_ignored = set()

log = logging.getLogger(__name__)


def report_folder(model_dir) -> Path:
    """Where a run's pipelines report the records they left out: a folder in the run directory."""
    return Path(model_dir) / ".unreadable"


def guard(load, paths, report_dir=None):
    """Wraps a record source's `load` so that it never raises.

    Args:
        load: record -> (features, label), graph ops.
        paths: record -> list of the record's image paths (string scalars).
        report_dir: where a failed record's paths are written, one file per record; None: nowhere.

    Returns:
        record -> (features, label, weight): weight 1.0, or 0.0 with zeros when `load` failed.
    """
    def report(record):
        if report_dir is None:
            return tf.constant(True)
        listed = tf.strings.reduce_join(tf.stack(paths(record)), separator="\n")
        # Named by the paths' hash: a file that fails every epoch is reported once.
        name = tf.strings.as_string(tf.strings.to_hash_bucket_fast(listed, _HASH_BUCKETS))
        tf.io.write_file(tf.strings.join([str(report_dir), "/", name, ".txt"]), listed)
        return tf.constant(True)

    def load_or_blank(record):
        loaded = tf.data.Dataset.from_tensors(record).map(lambda r: (*load(r), tf.constant(1.0)))
        blank = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), loaded.element_spec)
        blank = blank[:-1] + (tf.constant(0.0),)
        element = loaded.ignore_errors().concatenate(tf.data.Dataset.from_tensors(blank)).take(1)
        features, label, weight = element.get_single_element()
        reported = tf.cond(weight > 0, lambda: tf.constant(False), lambda: report(record))
        with tf.control_dependencies([reported]):
            return features, label, tf.identity(weight)

    return tf.autograph.experimental.do_not_convert(load_or_blank)


def drop_failed(data: tf.data.Dataset, records: int) -> tf.data.Dataset:
    """Training: leaves out the records `guard` blanked (weight 0) of a pass of `records`; stops when
    MAX_FAILED_IN_A_ROW in a row, or all of them, failed."""
    limit = min(MAX_FAILED_IN_A_ROW, records)

    def count(in_a_row, element):
        in_a_row = tf.where(element[2] > 0, tf.constant(0, tf.int64), in_a_row + 1)
        check = tf.debugging.assert_less(in_a_row, tf.constant(limit, tf.int64),
                                         message=f"{limit} {FAILED_IN_A_ROW}")
        with tf.control_dependencies([check]):
            return in_a_row, tf.nest.map_structure(tf.identity, element)

    def loaded(features, label, weight):
        return weight > 0

    def unweighted(features, label, weight):
        return features, label

    data = data.scan(tf.constant(0, tf.int64), tf.autograph.experimental.do_not_convert(count))
    return data.filter(tf.autograph.experimental.do_not_convert(loaded)).map(
        tf.autograph.experimental.do_not_convert(unweighted))


def _reason(path) -> str:
    """Why the image file at `path` was left out, found again on the host."""
    found = problem(path)
    if found:
        return f"undecodable image: {found}"
    try:
        tf.io.decode_image(tf.io.read_file(path), expand_animations=False).numpy()
    except tf.errors.OpError as error:
        resources.raise_if_exhausted(error, f"decoding {path} again")  # no verdict on the file, then
        return f"undecodable image: damaged inside ({decode_message(error)})"
    return None


def decode_message(error: tf.errors.OpError) -> str:
    """What a failed decode says, in one line: ``{{function_node ...}} Invalid PNG data, size 223248
    [Op:DecodeImage] name:`` -> ``Invalid PNG data, size 223248``."""
    return (error.message.splitlines() or [""])[0].rpartition("}}")[2].partition(" [Op:")[0].strip()


def _written_by_guard(name, content: bytes) -> bool:
    """Whether a report file named `name` holding `content` is one `guard` wrote: named by its content's hash."""
    match = _REPORT_NAME.fullmatch(name)
    return bool(match) and int(match.group(1)) == int(tf.strings.to_hash_bucket_fast(content, _HASH_BUCKETS))


def _listed_paths(path) -> list:
    """The image paths that the report file at `path` lists; none, logged once, for a file `guard` did not write
    (a name that is not the hash of its content: damaged, cut short, or put there) or a directory."""
    try:
        content, why = reading.read_bytes(path), None
    except IsADirectoryError:
        content, why = b"", f"{path} is a directory, not a report; ignored"
    except OSError as error:  # a named pipe in its place, too (reading.SpecialFileError)
        content, why = b"", f"{path} cannot be read ({error.strerror or error}); ignored"
    if why is None and not _written_by_guard(Path(path).name, content):
        why = f"{len(content.splitlines())} unreadable lines in {path} ignored (not a report a pipeline wrote)"
    if why is None:
        # Paths as the tables hold them, which the pipeline wrote as UTF-8.
        return content.decode("utf-8", "surrogateescape").split("\n")
    try:
        stat = os.stat(path)
        state = (str(path), stat.st_size, stat.st_mtime_ns)
    except OSError:
        state = (str(path),)
    if state not in _ignored:
        _ignored.add(state)
        log.warning("%s", why)
    return []


def collect(report_dir, known) -> list:
    """The (path, reason) rows for records reported in `report_dir` whose paths are not in `known`.

    A record of several images (an LFW pair) lists each; the image that fails on the host is named. A record
    whose images all read and decode whole on the host is no fault of the data (the pipeline ran short of memory
    or file handles, say): it is logged, never listed, and counted for `in_a_row_error`. A file that is not a report
    `guard` wrote lists nothing (`_listed_paths`). OutOfResource when the host runs out of a resource itself.
    """
    rows, whole = [], 0
    try:
        reports = sorted(os.scandir(report_dir), key=lambda entry: entry.name)
    except FileNotFoundError:
        return rows
    for entry in reports:
        paths = [path for path in _listed_paths(entry.path) if path and path not in known]
        reasons = [(path, _reason(path)) for path in paths]
        failing = [(path, reason) for path, reason in reasons if reason]
        rows += failing
        if paths and not failing:
            whole, example = whole + 1, " and ".join(paths)
        known.update(paths)
    if whole:
        log.warning("%d record(s) failed to load in the input pipeline but read and decode whole here (%s%s): not "
                    "listed in skipped.csv; the pipeline may have run short of memory or file handles", whole,
                    example, ", ..." if whole > 1 else "")
    if rows or whole:
        _last_judged.update(bad=len(rows), whole=whole)
    return rows


# What the last `collect` that found new reports judged: how many images were at fault, how many records whole.
_last_judged = {"bad": 0, "whole": 0}


def in_a_row_error(failed: str, where: str, dataset: str) -> Exception:
    """The error of a pass that stopped because `failed` ("N records in a row failed ...") at `where`, after
    `collect` has judged the reports: a DatasetError when the files are at fault, OutOfResource when every record
    it could judge reads and decodes whole here (the pipeline ran out of memory or file handles, not the data)."""
    if _last_judged["whole"] and not _last_judged["bad"]:
        return resources.OutOfResource(
            f"{failed} {where}, yet they read and decode whole outside the input pipeline: it ran out of memory or "
            f"file handles, not a fault of the data (none listed in skipped.csv); ask for less (a smaller "
            f"pipeline.image_size or pipeline.batch_size), then run the same command again")
    return DatasetError(f"{failed} {where}: the image files are not what dataset={dataset} reads (listed in "
                        f"skipped.csv)")
