"""The built-in transport: a full mesh of authenticated TCP connections (see `transport`).

One module per job: `peer` (a framed connection and its sender thread), `deathwatch` (failure
detection and blame), `mesh` (connecting the mesh), `transport` (the Transport methods, composed
from `horovod.common.algorithms`).
"""

from horovod.common.transport.tcp.deathwatch import CLOSED_BY_PEER, HANGUP, DeathWatch
from horovod.common.transport.tcp.transport import TcpTransport

__all__ = ["CLOSED_BY_PEER", "HANGUP", "DeathWatch", "TcpTransport"]
