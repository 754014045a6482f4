#!/usr/bin/env bash
# scripts/cluster.d/netns.sh: a network namespace for the partition test of
# `scripts/cluster --local test` (tests/cluster/faults.py). Needs root and
# iproute2.
#
#   netns.sh setup STATE    creates namespace sw-<pid> with a veth pair
#                           (host 10.213.0.1/30, namespace 10.213.0.2/30) and
#                           prints the host address the namespace reaches
#   netns.sh down STATE     cuts the link (the partition)
#   netns.sh up STATE       restores it
#   netns.sh cleanup STATE  removes the namespace and the veth pair
set -euo pipefail
cmd=$1 state=$2
name_file="$state/netns.name"
case "$cmd" in
  setup)
    # A run that was killed leaves its namespace and 10.213.0.1 behind,
    # and a second link with that address breaks the new one: remove them.
    for old in $(ip netns list 2>/dev/null | awk '/^sw-[0-9]+/ {print $1}'); do
      ip link del "${old}-h" 2>/dev/null || true
      ip netns del "$old" 2>/dev/null || true
    done
    ns="sw-$$"
    ip netns add "$ns"
    ip link add "${ns}-h" type veth peer name "${ns}-n"
    ip link set "${ns}-n" netns "$ns"
    ip addr add 10.213.0.1/30 dev "${ns}-h"
    ip link set "${ns}-h" up
    ip netns exec "$ns" ip addr add 10.213.0.2/30 dev "${ns}-n"
    ip netns exec "$ns" ip link set "${ns}-n" up
    ip netns exec "$ns" ip link set lo up
    echo "$ns" >"$name_file"
    echo 10.213.0.1 ;;
  down) ip link set "$(cat "$name_file")-h" down ;;
  up) ip link set "$(cat "$name_file")-h" up ;;
  cleanup)
    [ -f "$name_file" ] || exit 0
    ns=$(cat "$name_file")
    ip link del "${ns}-h" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -f "$name_file" ;;
  *) echo "netns.sh: unknown command $cmd" >&2; exit 2 ;;
esac
