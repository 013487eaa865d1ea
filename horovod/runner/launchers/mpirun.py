"""`horovodrun --mpi`: the whole job as one `mpirun` command, as Horovod builds it.

mpirun starts every rank itself and ends the job when one fails, so this is not a per-worker
`Launcher` (see `base`): it builds one command line (a pure function of the flags, the hosts and
the MPI flavour) and runs it. Workers find their slot from MPI (`horovod.common.bootstrap.mpi`),
so none of our rendezvous variables travel; the `HOROVOD_*` settings and the rest of the
launcher's environment are exported to every rank (`-x` for Open MPI, `-genvlist` for MPICH), as
Horovod does. Every `horovodrun` flag that Horovod hands to mpirun reaches it in that MPI's own
spelling: ssh's port and key (Open MPI's `plm_rsh_args`, MPICH's `HYDRA_LAUNCHER_EXTRA_ARGS`,
Intel MPI's `-bootstrap-exec-args`), the interfaces, and Open MPI's settings for 64 hosts or more.
The output flags are honoured by `tagged_output`, the same way for every flavour.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Mapping

from horovod.runner.hosts import HostInfo
from horovod.runner.launchers.base import OutputOptions
from horovod.runner.launchers.tagged_output import TaggedOutput
from horovod.runner.launchers.orphans import parent_death_signal

OPEN_MPI, MPICH, INTEL_MPI = "openmpi", "mpich", "intelmpi"
#: From this many hosts on, Open MPI starts its daemons from mpirun alone and all at once (as
#: Horovod does): its tree spawn goes through every host's own ssh setup, which large clusters lack.
LARGE_CLUSTER_HOSTS = 64
_EXPORTABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables that describe the launcher's own shell or an enclosing MPI/Slurm job, never a rank's.
_NOT_EXPORTED = ("OMPI_", "PMI_", "PMIX_", "PRTE_", "HYDRA_", "SLURM_", "BASH_FUNC", "_")


@dataclass(frozen=True)
class MpiJob:
    """What the command line is built from."""

    num_proc: int
    hosts: tuple[HostInfo, ...]
    command: tuple[str, ...]
    env_names: tuple[str, ...]  # exported to every rank
    mpi_args: str | None = None
    binding_args: str | None = None
    nics: tuple[str, ...] = ()
    tcp_only: bool = False
    ssh_port: int | None = None
    ssh_identity_file: str | None = None

    def ssh_args(self) -> str:
        """The options mpirun passes to ssh when it starts its daemons on other hosts."""
        args = ([f"-p {self.ssh_port}"] if self.ssh_port else []) + \
            ([f"-i {shlex.quote(self.ssh_identity_file)}"] if self.ssh_identity_file else [])
        return " ".join(args)


def find_mpirun() -> str:
    """The mpirun next to this Python (the mpi4py wheels put it there), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    found = beside if os.access(beside, os.X_OK) else shutil.which("mpirun")
    if found is None:
        raise ValueError("horovodrun --mpi needs mpirun: install an MPI (pip install 'khorovod[mpi]' brings "
                         "Open MPI) or put its bin directory on PATH")
    return found


def flavor(version_text: str) -> str:
    """Which MPI an `mpirun --version` output comes from; ValueError for one we cannot drive."""
    if "Open MPI" in version_text or "OpenRTE" in version_text or "Open RTE" in version_text:
        return OPEN_MPI
    if "Intel(R) MPI" in version_text:
        return INTEL_MPI
    if "HYDRA" in version_text or "MPICH" in version_text:
        return MPICH
    raise ValueError(f"mpirun is neither Open MPI, MPICH nor Intel MPI (its --version said: "
                     f"{version_text.strip()[:200]!r})")


def detect_flavor(mpirun: str) -> str:
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30,
                         stdin=subprocess.DEVNULL)
    return flavor(out.stdout + out.stderr)


