#!/usr/bin/env python3
"""tests/cluster/containers.py -- the fault tests of `scripts/cluster test`
against the docker-compose cluster (docker-compose.yml), through the gateway
on --port. docker-compose talks to whatever DOCKER_HOST scripts/cluster set
(a Docker engine, or podman's Docker API).

  baseline        a stream through the gateway completes, 400 items in order
  node-lost       nats1 is killed mid-stream: the stream completes with every
                  item; nats1 starts again and rejoins; requests are served
  worker-kill     the serving worker container is killed: instance_lost;
                  traffic moves to the other; the worker is started again
  worker-pause    the serving worker is paused: instance_lost within the freeze
                  bound; unpaused, it registers again and serves
  partition       the serving worker's container is disconnected from the
                  compose network (the process stays alive): instance_lost
                  within the freeze bound; reconnected, it registers again
                  and serves
  rolling-restart both worker containers restarted in turn (SIGTERM, drain)
                  under 6 clients: every request completes or ends with a
                  documented error, none hangs
  python          the Python worker's container (model "py") streams through
                  the gateway: 100 items in order, completed
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import check, sse, p99, rolling_restart, FAILED  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def compose(*args, timeout=120):
    return subprocess.run(["docker-compose", "-p", "streamwire", "-f",
                           os.path.join(ROOT, "docker-compose.yml")] + list(args),
                          capture_output=True, text=True, timeout=timeout)


def engine(*args):
    """The container engine's own CLI (docker-compose has no network
    disconnect): docker when a Docker engine answers, else podman (with the
    CONTAINERS_CONF that scripts/cluster exported)."""
    tool = "podman" if os.environ.get("DOCKER_HOST", "").startswith("unix://") and \
        shutil.which("podman") else "docker"
    return subprocess.run([tool] + list(args), capture_output=True, text=True, timeout=60)


def inflight(svc):
    out = compose("exec", "-T", svc, "curl", "-s", "http://127.0.0.1:9100/metrics").stdout
    m = re.search(r"^streamwire_worker_inflight_streams\{[^}]*\} (\S+)", out, re.M)
    return float(m.group(1)) if m else 0


def serving():
    for _ in range(50):
        for svc in ("worker1", "worker2"):
            if inflight(svc) > 0:
                return svc
        time.sleep(0.1)
    return None


def instances(endpoint="demo.llm.gen"):
    out = compose("exec", "-T", "gateway", "streamwire", "instances", "--server",
                  "nats://nats1:4222,nats://nats2:4222,nats://nats3:4222", "--endpoint", endpoint,
                  "--json").stdout
    return sorted(re.findall(r'"instance":"([^"]+)"', out))


def wait_instances(cond, secs):
    deadline = time.time() + secs
    got = []
    while time.time() < deadline:
        got = instances()
        if cond(got):
            return got, True
        time.sleep(0.5)
    return got, False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8080)
    a = ap.parse_args()
    figures = {}
    print("baseline", flush=True)
    r = sse(a.port)
    check(r["terminal"] == "response.completed" and r["deltas"] == 400 and r["in_order"],
          "a stream completes with 400 items in order (%s, %d)" % (r["terminal"], r["deltas"]))

    print("node lost mid-stream, then back", flush=True)
    done = {}

    def kill_node(n):
        if n == 50 and not done:
            done["t"] = time.time()
            compose("kill", "nats1")
    r = sse(a.port, on_delta=kill_node)
    check(r["terminal"] == "response.completed" and r["deltas"] == 400 and r["in_order"],
          "the stream completes with every item (%s, %d)" % (r["terminal"], r["deltas"]))
    figures["node_lost"] = {"max_gap_ms": round(r["max_gap_ms"]), "p99_gap_ms": round(p99(r["gaps"]))}
    compose("start", "nats1")
    got, ok = wait_instances(lambda g: g == ["worker1", "worker2"], 60)
    check(ok, "nats1 rejoined; the registry lists both workers (%s)" % got)
    r = sse(a.port, max_tokens=10)
    check(r["terminal"] == "response.incomplete", "requests are served (%s)" % r["terminal"])

    print("worker container killed mid-stream", flush=True)
    t = {}

    def kill_worker(n):
        if n == 30 and not t:
            t["svc"] = serving()
            t["t"] = time.time()
            compose("kill", t["svc"])
    r = sse(a.port, on_delta=kill_worker)
    detect = (time.time() - t.get("t", time.time())) * 1000
    check(r["terminal"] == "response.failed" and r["error"] == "instance_lost",
          "instance_lost (%s %s) after %.0f ms" % (r["terminal"], r["error"], detect))
    outcomes = [sse(a.port, max_tokens=5)["terminal"] for _ in range(4)]
    check(all(o == "response.incomplete" for o in outcomes), "traffic moved: %s" % outcomes)
    figures["worker_kill_ms"] = round(detect)
    compose("start", t.get("svc", "worker1"))
    wait_instances(lambda g: g == ["worker1", "worker2"], 60)

    print("worker container paused mid-stream", flush=True)
    t = {}

    def pause_worker(n):
        if n == 30 and not t:
            t["svc"] = serving()
            t["t"] = time.time()
            compose("pause", t["svc"])
    r = sse(a.port, on_delta=pause_worker)
    detect = (time.time() - t.get("t", time.time())) * 1000
    check(r["terminal"] == "response.failed" and r["error"] == "instance_lost",
          "instance_lost (%s %s) after %.0f ms" % (r["terminal"], r["error"], detect))
    check(detect <= 2500, "within the freeze bound: %.0f ms" % detect)
    svc = t.get("svc", "worker1")
    if compose("unpause", svc).returncode != 0:
        # docker-compose 1.29's unpause finds no paused container through
        # podman's Docker API; podman itself does it
        subprocess.run(["podman", "unpause", "streamwire_%s_1" % svc], capture_output=True)
    got, ok = wait_instances(lambda g: g == ["worker1", "worker2"], 60)
    check(ok, "unpaused, it registered again (%s)" % got)
    figures["worker_pause_ms"] = round(detect)
    print("partition: a worker container cut off from the network", flush=True)
    t = {}
    net = "streamwire_default"

    def cut_worker(n):
        if n == 30 and not t:
            t["svc"] = serving()
            t["t"] = time.time()
            t["rc"] = engine("network", "disconnect", net, "streamwire_%s_1" % t["svc"])
    r = sse(a.port, on_delta=cut_worker)
    detect = (time.time() - t.get("t", time.time())) * 1000
    rc = t.get("rc")
    check(rc is not None and rc.returncode == 0,
          "disconnected %s (%s)" % (t.get("svc"), (rc.stderr.strip() if rc else "not run")[:200]))
    check(r["terminal"] == "response.failed" and r["error"] == "instance_lost",
          "instance_lost (%s %s) after %.0f ms" % (r["terminal"], r["error"], detect))
    check(detect <= 2500, "within the freeze bound: %.0f ms" % detect)
    svc = t.get("svc", "worker1")
    rc = engine("network", "connect", "--alias", svc, net, "streamwire_%s_1" % svc)
    check(rc.returncode == 0, "reconnected %s (%s)" % (svc, rc.stderr.strip()[:200]))
    got, ok = wait_instances(lambda g: g == ["worker1", "worker2"], 60)
    check(ok, "reconnected, it registered again (%s)" % got)
    outcomes = [sse(a.port, max_tokens=5)["terminal"] for _ in range(4)]
    check(all(o == "response.incomplete" for o in outcomes), "both serve again: %s" % outcomes)
    figures["partition_ms"] = round(detect)

    print("rolling restart of both worker containers under load", flush=True)

    def restart_workers():
        for svc in ("worker1", "worker2"):
            compose("restart", "-t", "10", svc)
            wait_instances(lambda g, s=svc: s in g, 60)
            time.sleep(1)

    figures["rolling_restart"] = rolling_restart(a.port, restart_workers)

    print("python worker", flush=True)
    r = sse(a.port, model="py")
    check(r["terminal"] == "response.completed" and r["deltas"] == 100 and r["in_order"],
          "the Python worker's container streams 100 items in order (%s, %d)"
          % (r["terminal"], r["deltas"]))
    check(instances("demo.py.gen") == ["workerpy"], "the Python worker is registered")

    print(figures)
    print("%d check(s) failed" % len(FAILED) if FAILED else "all checks passed")
    return min(len(FAILED), 100)


if __name__ == "__main__":
    sys.exit(main())
