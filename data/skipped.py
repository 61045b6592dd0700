"""The record of input examples that a run leaves out, written as skipped.csv."""
import csv
import logging
import os
from collections import Counter

log = logging.getLogger(__name__)


class SkipLog:
    """Collects (path, reason) for every example dropped from the input."""

    def __init__(self):
        self.rows = []

    def add(self, path, reason):
        self.rows.append((str(path), reason))

    def extend(self, rows):
        for path, reason in rows:
            self.add(path, reason)

    def __len__(self):
        return len(self.rows)

    def summary(self) -> str:
        counts = Counter(reason.split(":")[0] for _, reason in self.rows)
        return ", ".join(f"{n} {reason}" for reason, n in counts.most_common())

    def write(self, path):
        """Writes skipped.csv atomically; the file exists (header only) when nothing was skipped."""
        tmp = f"{path}.tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "reason"])
            writer.writerows(self.rows)
        os.replace(tmp, path)
        if self.rows:
            log.warning("Skipped %d input examples (%s); listed in %s", len(self.rows), self.summary(), path)
