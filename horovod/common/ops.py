"""The framework-neutral collective API: enqueue buffers, get a `Handle` back.

Every framework adapter turns its tensors into buffers that share memory with them (no copy):
numpy arrays for host memory, `DeviceBuffer`s for GPU memory. It checks them once (dtype,
contiguity; `check_host_array` for the numpy API), calls these functions and wraps the handle;
nothing below checks a buffer again. Argument errors about the call itself (process set,
reduction op, root, splits) raise `ValueError` here, once, on the calling rank, before anything
is sent.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, TypeVar

import numpy as np

from horovod.common import basics
from horovod.common.device import events
from horovod.common.device.buffers import Buffer, DeviceBuffer, device_of
from horovod.common.engine.handles import Entry, Handle
from horovod.common.engine.messages import OpType, Request, anonymous_name
from horovod.common.exceptions import HorovodInternalError
from horovod.common.partition import block_size
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Adasum, Average, Sum, check_reducible, dtype_name


T = TypeVar("T")
# Named allreduces whose Request is kept for their next call: more names than a model has tensors.
_REQUESTS_KEPT = 4096


class Waitable(Protocol):
    """A submitted collective: a `Handle`, or a bridge's wrapper of one."""

    def wait(self) -> Any: ...


def _op_name(prefix: str, name: str | None, rt: basics.Runtime, process_set: ProcessSet) -> str:
    return f"{prefix}.{name}" if name else anonymous_name(prefix, rt.next_anonymous_id(process_set))


def _group_names(prefix: str, name: str | None, count: int, rt: basics.Runtime,
                 process_set: ProcessSet) -> list[str]:
    base = _op_name(prefix, name, rt, process_set)
    return [f"{base}_{i + 1}of{count}" for i in range(count)]


# An enum member's `.name` is a Python property: looked up once here, not per op.
_KINDS = {op_type: op_type.name.lower() for op_type in OpType}


def check_host_array(array: object, op: str, name: str) -> None:
    """The numpy API's check of a caller's array (a framework's bridge checks its own tensors):
    ValueError unless the core can move it in place."""
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{op} {name}: expected a numpy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{op} {name}: the tensor is not contiguous; pass a contiguous copy "
                         "(numpy.ascontiguousarray / tensor.contiguous())")


def _dtype_of(array: Buffer, op: str, name: str) -> str:
    """The dtype name of a buffer its bridge has checked (for its Request)."""
    if isinstance(array, DeviceBuffer):
        return array.dtype
    try:
        return dtype_name(array.dtype)
    except ValueError as exc:  # a caller that did not check: say which op
        raise ValueError(f"{op} {name}: {exc}") from None


def _where(device: int) -> str:
    return "host memory" if device < 0 else f"CUDA device {device}"


def _check_one_memory(tensors: Sequence[Buffer], kind: str, name: str) -> None:
    """A grouped call's tensors travel as one unit: all in host memory, or all on one device."""
    devices = [device_of(t) for t in tensors]
    if len(set(devices)) > 1:
        other = next(i for i, d in enumerate(devices) if d != devices[0])
        raise ValueError(f"grouped {kind} {name}: tensor 0 is in {_where(devices[0])} but tensor {other} is in "
                         f"{_where(devices[other])}; pass the tensors of one device per call")


def _check_reduce(op: int, dtype: str, kind: str, name: str, rt: basics.Runtime, process_set: ProcessSet) -> None:
    check_reducible(dtype, op)
    if op == Adasum:  # every member sees the same set and hosts, so each raises the same error
        error = rt.transport.adasum_error(process_set.ranks)
        if error:
            raise NotImplementedError(f"{kind} {name}: {error}")


def _request(rt: basics.Runtime, op_type: OpType, name: str, array: Buffer | None = None, dtype: str = "",
             **fields: object) -> Request:
    """This rank's Request for `array` (of dtype name `dtype`); a bare one for ops without data.
    A device buffer's readiness is recorded on its stream here, at submission."""
    if isinstance(array, DeviceBuffer):
        rt.use_device(array.device, f"{_KINDS[op_type]} {name}")
        events.mark_ready(array)
        fields["device"] = array.device
    return Request(rt.settings.topology.rank, op_type, name, dtype,
                   array.shape if array is not None else (), **fields)  # type: ignore[arg-type]


