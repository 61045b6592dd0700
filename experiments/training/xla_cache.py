"""XLA's compiled programs kept across runs, so a second run or a sweep's next job skips the compile.

TensorFlow persists each program XLA compiles for a `jit_compile=True` function when TF_XLA_FLAGS names
`--tf_xla_persistent_cache_directory`, and a later process loads it back only after checking that its key
(a hash of the HLO module, the device type and a prefix) and its whole HLO module match what it is about
to compile: a program for other shapes or dtypes is never served. The prefix and the folder carry
TensorFlow's version, so no other release reads them, and the folder a key of the machine's CPU and GPUs
(`machine`), so a cache home shared between unlike machines never hands one a program built for another.

TensorFlow writes an entry with a plain write, which another process could read half-written. So each
process compiles into a private folder, seeded with hard links to the shared entries, and publishes its
new entries into the shared folder with one hard link each, an atomic step, once they are whole: after a
run's first training loop and at exit. A private folder is owned through an flock held for the process's
life; one whose lock can be taken belonged to a dead process, and the next start removes it.

TensorFlow trusts what it finds in its folder: an entry cut short fails the compile ("Read less bytes than
requested"), and with it the run. So an entry is checked when it is published, that it is a whole protocol
buffer, and a record of its size and sha256 (`<entry>.sha256`) is written beside it first; at the next start
each entry is checked against its record before it seeds the private folder. One that fails (cut, written
over, emptied, a folder in its place, its record missing or garbled) is left out, removed with its record, and
named in one warning; the run compiles that program again and publishes it anew. Nothing the cache's entries
hold can fail a run: a failure to publish is a warning too.
"""
import atexit
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import time
import uuid
from pathlib import Path

from tf_harness.data.integrity import locks, reading, writing

log = logging.getLogger(__name__)
FLAG = "--tf_xla_persistent_cache_directory"
# Names the flags `enable` added to TF_XLA_FLAGS, so a process this one starts, which inherits them, tells them
# from a user's own and takes a private folder of its own.
ADDED = "HARNESS_XLA_FLAGS_ADDED"
_LOCK = ".lock"
RECORD = ".sha256"  # an entry's record is its name with this added
# A record this old without its entry was left by a publisher that died between the two: another may replace it.
ORPHAN_AGE_S = 60

_private = None  # this process's folder, once enabled
_shared = None
_lock = None  # the private folder's, held for the process's life
_note = []  # what `report` logs: (level, message)


def _version() -> str:
    # From the package's metadata: nothing here may import TensorFlow, which reads TF_XLA_FLAGS as it starts.
    return importlib.metadata.version("tensorflow")


