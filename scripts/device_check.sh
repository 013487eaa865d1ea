#!/usr/bin/env bash
# What this 2-core, GPU-less development VM cannot show, run in one go on a bigger machine (the
# device machine: 16 cores and a CUDA GPU, no network). Each step has its own time limit and
# the log goes to $OUT/device.log, so a step that fails or runs long costs only itself.
#
#   bash scripts/device_check.sh                 # the GPU step (nccl), from the repository root
#   bash scripts/device_check.sh nccl mpi        # only these steps
#
# Steps: nccl (the NCCL device path: NCCL's version, a smoke test that finds how two ranks may
# share the one GPU, the CUDA and JAX GPU tests on both device routes with a rank killed
# mid-allreduce, AMP, the sharded optimizer, PowerSGD and the Lightning strategy, busbw against torch.distributed's NCCL, training against DDP over NCCL; or only
# some of it, each after the smoke test: nccl-tests, nccl-busbw, nccl-train, nccl-sets (process
# sets and join); nccl-fresh: the training benchmark in 3 more fresh jobs per model, for the
# spread), cuda (the CUDA tests alone), mpi (the MPI
# path against raw mpi4py at 4 and 2 ranks, and where its time goes), threads (torch training
# with 1 and 4 intra-op threads per rank), fresh (20 fresh jobs), gpu-train (torch training on
# the GPU), scaling (4 ranks with a core each). The machine's image has torch and mpi4py over
# Debian's Open MPI; packages it lacks can travel as wheels in .whl/. The repository runs from
# its checkout (PYTHONPATH), and horovodrun is `python -m horovod.runner.launch`.
#
# Times there (H200 machine): machine 8 s, the NCCL versions 6 s, smoke test 7 s, nccl-tests
# 73 s, nccl-busbw 19 s, nccl-train 45 s, nccl-fresh 130 s, nccl-sets 12 s; so `nccl` takes about
# 2.5 minutes plus the machine's start (20-30 s). On the H100 machine: cuda 25 s, gpu-train 14 s,
# mpi 190 s, threads 85 s, fresh 124 s, scaling 18 s.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
LOG="$OUT/device.log"
PY=$(command -v python3)
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p /tmp/hvdbin
printf '#!/bin/sh\nexec %s -m horovod.runner.launch "$@"\n' "$PY" >/tmp/hvdbin/horovodrun
chmod +x /tmp/hvdbin/horovodrun
export PATH=/tmp/hvdbin:$PATH
STEPS=" ${*:-nccl} "

step() {  # step SECONDS TITLE COMMAND...: run one check under its own limit, logging it
    local limit=$1 title=$2
    shift 2
    echo "=== $title ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg)): $*" | tee -a "$LOG"
    local start=$SECONDS
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    echo "=== rc=${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$LOG"
}
wanted() { [[ $STEPS == *" $1 "* ]]; }

step 30 "machine" bash -c 'nproc; lscpu | grep -E "Model name|Thread|Core|Socket"; nvidia-smi -L;
    python3 -c "import sys, torch, numpy; print(sys.version.split()[0], torch.__version__, numpy.__version__)";
    python3 -c "import mpi4py; from mpi4py import MPI; print(\"mpi4py\", mpi4py.__version__, MPI.Get_library_version().splitlines()[0])";
    command -v mpirun && mpirun --version | head -1'
if wanted nccl || wanted nccl-tests || wanted nccl-busbw || wanted nccl-train || wanted nccl-fresh || wanted nccl-sets; then
    step 60 "NCCL: versions and the build check" bash -c '"$0" -c "import torch; print(\"torch\", torch.__version__, \"NCCL in torch\", torch.cuda.nccl.version())";
        "$0" -c "from horovod.common import basics; from horovod.common.transport.nccl import library; from horovod.common.settings import Settings; print(\"khorovod finds\", library.find(Settings.from_env()), basics.nccl_built())";
        "$0" -m horovod.runner.launch --check-build' "$PY"
    # Two ranks on one GPU: NCCL before 2.30 refuses them unless each rank looks like a host of
    # its own (its own NCCL_HOSTID, sockets on loopback). Find the first environment that works.
    cat >/tmp/smoke.py <<'PYEOF'
import os, torch, horovod.torch as hvd
from horovod.common import basics
hvd.init()
torch.cuda.set_device(0)
x = torch.full((1 << 20,), float(hvd.rank() + 1), device="cuda")
y = hvd.allreduce(x, op=hvd.Sum)
torch.cuda.synchronize()
print("rank", hvd.rank(), "sum", y[0].item(), "routes", basics.runtime().engine.cycle.executor.device.routes,
      "NCCL_HOSTID", os.environ.get("NCCL_HOSTID"), flush=True)
