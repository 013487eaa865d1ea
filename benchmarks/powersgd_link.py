"""PowerSGD on a slow link: two network-namespace "hosts" joined by a 1 Gbit/s link (tc).

    sudo python benchmarks/powersgd_link.py                      # builds the hosts, runs, cleans up
    sudo python benchmarks/powersgd_link.py --rate 1gbit --steps 40 --width 1024 --rank 4

Run as root (it creates two network namespaces, a bridge and veth pairs, and limits each host's
outgoing traffic with a token bucket: `tc qdisc ... tbf rate <rate>`). One rank per host,
started by horovodrun over a stand-in ssh (`ip netns exec`). In the same job, on the same model,
data and optimizer (SGD with momentum), each rank trains in turn with:
- khorovod `DistributedOptimizer`, plain allreduce;
- khorovod `DistributedOptimizer` with `Compression.powersgd`;
- DDP (gloo) with plain allreduce, and DDP with its `powerSGD_hook`;
and rank 0 prints, for each, steps/s after the warm-up and the loss on a held-out batch after
`--steps` steps. Both PowerSGD runs use the same rank, starting phase and compression rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from netns_ssh import FAKE_SSH  # noqa: E402  (the ssh stand-in the network tests use)


def ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def orchestrate(args: argparse.Namespace) -> None:
    """Build the two hosts, run the job across them, tear everything down."""
    tag = str(os.getpid() % 100000)
    subnet = f"10.{100 + os.getpid() % 50}.{os.getpid() % 250}"
    bridge, namespaces = f"kpb{tag}", (f"kpsgd{tag}a", f"kpsgd{tag}b")
    addresses, ports = (f"{subnet}.2", f"{subnet}.3"), (f"kp{tag}a", f"kp{tag}b")
    try:
        ip("link", "add", bridge, "type", "bridge")
        ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        for ns, port, address in zip(namespaces, ports, addresses):
            ip("netns", "add", ns)
            ip("link", "add", port, "type", "veth", "peer", "name", f"{port}i")
            ip("link", "set", f"{port}i", "netns", ns)
            ip("-n", ns, "link", "set", f"{port}i", "name", "eth1")  # the same name on both hosts, for gloo
            ip("link", "set", port, "master", bridge)
            ip("link", "set", port, "up")
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth1")
            ip("-n", ns, "link", "set", "eth1", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth1", "root", "tbf", "rate",
                            args.rate, "burst", "256kb", "latency", "100ms"], check=True)
        with tempfile.TemporaryDirectory() as tmp:
            ssh = Path(tmp) / "ssh"
            ssh.write_text(FAKE_SSH.format(cases="\n".join(f"  {a}) ns={ns};;" for a, ns in zip(addresses, namespaces))))
            ssh.chmod(0o755)
            env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
            env["PATH"] = f"{tmp}{os.pathsep}{env['PATH']}"
            env["GLOO_SOCKET_IFNAME"] = "eth1"
            argv = [sys.executable, "-m", "horovod.runner.launch", "-np", "2", "-H",
                    f"{addresses[0]}:1,{addresses[1]}:1", sys.executable, os.path.abspath(__file__), "--worker",
                    "--master-addr", addresses[0], *sys.argv[1:]]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        lines = [line.split(":", 1)[1] for line in done.stdout.splitlines() if line.startswith("[0]<stdout>:")]
        print("\n".join(lines) if lines else done.stdout + done.stderr)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            sys.exit(done.returncode)
    finally:
        for port in ports:
            ip("link", "del", port, check=False)
        for ns in namespaces:
            ip("netns", "del", ns, check=False)
        ip("link", "del", bridge, check=False)


def work(args: argparse.Namespace) -> None:
    """One rank: the four runs in turn; rank 0 prints the table."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    import horovod.torch as hvd

    torch.set_num_threads(args.threads)
    hvd.init()
    rank = hvd.rank()
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=hvd.size())

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[m for _ in range(args.layers)
                                     for m in (torch.nn.Linear(args.width, args.width), torch.nn.Tanh())])

    teacher = model()
    for p in teacher.parameters():
        p.data.normal_()
    generator = torch.Generator().manual_seed(100 + rank)
    batches = [torch.randn(args.batch_size, args.width, generator=generator) for _ in range(args.steps)]
    held_out = torch.randn(256, args.width, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        targets = [teacher(x) for x in batches]
        held_out_target = teacher(held_out)

    def train(net: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
        stamps = []
        for x, y in zip(batches, targets):
            opt.zero_grad()
            ((net(x) - y) ** 2).mean().backward()
            opt.step()
            stamps.append(time.perf_counter())
        measured = stamps[args.warmup:]
        with torch.no_grad():
            loss = ((net(held_out) - held_out_target) ** 2).mean().item()
        return {"steps_per_s": (len(measured) - 1) / (measured[-1] - measured[0]), "held_out_loss": loss}

    def sgd(params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=args.lr, momentum=0.9)

    psgd = dict(matrix_approximation_rank=args.rank, start_powerSGD_iter=args.start, min_compression_rate=2)
    results = {}
    net = model()
    results["khorovod allreduce"] = train(net, hvd.DistributedOptimizer(sgd(net.parameters()),
                                                                        named_parameters=net.named_parameters()))
    net = model()
    results["khorovod PowerSGD"] = train(net, hvd.DistributedOptimizer(
        sgd(net.parameters()), named_parameters=net.named_parameters(), compression=hvd.Compression.powersgd(**psgd)))
    ddp = torch.nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=args.bucket_mb)
    results["DDP allreduce"] = train(ddp, sgd(ddp.parameters()))
    del ddp
    dist.barrier()
    ddp = torch.nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=args.bucket_mb)
    ddp.register_comm_hook(powerSGD_hook.PowerSGDState(process_group=None, **psgd), powerSGD_hook.powerSGD_hook)
    results["DDP PowerSGD hook"] = train(ddp, sgd(ddp.parameters()))
    every = hvd.allgather_object(results)
    dist.destroy_process_group()
    if rank == 0:
        params = sum(p.numel() for p in model().parameters())
        print(json.dumps({"parameters": params, "rate": args.rate, "steps": args.steps, "warmup": args.warmup,
                          "powersgd": psgd, "rank0": every[0], "rank1": every[1]}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="1gbit", help="tc rate of each host's outgoing link")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10, help="steps not timed (PowerSGD starts compressing by then)")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD's matrix_approximation_rank")
    parser.add_argument("--start", type=int, default=5, help="PowerSGD's start_powerSGD_iter")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bucket-mb", type=float, default=25, help="DDP's bucket_cap_mb")
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--master-addr", help=argparse.SUPPRESS)
    args = parser.parse_args()
    work(args) if args.worker else orchestrate(args)


if __name__ == "__main__":
    main()
