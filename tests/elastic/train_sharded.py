"""Elastic training with ShardedDistributedOptimizer (Adam), recording every committed step.

    train_sharded.py OUT_DIR EPOCHS BATCHES_PER_EPOCH

ELASTIC_KILL="<epoch>:<batch>:<rank>": that rank SIGKILLs itself there, once (a marker file in
OUT_DIR keeps its replacement alive). ELASTIC_HOSTS="<epoch>=<hosts>": rank 0 rewrites
OUT_DIR/hosts (which the discovery script prints) when that epoch starts, once, and every rank
waits for the new round.
Rank 0 writes OUT_DIR/result.json: the committed steps (every rank's samples) with the
membership size of each, and the final parameters.
"""

import json
import os
import signal
import sys
import time

import torch

import horovod.torch as hvd

LR = 0.05


def make_model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3).double()


def features(samples):
    """Sample i's input and target, the same in the run and in the test's replay."""
    index = torch.tensor(samples, dtype=torch.float64).view(-1, 1)
    x = torch.cat([torch.sin(index * (k + 1)) for k in range(4)], dim=1)
    return x, torch.cat([x[:, :1] * 2, x[:, 1:2] - x[:, 2:3], x[:, 3:] ** 2], dim=1)


def loss_of(model, samples):
    x, y = features(samples)
    return ((model(x) - y) ** 2).mean()


def main():
    out, epochs, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hvd.init()
    dataset = torch.arange(4 * batches * 3)
    model = make_model()
    optimizer = hvd.ShardedDistributedOptimizer(torch.optim.Adam(model.parameters(), lr=LR),
                                                named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, steps=[], sizes=[])
    kill = os.environ.get("ELASTIC_KILL")
    hosts = dict(item.split("=", 1) for item in os.environ.get("ELASTIC_HOSTS", "").split(";") if item)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            marker = os.path.join(out, f"hosts.{state.epoch}")
            if str(state.epoch) in hosts and not os.path.exists(marker):
                hvd.barrier()  # every rank has seen that the marker is missing
                if hvd.rank() == 0:
                    open(marker, "w").close()
                    with open(os.path.join(out, "hosts"), "w") as f:
                        f.write(hosts[str(state.epoch)].replace(",", "\n") + "\n")
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # until the driver announces the new round
                    time.sleep(0.2)
                    state.check_host_updates()
            loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=state.sampler)
            for data in loader:
                killed = os.path.join(out, "killed")
                if kill == f"{state.epoch}:{state.batch}:{hvd.rank()}" and not os.path.exists(killed):
                    open(killed, "w").close()
                    os.kill(os.getpid(), signal.SIGKILL)
                optimizer.zero_grad()
                loss_of(model, data.tolist()).backward()
                optimizer.step()
                state.steps.append(hvd.allgather_object([int(i) for i in data.tolist()]))
                state.sizes.append(hvd.size())
                state.sampler.record_batch(state.batch, len(data))
                state.batch += 1
                time.sleep(0.05)
                state.commit()
            state.epoch += 1
            state.batch = 0
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"steps": state.steps, "sizes": state.sizes,
                       "parameters": [p.detach().reshape(-1).tolist() for p in model.parameters()]}, f)


if __name__ == "__main__":
    main()
