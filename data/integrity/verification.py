"""Whether image files are whole, checked per file and remembered by (path, size, mtime).

A full decode of every image up front would cost CPU-minutes for a real release
(docs/input-pipeline.md). A damaged file is nearly always a truncated
one or not an image at all, and both show at its two ends: a PNG starts with its
signature and IHDR and ends with IEND, a JPEG starts with SOI and ends with EOI,
a GIF ends with its trailer byte. So a file is checked by reading its first and
last bytes (`problem`), once: the verdicts are kept per file, keyed by its size,
mtime and ctime (which no copy or editor can set back, so a file rewritten in place
with its old size and mtime is read again), and only new or changed files are read
again (`check_files`).

A file that passes this check but does not decode, or one that was never
checked (``pipeline.verify_images=false``), is left out by the pipeline when
its decode fails, and listed in skipped.csv then (data/integrity/unreadable.py).
"""
import hashlib
import logging
import os
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tf_harness.data.integrity import pickle_cache, reading, resources
from tf_harness.data.integrity.cache_folder import cache_home

log = logging.getLogger(__name__)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: zero length, type, CRC
JPEG_START, JPEG_END = b"\xff\xd8\xff", b"\xff\xd9"
GIF_SIGNATURES, GIF_END = (b"GIF87a", b"GIF89a"), b";"
BMP_SIGNATURE = b"BM"
# Some writers pad a JPEG after its EOI marker; the marker is looked for in this many last bytes.
JPEG_TAIL = 64
_PNG_COLOUR_TYPES = {0, 2, 3, 4, 6}
_CHUNK = 500
# Bump when `problem` or the verdicts' key changes, so every file is checked again.
VERSION = 4


def _png_problem(head, tail):
    if len(head) < 26 or head[12:16] != b"IHDR":
        return "damaged PNG header (no IHDR chunk)"
    width, height = struct.unpack(">II", head[16:24])
    if width == 0 or height == 0 or head[24] not in (1, 2, 4, 8, 16) or head[25] not in _PNG_COLOUR_TYPES:
        return f"damaged PNG header ({width}x{height}, bit depth {head[24]}, colour type {head[25]})"
    if not tail.endswith(PNG_END):
        return "truncated PNG (no IEND chunk at the end)"
    return None


def problem(path):
    """What is wrong with the image file at `path` from its first and last bytes, or None when it looks whole."""
    try:
        with reading.open_file(path, "rb") as f:
            head = f.read(32)
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - JPEG_TAIL, 0))
            tail = f.read()
    except reading.SpecialFileError as error:
        return str(error)
    except OSError as error:
        resources.raise_if_exhausted(error)  # out of file handles or memory: no verdict on the file
        return f"unreadable file ({error.strerror or error})"
    if not head:
        return "empty file"
    if head.startswith(PNG_SIGNATURE):
        return _png_problem(head, tail)
    if head.startswith(JPEG_START):
        return None if JPEG_END in tail else "truncated JPEG (no EOI marker at the end)"
    if head.startswith(GIF_SIGNATURES):
        return None if tail.rstrip(b"\0").endswith(GIF_END) else "truncated GIF (no trailer at the end)"
    if head.startswith(BMP_SIGNATURE):
        return None
    return "not a PNG, JPEG, GIF or BMP file"


def _top(paths) -> str:
    """The folder that holds the sorted `paths`."""
    return os.path.abspath(os.path.commonpath([paths[0], paths[-1]])) if paths else ""  # sorted: the ends share least


def _records_key(paths) -> tuple:
    """What decides a verdicts file's content besides the files themselves: the check's version, and the folder."""
    return VERSION, _top(paths)


def _records_file(paths):
    """The verdicts' file for the folder that holds the sorted `paths` (one per dataset root)."""
    digest = hashlib.sha256(f"{VERSION}\0{_top(paths)}".encode()).hexdigest()[:20]
    return cache_home() / "verified" / f"files-{digest}.pkl"


_KEY_FIELDS = 3  # size, mtime_ns, ctime_ns


def _stats(paths):
    """(size, mtime_ns, ctime_ns) of each of `paths`, -1s where it cannot be read, as an int64 array."""
    def key(path):
        try:
            stat = os.stat(path)
            return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns
        except OSError:
            return -1, -1, -1

    # In one thread: spread over several, the GIL between such short calls makes them slower.
    return np.array([key(path) for path in paths], dtype=np.int64).reshape(-1, _KEY_FIELDS)


def _known_keys(records, paths):
    """The (size, mtime_ns, ctime_ns) each of `paths` (other files than `records` holds) had when last checked;
    -2s for one never checked."""
    row = {path: number for number, path in enumerate(records["paths"])}
    known = np.full((len(paths), _KEY_FIELDS), -2, dtype=np.int64)
    found = [(number, row[path]) for number, path in enumerate(paths) if path in row]
    if found:
        now, then = np.array(found).T
        known[now] = records["keys"][then]
    return known


def check_files(paths, workers=8):
    """Checks the image files among `paths` that are new or changed since they were last checked.

    The verdicts are kept as the sorted paths, an array of their (size, mtime, ctime) keys and the problems
    found, so that a warm start of 112,120 files loads and compares them in a few array operations.

    Returns:
        ({path: problem} for every file that is not whole, the number of files read this time).
    """
    paths = sorted(set(paths))
    records_file = _records_file(paths)
    records = pickle_cache.read(records_file, None, key=_records_key(paths)) or {
        "paths": [], "keys": np.zeros((0, _KEY_FIELDS), np.int64), "problems": {}}
    keys = _stats(paths)
    same_files = records["paths"] == paths  # the usual warm start: the keys compare in one go
    known = records["keys"] if same_files else _known_keys(records, paths)
    changed = (keys != known).any(axis=1) | (keys[:, 0] < 0)
    stale = [path for path, is_stale in zip(paths, changed) if is_stale]
    problems = records["problems"]
    if not same_files:  # forget the files that are gone
        present = set(paths)
        problems = {path: problem for path, problem in problems.items() if path in present}
    # Reads release the GIL, and a cold disk wants many in flight; chunks keep the pool's cost per file small.
    chunks = [stale[start:start + _CHUNK] for start in range(0, len(stale), _CHUNK)]
    with ThreadPoolExecutor(workers) as pool:
        for chunk, verdicts in zip(chunks, pool.map(lambda chunk: [problem(path) for path in chunk], chunks)):
            for path, verdict in zip(chunk, verdicts):
                problems.pop(path, None)
                if verdict is not None:
                    problems[path] = verdict
    if stale or not same_files:
        pickle_cache.write(records_file, {"paths": paths, "keys": keys, "problems": problems},
                           key=_records_key(paths))
    return problems, len(stale)
