"""Embedded samples: small datasets generated once, in the real on-disk layout, into a cache folder.

A sample is generated into a staging folder that its generator holds a lock on (staging.py), given a
manifest of every file's name, size and modification time, written last, and renamed into place whole.
Each start checks the sample against its manifest (one stat per file): a sample with a file missing, cut
or written since (an editor keeps the size, not the time), or without a manifest, is generated again and
swapped in, with one log line saying so. A copy that does not keep times is generated again once.
"""
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tf_harness.data.integrity import reading
from tf_harness.data.integrity.cache_folder import cache_home
from tf_harness.data.integrity.writing import replacing
from tf_harness.data.samples import staging as staging_dir

log = logging.getLogger(__name__)

# Bump when a generator changes, so cached samples are regenerated.
VERSION = 2
# The sample's own record of its files, inside its root; no dataset reader looks at it.
MANIFEST = ".sample-manifest.json"
# Tries at swapping a sample into place while other processes swap theirs.
_SWAP_TRIES = 5


def parallel_map(fn, jobs):
    """Runs `fn` over `jobs` on all cores; PIL and NumPy release the GIL while encoding."""
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return list(pool.map(fn, jobs))


def write_manifest(root: Path) -> None:
    """Records the name, size and modification time of every file under `root` in its manifest, the last file
    written."""
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            files[path.relative_to(root).as_posix()] = _stamp(os.stat(path))
    files.pop(MANIFEST, None)
    with replacing(root / MANIFEST) as f:
        f.write(json.dumps({"version": VERSION, "files": dict(sorted(files.items()))}))


def _stamp(stat) -> list:
    return [stat.st_size, stat.st_mtime_ns]


def mismatch(root: Path):
    """What about the sample at `root` does not match its manifest, or None when every file it lists is there as
    it was written."""
    try:
        files = json.loads(reading.read_text(root / MANIFEST))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        files = None
    if not isinstance(files, dict):  # missing, not JSON, or JSON of another shape
        return f"it has no readable {MANIFEST}"
    missing, changed = [], []
    for name, stamp in files.items():
        try:
            if _stamp(os.stat(root / name)) != stamp:
                changed.append(name)
        except OSError:
            missing.append(name)
    if not missing and not changed:
        return None
    example = (missing or changed)[0]
    return f"{len(missing)} of its {len(files)} files missing, {len(changed)} changed since, e.g. {example}"


def _swap_in(generated: Path, root: Path, aside: Path) -> None:
    """Renames the whole sample `generated` to `root`; a damaged one there is moved to `aside` first (and removed
    with it), and one another process swapped in whole is kept instead."""
    for attempt in range(_SWAP_TRIES):
        try:
            os.rename(generated, root)
            return
        except OSError:
            if not root.exists():
                if attempt == _SWAP_TRIES - 1:
                    raise
                continue
        if mismatch(root) is None:  # a concurrent run's whole sample: use it
            return
        try:
            os.rename(root, aside / f"damaged-{attempt}")
        except FileNotFoundError:
            pass  # another process moved it away first
    raise OSError(f"could not put the generated sample in place at {root}")


def _generate(name: str, make_sample, seed: int, root: Path) -> None:
    root.parent.mkdir(parents=True, exist_ok=True)
    # Generate beside the final place and rename, so a killed generation is never mistaken for a sample.
    with staging_dir.folder(root.parent, name) as staging:
        make_sample(staging / "data", seed)
        write_manifest(staging / "data")
        _swap_in(staging / "data", root, staging)
    log.info("Generated the embedded %s sample in %s", name, root)


def sample_root(name: str, make_sample, seed: int = 0) -> Path:
    """Returns the sample's root, generating it first if it is not cached yet or does not match its manifest."""
    root = cache_home() / "samples" / (f"{name}-v{VERSION}" + (f"-seed{seed}" if seed else ""))
    staging_dir.remove_stale(root.parent)  # what killed generations left
    if not root.exists():
        _generate(name, make_sample, seed, root)
    else:
        problem = mismatch(root)
        if problem:
            log.warning("The embedded %s sample at %s does not match its manifest (%s); generating it again", name,
                        root, problem)
            _generate(name, make_sample, seed, root)
    log.info("dataset.root is unset: using the embedded %s sample at %s", name, root)
    return root
