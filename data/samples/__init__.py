"""Embedded samples: small datasets generated once, in the real on-disk layout, into a cache folder."""
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tf_harness.data.samples import staging as staging_dir

log = logging.getLogger(__name__)

# Bump when a generator changes, so cached samples are regenerated.
VERSION = 2


def cache_home() -> Path:
    """Where samples, indexes and verification results are cached (env HARNESS_CACHE overrides)."""
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "tf-harness"))


def parallel_map(fn, jobs):
    """Runs `fn` over `jobs` on all cores; PIL and NumPy release the GIL while encoding."""
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return list(pool.map(fn, jobs))


def sample_root(name: str, make_sample, seed: int = 0) -> Path:
    """Returns the sample's root, generating it first if it is not cached yet."""
    root = cache_home() / "samples" / f"{name}-v{VERSION}"
    staging_dir.remove_stale(root.parent)  # what killed generations left
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        # Generate beside the final place and rename, so a killed generation is never mistaken for a sample.
        staging = staging_dir.make(root.parent, name)
        try:
            make_sample(staging / "data", seed)
            os.rename(staging / "data", root)
        except OSError:
            if not root.exists():  # a concurrent run that finished first is fine
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("Generated the embedded %s sample in %s", name, root)
    log.info("dataset.root is unset: using the embedded %s sample at %s", name, root)
    return root
