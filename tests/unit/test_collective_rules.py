"""The framework-neutral gradient rules, applied to numpy arrays by a fake two-member set."""

import numpy as np

from horovod.common import collective_rules as rules
from horovod.common.reduce_ops import Average, Sum


class TwoMembers:
    """GradientCollectives over numpy arrays, as member `me` of a set whose other member holds
    `other(x)` wherever this one holds x; records the collectives a rule asks for."""

    def __init__(self, me, other=lambda x: x * 3, other_rows=None):
        self.me, self.other, self.other_rows, self.calls = me, other, other_rows, []

    def _both(self, x):
        return (x, self.other(x)) if self.me == 0 else (self.other(x), x)

    def allreduce(self, tensors, op, prescale, postscale):
        self.calls.append(("allreduce", op))
        return [sum(self._both(t * prescale)) * postscale / (2 if op == Average else 1) for t in tensors]

    def allgather(self, tensors):
        self.calls.append(("allgather",))
        return [np.concatenate(self._both(t)) for t in tensors]

    def alltoall(self, tensor, splits):
        self.calls.append(("alltoall", list(splits)))
        return tensor

    def average_and_gather_rows(self, tensors, inputs):
        self.calls.append(("average_and_gather_rows",))
        mine = [len(x) for x in inputs]
        rows = [mine, self.other_rows] if self.me == 0 else [self.other_rows, mine]
        return self.allreduce(tensors, Average, 1.0, 1.0), np.array(rows)

    def rows_before(self, rows, member):
        return rows[:member].sum(axis=0)

    def narrow(self, tensor, starts, k, like):
        return tensor[starts[k]:starts[k] + len(like)]

    def scale(self, tensor, factor):
        return tensor * factor

    def zeros_like(self, tensor):
        return np.zeros_like(tensor)


def test_allgather_gradient_is_the_average_cut_to_own_rows():
    grad = np.arange(5.0)  # member 0 gave 2 rows, member 1 gave 3
    for me, want in ((0, grad[:2] * 2), (1, grad[2:] * 2)):
        inputs = [np.zeros(2)] if me == 0 else [np.zeros(3)]
        fake = TwoMembers(me, other_rows=[3] if me == 0 else [2])
        (got,) = rules.allgather_gradient(fake, [grad], inputs, me)
        assert np.array_equal(got, want)


def test_broadcast_gradient_goes_to_the_root_only():
    grad = np.ones(2)
    assert np.array_equal(rules.broadcast_gradient(TwoMembers(0), grad, 0, 0), np.full(2, 2.0))
    assert np.array_equal(rules.broadcast_gradient(TwoMembers(1), grad, 0, 1), np.zeros(2))


def test_reducescatter_gradient_gathers_and_counts_sum_set_size_times():
    fake = TwoMembers(0, other=lambda x: x + 10)
    (average,) = rules.reducescatter_gradient(fake, [np.ones(1)], Average, 1.0, 1.0, 2)
    assert np.array_equal(average, [1.0, 11.0])
    (total,) = rules.reducescatter_gradient(fake, [np.ones(1)], Sum, 0.5, 3.0, 2)
    assert np.array_equal(total, [3.0, 33.0])


def test_alltoall_gradient_sends_back_with_the_received_splits():
    fake = TwoMembers(0)
    rules.alltoall_gradient(fake, np.ones(3), np.array([2, 1]))
    assert fake.calls == [("alltoall", [2, 1])]


def test_allreduce_gradient_is_the_same_allreduce():
    fake = TwoMembers(0)
    (got,) = rules.allreduce_gradient(fake, [np.ones(2)], Sum, 2.0, 0.5)
    assert fake.calls == [("allreduce", Sum)] and np.array_equal(got, np.full(2, 4.0))


def test_sparse_values_factor():
    assert rules.sparse_values_factor(Average, 2.0, 4) == 0.5
    assert rules.sparse_values_factor(Sum, 2.0, 4) == 2.0
    assert set(rules.SPARSE_OPS) == {Average, Sum}
