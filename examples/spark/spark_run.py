"""horovod.spark.run: train a tiny linear model with Horovod on Spark tasks, results by rank.

    python examples/spark/spark_run.py --num-proc 2

Starts its own Spark session (`--master`, default a two-executor local-cluster on this machine)
unless `main` is given one.
"""

from __future__ import annotations

import argparse
import os
import sys


def train(steps: int) -> dict:
    """What every rank runs: fit y = 3x - 1 on its own slice of points, gradients averaged."""
    import torch

    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(hvd.rank())
    x = torch.linspace(-1, 1, 64)[hvd.rank()::hvd.size()].unsqueeze(1)
    y = 3 * x - 1
    model = torch.nn.Linear(1, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.3),
                                         named_parameters=model.named_parameters())
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    print(f"rank {hvd.rank()} of {hvd.size()} (local rank {hvd.local_rank()}): loss {loss.item():.5f}")
    return {"rank": hvd.rank(), "weight": model.weight.item(), "bias": model.bias.item()}


def main(spark: object, num_proc: int, steps: int) -> list[dict]:
    import horovod.spark

    results = horovod.spark.run(train, args=(steps,), num_proc=num_proc)
    for result in results:
        print(f"rank {result['rank']}: y = {result['weight']:.3f} x + {result['bias']:.3f}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python: this one
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(args.master).appName("horovod.spark.run example")
               .config("spark.ui.enabled", "false").getOrCreate())
    try:
        main(session, args.num_proc, args.steps)
    finally:
        session.stop()