def _empty_like(array: Buffer, shape: tuple[int, ...] | None = None) -> Buffer:
    """A new buffer of `array`'s dtype and memory (and of its shape unless given)."""
    shape = array.shape if shape is None else shape
    if isinstance(array, DeviceBuffer):
        return array.allocate(shape)
    return np.empty(shape, array.dtype)


def _same_layout(output: Buffer, tensor: Buffer) -> bool:
    if isinstance(tensor, DeviceBuffer):
        return (isinstance(output, DeviceBuffer) and output.shape == tensor.shape and output.dtype == tensor.dtype
                and output.device == tensor.device)
    return (isinstance(output, np.ndarray) and output.shape == tensor.shape and output.dtype == tensor.dtype
            and output.flags.c_contiguous)


def grouped_allreduce_async(tensors: Sequence[np.ndarray], name: str | None = None, op: int = Average,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set,
                            outputs: Sequence[np.ndarray] | None = None, prefix: str = "grouped_allreduce"
                            ) -> Handle:
    """Allreduce a list of arrays as one unit (they may fuse); result: the list of outputs.

    Pass `outputs=tensors` to reduce in place."""
    rt = basics.runtime()
    names = _group_names(prefix, name, len(tensors), rt, process_set)
    set_id = rt.set_id(process_set)
    if len(tensors) > 1:
        _check_one_memory(tensors, "allreduce", names[0])
    handle = Handle(len(tensors), True, names[0] if names else "grouped_allreduce")
    entries = [_allreduce_entry(rt, tensor, name, None if outputs is None else outputs[i], op, prescale_factor,
                                postscale_factor, process_set, handle, i)
               for i, (tensor, name) in enumerate(zip(tensors, names))]
    if entries:
        rt.engine.enqueue(set_id, entries)
    return handle


def allreduce_async(tensor: np.ndarray, name: str | None = None, op: int = Average,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set, output: np.ndarray | None = None) -> Handle:
    """Reduce `tensor` across the set; result: `output` (a new array unless given; pass the
    input itself to reduce in place). The most frequent op: written out, with no helper per call
    that it does not need. A named op in host memory that repeats with what it had last time
    (dtype, shape, op, scales, set) reuses its Request: it was checked and built then."""
    rt = basics.runtime()
    set_id = rt.set_id(process_set)
    last = rt.allreduce_requests.get(name) if name else None
    if (last is not None and last[1] is tensor.dtype and last[2] == tensor.shape and last[3] == op
            and last[4] == prescale_factor and last[5] == postscale_factor and last[6] == set_id):
        request = last[0]
        full_name = request.name
    else:
        full_name = _op_name("allreduce", name, rt, process_set)
        request = _allreduce_request(rt, tensor, full_name, op, prescale_factor, postscale_factor, process_set)
        if name and type(tensor) is np.ndarray:
            if len(rt.allreduce_requests) >= _REQUESTS_KEPT:
                rt.allreduce_requests.clear()
            rt.allreduce_requests[name] = (request, tensor.dtype, tensor.shape, op, prescale_factor,
                                           postscale_factor, set_id)
    handle = Handle(1, False, full_name)
    rt.engine.enqueue(set_id, [Entry(request, tensor, _allreduce_output(tensor, output, full_name), handle)])
    return handle


def _allreduce_request(rt: basics.Runtime, tensor: Buffer, name: str, op: int, prescale: float, postscale: float,
                       process_set: ProcessSet) -> Request:
    """The Request of one tensor of an allreduce, once its dtype and op are checked."""
    dtype = _dtype_of(tensor, "allreduce", name)
    _check_reduce(op, dtype, "allreduce", name, rt, process_set)
    return _request(rt, OpType.ALLREDUCE, name, tensor, dtype, reduce_op=op, prescale=float(prescale),
                    postscale=float(postscale))


