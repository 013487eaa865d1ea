"""The worker side of `horovod.run`: fetch the function from the launcher, run it, return the result.

Started by the launcher (or by mpirun) as `python -m horovod.runner.run_task`; everything it needs
(the store's address, the job secret, its rank) comes from the environment, never from argv.
"""

from __future__ import annotations

import sys
import traceback

import cloudpickle

from horovod.common import basics
from horovod.common.rendezvous import RendezvousClient
from horovod.common.settings import Settings


def failure_report(exc: BaseException) -> str:
    """The `failures/<rank>` text: `Type: message`, then the traceback (docs/internals.md)."""
    return f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc))


def main() -> int:
    settings = Settings.from_env()
    if settings.rendezvous_addr is None or settings.rendezvous_port is None or not settings.secret_key:
        print("horovod.runner.run_task is started by horovod.run(); it needs the launcher's "
              "HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT and _HOROVOD_SECRET_KEY", file=sys.stderr)
        return 2
    # Our launcher names the rank in HOROVOD_RANK; under mpirun (horovod.run(use_mpi=True)) MPI's own
    # variables do.
    slot = settings.launcher_slot if settings.bootstrap == "mpi" else None
    rank = str(slot.rank if slot is not None else settings.topology.rank)
    client = RendezvousClient(settings.rendezvous_addr, settings.rendezvous_port, settings.secret_key,
                              connect_timeout=settings.start_timeout)
    try:
        func, args, kwargs = cloudpickle.loads(client.get("runfunc", "func", settings.start_timeout))
        result = func(*args, **kwargs)
        if basics.is_initialized():  # an elastic job's rank is the one of the round it finished in
            rank = str(basics.rank())
        client.put("runfunc_result", rank, cloudpickle.dumps(result))
    except Exception as exc:
        # As for an uncaught exception: recorded (with the peers this rank saw leave first, when
        # the function initialised Horovod), and shutdown at exit tells the peers this rank failed.
        basics.record_failure(exc)
        # Keep the first report: if the engine already recorded why this rank failed, that wins.
        try:
            if rank not in client.keys("failures"):
                client.put("failures", rank, failure_report(exc).encode("utf-8"))
        except OSError:
            pass  # the launcher is gone; the traceback below still reaches our stderr
        traceback.print_exc()
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
