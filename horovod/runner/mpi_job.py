"""A job that mpirun starts: `horovodrun --mpi` and `horovod.run(use_mpi=True)`.

mpirun places and starts every rank and ends the job when one fails, so no failure policy of ours
runs here (compare `horovod.runner.job`). Ranks find their slot from MPI. The launcher still serves
its rendezvous store, only as the way `horovod.run` hands a function to the ranks and gets their
results back, and where a rank records why it failed (`failures/<rank>`); the store's address and
the job's secret reach the ranks in the environment mpirun exports (`-x`), never on a command line.
"""

from __future__ import annotations

import argparse
import os

from horovod.runner.hosts import HostInfo
from horovod.runner.job import Job, JobSpec
from horovod.runner.launchers import SECRET_KEY_ENV, mpirun
from horovod.runner.report import JobResult, WorkerFailure, exit_status


class MpiRunJob(Job):
    """Use as a context manager, as `Job`: the store lives as long as the `with` block."""

    def __init__(self, spec: JobSpec, hosts: tuple[HostInfo, ...], args: argparse.Namespace) -> None:
        super().__init__(spec)
        self.hosts = hosts
        self.mpi_args, self.binding_args, self.tcp_only = args.mpi_args, args.binding_args, bool(args.tcp_flag)

    def mpi_job(self, env_names: tuple[str, ...]) -> mpirun.MpiJob:
        return mpirun.MpiJob(num_proc=len(self.spec.slots), hosts=self.hosts, command=self.spec.command,
                             env_names=env_names, mpi_args=self.mpi_args, binding_args=self.binding_args,
                             nics=self.spec.nics, tcp_only=self.tcp_only, ssh_port=self.spec.ssh_port,
                             ssh_identity_file=self.spec.ssh_identity_file)

    def run(self) -> JobResult:
        """Run mpirun until it exits; a failure names the rank that recorded its exception, if any."""
        assert self.store is not None, "use the job as a context manager"
        env = {**os.environ, **self.spec.extra_env, "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address,
               "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port), SECRET_KEY_ENV: self._secret.hex(),
               "HOROVOD_BOOTSTRAP": "mpi"}  # whatever other launcher's variables the ranks inherit
        env_names = tuple(sorted({*mpirun.exportable(env), SECRET_KEY_ENV}))
        returncode = mpirun.run(self.mpi_job(env_names), env, self.spec.output, self.spec.verbose)
        if returncode == 0:
            return JobResult(0)
        reports = sorted(int(key) for key in self.store.keys("failures") if key.isdigit())
        reason = f"mpirun failed with {'exit code' if returncode > 0 else 'signal'} {abs(returncode)}"
        if not reports:
            return JobResult(exit_status(returncode), reason=reason)
        slot = self.spec.slots[reports[0]]
        report = self.store.get("failures", str(slot.rank))
        return JobResult(exit_status(returncode), WorkerFailure(
            slot.rank, slot.hostname, slot.local_rank, returncode,
            reported_exception=report.decode("utf-8", "replace") if report else None,
            other_reporting_ranks=tuple(reports[1:]), reason=reason))
