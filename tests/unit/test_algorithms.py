"""The collective algorithms, run by n threads over real sockets (socketpairs and the tcp peer
connection with its sender thread): exact results for uneven sizes, for n = 1..4, on every path
(direct exchange below the ring threshold, the ring, chunked reduction above RING_CHUNK_BYTES)."""

from __future__ import annotations

import socket
import threading
from typing import Callable

import numpy as np
import pytest

from horovod.common.algorithms import Scratch, adasum, pairwise, ring, segment_bounds
from horovod.common.partition import even_counts
from horovod.common.reduce_ops import SUPPORTED_DTYPES, Max, Min, Product, Sum
from horovod.common.transport.tcp.peer import PeerConnection, PeerLinks
import adasum_reference


def run_ranks(n: int, body: Callable[[PeerLinks, Scratch], object]) -> list[object]:
    """Run `body` on n threads, each with its own PeerLinks (a full mesh); their results in rank order."""
    connections: list[dict[int, PeerConnection]] = [{} for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            sa, sb = socket.socketpair()
            connections[a][b] = PeerConnection(b, sa, timeout=20.0)
            connections[b][a] = PeerConnection(a, sb, timeout=20.0)
    results: list[object] = [None] * n
    errors: list[BaseException] = []

    def worker(rank: int) -> None:
        try:
            results[rank] = body(PeerLinks(rank, connections[rank]), Scratch())
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for peers in connections:
        for conn in peers.values():
            conn.close()
    assert not any(t.is_alive() for t in threads), "an algorithm hung"
    if errors:
        raise errors[0]
    return results


def data(rank: int, size: int, dtype: str = "int64") -> np.ndarray:
    """Distinct small integers per rank, so sums and products are exact in any dtype."""
    return ((np.arange(size) * 7 + rank * 13) % 5 + 1).astype(dtype)


# Sizes (in elements): fewer than the members, direct exchange, the ring, a ring chunked for reduction.
SIZES = [1, 2, 3, 1001, 40_003, 300_007]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("size", SIZES)
def test_allreduce_sums_exactly_on_every_path(n: int, size: int) -> None:
    group = list(range(n))

    def body(link: PeerLinks, scratch: Scratch) -> np.ndarray:
        buf = data(link.rank, size, "float64")
        ring.allreduce(link, group, buf, Sum, scratch)
        return buf

    expected = sum(data(r, size, "float64") for r in range(n))
    for result in run_ranks(n, body):
        np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("op, combine", [(Min, np.minimum), (Max, np.maximum), (Product, np.multiply)])
def test_allreduce_other_ops(op: int, combine: Callable) -> None:
    group = [0, 1, 2]
    for size in (5, 70_001):  # direct and ring

        def body(link: PeerLinks, scratch: Scratch) -> np.ndarray:
            buf = data(link.rank, size, "int32")
            ring.allreduce(link, group, buf, op, scratch)
            return buf

        expected = data(0, size, "int32")
        for r in group[1:]:
            expected = combine(expected, data(r, size, "int32"))
        for result in run_ranks(3, body):
            np.testing.assert_array_equal(result, expected)


def test_allreduce_of_floats_is_bit_identical_on_every_rank() -> None:
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(90_001).astype(np.float32) for _ in range(4)]
    for size in (1000, 90_001):

        def body(link: PeerLinks, scratch: Scratch) -> np.ndarray:
            buf = inputs[link.rank][:size].copy()
            ring.allreduce(link, [0, 1, 2, 3], buf, Sum, scratch)
            return buf

        results = run_ranks(4, body)
        for result in results[1:]:
            assert result.tobytes() == results[0].tobytes()
        np.testing.assert_allclose(results[0], sum(x[:size].astype(np.float64) for x in inputs), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("total", [0, 1, 7, 1001, 300_007])
def test_reducescatter_hands_member_i_block_i(n: int, total: int) -> None:
    group = list(range(n))
    uneven = [total] + [0] * (n - 1) if total % 2 else even_counts(total, n)

    for counts in (even_counts(total, n), uneven):

        def body(link: PeerLinks, scratch: Scratch) -> np.ndarray:
            pos = group.index(link.rank)
            recv = np.zeros(counts[pos], np.int64)
            ring.reducescatter(link, group, data(link.rank, total), recv, counts, Sum, scratch)
            return recv

        full = sum(data(r, total) for r in range(n))
        start = 0
        for pos, result in enumerate(run_ranks(n, body)):
            np.testing.assert_array_equal(result, full[start:start + counts[pos]])
            start += counts[pos]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_allgatherv_concatenates_uneven_blocks(n: int) -> None:
    counts = [(3 * r + 1) % 4 * 50_001 for r in range(n)]  # includes empty blocks and large ones

    def body(link: PeerLinks, scratch: Scratch) -> np.ndarray:
        recv = np.zeros(sum(counts), np.int64)
        pairwise.allgatherv(link, list(range(n)), data(link.rank, counts[link.rank]), recv, counts)
        return recv

    expected = np.concatenate([data(r, counts[r]) for r in range(n)])
    for result in run_ranks(n, body):
        np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_alltoallv_delivers_block_j_of_member_i_to_member_j(n: int) -> None:
    def count(i: int, j: int) -> int:  # what member i sends member j
        return (i * 5 + j * 3) % 4 * 30_001

    def block(i: int, j: int) -> np.ndarray:
        return np.full(count(i, j), i * 10 + j, np.int64)

    def body(link: PeerLinks, scratch: Scratch) -> np.ndarray:
        i = link.rank
        send = np.concatenate([block(i, j) for j in range(n)])
        recv = np.zeros(sum(count(k, i) for k in range(n)), np.int64)
        pairwise.alltoallv(link, list(range(n)), send, [count(i, j) for j in range(n)], recv,
                           [count(k, i) for k in range(n)])
        return recv

    for j, result in enumerate(run_ranks(n, body)):
        np.testing.assert_array_equal(result, np.concatenate([block(k, j) for k in range(n)]))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("size", [0, 3, 300_007])
def test_broadcast_copies_the_roots_buffer_everywhere(n: int, size: int) -> None:
    root = n - 1

    def body(link: PeerLinks, scratch: Scratch) -> np.ndarray:
        buf = data(link.rank, size)
        pairwise.broadcast(link, list(range(n)), buf, root)
        return buf

    for result in run_ranks(n, body):
        np.testing.assert_array_equal(result, data(root, size))


def test_subgroups_use_global_ranks() -> None:
    """A process set's members are global ranks: rank 1 stays out of a collective of [0, 2, 3]."""
    group = [0, 2, 3]

    def body(link: PeerLinks, scratch: Scratch) -> np.ndarray | None:
        if link.rank not in group:
            return None
        buf = data(link.rank, 100_003)
        ring.allreduce(link, group, buf, Sum, scratch)
        return buf

    expected = sum(data(r, 100_003) for r in group)
    for rank, result in enumerate(run_ranks(4, body)):
        if rank in group:
            np.testing.assert_array_equal(result, expected)


ADASUM_TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-14}


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("sizes", [[1], [3, 1], [1000], [7, 0, 40_001, 5], [300_007]])
def test_adasum_matches_the_formula(n: int, dtype: str, sizes: list[int]) -> None:
    """Recursive halving gives the pairwise tree of the formula, per tensor, with identical bits
    on every member (fewer elements than members, empty tensors and odd splits included)."""
    np_dtype = SUPPORTED_DTYPES[dtype]
    bounds = segment_bounds(sum(sizes), sizes)
    rng = np.random.default_rng(n * 100 + len(sizes))
    # Correlated gradients: a shared direction plus noise, so the coefficients are far from 1.
    shared = rng.standard_normal(sum(sizes))
    inputs = [(shared + 0.5 * rng.standard_normal(sum(sizes))).astype(np_dtype) for _ in range(n)]

    def body(link: PeerLinks, scratch: Scratch) -> np.ndarray:
        buf = inputs[link.rank].copy()
        adasum.allreduce(link, list(range(n)), buf, bounds, scratch)
        return buf

    results = run_ranks(n, body)
    for result in results[1:]:
        assert result.tobytes() == results[0].tobytes()
    expected = adasum_reference.adasum(inputs, bounds)
    tol = ADASUM_TOLERANCE[dtype]
    np.testing.assert_allclose(results[0].astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)


def test_adasum_of_parallel_gradients_averages_and_of_orthogonal_ones_adds() -> None:
    a, b = np.array([2.0, 0.0]), np.array([0.0, 3.0])
    for pair, expected in (([a, a], a), ([a, b], a + b)):

        def body(link: PeerLinks, scratch: Scratch) -> np.ndarray:
            buf = pair[link.rank].copy()
            adasum.allreduce(link, [0, 1], buf, [(0, 2)], scratch)
            return buf

        for result in run_ranks(2, body):
            np.testing.assert_array_equal(result, expected)


def test_adasum_rejects_a_group_that_is_not_a_power_of_two() -> None:
    def body(link: PeerLinks, scratch: Scratch) -> None:
        adasum.allreduce(link, [0, 1, 2], np.ones(4), [(0, 4)], scratch)

    with pytest.raises(ValueError, match="power-of-two"):
        run_ranks(3, body)
