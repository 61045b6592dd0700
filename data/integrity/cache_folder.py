"""Where the harness keeps what it caches between runs: samples, indexes, verdicts, compiled programs."""
import os
from pathlib import Path


def cache_home() -> Path:
    """The cache folder (env HARNESS_CACHE overrides)."""
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "tf-harness"))
