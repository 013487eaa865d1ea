"""Data-parallel Gluon training on scikit-learn's bundled digits, with horovod.mxnet.

MXNet 1.9.1 needs numpy<1.24, so it runs in its own environment (docs/mxnet.md):

    MX=$(bash scripts/setup-mxnet-venv.sh)
    DIGITS=$(python -c "import sklearn, pathlib; print(pathlib.Path(sklearn.__file__).parent / 'datasets/data/digits.csv.gz')")
    PYTHONPATH=$PWD horovodrun -np 2 $MX examples/mxnet/mxnet_digits.py --data $DIGITS

The digits are the CSV that scikit-learn ships (taken from the main environment: the MXNet one
has no scikit-learn). Each rank trains on its own shard; the DistributedTrainer averages the
gradients every step.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import mxnet as mx
import numpy as np

import horovod.mxnet as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Horovod + MXNet Gluon on the digits")
    parser.add_argument("--data", type=Path, required=True, help="scikit-learn's datasets/data/digits.csv.gz")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the number of ranks")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init()
    data = np.loadtxt(args.data, delimiter=",", dtype=np.float32)
    x, y = data[:, :-1] / 16.0, data[:, -1]
    order = np.random.default_rng(42).permutation(len(y))  # the same split on every rank
    test, train = order[:300], order[300:]
    shard = train[hvd.rank()::hvd.size()]

    net = mx.gluon.nn.Sequential()
    net.add(mx.gluon.nn.Dense(128, activation="relu"), mx.gluon.nn.Dense(10))
    mx.random.seed(hvd.rank())  # different on purpose: broadcast_parameters makes rank 0's the start
    net.initialize(mx.init.Xavier())
    net(mx.nd.array(x[:1]))  # deferred initialisation: parameters exist after one forward pass
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd",
                                     {"learning_rate": args.lr * hvd.size(), "momentum": 0.9},
                                     compression=compression)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    steps = int(hvd.allreduce(mx.nd.array([len(shard) // args.batch_size]), op=hvd.Min).asscalar())
    rng = np.random.default_rng(hvd.rank())
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        rng.shuffle(shard)
        total = 0.0
        for i in range(steps):
            batch = shard[i * args.batch_size:(i + 1) * args.batch_size]
            with mx.autograd.record():
                loss = loss_fn(net(mx.nd.array(x[batch])), mx.nd.array(y[batch]))
            loss.backward()
            trainer.step(len(batch))
            total += float(loss.mean().asscalar())
        mean_loss = float(hvd.allreduce(mx.nd.array([total / steps]), name="loss").asscalar())
        if hvd.rank() == 0 and (epoch % 5 == 0 or epoch == 1):
            print(f"epoch {epoch:3d}  loss {mean_loss:.4f}", flush=True)
    accuracy = float((net(mx.nd.array(x[test])).argmax(axis=1).asnumpy() == y[test]).mean())
    same = hvd.allgather_object(float(net.collect_params()[sorted(net.collect_params().keys())[0]].data().sum()
                                      .asscalar()))
    if hvd.rank() == 0:
        print(f"final test accuracy {100 * accuracy:.1f}% on {hvd.size()} rank(s) in "
              f"{time.perf_counter() - start:.1f}s; all ranks hold the same model: {len(set(same)) == 1}")


if __name__ == "__main__":
    main()
