"""The GPU path's pure parts, on the CPU: NCCL discovery and version, its error messages, the
reduction table, the group's route, the device checks of negotiation and fusion, and the
settings. Communicator creation needs a GPU; without one NCCL's own error comes through."""

from __future__ import annotations

import numpy as np
import pytest

from horovod.common import basics
from horovod.common.device.cuda_runtime import runtime
from horovod.common.engine.coordinator import validate
from horovod.common.engine.device_executor import group_route
from horovod.common.engine.fusion import plan_fusion
from horovod.common.engine.messages import OpType, Request, Response
from horovod.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from horovod.common.settings import GpuOperations, Settings
from horovod.common.transport.nccl import library, reductions

NCCL = library.find(Settings())
needs_nccl = pytest.mark.skipif(NCCL.path is None, reason=f"no libnccl here: {NCCL.why_not}")
_CUDA = runtime()
HAS_GPU = _CUDA is not None and _CUDA.device_count() > 0


# -- finding and loading NCCL ----------------------------------------------------------------------
def test_an_explicit_library_is_the_only_candidate(tmp_path):
    assert library.candidates(Settings(nccl_lib="/opt/nccl/lib/libnccl.so.2")) == ["/opt/nccl/lib/libnccl.so.2"]
    (tmp_path / "lib").mkdir()
    assert library.candidates(Settings(nccl_lib=str(tmp_path))) == [str(tmp_path / "lib" / "libnccl.so.2")]


def test_a_library_that_does_not_load_is_reported_not_loaded(tmp_path):
    broken = tmp_path / "libnccl.so.2"
    broken.write_bytes(b"not a shared object")
    found = library.find(Settings(nccl_lib=str(broken)))
    assert (found.path, found.version) == (None, 0)
    assert str(broken) in found.why_not


def test_settings_read_the_nccl_variables():
    env = {"HOROVOD_NCCL_HOME": "/opt/nccl", "NCCL_HOSTID": "a", "NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    settings = Settings.from_env(env)
    assert (settings.nccl_lib, settings.nccl_hostid, settings.nccl_multi_rank_gpu) == ("/opt/nccl", "a", True)
    assert Settings.from_env({"HOROVOD_NCCL_LIB": "/x/libnccl.so.2"}).nccl_lib == "/x/libnccl.so.2"


@needs_nccl
def test_the_wheel_nccl_loads_and_reports_its_version():
    nccl = library.load(NCCL.path)
    assert nccl.version == NCCL.version > 20000
    assert basics.nccl_built() == NCCL.version  # Horovod's contract: the version code
    assert library.version_string(22803) == "2.28.3" and library.version_string(2708) == "2.7.8"


@needs_nccl
def test_a_unique_id_is_128_fresh_bytes():
    nccl = library.load(NCCL.path)
    first, second = nccl.unique_id(), nccl.unique_id()
    assert len(first) == library.UNIQUE_ID_BYTES and first != second


@needs_nccl
@pytest.mark.skipif(HAS_GPU, reason="a GPU is here: tests/torch/test_torch_cuda.py forms communicators on it")
def test_without_a_gpu_forming_a_communicator_fails_with_nccls_own_words():
    nccl = library.load(NCCL.path)
    with pytest.raises(library.NcclError, match=r"ncclCommInitRankConfig failed: unhandled CUDA error: .*[Cc]uda"):
        nccl.init_rank(1, nccl.unique_id(), 0)


# -- reductions ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, op, pre, post, n, want", [
    ("float32", Sum, 1.0, 1.0, 2, reductions.Reduction(7, library.SUM)),
    ("float32", Average, 1.0, 1.0, 4, reductions.Reduction(7, library.SUM, True, 0.25)),
    ("float16", Sum, 0.5, 3.0, 2, reductions.Reduction(6, library.SUM, True, 1.5)),
    ("bfloat16", Average, 2.0, 1.0, 2, reductions.Reduction(9, library.SUM)),  # 2 * 1/2: no multiply at all
    ("int64", Average, 1.0, 1.0, 3, reductions.Reduction(4, library.AVG)),
    ("int32", Sum, 1.0, 1.0, 3, reductions.Reduction(2, library.SUM)),
    ("float64", Max, 1.0, 1.0, 2, reductions.Reduction(8, library.MAX)),
    ("uint8", Product, 1.0, 1.0, 2, reductions.Reduction(1, library.PROD)),
    ("bool", Sum, 1.0, 1.0, 2, reductions.Reduction(1, library.MAX)),  # logical or
    ("bool", Min, 1.0, 1.0, 2, reductions.Reduction(1, library.MIN)),  # logical and
])
def test_horovods_reductions_map_onto_nccl(dtype, op, pre, post, n, want):
    assert reductions.plan(dtype, op, pre, post, n) == want


