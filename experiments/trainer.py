"""The model, optimizer, global step, checkpoints and the traced train and eval steps."""
import logging

import keras
import tensorflow as tf

from data.preprocessing import Preprocessing
from experiments import metrics
from models import BUILDERS

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


class Trainer:
    """Owns what a checkpoint holds and the two step functions, each traced once.

    Batches of uint8 images arrive whole (global batches; under multi_worker a
    training batch is the worker's share) and are split evenly across replicas
    inside the step, so the input iterator stays a plain, checkpointable
    iterator under every strategy. Each replica then augments and
    normalises its share on its own device (data/preprocessing.py).
    """

    def __init__(self, cfg, spec, strategy, image_size):
        self.spec, self.strategy = spec, strategy
        self.replicas = strategy.num_replicas_in_sync
        self.global_batch_size = cfg.pipeline.batch_size
        self.preprocess = Preprocessing.from_config(cfg)
        with strategy.scope():
            self.model = BUILDERS[cfg.model.name](cfg.model, spec, image_size)
            self.optimizer = keras.optimizers.Adam(cfg.trainer.learning_rate)
            if cfg.pipeline.dtype == "float16":
                self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
            # Keras 3 optimizers must create their slots before the first distributed step (keras#19246).
            self.optimizer.build(self.model.trainable_variables)
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.train_step = tf.function(self._train_step)
        self.eval_step = tf.function(self._eval_step)

    def _per_replica(self, batch):
        if self.replicas == 1:
            return batch
        share = self.global_batch_size // self.replicas

        def split(context, tensor):
            # A training batch under multi_worker is the worker's share, split across its own replicas
            # (replica ids run worker by worker); any other batch is global, split across all of them.
            parts = tensor.shape[0] // share
            return tf.split(tensor, parts)[context.replica_id_in_sync_group % parts]

        return self.strategy.experimental_distribute_values_from_function(
            lambda context: tf.nest.map_structure(lambda tensor: split(context, tensor), batch))

    def _gather(self, value):
        return self.strategy.gather(value, axis=0) if self.replicas > 1 else value

    def _train_step(self, features, labels, weights):
        step = self.global_step.read_value()

        def replica_step(features, labels, weights):
            features = self.preprocess(features, training=True, step=step)
            with tf.GradientTape() as tape:
                logits = self.model(features, training=True)
                # Divide by the global batch, not the replica's: the all-reduce sums the replicas' gradients.
                loss = tf.reduce_sum(metrics.per_example_loss(self.spec.task, labels, logits) * weights)
                loss = loss / self.global_batch_size
                if self.model.losses:
                    loss += tf.add_n(self.model.losses) / self.replicas
                scaled = self.optimizer.scale_loss(loss)
            gradients = tape.gradient(scaled, self.model.trainable_variables)
            self.optimizer.apply(gradients, self.model.trainable_variables)
            return loss, tf.cast(logits, tf.float32), labels

        loss, logits, labels = self.strategy.run(replica_step, args=self._per_replica((features, labels, weights)))
        self.global_step.assign_add(1)
        return self.strategy.reduce("SUM", loss, axis=None), self._gather(logits), self._gather(labels)

    def _eval_step(self, features, labels, weights):
        def replica_step(features, labels, weights):
            logits = self.model(self.preprocess(features, training=False), training=False)
            loss = tf.reduce_sum(metrics.per_example_loss(self.spec.task, labels, logits) * weights)
            return loss, tf.cast(logits, tf.float32)

        loss, logits = self.strategy.run(replica_step, args=self._per_replica((features, labels, weights)))
        return self.strategy.reduce("SUM", loss, axis=None), self._gather(logits)

    def checkpoint(self, iterator=None) -> tf.train.Checkpoint:
        parts = dict(model=self.model, optimizer=self.optimizer, global_step=self.global_step)
        if iterator is not None:
            parts["input_iterator"] = iterator
        return tf.train.Checkpoint(**parts)

    @property
    def step(self) -> int:
        """The global step as a Python int (under any strategy)."""
        return int(self.global_step.read_value().numpy())

    @property
    def learning_rate(self) -> float:
        return float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))
