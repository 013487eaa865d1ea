"""`python -m horovod.benchmarks`: run collective benchmarks for several systems and compare them.

See `horovod.benchmarks` for examples; `--help` for every option.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from horovod.benchmarks import report
from horovod.benchmarks.worker import OPS

WORKER = Path(__file__).with_name("worker.py")
REPO = Path(__file__).resolve().parents[2]  # where our `horovod` package lives (a checkout or site-packages)
LATENCY_SIZES = [4, 4096]
# Transparent huge pages for every buffer of every system, or none: numpy asks the kernel for them
# on its own (arrays of 4 MiB and more), torch only when THP_MEM_ALLOC_ENABLE=1. Huge pages alone
# change a large allreduce's speed (docs/engineering-notes.md), so systems compare on the same memory.
HUGE_PAGES = {"on": "1", "off": "0"}
QUICK_SIZES = [4096, 65536, 1 << 20]


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 4K, 16M, 1G)")
    return int(match[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[match[2].upper()]


def parse_sizes(text: str, step: int = 4) -> list[int]:
    """'4K-256M' (a geometric range, times `step`), '4K,1M,16M' (a list), or one size."""
    if "-" in text:
        low, high = (parse_size(part) for part in text.split("-", 1))
        sizes = []
        while low <= high:
            sizes.append(low)
            low *= step
        return sizes
    return [parse_size(part) for part in text.split(",") if part.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpirun_path() -> str | None:
    here = Path(sys.executable).parent / "mpirun"
    return str(here) if here.exists() else shutil.which("mpirun")


def available_peers(horovod_python: str | None) -> list[str]:
    """The peers `--compare` can run here, in table order."""
    peers = []
    if importlib.util.find_spec("torch") is not None:
        peers.append("gloo")
    if importlib.util.find_spec("mpi4py") is not None and mpirun_path():
        peers.append("mpi")
    if horovod_python:
        peers.append("horovod")
    return peers


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as f:
            memory = f"{int(f.readline().split()[1]) / (1 << 20):.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": memory, "kernel": platform.release(),
            "python": platform.python_version(), "host": platform.node()}


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def command_for(system: str, args: argparse.Namespace, worker_args: list[str], out: str) -> tuple[list[str], dict, int]:
    """(argv, env, number of processes to start ourselves: 0 when a launcher starts them)."""
    env = dict(os.environ)
    if args.huge_pages in HUGE_PAGES:
        env.update(THP_MEM_ALLOC_ENABLE=HUGE_PAGES[args.huge_pages],
                   NUMPY_MADVISE_HUGEPAGE=HUGE_PAGES[args.huge_pages])
    if system.startswith("khorovod"):
        # A PYTHONPATH given (another checkout, to compare) comes first: this one only fills in.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO)) if p)
        if ":" in system:
            env["HOROVOD_CPU_OPERATIONS"] = system.split(":", 1)[1]
        hosts = ["-H", args.hosts] if args.hosts else []
        # khorovod:mpi runs where the MPI path runs: a job mpirun starts (horovodrun --mpi).
        controller = ["--mpi"] if system == "khorovod:mpi" else []
        argv = [sys.executable, "-m", "horovod.runner.launch", *controller, "-np", str(args.np), *hosts,
                sys.executable, str(WORKER), "--system", "khorovod", *worker_args, "--out", out]
        return argv, env, 0
    if system == "horovod":
        python = args.horovod_python
        env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                            if p and Path(p).resolve() != REPO)
        launcher = Path(python).with_name("horovodrun")
        start = [str(launcher)] if launcher.exists() else [python, "-m", "horovod.runner.launch"]
        argv = [*start, "--gloo", "-np", str(args.np), python, str(WORKER), "--system", "horovod",
                *worker_args, "--out", out]
        return argv, env, 0
    if system == "mpi":
        mpirun = mpirun_path()
        extra = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        if args.np > (os.cpu_count() or 1):
            extra.append("--oversubscribe")
        argv = [str(mpirun), "-np", str(args.np), *extra, "--bind-to", "none", *args.mpirun_args.split(),
                sys.executable, str(WORKER), "--system", "mpi", *worker_args, "--out", out]
        return argv, env, 0
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.np))
    argv = [sys.executable, str(WORKER), "--system", "gloo", *worker_args, "--out", out]
    return argv, env, args.np


def run_system(system: str, args: argparse.Namespace, ops: list[str], sizes: list[int], seconds: float,
               max_iters: int) -> dict:
    """One job of `system` over every op and size; its rank 0's report (or the error)."""
    worker_args = ["--ops", ",".join(ops), "--sizes", ",".join(map(str, sizes)), "--seconds", str(seconds),
                   "--max-iters", str(max_iters), "--warmup", str(args.warmup), "--min-iters", str(args.min_iters)]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        argv, env, spawn = command_for(system, args, worker_args, out)
        started = time.monotonic()
        try:
            if spawn:
                procs = [subprocess.Popen(argv, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                         for r in range(spawn)]
                outputs = [p.communicate(timeout=args.timeout)[0] for p in procs]
                code, output = max(p.returncode for p in procs), "\n".join(outputs)
            else:
                proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout)
                code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired:
            if spawn:
                for p in procs:
                    p.kill()
            return {"error": f"{system}: no result within {args.timeout:.0f} s"}
        if code != 0 or not os.path.exists(out):
            tail = "\n".join(output.strip().splitlines()[-15:])
            return {"error": f"{system} failed (exit code {code}):\n{tail}"}
        with open(out) as f:
            result = json.load(f)
        result["wall_s"] = round(time.monotonic() - started, 1)
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m horovod.benchmarks", description="Collective benchmarks, side by side with the peers.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("ops", nargs="+", choices=[*OPS, "latency", "all"],
                        help="collectives to time; 'all' = the five; 'latency' = 4 B and 4 KiB allreduce")
    parser.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--sizes", default="4K-256M", help="'4K-256M' (times --step), or a list '4K,1M,16M'")
    parser.add_argument("--step", type=int, default=4, help="factor between sizes of a range (default 4)")
    parser.add_argument("--compare", action="store_true", help="also run every peer installed here")
    parser.add_argument("--systems", help="comma-separated, instead of --compare: khorovod, khorovod:tcp, "
                                          "khorovod:shm, khorovod:mpi (through horovodrun --mpi), gloo, mpi, horovod")
    parser.add_argument("--horovod-python", help="python of an environment with the reference Horovod")
    parser.add_argument("--hosts", help="horovodrun -H for khorovod (e.g. localhost:2,127.0.0.1:2 to pretend "
                                        "two hosts)")
    parser.add_argument("--mpirun-args", default="", help="extra mpirun arguments")
    parser.add_argument("--huge-pages", choices=[*HUGE_PAGES, "native"], default="off",
                        help="transparent huge pages for every system's buffers (on), for none (off, "
                             "the default: what torch tensors get unless THP_MEM_ALLOC_ENABLE=1), or as "
                             "each library allocates by itself (native: numpy's arrays get them, torch's not)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over all systems, taken in turns")
    parser.add_argument("--seconds", type=float, default=0.5, help="timing budget per op, size and system")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--min-iters", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900, help="seconds a system's job may take")
    parser.add_argument("--quick", action="store_true", help="a few small sizes, short timings: checks it works")
    parser.add_argument("--out-dir", default="bench-results", help="where results.json and busbw.png go")
    args = parser.parse_args(argv)

    ops = list(OPS) if "all" in args.ops else [op for op in args.ops if op != "latency"]
    sizes = QUICK_SIZES if args.quick else parse_sizes(args.sizes, args.step)
    seconds = 0.05 if args.quick else args.seconds
    if args.quick:
        args.warmup, args.min_iters = 1, 3
    if args.systems:
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    else:
        systems = ["khorovod"] + (available_peers(args.horovod_python) if args.compare else [])
    if "horovod" in systems and not args.horovod_python:
        parser.error("the 'horovod' system needs --horovod-python")
    os.makedirs(args.out_dir, exist_ok=True)
    info = {"command": " ".join(["python -m horovod.benchmarks", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine(), "np": args.np, "systems": systems, "huge_pages": args.huge_pages,
            "load_before": load(), "runs": [], "errors": []}
    plans = ([(ops, sizes, seconds, 2000)] if ops else []) + \
            ([(["allreduce"], LATENCY_SIZES, 0.05 if args.quick else 2.0, 200 if args.quick else 20000)]
             if "latency" in args.ops else [])
    for round_ in range(args.repeat):
        for kind, (plan_ops, plan_sizes, plan_seconds, max_iters) in enumerate(plans):
            for system in systems:
                label = "latency" if plan_sizes is LATENCY_SIZES else "bandwidth"
                print(f"[{round_ + 1}/{args.repeat}] {system}: {label} {','.join(plan_ops)} "
                      f"({len(plan_sizes)} sizes, {args.np} ranks, load {load()})", flush=True)
                result = run_system(system, args, plan_ops, plan_sizes, plan_seconds, max_iters)
                if "error" in result:
                    print(result["error"], flush=True)
                    info["errors"].append(result["error"])
                    continue
                for problem in result.get("errors", []):
                    print(f"  {system}: {problem}", flush=True)
                info["runs"].append({"system": system, "round": round_, "kind": label, "report": result})
    info["load_after"] = load()
    summaries = {kind: report.summarize(r for r in info["runs"] if r["kind"] == kind)
                 for kind in ("bandwidth", "latency")}
    info["summary"] = summaries
    print()
    for op, per_system in summaries["bandwidth"].items():
        print(report.table(op, per_system, args.np), end="\n\n")
    for op, per_system in summaries["latency"].items():
        print(report.table("latency (allreduce)", per_system, args.np, latency=True), end="\n\n")
    out = os.path.join(args.out_dir, "results.json")
    with open(out, "w") as f:
        json.dump(info, f, indent=1)
    print(f"results: {out}")
    tables = [f"### {op}, {args.np} ranks\n\n{report.markdown(op, per_system, args.np)}"
              for op, per_system in summaries["bandwidth"].items()]
    tables += [f"### latency (allreduce), {args.np} ranks\n\n{report.markdown(op, per_system, args.np, latency=True)}"
               for op, per_system in summaries["latency"].items()]
    if tables:
        with open(os.path.join(args.out_dir, "tables.md"), "w") as f:
            f.write("\n\n".join(tables) + "\n")
        print(f"markdown tables: {os.path.join(args.out_dir, 'tables.md')}")
    if summaries["bandwidth"]:
        m = info["machine"]
        title = (f"{m['cpu']}, {m['cores']} cores; {args.np} ranks; huge pages {args.huge_pages}; "
                 f"load {info['load_before']} -> {info['load_after']}")
        print(report.plot(summaries["bandwidth"], args.np, os.path.join(args.out_dir, "busbw.png"), title))
    return 1 if info["errors"] and not info["runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
