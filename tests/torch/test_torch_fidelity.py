"""Drop-in details Horovod scripts rely on, checked on two real ranks: sparse gradients stay
sparse for torch.optim.SparseAdam, broadcast_optimizer_state copes with parameters that have no
gradient or state yet, step() after an explicit synchronize() warns, the wrapper is named after
the wrapped class, reducescatter(op=Adasum) raises a RuntimeError, and horovod.torch.mpi_ops /
horovod.common.util offer the names scripts import from them."""

import pytest

torch = pytest.importorskip("torch")

from multirank import hvdrun  # noqa: E402

FIDELITY = r'''
import warnings
import torch
import horovod.torch as hvd

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()

# Sparse gradients: averaged, still sparse, and SparseAdam steps with them.
torch.manual_seed(0)
emb = torch.nn.Embedding(6, 3, sparse=True)
opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                               named_parameters=emb.named_parameters())
emb(torch.tensor([r, 4])).sum().backward()
opt.step()
grad = emb.weight.grad.coalesce()
report(sparse=grad.is_sparse, sparse_rows=sorted(grad.indices()[0].tolist()),
       sparse_values=grad.to_dense().sum(1).tolist(), weights=emb.weight.detach().sum().item(),
       type_name=type(opt).__name__, is_sparse_adam=isinstance(opt, torch.optim.SparseAdam))

# broadcast_optimizer_state: a frozen layer, a layer never used, state only on the root.
torch.manual_seed(r)
model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
model[0].weight.requires_grad_(False)
adam = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1),
                                named_parameters=model.named_parameters())
hvd.broadcast_optimizer_state(adam, root_rank=0)  # no state anywhere yet
if r == 0:
    with adam.no_sync():  # a backward on the root alone: nothing to reduce with the others
        model[1](torch.ones(2)).sum().backward()
    adam._optimizer.step()  # local state on the root only
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(adam, root_rank=0)
state = adam.state_dict()["state"]
report(state_keys=sorted(state), exp_avg=sorted(round(float(s["exp_avg"].sum()), 6) for s in state.values()),
       params=[round(float(p.sum()), 6) for p in model.parameters()])

# step() after an explicit synchronize() warns, unless inside skip_synchronize().
lin = torch.nn.Linear(2, 2)
sgd = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1), named_parameters=lin.named_parameters())
def run_step(skip):
    lin(torch.ones(2)).sum().backward()
    sgd.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if skip:
            with sgd.skip_synchronize():
                sgd.step()
        else:
            sgd.step()
    sgd.zero_grad()
    return [(w.category.__name__, str(w.message)) for w in caught]
report(unskipped=run_step(False), skipped=run_step(True))

# reducescatter(op=Adasum): a RuntimeError, as Horovod's core raises; the job goes on.
try:
    hvd.reducescatter(torch.ones(4), op=hvd.Adasum)
    report(adasum=None)
except RuntimeError as exc:
    report(adasum=[type(exc).__name__, str(exc)])
report(after=hvd.allreduce(torch.ones(1), op=hvd.Sum).item())

# What scripts import from horovod.torch.mpi_ops and horovod.common.util.
from horovod.torch import mpi_ops
from horovod.torch.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, ProcessSet, global_process_set,
                                   gpu_available, is_initialized, local_rank, local_size, rank, size,
                                   handle_average_backwards_compatibility)
from horovod.common.util import check_extension, env, is_version_greater_equal_than, split_list
from horovod.common.util import gpu_available as util_gpu_available
from horovod.common.exceptions import HorovodVersionMismatchError
check_extension("horovod.torch", "HOROVOD_WITH_PYTORCH", mpi_ops.__file__, "mpi_lib_v2")
try:
    check_extension("horovod.mxnet", "HOROVOD_WITH_MXNET", mpi_ops.__file__, "mpi_lib")
    mxnet_error = None
except ImportError as exc:
    mxnet_error = str(exc)
with env(KHOROVOD_FIDELITY_PROBE="1"):
    import os
    inside = os.environ.get("KHOROVOD_FIDELITY_PROBE")
report(mpi_ops=[size(), rank(), local_size(), local_rank(), is_initialized(), gpu_available("torch"),
                util_gpu_available("horovod.torch"),
                Average, Sum, Adasum, Min, Max, Product, global_process_set.size(),
                handle_average_backwards_compatibility(None, False)],
       split=[list(part) for part in split_list(list(range(7)), 3)],
       versions=[is_version_greater_equal_than("2.13.0", "2.9.1"), is_version_greater_equal_than("1.2.3", "1.10.0")],
       env=[inside, os.environ.get("KHOROVOD_FIDELITY_PROBE")], mxnet_error=mxnet_error,
       mismatch=issubclass(HorovodVersionMismatchError, ImportError))

# Horovod's autograd nodes, applied directly with Horovod's forward arguments.
from horovod.torch.mpi_ops import (HorovodAllgather, HorovodAllreduce, HorovodAlltoall, HorovodBroadcast,
                                   HorovodGroupedAllgather, HorovodGroupedAllreduce, HorovodGroupedReducescatter,
                                   HorovodReducescatter)
def node(apply, *shape):
    """(output(s) as lists, the input's gradient for a loss of sum(output * (rank + 1)))."""
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape).requires_grad_()
    out = apply(x)
    outs = out if isinstance(out, tuple) else (out,)
    sum((o * (r + 1)).sum() for o in outs if o.is_floating_point()).backward()
    return [o.tolist() for o in outs], x.grad.tolist()
ps = global_process_set
report(nodes={
    "allreduce": node(lambda x: HorovodAllreduce.apply(x, None, "n.ar", Sum, 1.0, 2.0, ps), 2),
    "grouped_allreduce": node(lambda x: HorovodGroupedAllreduce.apply(None, "n.gar", Average, 1.0, 1.0, ps, x,
                                                                      x * 2), 2),
    "allgather": node(lambda x: HorovodAllgather.apply(x, "n.ag", ps), 1, 2),
    "grouped_allgather": node(lambda x: HorovodGroupedAllgather.apply("n.gag", ps, x), 1),
    "broadcast": node(lambda x: HorovodBroadcast.apply(x + r, 1, "n.bc", ps), 2),
    "alltoall": node(lambda x: HorovodAlltoall.apply(x + 10 * r, None, "n.a2a", ps), 2),
    "alltoall_splits": node(lambda x: HorovodAlltoall.apply(x, torch.tensor([1, 2], dtype=torch.int32), "n.a2s",
                                                            ps), 3),
    "reducescatter": node(lambda x: HorovodReducescatter.apply(x, "n.rs", Sum, ps, 1.0, 1.0), 2),
    "grouped_reducescatter": node(lambda x: HorovodGroupedReducescatter.apply("n.grs", Average, ps, 1.0, 1.0, x), 4),
})
'''


