"""Elastic PyTorch training on synthetic data: survives lost workers, follows added hosts.

    horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./examples/elastic/discover_hosts.sh \
        python examples/elastic/pytorch_elastic.py --epochs 5

or, on fixed hosts with fault tolerance only:

    horovodrun -np 3 --min-np 2 -H localhost:2,127.0.0.1:1 python examples/elastic/pytorch_elastic.py
"""

import argparse

import torch
import torch.nn.functional as F

import horovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
features = torch.randn(2048, 20)
labels = (features.sum(dim=1) > 0).long()
dataset = torch.utils.data.TensorDataset(features, labels)

model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)


def on_reset():
    # The learning rate follows the number of workers.
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=state.sampler)
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            state.sampler.record_batch(state.batch, len(data))
            state.batch += 1
            if state.batch % 10 == 0:
                state.commit()  # what a failure rolls back to; also where host changes are noticed
        if hvd.rank() == 0:
            print(f"epoch {state.epoch}: loss {loss.item():.4f} on {hvd.size()} workers", flush=True)
        state.epoch += 1
        state.batch = 0
        state.sampler.set_epoch(state.epoch)
        state.commit()


train(state)
