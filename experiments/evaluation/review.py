"""What TensorBoard shows beyond scalars: training inputs, PR curves, a confusion matrix and a profiler trace.

The PR curves and the confusion matrix are drawn from the labels and probabilities an evaluation already has,
so they cost no second pass over the validation split.
"""
import contextlib
import logging

import numpy as np
import tensorflow as tf
from sklearn.metrics import confusion_matrix, roc_curve
from tensorboard.plugins.pr_curve import summary as pr_summary

log = logging.getLogger(__name__)
INPUT_EXAMPLES = 4  # training inputs shown at the start of a run
PR_THRESHOLDS = 101


def _for_display(images):
    """Each image stretched to [0, 1] by its own range: the model's inputs are [-1, 1] or standardised."""
    low = tf.reduce_min(images, axis=[1, 2, 3], keepdims=True)
    high = tf.reduce_max(images, axis=[1, 2, 3], keepdims=True)
    return (images - low) / tf.maximum(high - low, 1e-6)


def _label_text(label, spec):
    label = np.asarray(label).reshape(-1)
    if spec.task == "multilabel":
        return ", ".join(name for name, on in zip(spec.class_names, label) if on) or "no finding"
    if spec.task == "binary":
        return "same person" if label[0] else "different people"
    return spec.class_names[int(label[0])]


def as_seen(batch, preprocess, step):
    """A training batch as the train step at global `step` sees it: (features, augmented and normalised; labels)."""
    features, labels, _ = batch
    return preprocess(features, training=True, step=tf.constant(step, tf.int64)), labels.numpy()


def write_inputs(features, labels, spec, step):
    """Image summary `inputs` of the first few examples of a preprocessed training batch, into the default
    writer. A pair of images is shown side by side; the description names each example's label."""
    if isinstance(features, (tuple, list)):
        features = tf.concat([_for_display(images[:INPUT_EXAMPLES]) for images in features], axis=2)
    else:
        features = _for_display(features[:INPUT_EXAMPLES])
    shown = [f"{index + 1}: {_label_text(label, spec)}"
             for index, label in enumerate(np.asarray(labels)[:INPUT_EXAMPLES])]
    tf.summary.image("inputs", features, step=step, max_outputs=INPUT_EXAMPLES,
                     description="Training inputs as the model sees them (augmented and normalised, each "
                                 "stretched to its own range for display): " + "; ".join(shown))


def pr_curves(spec, labels, probabilities):
    """One PR-curve summary per class (`pr/<class>`): per finding for multi-label, `same` and `different` for
    a binary task. Returns serialised Summary protos, for `tf.summary.experimental.write_raw_pb`."""
    if spec.task == "multilabel":
        labels = np.asarray(labels).reshape(probabilities.shape).astype(bool)
        columns = [(name, labels[:, k], probabilities[:, k]) for k, name in enumerate(spec.class_names)]
    elif spec.task == "binary":
        positive, scores = np.asarray(labels).reshape(-1).astype(bool), probabilities.reshape(-1)
        columns = [(spec.class_names[0], positive, scores), ("different", ~positive, 1 - scores)]
    else:
        return []
    summaries = []
    for name, truth, score in columns:
        summary = pr_summary.pb(name, truth, score.astype(np.float32), num_thresholds=PR_THRESHOLDS,
                                description=f"Precision and recall of `{name}` over {len(truth)} validation "
                                            f"examples, at {PR_THRESHOLDS} thresholds")
        summary.value[0].tag = f"pr/{name}"  # pb() names it `<name>/pr_curves`
        summaries.append(summary.SerializeToString())
    return summaries


