"""Which network each host uses: `--network-interfaces` / HOROVOD_GLOO_IFACE, or chosen per host.

Hosts are network namespaces (`netns.EmulatedHosts`) whose interfaces have different names
(`ens3`, `enp0s8`); host b also has a network of its own (`mgmt0`) that reaches no other host.
The preflight `python -m horovod.runner.network_check` is the job's program: each rank prints
what it offers its peers, then the ranks meet over TCP and allreduce.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from horovod.common import netif
from multirank import child_env
from netns import EmulatedHosts


def test_a_peer_is_dialled_on_a_shared_network_first():
    local = [netif.Interface("lo", "127.0.0.1", "255.0.0.0"), netif.Interface("ens3", "10.1.0.2", "255.255.255.0")]
    assert netif.dial_order(["10.9.0.3", "10.1.0.3", "10.8.0.3"], local) == ["10.1.0.3", "10.9.0.3", "10.8.0.3"]


def test_an_interface_this_host_lacks_is_named_with_those_it_has():
    with pytest.raises(ValueError, match=r"HOROVOD_GLOO_IFACE='nosuch0'.*has none of these interfaces; it has lo 127"):
        netif.offered_addresses("10.1.0.1", "nosuch0")
    assert netif.offered_addresses("127.0.0.1", None) == ["127.0.0.1"]
    assert netif.offered_addresses("10.1.0.1", "nosuch0,lo") == ["127.0.0.1"]


@pytest.fixture
def hosts(tmp_path):
    with EmulatedHosts({"a": "ens3", "b": "enp0s8"}, tmp_path) as made:
        made.mgmt = made.add_network("b", "mgmt0", 0)
        yield made


def _check(hosts: EmulatedHosts, order: str, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env["PATH"] = f"{hosts.ssh_bin}:{env['PATH']}"
    slots = ",".join(f"{hosts.host(name).address}:1" for name in order)
    return subprocess.run([sys.executable, "-m", "horovod.runner.launch", "-np", str(len(order)), "-H", slots,
                           *flags, sys.executable, "-m", "horovod.runner.network_check"],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=hosts.tmp)


def _offers(stdout: str) -> dict[int, list[str]]:
    found = re.findall(r"^\[(\d+)\]<stdout>:host \S+ \(rank \d+\): interfaces .*; offers (.*) to its peers", stdout, re.M)
    return {int(rank): offered.split(", ") for rank, offered in found}


@pytest.mark.timeout(180)
def test_hosts_with_different_interface_names_pick_their_own(hosts):
    a, b = hosts.host("a"), hosts.host("b")
    result = _check(hosts, "ab")
    assert result.returncode == 0, result.stdout + result.stderr
    offers = _offers(result.stdout)
    # Nothing given: each host offers its address towards the launcher first, then the others.
    assert offers[0] == [a.address] and offers[1] == [b.address, hosts.mgmt], result.stdout
    assert "enp0s8" in result.stdout and "mgmt0" in result.stdout
    assert len(re.findall(r"reached all 2 ranks \(allreduce of ones = 2\)", result.stdout)) == 2

    # Both names listed: each host uses the one it has, and only that one.
    named = _check(hosts, "ab", "--network-interfaces", "ens3,enp0s8")
    assert named.returncode == 0, named.stdout + named.stderr
    assert _offers(named.stdout) == {0: [a.address], 1: [b.address]}


@pytest.mark.timeout(180)
def test_an_interface_that_reaches_no_peer_fails_saying_what_was_tried(hosts):
    # Host b (rank 0) offers only mgmt0, a network host a has no route to.
    result = _check(hosts, "ba", "--network-interfaces", "mgmt0,ens3")
    assert result.returncode != 0
    assert _offers(result.stdout) == {0: [hosts.mgmt], 1: [hosts.host("a").address]}, result.stdout
    assert re.search(rf"could not be reached: {re.escape(hosts.mgmt)}:\d+: Network is unreachable",
                     result.stdout + result.stderr), result.stdout + result.stderr


@pytest.mark.timeout(120)
def test_a_host_without_any_named_interface_says_which_it_has(hosts):
    result = _check(hosts, "ab", "--network-interface", "mgmt0")
    assert result.returncode != 0
    assert re.search(r"HOROVOD_GLOO_IFACE='mgmt0' \(--network-interfaces\): \S+ has none of these interfaces; "
                     r"it has lo 127\.0\.0\.1/8, ens3 ", result.stdout + result.stderr), result.stdout + result.stderr
