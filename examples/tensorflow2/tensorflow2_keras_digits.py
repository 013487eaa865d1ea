"""Keras `model.fit` on scikit-learn's bundled digits, data-parallel with horovod.tensorflow.keras.

Each rank fits on its own shard of the 1,437 training images (nothing to download). The
DistributedOptimizer averages the gradients of every step over all ranks; the callbacks make
the ranks start from rank 0's weights, warm the learning rate up, and average the epoch
metrics. Only rank 0 prints progress and writes the checkpoint.

    horovodrun -np 2 python examples/tensorflow2/tensorflow2_keras_digits.py

About 97% validation accuracy after 12 epochs.
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import horovod.tensorflow.keras as hvd  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=0.001, help="single-rank rate; multiplied by the rank count")
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "digits-{epoch}.keras"),
                        help="where rank 0 saves the model after each epoch")
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)

    images, labels = load_digits(return_X_y=True)
    images = (images / 16.0).astype("float32").reshape(-1, 8, 8, 1)
    order = np.random.default_rng(0).permutation(len(labels))
    train, test = order[:1437], order[1437:]
    shard = train[hvd.rank()::hvd.size()]  # Horovod: every rank fits on its own part

    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Dense(10),
    ])
    # Horovod: scale the rate with the global batch, and average gradients across ranks.
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(args.lr * hvd.size()))
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    callbacks = [
        # Horovod: start every rank from rank 0's weights.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: report (and let later callbacks see) metrics averaged over all ranks.
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: ramp the large rate up over the first epochs (Goyal et al.).
        hvd.callbacks.LearningRateWarmupCallback(args.lr * hvd.size(), warmup_epochs=args.warmup_epochs,
                                                 verbose=1),
    ]
    if hvd.rank() == 0:  # Horovod: one writer
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(args.checkpoint))

    model.fit(images[shard], labels[shard], batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
              validation_data=(images[test], labels[test]), verbose=2 if hvd.rank() == 0 else 0)
    loss, accuracy = model.evaluate(images[test], labels[test], verbose=0)
    if hvd.rank() == 0:
        print(f"test accuracy {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
