"""ShardedDistributedOptimizer on real ranks: the same parameters as the unsharded
DistributedOptimizer and as one process on the whole batch, about 1/N of the optimizer state per
rank, and checkpoints that the unsharded optimizer reads (and the other way round)."""

import pytest

torch = pytest.importorskip("torch")

from multirank import hvdrun  # noqa: E402
from torch_regression import prelude  # noqa: E402

SHARDED = prelude() + r'''
def groups(model):  # two groups with their own options: the layers' weights, then the biases
    weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    return [{"params": weights}, {"params": biases, "lr": 0.05}]

def sse(model, rows):
    return ((model(X[rows]) - Y[rows]) ** 2).sum()

def state_bytes(opt):
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor) and v.dim())

def train(model, opt, steps, rows, passes=1):
    for _ in range(steps):
        opt.zero_grad()
        for micro in rows.chunk(passes):
            (sse(model, micro) / len(rows)).backward()
        opt.step()

def max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters()))

factories = {
    "momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
}
for label, factory in factories.items():
    single, plain, sharded = make(), make(), make()
    single_opt = factory(groups(single))
    plain_opt = hvd.DistributedOptimizer(factory(groups(plain)), named_parameters=plain.named_parameters())
    opt = hvd.ShardedDistributedOptimizer(factory(groups(sharded)), named_parameters=sharded.named_parameters())
    hvd.broadcast_parameters(sharded.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    train(single, single_opt, 4, torch.arange(12))
    train(plain, plain_opt, 4, ROWS)
    train(sharded, opt, 2, ROWS)
    train(sharded, opt, 2, ROWS, passes=2)  # accumulated backward passes need no option
    report(**{f"{label}_vs_plain": max_diff(sharded, plain), f"{label}_vs_single": max_diff(sharded, single),
              f"{label}_bytes": state_bytes(opt), f"{label}_plain_bytes": state_bytes(plain_opt),
              f"{label}_isinstance": isinstance(opt, torch.optim.Optimizer) and type(opt).__name__})

    # The whole state, gathered on rank 0, is the unsharded optimizer's (same format, same numbers).
    opt.consolidate_state_dict(to=0)
    if r == 0:
        whole, ref = opt.state_dict(), plain_opt.state_dict()
        same = whole["param_groups"] == ref["param_groups"] and sorted(whole["state"]) == sorted(ref["state"])
        diff = max((whole["state"][i][k] - ref["state"][i][k]).abs().max().item()
                   for i in ref["state"] for k in ref["state"][i])
        report(**{f"{label}_whole_same_keys": same, f"{label}_whole_diff": diff})
        torch.save(whole, f"/tmp/khvd-sharded-{label}-{n}.pt")
    hvd.barrier()

    # Loaded back (every rank), training goes on exactly as the unsharded optimizer does.
    whole = torch.load(f"/tmp/khvd-sharded-{label}-{n}.pt")
    resumed = make()
    resumed.load_state_dict(sharded.state_dict())
    resumed_opt = hvd.ShardedDistributedOptimizer(factory(groups(resumed)))
    resumed_opt.load_state_dict(whole)
    part = resumed_opt.shard_state_dict()
    resumed_opt.load_shard_state_dict(part)
    train(resumed, resumed_opt, 2, ROWS)
    train(plain, plain_opt, 2, ROWS)
    report(**{f"{label}_resumed_vs_plain": max_diff(resumed, plain)})
    hvd.barrier()
    if r == 0:
        import os
        os.remove(f"/tmp/khvd-sharded-{label}-{n}.pt")

# An LR scheduler drives the wrapped optimizer's groups.
model = make()
opt = hvd.ShardedDistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
train(model, opt, 1, ROWS)
scheduler.step()
report(lr=opt.param_groups[0]["lr"])
try:
    opt.state_dict()
except RuntimeError as e:
    report(state_dict_error=str(e))

# What cannot be sharded is refused, on every rank.
mixed = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]
attempts = {"mixed": lambda: hvd.ShardedDistributedOptimizer(torch.optim.SGD(mixed, lr=1)),
            "adasum": lambda: hvd.ShardedDistributedOptimizer(torch.optim.SGD(mixed[:1], lr=1), op=hvd.Adasum)}
for label, attempt in attempts.items():
    try:
        attempt()
    except ValueError as e:
        report(**{label: str(e)})
'''


@pytest.mark.parametrize("np", [2, 3, 4])
def test_sharded_state_equals_unsharded_training_with_1_over_n_of_the_state(np):
    result = hvdrun(SHARDED, np=np, timeout=240).check()
    for rank in range(np):
        got = result.ranks[rank]
        for label in ("momentum", "adam"):
            assert got[f"{label}_vs_plain"] < 1e-12, (rank, label, got)
            assert got[f"{label}_vs_single"] < 1e-12, (rank, label, got)
            assert got[f"{label}_resumed_vs_plain"] < 1e-12, (rank, label, got)
            assert got[f"{label}_isinstance"] == {"momentum": "SGD", "adam": "Adam"}[label]
            # 56 weights and 10 biases: blocks of ceil(56/n) and ceil(10/n) elements per rank.
            per_element = got[f"{label}_plain_bytes"] // 66
            assert got[f"{label}_bytes"] == per_element * (-(-56 // np) + -(-10 // np)), (rank, got)
        assert got["lr"] == 0.05
        assert "call optimizer.consolidate_state_dict(to=0) on every rank first" in got["state_dict_error"]
        assert "param group 0 mixes" in got["mixed"] and "put parameters of each dtype" in got["mixed"]
        assert "op must be Average or Sum" in got["adasum"]
    for label in ("momentum", "adam"):
        assert result.ranks[0][f"{label}_whole_same_keys"] is True
        assert result.ranks[0][f"{label}_whole_diff"] < 1e-12


def test_layout_blocks_and_state_reassembled_under_another_layout():
    from horovod.torch.shard_layout import Piece, ShardLayout, assemble

    three = ShardLayout((10, 2), size=3, rank=2)
    assert [three.bounds(0, k) for k in range(3)] == [(0, 4), (4, 8), (8, 10)]
    assert [three.bounds(1, k) for k in range(3)] == [(0, 1), (1, 2), (2, 2)]  # the last block is padding
    moments = torch.arange(10, dtype=torch.float64)
    pieces = [Piece(0, s, e, {"exp_avg": moments[s:e]}, {"step": 3}) for s, e in ((4, 8), (0, 4), (8, 10))]
    two = ShardLayout((10, 2), size=2, rank=1)
    state = assemble(pieces, 0, *two.bounds(0), two.shard(0))
    assert state["step"] == 3 and state["exp_avg"].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
    with pytest.raises(RuntimeError, match=r"positions 4\.\.7 of param group 0 is on no remaining rank"):
        assemble([pieces[1], pieces[2]], 0, 0, 10, 10)
    assert assemble([Piece(0, 0, 10)], 0, 0, 5, 5) == {}  # no step taken yet: nothing to rebuild
