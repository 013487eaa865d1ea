"""Launch data-parallel training from inside Python with `horovod.run`: no horovodrun command.

    python examples/pytorch/pytorch_run_from_python.py --num-proc 2

`horovod.run(fn, args, num_proc=N)` starts N worker processes, runs `fn(*args)` on each with Horovod
initialised by the environment it sets, and returns the N return values in rank order.
Here every rank fits a linear regression on its shard of a synthetic data set and returns its
final weights; the caller checks that all ranks ended with the same model.
"""

from __future__ import annotations

import argparse

import horovod


def train(epochs: int, lr: float) -> dict:
    # Imports inside the function: it runs in fresh worker processes.
    import torch

    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)  # the same data set on every rank ...
    true_w = torch.tensor([[2.0], [-3.0], [0.5]])
    x = torch.randn(512, 3, generator=generator)
    y = x @ true_w + 1.0 + 0.01 * torch.randn(512, 1, generator=generator)
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]  # ... of which each takes a shard

    model = torch.nn.Linear(3, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for epoch in range(epochs):
        for i in range(0, len(x), 32):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[i:i + 32]), y[i:i + 32])
            loss.backward()
            optimizer.step()
        # Horovod: average a metric over the ranks for reporting.
        mean_loss = hvd.allreduce(loss.detach(), name="loss").item()
        if hvd.rank() == 0 and (epoch + 1) % 5 == 0:
            print(f"epoch {epoch + 1}: loss {mean_loss:.5f}", flush=True)
    return {"rank": hvd.rank(), "weight": model.weight.detach().view(-1).tolist(), "bias": model.bias.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2, help="number of worker processes")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    results = horovod.run(train, args=(args.epochs, args.lr), num_proc=args.num_proc)
    for result in results:
        weights = ", ".join(f"{w:+.3f}" for w in result["weight"])
        print(f"rank {result['rank']}: weight [{weights}]  bias {result['bias']:+.3f}")
    assert all(r["weight"] == results[0]["weight"] for r in results), "ranks ended with different models"
    print("all ranks hold the same model (the data was generated with weight [+2, -3, +0.5], bias +1)")


if __name__ == "__main__":
    main()
