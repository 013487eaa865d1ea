"""From `horovodrun`'s flags to an elastic job: when it is one, its hosts, its limits, its workers' env.

Any of --host-discovery-script, --min-np or --max-np makes a job elastic (as in Horovod). The
hosts come from the discovery script, else from -H/--hostfile (fault tolerance without scaling).
"""

from __future__ import annotations

import argparse
import dataclasses

from horovod.common.settings import Settings
from horovod.runner.elastic.discovery import FixedHosts, HostDiscovery, HostDiscoveryScript
from horovod.runner.elastic.driver import ElasticSpec
from horovod.runner.elastic.plan import plan_round
from horovod.runner.hosts import HostInfo, parse_hostfile, parse_hosts
from horovod.runner.job import JobSpec



def is_elastic(args: argparse.Namespace) -> bool:
    return any(getattr(args, dest, None) is not None
               for dest in ("host_discovery_script", "min_num_proc", "max_num_proc"))


def validate(args: argparse.Namespace) -> None:
    """Refuse contradictory elastic limits before anything starts."""
    min_np = args.min_num_proc if args.min_num_proc is not None else args.num_proc
    for dest, flag in (("min_num_proc", "--min-np"), ("max_num_proc", "--max-np"), ("slots", "--slots-per-host"),
                       ("elastic_timeout", "--elastic-timeout"), ("reset_limit", "--reset-limit")):
        value = getattr(args, dest, None)
        if value is not None and value < (1 if dest in ("min_num_proc", "max_num_proc", "slots") else 0):
            raise ValueError(f"{flag} {value} is out of range")
    if args.max_num_proc is not None and min_np is not None and min_np > args.max_num_proc:
        raise ValueError(f"--min-np {min_np} is larger than --max-np {args.max_num_proc}")
    if args.cooldown_range is not None:
        low, high = args.cooldown_range
        if not 1 <= low <= high:
            raise ValueError(f"--blacklist-cooldown-range {low} {high}: need 1 <= MIN <= MAX (seconds)")


def discovery_of(args: argparse.Namespace) -> HostDiscovery:
    if args.host_discovery_script:
        return HostDiscoveryScript(args.host_discovery_script, args.slots)
    if args.hosts:
        return FixedHosts(parse_hosts(args.hosts))
    if args.hostfile:
        return FixedHosts(parse_hostfile(args.hostfile))
    return FixedHosts([HostInfo("localhost", args.num_proc)])


def elastic_job(args: argparse.Namespace, spec: JobSpec) -> tuple[JobSpec, ElasticSpec]:
    """The job and elastic specs of an elastic command line; the fixed job's `spec` is the base."""
    validate(args)
    discovery = discovery_of(args)
    hosts = discovery.find_available_hosts()  # fails here, before anything starts, if the script does
    min_np = args.min_num_proc if args.min_num_proc is not None else args.num_proc
    timeout = float(args.elastic_timeout) if args.elastic_timeout is not None else \
        Settings.from_env().elastic_timeout
    elastic = ElasticSpec(discovery, min_np, args.max_num_proc, timeout, args.reset_limit,
                          tuple(args.cooldown_range) if args.cooldown_range else None)
    first = plan_round({host.hostname: host.slots for host in hosts}, 1, args.max_num_proc) or []
    return elastic_spec(dataclasses.replace(spec, slots=tuple(first)), timeout), elastic


def elastic_spec(spec: JobSpec, elastic_timeout: float) -> JobSpec:
    """`spec` for the workers of an elastic job: the `store` bootstrap, and a start timeout as long
    as the elastic timeout (survivors wait in init() for the next round while the driver waits for
    slots)."""
    start_timeout = max(spec.start_timeout, elastic_timeout)
    extra_env = {**spec.extra_env, "HOROVOD_ELASTIC": "1", "HOROVOD_BOOTSTRAP": "store",
                 "HOROVOD_START_TIMEOUT": f"{start_timeout:g}"}
    return dataclasses.replace(spec, extra_env=extra_env, start_timeout=start_timeout)
