#!/usr/bin/env bash
# Install the system packages some tests need, when missing: Debian's Slurm and munge (and the
# PMIx library srun's MPI plugin loads) for tests/slurm, a headless Java runtime for tests/spark
# (pyspark starts a JVM), OpenSSH's server for the launcher tests that ssh into emulated hosts,
# nftables for tests/reliability/test_bad_networks.py (packet loss and partitions between network
# namespaces). Needs root and apt-get; elsewhere those tests skip, saying why.
set -euo pipefail
need=()
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
[ -e /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so ] || [ -e /usr/lib/aarch64-linux-gnu/pmix2/lib/libpmix.so ] \
    || need+=(libpmix-dev)
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v nft >/dev/null 2>&1 || need+=(nftables)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-system-packages: not root or no apt-get: ${need[*]} not installed; tests/slurm," \
         "tests/spark, the sshd tests or tests/reliability/test_bad_networks.py will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq "${need[@]}" >&2
