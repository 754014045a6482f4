#!/usr/bin/env bash
# scripts/cluster.d/containers.sh: `scripts/cluster up|down|status|test` with
# containers (docker-compose.yml). A Docker engine is used when one answers;
# otherwise podman, set up as these machines need it:
#   - a private containers.conf (CONTAINERS_CONF): no default ulimits (runc
#     fails on setrlimit otherwise), runc, cgroupfs, the file events logger;
#   - `podman system service` serving the Docker API on a socket in the state
#     directory, for Debian's docker-compose (DOCKER_HOST);
#   - no image registry is reachable: the debian:bookworm-slim base image is
#     built with mmdebstrap from the machine's Debian mirror and imported,
#     only when it cannot be pulled.
# Every process it starts is stopped by `down`.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
cmd=$1
STATE="${SW_CLUSTER_STATE:-${TMPDIR:-/tmp}/streamwire-containers}"
PROJECT=streamwire
mkdir -p "$STATE"

compose() { docker-compose -p "$PROJECT" -f "$ROOT/docker-compose.yml" "$@"; }

engine() {
  if [ -z "${DOCKER_HOST:-}" ] && docker info >/dev/null 2>&1; then
    echo docker; return
  fi
  echo podman
}

podman_setup() {
  "$ROOT/scripts/deps" --cluster >/dev/null
  cat >"$STATE/containers.conf" <<'EOF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_CONF="$STATE/containers.conf"
  export DOCKER_HOST="unix://$STATE/podman.sock"
  if [ ! -S "$STATE/podman.sock" ] || ! curl -s --unix-socket "$STATE/podman.sock" http://d/_ping >/dev/null; then
    rm -f "$STATE/podman.sock"
    podman system service --time=0 "unix://$STATE/podman.sock" >"$STATE/podman.log" 2>&1 &
    echo $! >"$STATE/podman.pid"
    for _ in $(seq 1 100); do
      curl -s --unix-socket "$STATE/podman.sock" http://d/_ping >/dev/null 2>&1 && break
      sleep 0.1
    done
  fi
  if ! podman image exists docker.io/library/debian:bookworm-slim; then
    if ! podman pull -q docker.io/library/debian:bookworm-slim >/dev/null 2>&1; then
      local mirror
      mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
      mirror=${mirror:-http://deb.debian.org/debian}
      echo "containers: building debian:bookworm-slim with mmdebstrap from $mirror"
      mmdebstrap --variant=minbase bookworm "$STATE/rootfs.tar" "$mirror" >"$STATE/mmdebstrap.log" 2>&1
      podman import -q "$STATE/rootfs.tar" docker.io/library/debian:bookworm-slim >/dev/null
      rm -f "$STATE/rootfs.tar"
    fi
  fi
}

use_engine() {
  if [ "$(engine)" = podman ]; then podman_setup; fi
}

wait_healthy() {
  local i
  for i in $(seq 1 180); do
    if curl -sf "http://127.0.0.1:${SW_GATEWAY_PORT:-8080}/readyz" >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  echo "containers: the gateway never became ready" >&2
  compose ps >&2 || true
  return 1
}

case "$cmd" in
  up)
    use_engine
    echo "containers: building the images (engine: $(engine))"
    compose build >"$STATE/build.log" 2>&1 || { tail -30 "$STATE/build.log" >&2; exit 1; }
    compose up -d
    wait_healthy
    echo "containers: up; gateway http://127.0.0.1:${SW_GATEWAY_PORT:-8080} (model demo)" ;;
  status)
    use_engine
    compose ps
    echo -n "gateway /readyz: "; curl -s -m 3 "http://127.0.0.1:${SW_GATEWAY_PORT:-8080}/readyz" || echo "(no answer)" ;;
  test)
    use_engine
    started=0
    if ! curl -sf "http://127.0.0.1:${SW_GATEWAY_PORT:-8080}/readyz" >/dev/null 2>&1; then
      "$0" up; started=1
    fi
    rc=0
    python3 "$ROOT/tests/cluster/containers.py" --port "${SW_GATEWAY_PORT:-8080}" || rc=$?
    if [ "$started" -eq 1 ]; then "$0" down; fi
    exit $rc ;;
  down)
    if [ -f "$STATE/podman.pid" ] || [ "$(engine)" = podman ]; then
      export CONTAINERS_CONF="$STATE/containers.conf" DOCKER_HOST="unix://$STATE/podman.sock"
    fi
    compose down -v --remove-orphans 2>/dev/null || true
    if [ -f "$STATE/podman.pid" ]; then
      kill "$(cat "$STATE/podman.pid")" 2>/dev/null || true
      rm -f "$STATE/podman.pid" "$STATE/podman.sock"
    fi
    echo "containers: down" ;;
  *) echo "containers.sh: unknown command $cmd" >&2; exit 2 ;;
esac
