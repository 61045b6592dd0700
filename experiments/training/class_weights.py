"""``trainer.class_weights: balanced``: a multi-label loss's positive weights, from the training split, kept in the run.

The first start of a run computes each label's negatives ÷ positives over the training split (data/losses.py
`balanced_positive_weights`), logs them once and writes ``<run>/class_weights.json`` atomically. Every later start
(resume, evaluate, predict) reads that file and does not recompute: like the saved config, it is the run's truth, so
a dataset root moved or grown under the run cannot change the loss halfway. A file that cannot be read, that names
other labels, or that holds a weight that is not a finite number > 0, stops the start with one line naming it
(delete it to have it computed again).
"""
import json
import logging
import math

from tf_harness.data.errors import DatasetError
from tf_harness.data.integrity.text_files import read_text
from tf_harness.data.integrity.writing import replacing
from tf_harness.data.losses import balanced_positive_weights

log = logging.getLogger(__name__)

FILE = "class_weights.json"
_FIX = f"delete it to have {FILE} computed again from the training split"


def prepare(choice, task, tables, model_dir, write=True) -> None:
    """Gives `task` its positive weights when trainer.class_weights (`choice`) is ``balanced``: read from `model_dir`'s
    class_weights.json, or computed from ``tables['train']`` and (with `write`) written there."""
    if choice is None:
        return
    names = list(task.SPEC.class_names)
    path = model_dir / FILE
    if path.exists():
        weights = _read(path, names)
        log.info("trainer.class_weights=balanced: positive weights read from %s", path)
    else:
        train = tables["train"]
        weights = balanced_positive_weights(train.label.tolist())
        record = {"class_weights": choice, "training_examples": len(train),
                  "positive_weights": dict(zip(names, weights))}
        if write:
            with replacing(path) as f:
                json.dump(record, f, indent=2)
        log.info("trainer.class_weights=balanced: positive weights (negatives / positives over %d training examples)"
                 " %s, kept in %s", len(train), ", ".join(f"{n} {w:.3g}" for n, w in zip(names, weights)), path)
    task.positive_weights = tuple(weights)


def _read(path, names) -> list:
    try:
        record = json.loads(read_text(path, _FIX))
        saved = record["positive_weights"]
        if list(saved) != names:
            raise DatasetError(f"{path} weighs the labels {', '.join(saved)}, not this dataset's {', '.join(names)}; "
                               f"{_FIX}")
        weights = [float(saved[name]) for name in names]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise DatasetError(f"{path} is not a record of positive weights ({type(error).__name__}); {_FIX}") from None
    bad = [f"{name} {weight:g}" for name, weight in zip(names, weights) if not (math.isfinite(weight) and weight > 0)]
    if bad:
        raise DatasetError(f"{path} holds positive weights that are not finite numbers > 0 ({', '.join(bad)}); {_FIX}")
    return weights