def exportable(env: Mapping[str, str]) -> tuple[str, ...]:
    """The names of `env` that go to every rank."""
    return tuple(sorted(name for name in env if _EXPORTABLE.match(name) and not name.startswith(_NOT_EXPORTED)))


def build_command(mpirun: str, kind: str, job: MpiJob, as_root: bool) -> list[str]:
    """The mpirun command line for `job` on an MPI of flavour `kind`."""
    hosts = ",".join(f"{h.hostname}:{h.slots}" for h in job.hosts)
    dash = "--" if kind == OPEN_MPI else "-"  # Open MPI 5 wants long options; Hydra has only short ones
    binding = (shlex.split(job.binding_args) if job.binding_args
               else [f"{dash}bind-to", "none", f"{dash}map-by", "slot"])
    if kind == OPEN_MPI:
        argv = [mpirun, *(["--allow-run-as-root"] if as_root else []), "--tag-output", "-np", str(job.num_proc),
                "--host", hosts, *binding]
        if job.num_proc > (os.cpu_count() or 1):
            # More ranks than cores: --host names the slots, so Open MPI does not see the
            # oversubscription itself and its waits spin without yielding; each wait then lasts a
            # scheduler time slice (a 4 KiB allreduce of 4 ranks on 2 cores: 90 ms, 34 us yielding).
            argv += ["--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
        if job.tcp_only:
            argv += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
        if job.nics:
            argv += ["--mca", "btl_tcp_if_include", ",".join(job.nics)]
        if job.ssh_args():
            argv += ["--mca", "plm_rsh_args", job.ssh_args()]
        if len(job.hosts) >= LARGE_CLUSTER_HOSTS:
            argv += ["--mca", "plm_rsh_no_tree_spawn", "true", "--mca", "plm_rsh_num_concurrent", str(len(job.hosts))]
        for name in job.env_names:
            argv += ["-x", name]
    else:  # MPICH and Intel MPI share Hydra's flags
        argv = [mpirun, "-l", "-np", str(job.num_proc), "-hosts", hosts, *binding]
        if job.nics:
            argv += ["-iface", job.nics[0]]
        if kind == INTEL_MPI and job.ssh_args():
            argv += ["-bootstrap", "ssh", "-bootstrap-exec-args", job.ssh_args()]
        if job.env_names:
            argv += ["-genvlist", ",".join(job.env_names)]
    return [*argv, *(shlex.split(job.mpi_args) if job.mpi_args else []), *job.command]


def launcher_env(kind: str, job: MpiJob) -> dict[str, str]:
    """Variables for mpirun itself (never exported to the ranks): MPICH's Hydra takes ssh's options
    from HYDRA_LAUNCHER_EXTRA_ARGS, having no flag for them."""
    return {"HYDRA_LAUNCHER_EXTRA_ARGS": job.ssh_args()} if kind == MPICH and job.ssh_args() else {}


def run(job: MpiJob, env: Mapping[str, str], output: OutputOptions = OutputOptions(), verbose: bool = False) -> int:
    """Run the job through mpirun with `env`, its output shown as `output` asks; mpirun's exit status
    (it reports a failed rank itself). `verbose` prints the command line first, as Horovod does."""
    mpirun = find_mpirun()
    kind = detect_flavor(mpirun)
    argv = build_command(mpirun, kind, job, as_root=os.geteuid() == 0)
    if verbose:
        print(f"horovodrun: {shlex.join(argv)}", file=sys.stderr, flush=True)
    # Should horovodrun die, mpirun gets the SIGTERM it would from a user and tears its ranks down
    # by its own rules; the ranks themselves are mpirun's to stop, not ours.
    proc = subprocess.Popen(argv, env={**env, **launcher_env(kind, job)}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=parent_death_signal(signal.SIGTERM))
    with TaggedOutput(kind == OPEN_MPI, job.num_proc, output) as forward:
        forward.pump(proc.stdout, proc.stderr)  # type: ignore[arg-type]
    return proc.wait()
