"""Elastic Keras training (TensorFlow backend) on synthetic data: survives lost workers.

    horovodrun -np 3 --min-np 2 -H localhost:2,127.0.0.1:1 python examples/elastic/keras_elastic.py
    horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./examples/elastic/discover_hosts.sh \
        python examples/elastic/keras_elastic.py --epochs 5
"""

import argparse

import keras
import numpy as np

import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()

hvd.init()
rng = np.random.default_rng(0)
features = rng.normal(size=(2048, 20)).astype("float32")
labels = (features.sum(axis=1) > 0).astype("int32")

model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size())),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_reset():
    model.optimizer.learning_rate = args.lr * hvd.size()  # follows the number of workers


state.register_reset_callbacks([on_reset])
callbacks = [
    hvd.callbacks.MetricAverageCallback(),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=10),  # last: commits the updated state
]


@hvd.elastic.run
def train(state):
    shard = slice(hvd.rank(), None, hvd.size())
    model.fit(features[shard], labels[shard], batch_size=32, initial_epoch=state.epoch, epochs=args.epochs,
              callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)


train(state)
