"""This host's network interfaces: which addresses a rank offers its peers, and in which order a
rank tries a peer's addresses.

Hosts need not share interface names. Given `HOROVOD_GLOO_IFACE` (`--network-interfaces`, a
comma list), a rank offers the addresses of those of the named interfaces its host has, in that
order, and fails naming the interfaces it does have when it has none of them. Given nothing, it
offers every IPv4 address of its host, the one its route to the launcher uses first; a peer
tries first the addresses on a network it shares, then the others, and keeps the first that
answers. A management network that cannot reach the other hosts is then passed over rather than
chosen. A one-host job (the launcher on loopback) offers loopback only.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Sequence

_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B


@dataclass(frozen=True)
class Interface:
    """One network interface with its (primary) IPv4 address."""

    name: str
    address: str
    netmask: str

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.address}/{self.netmask}", strict=False)

    @property
    def is_loopback(self) -> bool:
        return ipaddress.IPv4Address(self.address).is_loopback


def _ioctl_address(sock: socket.socket, request: int, name: str) -> str:
    packed = fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def interfaces() -> list[Interface]:
    """Every interface of this host that has an IPv4 address (Linux), in the kernel's order."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                found.append(Interface(name, _ioctl_address(sock, _SIOCGIFADDR, name),
                                       _ioctl_address(sock, _SIOCGIFNETMASK, name)))
            except OSError:
                continue  # down, or no IPv4 address
    return found


def describe(found: Sequence[Interface]) -> str:
    """`lo 127.0.0.1, eth0 10.0.0.2/24`: for messages and the network report."""
    return ", ".join(f"{i.name} {i.address}/{i.network.prefixlen}" for i in found) or "none"


def interface_address(nic: str) -> str:
    """The IPv4 address of the interface `nic` of this host; ValueError naming those it has."""
    for interface in interfaces():
        if interface.name == nic:
            return interface.address
    raise ValueError(f"network interface {nic!r} has no IPv4 address on {socket.gethostname()} "
                     f"(its interfaces: {describe(interfaces())})")


def address_towards(remote: str) -> str:
    """The local address the OS routes to `remote` from (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((remote, 9))
        return sock.getsockname()[0]


def offered_addresses(launcher_address: str, iface: str | None) -> list[str]:
    """The addresses a rank listens on and tells its peers, best first (see the module's doc)."""
    found = interfaces()
    if iface:
        wanted = [name.strip() for name in iface.split(",") if name.strip()]
        chosen = [i.address for name in wanted for i in found if i.name == name]
        if not chosen:
            raise ValueError(f"HOROVOD_GLOO_IFACE={iface!r} (--network-interfaces): {socket.gethostname()} has none "
                             f"of these interfaces; it has {describe(found)}. Name one of each host's "
                             "interfaces (a comma list may name several), or leave it unset to choose automatically")
        return list(dict.fromkeys(chosen))
    if launcher_address in ("localhost", "") or ipaddress.ip_address(
            socket.gethostbyname(launcher_address)).is_loopback:
        return ["127.0.0.1"]
    route = address_towards(launcher_address)
    return list(dict.fromkeys([route, *(i.address for i in found if not i.is_loopback)]))


def dial_order(candidates: Sequence[str], local: Sequence[Interface]) -> list[str]:
    """A peer's addresses in the order to try them: those on a network this host is on first."""
    networks = [i.network for i in local if not i.is_loopback]

    def shared(address: str) -> bool:
        return any(ipaddress.IPv4Address(address) in network for network in networks)

    return sorted(candidates, key=lambda address: not shared(address))
