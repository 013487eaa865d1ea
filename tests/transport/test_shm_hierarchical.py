"""The shared-memory and hierarchical transports on real ranks.

Several "hosts" on one machine: horovodrun -H localhost:2,127.0.0.1:2 gives ranks 0,1 the hostname
"localhost" and ranks 2,3 "127.0.0.1", so shared memory stays inside each and TCP runs between.
"""

import os

import pytest

from multirank import hvdrun

COLLECTIVES = r'''
import hashlib, os, sys
import numpy as np
import horovod.numpy as hvd
from horovod.common import basics
from horovod.common.process_sets import ProcessSet

if os.environ.get("BREAK_SHM"):  # a /dev/shm we cannot use: the transport must fall back to TCP
    import horovod.common.transport.shm.segment as shm_module
    shm_module.SHM_DIR = "/nonexistent-khorovod-test"
n_env = int(os.environ["HOROVOD_SIZE"])
sets = [ProcessSet([0, n_env - 1]), ProcessSet(list(range(n_env - 1)))] if n_env >= 3 else []
hvd.init(process_sets=sets)
r, n = hvd.rank(), hvd.size()
tr = basics.runtime().transport
problems, digests, tcp_groups, tcp_gather_groups, shm_calls = [], [], set(), set(), [0]

tcp = getattr(tr, "tcp", None)
if tcp is not None:
    real_tcp_allreduce = tcp.allreduce
    def spy_tcp(group, buf, op):
        tcp_groups.add(tuple(group))
        real_tcp_allreduce(group, buf, op)
    tcp.allreduce = spy_tcp
    real_tcp_allgatherv = tcp.allgatherv
    def spy_tcp_gather(group, *args):
        tcp_gather_groups.add(tuple(group))
        real_tcp_allgatherv(group, *args)
    tcp.allgatherv = spy_tcp_gather
if getattr(tr, "shm", None) is not None:  # count reductions through shared memory
    for method in ("allreduce", "reducescatter"):
        def spy_shm(*args, real=getattr(tr.shm, method)):
            shm_calls[0] += 1
            real(*args)
        setattr(tr.shm, method, spy_shm)

def dt(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)

def expect(label, got, want, same_everywhere=True):
    got, want = np.asarray(got), np.asarray(want)
    if same_everywhere:
        digests.append(hashlib.sha1(np.ascontiguousarray(got).tobytes()).hexdigest()[:12])
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(
            got.astype(np.float64), want.astype(np.float64)):
        problems.append(f"{label}: got {got.dtype}{got.shape} {got.ravel()[:4]}, want {want.dtype}{want.shape} {want.ravel()[:4]}")

ops = {"sum": (hvd.Sum, np.sum), "min": (hvd.Min, np.min), "max": (hvd.Max, np.max), "prod": (hvd.Product, np.prod)}
# 5: the whole-buffer path; 40_009: one sliced round; 700_001: several rounds, uneven slices.
for name in ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bfloat16"]:
    d = dt(name)
    for size in (5, 40_009, 700_001):
        base = np.arange(size) % 7
        for opname, (op, ref) in ops.items():
            if opname == "prod":
                if size > 40_009:
                    continue
                every = [(base + k) % 2 + 1 for k in range(n)]
            else:
                every = [base + k for k in range(n)]
            want = ref(np.stack(every).astype(np.float64), axis=0).astype(d)
            expect(f"allreduce {opname} {name} {size}", hvd.allreduce(every[r].astype(d), op=op, name=f"{opname}{name}{size}"), want)

flags = (np.arange(100_003) % (r + 2)) == 0
expect("allreduce bool max", hvd.allreduce(flags, op=hvd.Max, name="bmax"),
       np.any([(np.arange(100_003) % (k + 2)) == 0 for k in range(n)], axis=0))

# Random floats: every rank must hold the very same bits.
rng = np.random.default_rng(r)
noise = rng.standard_normal(1_000_003).astype(np.float32)
total = hvd.allreduce(noise, op=hvd.Sum, name="noise")
digests.append(hashlib.sha1(total.tobytes()).hexdigest()[:12])
every_noise = [np.random.default_rng(k).standard_normal(1_000_003).astype(np.float32) for k in range(n)]
if not np.allclose(total, np.sum(np.stack(every_noise).astype(np.float64), 0), atol=1e-4):
    problems.append("noise sum is wrong")

# Fused (the fusion buffer lives in shared memory), with Average's post-scaling.
shapes = [(3,), (100_000,), (7, 11), (250_001,), (1,), (64, 64)]
fused = hvd.grouped_allreduce([np.full(s, float(r + 1), np.float32) for s in shapes], name="fused")
for s, got in zip(shapes, fused):
    expect(f"fused average {s}", got, np.full(s, (n + 1) / 2, np.float32))
fused = hvd.grouped_allreduce([np.full(s, r + 1, np.int64) for s in shapes], op=hvd.Sum, name="fusedint")
for s, got in zip(shapes, fused):
    expect(f"fused sum {s}", got, np.full(s, n * (n + 1) // 2, np.int64))

# Negotiation messages above a mailbox (64 KiB: 1500 long names) travel over TCP instead.
many = hvd.grouped_allreduce([np.full(2, r + k, np.int32) for k in range(1500)], op=hvd.Sum,
                             name="a_rather_long_name_for_every_tensor_of_this_group")
expect("1500 tensors", np.stack(many), np.stack([np.full(2, sum(range(n)) + n * k, np.int32) for k in range(1500)]))

# Uneven everything, several rounds each.
rows = 2 * n + 1
full = np.arange(rows * 100_003, dtype=np.float64).reshape(rows, 100_003) % 11
part = hvd.reducescatter(full * (r + 1), op=hvd.Sum, name="rs")
start = sum(rows // n + (k < rows % n) for k in range(r))
expect("reducescatter", part, (full * (n * (n + 1) // 2))[start:start + rows // n + (r < rows % n)], False)
mine_rows = 0 if r == 1 else 50_000 * (r + 1) + 3
gathered = hvd.allgather(np.full((mine_rows, 3), r, np.int16), name="ag")
expect("allgather", gathered, np.concatenate([np.full((0 if k == 1 else 50_000 * (k + 1) + 3, 3), k, np.int16) for k in range(n)]))
payload = (np.arange(600_007) * (r + 1)).astype(np.float32)
expect("broadcast", hvd.broadcast(payload, root_rank=n - 1, name="bc"), (np.arange(600_007) * n).astype(np.float32))
splits = [(r + k) % 3 * 70_001 for k in range(n)]
send = np.concatenate([np.full((s, 2), 10 * r + k, np.int32) for k, s in enumerate(splits)])
out, received = hvd.alltoall(send, splits=splits, name="a2a")
expect("alltoall", out, np.concatenate([np.full(((k + r) % 3 * 70_001, 2), 10 * k + r, np.int32) for k in range(n)]), False)

# Process sets: members only, interleaved with work on the global set.
record = len(digests)
for ps in sets:
    if r in ps.ranks:
        got = hvd.allreduce(np.full(300_000, r + 1, np.int32), op=hvd.Sum, name="set", process_set=ps)
        expect(f"set {ps.ranks}", got, np.full(300_000, sum(k + 1 for k in ps.ranks), np.int32))
        got = hvd.allgather(np.full((2, 2), r, np.int8), name="setg", process_set=ps)
        expect(f"set allgather {ps.ranks}", got, np.repeat(np.array(ps.ranks, np.int8), 4).reshape(-1, 2))
    expect("global between sets", hvd.allreduce(np.ones(10), op=hvd.Sum, name="between"), np.full(10, float(n)))

report(problems=problems, digests=digests[:record], transport=tr.name, tcp_groups=sorted(tcp_groups),
       tcp_gather_groups=sorted(tcp_gather_groups),
       shm_calls=shm_calls[0], shm=getattr(tr, "shm", None) is not None)
'''

