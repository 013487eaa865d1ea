"""Synthetic throughput benchmark of a Keras application model, with Horovod's flags.

Random images and labels, a `tf.function` train step with DistributedGradientTape; reports
images/second per rank and in total (rank 0 prints).

    horovodrun -np 2 python examples/tensorflow2/tensorflow2_synthetic_benchmark.py --model ResNet50
    horovodrun -np 2 python examples/tensorflow2/tensorflow2_synthetic_benchmark.py \\
        --model MobileNetV2 --image-size 64 --batch-size 8 --num-iters 3   # a quick run on CPU
"""

import argparse
import os
import timeit

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import horovod.tensorflow as hvd  # noqa: E402

parser = argparse.ArgumentParser(description="TensorFlow 2 synthetic benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="ResNet50", help="model to benchmark (a keras.applications name)")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=10, help="number of warm-up batches that don't count")
parser.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
parser.add_argument("--eager", action="store_true", default=False, help="run eagerly instead of in a tf.function")
parser.add_argument("--no-cuda", action="store_true", default=False, help="accepted; khorovod runs on the CPU")
parser.add_argument("--image-size", type=int, default=224, help="height and width of the synthetic images")
args = parser.parse_args()

hvd.init()
device = "CPU"

model = getattr(tf.keras.applications, args.model)(weights=None, input_shape=(args.image_size, args.image_size, 3))
optimizer = tf.keras.optimizers.SGD(0.01)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

rng = np.random.default_rng(hvd.rank())
data = tf.constant(rng.random((args.batch_size, args.image_size, args.image_size, 3), dtype=np.float32))
target = tf.constant(rng.integers(0, 1000, args.batch_size))


def benchmark_step(first_batch: tf.Tensor) -> None:
    with tf.GradientTape() as tape:
        loss = loss_fn(target, model(data, training=True))
    # Horovod: average the gradients over all ranks.
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    # Horovod: start from rank 0's weights and optimizer state once the slots exist.
    if first_batch:
        hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)


step = benchmark_step if args.eager else tf.function(benchmark_step)


def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
log(f"Number of {device}s: {hvd.size()}")

# A boolean tensor, not a Python bool: one traced function serves the first and the later steps.
first, later = tf.constant(True), tf.constant(False)
step(first)
log("Running warmup...")
timeit.timeit(lambda: step(later), number=args.num_warmup_batches)

log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    seconds = timeit.timeit(lambda: step(later), number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / seconds
    log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
    img_secs.append(img_sec)

mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log(f"Img/sec per {device}: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
