"""khorovod: Horovod's distributed data-parallel training, rebuilt in pure Python.

`import horovod.torch as hvd` (or `.tensorflow`, `.keras`, `.numpy`) for the training API;
`horovod.run(func, np=4)` to run a function on several ranks from Python.
`__version__` is the Horovod API level implemented (scripts gate on it); `__khorovod_version__`
is this package's own release.
"""

from horovod.version import __khorovod_version__, __version__


def run(*args, **kwargs):  # type: ignore[no-untyped-def]
    """Run a function on several ranks; see `horovod.runner.run`."""
    from horovod.runner import run as _run

    return _run(*args, **kwargs)


__all__ = ["__khorovod_version__", "__version__", "run"]
