"""Where an estimator's training runs: a `Backend` runs the training function as a Horovod job.

Estimators hand their training function to the backend they were given (`backend=`), or to a
`SparkBackend` of `num_proc` ranks when none was. A user-supplied subclass of `Backend` that
implements `run` and `num_processes` takes the place of Spark entirely (for example to run the
ranks somewhere else, or to wrap `horovod.spark.run` with extra set-up).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence


def default_num_proc() -> int:
    """The active Spark context's default parallelism (what `num_proc=None` means)."""
    from horovod.spark.runner import active_spark_context

    return int(active_spark_context().defaultParallelism)


class Backend:
    """Runs a function on every rank of a Horovod job and returns the results by rank."""

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
            env: dict[str, str] | None = None) -> list[Any]:
        """`fn(*args, **kwargs)` on each rank, with `env` added to the ranks' environment."""
        raise NotImplementedError(f"{type(self).__name__} must implement run(fn, args, kwargs, env)")

    def num_processes(self) -> int:
        """How many ranks `run` starts."""
        raise NotImplementedError(f"{type(self).__name__} must implement num_processes()")


class SparkBackend(Backend):
    """Runs the function with `horovod.spark.run` on `num_proc` Spark tasks.

    `env` is the ranks' environment (default: the driver's); `run(env=...)` adds to it. Every
    other keyword argument (`stdout`, `stderr`, `verbose`, `nics`, `start_timeout`,
    `prefix_output_with_timestamp`, `use_mpi`, ...) is passed on to `horovod.spark.run`.
    """

    def __init__(self, num_proc: int | None = None, env: dict[str, str] | None = None, **kwargs: Any) -> None:
        import inspect

        from horovod.spark.runner import run

        accepted = set(inspect.signature(run).parameters) - {"fn", "args", "kwargs", "num_proc", "env"}
        unknown = sorted(set(kwargs) - accepted)
        if unknown:
            raise TypeError(f"SparkBackend got unknown arguments: {', '.join(unknown)} "
                            f"(it passes on only horovod.spark.run's: {', '.join(sorted(accepted))})")
        self._num_proc = num_proc or default_num_proc()
        self._env = dict(env) if env is not None else None
        self._kwargs = kwargs

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
            env: dict[str, str] | None = None) -> list[Any]:
        import horovod.spark

        full_env = {**(self._env or {}), **(env or {})}
        return horovod.spark.run(fn, args=args, kwargs=kwargs, num_proc=self._num_proc,
                                 env=full_env or None, **self._kwargs)

    def num_processes(self) -> int:
        return self._num_proc
