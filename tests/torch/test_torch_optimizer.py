"""The data-parallel identity: N ranks with DistributedOptimizer on disjoint shards end with the
parameters one process gets on the whole batch. Plus the optimizer's behaviour on real ranks and
the broadcast helpers that start training from one point."""

import contextlib
import os
from typing import Iterator

import pytest

torch = pytest.importorskip("torch")

from multirank import hvdrun  # noqa: E402

IDENTITY = r'''
import torch
import horovod.torch as hvd
from horovod.common.cores import cores_per_rank

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)
X, Y = torch.randn(12, 5, dtype=torch.float64), torch.randn(12, 3, dtype=torch.float64)
SHARD = torch.arange(12)[r::n]

def make(norm=None):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(5, 6)] + ([norm(6)] if norm else []) + [torch.nn.Tanh(), torch.nn.Linear(6, 3)]
    return torch.nn.Sequential(*layers).double()

def sse(model, rows):  # summed squared error: divide by the batch the loss is a mean over
    return ((model(X[rows]) - Y[rows]) ** 2).sum()

def compare(label, opt_factory, cycles=(1, 1, 1, 1), norm=None, ref_norm=None, loss_scale=1.0, group_lists=False,
            **kwargs):
    ref, dist = make(ref_norm or norm), make(norm)
    if group_lists:  # the first two parameters reduced together, the others alone
        kwargs["groups"] = [list(dist.parameters())[:2]]
    ref_opt = opt_factory(ref.parameters())
    opt = hvd.DistributedOptimizer(opt_factory(dist.parameters()), named_parameters=dist.named_parameters(),
                                   **kwargs)
    for passes in cycles:  # a cycle of `passes` backward passes, then one step
        ref_opt.zero_grad()
        (loss_scale * sse(ref, torch.arange(12)) / 12).backward()
        ref_opt.step()
        opt.zero_grad()
        for micro in SHARD.chunk(passes):
            (sse(dist, micro) / len(SHARD)).backward()
        opt.step()
    diffs = [(a - b).abs().max().item() for a, b in zip(ref.state_dict().values(), dist.state_dict().values())
             if a.is_floating_point()]
    report(**{label: max(diffs)})

sgd = lambda p: torch.optim.SGD(p, lr=0.1)
momentum = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)
adam = lambda p: torch.optim.Adam(p, lr=0.01)
compare("sgd", sgd)
compare("momentum", momentum)
compare("adam", adam)
compare("sgd_passes", sgd, cycles=(2, 2, 2), backward_passes_per_step=2)
compare("adam_passes", adam, cycles=(3, 3, 3), backward_passes_per_step=3)
compare("adam_partial_cycle", adam, cycles=(3, 2, 3, 1, 3), backward_passes_per_step=3)
compare("momentum_groups", momentum, groups=2)
compare("adam_group_lists", adam, group_lists=True)
compare("sgd_predivide", sgd, gradient_predivide_factor=2.0)
compare("sgd_sum", sgd, op=hvd.Sum, loss_scale=float(n))
compare("fp16", adam, compression=hvd.Compression.fp16)
compare("bf16", sgd, compression=hvd.Compression.bf16)
compare("sync_batch_norm", momentum, norm=hvd.SyncBatchNorm, ref_norm=torch.nn.BatchNorm1d)
report(overlap=cores_per_rank(hvd.local_size()) >= 2)
'''


