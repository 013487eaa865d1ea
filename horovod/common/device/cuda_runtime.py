"""The few CUDA runtime calls the engine makes itself, through ctypes: streams, events, copies.

The frameworks compute; the engine only orders work between streams (an event recorded on one,
waited for on another), packs fused tensors with device-to-device copies, and stages device
memory through page-locked host memory where no device transport can take it. No compiler and
no new dependency: the runtime library is the one the framework already loaded into this
process (torch, JAX and TensorFlow GPU builds all load libcudart), or the `nvidia-cuda-runtime`
wheel they install. Handles (streams, events) and device pointers are plain integers, so they
mix freely with the frameworks' own (`torch.cuda.current_stream().cuda_stream`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading

from horovod.common.exceptions import DeviceError

_DEFAULT_COPY = 4  # cudaMemcpyDefault: the direction is read off the pointers (unified addressing)
_STREAM_NON_BLOCKING = 1
_EVENT_DISABLE_TIMING = 2


class CudaError(DeviceError):
    """A CUDA runtime call failed; the message is the runtime's own."""


def _loaded_copy() -> str | None:
    """The libcudart this process already has mapped (the framework's), if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if "/libcudart.so" in path:
                    return path
    except OSError:
        pass
    return None


def _wheel_copies() -> list[str]:
    """libcudart from the nvidia-cuda-runtime wheels (CUDA 13's layout first, then CUDA 12's)."""
    found = []
    for entry in sys.path:
        for pattern in ("nvidia/cu13/lib/libcudart.so.*", "nvidia/cuda_runtime/lib/libcudart.so.*"):
            found.extend(sorted(glob.glob(os.path.join(entry, pattern))))
    return found


def find_library() -> str | None:
    """Where the CUDA runtime is: the copy already loaded, a wheel's, or the system's by name."""
    candidates = [c for c in (_loaded_copy(), *_wheel_copies()) if c]
    candidates += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for candidate in candidates:
        try:
            ctypes.CDLL(candidate)
        except OSError:
            continue
        return candidate
    return None


class CudaRuntime:
    """The runtime calls the engine needs, each raising `CudaError` with the runtime's message."""

    def __init__(self, path: str) -> None:
        self.path = path
        lib = ctypes.CDLL(path)
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        signatures = {
            "cudaGetDeviceCount": [ctypes.POINTER(ctypes.c_int)],
            "cudaSetDevice": [ctypes.c_int],
            "cudaGetDevice": [ctypes.POINTER(ctypes.c_int)],
            "cudaDeviceGetPCIBusId": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
            "cudaStreamCreateWithFlags": [ctypes.POINTER(vp), ctypes.c_uint],
            "cudaStreamDestroy": [vp],
            "cudaStreamSynchronize": [vp],
            "cudaStreamWaitEvent": [vp, vp, ctypes.c_uint],
            "cudaEventCreateWithFlags": [ctypes.POINTER(vp), ctypes.c_uint],
            "cudaEventRecord": [vp, vp],
            "cudaMemcpyAsync": [vp, vp, sz, ctypes.c_int, vp],
            "cudaMemsetAsync": [vp, ctypes.c_int, sz, vp],
            "cudaMalloc": [ctypes.POINTER(vp), sz],
            "cudaFree": [vp],
            "cudaHostAlloc": [ctypes.POINTER(vp), sz, ctypes.c_uint],
            "cudaFreeHost": [vp],
        }
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        self._lib = lib

    def _check(self, code: int, call: str) -> None:
        if code:
            message = self._lib.cudaGetErrorString(code).decode(errors="replace")
            raise CudaError(f"{call} failed: {message} (CUDA error {code})")

    # -- devices ---------------------------------------------------------------------------
    def device_count(self) -> int:
        count = ctypes.c_int()
        code = self._lib.cudaGetDeviceCount(ctypes.byref(count))
        return count.value if code == 0 else 0

    def set_device(self, device: int) -> None:
        self._check(self._lib.cudaSetDevice(device), f"cudaSetDevice({device})")

    def current_device(self) -> int:
        device = ctypes.c_int()
        self._check(self._lib.cudaGetDevice(ctypes.byref(device)), "cudaGetDevice")
        return device.value

    def pci_bus_id(self, device: int) -> str:
        buf = ctypes.create_string_buffer(64)
        self._check(self._lib.cudaDeviceGetPCIBusId(buf, 64, device), "cudaDeviceGetPCIBusId")
        return buf.value.decode().lower()

    # -- streams and events ----------------------------------------------------------------
    def create_stream(self) -> int:
        handle = ctypes.c_void_p()
        self._check(self._lib.cudaStreamCreateWithFlags(ctypes.byref(handle), _STREAM_NON_BLOCKING),
                    "cudaStreamCreateWithFlags")
        return handle.value or 0

    def destroy_stream(self, stream: int) -> None:
        self._lib.cudaStreamDestroy(stream)

    def synchronize(self, stream: int) -> None:
        self._check(self._lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def create_event(self) -> int:
        handle = ctypes.c_void_p()
        self._check(self._lib.cudaEventCreateWithFlags(ctypes.byref(handle), _EVENT_DISABLE_TIMING),
                    "cudaEventCreateWithFlags")
        return handle.value or 0

    def record(self, event: int, stream: int) -> None:
        self._check(self._lib.cudaEventRecord(event, stream), "cudaEventRecord")

    def wait_event(self, stream: int, event: int) -> None:
        """Work queued on `stream` from now on starts after `event`'s recorded work is done."""
        self._check(self._lib.cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent")

    # -- memory ----------------------------------------------------------------------------
    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Queue a copy of `nbytes` on `stream`; either side may be device or page-locked host memory."""
        if nbytes:
            self._check(self._lib.cudaMemcpyAsync(dst, src, nbytes, _DEFAULT_COPY, stream), "cudaMemcpyAsync")

    def zero(self, ptr: int, nbytes: int, stream: int) -> None:
        if nbytes:
            self._check(self._lib.cudaMemsetAsync(ptr, 0, nbytes, stream), "cudaMemsetAsync")

    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self._check(self._lib.cudaMalloc(ctypes.byref(ptr), max(nbytes, 1)), f"cudaMalloc({nbytes})")
        return ptr.value or 0

    def free(self, ptr: int) -> None:
        self._lib.cudaFree(ptr)

    def host_alloc(self, nbytes: int) -> int:
        """Page-locked host memory: a copy to or from it is one DMA."""
        ptr = ctypes.c_void_p()
        self._check(self._lib.cudaHostAlloc(ctypes.byref(ptr), max(nbytes, 1), 0), f"cudaHostAlloc({nbytes})")
        return ptr.value or 0

    def free_host(self, ptr: int) -> None:
        self._lib.cudaFreeHost(ptr)


_lock = threading.Lock()
_loaded: CudaRuntime | None = None


def runtime() -> CudaRuntime | None:
    """The process's CUDA runtime, or None where there is none (no GPU framework, no driver).
    Looked for again until found: a framework may load it after our first question."""
    global _loaded
    with _lock:
        if _loaded is None:
            path = find_library()
            _loaded = None if path is None else CudaRuntime(path)
        return _loaded
