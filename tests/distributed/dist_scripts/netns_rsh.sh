#!/bin/sh
# Open MPI's rsh agent for hosts that are network namespaces on this machine (tests/distributed/netns_hosts.py):
# called as "netns_rsh.sh [ssh options] HOST COMMAND...", it runs COMMAND inside the namespace named HOST.
while [ $# -gt 0 ]; do
    case "$1" in
        -*) shift ;;
        *) break ;;
    esac
done
host="$1"
shift
exec ip netns exec "$host" /bin/sh -c "$*"
