#!/bin/sh
# Open MPI's rsh agent for hosts that are network namespaces on this machine (tests/distributed/netns_hosts.py):
# called as "netns_rsh.sh [ssh options] HOST COMMAND...", it runs COMMAND inside the namespace named HOST.
# Each host gets its own Open MPI session directory, ${TMPDIR:-/tmp}/HOST (netns_hosts removes it), as real hosts
# have: the namespaces share one filesystem and one hostname, and daemons sharing /tmp/ompi.<hostname>.<uid> raced
# there (one removed the job's directory while another made its own in it; a topology file one daemon mapped was
# rewritten by another: segfault). The daemon died silently, detached from mpirun, and the launch hung.
while [ $# -gt 0 ]; do
    case "$1" in
        -*) shift ;;
        *) break ;;
    esac
done
host="$1"
shift
exec ip netns exec "$host" env OMPI_MCA_orte_tmpdir_base="${TMPDIR:-/tmp}/$host" /bin/sh -c "$*"