def _allreduce_entry(rt: basics.Runtime, tensor: Buffer, name: str, output: Buffer | None, op: int, prescale: float,
                     postscale: float, process_set: ProcessSet, handle: Handle, index: int) -> Entry:
    """The entry of one tensor of a grouped allreduce, once its op and output are checked."""
    request = _allreduce_request(rt, tensor, name, op, prescale, postscale, process_set)
    return Entry(request, tensor, _allreduce_output(tensor, output, name), handle, index)


def _allreduce_output(tensor: Buffer, output: Buffer | None, name: str) -> Buffer:
    """Where an allreduce of `tensor` writes: `output` once checked, else a new buffer."""
    if output is None:
        return _empty_like(tensor)
    if output is not tensor and not _same_layout(output, tensor):
        raise ValueError(f"allreduce {name}: the output must be a contiguous array of the input's "
                         f"shape and dtype ({tensor.shape}, {tensor.dtype})")
    return output


def _entries(rt: basics.Runtime, op_type: OpType, tensors: Sequence[np.ndarray], names: list[str], set_id: int,
             grouped: bool,
             prepare: Callable[[int, np.ndarray, str, str], tuple[np.ndarray | None, dict[str, Any]]]) -> Handle:
    """Submit one entry per tensor, all completing one handle. `prepare(i, tensor, name, dtype)`
    makes the checks particular to the op and returns the output array (None: the engine
    allocates it) and the extra Request fields."""
    kind = _KINDS[op_type]
    if grouped and len(tensors) > 1:
        _check_one_memory(tensors, kind, names[0])
    handle = Handle(len(tensors), grouped, names[0] if names else f"grouped_{kind}")
    entries = []
    for i, (tensor, name) in enumerate(zip(tensors, names)):
        dtype = _dtype_of(tensor, kind, name)
        output, fields = prepare(i, tensor, name, dtype)
        entries.append(Entry(_request(rt, op_type, name, tensor, dtype, **fields), tensor, output, handle, i))
    if entries:
        rt.engine.enqueue(set_id, entries)
    return handle


