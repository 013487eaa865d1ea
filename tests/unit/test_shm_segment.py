"""The shared-memory segment in one process: its layout, its life cycle, stale-segment removal,
and how transports are chosen and built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from horovod.common.settings import Settings, Topology
from horovod.common.transport import TransportContext, create, default_name
from horovod.common.transport.shm import segment
from horovod.common.transport.shm.segment import (CHANNEL_BYTES, DEPTH, MIN_SLOT_BYTES, PAGE, PIECE_BYTES,
                                                  HostSegments, Layout, Unavailable, round_up)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets, posix_fallocate")


class LoneMesh:
    """The TCP mesh of a host with one rank: every exchange returns just our own payload."""

    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        assert list(group) == [0]
        return [payload]


@pytest.mark.parametrize("local_size", [1, 2, 3, 8])
def test_layout_puts_every_region_after_the_previous_one(local_size: int) -> None:
    fusion = round_up(5 << 20)
    layout = Layout(local_size, fusion)
    assert layout.counters == layout.header_bytes
    assert layout.slot_desc >= layout.counters + 8 * 5 * local_size  # five counter kinds per peer
    assert layout.channels % PAGE == 0 and layout.channels >= layout.slot_desc + 8 * DEPTH
    assert layout.slots == layout.channels + 2 * CHANNEL_BYTES * local_size  # two mailboxes per peer
    assert layout.slot_bytes == max(MIN_SLOT_BYTES, PIECE_BYTES * local_size)
    assert layout.fusion == layout.fixed == layout.slots + DEPTH * layout.slot_bytes
    assert layout.total == layout.fixed + fusion and layout.fusion_bytes == fusion


def test_round_up_to_pages_and_to_any_unit() -> None:
    assert round_up(0) == 0 and round_up(1) == PAGE and round_up(PAGE) == PAGE
    assert round_up(5, 4) == 8 and round_up(8, 4) == 8


def test_stale_segments_of_dead_creators_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segment, "SHM_DIR", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {"stale": f"khvd-{dead.pid}-abc", "alive": f"khvd-{os.getpid()}-abc", "not-ours": f"other-{dead.pid}-abc",
             "odd": "khvd-notapid-abc"}
    for name in names.values():
        (tmp_path / name).write_bytes(b"")
    segment.remove_stale_segments()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[k] for k in ("alive", "not-ours", "odd"))


@linux_only
def test_a_segment_is_unlinked_once_mapped_and_lends_its_fusion_region(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segment, "SHM_DIR", str(tmp_path))
    host = HostSegments(LoneMesh(), [0], 0, fusion_bytes=3 << 20)
    try:
        assert list(tmp_path.iterdir()) == []  # every member has mapped it: the name is gone
        assert host.me == 0 and host.group([0]) == ([0], 0) and host.mine is host.mapped[0]
        assert host.fusion_buffer((3 << 20) + 1) is None  # larger than the region
        packed = host.fusion_buffer(1000)
        assert packed is not None and packed.nbytes == 1000
        packed[:] = 7
        assert (host.mine.fusion[:1000] == 7).all()  # the buffer is the segment itself
        floats = packed[64:].view(np.float32)
        assert host.descriptor(floats) == 1 + 64
        assert host.descriptor(np.zeros(10, np.float32)) == 0  # private memory: read through the slots
    finally:
        host.close()
        host.close()  # twice is fine


def test_a_segment_that_cannot_be_created_makes_shared_memory_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segment, "SHM_DIR", "/nonexistent-khorovod-test")
    with pytest.raises(Unavailable, match="rank 0: could not create"):
        HostSegments(LoneMesh(), [0], 0, fusion_bytes=0)


def test_transports_are_chosen_by_name_from_a_context() -> None:
    topology = Topology(rank=0, size=1)
    context = TransportContext(topology, Settings(topology=topology), None, 1)
    assert (context.rank, context.size, context.store_host) == (0, 1, "127.0.0.1")
    assert default_name(None) == "tcp"
    with pytest.raises(ValueError, match="choose one of: auto, hierarchical, mpi, shm, tcp"):
        create("nccl-ish", context)
    single = create("gloo", context)  # auto: one rank talks to nobody, over TCP
    try:
        assert single.name == "tcp" and single.exchange([0], b"x") == [b"x"]
    finally:
        single.close()


def test_a_lone_rank_asked_for_shared_memory_needs_none() -> None:
    topology = Topology(rank=0, size=1)
    for name in ("shm", "hierarchical"):
        transport = create(name, TransportContext(topology, Settings(topology=topology), None, 1))
        try:
            assert transport.name == name and transport.shm is None  # type: ignore[attr-defined]
            activity = transport.activity
            assert not activity.pending() and activity.fds(True) == {}
            assert not activity.spin_useful
            activity.set_caller_driving(True)
            activity.set_caller_driving(False)
            assert activity.waiting_after_release() is False  # no peer can have posted anything
        finally:
            transport.close()
