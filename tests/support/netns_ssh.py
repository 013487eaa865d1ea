"""A stand-in for ssh that maps a host address to its network namespace (`ip netns exec`).

`FAKE_SSH.format(cases=...)` is the script; each case is a line `  <address>) ns=<namespace>;;`.
Used by the network-fault tests and by benchmarks/powersgd_link.py, whose "hosts" are namespaces.
"""

FAKE_SSH = """\
#!/bin/sh
# Stand-in for ssh: skip the options, map the host to its network namespace, run the command there.
while [ $# -gt 2 ]; do
  case "$1" in -o|-p|-i) shift 2;; *) break;; esac
done
case "$1" in
{cases}
  *) echo "ssh: connect to host $1 port 22: No route to host" >&2; exit 255;;
esac
shift
exec ip netns exec "$ns" sh -c "$1"
"""