def grouped_allgather_async(tensors: Sequence[np.ndarray], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    rt = basics.runtime()
    return _allgather_entries(rt, tensors, _group_names("grouped_allgather", name, len(tensors), rt, process_set),
                              process_set, grouped=True)


def allgather_async(tensor: np.ndarray, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Concatenate every member's `tensor` along dim 0 (dim 0 may differ per rank)."""
    rt = basics.runtime()
    return _allgather_entries(rt, [tensor], [_op_name("allgather", name, rt, process_set)], process_set, grouped=False)


def _allgather_entries(rt: basics.Runtime, tensors: Sequence[np.ndarray], names: list[str],
                       process_set: ProcessSet, grouped: bool) -> Handle:
    def prepare(i: int, tensor: np.ndarray, name: str, dtype: str) -> tuple[None, dict[str, Any]]:
        if tensor.ndim == 0:
            raise ValueError(f"allgather {name}: cannot gather a rank-zero tensor; reshape it to [1]")
        return None, {}

    return _entries(rt, OpType.ALLGATHER, tensors, names, rt.set_id(process_set), grouped, prepare)


def broadcast_async(tensor: np.ndarray, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set, output: np.ndarray | None = None) -> Handle:
    """Every member receives the global rank `root_rank`'s tensor (in `output`; pass the input
    to broadcast in place)."""
    rt = basics.runtime()
    full_name = _op_name("broadcast", name, rt, process_set)
    set_id = rt.set_id(process_set)
    dtype = _dtype_of(tensor, "broadcast", full_name)
    if root_rank not in process_set.ranks:
        raise ValueError(f"broadcast {full_name}: root_rank {root_rank} is not a member of {process_set}")
    output = _empty_like(tensor) if output is None else output
    handle = Handle(1, False, full_name)
    request = _request(rt, OpType.BROADCAST, full_name, tensor, dtype, root_rank=int(root_rank))
    rt.engine.enqueue(set_id, [Entry(request, tensor, output, handle)])
    return handle


def alltoall_async(tensor: np.ndarray, splits: Sequence[int] | np.ndarray | None = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Send splits[j] rows to member j; result: (received rows, received splits as int32)."""
    rt = basics.runtime()
    full_name = _op_name("alltoall", name, rt, process_set)
    set_id = rt.set_id(process_set)
    dtype = _dtype_of(tensor, "alltoall", full_name)
    n = len(process_set.ranks)
    if tensor.ndim == 0:
        raise ValueError(f"alltoall {full_name}: cannot scatter a rank-zero tensor; reshape it to [1]")
    if splits is None:
        if tensor.shape[0] % n:
            raise ValueError(f"alltoall {full_name}: without splits, dim 0 ({tensor.shape[0]}) must divide "
                             f"evenly by the set size {n}; pass splits= to send uneven parts")
        split_list = [tensor.shape[0] // n] * n
    else:
        arr = np.asarray(splits)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ValueError(f"alltoall {full_name}: splits must be a 1-D list of integers, got {splits!r}")
        split_list = [int(s) for s in arr]
        if len(split_list) != n:
            raise ValueError(f"alltoall {full_name}: splits has {len(split_list)} entries; the set has {n} members")
        if any(s < 0 for s in split_list) or sum(split_list) > tensor.shape[0]:
            raise ValueError(f"alltoall {full_name}: splits {split_list} must be >= 0 and sum to at most "
                             f"dim 0 ({tensor.shape[0]})")
    handle = Handle(1, False, full_name)
    request = _request(rt, OpType.ALLTOALL, full_name, tensor, dtype, splits=tuple(split_list))
    rt.engine.enqueue(set_id, [Entry(request, tensor, None, handle)])
    return handle


def grouped_reducescatter_async(tensors: Sequence[np.ndarray], name: str | None = None, op: int = Average,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                process_set: ProcessSet = global_process_set) -> Handle:
    rt = basics.runtime()
    names = _group_names("grouped_reducescatter", name, len(tensors), rt, process_set)
    return _reducescatter_entries(rt, tensors, names, op, prescale_factor, postscale_factor, process_set, True)


def reducescatter_async(tensor: np.ndarray, name: str | None = None, op: int = Average,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set: ProcessSet = global_process_set) -> Handle:
    """Reduce across the set and keep this member's block of dim 0 (the first dim0 % n members
    get one extra row)."""
    rt = basics.runtime()
    return _reducescatter_entries(rt, [tensor], [_op_name("reducescatter", name, rt, process_set)], op, prescale_factor,
                                  postscale_factor, process_set, False)


def check_reducescatter_op(op: int, name: str) -> None:
    """Only Average and Sum reduce-scatter. Adasum is refused as Horovod's core refuses it, with a
    RuntimeError (HorovodInternalError) that scripts catch; other ops with a ValueError."""
    if op == Adasum:
        raise HorovodInternalError(f"reducescatter {name}: op=Adasum cannot reduce-scatter; only "
                                   "op=Average or op=Sum are supported")
    if op not in (Average, Sum):
        raise ValueError(f"reducescatter {name}: only op=Average or op=Sum are supported")


def _reducescatter_entries(rt: basics.Runtime, tensors: Sequence[np.ndarray], names: list[str], op: int,
                           prescale: float, postscale: float, process_set: ProcessSet, grouped: bool) -> Handle:
    set_id = rt.set_id(process_set)
    n = len(process_set.ranks)
    me = process_set.ranks.index(rt.settings.topology.rank)

    def prepare(i: int, tensor: np.ndarray, name: str, dtype: str) -> tuple[np.ndarray, dict[str, Any]]:
        check_reducescatter_op(op, name)
        _check_reduce(op, dtype, "reducescatter", name, rt, process_set)
        if tensor.ndim == 0:
            raise ValueError(f"reducescatter {name}: cannot scatter a rank-zero tensor; reshape it to [1]")
        rows = block_size(tensor.shape[0], n, me)
        output = _empty_like(tensor, (rows,) + tuple(tensor.shape[1:]))
        return output, {"reduce_op": op, "prescale": float(prescale), "postscale": float(postscale)}

    return _entries(rt, OpType.REDUCESCATTER, tensors, names, set_id, grouped, prepare)


def join_async(process_set: ProcessSet = global_process_set) -> Handle:
    """This rank has no more data: it contributes zeros to allreduces until every rank joined.
    Result: the global rank that joined last (the same on every rank)."""
    rt = basics.runtime()
    handle = Handle(1, False, "join.noname")
    rt.engine.enqueue(rt.set_id(process_set), [Entry(_request(rt, OpType.JOIN, "join.noname", None), None, None,
                                                     handle)])
    return handle


def barrier_async(process_set: ProcessSet = global_process_set) -> Handle:
    rt = basics.runtime()
    handle = Handle(1, False, "barrier.noname")
    rt.engine.enqueue(rt.set_id(process_set), [Entry(_request(rt, OpType.BARRIER, "barrier.noname", None), None,
                                                     None, handle)])
    return handle


def submit_waited(submit: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`submit(*args, **kwargs)`, which submits ops (any number of calls: an optimizer's
    gradients) that this thread waits for right after. They go to the engine as one batch when
    `submit` returns, so that no cycle takes part of them (`Engine.batch`); the engine thread
    is not woken for them, and the first wait runs their cycle on this thread. Returns what
    `submit` returned."""
    with basics.runtime().engine.batch():
        return submit(*args, **kwargs)


def run_now(submit: Callable[..., Waitable], *args: Any, **kwargs: Any) -> Any:
    """Submit with `submit(*args, **kwargs)` (one call: a blocking collective) and wait for the
    result on this thread, which runs the engine itself meanwhile (`Engine.waited`)."""
    with basics.runtime().engine.waited():
        pending = submit(*args, **kwargs)
    return pending.wait()


def poll(handle: Handle) -> bool:
    """True once the op finished (successfully or not); never blocks."""
    return handle.poll()


def synchronize(handle: Handle) -> object:
    """Wait for the op and return its result; raises HorovodInternalError if it failed."""
    return handle.wait()


def wait_as_internal_error(handle: Handle) -> Any:
    """The op's result; any core failure surfaces as HorovodInternalError, the one type that
    framework users (and elastic training) catch around a collective."""
    try:
        return handle.wait()
    except HorovodInternalError:
        raise
    except RuntimeError as exc:
        raise HorovodInternalError(str(exc)) from exc


# Objects travel as cloudpickled uint8 arrays: first the length, then the bytes.
def broadcast_object(obj: object, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> object:
    """Send any picklable object from `root_rank` to every member; returns it everywhere."""
    import cloudpickle

    # Not the object's type name: the others often pass None (`obj if rank == root else None`),
    # and differing names would never match.
    name = name or "object"
    if basics.rank() == root_rank:
        payload = np.frombuffer(cloudpickle.dumps(obj), np.uint8)
        length = np.array([payload.size], np.int64)
    else:
        payload, length = None, np.zeros(1, np.int64)
    broadcast_async(length, root_rank, f"{name}.sz", process_set, output=length).wait()
    if payload is None:
        payload = np.empty(int(length[0]), np.uint8)
    data = broadcast_async(payload, root_rank, f"{name}.t", process_set,
                           output=payload if basics.rank() != root_rank else None).wait()
    return obj if basics.rank() == root_rank else cloudpickle.loads(data.tobytes())


def allgather_object(obj: object, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[object]:
    """Every member's object, as a list in member order."""
    import cloudpickle

    name = name or "object"  # the same on every rank, whatever each one passes
    payload = np.frombuffer(cloudpickle.dumps(obj), np.uint8)
    sizes = allgather_async(np.array([payload.size], np.int64), f"{name}.sz", process_set).wait()
    data = allgather_async(payload, f"{name}.t", process_set).wait()
    result, offset = [], 0
    for size in sizes:
        result.append(cloudpickle.loads(data[offset:offset + int(size)].tobytes()))
        offset += int(size)
    return result
