"""Slot assignment and host parsing: pure functions, checked without starting any process."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from horovod.runner.hosts import (
    HostInfo,
    SlotInfo,
    get_host_assignments,
    hosts_string,
    parse_hostfile,
    parse_hostfile_text,
    parse_hosts,
)

pytestmark = pytest.mark.timeout(30)


def test_parse_hosts_keeps_order_and_slots():
    assert parse_hosts("h1:2,node-2.example.com:4, 10.0.0.7:1") == [
        HostInfo("h1", 2), HostInfo("node-2.example.com", 4), HostInfo("10.0.0.7", 1)]


@pytest.mark.parametrize("bad", ["h1", "h1:", "h1:x", "h 1:2", ":2", "h1:2,,h2:2", "h1:-1", "h1:2:3"])
def test_parse_hosts_rejects_malformed_entries(bad):
    with pytest.raises(ValueError, match="invalid host entry"):
        parse_hosts(bad)


def test_parse_hosts_rejects_a_host_listed_twice():
    with pytest.raises(ValueError, match="listed more than once"):
        parse_hosts("h1:1,h2:1,h1:1")


def test_hostfile_with_comments_blank_lines_and_bare_hosts(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\n\nnode1 slots=4\n  node2   slots = 2  # fast one\nnode3\n")
    assert parse_hostfile(str(path)) == [HostInfo("node1", 4), HostInfo("node2", 2), HostInfo("node3", 1)]
    assert hosts_string(parse_hostfile(str(path))) == "node1:4,node2:2,node3:1"


@pytest.mark.parametrize("text", ["node1 slots=x\n", "node1 cpus=2\n", "node1 slots=2 extra\n"])
def test_hostfile_errors_name_the_line(text):
    with pytest.raises(ValueError, match=r"myfile:2: cannot parse"):
        parse_hostfile_text("ok slots=1\n" + text, source="myfile")


def test_empty_hostfile_is_an_error():
    with pytest.raises(ValueError, match="lists no hosts"):
        parse_hostfile_text("# nothing\n\n")


def test_single_host():
    slots = get_host_assignments([HostInfo("localhost", 4)], 3)
    assert slots == [SlotInfo("localhost", r, r, 0, 3, 3, 1) for r in range(3)]


def test_two_hosts_cross_ranks():
    slots = get_host_assignments(parse_hosts("a:2,b:2"), 4)
    assert [(s.hostname, s.rank, s.local_rank, s.cross_rank, s.local_size, s.cross_size) for s in slots] == [
        ("a", 0, 0, 0, 2, 2), ("a", 1, 1, 0, 2, 2), ("b", 2, 0, 1, 2, 2), ("b", 3, 1, 1, 2, 2)]


def test_uneven_hosts_fill_in_order():
    # a has 3 slots, b 1, c 2; five ranks use all of a and b and one slot of c.
    slots = get_host_assignments(parse_hosts("a:3,b:1,c:2"), 5)
    got = [(s.hostname, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for s in slots]
    assert got == [
        ("a", 0, 3, 0, 3), ("a", 1, 3, 0, 1), ("a", 2, 3, 0, 1),
        ("b", 0, 1, 1, 3),
        ("c", 0, 1, 2, 3),
    ]


def test_hosts_without_needed_slots_are_left_out():
    slots = get_host_assignments(parse_hosts("a:2,b:2"), 2)
    assert {s.hostname for s in slots} == {"a"}
    assert all(s.cross_size == 1 for s in slots)


def test_too_few_slots_message():
    with pytest.raises(ValueError) as info:
        get_host_assignments(parse_hosts("a:2,b:1"), 5)
    assert str(info.value) == "Requested more processes (5) than there are available slots (3)"


def test_zero_processes_is_an_error():
    with pytest.raises(ValueError, match="at least 1"):
        get_host_assignments(parse_hosts("a:2"), 0)


def test_response_string():
    slot = SlotInfo(hostname="a", rank=5, local_rank=1, cross_rank=2, size=8, local_size=2, cross_size=4)
    assert slot.to_response_string() == "5,8,1,2,2,4"


@given(st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=6), st.data())
def test_assignment_invariants(slot_counts, data):
    hosts = [HostInfo(f"h{i}", n) for i, n in enumerate(slot_counts)]
    total = sum(slot_counts)
    if total == 0:
        with pytest.raises(ValueError):
            get_host_assignments(hosts, 1)
        return
    num_proc = data.draw(st.integers(min_value=1, max_value=total))
    slots = get_host_assignments(hosts, num_proc)
    assert [s.rank for s in slots] == list(range(num_proc))
    assert all(s.size == num_proc for s in slots)
    # Each host's ranks are contiguous and numbered 0..local_size-1.
    for host in {s.hostname for s in slots}:
        mine = [s for s in slots if s.hostname == host]
        assert [s.local_rank for s in mine] == list(range(len(mine)))
        assert all(s.local_size == len(mine) for s in mine)
        assert [s.rank for s in mine] == list(range(mine[0].rank, mine[0].rank + len(mine)))
    # Ranks sharing a local rank form a cross group numbered in host order.
    for local_rank in {s.local_rank for s in slots}:
        group = [s for s in slots if s.local_rank == local_rank]
        assert [s.cross_rank for s in group] == list(range(len(group)))
        assert all(s.cross_size == len(group) for s in group)
    # Earlier hosts are filled completely before a later host gets a rank.
    used = [h for h in hosts if any(s.hostname == h.hostname for s in slots)]
    for host in used[:-1]:
        assert sum(s.hostname == host.hostname for s in slots) == host.slots


def test_slurm_allocations_become_hosts():
    from horovod.runner.hosts import expand_nodelist, expand_tasks_per_node, slurm_allocation

    assert expand_nodelist("node[01-03,7],login,a[9-10]") == ["node01", "node02", "node03", "node7", "login",
                                                             "a9", "a10"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "4(x2)"}
    assert slurm_allocation(env) == [HostInfo("n1", 4), HostInfo("n2", 4)]
    assert slurm_allocation({"SLURM_JOB_NODELIST": "n1"}) is None  # not inside a job
    with pytest.raises(ValueError, match="lists 2 nodes"):
        slurm_allocation({**env, "SLURM_TASKS_PER_NODE": "4"})
    with pytest.raises(ValueError, match="not Slurm's format"):
        expand_tasks_per_node("many")
