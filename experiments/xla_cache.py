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
"""
import atexit
import fcntl
import hashlib
import importlib.metadata
import logging
import os
import platform
import shutil
import uuid
from pathlib import Path

log = logging.getLogger(__name__)
FLAG = "--tf_xla_persistent_cache_directory"
_LOCK = ".lock"

_private = None  # this process's folder, once enabled
_shared = None
_lock_fd = None
_note = []  # what `report` logs


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
        cpuinfo = Path("/proc/cpuinfo").read_text()
        parts += [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.startswith(("model name", "flags"))][:2]
    except OSError:
        parts.append(platform.processor())
    for gpu in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        parts += [line for line in gpu.read_text().splitlines() if line.startswith("Model:")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def folder(cache_home) -> Path:
    """The shared folder of this TensorFlow release on this kind of machine under the cache home."""
    return Path(cache_home) / "xla" / f"tf-{_version()}" / machine()


def enable(cache_home) -> Path | None:
    """Points XLA's persistent cache at this process's private folder under `cache_home`; call before TensorFlow
    lists its devices, which is when it reads TF_XLA_FLAGS. Returns the shared folder, or None when the
    user's own TF_XLA_FLAGS name a cache folder (theirs is used as it is). Later calls change nothing."""
    global _private, _shared, _lock_fd
    if _shared is not None:
        return _shared
    flags = os.environ.get("TF_XLA_FLAGS", "")
    if FLAG in flags:
        _note.append("TF_XLA_FLAGS names its own XLA cache folder; using it as it is")
        return None
    shared = folder(cache_home)
    shared.mkdir(parents=True, exist_ok=True)
    _remove_dead(shared)
    # Locked before it gets the name that _remove_dead looks for: no `.job-*` folder is ever unlocked while alive.
    name = uuid.uuid4().hex[:12]
    unnamed, private = shared / f".new-{name}", shared / f".job-{name}"
    unnamed.mkdir()
    _lock_fd = os.open(unnamed / _LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(_lock_fd, fcntl.LOCK_EX)
    unnamed.rename(private)
    seeded = 0
    for entry in _entries(shared):
        try:
            os.link(entry, private / entry.name)
            seeded += 1
        except OSError:
            shutil.copyfile(entry, private / entry.name)  # a file system without hard links
            seeded += 1
    prefix = f"tf{_version()}".replace(".", "_") + "_"
    os.environ["TF_XLA_FLAGS"] = f"{flags} {FLAG}={private} --tf_xla_persistent_cache_prefix={prefix}".strip()
    _private, _shared = private, shared
    atexit.register(_close)
    _note.append(f"XLA programs are cached in {shared} ({seeded} there already)")
    return shared


def report() -> None:
    """Logs where the compiled programs are kept, once. It waits for the run to hold its directory: `enable` runs
    before Hydra's job log is known to be this process's to write (a start refused as a second trainer writes
    nothing into the live run's run.log)."""
    while _note:
        log.info(_note.pop(0))


def publish() -> int:
    """Links the whole entries this process compiled into the shared folder; returns how many were new."""
    if _private is None:
        return 0
    published = 0
    for entry in _entries(_private):
        target = _shared / entry.name
        if target.exists():
            continue
        try:
            os.link(entry, target)  # atomic: another process sees the whole file or none
        except FileExistsError:
            continue  # another job published the same program
        except OSError:
            temporary = _shared / f".{entry.name}.{uuid.uuid4().hex[:8]}.tmp"
            shutil.copyfile(entry, temporary)
            os.replace(temporary, target)
        published += 1
    if published:
        log.info("Published %d compiled XLA program(s) to %s", published, _shared)
    return published


def _entries(directory):
    return sorted(path for path in Path(directory).glob("*.pb") if path.is_file())


def _remove_dead(shared):
    """Removes the private folders of processes that died without cleaning up: their locks can be taken."""
    for private in shared.glob(".job-*"):
        try:
            fd = os.open(private / _LOCK, os.O_RDWR)
        except OSError:
            continue  # no lock file yet: a process is creating it this instant
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # alive
        finally:
            os.close(fd)
        shutil.rmtree(private, ignore_errors=True)


def _close():
    global _private
    try:
        publish()
    except OSError as error:
        log.warning("Could not publish the compiled XLA programs: %s", error)
    if _private is not None:
        shutil.rmtree(_private, ignore_errors=True)
        _private = None
    if _lock_fd is not None:
        os.close(_lock_fd)