@contextlib.contextmanager
def one_core() -> Iterator[None]:
    """The ranks started inside inherit a single core: each has less than one of its own."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# Where a rank has a core or more of its own, gradients are reduced during backward (overlap);
# with less, all at step(). "two-hosts" (one rank per host name) and "one-core" force each mode;
# the others take what this machine gives them.
@pytest.mark.parametrize("np,args,pinned,overlap", [
    (2, [], False, None), (3, [], False, None), (4, [], False, None),
    (2, ["-H", "localhost:1,127.0.0.1:1"], False, True), (2, [], True, False),
], ids=["2", "3", "4", "two-hosts-overlap", "one-core-at-step"])
def test_n_ranks_equal_one_process_on_the_whole_batch(np, args, pinned, overlap):
    with one_core() if pinned else contextlib.nullcontext():
        result = hvdrun(IDENTITY, np=np, args=args, timeout=180).check()
    for rank in range(np):
        got = result.ranks[rank]
        mode = got.pop("overlap")
        assert overlap is None or mode is overlap, (rank, mode)
        exact = {k: v for k, v in got.items() if k not in ("fp16", "bf16")}
        assert len(exact) == 11
        assert all(v < 1e-12 for v in exact.values()), (rank, got)
        assert got["fp16"] < 2e-3 and got["bf16"] < 2e-2, (rank, got)


BEHAVIOUR = r'''
import torch
import horovod.torch as hvd

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()

def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

def agree(model):
    every = hvd.allgather(flat(model).unsqueeze(0))
    return bool(all(torch.equal(every[0], row) for row in every))

# A branch only rank 0 uses: rank 1 reduces zeros for it, nobody hangs, and weights stay equal.
torch.manual_seed(0)
trunk, branch = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
model = torch.nn.ModuleDict({"trunk": trunk, "branch": branch})
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
for step in range(3):
    opt.zero_grad()
    out = trunk(torch.randn(4, 3))
    (branch(out).sum() if r == 0 else out.sum()).backward()
    opt.step()
report(unused_agree=agree(model))

# A parameter group added after wrapping is averaged like the others.
extra = torch.nn.Linear(3, 2)
hvd.broadcast_parameters(extra.state_dict(), root_rank=0)
opt.add_param_group({"params": list(extra.parameters())})
opt.zero_grad()
(extra(trunk(torch.randn(4, 3))).sum() * (r + 1)).backward()
opt.step()
report(added_group_agree=agree(extra))

# A rank with no batch this step runs no backward but still steps: it reduces zeros, nobody hangs.
opt.zero_grad()
if r == 0:
    trunk(torch.randn(4, 3)).sum().backward()
opt.step()
report(skipped_backward_agree=agree(model))

# Uneven shards: rank 0 has one batch more; rank 1 joins early and contributes zeros meanwhile.
torch.manual_seed(2)
lone = torch.nn.Linear(3, 1)
jopt = hvd.DistributedOptimizer(torch.optim.SGD(lone.parameters(), lr=0.1), named_parameters=lone.named_parameters())
for _ in range(3 if r == 0 else 2):
    jopt.zero_grad()
    lone(torch.ones(2, 3)).sum().backward()
    jopt.step()
report(joined_last=hvd.join(), joined_bias=lone.bias.item())

# Gradient clipping between synchronize() and step(), Horovod's documented pattern.
opt.zero_grad()
trunk(torch.randn(4, 3) * (r + 1)).sum().backward()
opt.synchronize()
torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
with opt.skip_synchronize():
    opt.step()
report(clip_agree=agree(model))

# Sparse embedding gradients, gathered or reduced as dense: how much rows 0, 1 and 4 moved.
for dense in (False, True):
    torch.manual_seed(1)
    emb = torch.nn.Embedding(6, 2, sparse=True)
    before = emb.weight.detach()[[0, 1, 4]].sum(1)
    eopt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5), sparse_as_dense=dense)
    emb(torch.tensor([r, 4])).sum().backward()
    eopt.step()
    report(**{f"sparse_{dense}": (emb.weight.detach()[[0, 1, 4]].sum(1) - before).tolist(),
              f"sparse_{dense}_stays_sparse": emb.weight.grad.is_sparse})

# More backward passes than backward_passes_per_step: a clear AssertionError on every rank.
opt2 = hvd.DistributedOptimizer(torch.optim.SGD(trunk.parameters(), lr=0.1), backward_passes_per_step=1)
trunk(torch.randn(1, 3)).sum().backward()
try:
    trunk(torch.randn(1, 3)).sum().backward()
except AssertionError as exc:
    report(too_many=str(exc))
opt2.synchronize()

# A subset of ranks: in a process set of rank 0 alone, rank 0's gradient (1) is not averaged with
# rank 1's (2); rank 1, outside the set, steps on its own gradient.
hvd.shutdown()
solo = hvd.ProcessSet([0])
hvd.init(process_sets=[solo])
lin = torch.nn.Linear(2, 1)
start = lin.weight.detach().clone()
sopt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), process_set=solo)
lin(torch.full((1, 2), r + 1.0)).sum().backward()
sopt.step()
report(solo_moved=(lin.weight.detach() - start).reshape(-1).tolist())
'''


def test_optimizer_behaviour_on_two_ranks():
    result = hvdrun(BEHAVIOUR, np=2, timeout=120).check()
    for rank, got in result.every_rank(2):
        assert got["unused_agree"] and got["clip_agree"] and got["skipped_backward_agree"]
        assert got["added_group_agree"] is True
        assert got["too_many"].startswith(
            "Gradients were computed more than backward_passes_per_step times before call to step().")
        assert "more than backward_passes_per_step=1" in got["too_many"]
        assert got["solo_moved"] == pytest.approx([-0.1 * (rank + 1)] * 2, abs=1e-7), rank
        assert got["joined_last"] == 0
        # rows 0 and 1 are each used by one rank (grad 1 per element, averaged 0.5); row 4 by both
        # (grad 1): lr 0.5 moves a row's two elements by 0.25 each, or 0.5 each
        for key in ("sparse_False", "sparse_True"):
            assert got[key] == pytest.approx([-0.5, -0.5, -1.0], abs=1e-6), (rank, key)
            assert got[f"{key}_stays_sparse"] is True, (rank, key)
    # the bias gradient is 2 (batch of two): two steps together, then one with rank 1 joined
    # (2 + 0, averaged over both ranks: 1)
    start = result.ranks[1]["joined_bias"] + 0.1 * 2 * 2
    assert result.ranks[0]["joined_bias"] == pytest.approx(start - 0.1 * (2 * 2 + 1))


SPARSE_ADAM = r'''
import warnings
import torch
import horovod.torch as hvd

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)
BATCHES = [torch.randint(0, 9, (12,)) for _ in range(3)]  # row 9 is never looked up
TARGETS = [torch.randn(12, 3, dtype=torch.float64) for _ in range(3)]

def make():
    torch.manual_seed(1)
    return torch.nn.Embedding(10, 3, sparse=True).double()

def train(model, optimizer, rows):
    for ids, target in zip(BATCHES, TARGETS):
        optimizer.zero_grad()
        loss = ((model(ids[rows]) - target[rows]) ** 2).sum() / len(rows)
        loss.backward()
        optimizer.step()
        report(**{f"sparse_grad_{type(optimizer).__name__}": model.weight.grad.is_sparse})

reference = make()
train(reference, torch.optim.SparseAdam(reference.parameters(), lr=0.1), torch.arange(12))
for sparse_as_dense in (False, True):
    model = make()
    optimizer = torch.optim.SparseAdam(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         sparse_as_dense=sparse_as_dense)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    train(model, optimizer, torch.arange(12)[r::n])
    report(**{f"diff_{sparse_as_dense}": (model.weight - reference.weight).abs().max().item(),
              f"untouched_{sparse_as_dense}": torch.equal(model.weight[9], make().weight[9])})

# Without named_parameters: Horovod's names, unique and the same on every rank.
net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
opt = torch.optim.SGD([{"params": net[0].parameters()}, {"params": net[1].parameters(), "lr": 0.2}], lr=0.1)
opt = hvd.DistributedOptimizer(opt)
names = [opt._parameter_names[p] for p in net.parameters()]
report(names=names, names_agree=hvd.allgather_object(names) == [names] * n)

# step() after an explicit synchronize() without skip_synchronize(): Horovod's warning.
net(torch.randn(2, 3)).sum().backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.step()
report(warned=[str(w.message) for w in caught])
opt.zero_grad()
'''


@pytest.mark.parametrize("np", [2, 3])
def test_sparse_adam_on_n_ranks_equals_one_process(np):
    result = hvdrun(SPARSE_ADAM, np=np, timeout=120).check()
    for rank, got in result.every_rank(np):
        for sparse_as_dense in ("False", "True"):
            # SparseAdam refuses dense gradients: it ran, so it was handed sparse ones
            assert got[f"diff_{sparse_as_dense}"] < 1e-12, (rank, sparse_as_dense, got)
            assert got[f"untouched_{sparse_as_dense}"] is True, (rank, sparse_as_dense)
        assert got["sparse_grad_SparseAdam"] is True
        assert got["names"] == ["allreduce.noname.0.0", "allreduce.noname.0.1", "allreduce.noname.1.0",
                                "allreduce.noname.1.1"]
        assert got["names_agree"] is True
        assert len(got["warned"]) == 1, got["warned"]
        assert got["warned"][0].startswith("optimizer.step() called without optimizer.skip_synchronize() "
                                           "context after optimizer.synchronize().")


BROADCASTS = r'''
import copy
import torch
import horovod.torch as hvd

torch.set_num_threads(1)
hvd.init()
r = hvd.rank()

def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))

def train(model, opt, steps, seed):
    torch.manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()

model = make_model(seed=r)  # every rank starts somewhere else
hvd.broadcast_parameters(model.state_dict(), root_rank=1)
root_values = hvd.broadcast_object({k: v.clone() for k, v in model.state_dict().items()}, root_rank=1)
report(params_equal=all(torch.equal(v, root_values[k]) for k, v in model.state_dict().items()))

for kind in ("adam", "sgd", "lbfgs", "empty"):
    model = make_model(seed=0)
    if kind == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01 if r == 0 else 0.5, betas=(0.8, 0.9))
    elif kind == "lbfgs":
        opt = torch.optim.LBFGS(model.parameters(), lr=0.1 * (r + 1), history_size=3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    if kind == "lbfgs":
        for _ in range(r + 1):
            opt.zero_grad()
            def closure():
                opt.zero_grad()
                loss = model(torch.ones(5, 3)).pow(2).mean()
                loss.backward()
                return loss
            opt.step(closure)
    elif kind != "empty":
        train(model, opt, steps=2 + r, seed=r)
    before = copy.deepcopy(opt.state_dict())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    after = opt.state_dict()
    mine = hvd.allgather_object(after)
    def same(a, b):
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b
    report(**{f"{kind}_ranks_agree": same(mine[0], mine[1]),
              f"{kind}_root_untouched": same(before, after) if r == 0 else None,
              f"{kind}_state_size": len(after["state"])})
    if kind == "adam":  # training continues identically once both start from the root's point
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        train(model, opt, steps=2, seed=7)
        gathered = hvd.allgather_object([p.detach() for p in model.parameters()])
        report(adam_continue_equal=all(torch.equal(a, b) for a, b in zip(*gathered)))
'''


def test_broadcast_parameters_and_optimizer_state():
    result = hvdrun(BROADCASTS, np=2, timeout=120).check()
    for rank in (0, 1):
        got = result.ranks[rank]
        assert got["params_equal"]
        for kind in ("adam", "sgd", "lbfgs", "empty"):
            assert got[f"{kind}_ranks_agree"], (rank, kind)
        assert got["adam_continue_equal"]
        assert got["adam_state_size"] == 6 and got["empty_state_size"] == 0
    for kind in ("adam", "sgd", "lbfgs", "empty"):
        assert result.ranks[0][f"{kind}_root_untouched"], kind


OVERLAP_SETTING = r'''
import json
import os
import time
import torch
import horovod.torch as hvd

torch.set_num_threads(1)
hvd.init()
TIMELINE = os.environ["HOROVOD_TIMELINE"]

def requested_by_rank0():
    """Tensor names whose request from rank 0 the timeline records (rank 0 writes it; an `X`
    event named "0" marks rank 0's request arriving at the coordinator)."""
    with open(TIMELINE) as f:
        events = json.load(f)  # the file stays valid JSON between writes
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    return {names.get(e["pid"]) for e in events if e.get("ph") == "X" and e.get("name") == "0"}

def train(setting):
    """Three steps with HOROVOD_TORCH_OVERLAP_BACKWARD=setting; (final parameters, whether the last
    layer's allreduce reached the engine while backward was held before the first layer)."""
    os.environ["HOROVOD_TORCH_OVERLAP_BACKWARD"] = setting
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3)).double()
    # Each run's own names, so that the timeline tells the two apart.
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=[(f"run{setting}.{n}", p) for n, p in model.named_parameters()])
    late = {f"allreduce.run{setting}.4.weight", f"allreduce.run{setting}.4.bias"}  # backward's first
    seen = []

    def first_layer_reached(grad):
        # Backward of the first layer's output: the last layer's gradient is complete by now, and
        # the first layer's cannot be until this returns. With overlap its allreduce was submitted
        # from the hook, so rank 0's request shows up (bounded wait); without, nothing was submitted.
        if hvd.rank() == 0 and not seen:
            deadline = time.monotonic() + (60 if setting == "1" else 0)
            while not late <= requested_by_rank0() and time.monotonic() < deadline:
                time.sleep(0.02)
            seen.append(late <= requested_by_rank0())
        return grad

    torch.manual_seed(1 + hvd.rank())
    for _ in range(3):
        x, y = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
        opt.zero_grad()
        hidden = model[0](x)
        hidden.register_hook(first_layer_reached)
        ((model[1:](hidden) - y) ** 2).mean().backward()
        opt.step()
    return [p.detach().reshape(-1) for p in model.parameters()], seen[:1]

