"""`horovodrun`: command-line flags -> validated settings -> a job (see `horovod.runner.job`).

The flow reads top to bottom: `parse_args` (the flags of `horovod.runner.flags`, then the YAML
config file for anything not given on the command line), `validate`, `plan_job` (hosts, slots
and the `HOROVOD_*` variables, all pure), and `Job.run` which starts the workers and applies
the failure policy.
`horovod.runner.run` reuses every step, with a different command.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Iterable, Sequence

from horovod.common import logging as hvd_logging
from horovod.common.settings import DEFAULT_FAILURE_DETECTION_SECONDS, env_float, scaled_timeout
from horovod.runner import check_build, config_file, env_builder, noop_flags
from horovod.runner.elastic import setup as elastic_setup
from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.flags import ELASTIC_DESTS, make_parser
from horovod.runner.hosts import HostInfo, get_host_assignments, parse_hostfile, parse_hosts, slurm_allocation
from horovod.runner.job import Job, JobSpec
from horovod.runner.launchers import OutputOptions
from horovod.runner.mpi_job import MpiRunJob
from horovod.runner.report import JobResult, format_result

log = logging.getLogger("horovod.runner")

_UNSET = object()


def _given_dests(parser: argparse.ArgumentParser, argv: Sequence[str], dests: Iterable[str]) -> set[str]:
    """Which of `dests` the command line sets explicitly (argparse keeps attributes it finds)."""
    probe = argparse.Namespace(**{dest: _UNSET for dest in dests})
    parser.parse_args(argv, probe)
    return {dest for dest, value in vars(probe).items() if value is not _UNSET and dest in dests}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line and merge the config file; exits (status 2) on a usage error."""
    parser = make_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.config_file:
        explicit = _given_dests(parser, argv, config_file.CONFIG_DESTS)
        try:
            config = config_file.load(args.config_file)
            config_file.apply(args, config, explicit, source=args.config_file)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
    if args.num_proc is None and not args.check_build:
        parser.error("-np/--num-proc is required: how many worker processes to start")
    return args


def default_args() -> argparse.Namespace:
    """Every dest at its default: the starting point of `horovod.runner.run`."""
    return make_parser().parse_args([])


def validate(args: argparse.Namespace) -> None:
    """Refuse what this launcher cannot do, with a message that says what to do instead."""
    if elastic_setup.is_elastic(args):
        elastic_setup.validate(args)
    else:
        used = [flag for dest, flag in ELASTIC_DESTS.items() if getattr(args, dest, None) is not None]
        if used:
            raise ValueError(f"{', '.join(used)} only apply to an elastic job: add --min-np, --max-np "
                             "or --host-discovery-script")
    if getattr(args, "use_gloo", None) and getattr(args, "use_mpi", None):
        raise ValueError("choose one controller: Gloo or MPI, not both")
    if elastic_setup.is_elastic(args) and getattr(args, "use_mpi", None):
        # As in Horovod: an elastic job always runs with Horovod's own launcher.
        log.warning("--mpi does not apply to an elastic job: workers come and go, which one mpirun cannot "
                    "follow, so this elastic job runs with horovodrun's own launcher (as with --gloo)")
    if getattr(args, "use_jsrun", None):
        raise NotImplementedError("jsrun controller not available: use --gloo (the default)")
    if args.hosts and args.hostfile:
        raise ValueError("give the hosts either with -H/--hosts or with --hostfile, not both")
    if args.num_proc is None:
        raise ValueError("the number of processes (-np/--num-proc) is required")
    for name in ("start_timeout", "ssh_port"):
        value = getattr(args, name, None)
        if value is not None and value < 0:
            raise ValueError(f"{name}={value} must be >= 0")
    env_builder.validate(args)
    for dest, flag in (("mpi_args", "--mpi-args"), ("binding_args", "--binding-args"), ("tcp_flag", "--tcp")):
        if getattr(args, dest, None) and not uses_mpirun(args):
            log.warning("%s only applies to the MPI controller (--mpi); ignored with Gloo", flag)


