"""Every horovod.torch collective on 2 real ranks: values per dtype, async handles, gradients,
process sets, join, and the errors each rank sees."""

import pytest

torch = pytest.importorskip("torch")

from multirank import hvdrun  # noqa: E402

from horovod.common import basics  # noqa: E402

COLLECTIVES = r'''
import torch
import horovod.torch as hvd

torch.set_num_threads(1)
hvd.init(process_sets="dynamic")
r, n = hvd.rank(), hvd.size()
bad = []

def same(label, got, want):
    if not (isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
            and torch.equal(got, want)):
        bad.append(f"{label}: got {got!r}, want {want!r}")

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.bool]
for dt in DTYPES:
    k = str(dt)
    mine = (torch.arange(6).reshape(2, 3) % 2 + r).to(dt)
    every = [(torch.arange(6).reshape(2, 3) % 2 + q).to(dt) for q in range(n)]
    op = hvd.Max if dt == torch.bool else hvd.Sum
    want = torch.stack(every).any(0) if dt == torch.bool else sum(e.to(torch.float64) for e in every).to(dt)
    same(f"allreduce {k}", hvd.allreduce(mine, op=op), want)
    inplace = mine.clone()
    same(f"allreduce_ {k}", hvd.allreduce_(inplace, op=op), want)
    same(f"allreduce_ memory {k}", inplace, want)
    same(f"grouped_allreduce {k}", hvd.grouped_allreduce([mine, mine[0]], op=op)[1], want[0])
    rows = mine[: r + 1].contiguous()
    same(f"allgather {k}", hvd.allgather(rows), torch.cat([e[: q + 1] for q, e in enumerate(every)]))
    same(f"grouped_allgather {k}", hvd.grouped_allgather([rows, mine])[1], torch.cat(every))
    same(f"broadcast {k}", hvd.broadcast(mine, root_rank=1), every[1])
    target = mine.clone()
    hvd.broadcast_(target, root_rank=1)
    same(f"broadcast_ {k}", target, every[1])
    out, got_splits = hvd.alltoall(mine, splits=[2, 0] if r == 0 else [1, 1])
    same(f"alltoall {k}", out, torch.cat([every[0], every[1][:1]]) if r == 0 else every[1][1:])
    same(f"alltoall splits {k}", got_splits, torch.tensor([2, 1] if r == 0 else [0, 1], dtype=torch.int32))
    if dt not in (torch.bool, torch.uint8, torch.int8):
        block = sum(e.to(torch.float64) for e in every).to(dt)[r:r + 1]
        same(f"reducescatter {k}", hvd.reducescatter(mine, op=hvd.Sum), block)
        same(f"grouped_reducescatter {k}", hvd.grouped_reducescatter([mine], op=hvd.Sum)[0], block)

pair = [torch.ones(2) * (r + 1), torch.ones(1) * (r + 1)]
res = hvd.grouped_allreduce_(pair, op=hvd.Sum)
same("grouped_allreduce_", pair[1], torch.full((1,), 3.0))
report(grouped_inplace_returns_inputs=all(a is b for a, b in zip(res, pair)))

# -- lifecycle, topology, build queries, timeline
import json, os, tempfile
try:
    hvd.mpi_threads_supported()
    mpi_threads = "no error"
except ValueError as exc:
    mpi_threads = str(exc)
report(topology=[hvd.is_initialized(), hvd.size(), hvd.local_size(), hvd.local_rank() == r, hvd.cross_size(),
                 hvd.cross_rank(), hvd.is_homogeneous()],
       built=[hvd.gloo_built(), hvd.gloo_enabled(), hvd.mpi_enabled(), hvd.nccl_built(), hvd.cuda_built(),
              hvd.rocm_built(), hvd.ddl_built(), hvd.ccl_built(), isinstance(hvd.mpi_built(), bool)],
       mpi_threads=mpi_threads)
timeline = os.path.join(tempfile.gettempdir(), f"khorovod-torch-timeline-{os.getppid()}.json")
hvd.start_timeline(timeline)
hvd.allreduce(torch.ones(3), name="in.the.timeline")
hvd.stop_timeline()
if r == 0:
    with open(timeline) as f:
        report(timeline_has_op="allreduce.in.the.timeline" in f.read())
    os.remove(timeline)

# -- async forms and integer handles
x = torch.full((4,), float(r + 1))
h = hvd.allreduce_async(x, name="async.x")
same("async allreduce", hvd.synchronize(h), torch.full((4,), 1.5))
y = x.clone()
h = hvd.allreduce_async_(y, op=hvd.Sum, name="async.y")
while not hvd.poll(h):
    pass
same("async allreduce_ returns the tensor", hvd.synchronize(h), torch.full((4,), 3.0))
same("async allreduce_ memory", y, torch.full((4,), 3.0))
pair = [x.clone(), x[:2].clone()]
res = hvd.synchronize(hvd.grouped_allreduce_async_(pair, op=hvd.Min))
same("grouped async_", pair[1], torch.ones(2))
same("grouped async_ result", res[0], torch.ones(4))
same("grouped async", hvd.synchronize(hvd.grouped_allreduce_async([x], op=hvd.Product))[0], torch.full((4,), 2.0))
same("allgather async", hvd.synchronize(hvd.allgather_async(x[:1])), torch.tensor([1.0, 2.0]))
same("grouped allgather async", hvd.synchronize(hvd.grouped_allgather_async([x[:1]]))[0], torch.tensor([1.0, 2.0]))
same("broadcast async", hvd.synchronize(hvd.broadcast_async(x, 0)), torch.ones(4))
z = x.clone()
hvd.synchronize(hvd.broadcast_async_(z, 1))
same("broadcast async_", z, torch.full((4,), 2.0))
out, got_splits = hvd.synchronize(hvd.alltoall_async(torch.arange(2.0) + 10 * r))
same("alltoall async", out, torch.tensor([10.0 * 0 + r, 10.0 + r]))
same("reducescatter async", hvd.synchronize(hvd.reducescatter_async(torch.ones(3, 2) * (r + 1))),
     torch.full((2 if r == 0 else 1, 2), 1.5))
same("grouped reducescatter async", hvd.synchronize(hvd.grouped_reducescatter_async([torch.ones(2)], op=hvd.Sum))[0],
     torch.full((1,), 2.0))
same("prescale/postscale", hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
     torch.full((4,), 1.5))
same("fp16 compression", hvd.allreduce(x, compression=hvd.Compression.fp16), torch.full((4,), 1.5))
same("bf16 compression", hvd.reducescatter(torch.ones(2, 1) * (r + 1), compression=hvd.Compression.bf16),
     torch.full((1, 1), 1.5))
same("alltoall splits as a tensor", hvd.alltoall(torch.arange(3.0), splits=torch.tensor([1, 2], dtype=torch.int32))[1],
     torch.tensor([1, 1] if r == 0 else [2, 2], dtype=torch.int32))

# -- gradients (Horovod's rules)
def grad_of(fn, *shape, value=1.0):
    t = torch.full(shape, value, requires_grad=True)
    out = fn(t)
    outs = out if isinstance(out, (list, tuple)) else [out]
    torch.stack([o.sum() * (i + 1) for i, o in enumerate(outs) if o.is_floating_point()]).sum().backward()
    return t.grad

same("grad allreduce avg", grad_of(lambda t: hvd.allreduce(t * (r + 1)), 3), torch.full((3,), float(r + 1)))
same("grad allreduce sum scaled", grad_of(lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=3.0), 2),
     torch.full((2,), 6.0))
same("grad grouped allreduce", grad_of(lambda t: hvd.grouped_allreduce([t, t * 2], op=hvd.Sum), 2),
     torch.full((2,), 2.0 * (1 + 4)))
ag = grad_of(lambda t: hvd.allgather(t) * torch.arange(3.0).unsqueeze(1), r + 1, 2)
same("grad allgather", ag, torch.tensor([[0.0, 0.0]]) if r == 0 else torch.tensor([[1.0, 1.0], [2.0, 2.0]]))
same("grad grouped allgather", grad_of(lambda t: hvd.grouped_allgather([t, t]), 1), torch.full((1,), 3.0))
same("grad broadcast", grad_of(lambda t: hvd.broadcast(t, root_rank=1) * (r + 1), 2),
     torch.full((2,), 1.5 if r == 1 else 0.0))
a2a = grad_of(lambda t: hvd.alltoall(t * (r + 1), splits=[1, 2] if r == 0 else [2, 1])[0], 3)
same("grad alltoall", a2a, torch.full((3,), float(r + 1)))
same("grad reducescatter avg", grad_of(lambda t: hvd.reducescatter(t), 3, 1), torch.ones(3, 1))
same("grad reducescatter sum", grad_of(lambda t: hvd.reducescatter(t, op=hvd.Sum), 3), torch.full((3,), 2.0))
same("grad grouped reducescatter", grad_of(lambda t: hvd.grouped_reducescatter([t], op=hvd.Sum), 2),
     torch.full((2,), 2.0))

# -- sparse
sp = torch.sparse_coo_tensor(torch.tensor([[r, 2]]), torch.tensor([1.0, 1.0]), (4,))
same("sparse average", hvd.sparse_allreduce_async(sp, "sp", hvd.Average)().to_dense(), torch.tensor([0.5, 0.5, 1.0, 0.0]))
same("sparse sum", hvd.sparse_allreduce_async(sp, "sp2", hvd.Sum)().to_dense(), torch.tensor([1.0, 1.0, 2.0, 0.0]))

# -- objects
report(obj=hvd.broadcast_object({"from": r, "t": torch.ones(1) * r}, root_rank=1)["from"],
       objs=hvd.allgather_object(("rank", r)),
       from_root_only=hvd.broadcast_object([1, 2] if r == 0 else None, root_rank=0),
       mixed_types=hvd.allgather_object(r if r == 0 else "one"))

# -- process sets
solo = hvd.add_process_set([0])
if r == 0:
    same("process set allreduce", hvd.allreduce(torch.ones(2) * 7, process_set=solo), torch.full((2,), 7.0))
else:
    try:
        hvd.allreduce(torch.ones(2), process_set=solo)
        bad.append("non-member allreduce was accepted")
    except ValueError as exc:
        report(non_member=str(exc))
report(removed=hvd.remove_process_set(solo))

# -- errors: the same call on every rank
def error_of(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return [type(exc).__name__, str(exc)]
    return None

errors = {
    "shape": error_of(lambda: hvd.allreduce(torch.ones(r + 2), name="mismatch.shape")),
    "dtype": error_of(lambda: hvd.allreduce(torch.ones(2, dtype=torch.float32 if r else torch.float64),
                                            name="mismatch.dtype")),
    "root": error_of(lambda: hvd.broadcast(torch.ones(2), root_rank=5)),
    "splits": error_of(lambda: hvd.alltoall(torch.ones(4), splits=[1, 1, 2])),
    "rs_op": error_of(lambda: hvd.reducescatter(torch.ones(4), op=hvd.Max)),
    "noncontig": error_of(lambda: hvd.allgather(torch.ones(3, 2).t())),
    "dtype_unsupported": error_of(lambda: hvd.broadcast(torch.ones(2, dtype=torch.complex64), 0)),
    "average_and_op": error_of(lambda: hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)),
}
# A name still in flight cannot be reused. Each rank tries while its peer provably has not
# submitted yet (the peer waits in a broadcast), so the op cannot have completed.
mine, theirs = ("twice.a", "twice.b") if r == 0 else ("twice.b", "twice.a")
if r == 1:
    hvd.broadcast_object(None, root_rank=0, name="go1")
first = hvd.allreduce_async(torch.ones(2), name=mine)
errors["duplicate"] = error_of(lambda: hvd.allreduce_async(torch.ones(2), name=mine))
if r == 0:
    hvd.broadcast_object(None, root_rank=0, name="go1")
    hvd.broadcast_object(None, root_rank=1, name="go2")
else:
    hvd.broadcast_object(None, root_rank=1, name="go2")
second = hvd.allreduce_async(torch.ones(2), name=theirs)
hvd.synchronize(first)
hvd.synchronize(second)
same("still works after errors", hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), 2.0))
report(errors=errors)

# -- join: rank 1 runs out of data first
if r == 0:
    same("allreduce while rank 1 joined", hvd.allreduce(torch.full((2,), 4.0), name="late"), torch.full((2,), 2.0))
report(last_joined=hvd.join())
hvd.barrier()
report(bad=bad)
'''


