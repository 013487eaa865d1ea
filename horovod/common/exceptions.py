"""The exception types a Horovod user catches: names and bases match Horovod's."""


class HorovodInternalError(RuntimeError):
    """A collective failed on this rank: a cross-rank mismatch, a dead peer, or shutdown.

    Elastic training catches it to roll back to the last committed state.
    """


class DeviceError(RuntimeError):
    """The GPU side failed: a CUDA runtime or NCCL call returned an error (khorovod's own type;
    collectives report it as HorovodInternalError, naming the call and the library's message)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed; workers interrupt to re-form the ring.

    `skip_sync` is True when only removals happened, so state need not be re-broadcast.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class HorovodVersionMismatchError(ImportError):
    """A framework's installed version differs from the one Horovod was built against.

    khorovod builds nothing against a framework, so it never raises this itself; it exists so
    that scripts catching it keep importing."""

    def __init__(self, name: str, version: str, installed_version: str) -> None:
        super().__init__(f"Framework {name} installed with version {installed_version} but found version "
                         f"{version}. This can result in unexpected behavior including runtime errors. "
                         "Reinstall Horovod using `pip install --no-cache-dir` to build with the new version.")
        self.name = name
        self.version = version
        self.installed_version = installed_version
