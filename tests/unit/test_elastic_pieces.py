"""The elastic driver's pure pieces and the sampler's dealing, without processes."""

from __future__ import annotations

import random

import pytest

from horovod.runner.elastic import discovery, hosts, plan
from horovod.runner.hosts import HostInfo


def test_discovery_output_lines_with_and_without_slots():
    text = "a:2\n\nb\na:3\n"
    assert discovery.parse_discovery_output(text, 4, "s") == [HostInfo("a", 2), HostInfo("b", 4)]
    with pytest.raises(ValueError, match="names no slot count"):
        discovery.parse_discovery_output("b\n", None, "s")
    with pytest.raises(ValueError, match="line 1 'a b' is not"):
        discovery.parse_discovery_output("a b\n", 1, "s")


def test_a_failing_discovery_script_names_its_status(tmp_path):
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\necho nope >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(RuntimeError, match="exited with status 3: nope"):
        discovery.HostDiscoveryScript(str(script), None).find_available_hosts()


def test_host_order_keeps_old_hosts_first_and_reports_what_changed():
    manager = hosts.HostManager()
    assert manager.update([HostInfo("a", 2)], 0) == hosts.HostUpdate.added
    assert manager.update([HostInfo("b", 1), HostInfo("a", 2)], 0) == hosts.HostUpdate.added
    assert list(manager.usable(0)) == ["a", "b"]
    assert manager.update([HostInfo("b", 1), HostInfo("a", 1)], 0) == hosts.HostUpdate.removed
    assert manager.update([HostInfo("a", 2)], 0) == hosts.HostUpdate.mixed
    assert manager.update([HostInfo("a", 2)], 0) == hosts.HostUpdate.no_update


def test_blacklist_for_good_without_a_cooldown_range():
    manager = hosts.HostManager()
    manager.update([HostInfo("a", 1), HostInfo("b", 1)], 0)
    assert manager.blacklist("b", 0) is None
    assert list(manager.usable(10**6)) == ["a"]
    assert not manager.all_blacklisted(0)
    manager.blacklist("a", 0)
    assert manager.all_blacklisted(0)


def test_cooldown_grows_with_each_failure_and_stays_in_range():
    manager = hosts.HostManager((2, 20), random.Random(1))
    manager.update([HostInfo("a", 1)], 0)
    delays = [manager.blacklist("a", 0) for _ in range(6)]
    assert all(2 <= d <= 20 for d in delays)
    assert delays[0] < 4 <= delays[1] < 6 <= delays[2] and delays[-1] == 20
    assert manager.usable(19.9) == {} and manager.usable(20.1) == {"a": 1}


def test_plan_fills_hosts_in_order_caps_at_max_np_and_refuses_below_min_np():
    slots = plan.plan_round({"a": 2, "b": 2}, 2, 3)
    assert [(plan.worker_name(s), s.rank, s.local_rank, s.cross_rank) for s in slots] == [
        ("a:0", 0, 0, 0), ("a:1", 1, 1, 0), ("b:0", 2, 0, 1)]
    assert plan.plan_round({"a": 1}, 2, None) is None
    assignment = plan.as_assignment(slots)
    assert assignment["b:0"].rank == 2 and assignment["b:0"].hostname == "b" and assignment["b:0"].size == 3


def test_sampler_deals_the_rest_of_an_epoch_to_a_new_membership_exactly_once(monkeypatch):
    pytest.importorskip("torch", reason="the sampler is PyTorch's")
    from horovod.torch.elastic import sampler as sampler_module

    dataset = list(range(30))
    seen: list[int] = []

    def shares(size: int) -> list[list[int]]:
        out = []
        for rank in range(size):
            monkeypatch.setattr(sampler_module.basics, "is_initialized", lambda: True)
            monkeypatch.setattr(sampler_module.basics, "size", lambda: size)
            monkeypatch.setattr(sampler_module.basics, "rank", lambda r=rank: r)
            s = sampler_module.ElasticSampler(dataset, seed=5)
            s.load_state_dict(state)
            out.append(list(s))
        return out

    state = {"epoch": 2, "processed_num": 0}
    first = shares(3)
    for step in range(2):  # two steps of batch 2 on 3 ranks
        for part in first:
            seen += part[2 * step:2 * step + 2]
    state["processed_num"] = 12
    second = shares(2)  # the rest on 2 ranks, equal shares
    assert len(second[0]) == len(second[1]) == 9
    seen += second[0] + second[1]
    assert sorted(seen) == dataset


def test_plan_order_follows_the_hosts_given():
    slots = plan.plan_round({"b": 1, "a": 1}, 1, None)
    assert [plan.worker_name(s) for s in slots] == ["b:0", "a:0"]
