"""The record of input examples that a run leaves out, written as skipped.csv."""
import csv
import logging
from collections import Counter

from tf_harness.data.integrity.writing import replacing

log = logging.getLogger(__name__)


class SkipLog:
    """Collects (path, reason) for every example dropped from the input.

    A row is one example, except where it names a container of several (a damaged TFRecord shard,
    `add(..., count=n)`): its reason then says how many, and it counts as that many everywhere, in
    ``len()``, the summary and dataset.max_skipped_fraction. Rows added with ``in_tables=True`` stand for
    examples that are still rows of the index tables (records lost from shards of those rows), so
    `in_tables` tells how many of the tables' rows will not be read.
    """

    def __init__(self):
        self.rows = []
        self.counts = []
        self.in_tables = 0

    def add(self, path, reason, count=1, in_tables=False):
        self.rows.append((str(path), reason))
        self.counts.append(int(count))
        if in_tables:
            self.in_tables += int(count)

    def extend(self, rows):
        for path, reason in rows:
            self.add(path, reason)

    def __len__(self):
        """How many examples were left out."""
        return sum(self.counts)

    def summary(self) -> str:
        counts = Counter()
        for (_, reason), count in zip(self.rows, self.counts):
            counts[reason.split(":")[0]] += count
        return ", ".join(f"{n} {reason}" for reason, n in counts.most_common())

    def write(self, path):
        """Writes skipped.csv atomically; the file exists (header only) when nothing was skipped."""
        with replacing(path, newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "reason"])
            writer.writerows(self.rows)
        if self.rows:
            log.warning("Skipped %d input examples (%s); listed in %s", len(self), self.summary(), path)
