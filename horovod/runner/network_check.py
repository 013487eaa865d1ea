"""A preflight of the network: which interfaces each host of a job will use, and whether every
rank reaches every other.

Run it as the job's program, on the job's hosts and with its flags:

    horovodrun -np 4 -H server1:2,server2:2 python -m horovod.runner.network_check

Every rank prints its host's interfaces and the addresses it offers its peers (see
`horovod.common.netif`), then joins the job and runs one allreduce over the data connections. A
peer it cannot reach fails that rank with the addresses it tried.
"""

from __future__ import annotations

import socket
import sys

from horovod.common import netif
from horovod.common.settings import Settings


def offer_line(settings: Settings) -> str:
    """`host h (rank r): interfaces ...; offers ... to its peers`."""
    where = settings.rendezvous_addr or "127.0.0.1"
    offered = netif.offered_addresses(where, settings.iface)
    chosen = f" (HOROVOD_GLOO_IFACE={settings.iface})" if settings.iface else ""
    return (f"host {socket.gethostname()} (rank {settings.topology.rank}): interfaces "
            f"{netif.describe(netif.interfaces())}; offers {', '.join(offered)} to its peers{chosen}")


def main() -> int:
    import numpy as np

    import horovod.numpy as hvd

    print(offer_line(Settings.from_env()), flush=True)
    hvd.init()
    size = hvd.size()
    total = hvd.allreduce(np.ones(1), op=hvd.Sum, name="network_check")
    print(f"rank {hvd.rank()}: reached all {size} ranks (allreduce of ones = {total[0]:g})", flush=True)
    hvd.shutdown()
    return 0 if int(total[0]) == size else 1


if __name__ == "__main__":
    sys.exit(main())