@pytest.fixture(scope="module")
def result():
    return hvdrun(COLLECTIVES, np=2, timeout=120).check()


def test_values_async_and_gradients_on_every_rank(result):
    for rank in (0, 1):
        assert result.ranks[rank]["bad"] == [], result.ranks[rank]["bad"]


def test_objects_and_process_sets(result):
    for rank in (0, 1):
        assert result.ranks[rank]["obj"] == 1
        assert result.ranks[rank]["objs"] == [["rank", 0], ["rank", 1]]
        assert result.ranks[rank]["removed"] is True
        assert result.ranks[rank]["from_root_only"] == [1, 2]  # the others pass None: no name mismatch
        assert result.ranks[rank]["mixed_types"] == [0, "one"]
    assert "not a member" in result.ranks[1]["non_member"]


def test_lifecycle_topology_build_queries_and_timeline(result):
    for rank in (0, 1):
        got = result.ranks[rank]
        assert got["topology"] == [True, 2, 2, True, 1, 0, True]
        # NCCL and the CUDA runtime are there where the test environment installed them (the nccl extra).
        assert got["built"] == [True, True, False, basics.nccl_built(), basics.cuda_built(), False, False, False, True]
        assert "MPI" in got["mpi_threads"]
        assert got["grouped_inplace_returns_inputs"]
    assert result.ranks[0]["timeline_has_op"]


def test_join_returns_the_same_rank_everywhere(result):
    assert result.ranks[0]["last_joined"] == result.ranks[1]["last_joined"] == 0


@pytest.mark.parametrize("key, kind, words", [
    ("shape", "HorovodInternalError", "shape"),
    ("dtype", "HorovodInternalError", "float"),
    ("root", "ValueError", "root_rank"),
    ("splits", "ValueError", "splits"),
    ("rs_op", "ValueError", "Average or op=Sum"),
    ("noncontig", "ValueError", "contiguous"),
    ("dtype_unsupported", "ValueError", "complex64 is not supported"),
    ("average_and_op", "ValueError", "The op parameter supersedes average."),
    ("duplicate", "ValueError", "twice"),
])
def test_errors_on_every_rank(result, key, kind, words):
    for rank in (0, 1):
        got = result.ranks[rank]["errors"][key]
        assert got is not None, f"rank {rank}: {key} raised nothing"
        assert got[0] == kind and words in got[1], f"rank {rank}: {got}"
