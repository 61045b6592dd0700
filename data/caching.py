"""tf.data caching of decoded images, safe against runs that were killed mid-pass."""
import glob
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def clean_partial_cache(prefix: str) -> bool:
    """Removes what a killed caching pass leaves behind; True when there was something.

    TensorFlow writes `<prefix>_<n>.lockfile` and temporary shards while it fills
    a cache and only writes `<prefix>.index` when the pass completes. A lockfile
    left by a dead run makes the next run fail with "There appears to be a
    concurrent caching iterator running", and a partial cache must never be read
    as if it were whole.
    """
    leftovers = glob.glob(f"{glob.escape(prefix)}_*.lockfile") + glob.glob(f"{glob.escape(prefix)}*.tempstate*")
    complete = os.path.exists(f"{prefix}.index")
    if leftovers and complete:
        # The index was written, so the data is whole; only the stale lock needs to go.
        leftovers = [path for path in leftovers if path.endswith(".lockfile")]
    elif leftovers:
        leftovers += glob.glob(f"{glob.escape(prefix)}.data-*")
    for path in leftovers:
        os.remove(path)
    if leftovers:
        log.warning("Removed a partial input cache left by an interrupted run: %s*", prefix)
    return bool(leftovers)


def cache(data, kind, model_dir, split):
    """`data.cache()` in memory, or on disk under `<model_dir>/input_cache/<split>`."""
    if kind == "memory":
        return data.cache()
    directory = Path(model_dir or ".") / "input_cache"
    directory.mkdir(parents=True, exist_ok=True)
    prefix = str(directory / split)
    clean_partial_cache(prefix)
    return data.cache(prefix)