assert y[0].item() == 3.0
PYEOF
    : >/tmp/nccl_env
    for variant in "NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1" \
                   "NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket" \
                   "NCCL_MULTI_RANK_GPU_ENABLE=1 NONE=1"; do
        if [[ $variant == *MULTI_RANK* ]]; then own=""; else own="NCCL_HOSTID=khorovod-\$HOROVOD_RANK"; fi
        step 90 "NCCL smoke test: 2 ranks on the GPU with $variant $own" \
            env NCCL_DEBUG=WARN $variant horovodrun -np 2 sh -c "$own exec $PY /tmp/smoke.py"
        if grep -q "routes {(0, 1): ''}" "$LOG"; then echo "$variant" >/tmp/nccl_env; echo "$own" >/tmp/nccl_own; break; fi
    done
    NCCL_ENV=$(cat /tmp/nccl_env); OWN=$(cat /tmp/nccl_own 2>/dev/null)
    echo "=== NCCL environment that works: ${NCCL_ENV:-none} ${OWN}" | tee -a "$LOG"
fi
if wanted nccl || wanted nccl-tests; then
    step 480 "CUDA tests: every collective and dtype against the CPU, DistributedOptimizer, AMP, the sharded optimizer, PowerSGD, Lightning, a killed rank; NCCL and staged routes" \
        env KHOROVOD_TEST_NCCL_ENV="$NCCL_ENV" "$PY" -m pytest -v -s -rA --timeout 130 -p no:cacheprovider \
        tests/unit/test_device_pieces.py tests/torch/test_torch_cuda.py tests/jax/test_jax_gpu.py
fi
if wanted nccl || wanted nccl-busbw; then
    step 150 "allreduce busbw, khorovod's NCCL path against torch.distributed NCCL, 2 ranks" \
        env $NCCL_ENV horovodrun -np 2 sh -c "$OWN exec $PY benchmarks/nccl_busbw.py --rounds 3 --json $OUT/busbw.json"
fi
if wanted nccl || wanted nccl-train; then
    for model in mlp cnn mnist; do
        step 90 "torch $model training on the GPU against DDP over NCCL, 2 ranks" \
            env $NCCL_ENV horovodrun -np 2 sh -c "$OWN exec $PY benchmarks/torch_training.py --model $model --device cuda --rounds 5"
    done
fi
if wanted nccl-sets; then  # alone: process sets and join on NCCL (also part of nccl-tests)
    step 90 "process sets and join on the GPU" env KHOROVOD_TEST_NCCL_ENV="$NCCL_ENV" "$PY" -m pytest -v -s -rA \
        --timeout 80 -p no:cacheprovider tests/torch/test_torch_cuda.py -k process_sets_and_join
fi
if wanted nccl-fresh; then  # the spread over fresh jobs: each model's training 3 more times
    for job in 1 2 3; do
        for model in mlp cnn mnist; do
            step 60 "torch $model training against DDP over NCCL, fresh job $job" \
                env $NCCL_ENV horovodrun -np 2 sh -c "$OWN exec $PY benchmarks/torch_training.py --model $model --device cuda --rounds 5"
        done
    done
fi
if wanted cuda; then
    step 240 "CUDA tensors through every collective and DistributedOptimizer, 2 ranks on one GPU" \
        "$PY" -m pytest -q -p no:cacheprovider tests/torch/test_torch_cuda.py
fi
if wanted gpu-train; then
    step 120 "torch mlp against DDP on the GPU (gradients staged through host memory), 2 ranks" \
        horovodrun -np 2 "$PY" benchmarks/torch_training.py --model mlp --device cuda --rounds 5
fi
if wanted mpi; then
    for np in 4 2; do
        step 150 "MPI path against raw mpi4py and the shm path, $np ranks with a core each" \
            "$PY" -m horovod.benchmarks allreduce latency --np $np --systems khorovod:mpi,mpi,khorovod:shm \
            --sizes 4K,1M,4M,16M --seconds 0.2 --repeat 3 --out-dir "$OUT/mpi-np$np"
    done
    step 90 "where the MPI path's time goes, 4 ranks" \
        horovodrun --mpi -np 4 "$PY" benchmarks/mpi_overhead.py --sizes 4,1M --iters 300
fi
if wanted threads; then
    for model in mlp cnn; do
        for threads in 1 4; do
            step 120 "torch $model against DDP, 2 ranks, $threads intra-op thread(s) per rank" \
                horovodrun -np 2 "$PY" benchmarks/torch_training.py --model $model --threads $threads --rounds 5
        done
    done
fi
if wanted fresh; then
    step 150 "fresh jobs, 20 of them, 4 KiB and 64 MiB" "$PY" benchmarks/fresh_jobs.py --jobs 20 --sizes 4K,64M
fi
if wanted scaling; then
    step 120 "torch mlp against DDP, 4 ranks with a core each" \
        horovodrun -np 4 "$PY" benchmarks/torch_training.py --model mlp --rounds 5
fi
echo "=== done $(date +%T)" | tee -a "$LOG"
