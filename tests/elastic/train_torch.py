"""An elastic PyTorch training run that records what it did, for tests/elastic.

    train_torch.py OUT_DIR EPOCHS BATCHES_PER_EPOCH

Environment knobs (all optional):
- ELASTIC_KILL="<epoch>:<batch>:<rank>[:how]" (comma-separated): that rank dies there once
  (`how` = kill for SIGKILL, the default; raise for an exception; commit for SIGKILL in the middle
  of that batch's `state.commit()`, after its snapshot, before its host check; reset for SIGKILL in
  the next re-init, once the new round has formed and before the state is synced; discovery to be
  SIGKILLed by the driver's next run of the discovery script, while it runs: the rank writes its
  pid to OUT_DIR/victim and trains on); a marker file in OUT_DIR keeps a replacement from dying again.
- ELASTIC_HOSTS="<epoch>=<hosts file text>;...": rank 0 writes OUT_DIR/hosts at that epoch
  (the discovery script prints it), then waits for the new round before going on.
- ELASTIC_STEP_SECONDS: sleep per batch (default 0.02).
Rank 0 writes OUT_DIR/result.json at the end: each committed step (its epoch and every rank's
samples), its size and time, the final weight and bias, and every step at which a rank's slot
variables in os.environ disagreed with hvd.rank(), hvd.size() and the local/cross queries.
"""

import json
import os
import signal
import sys
import time

import torch

import horovod.torch as hvd

LR = 0.001


def make_model():
    """The model every run starts from (a replay of the committed steps starts from it too)."""
    torch.manual_seed(0)
    return torch.nn.Linear(1, 1)


def loss_of(model, samples):
    data = torch.tensor(samples, dtype=torch.float32).view(-1, 1)
    return ((model(data) - 2 * data) ** 2).mean()


def env_disagreements():
    """The slot variables of this worker's environment that differ from the current round's values."""
    current = {"HOROVOD_RANK": hvd.rank(), "HOROVOD_SIZE": hvd.size(), "HOROVOD_LOCAL_RANK": hvd.local_rank(),
               "HOROVOD_LOCAL_SIZE": hvd.local_size(), "HOROVOD_CROSS_RANK": hvd.cross_rank(),
               "HOROVOD_CROSS_SIZE": hvd.cross_size()}
    return {name: (os.environ.get(name), str(value)) for name, value in current.items()
            if os.environ.get(name) != str(value)}


BATCH = 4


def main():
    out, epochs, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hvd.init()
    dataset = torch.arange(BATCH * batches * 3, dtype=torch.float32)  # room for 3 ranks per step
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, steps=[], sizes=[], stamps=[],
                                   env_mismatches=[])
    kills = [entry.split(":") for entry in os.environ.get("ELASTIC_KILL", "").split(",") if entry]
    schedule = dict(item.split("=", 1) for item in os.environ.get("ELASTIC_HOSTS", "").split(";") if item)
    step_seconds = float(os.environ.get("ELASTIC_STEP_SECONDS", "0.02"))

    def die(number):
        with open(os.path.join(out, f"killed.{number}"), "w") as f:
            f.write(repr(time.time()))  # when it died: recovery time is measured from here
        os.kill(os.getpid(), signal.SIGKILL)

    def maybe_die(epoch, batch, moment="step"):
        for number, entry in enumerate(kills):
            how = (entry[3:] or ["kill"])[0]
            if ([int(v) for v in entry[:3]] != [epoch, batch, hvd.rank()]
                    or os.path.exists(os.path.join(out, f"killed.{number}"))
                    or (moment == "commit") != (how == "commit")):
                continue
            if how == "raise":
                open(os.path.join(out, f"killed.{number}"), "w").close()
                raise ValueError(f"rank {hvd.rank()} fails on purpose at epoch {epoch} batch {batch}")
            if how == "reset":
                armed_resets.append(number)  # dies in the next re-init instead
            elif how == "discovery":
                open(os.path.join(out, f"killed.{number}"), "w").close()
                with open(os.path.join(out, "victim.tmp"), "w") as f:
                    f.write(str(os.getpid()))
                os.replace(os.path.join(out, "victim.tmp"), os.path.join(out, "victim"))
            else:
                die(number)

    armed_resets = []

    def die_in_reset():
        if armed_resets:
            die(armed_resets.pop())

    state.register_reset_callbacks([die_in_reset])
    save = state.save

    def save_then_maybe_die():  # commit() is save() then the host check: die between the two
        save()
        maybe_die(state.epoch, state.batch - 1, "commit")

    state.save = save_then_maybe_die

    def change_hosts(epoch):
        text = schedule.get(str(epoch))
        marker = os.path.join(out, f"hosts.{epoch}")
        if text is None or hvd.rank() != 0 or os.path.exists(marker):
            return
        open(marker, "w").close()
        with open(os.path.join(out, "hosts.tmp"), "w") as f:
            f.write(text.replace(",", "\n") + "\n")
        os.replace(os.path.join(out, "hosts.tmp"), os.path.join(out, "hosts"))

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            change_hosts(state.epoch)
            loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=state.sampler)
            for data in loader:
                maybe_die(state.epoch, state.batch)
                optimizer.zero_grad()
                loss_of(model, data.tolist()).backward()
                optimizer.step()
                everyone = hvd.allgather_object([int(i) for i in data.tolist()])
                disagreeing = [d for d in hvd.allgather_object(env_disagreements()) if d]
                if disagreeing:
                    state.env_mismatches.append((state.epoch, state.batch, disagreeing))
                state.steps.append((state.epoch, everyone))
                state.sizes.append(hvd.size())
                state.stamps.append(time.time())
                state.sampler.record_batch(state.batch, len(data))
                state.batch += 1
                time.sleep(step_seconds)
                state.commit()
            state.epoch += 1
            state.batch = 0
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"steps": state.steps, "sizes": state.sizes, "stamps": state.stamps,
                       "weight": model.weight.item(), "bias": model.bias.item(), "dataset": len(dataset),
                       "env_mismatches": state.env_mismatches}, f)


if __name__ == "__main__":
    main()