@pytest.mark.parametrize("dtype, op, pre, post, why", [
    ("int16", Sum, 1.0, 1.0, "NCCL has no int16"),
    ("float32", Adasum, 1.0, 1.0, "Adasum runs on the host"),
    ("float32", Max, 1.0, 2.0, "cannot scale the result of Max"),
    ("int32", Sum, 0.5, 1.0, "integer tensors"),
])
def test_what_nccl_cannot_do_says_why(dtype, op, pre, post, why):
    assert why in reductions.plan(dtype, op, pre, post, 2)


def test_premul_scalars_have_the_tensors_layout():
    assert reductions.scalar_bytes("float16", 0.25) == np.float16(0.25).tobytes()
    assert reductions.scalar_bytes("float64", 1 / 3) == np.float64(1 / 3).tobytes()
    assert reductions.scalar_bytes("bfloat16", 1.5) == bytes([0xC0, 0x3F])  # 0x3FC0
    assert reductions.scalar_bytes("bfloat16", 1 / 3) == bytes([0xAB, 0x3E])  # rounded to nearest


# -- routes -------------------------------------------------------------------------------------------
def test_a_group_on_distinct_gpus_uses_nccl():
    assert group_route([(22803, "a", "0000:01:00.0"), (22803, "a", "0000:02:00.0")], False) == ""
    assert group_route([(22803, "a", "0000:01:00.0"), (22803, "b", "0000:01:00.0")], False) == ""


def test_two_ranks_on_one_gpu_are_named_unless_nccl_accepts_them():
    why = group_route([(22803, "a", "0000:01:00.0"), (22803, "a", "0000:01:00.0")], False)
    assert "members 0 and 1" in why and "0000:01:00.0" in why and "NCCL_MULTI_RANK_GPU_ENABLE" in why
    assert group_route([(23200, "a", "0000:01:00.0"), (23200, "a", "0000:01:00.0")], True) == ""
    assert group_route([(22803, "a", "0000:01:00.0"), (22803, "a", "0000:01:00.0")], True) != ""  # too old


def test_a_member_without_nccl_keeps_the_whole_group_off_it():
    assert "positions [1]" in group_route([(22803, "a", "x"), (0, "a", "y")], False)


def test_gpu_operations_per_collective():
    ops = GpuOperations.from_env({"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_GPU_ALLGATHER": "MPI"})
    assert (ops.allreduce, ops.allgather, ops.broadcast) == ("nccl", "host", "nccl")
    assert GpuOperations.from_env({}).alltoall == "nccl"


# -- negotiation and fusion -------------------------------------------------------------------------
def test_a_cpu_and_a_gpu_tensor_under_one_name_is_a_mismatch():
    requests = {0: Request(0, OpType.ALLREDUCE, "grad", "float32", (4,)),
                1: Request(1, OpType.ALLREDUCE, "grad", "float32", (4,), device=0)}
    message = validate("grad", requests, (0, 1), [])
    assert "mismatched CPU/GPU device selection" in message and "rank 0: CPU; rank 1: GPU" in message


def test_host_and_device_responses_never_fuse():
    host = Response(OpType.ALLREDUCE, ["a"], "float32", [(4,)])
    device = Response(OpType.ALLREDUCE, ["b"], "float32", [(4,)], on_device=1)
    device2 = Response(OpType.ALLREDUCE, ["c"], "float32", [(4,)], on_device=1)
    planned = plan_fusion([host, device, device2], 1 << 20)
    assert [r.names for r in planned] == [["a"], ["b", "c"]] and planned[1].on_device == 1


def test_requests_and_responses_carry_the_device_over_the_wire():
    request = Request(3, OpType.BROADCAST, "w", "float16", (2, 2), root_rank=0, device=1)
    assert Request.from_wire(request.to_wire()) == request
    response = Response(OpType.ALLGATHER, ["w"], "float16", [(2, 2)], first_dims=[[2, 2]], on_device=1)
    assert Response.from_wire(response.to_wire()) == response


def test_a_rank_keeps_its_device_collectives_on_one_device():
    from horovod.common.runtime import Runtime

    rt = Runtime(Settings(), 1, None, None, None, None)  # type: ignore[arg-type]
    rt.use_device(1, "allreduce a")
    rt.use_device(1, "allreduce b")
    with pytest.raises(ValueError, match=r"allreduce c: the tensor is on CUDA device 0, but this rank's collectives "
                                         r"run on device 1"):
        rt.use_device(0, "allreduce c")