on, seen_on = train("1")
off, seen_off = train("0")
report(identical=all(torch.equal(a, b) for a, b in zip(on, off)), seen_on=seen_on, seen_off=seen_off)
'''


def test_overlap_setting_submits_during_backward_with_the_same_results(tmp_path):
    # This 2-core machine would not overlap 2 ranks by itself: =1 forces it, =0 forbids it.
    timeline = tmp_path / "timeline.json"
    result = hvdrun(OVERLAP_SETTING, np=2, env={"HOROVOD_TIMELINE": str(timeline)}, timeout=120).check()
    for rank in (0, 1):
        assert result.ranks[rank]["identical"] is True, rank
    got = result.ranks[0]
    assert got["seen_on"] == [True]  # =1: submitted from the hook, while backward still ran
    assert got["seen_off"] == [False]  # =0: nothing reached the engine while backward ran
    # (and "identical" shows that =0 still reduced every gradient, as backward ended)


ONE_CYCLE_PER_STEP = r'''
import torch
import horovod.torch as hvd
from horovod.common.engine.cycle import Cycle
from horovod.common.engine.executor import Executor

# Record what each step's cycles run (the calls themselves run unchanged).
cycles, executed = [], []
run, execute = Cycle.run, Executor.execute
def counted_run(self):
    before = len(executed)
    try:
        return run(self)
    finally:
        cycles.append(sorted(name for names in executed[before:] for name in names))
