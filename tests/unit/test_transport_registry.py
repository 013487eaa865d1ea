"""Transports by name: aliases, `auto`, a single rank, and the message for a name that does not exist."""

from __future__ import annotations

import os

import pytest

from horovod.common.settings import Settings, Topology
from horovod.common.transport import TransportContext, create, default_name
from horovod.common.transport.tcp import TcpTransport


def context(topology: Topology = Topology()) -> TransportContext:
    return TransportContext(topology, Settings(topology=topology), None, round=1)


@pytest.mark.parametrize("name", ["", "gloo", "auto", "tcp"])
def test_a_single_rank_gets_a_working_tcp_transport(name: str) -> None:
    transport = create(name, context())
    try:
        assert isinstance(transport, TcpTransport) and (transport.rank, transport.size) == (0, 1)
        assert transport.activity.fds(driver=True) == {}
        assert transport.exchange([0], b"x") == [b"x"]
    finally:
        transport.close()


def test_auto_picks_by_topology() -> None:
    """One rank: tcp. Several on one host: shm; on several hosts: hierarchical; both only where
    shared memory works here (the probe's own answer decides which of the two this host expects)."""
    from horovod.common.transport.shm import shared_memory_usable

    usable = shared_memory_usable()
    assert usable or os.environ.get("CI") != "true", "CI's machines have a usable /dev/shm"
    assert default_name(Topology(size=1)) == "tcp"
    assert default_name(Topology(size=4, local_size=4)) == ("shm" if usable else "tcp")
    assert default_name(Topology(size=4, local_size=2)) == ("hierarchical" if usable else "tcp")


def test_an_unknown_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match=r"HOROVOD_CPU_OPERATIONS='nccl' is not an available transport; "
                                         r"choose one of: auto, hierarchical, mpi, shm, tcp"):
        create("nccl", context())


def test_without_a_store_auto_means_mpi() -> None:
    """A job mpirun started has no store of ours: MPI is the only way its ranks can meet."""
    pytest.importorskip("mpi4py", reason="the MPI transport needs mpi4py")
    ctx = TransportContext(Topology(rank=0, size=2), Settings(), None, round=1)
    with pytest.raises(ValueError, match="needs a job that MPI started"):
        create("auto", ctx)  # this test process is not under mpirun


def test_the_context_derives_rank_size_and_store_host() -> None:
    ctx = TransportContext(Topology(rank=2, size=3), Settings(rendezvous_addr="10.0.0.5"), None, round=7)
    assert (ctx.rank, ctx.size, ctx.store_host, ctx.round) == (2, 3, "10.0.0.5", 7)
    assert context().store_host == "127.0.0.1"
