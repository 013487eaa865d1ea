"""TensorFlow 2 custom training loop on scikit-learn's bundled digits, data-parallel with Horovod.

The 1,797 8x8 images ship inside scikit-learn (no download). Every rank trains a small CNN on
its own slice of each global batch inside a `tf.function`; `hvd.DistributedGradientTape`
averages the gradients, so all ranks apply the same update. Only rank 0 prints.

    horovodrun -np 2 python examples/tensorflow2/tensorflow2_digits.py
    python examples/tensorflow2/tensorflow2_digits.py              # a single process works too

About 97% test accuracy after 10 epochs, in seconds on two CPU cores.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402


def build_model() -> tf.keras.Model:
    return tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=0.02, help="single-rank rate; multiplied by the rank count")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)  # ranks share the machine's cores
    tf.keras.utils.set_random_seed(1234 + hvd.rank())  # Horovod: rank 0's weights are broadcast below

    images, labels = load_digits(return_X_y=True)
    images = (images / 16.0).astype("float32").reshape(-1, 8, 8, 1)
    order = np.random.default_rng(0).permutation(len(labels))  # the same split on every rank
    train, test = order[:1440], order[1440:]

    model = build_model()
    # Horovod: a global batch is size() times bigger, so is the learning rate.
    optimizer = tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    @tf.function
    def train_step(x, y, first_step):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        # Horovod: gradients averaged over every rank's batch.
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        # Horovod: after the first step (the optimizer's slots exist now) every rank takes rank 0's
        # weights and optimizer state.
        if first_step:
            hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)
        return loss

    global_batch = args.batch_size * hvd.size()
    steps = len(train) // global_batch
    for epoch in range(args.epochs):
        shuffled = np.random.default_rng(epoch).permutation(train)  # same order on every rank
        losses = []
        for step in range(steps):
            # Horovod: this rank's slice of the global batch.
            start = step * global_batch + hvd.rank() * args.batch_size
            idx = shuffled[start:start + args.batch_size]
            losses.append(train_step(images[idx], labels[idx], tf.constant(epoch == 0 and step == 0)))
        epoch_loss = hvd.allreduce(tf.reduce_mean(losses), name="epoch_loss")
        logits = model(images[test[hvd.rank()::hvd.size()]], training=False)
        hits = tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == labels[test[hvd.rank()::hvd.size()]], tf.float32))
        accuracy = hvd.allreduce(hits, op=hvd.Sum, name="hits") / len(test)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {float(epoch_loss):.4f}, "
                  f"test accuracy {float(accuracy):.4f}", flush=True)


if __name__ == "__main__":
    main()
