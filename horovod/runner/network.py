"""Where the launcher is on the network: is a host this machine, and what address reaches us.

Kept apart from slot assignment (which is pure) because these answers come from the OS.
"""

from __future__ import annotations

import functools
import socket

from horovod.common import netif

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


def address_towards(remote_host: str) -> str:
    """The local address the OS would use to reach `remote_host` (no packet is sent)."""
    try:
        return netif.address_towards(remote_host)
    except OSError:
        return socket.gethostbyname(socket.gethostname())
