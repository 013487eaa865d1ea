"""Synthetic `train_on_batch` throughput of a Keras application model on any Keras 3 backend,
with Horovod's benchmark flags. Rank 0 prints images/second per rank and in total.

    KERAS_BACKEND=jax horovodrun -np 2 python examples/keras/keras_synthetic_benchmark.py --model ResNet50
    horovodrun -np 2 python examples/keras/keras_synthetic_benchmark.py \\
        --model MobileNetV2 --image-size 64 --batch-size 8 --num-iters 3        # a quick CPU run
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import horovod.keras as hvd  # noqa: E402


def throughput(model: keras.Model, images: np.ndarray, labels: np.ndarray, batches: int) -> float:
    """Images per second over `batches` training steps."""
    start = time.perf_counter()
    for _ in range(batches):
        model.train_on_batch(images, labels)
    return batches * len(images) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce")
    parser.add_argument("--model", default="ResNet50", help="a keras.applications model name")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="batches before timing starts")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="batches per timed iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="timed iterations")
    parser.add_argument("--image-size", type=int, default=224, help="height and width of the synthetic images")
    args = parser.parse_args()

    hvd.init()
    size = args.image_size
    model = getattr(keras.applications, args.model)(weights=None, input_shape=(size, size, 3))
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01), compression=compression),
                  loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(hvd.rank())
    images = rng.random((args.batch_size, size, size, 3), dtype=np.float32)
    labels = rng.integers(0, 1000, args.batch_size)

    say = print if hvd.rank() == 0 else (lambda *a, **k: None)
    say(f"Model: {args.model} (Keras backend {keras.backend.backend()})")
    say(f"Batch size: {args.batch_size}")
    say(f"Number of CPUs: {hvd.size()}")
    model.train_on_batch(images, labels)
    # Horovod: every rank continues from rank 0's weights and optimizer state (what the callback
    # does after the first batch of fit()).
    broadcast = hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank=0)
    broadcast.set_model(model)
    broadcast.on_batch_end(0)
    say("Running warmup...")
    throughput(model, images, labels, args.num_warmup_batches)
    say("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        rates.append(throughput(model, images, labels, args.num_batches_per_iter))
        say(f"Iter #{i}: {rates[-1]:.1f} img/sec per CPU", flush=True)
    mean, conf = float(np.mean(rates)), 1.96 * float(np.std(rates))
    say(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    say(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}", flush=True)


if __name__ == "__main__":
    main()