def machine() -> str:
    """A short key of what a compiled program is built for beyond its HLO: the CPU's model and instruction set
    extensions, and each NVIDIA GPU's model. TensorFlow's own key names only the device type (XLA_CPU_JIT,
    XLA_GPU_JIT), so a cache folder shared between unlike machines must not mix their programs. Read from /proc,
    not from TensorFlow: listing its devices would read TF_XLA_FLAGS before `enable` has set them."""
    parts = [platform.machine()]
    try:
        cpuinfo = reading.read_text("/proc/cpuinfo")
        parts += [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.startswith(("model name", "flags"))][:2]
    except OSError:
        parts.append(platform.processor())
    for gpu in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        parts += [line for line in reading.read_text(gpu).splitlines() if line.startswith("Model:")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def folder(cache_home) -> Path:
    """The shared folder of this TensorFlow release on this kind of machine under the cache home."""
    return Path(cache_home) / "xla" / f"tf-{_version()}" / machine()


def enable(cache_home) -> Path | None:
    """Points XLA's persistent cache at this process's private folder under `cache_home`; call before TensorFlow
    lists its devices, which is when it reads TF_XLA_FLAGS. Returns the shared folder, or None when the
    user's own TF_XLA_FLAGS name a cache folder (theirs is used as it is). Later calls change nothing.
    The private folder gets the shared entries that match their records; the others are removed (`report` names
    each once)."""
    global _private, _shared, _lock
    if _shared is not None:
        return _shared
    flags = _users_flags()
    if FLAG in flags:
        _note.append((logging.INFO, "TF_XLA_FLAGS names its own XLA cache folder; using it as it is"))
        return None
    shared = folder(cache_home)
    shared.mkdir(parents=True, exist_ok=True)
    _remove_dead(shared)
    # Locked before it gets the name that _remove_dead looks for: no `.job-*` folder is ever unlocked while alive.
    name = uuid.uuid4().hex[:12]
    unnamed, private = shared / f".new-{name}", shared / f".job-{name}"
    unnamed.mkdir()
    _lock = locks.take(unnamed / _LOCK, wait=True)  # a folder made this instant: nobody else holds it
    unnamed.rename(private)
    problems = [_seed(entry, private / entry.name) for entry in sorted(shared.glob("*.pb"))]
    prefix = f"tf{_version()}".replace(".", "_") + "_"
    added = f"{FLAG}={private} --tf_xla_persistent_cache_prefix={prefix}"
    os.environ["TF_XLA_FLAGS"], os.environ[ADDED] = f"{flags} {added}".strip(), added
    _private, _shared = private, shared
    atexit.register(_close)
    seeded = sum(problem is None for problem in problems)
    _note.append((logging.INFO, f"XLA programs are cached in {shared} ({seeded} there already)"))
    _note.extend((logging.WARNING, problem) for problem in problems if problem)
    return shared


def _users_flags() -> str:
    """TF_XLA_FLAGS without what the `enable` of the process that started this one added: that names the
    parent's private folder, which this process must not write into."""
    flags, added = os.environ.get("TF_XLA_FLAGS", ""), os.environ.get(ADDED, "")
    return " ".join(flags.replace(added, " ").split()) if added else flags


def report() -> None:
    """Logs where the compiled programs are kept, and each damaged entry `enable` removed, once. It waits for the
    run to hold its directory: `enable` runs before Hydra's job log is known to be this process's to write (a
    start refused as a second trainer writes nothing into the live run's run.log)."""
    while _note:
        log.log(*_note.pop(0))


def publish() -> int:
    """Links the whole entries this process compiled into the shared folder, each after its record; returns how
    many were new. An entry that is not whole is left out, and an error of the shared folder (a full disk, say)
    ends the publishing: each is one warning, never an exception."""
    if _private is None:
        return 0
    published = 0
    try:
        for entry in _entries(_private):
            published += _publish(entry, _shared / entry.name)
    except OSError as error:
        log.warning("Could not publish the compiled XLA programs to %s: %s", _shared, error)
    if published:
        log.info("Published %d compiled XLA program(s) to %s", published, _shared)
    return published


def _publish(entry, target) -> bool:
    """Publishes the private `entry` as `target`, its record first; False when it is there already, another
    process is publishing it, or it is not whole."""
    if os.path.lexists(target):
        return False
    data = reading.read_bytes(entry)
    problem = _unwhole(data)
    if problem:
        log.warning("The compiled XLA program %s %s; not published", entry, problem)
        return False
    if not _claim(_record_of(target), {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}):
        return False
    try:
        os.link(entry, target)  # atomic: another process sees the whole file or none
    except FileExistsError:
        return False  # another job published the same program
    except OSError:
        temporary = _shared / f".{entry.name}.{uuid.uuid4().hex[:8]}.tmp"
        shutil.copyfile(entry, temporary)  # a file system without hard links
        writing.publish(temporary, target)
    return True


def _claim(record, content: dict) -> bool:
    """Writes `record`, made anew, for an entry about to be published; False when another process is publishing
    that entry now (its record is there, another and young). A record left without its entry for ORPHAN_AGE_S is
    replaced. Readers look only at the records of entries that are there, so neither write is seen half done."""
    try:
        file = writing.creating(record)
    except FileExistsError:
        if _read_record(record) == content:
            return True  # left by a publisher of the same bytes
        try:
            if time.time() - record.stat().st_mtime < ORPHAN_AGE_S:
                return False
        except FileNotFoundError:
            return False  # removed this instant: its entry is found damaged, and the next start publishes anew
        temporary = record.with_name(f".{record.name}.{uuid.uuid4().hex[:8]}.tmp")  # unique across hosts
        with writing.replacing(record, temporary=temporary) as file:
            json.dump(content, file)
        return True
    with file:
        json.dump(content, file)
    return True


def _seed(entry, copy):
    """Puts the shared `entry` into the private folder as `copy` once it matches its record. Returns None when it
    did; "" when the entry vanished meanwhile (another process found it damaged and removed it); otherwise the
    warning that says why not, once the copy is removed, and, when the entry itself is at fault, it and its record."""
    found = None
    try:
        if entry.is_symlink() or not entry.is_file():
            raise _Bad("is not a file")
        found = os.stat(entry)
        try:
            os.link(entry, copy)
        except FileNotFoundError:
            raise
        except OSError:
            shutil.copyfile(entry, copy)  # a file system without hard links
        _check(copy, _read_record(_record_of(entry)))
        return None
    except FileNotFoundError:
        _remove_quietly(copy)
        return ""
    except _Bad as bad:
        _remove_quietly(copy)
        _discard(entry, found)
        return f"The cached XLA program {entry} {bad}; removed it, this run compiles the program again"
    except OSError as error:
        _remove_quietly(copy)
        return f"The cached XLA program {entry} could not be used ({error}); this run compiles the program again"


def _check(copy, record) -> None:
    """Raises _Bad when the file `copy` is not what `record` (or None: no readable record) describes."""
    if record is None:
        raise _Bad(f"has no readable record of its size and sha256 beside it ({RECORD})")
    actual = _describe(copy)
    if actual["bytes"] != record["bytes"]:
        raise _Bad(f"holds {actual['bytes']} bytes where its record says {record['bytes']}")
    if actual["sha256"] != record["sha256"]:
        raise _Bad("does not match the sha256 of its record")


class _Bad(Exception):
    """Why a shared entry cannot seed a private folder."""


def _discard(entry, found) -> None:
    """Removes the shared `entry` and its record when it is still the file `found` (an os.stat; None for one that
    is not a file): another process may have published a whole one meanwhile. The record goes first: a record
    without its entry is never read."""
    try:
        if found is not None:
            now = os.stat(entry)
            if (now.st_dev, now.st_ino) != (found.st_dev, found.st_ino):
                return
        _record_of(entry).unlink(missing_ok=True)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)
    except OSError:
        pass  # left for the next start: this run does without it all the same


