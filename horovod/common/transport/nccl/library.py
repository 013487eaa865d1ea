"""libnccl through ctypes: where it is, its version, one table of the calls we make, their errors.

No compiler and no new dependency: the library is the one the GPU frameworks already install
(the `nvidia-nccl-cu12` / `-cu13` wheels that torch, TensorFlow and JAX CUDA builds bring), or
the copy already loaded in the process, or one named explicitly (`HOROVOD_NCCL_LIB`, a file, or
`HOROVOD_NCCL_HOME`, a folder with `lib/`). A library is first opened in a child process
(`probe`): a broken or mismatched libnccl can crash whoever loads it, and that must not be the job.

Communicator handles, device pointers and stream handles are plain integers. Nothing here
destroys a communicator from `__del__`: the transport does it, in order, at shutdown or abort.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import subprocess
import sys
from dataclasses import dataclass

from horovod.common.exceptions import DeviceError
from horovod.common.settings import Settings

UNIQUE_ID_BYTES = 128
IN_PROGRESS = 7  # ncclInProgress: a non-blocking communicator is still working on the call

# Our dtype names -> ncclDataType_t. NCCL has no 16-bit integers (Horovod refuses them too).
DATA_TYPES = {"int8": 0, "uint8": 1, "bool": 1, "int32": 2, "int64": 4, "float16": 6, "float32": 7,
              "float64": 8, "bfloat16": 9}
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4

_RESULTS = {1: "unhandled CUDA error", 2: "system error", 3: "internal error", 4: "invalid argument",
            5: "invalid usage", 6: "remote error (a peer failed or closed its connection)",
            7: "operation in progress", 8: "timeout"}


class NcclError(DeviceError):
    """An NCCL call failed; `code` is its ncclResult_t, the message NCCL's own words."""

    def __init__(self, call: str, code: int, detail: str = "") -> None:
        text = _RESULTS.get(code, f"result {code}")
        super().__init__(f"{call} failed: {text}" + (f": {detail}" if detail else ""))
        self.code = code


def version_string(code: int) -> str:
    """NCCL's version code as major.minor.patch (2.18+ codes are major*10000 + minor*100 + patch)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def candidates(settings: Settings) -> list[str]:
    """Where to look, in order: the explicit setting, the wheels, the copy already loaded, the system's."""
    found: list[str] = []
    if settings.nccl_lib:
        path = settings.nccl_lib
        found.append(os.path.join(path, "lib", "libnccl.so.2") if os.path.isdir(path) else path)
        return found  # asked for one library: that one or none
    for entry in sys.path:
        found.extend(sorted(glob.glob(os.path.join(entry, "nvidia", "nccl", "lib", "libnccl.so.2"))))
    try:
        with open("/proc/self/maps") as maps:
            found.extend(line.rsplit(" ", 1)[-1].strip() for line in maps if "/libnccl.so" in line)
    except OSError:
        pass
    found.append("libnccl.so.2")
    return list(dict.fromkeys(found))


_PROBE = ("import ctypes, sys\n"
          "lib = ctypes.CDLL(sys.argv[1]); v = ctypes.c_int()\n"
          "assert lib.ncclGetVersion(ctypes.byref(v)) == 0\n"
          "print(v.value)\n")


@dataclass(frozen=True)
class Probe:
    """What opening a libnccl in a child process showed."""

    path: str | None
    version: int  # 0: none usable
    why_not: str  # empty when usable


@functools.lru_cache(maxsize=8)
def probe(paths: tuple[str, ...]) -> Probe:
    """The first of `paths` that loads and answers ncclGetVersion, tried in a child process."""
    reasons = []
    for path in paths:
        try:
            done = subprocess.run([sys.executable, "-c", _PROBE, path], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"{path}: {exc}")
            continue
        if done.returncode == 0 and done.stdout.strip().isdigit():
            return Probe(path, int(done.stdout.strip()), "")
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        reasons.append(f"{path}: {last}")
    return Probe(None, 0, "no libnccl.so.2 could be loaded (" + "; ".join(reasons) + ")" if reasons
                 else "no libnccl.so.2 found")


def find(settings: Settings) -> Probe:
    return probe(tuple(candidates(settings)))


