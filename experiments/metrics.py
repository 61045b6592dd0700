"""Evaluation metrics per task (the losses are the Task's: data/losses.py).

Metrics run on the host over a whole evaluation with scikit-learn, so that AUC
is exact rather than a bucketed streaming estimate.
"""
import numpy as np
from scipy.special import expit, softmax
from sklearn.metrics import accuracy_score, roc_auc_score, top_k_accuracy_score


def probabilities(task, logits):
    logits = np.asarray(logits, np.float64)
    return softmax(logits, axis=-1) if task == "multiclass" else expit(logits)


def _auc(labels, scores):
    # AUC is undefined when a label has only one class in the evaluated examples.
    return roc_auc_score(labels, scores) if 0 < labels.sum() < len(labels) else float("nan")


def evaluate(task, class_names, labels, logits) -> dict:
    """Metrics of one evaluation: per-label and mean AUC, accuracy, top-5 accuracy."""
    return scored(task, class_names, labels, probabilities(task, logits))


def scored(task, class_names, labels, scores) -> dict:
    """`evaluate`'s metrics from probabilities (`scores`, as predictions.csv holds them) rather than logits."""
    scores = np.asarray(scores, np.float64)
    if task == "multilabel":
        labels = np.asarray(labels).reshape(scores.shape)
        aucs = {f"auc/{name}": _auc(labels[:, k], scores[:, k]) for k, name in enumerate(class_names)}
        defined = [value for value in aucs.values() if not np.isnan(value)]
        return {**aucs, "auc/mean": float(np.mean(defined)) if defined else float("nan")}
    if task == "binary":
        labels, scores = np.asarray(labels).reshape(-1), scores.reshape(-1)
        return {"accuracy": accuracy_score(labels, scores > 0.5), "auc": _auc(labels, scores)}
    labels = np.asarray(labels).reshape(-1)
    all_classes = np.arange(scores.shape[-1])
    return {"accuracy": accuracy_score(labels, scores.argmax(-1)),
            "top5_accuracy": top_k_accuracy_score(labels, scores, k=min(5, len(all_classes)), labels=all_classes)}


def headline(task) -> str:
    """The metric a progress line and an HParams table lead with."""
    return {"multilabel": "auc/mean", "binary": "accuracy", "multiclass": "accuracy"}[task]