def _remove_quietly(path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # a private copy: removed with the private folder at exit


def _record_of(entry) -> Path:
    return entry.with_name(entry.name + RECORD)


def _read_record(record):
    """The record {"bytes", "sha256"} in the file `record`; None when there is none, or it cannot be read or is
    not one."""
    try:
        content = json.loads(reading.read_text(record))
    except (OSError, ValueError):
        return None
    if (not isinstance(content, dict) or set(content) != {"bytes", "sha256"} or type(content["bytes"]) is not int
            or not isinstance(content["sha256"], str)):
        return None
    return content


def _describe(path) -> dict:
    """The record of the file at `path`: its size and sha256."""
    digest, size = hashlib.sha256(), 0
    with reading.open_file(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


def _unwhole(data: bytes):
    """Why `data`, a private entry's bytes, is not a whole entry, or None. TensorFlow writes an entry as one
    protocol buffer, whose fields' lengths tell one cut short."""
    from google.protobuf import empty_pb2
    from google.protobuf.message import DecodeError

    if not data:
        return "is empty"
    try:
        empty_pb2.Empty().ParseFromString(data)  # keeps the fields it does not know, checking their lengths
    except DecodeError:
        return "is not a whole protocol buffer"
    return None


def _entries(directory):
    return sorted(path for path in Path(directory).glob("*.pb") if path.is_file())


def _remove_dead(shared):
    """Removes the private folders of processes that died without cleaning up: their locks can be taken."""
    for private in shared.glob(".job-*"):
        try:
            lock = locks.take(private / _LOCK, create=False)
        except OSError:
            continue  # no lock file yet: a process is creating it this instant
        if lock is None:
            continue  # alive
        with lock:
            shutil.rmtree(private, ignore_errors=True)


def _close():
    global _private
    publish()
    if _private is not None:
        shutil.rmtree(_private, ignore_errors=True)
        _private = None
    if _lock is not None:
        _lock.release()
