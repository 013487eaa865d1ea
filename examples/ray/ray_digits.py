"""Horovod + PyTorch on a Ray cluster: scikit-learn's handwritten digits, three ways.

    python examples/ray/ray_digits.py                  # RayExecutor: 2 workers
    python examples/ray/ray_digits.py --mode elastic   # ElasticRayExecutor: a worker per free CPU
    python examples/ray/ray_digits.py --mode tune      # Ray Tune: a grid search over the learning rate

Without --address it starts a Ray instance on this machine (--cpus CPUs); `--address auto` joins
the cluster that `ray start` made. Each worker is a Ray actor; rank 0's progress comes back
through `horovod.ray.report`, and the script prints the final test accuracy (about 0.95).
"""

from __future__ import annotations

import argparse
from typing import Any


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Horovod on Ray: digits with PyTorch")
    parser.add_argument("--mode", choices=["executor", "elastic", "tune"], default="executor")
    parser.add_argument("--address", default=None, help="a running Ray cluster (auto: the local one)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the Ray instance started without --address")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05, help="per worker; scaled by the number of workers")
    parser.add_argument("--storage-path", default=None, help="where Tune keeps its results (default ~/ray_results)")
    return parser.parse_args()


def train(config: dict[str, Any]) -> float:
    """One worker's training; the test accuracy over every worker's share of the test set."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    import horovod.ray
    import horovod.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    images, labels = load_digits(return_X_y=True)
    x, y = torch.tensor(images, dtype=torch.float32) / 16.0, torch.tensor(labels)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train_idx, test_idx = order[:1400], order[1400:]
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=config["lr"] * hvd.size(),
                                                         momentum=0.9),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, epoch=0)

    def accuracy() -> float:
        mine = test_idx[hvd.rank()::hvd.size()]
        correct = (model(x[mine]).argmax(1) == y[mine]).sum()
        totals = hvd.allreduce(torch.tensor([float(correct), float(len(mine))]), op=hvd.Sum)
        return (totals[0] / totals[1]).item()

    @hvd.elastic.run  # under RayExecutor a plain run: nobody joins or leaves
    def epochs(state: Any) -> float:
        while state.epoch < config["epochs"]:
            mine = train_idx[torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(state.epoch))]
            mine = mine[hvd.rank()::hvd.size()]
            for start in range(0, len(mine), 32):
                batch = mine[start:start + 32]
                optimizer.zero_grad()
                F.cross_entropy(model(x[batch]), y[batch]).backward()
                optimizer.step()
            state.epoch += 1
            state.commit()
            horovod.ray.report({"epoch": state.epoch, "accuracy": accuracy(), "workers": hvd.size()})
        return accuracy()

    return epochs(state)


def show(report: dict[str, Any]) -> None:
    print(f"epoch {report['epoch']}: test accuracy {report['accuracy']:.3f} on {report['workers']} workers",
          flush=True)


def main() -> None:
    args = parse_args()
    import ray

    from horovod.ray import ElasticRayExecutor, RayExecutor

    ray.init(address=args.address, num_cpus=None if args.address else args.cpus,
             include_dashboard=False, log_to_driver=False)
    config = {"lr": args.lr, "epochs": args.epochs}
    if args.mode == "executor":
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=args.num_workers)
        executor.start()
        try:
            accuracy = executor.run(train, args=[config], callbacks=[show])[0]
        finally:
            executor.shutdown()
    elif args.mode == "elastic":
        settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=args.num_workers,
                                                      elastic_timeout=60, timeout_s=60)
        elastic = ElasticRayExecutor(settings, cpus_per_slot=1)
        elastic.start()
        accuracy = elastic.run(lambda: train(config), callbacks=[show])[0]
    else:
        from ray import tune

        from horovod.ray.tune import DistributedTrainableCreator

        trainable = DistributedTrainableCreator(train, num_workers=args.num_workers)
        grid = tune.Tuner(trainable, param_space={**config, "lr": tune.grid_search([0.005, args.lr])},
                          tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
                          run_config=tune.RunConfig(storage_path=args.storage_path, verbose=0)).fit()
        for result in grid:
            print(f"lr {result.config['lr']}: test accuracy {result.metrics['accuracy']:.3f}")
        best = grid.get_best_result()
        print(f"best lr: {best.config['lr']}")
        accuracy = best.metrics["accuracy"]
    print(f"final test accuracy: {accuracy:.3f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
