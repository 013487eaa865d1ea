"""Where the launcher is on the network: is a host this machine, and what address reaches us.

Kept apart from slot assignment (which is pure) because these answers come from the OS.
"""

from __future__ import annotations

import fcntl
import functools
import socket
import struct

_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "::1"})


@functools.lru_cache(maxsize=None)
def is_local_host(hostname: str) -> bool:
    """True when `hostname` names this machine, so its workers run as plain child processes.

    Loopback names and this machine's own names are recognised without a lookup; any other
    name is resolved and counts as local when we can bind to one of its addresses.
    """
    if hostname in _LOCAL_NAMES or hostname.startswith("127."):
        return True
    if hostname in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(hostname, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return False
    for *_, sockaddr in infos:
        address = sockaddr[0]
        if address.startswith("127."):
            return True
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, 0))
                return True
            except OSError:
                continue
    return False


def interface_address(nic: str) -> str:
    """The IPv4 address of a network interface (Linux), for `--network-interfaces`."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", nic[:15].encode()))
        except OSError as exc:
            raise ValueError(f"network interface {nic!r} has no IPv4 address ({exc})") from None
    return socket.inet_ntoa(packed[20:24])


def address_towards(remote_host: str) -> str:
    """The local address the OS would use to reach `remote_host` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((remote_host, 9))
            return sock.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())