@pytest.fixture(scope="module")
def fidelity():
    return hvdrun(FIDELITY, np=2, timeout=120).check()


def test_sparse_gradients_stay_sparse_for_sparse_adam(fidelity):
    for rank in (0, 1):
        got = fidelity.ranks[rank]
        assert got["sparse"] is True and got["is_sparse_adam"] is True
        # rank 0 touched rows 0 and 4, rank 1 rows 1 and 4: the average holds rows 0, 1 and 4
        # (row 4 once per rank, uncoalesced entries add up), each of 3 ones halved.
        assert sorted(set(got["sparse_rows"])) == [0, 1, 4]
        assert got["sparse_values"] == [1.5, 1.5, 0.0, 0.0, 3.0, 0.0]
    assert fidelity.ranks[0]["weights"] == fidelity.ranks[1]["weights"]


def test_wrapper_reports_the_wrapped_class_name(fidelity):
    assert fidelity.ranks[0]["type_name"] == "SparseAdam"


def test_broadcast_optimizer_state_with_frozen_unused_and_root_only_state(fidelity):
    root, other = fidelity.ranks[0], fidelity.ranks[1]
    assert root["state_keys"] == other["state_keys"] and len(root["state_keys"]) == 2
    assert root["exp_avg"] == other["exp_avg"]
    assert root["params"] == other["params"]


def test_step_after_synchronize_warns_unless_skipped(fidelity):
    for rank in (0, 1):
        got = fidelity.ranks[rank]
        assert [category for category, _ in got["unskipped"]] == ["UserWarning"]
        assert got["unskipped"][0][1].startswith(
            "optimizer.step() called without optimizer.skip_synchronize() context after optimizer.synchronize().")
        assert got["skipped"] == []


def test_reducescatter_adasum_raises_a_runtime_error_on_every_rank(fidelity):
    for rank in (0, 1):
        got = fidelity.ranks[rank]
        assert got["adasum"][0] == "HorovodInternalError" and "Adasum" in got["adasum"][1]
        assert got["after"] == 2.0


def test_mpi_ops_and_common_util_names(fidelity):
    for rank in (0, 1):
        got = fidelity.ranks[rank]
        assert got["mpi_ops"] == [2, rank, 2, rank, True, False, False, 0, 1, 2, 3, 4, 5, 2, 1]
        assert got["split"] == [[0, 1, 2], [3, 4], [5, 6]]
        assert got["versions"] == [True, False]
        assert got["env"] == ["1", None]
        assert "mxnet" in got["mxnet_error"] and got["mismatch"] is True


def test_horovods_autograd_nodes_in_mpi_ops(fidelity):
    """Each node's output, and its input's gradient for loss = sum(output * (rank + 1)): the
    allreduce-like ones sum those weights over the ranks (1 + 2 = 3), averaged ones halve them."""
    for rank, got in fidelity.every_rank(2):
        nodes = got["nodes"]
        assert nodes["allreduce"] == [[[0.0, 4.0]], [6.0, 6.0]]  # Sum, postscale 2; grad Sum of 2*w
        assert nodes["grouped_allreduce"] == [[[0.0, 1.0], [0.0, 2.0]], [4.5, 4.5]]  # grad avg(w) + 2 avg(w)
        assert nodes["allgather"] == [[[[0.0, 1.0], [0.0, 1.0]]], [[1.5, 1.5]]]  # grad: average of w
        assert nodes["grouped_allgather"] == [[[0.0, 0.0]], [1.5]]
        assert nodes["broadcast"] == [[[1.0, 2.0]], [[0.0, 0.0], [1.5, 1.5]][rank]]  # root 1 gets avg(w)
        assert nodes["alltoall"] == [[[[0.0, 10.0], [1.0, 11.0]][rank]], [1.0, 2.0]]  # row j back from rank j
        assert nodes["alltoall_splits"] == [[[[0.0, 0.0], [1.0, 2.0, 1.0, 2.0]][rank], [[1, 1], [2, 2]][rank]],
                                            [1.0, 2.0, 2.0]]
        assert nodes["reducescatter"] == [[[[0.0], [2.0]][rank]], [2.0, 4.0]]  # Horovod scales Sum by n
        # Average: Horovod's gradient is the gathered output gradients, unscaled
        assert nodes["grouped_reducescatter"] == [[[[0.0, 1.0], [2.0, 3.0]][rank]], [1.0, 1.0, 2.0, 2.0]]
