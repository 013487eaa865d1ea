"""A tiny Horovod training step for the Kubernetes examples: every pod runs it unchanged.

Under an MPIJob it is started by horovodrun; under a PyTorchJob or an Indexed Job the operator's
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT variables start it, and hvd.init() finds them.
"""

import socket

import torch

import horovod.torch as hvd

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
data = torch.full((8, 4), float(hvd.rank() + 1))
loss = model(data).pow(2).mean()
optimizer.zero_grad()
loss.backward()
optimizer.step()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
weights = hvd.allgather(model.weight.detach()).view(hvd.size(), -1)
same = bool((weights == weights[0]).all())
print(f"rank {hvd.rank()}/{hvd.size()} on {socket.gethostname()}: sum of ranks+1 = {total:g}, "
      f"weights equal on every rank: {same}, weight sum {model.weight.sum().item():.6f}", flush=True)
