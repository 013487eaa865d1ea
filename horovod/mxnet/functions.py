"""Helpers that start every rank from the same point: parameters and Python objects."""

from __future__ import annotations

from typing import Any

import mxnet as mx

from horovod.common import ops
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.mxnet._bridge import start

__all__ = ["allgather_object", "broadcast_object", "broadcast_parameters"]


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: str | None = None,
                         process_set: ProcessSet = global_process_set) -> None:
    """Overwrite parameters on every rank with `root_rank`'s, in place.

    `params`: a dict of NDArrays (`module.get_params()[0]`) or Gluon's `net.collect_params()`.
    Entries go in name order (dict order may differ between ranks), all in flight at once.
    A Gluon parameter still waiting for its deferred initialisation (no forward pass yet) is
    broadcast when it initialises, during the first forward pass, which every rank then runs."""
    if not hasattr(params, "items"):
        raise ValueError(f"broadcast_parameters: expected a dict of NDArrays or a ParameterDict, got "
                         f"{type(params).__name__}")
    pending = []
    for name, value in sorted(params.items(), key=lambda item: item[0]):
        full_name = f"{prefix or 'parameter'}.{name}"
        is_parameter = isinstance(value, mx.gluon.Parameter)
        if is_parameter:
            try:
                value = value.data()
            except mx.gluon.parameter.DeferredInitializationError:
                _broadcast_when_initialised(params[name], root_rank, full_name, process_set)
                continue
        pending.append((params[name] if is_parameter else None,
                        start("broadcast", [value], inplace=True, root_rank=root_rank, name=full_name,
                              process_set=process_set)))
    for parameter, handle in pending:
        result = handle.wait()
        if parameter is not None:
            parameter.set_data(result)  # every context of the parameter


def _broadcast_when_initialised(parameter: Any, root_rank: int, name: str, process_set: ProcessSet) -> None:
    """Make `parameter`'s deferred initialisation take the root's values: Gluon hands the freshly
    initialised array to the parameter's `_init_impl(data, ctx_list)` (MXNet's own hook point, the
    one Horovod uses too), which copies it to every context; the root's values go in first."""
    initialise = parameter._init_impl

    def initialise_from_root(data: Any, ctx_list: Any) -> None:
        start("broadcast", [data], inplace=True, root_rank=root_rank, name=name, process_set=process_set).wait()
        initialise(data, ctx_list)

    parameter._init_impl = initialise_from_root


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """`root_rank`'s object (anything cloudpickle can serialise), returned on every rank."""
    return ops.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every rank's object, as a list indexed by rank within the set."""
    return ops.allgather_object(obj, name, process_set)