def uses_mpirun(args: argparse.Namespace) -> bool:
    """Whether mpirun starts the job: --mpi, unless the job is elastic (then our launcher does)."""
    return bool(getattr(args, "use_mpi", None)) and not elastic_setup.is_elastic(args)


def host_list(args: argparse.Namespace) -> list[HostInfo]:
    """The hosts of the job: -H, else --hostfile, else the Slurm allocation we run in, else this
    machine with -np slots."""
    if args.hosts:
        return parse_hosts(args.hosts)
    if args.hostfile:
        return parse_hostfile(args.hostfile)
    return slurm_allocation(os.environ) or [HostInfo("localhost", args.num_proc)]


def plan_job(args: argparse.Namespace, command: Sequence[str]) -> JobSpec:
    """Everything decided before a process starts: slots, the worker environment, output."""
    if not command:
        raise ValueError("no command given: put the program to run after the flags, "
                         "e.g. horovodrun -np 2 python train.py")
    slots = [] if args.host_discovery_script else get_host_assignments(host_list(args), args.num_proc)
    extra_env = env_builder.horovod_env(args)
    # What the workers will see: a flag wins, else the launcher's own environment, else the default.
    worker_view = {**os.environ, **extra_env}
    return JobSpec(
        command=tuple(command),
        slots=tuple(slots),
        extra_env=extra_env,
        # The workers compute the same default from HOROVOD_SIZE and HOROVOD_LOCAL_SIZE.
        start_timeout=env_float(worker_view, "HOROVOD_START_TIMEOUT",
                                scaled_timeout(args.num_proc, len({slot.hostname for slot in slots}) or 1)),
        failure_detection_seconds=env_float(worker_view, "HOROVOD_FAILURE_DETECTION_SECONDS",
                                            DEFAULT_FAILURE_DETECTION_SECONDS),
        output=OutputOptions(
            prefix_timestamp=bool(args.prefix_output_with_timestamp),
            output_dir=args.output_filename,
        ),
        ssh_port=args.ssh_port,
        ssh_identity_file=args.ssh_identity_file,
        nics=tuple(args.nics or ()),
        verbose=bool(args.verbose),
    )


def make_job(args: argparse.Namespace, spec: JobSpec) -> Job:
    """The job a command line asks for: started by mpirun (`--mpi`), a fixed one, or an elastic one
    (`horovod.runner.elastic`)."""
    if uses_mpirun(args):
        return MpiRunJob(spec, tuple(host_list(args)), args)
    if not elastic_setup.is_elastic(args):
        return Job(spec)
    job_spec, elastic = elastic_setup.elastic_job(args, spec)
    return ElasticDriver(job_spec, elastic)


def _run(args: argparse.Namespace) -> int:
    """Run a parsed command line; returns horovodrun's exit status."""
    if args.check_build:
        print(check_build.report())
        return 0
    try:
        validate(args)
        spec = plan_job(args, args.command)
        job = make_job(args, spec)
    except (ValueError, NotImplementedError, OSError, RuntimeError) as exc:
        print(f"horovodrun: error: {exc}", file=sys.stderr)
        return 2
    noop_flags.warn_noop_flags(args)
    try:
        with job:
            result: JobResult = job.run()
    except FileNotFoundError as exc:
        print(f"horovodrun: error: cannot start {spec.command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    except (ValueError, OSError) as exc:  # mpirun missing, or one we cannot drive
        print(f"horovodrun: error: {exc}", file=sys.stderr)
        return 2
    message = format_result(result)
    if message:
        print(message, file=sys.stderr, flush=True)
    return result.exit_code


def run_commandline(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `horovodrun` console script."""
    args = parse_args(argv)
    hvd_logging.configure((args.log_level or "WARNING").lower(), args.log_with_timestamp is False)
    sys.exit(_run(args))


if __name__ == "__main__":
    run_commandline()