def counted_execute(self, response, entries, members, *rest):
    executed.append(list(response.names))
    return execute(self, response, entries, members, *rest)
Cycle.run, Executor.execute = counted_run, counted_execute

torch.set_num_threads(1)
hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
names = sorted(f"allreduce.{n}" for n, _ in model.named_parameters())
torch.manual_seed(1 + hvd.rank())
steps = []
for step in range(6):
    x, y = torch.randn(5, 6, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)  # this rank's own (no hooks)
    del cycles[:], executed[:]
    loss.backward()  # the step's allreduces run as backward ends
    # Cycles that ran nothing (a peer's, answered while it waited for us) do not count.
    record = {"cycles": [c for c in cycles if c], "executed": [sorted(e) for e in executed]}
    expected = hvd.grouped_allreduce(list(grads), op=hvd.Average, name="expected")  # one by one, same sums
    record["averaged"] = all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected))
    opt.step()
    steps.append(record)
report(steps=steps, names=names)
'''


def test_a_steps_gradients_take_one_cycle_and_one_fused_allreduce():
    """Where gradients are submitted as backward ends (no overlap), the step's allreduces go in as
    one batch: once they are cached, every step is one cycle that offers them all, and they run as
    one fused allreduce (with one in flight per gradient they would take one cycle each)."""
    result = hvdrun(ONE_CYCLE_PER_STEP, np=2, env={"HOROVOD_TORCH_OVERLAP_BACKWARD": "0"}).check()
    for rank in (0, 1):
        got = result.ranks[rank]
        names = got["names"]
        for number, step in enumerate(got["steps"]):
            assert step["averaged"] is True, (rank, number)
            if number >= 1:  # the first step's requests go through the coordinator (not cached yet)
                assert step["cycles"] == [names], (rank, number, step)
                assert step["executed"] == [names], (rank, number, step)
