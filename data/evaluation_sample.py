"""A partial evaluation's examples (``trainer.eval_steps``): a fixed, seeded, stratified sample of a split's rows.

``trainer.eval_steps=N`` scores N evaluation steps of EXAMPLES_PER_STEP examples each, N x 32 examples, whatever
``pipeline.batch_size`` is, so the trials of a batch-size sweep are scored on the same examples. The head of a
split is no fair sample: LFW's evaluation pairs come ordered by class, so its first batches hold same-person
pairs only. The sample is drawn instead, once, in Python, from the split's table when the pipeline is built:
stratified on the label (the first finding present, or none, for a multi-label chest X-ray; same or different
person for LFW's pairs; the class for ILSVRC DET), so its classes are mixed as in the whole split, and seeded with
the run's ``seed``, so every evaluation of a run, and every batch size, scores the same rows. input_fn reads only
those rows (data/input_fn.py), before batching: each is scored once, and the last partial batch is kept.
"""
import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

# The examples one evaluation step stands for: the default pipeline.batch_size, so with that batch size
# trainer.eval_steps counts batches as it reads.
EXAMPLES_PER_STEP = 32
# The stratum that the classes too rare to be drawn from on their own share.
_RARER = "(rarer classes)"


def sample_rows(table, eval_steps, seed):
    """The row numbers of `table` that an evaluation with trainer.eval_steps=`eval_steps` scores, ascending (table
    order); None when that is every row (eval_steps null, or a split of no more rows than it asks for)."""
    size = None if eval_steps is None else eval_steps * EXAMPLES_PER_STEP
    if size is None or size >= len(table):
        return None
    rows = np.arange(len(table))
    _, sample = train_test_split(rows, test_size=size, random_state=seed, stratify=strata(table, size))
    return np.sort(sample)


def strata(table, size):
    """What a sample of `size` of `table`'s rows is stratified on, or None for a plain random sample.

    The label, or for a multi-hot label the first class present (-1: none). scikit-learn's stratified split
    needs two rows or more of every stratum, and no more strata than either part has rows: the rarest classes
    are lumped into one stratum until that holds.
    """
    labels = np.asarray(table.label.tolist())
    if labels.ndim > 1:
        labels = np.where(labels.any(axis=1), labels.argmax(axis=1), -1)
    labels = labels.astype(str)
    # Largest first; ties in a fixed order, so the same table always gives the same strata.
    counts = pd.Series(labels).value_counts().sort_index().sort_values(ascending=False, kind="stable")
    room = min(size, len(labels) - size)
    for kept in range(len(counts), 0, -1):
        rest = int(counts.iloc[kept:].sum())
        if counts.iloc[kept - 1] >= 2 and rest != 1 and kept + (rest > 0) <= room:
            return np.where(np.isin(labels, counts.index[:kept]), labels, _RARER)
    return None