TWO_HOSTS = ["-H", "localhost:2,127.0.0.1:2"]


@pytest.mark.parametrize("np_,args,env,transport", [
    (2, [], {}, "shm"),
    (3, [], {}, "shm"),
    (4, [], {}, "shm"),
    (4, TWO_HOSTS, {"HOROVOD_HIERARCHICAL_ALLGATHER": "1"}, "hierarchical"),
    (4, TWO_HOSTS, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0", "HOROVOD_HIERARCHICAL_ALLGATHER": "0"}, "hierarchical"),
    (3, ["-H", "localhost:2,127.0.0.1:1"], {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}, "hierarchical"),
    (3, [], {"HOROVOD_CPU_OPERATIONS": "tcp"}, "tcp"),
    (2, [], {"BREAK_SHM": "1", "HOROVOD_CPU_OPERATIONS": "shm"}, "shm"),
], ids=["shm-2", "shm-3", "shm-4", "two-hosts", "two-hosts-flat", "uneven-hosts", "tcp-3", "shm-unavailable"])
def test_every_collective_is_exact_and_identical_everywhere(np_, args, env, transport):
    result = hvdrun(COLLECTIVES, np=np_, args=args, env=env, timeout=180).check()
    for rank, values in result.every_rank(np_):
        assert values["problems"] == [], f"rank {rank}: {values['problems']}"
        assert values["transport"] == transport
    # Results of the global set (the first digests) are bit-identical on every rank.
    assert len({tuple(v["digests"]) for v in result.ranks.values()}) == 1
    by_rank = result.ranks
    if transport == "shm" and not env:
        assert all(v["shm"] and v["shm_calls"] > 0 and v["tcp_groups"] == [] for v in by_rank.values())
    if env.get("BREAK_SHM"):
        assert not any(v["shm"] for v in by_rank.values())
        assert "shared memory is unavailable" in result.stderr + result.stdout
    if args == TWO_HOSTS and "HOROVOD_HIERARCHICAL_ALLREDUCE" not in env:
        # Hierarchical: the global set's TCP rings run between the ranks at the same local position
        # (sets with one member per host, or uneven ones, take the flat ring).
        groups = {rank: {tuple(g) for g in v["tcp_groups"]} for rank, v in by_rank.items()}
        assert (0, 2) in groups[0] and (1, 3) in groups[1] and (0, 1, 2, 3) not in groups[0]
        gathers = {tuple(g) for g in by_rank[0]["tcp_gather_groups"]}
        assert (0, 2) in gathers and (0, 1, 2, 3) not in gathers  # asked for: hierarchical allgather
        assert all(v["shm_calls"] > 0 for v in by_rank.values())
    if env.get("HOROVOD_HIERARCHICAL_ALLREDUCE") == "0":
        assert (0, 1, 2, 3) in {tuple(g) for g in by_rank[0]["tcp_groups"]}
        assert (0, 2) not in {tuple(g) for g in by_rank[0]["tcp_groups"]}
    if np_ == 3 and args:  # 2 + 1 ranks: uneven, so the flat ring even though it was asked for
        assert "uneven" in result.stderr + result.stdout
        assert (0, 1, 2) in {tuple(g) for g in by_rank[0]["tcp_groups"]}


def _our_segments(pids: list[int]) -> list[str]:
    return [f for f in os.listdir("/dev/shm") if any(f.startswith(f"khvd-{pid}-") for pid in pids)]


LIFECYCLE = r'''
import gc, os
import numpy as np
import horovod.numpy as hvd
pid = os.getpid()
def files():
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"khvd-{pid}-")]
def mapped():
    with open("/proc/self/maps") as maps:
        return len({line.split()[-2] if line.endswith("(deleted)\n") else line.split()[-1]
                    for line in maps if "/khvd-" in line})
hvd.init()
after_init = files()
hvd.allreduce(np.ones(100_000), name="a")
hvd.grouped_allreduce([np.ones(10), np.ones(300_000)], name="g")
while_running = mapped()
hvd.shutdown()
gc.collect()
after_shutdown, mapped_after_shutdown = files(), mapped()
hvd.init()
hvd.allreduce(np.ones(100_000), name="b")
report(pid=pid, after_init=after_init, after_shutdown=after_shutdown, while_running=while_running,
       mapped_after_shutdown=mapped_after_shutdown, again=files())
'''


@pytest.mark.parametrize("np_,args", [(3, []), (4, TWO_HOSTS)], ids=["one-host", "two-hosts"])
def test_no_segment_outlives_setup_shutdown_or_exit(np_, args):
    result = hvdrun(LIFECYCLE, np=np_, args=args).check()
    for _, values in result.every_rank(np_):
        # Names are unlinked as soon as every peer has mapped them: nothing in /dev/shm, ever after.
        assert values["after_init"] == [] and values["after_shutdown"] == [] and values["again"] == []
        assert values["while_running"] == (3 if np_ == 3 else 2)  # our own segment and our local peers'
        assert values["mapped_after_shutdown"] == 0
    assert _our_segments([v["pid"] for _, v in result.every_rank(np_)]) == []


KILLED = r'''
import os, signal, threading, time
import numpy as np
import horovod.numpy as hvd
VICTIM = int(os.environ["VICTIM"])
hvd.init()
r = hvd.rank()
report(pid=os.getpid())
if r != VICTIM:  # the launcher stops everyone once the victim is gone; report before that
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
hvd.allreduce(np.ones(4), name="warmup")
if r == VICTIM:
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
start = time.monotonic()
try:
    for i in range(10_000):
        hvd.allreduce(np.ones(1 << 21, np.float32), op=hvd.Sum, name=f"big{i % 4}")
    report(error=None)
except hvd.HorovodInternalError as exc:
    report(error=str(exc), seconds=time.monotonic() - start, iterations=i)
time.sleep(1)  # as a real script would be: still unwinding while the others look into what failed
os._exit(3)
'''


@pytest.mark.parametrize("np_,args,victim", [(3, [], 1), (4, TWO_HOSTS, 2)], ids=["one-host", "two-hosts"])
def test_a_rank_killed_mid_allreduce_makes_the_others_fail_fast_naming_it(np_, args, victim):
    result = hvdrun(KILLED, np=np_, args=args, env={"VICTIM": str(victim)}, timeout=120)
    assert result.returncode != 0
    for rank in range(np_):
        if rank == victim:
            continue
        values = result.ranks[rank]
        assert values["error"] is not None, f"rank {rank} did not notice"
        assert f"rank {victim}" in values["error"], values["error"]
        assert values["seconds"] < 5.5
    assert _our_segments([v["pid"] for _, v in result.every_rank(np_)]) == []  # the victim's pid too


def test_auto_choice_of_transport():
    from horovod.common.settings import Topology
    from horovod.common.transport import default_name

    assert default_name(Topology(rank=0, size=1)) == "tcp"
    assert default_name(Topology(rank=1, size=4, local_rank=1, local_size=4)) == "shm"
    assert default_name(Topology(rank=1, size=4, local_rank=1, local_size=2, cross_size=2)) == "hierarchical"