def confusion_image(class_names, labels, probabilities) -> np.ndarray:
    """The confusion matrix of a multiclass evaluation, rows normalised (each true class's recall), over the
    classes seen in the labels or predictions, as an RGB uint8 image [height, width, 3]."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels, predicted = np.asarray(labels).reshape(-1), np.asarray(probabilities).argmax(-1)
    seen = np.union1d(labels, predicted)
    counts = confusion_matrix(labels, predicted, labels=seen)
    rates = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    size = min(4 + 0.3 * len(seen), 20)
    figure = Figure(figsize=(size, size), dpi=80)
    axes = figure.add_subplot()
    axes.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    names = [class_names[k] for k in seen]
    if len(seen) <= 40:  # beyond that the names overlap; the description lists them
        axes.set_xticks(range(len(seen)), names, rotation=90, fontsize=7)
        axes.set_yticks(range(len(seen)), names, fontsize=7)
    axes.set_xlabel("predicted")
    axes.set_ylabel("true")
    figure.tight_layout()
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3]


def roc_image(labels, scores) -> np.ndarray:
    """The ROC curve of a binary evaluation (true accept rate against false accept rate, the latter on a log
    axis, as face verification reads it), as an RGB uint8 image [height, width, 3]."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    false_accept, true_accept, _ = roc_curve(np.asarray(labels).reshape(-1), np.asarray(scores).reshape(-1))
    figure = Figure(figsize=(4, 4), dpi=80)
    axes = figure.add_subplot()
    axes.plot(false_accept, true_accept)
    axes.set_xscale("symlog", linthresh=1e-3)
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.set_xlabel("false accept rate")
    axes.set_ylabel("true accept rate")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3]


def write_evaluation(spec, labels, probabilities, step):
    """An evaluation's PR curves (multi-label, binary), ROC curve (binary) or confusion matrix (multiclass), into
    the default writer."""
    positive = np.asarray(labels).reshape(-1)
    if spec.task == "binary" and 0 < positive.sum() < len(positive):
        tf.summary.image("roc", roc_image(positive, probabilities)[None], step=step,
                         description=f"Validation ROC curve over {len(positive)} examples: the true accept rate "
                                     "against the false accept rate (a log scale above 1e-3, linear below)")
    if spec.task == "multiclass":
        image = confusion_image(spec.class_names, labels, probabilities)
        tf.summary.image("confusion_matrix", image[None], step=step,
                         description=f"Validation confusion matrix over {len(labels)} examples; rows are true "
                                     "classes, normalised to 1 (the diagonal is each class's recall)")
    for summary in pr_curves(spec, labels, probabilities):
        tf.summary.experimental.write_raw_pb(summary, step=step)


class Profiler:
    """Captures a TensorFlow profiler trace of global steps [start, stop) into `logdir`, for TensorBoard's
    Profile tab (`trainer.profile_steps`; the tab needs the `profile` extra)."""

    def __init__(self, steps, logdir):
        self.start, self.stop = steps if steps else (None, None)
        self.logdir, self.active = str(logdir), False

    def loop_length(self, step, length) -> int:
        """`length`, cut so that a loop ends where the trace starts or stops; one step at a time inside it, so
        that each step gets its own step marker (`step`) in the trace."""
        if self.active:
            return 1
        for boundary in (self.start, self.stop):
            if boundary is not None and step < boundary:
                length = min(length, boundary - step)
        return length

    def step(self, step):
        """A context that marks the loop it wraps as global step `step` in the trace, TensorFlow's step marker
        for the Profile tab's step-time breakdown (a no-op outside the trace)."""
        if self.active:
            return tf.profiler.experimental.Trace("train", step_num=step, _r=1)
        return contextlib.nullcontext()

    def update(self, step):
        """Starts or stops the trace as the global step enters or leaves [start, stop)."""
        if self.start is None:
            return
        if not self.active and self.start <= step < self.stop:
            tf.profiler.experimental.start(self.logdir)
            self.active = True
            log.info("Profiling global steps %d to %d into %s", step, self.stop, self.logdir)
        elif self.active and step >= self.stop:
            self.close()

    def close(self):
        if self.active:
            tf.profiler.experimental.stop()
            self.active = False
