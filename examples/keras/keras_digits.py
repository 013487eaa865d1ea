"""Keras 3 on any backend (tensorflow, torch or jax) with horovod.keras, on scikit-learn's digits.

Pick the backend with KERAS_BACKEND, as with any Keras 3 program; the Horovod lines are the
same for all three. Each rank fits on its own shard (no download needed); only rank 0 prints.

    KERAS_BACKEND=jax   horovodrun -np 2 python examples/keras/keras_digits.py
    KERAS_BACKEND=torch horovodrun -np 2 python examples/keras/keras_digits.py
    horovodrun -np 2 python examples/keras/keras_digits.py                  # TensorFlow

About 96% test accuracy after 15 epochs.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import horovod.keras as hvd  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=0.05, help="single-rank rate; multiplied by the rank count")
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(7)

    features, labels = load_digits(return_X_y=True)
    features = (features / 16.0).astype("float32")
    order = np.random.default_rng(0).permutation(len(labels))
    train, test = order[:1437], order[1437:]
    mine = train[hvd.rank()::hvd.size()]  # Horovod: this rank's shard

    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    # Horovod: scale the rate by the number of ranks and average gradients over them.
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(features[mine], labels[mine], batch_size=args.batch_size, epochs=args.epochs,
              verbose=2 if hvd.rank() == 0 else 0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # Horovod: rank 0's start
                         hvd.callbacks.MetricAverageCallback()])  # Horovod: metrics of all ranks
    loss, accuracy = model.evaluate(features[test], labels[test], verbose=0)
    if hvd.rank() == 0:
        print(f"backend {keras.backend.backend()}: test accuracy {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
