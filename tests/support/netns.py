"""Emulated machines: one network namespace per host (or Kubernetes pod), with named interfaces.

`EmulatedHosts` makes a bridge in this namespace (where horovodrun runs, at `launcher_address`)
and, for each host, a namespace joined to the bridge by a veth pair whose inside end carries the
name given (`ens3` on one host, `enp0s8` on another: hosts need not share names). `add_network`
gives a host an extra network of its own, which reaches nothing else. Every namespace gets an
/etc/hosts of the hosts' names (`ip netns exec` shows /etc/netns/<ns>/hosts as /etc/hosts), as a
cluster's DNS would give. `ssh_bin` holds a stand-in `ssh` that maps a host's name or address to
its namespace and runs the command there. Everything is removed on exit, however the test ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_made = [0]  # fresh names and subnets for every set of hosts made by this process


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def require_netns() -> None:
    """Skip the test where namespaces cannot be made (not root, no iproute2)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("the `ip` tool (iproute2) is not installed")


@dataclass
class Host:
    name: str  # the host's name in every namespace's /etc/hosts
    namespace: str
    interface: str  # the name of its interface on the shared network
    address: str


FAKE_SSH = """\
#!/bin/sh
# Stand-in for ssh: skip the options, map the host to its network namespace, run the command there.
while [ $# -gt 2 ]; do
  case "$1" in -o|-p|-i|-l) shift 2;; -*) shift;; *) break;; esac
done
case "$1" in
{cases}
  *) echo "ssh: connect to host $1 port 22: No route to host" >&2; exit 255;;
esac
shift
exec ip netns exec "$ns" sh -c "$*"
"""


@dataclass
class EmulatedHosts:
    """Use as a context manager; `interfaces` maps each host's name to its interface's name."""

    interfaces: dict[str, str]
    tmp: Path
    hosts: list[Host] = field(default_factory=list)
    _links: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _made[0] += 1
        tag = f"{os.getpid() % 10000}{_made[0] % 100}"
        self.tag = tag
        self.subnet = f"10.{150 + os.getpid() % 40}.{_made[0] % 250}"
        self.bridge = f"khn{tag}"
        self.launcher_address = f"{self.subnet}.1"
        self.ssh_bin = self.tmp / "ssh-bin"

    def __enter__(self) -> "EmulatedHosts":
        require_netns()
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            self._links.append(self.bridge)
            ip("addr", "add", f"{self.launcher_address}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for index, (name, interface) in enumerate(self.interfaces.items()):
                host = Host(name, f"khn{self.tag}{name}", interface, f"{self.subnet}.{index + 2}")
                ip("netns", "add", host.namespace)
                self.hosts.append(host)
                outside = f"khn{self.tag}x{index}"
                ip("link", "add", outside, "type", "veth", "peer", "name", interface, "netns", host.namespace)
                self._links.append(outside)
                ip("link", "set", outside, "master", self.bridge)
                ip("link", "set", outside, "up")
                ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", interface)
                ip("-n", host.namespace, "link", "set", interface, "up")
                ip("-n", host.namespace, "link", "set", "lo", "up")
            self._write_hosts_files()
            self._write_fake_ssh()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        # Whatever still runs in a host (a session sshd forked, a worker it started) ends with it.
        for host in self.hosts:
            for pid in ip("netns", "pids", host.namespace, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for link in self._links:
            ip("link", "del", link, check=False)  # a veth takes its other end with it
        for host in self.hosts:
            ip("netns", "del", host.namespace, check=False)
            shutil.rmtree(f"/etc/netns/{host.namespace}", ignore_errors=True)

    def host(self, name: str) -> Host:
        return next(host for host in self.hosts if host.name == name)

    def add_network(self, name: str, interface: str, index: int) -> str:
        """Give host `name` an extra interface on a network of its own (no other host is on it,
        nothing routes to it); returns its address."""
        host = self.host(name)
        outside = f"khn{self.tag}m{index}"
        address = f"10.{192 + index}.{_made[0] % 250}.2"
        ip("link", "add", outside, "type", "veth", "peer", "name", interface, "netns", host.namespace)
        self._links.append(outside)
        ip("link", "set", outside, "up")
        ip("-n", host.namespace, "addr", "add", f"{address}/24", "dev", interface)
        ip("-n", host.namespace, "link", "set", interface, "up")
        return address

    def inside(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run in host `name`'s network namespace under its own host name (a UTS namespace,
        named by the first label of `name`, as a pod is): MPI tells hosts apart by it."""
        return ["ip", "netns", "exec", self.host(name).namespace, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', name.split(".")[0], *argv]

    def _write_hosts_files(self) -> None:
        lines = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        for host in self.hosts:
            directory = Path(f"/etc/netns/{host.namespace}")
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts").write_text(lines)

    def _write_fake_ssh(self) -> None:
        self.ssh_bin.mkdir(exist_ok=True)
        cases = "\n".join(f"  {h.address}|{h.name}) ns={h.namespace};;" for h in self.hosts)
        ssh = self.ssh_bin / "ssh"
        ssh.write_text(FAKE_SSH.format(cases=cases))
        ssh.chmod(0o755)
