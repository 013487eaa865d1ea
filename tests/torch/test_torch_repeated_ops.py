"""A loop that reduces the same named tensor every step reuses what its first op built: the numpy
view of the tensor (torch bridge) and the op's Request (core). Whatever a script changes under the
same name between two calls must still be seen: new values, new storage behind the same tensor
object, a new dtype or shape, another op or scale, a layout that is no longer contiguous.
Real ranks through horovodrun, in Horovod's idiom (`hvd.allreduce_(t, name=...)` in a loop); every
answer is exact and the same on every rank."""

from multirank import hvdrun

REPEATED = r'''
import torch
import horovod.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
problems = []


def check(label, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        problems.append(f"{label}: got {got.dtype} {tuple(got.shape)} {got.flatten().tolist()}, "
                        f"want {want.dtype} {tuple(want.shape)} {want.flatten().tolist()}")


ranks_sum = sum(range(n))
t = torch.zeros(4)
for step in range(5):  # the same tensor, new values each step
    t.fill_(step + r)
    hvd.allreduce_(t, name="metric", op=hvd.Sum)
    check(f"step {step}", t, torch.full((4,), float(step * n + ranks_sum)))

# New storage behind the same tensor object: same shape and dtype, another memory.
t.set_(torch.full((4,), 10.0 + r))
hvd.allreduce_(t, name="metric", op=hvd.Sum)
check("set_", t, torch.full((4,), 10.0 * n + ranks_sum))

# Another shape in the same tensor object.
t.set_(torch.full((64,), 1.0 + r))
hvd.allreduce_(t, name="metric", op=hvd.Sum)
check("set_ to another shape", t, torch.full((64,), float(n + ranks_sum)))

# Windows of one memory in one tensor object (the same data pointer), widened, then narrowed.
window, storage = torch.empty(0), torch.zeros(64).untyped_storage()
for size in (8, 64, 8):
    window.set_(storage, 0, (size,))
    window.fill_(3.0 + r)
    hvd.allreduce_(window, name="window", op=hvd.Sum)
    check(f"a window of {size}", window, torch.full((size,), 3.0 * n + ranks_sum))

# Another dtype and shape under the same name, through `.data`.
t.data = torch.full((2, 3), 2 + r, dtype=torch.int64)
hvd.allreduce_(t, name="metric", op=hvd.Sum)
check("data", t, torch.full((2, 3), 2 * n + ranks_sum, dtype=torch.int64))

# The same bytes seen as another dtype (same memory, same shape).
u = torch.ones(4, dtype=torch.int32) * (r + 1)
hvd.allreduce_(u, name="bits", op=hvd.Sum)
u.data = u.view(torch.float32)
u.fill_(0.5)
hvd.allreduce_(u, name="bits", op=hvd.Sum)
check("view as float32", u, torch.full((4,), 0.5 * n))

# Another op, then scales, then Average, under one name.
v = torch.tensor([1.0, 2.0, 3.0]) * (r + 1)
expected = {
    "Sum": torch.tensor([1.0, 2.0, 3.0]) * sum(q + 1 for q in range(n)),
    "Max": torch.tensor([1.0, 2.0, 3.0]) * n,
}
for label, op in (("Sum", hvd.Sum), ("Max", hvd.Max), ("Sum", hvd.Sum)):
    w = v.clone()
    hvd.allreduce_(w, name="changing", op=op)
    check(f"op {label}", w, expected[label])
w = v.clone()
hvd.allreduce_(w, name="changing", op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
check("scales", w, expected["Sum"] * 0.5)
w = v.clone()
hvd.allreduce_(w, name="changing", op=hvd.Average)
check("Average", w, expected["Sum"] / n)

# Made non-contiguous in place: refused on the rank, as any non-contiguous tensor is.
m = torch.arange(6.0).reshape(2, 3)
hvd.allreduce_(m, name="matrix", op=hvd.Sum)
m.as_strided_((3, 2), (1, 3))
try:
    hvd.allreduce_(m, name="matrix", op=hvd.Sum)
    problems.append("a tensor made non-contiguous in place was reduced")
except ValueError as exc:
    if "not contiguous" not in str(exc):
        problems.append(f"non-contiguous: unexpected error {exc}")

# The job still works afterwards, and every rank ended with the same answers.
check("after", hvd.allreduce(torch.ones(2), name="after", op=hvd.Sum), torch.full((2,), float(n)))
report(problems=problems, last=t.tolist())
'''


def test_a_named_op_that_repeats_sees_every_change_to_its_tensor_and_arguments():
    result = hvdrun(REPEATED, np=2).check()
    for rank in (0, 1):
        assert result.ranks[rank]["problems"] == [], (rank, result.ranks[rank]["problems"])
    assert result.ranks[0]["last"] == result.ranks[1]["last"]