class _UniqueId(ctypes.Structure):
    """ncclUniqueId: 128 opaque bytes, passed by value."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class _Config(ctypes.Structure):
    """The head of ncclConfig_t that NCCL 2.17 defined; NCCL reads `size` bytes of it and keeps its
    defaults for the fields that later versions added."""

    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int),
                ("maxCTAs", ctypes.c_int), ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int)]


_UNDEF_INT = -2147483648


class Nccl:
    """The NCCL calls the transport makes; each raises `NcclError` with NCCL's own message."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        table: dict[str, list] = {
            "ncclGetVersion": [ctypes.POINTER(i)],
            "ncclGetUniqueId": [ctypes.c_char_p],
            "ncclCommInitRankConfig": [ctypes.POINTER(vp), i, _UniqueId, i, ctypes.POINTER(_Config)],
            "ncclCommAbort": [vp],
            "ncclCommDestroy": [vp],
            "ncclCommGetAsyncError": [vp, ctypes.POINTER(i)],
            "ncclAllReduce": [vp, vp, sz, i, i, vp, vp],
            "ncclReduce": [vp, vp, sz, i, i, i, vp, vp],
            "ncclBroadcast": [vp, vp, sz, i, i, vp, vp],
            "ncclAllGather": [vp, vp, sz, i, vp, vp],
            "ncclReduceScatter": [vp, vp, sz, i, i, vp, vp],
            "ncclSend": [vp, sz, i, i, vp, vp],
            "ncclRecv": [vp, sz, i, i, vp, vp],
            "ncclGroupStart": [],
            "ncclGroupEnd": [],
            "ncclRedOpCreatePreMulSum": [ctypes.POINTER(i), vp, i, i, vp],
            "ncclRedOpDestroy": [i, vp],
        }
        for name, argtypes in table.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        lib.ncclGetLastError.argtypes, lib.ncclGetLastError.restype = [vp], ctypes.c_char_p
        self._lib = lib
        self.path = path
        code = ctypes.c_int()
        self.check(lib.ncclGetVersion(ctypes.byref(code)), "ncclGetVersion")
        self.version = code.value

    def check(self, code: int, call: str, comm: int | None = None) -> int:
        """Raise NcclError for a failed call; ncclInProgress is returned to the caller."""
        if code and code != IN_PROGRESS:
            detail = (self._lib.ncclGetLastError(comm) or b"").decode(errors="replace").strip()
            raise NcclError(call, code, detail)
        return code

    def unique_id(self) -> bytes:
        buf = ctypes.create_string_buffer(UNIQUE_ID_BYTES)
        self.check(self._lib.ncclGetUniqueId(buf), "ncclGetUniqueId")
        return buf.raw

    def init_rank(self, size: int, unique_id: bytes, rank: int) -> tuple[int, int]:
        """Start joining a communicator without blocking (a peer that never comes must not hang
        this thread in NCCL); returns (comm, code): poll `async_error` while code is IN_PROGRESS."""
        config = _Config(ctypes.sizeof(_Config), 0xCAFEBEEF, 21700, 0, _UNDEF_INT, _UNDEF_INT, _UNDEF_INT, None,
                         _UNDEF_INT)
        comm = ctypes.c_void_p()
        uid = _UniqueId.from_buffer_copy(unique_id)
        code = self.check(self._lib.ncclCommInitRankConfig(ctypes.byref(comm), size, uid, rank, ctypes.byref(config)),
                          "ncclCommInitRankConfig")
        return comm.value or 0, code

    def async_error(self, comm: int) -> int:
        """The communicator's state: 0 ready, IN_PROGRESS still working; raises if it failed."""
        state = ctypes.c_int()
        self.check(self._lib.ncclCommGetAsyncError(comm, ctypes.byref(state)), "ncclCommGetAsyncError", comm)
        return self.check(state.value, "NCCL (asynchronous error)", comm)

    def abort(self, comm: int) -> None:
        """Free the communicator now, stopping its kernels even if a peer never answers."""
        self._lib.ncclCommAbort(comm)

    def destroy(self, comm: int) -> None:
        self._lib.ncclCommDestroy(comm)

    # -- collectives: queued on `stream`; counts in elements -----------------------------------
    def all_reduce(self, send: int, recv: int, count: int, dtype: int, op: int, comm: int, stream: int) -> int:
        return self.check(self._lib.ncclAllReduce(send, recv, count, dtype, op, comm, stream), "ncclAllReduce", comm)

    def reduce(self, send: int, recv: int, count: int, dtype: int, op: int, root: int, comm: int,
               stream: int) -> int:
        return self.check(self._lib.ncclReduce(send, recv, count, dtype, op, root, comm, stream), "ncclReduce", comm)

    def broadcast(self, send: int, recv: int, count: int, dtype: int, root: int, comm: int, stream: int) -> int:
        return self.check(self._lib.ncclBroadcast(send, recv, count, dtype, root, comm, stream), "ncclBroadcast",
                          comm)

    def all_gather(self, send: int, recv: int, count: int, dtype: int, comm: int, stream: int) -> int:
        return self.check(self._lib.ncclAllGather(send, recv, count, dtype, comm, stream), "ncclAllGather", comm)

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: int, op: int, comm: int, stream: int) -> int:
        return self.check(self._lib.ncclReduceScatter(send, recv, count, dtype, op, comm, stream),
                          "ncclReduceScatter", comm)

    def send(self, buf: int, count: int, dtype: int, peer: int, comm: int, stream: int) -> int:
        return self.check(self._lib.ncclSend(buf, count, dtype, peer, comm, stream), "ncclSend", comm)

    def recv(self, buf: int, count: int, dtype: int, peer: int, comm: int, stream: int) -> int:
        return self.check(self._lib.ncclRecv(buf, count, dtype, peer, comm, stream), "ncclRecv", comm)

    def group_start(self) -> None:
        self.check(self._lib.ncclGroupStart(), "ncclGroupStart")

    def group_end(self, comm: int) -> int:
        return self.check(self._lib.ncclGroupEnd(), "ncclGroupEnd", comm)

    def premul_sum(self, scalar: bytes, dtype: int, comm: int) -> int:
        """A reduction op that multiplies each input by `scalar` (the dtype's bytes) and sums."""
        op = ctypes.c_int()
        value = ctypes.create_string_buffer(scalar, len(scalar))
        self.check(self._lib.ncclRedOpCreatePreMulSum(ctypes.byref(op), value, dtype, 1, comm),  # 1: host immediate
                   "ncclRedOpCreatePreMulSum", comm)
        return op.value

    def destroy_op(self, op: int, comm: int) -> None:
        self._lib.ncclRedOpDestroy(op, comm)


@functools.lru_cache(maxsize=4)
def load(path: str) -> Nccl:
    """The library at `path`, loaded into this process (after `probe` found it safe)."""
    return Nccl(path)

