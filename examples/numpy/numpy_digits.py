"""Data-parallel training with nothing but numpy: softmax regression on scikit-learn's digits.

    horovodrun -np 2 python examples/numpy/numpy_digits.py

Each rank trains on its own shard; gradients are averaged with hvd.allreduce, so every rank
takes the same step and the model stays identical everywhere. Only rank 0 prints.
"""

import argparse

import numpy as np
from sklearn.datasets import load_digits

import horovod.numpy as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.5, help="scaled by the number of ranks")
    args = parser.parse_args()

    hvd.init()
    digits = load_digits()
    x = digits.data.astype(np.float32) / 16.0
    y = digits.target
    order = np.random.default_rng(0).permutation(len(x))
    test, train = order[:300], order[300:]
    shard = train[hvd.rank()::hvd.size()]               # each rank sees a disjoint slice

    weights = np.zeros((x.shape[1], 10), np.float32)
    bias = np.zeros(10, np.float32)
    weights, bias = hvd.broadcast(weights, 0, name="w"), hvd.broadcast(bias, 0, name="b")
    lr = args.lr * hvd.size()
    rng = np.random.default_rng(hvd.rank())
    steps = len(shard) // args.batch_size
    steps = int(hvd.allreduce(np.array([steps]), op=hvd.Min, name="steps")[0])  # same count everywhere

    for epoch in range(1, args.epochs + 1):
        rng.shuffle(shard)
        losses = []
        for step in range(steps):
            batch = shard[step * args.batch_size:(step + 1) * args.batch_size]
            logits = x[batch] @ weights + bias
            probs = np.exp(logits - logits.max(1, keepdims=True))
            probs /= probs.sum(1, keepdims=True)
            losses.append(-np.log(probs[np.arange(len(batch)), y[batch]] + 1e-9).mean())
            probs[np.arange(len(batch)), y[batch]] -= 1.0
            grad_w = x[batch].T @ probs / len(batch)
            grad_b = probs.mean(0)
            grad_w, grad_b = hvd.grouped_allreduce([grad_w, grad_b], name="grads")   # average
            weights -= lr / hvd.size() * grad_w
            bias -= lr / hvd.size() * grad_b
        loss = hvd.allreduce(np.array([np.mean(losses)]), name="loss")[0]
        accuracy = float(((x[test] @ weights + bias).argmax(1) == y[test]).mean())
        if hvd.rank() == 0 and (epoch % 5 == 0 or epoch == 1):
            print(f"epoch {epoch:3d}  loss {loss:.4f}  test accuracy {accuracy:.3f}", flush=True)
    if hvd.rank() == 0:
        print(f"final test accuracy {accuracy:.3f} on {hvd.size()} ranks")


if __name__ == "__main__":
    main()
