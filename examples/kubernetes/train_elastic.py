"""The elastic variant of train.py: training state survives workers that come and go."""

import socket

import torch

import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)


@hvd.elastic.run
def train(state):
    while state.step < 20:
        loss = model(torch.ones(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state.step += 1
        state.commit()
    return hvd.size()


size = train(state)
print(f"rank {hvd.rank()} on {socket.gethostname()}: finished 20 steps with {size} workers", flush=True)
