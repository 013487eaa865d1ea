"""Every flag of `horovodrun`: the argparse parser, with a help line for each flag.

Apart from `horovod.runner.launch` (the flow from flags to a job) because it is a long
declaration that reads best on its own; `horovod.run` builds its defaults from the same parser.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from horovod.runner import noop_flags
from horovod.version import __khorovod_version__, __version__

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")

#: argparse dests of the elastic flags, with the flag to name in errors.
ELASTIC_DESTS = {
    "min_num_proc": "--min-np",
    "max_num_proc": "--max-np",
    "host_discovery_script": "--host-discovery-script",
    "slots": "--slots-per-host",
    "elastic_timeout": "--elastic-timeout",
    "reset_limit": "--reset-limit",
    "cooldown_range": "--blacklist-cooldown-range",
}


class _CommaListAction(argparse.Action):
    """`--network-interfaces eth0,eth1` and repeated `--network-interface eth0` both add NICs."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        current = getattr(namespace, self.dest, None)
        nics = list(current) if isinstance(current, list) else []
        nics += [nic.strip() for nic in str(values).split(",") if nic.strip()]
        setattr(namespace, self.dest, nics)


class _VersionAction(argparse.Action):
    """`-v`: Horovod's API level alone on stdout, as Horovod prints it (scripts parse it), and
    khorovod's own release on stderr, for the human reading it."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(__version__)
        print(f"khorovod {__khorovod_version__}, implementing the Horovod {__version__} API",
              file=sys.stderr)
        parser.exit()


def _add_switch(group: Any, on: str, off: str, on_help: str, off_help: str) -> None:
    """A flag and its negation on one dest that stays None unless one of them is given.

    None means "not set": no variable is exported and a config file may still set it.
    """
    dest = on.lstrip("-").replace("-", "_")
    group.add_argument(on, dest=dest, action="store_true", default=None, help=on_help)
    group.add_argument(off, dest=dest, action="store_false", help=off_help)


def make_parser() -> argparse.ArgumentParser:
    """Every flag of `horovodrun`, each with a help line that says what it does and its default."""
    parser = argparse.ArgumentParser(
        prog="horovodrun",
        description="Launch a Horovod training job: start one worker process per slot, on this "
        "machine or over ssh, give each its rank through HOROVOD_* environment variables, "
        "forward their output with a [rank] prefix, and stop the whole job as soon as one "
        "worker fails.",
        epilog="Example: horovodrun -np 4 -H server1:2,server2:2 python train.py",
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("-v", "--version", action=_VersionAction,
        help="Print the Horovod API version implemented (on stdout) and khorovod's own version "
        "(on stderr), then exit.")
    add("-np", "--num-proc", dest="num_proc", type=int, metavar="N",
        help="Number of worker processes (ranks) to start. Required unless --check-build.")
    add("-cb", "--check-build", action="store_true",
        help="Print which frameworks, controllers and tensor operations this installation "
        "supports, then exit.")
    add("--disable-cache", action="store_true",
        help="Do not reuse the cached results of the ssh and network checks.")
    add("--start-timeout", type=int, metavar="SECONDS",
        help="Every rank must call hvd.init() within this many seconds of the first rank that did, "
        "or the job is stopped naming the late ranks; also bounds ssh's connection to remote hosts "
        "(exported as HOROVOD_START_TIMEOUT). Default: $HOROVOD_START_TIMEOUT, else 30, or 1 s per host "
        "plus 0.1 s per rank when that is longer.")
    add("--network-interfaces", dest="nics", action=_CommaListAction,
        help="Comma-separated network interfaces (e.g. 'eth0,ens3') to use between hosts; each host "
        "uses those of them it has, so hosts whose names differ can be listed together "
        "(HOROVOD_GLOO_IFACE, NCCL_SOCKET_IFNAME). Default: each host offers all its addresses and "
        "peers keep the first that answers, those on a shared network tried first.")
    add("--network-interface", dest="nics", action=_CommaListAction,
        help="One network interface to use; repeat the flag for several. Same effect as "
        "--network-interfaces.")
    add("--output-filename", metavar="DIR",
        help="Also write each rank's output to DIR/rank.<rank>/stdout and .../stderr (rank "
        "zero-padded to the width of the largest rank). Output still goes to the console. "
        "Default: console only.")
    add("--verbose", action="store_true",
        help="Print what the launcher does: the slot of every rank, the rendezvous address, "
        "and when it stops workers. Default: off.")
    add("--config-file", metavar="FILE",
        help="YAML file with tuning settings (see docs/running.md). Flags given on the command "
        "line win over values in the file.")
    add("-p", "--ssh-port", type=int, metavar="PORT",
        help="Port of the ssh server on remote hosts. Default: ssh's own default (22).")
    add("-i", "--ssh-identity-file", metavar="FILE",
        help="Private key ssh uses to log in to remote hosts. Default: ssh's own choice.")

    group = parser.add_argument_group("tunable parameter arguments")
    add = group.add_argument
    add("--fusion-threshold-mb", type=int, metavar="MB",
        help="Size of the buffer that fuses small tensors into one collective, in MiB "
        "(HOROVOD_FUSION_THRESHOLD, in bytes). 0 disables fusion. Default: 128.")
    add("--cycle-time-ms", type=float, metavar="MS",
        help="Milliseconds the background thread waits between negotiation cycles "
        "(HOROVOD_CYCLE_TIME). Default: 1.")
    add("--cache-capacity", type=int, metavar="N",
        help="Number of negotiation responses kept in the response cache "
        "(HOROVOD_CACHE_CAPACITY). 0 disables the cache. Default: 1024.")
    _add_switch(group, "--hierarchical-allreduce", "--no-hierarchical-allreduce",
                "Allreduce within each host first, then across hosts "
                "(HOROVOD_HIERARCHICAL_ALLREDUCE=1). Default: on when the ranks span several "
                "hosts with the same number on each.",
                "Pin hierarchical allreduce off (HOROVOD_HIERARCHICAL_ALLREDUCE=0).")
    _add_switch(group, "--hierarchical-allgather", "--no-hierarchical-allgather",
                "Allgather within each host first, then across hosts "
                "(HOROVOD_HIERARCHICAL_ALLGATHER=1). Default: off.",
                "Pin hierarchical allgather off (HOROVOD_HIERARCHICAL_ALLGATHER=0).")
    _add_switch(group, "--torus-allreduce", "--no-torus-allreduce",
                "Use the two-dimensional torus allreduce of the NCCL backend "
                "(HOROVOD_TORUS_ALLREDUCE=1). Default: off.",
                "Pin the torus allreduce off (HOROVOD_TORUS_ALLREDUCE=0).")

    group = parser.add_argument_group("autotune arguments")
    add = group.add_argument
    _add_switch(group, "--autotune", "--no-autotune",
                "Search for the best fusion threshold, cycle time and hierarchical settings while "
                "training runs (HOROVOD_AUTOTUNE=1). The other --autotune-* flags only apply with "
                "it. Default: off.",
                "Pin autotuning off (HOROVOD_AUTOTUNE=0), e.g. over a config file that enables it.")
    add("--autotune-log-file", metavar="FILE",
        help="CSV file where autotune records every sample it tried (HOROVOD_AUTOTUNE_LOG). "
        "Default: no log.")
    add("--autotune-warmup-samples", type=int, metavar="N",
        help="Samples autotune discards at the start, before measuring "
        "(HOROVOD_AUTOTUNE_WARMUP_SAMPLES). Default: 3.")
    add("--autotune-steps-per-sample", type=int, metavar="N",
        help="Training steps measured for each sample of a setting "
        "(HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE). Default: 10.")
    add("--autotune-bayes-opt-max-samples", type=int, metavar="N",
        help="How many samples the Bayesian optimisation may take before it settles "
        "(HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES). Default: 20.")
    add("--autotune-gaussian-process-noise", type=float, metavar="NOISE",
        help="Noise assumed in the measurements, between 0 and 1 "
        "(HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE). Default: 0.8.")

    group = parser.add_argument_group(
        "elastic arguments", "Any of --min-np, --max-np or --host-discovery-script makes the job "
        "elastic: it survives failed workers and follows the hosts discovery reports (docs/elastic.md).")
    add = group.add_argument
    add("--min-np", "--min-num-proc", dest="min_num_proc", type=int, metavar="N",
        help="Fewest processes an elastic job may run with. Default: -np.")
    add("--max-np", "--max-num-proc", dest="max_num_proc", type=int, metavar="N",
        help="Most processes an elastic job may grow to. Default: no limit.")
    add("--slots-per-host", dest="slots", type=int, metavar="N",
        help="Slots of a discovered host whose line names no slot count.")
    add("--elastic-timeout", type=int, metavar="SECONDS",
        help="Seconds an elastic job waits for enough slots after hosts change. "
        "Default: $HOROVOD_ELASTIC_TIMEOUT, else 600.")
    add("--reset-limit", type=int, metavar="N",
        help="How many times an elastic job may re-form before it fails. Default: no limit.")
    add("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2,
        metavar=("MIN", "MAX"),
        help="Seconds a failed host stays excluded, growing from MIN to MAX with each failure. "
        "Default: excluded for good.")

    group = parser.add_argument_group("timeline arguments")
    add = group.add_argument
    add("--timeline-filename", metavar="FILE",
        help="Record a Chrome-trace timeline of every collective to FILE (HOROVOD_TIMELINE). "
        "Default: no timeline.")
    _add_switch(group, "--timeline-mark-cycles", "--no-timeline-mark-cycles",
                "Mark each background cycle in the timeline (HOROVOD_TIMELINE_MARK_CYCLES=1); "
                "only with --timeline-filename. Default: off.",
                "Do not mark cycles (HOROVOD_TIMELINE_MARK_CYCLES=0), e.g. over a config file.")

    group = parser.add_argument_group("stall check arguments")
    add = group.add_argument
    _add_switch(group, "--no-stall-check", "--stall-check",
                "Do not warn about ranks that stop submitting a tensor the others wait for "
                "(HOROVOD_STALL_CHECK_DISABLE=1). Default: the check is on.",
                "Keep the stall check on (HOROVOD_STALL_CHECK_DISABLE=0), e.g. over a config file.")
    add("--stall-check-warning-time-seconds", type=int, metavar="SECONDS",
        help="Seconds a tensor may wait for other ranks before a stall warning names the "
        "missing ranks (HOROVOD_STALL_CHECK_TIME_SECONDS). Default: 60.")
    add("--stall-check-shutdown-time-seconds", type=int, metavar="SECONDS",
        help="Seconds of stall after which the job shuts down; must exceed the warning time "
        "to matter (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS). Default: 0, never.")

    group = parser.add_argument_group("library arguments")
    add = group.add_argument
    _add_switch(group, "--mpi-threads-disable", "--no-mpi-threads-disable",
                "Ask MPI for single-threaded support only (HOROVOD_MPI_THREADS_DISABLE=1). Default: off.",
                "Let MPI use threads (HOROVOD_MPI_THREADS_DISABLE=0), e.g. over a config file.")
    add("--mpi-args", metavar="ARGS",
        help="Extra arguments for mpirun. MPI controller only; ignored with Gloo.")
    add("--tcp", dest="tcp_flag", action="store_true", default=None,
        help="Use TCP only, never InfiniBand: sets NCCL_IB_DISABLE=1 and, with --mpi, makes Open MPI "
        "use TCP alone (--mca btl tcp,self). Default: off.")
    add("--binding-args", metavar="ARGS",
        help="Process binding arguments for mpirun. MPI controller only; ignored with Gloo.")
    add("--num-nccl-streams", type=int, metavar="N",
        help="CUDA streams NCCL operations run on (HOROVOD_NUM_NCCL_STREAMS). Default: 1.")
    add("--thread-affinity", metavar="CORES",
        help="Pin each rank's background thread to a CPU core: one core id, or a comma list "
        "with one id per local rank (HOROVOD_THREAD_AFFINITY). Default: not pinned.")
    add("--gloo-timeout-seconds", type=int, metavar="SECONDS",
        help="Seconds a rank waits for a peer during a collective before it declares the peer "
        "lost (HOROVOD_GLOO_TIMEOUT_SECONDS). Default: 30, or 1 s per host plus 0.1 s per rank when "
        "that is longer.")

    group = parser.add_argument_group("logging arguments")
    add = group.add_argument
    add("--log-level", choices=LOG_LEVELS,
        help="Lowest level of Horovod messages shown by the workers and this launcher "
        "(HOROVOD_LOG_LEVEL). Default: WARNING.")
    add("--log-without-timestamp", "--log-hide-timestamp", dest="log_with_timestamp",
        action="store_false", default=None,
        help="Leave the time out of Horovod's log lines (HOROVOD_LOG_HIDE_TIME=1); "
        "--log-hide-timestamp is the old spelling. Default: with time.")
    add("--log-with-timestamp", "--no-log-hide-timestamp", dest="log_with_timestamp", action="store_true",
        help="Keep the time in Horovod's log lines (HOROVOD_LOG_HIDE_TIME=0); "
        "--no-log-hide-timestamp is the old spelling.")
    add("-prefix-timestamp", "--prefix-output-with-timestamp", action="store_true",
        help="Start every forwarded output line with the time it was received. Default: off.")

    group = parser.add_argument_group("host arguments")
    hosts = group.add_mutually_exclusive_group()
    hosts.add_argument(
        "-H", "--hosts", metavar="HOSTS",
        help="Hosts and their slots, e.g. 'server1:2,server2:4'. Ranks fill the hosts in this "
        "order, all slots of one host before the next. Default: localhost:<np>.")
    hosts.add_argument(
        "-hostfile", "--hostfile", metavar="FILE",
        help="File with one '<hostname> slots=<n>' line per host ('#' comments allowed); an "
        "alternative to -H.")
    hosts.add_argument(
        "--host-discovery-script", metavar="SCRIPT",
        help="Executable printing the current 'host[:slots]' lines, run about once a second; "
        "makes the job elastic.")

    group = parser.add_argument_group("controller arguments")
    controllers = group.add_mutually_exclusive_group()
    controllers.add_argument(
        "--gloo", dest="use_gloo", action="store_true", default=None,
        help="Start the workers with our own launcher and rendezvous (the default).")
    controllers.add_argument(
        "--mpi", dest="use_mpi", action="store_true", default=None,
        help="Launch the job through mpirun (Open MPI, MPICH or Intel MPI, detected); ranks "
        "meet and, unless HOROVOD_CPU_OPERATIONS says otherwise, exchange data through MPI.")
    controllers.add_argument(
        "--jsrun", dest="use_jsrun", action="store_true", default=None,
        help="Launch through IBM jsrun on LSF clusters (not available).")

    parser.add_argument(
        "command", nargs=argparse.REMAINDER,
        help="The program every worker runs, with its arguments, e.g. 'python train.py'.")
    noop_flags.mark_help(parser)
    return parser
