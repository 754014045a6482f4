#!/usr/bin/env python3
"""tests/cluster/faults.py -- the fault tests of `scripts/cluster --local test`.

Runs against the cluster that `scripts/cluster --local up` started (state in
--state): three nats-servers with routes and JetStream (registry bucket R3),
workers w1 and w2 (400 tokens, 10 ms apart), and the gateway (model demo).
Each fault prints its figures; the exit status is the number of failed
checks (0 = all passed). Standard library only.

  1 node-of-worker   the node a streaming worker is connected to is killed:
                     the stream completes with every item, in order, once
  1 node-of-gateway  the same for the node the gateway is connected to
  2 rejoin           the killed nodes come back: the registry still lists the
                     workers (R3 lost nothing) and new requests are served
  3 worker-kill      SIGKILL of the serving worker: instance_lost, it leaves the
                     registry, traffic moves to the other
  4 worker-pause     SIGSTOP: instance_lost within the freeze bound, reported
                     dead; SIGCONT: registered again, serves again
  5 partition        a worker in its own network namespace is cut off (veth
                     down) while alive: instance_lost within the bound; link up:
                     it reconnects, registers again, serves; nothing twice
  6 rolling-restart  every worker restarted (SIGTERM drain) under load: every
                     request ends completed or with a documented error, none hangs
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

FAILED = []
RESULTS = {}


def check(cond, what):
    print(("  ok    " if cond else "  FAIL  ") + what, flush=True)
    if not cond:
        FAILED.append(what)
    return cond


class Cluster:
    def __init__(self, state, cli, root):
        self.state, self.cli, self.root = state, cli, root
        self.gw = int(self.read("gw.port"))

    def read(self, name):
        with open(os.path.join(self.state, name)) as f:
            return f.read().strip()

    def pid(self, name):
        return int(self.read(name + ".pid"))

    def urls(self, *order):
        return ",".join("nats://127.0.0.1:%s" % self.read("n%d.port" % i) for i in order)

    def connz_node(self, conn_name):
        """The node (1..3) where a client connection of that name is."""
        for i in (1, 2, 3):
            try:
                c = http.client.HTTPConnection("127.0.0.1", int(self.read("n%d.mport" % i)),
                                               timeout=2)
                c.request("GET", "/connz?limit=1024")
                d = json.loads(c.getresponse().read())
                for conn in d.get("connections", []):
                    if conn.get("name") == conn_name:
                        return i
            except OSError:
                pass
        return None

    def kill_node(self, i):
        os.kill(self.pid("n%d" % i), signal.SIGKILL)

    def start_node(self, i):
        log = open(os.path.join(self.state, "n%d.log" % i), "a")
        p = subprocess.Popen(["nats-server", "-c", os.path.join(self.state, "n%d.conf" % i)],
                             stdout=log, stderr=log)
        with open(os.path.join(self.state, "n%d.pid" % i), "w") as f:
            f.write(str(p.pid))
        wait_http("127.0.0.1", int(self.read("n%d.mport" % i)), "/healthz", 20)

    def worker_metrics(self, wid):
        m = re.search(r"worker metrics url=(\S+)", open(os.path.join(self.state, wid + ".log")).read())
        return m.group(1) if m else None

    def inflight(self, wid):
        url = self.worker_metrics(wid)
        if url is None:
            return 0
        try:
            hp = url.split("//")[1].split("/")[0]
            h, p = hp.rsplit(":", 1)
            c = http.client.HTTPConnection(h, int(p), timeout=2)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
            m = re.search(r"^streamwire_worker_inflight_streams\{[^}]*\} (\S+)", text, re.M)
            return float(m.group(1)) if m else 0
        except OSError:
            return 0

    def serving(self, candidates=("w1", "w2")):
        for _ in range(100):
            for w in candidates:
                if self.inflight(w) > 0:
                    return w
            time.sleep(0.05)
        return None

    def start_worker(self, wid, urls, prefix=None, endpoint="demo.llm.gen"):
        log = open(os.path.join(self.state, wid + ".log"), "w")
        argv = (prefix or []) + [self.cli, "worker", "--server", urls, "--endpoint",
                                 endpoint, "--instance-id", wid, "--tokens", "400",
                                 "--token-interval-ms", "10", "--replicas", "3", "--lease-ms",
                                 "3000", "--metrics-listen", "127.0.0.1:0"]
        p = subprocess.Popen(argv, stdout=log, stderr=log)
        with open(os.path.join(self.state, wid + ".pid"), "w") as f:
            f.write(str(p.pid))
        deadline = time.time() + 30
        while time.time() < deadline:
            if "worker ready" in open(os.path.join(self.state, wid + ".log")).read():
                return p
            time.sleep(0.1)
        tail = open(os.path.join(self.state, wid + ".log")).read()[-2000:]
        raise RuntimeError("worker %s not ready; its log ends:\n%s" % (wid, tail))

    def instances(self):
        out = subprocess.run([self.cli, "instances", "--server", self.urls(1, 2, 3), "--json"],
                             capture_output=True, text=True, timeout=20).stdout
        # the Python worker (model py) serves its own endpoint: not counted here
        return sorted(e["instance"] for e in (json.loads(l) for l in out.splitlines()
                                              if l.startswith("{"))
                      if e["endpoint"] != "demo.py.gen")

    def wait_instances(self, cond, secs):
        deadline = time.time() + secs
        got = []
        while time.time() < deadline:
            try:
                got = self.instances()
            except (subprocess.SubprocessError, ValueError):
                got = []
            if cond(got):
                return got, True
            time.sleep(0.2)
        return got, False


def wait_http(host, port, path, secs):
    deadline = time.time() + secs
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection(host, port, timeout=1)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def rolling_restart(port, restart_workers, clients=6):
    """`clients` clients stream through the gateway on `port` while
    restart_workers() restarts every worker in turn. Every request must
    complete or end with a documented error, and none may hang. Returns the
    figures: requests, and errors by reason."""
    stop = threading.Event()
    outcomes = []
    lock = threading.Lock()

    def client():
        while not stop.is_set():
            r = sse(port, max_tokens=40, timeout=30)
            with lock:
                outcomes.append((r["terminal"], r["error"]))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for c in threads:
        c.start()
    time.sleep(1)
    restart_workers()
    stop.set()
    for c in threads:
        c.join(60)
    documented = {"instance_lost", "no_responders", "no_instances", "overloaded", None}
    bad = [o for o in outcomes
           if not (o[0] == "response.incomplete" or
                   (o[0] in ("response.failed", "error") and o[1] in documented))]
    hung = [o for o in outcomes if o[0] is None or str(o[0]).startswith("exception")]
    check(len(outcomes) > 20, "%d requests during the restarts" % len(outcomes))
    check(not bad, "every request ended completed or with a documented error (%d others: %s)"
          % (len(bad), bad[:3]))
    check(not hung, "none hung (%d)" % len(hung))
    errs = {}
    for o in outcomes:
        if o[0] != "response.incomplete":
            errs[o[1]] = errs.get(o[1], 0) + 1
    print("        %d requests, errors by reason: %s" % (len(outcomes), errs))
    return {"requests": len(outcomes), "errors": errs}


def sse(port, max_tokens=None, timeout=60, on_delta=None, model="demo"):
    """One streamed response through the gateway: the terminal, the deltas,
    the largest gap between events (ms), and whether the text is
    token-0 token-1 ... in order, each once."""
    body = {"model": model, "input": "hello", "stream": True}
    if max_tokens:
        body["max_output_tokens"] = max_tokens
    r = {"terminal": None, "deltas": 0, "max_gap_ms": 0.0, "error": None, "in_order": True,
         "gaps": []}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/responses", json.dumps(body), {"content-type": "application/json"})
        resp = c.getresponse()
        last = time.time()
        ev = None
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                now = time.time()
                gap = (now - last) * 1000
                last = now
                d = json.loads(line[6:])
                if ev == "response.output_text.delta":
                    if d["delta"] != "token-%d" % r["deltas"]:
                        r["in_order"] = False
                    r["deltas"] += 1
                    r["gaps"].append(gap)
                    r["max_gap_ms"] = max(r["max_gap_ms"], gap)
                    if on_delta:
                        on_delta(r["deltas"])
                elif ev in ("response.completed", "response.incomplete", "response.failed",
                            "error"):
                    r["terminal"] = ev
                    resp_obj = d.get("response") or {}
                    err = resp_obj.get("error") or {}
                    r["error"] = d.get("code") or err.get("code")
    except (OSError, ValueError) as e:
        r["terminal"] = "exception: %s" % e
    return r


def gateway_metric(cl, name):
    try:
        c = http.client.HTTPConnection("127.0.0.1", cl.gw, timeout=3)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        m = re.search(r"^%s\{[^}]*\} (\S+)" % re.escape(name), text, re.M)
        return int(float(m.group(1))) if m else -1
    except OSError:
        return -1


def p99(v):
    if not v:
        return 0
    s = sorted(v)
    return s[min(len(s) - 1, int(len(s) * 0.99))]


def node_loss(cl, who, conn_name):
    print("1 node loss: the node %s is connected to" % who, flush=True)
    victim = {}

    def on_delta(n):
        if n == 50 and not victim:
            node = cl.connz_node(conn_name() if callable(conn_name) else conn_name)
            victim["node"] = node
            victim["t"] = time.time()
            if node:
                cl.kill_node(node)

    r = sse(cl.gw, on_delta=on_delta)
    node = victim.get("node")
    check(node is not None, "found the node of %s" % who)
    check(r["terminal"] == "response.completed",
          "stream completed (%s%s)" % (r["terminal"], " " + r["error"] if r["error"] else ""))
    check(r["deltas"] == 400 and r["in_order"], "all 400 items, in order, once (%d)" % r["deltas"])
    print("        added delay: max gap %.0f ms, p99 gap %.0f ms (10 ms between items)"
          % (r["max_gap_ms"], p99(r["gaps"])))
    RESULTS["node_loss_" + who] = {"killed_node": node, "deltas": r["deltas"],
                                   "max_gap_ms": round(r["max_gap_ms"]),
                                   "p99_gap_ms": round(p99(r["gaps"]))}
    return node


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--root", required=True)
    a = ap.parse_args()
    cl = Cluster(a.state, a.cli, a.root)
    wait_http("127.0.0.1", cl.gw, "/readyz", 30)
    got, ok = cl.wait_instances(lambda g: g == ["w1", "w2"], 20)
    check(ok, "registry lists w1 and w2 (%s)" % got)

    # 0: the Python worker (python/examples/worker.py) through the gateway
    print("0 a worker written in Python, through the gateway", flush=True)
    r = sse(cl.gw, model="py")
    check(r["terminal"] == "response.completed" and r["deltas"] == 16 and r["in_order"],
          "model py: %s, %d tokens in order" % (r["terminal"], r["deltas"]))

    # 1: the node under a streaming worker, then the one under the gateway
    serving = {}

    def worker_conn():
        w = cl.serving()
        serving["w"] = w
        return "streamwire-worker-%s" % w

    def rejoin(n):
        print("2 node n%s rejoins" % n, flush=True)
        if n:
            cl.start_node(n)
        got, ok = cl.wait_instances(lambda g: g == ["w1", "w2"], 20)
        check(ok, "registry still lists w1 and w2 after the node came back (%s)" % got)
        # Losing a node may cost the registry's JetStream stream its leader:
        # until a new one is elected, keep-alives fail, and a router may let
        # the entries lapse for a moment (no_instances). Measured, bounded.
        t0 = time.time()
        while True:
            r = sse(cl.gw, max_tokens=20)
            if r["terminal"] == "response.incomplete" or time.time() - t0 > 30:
                break
            time.sleep(0.25)
        waited = (time.time() - t0) * 1000
        check(r["terminal"] == "response.incomplete" and r["deltas"] == 20,
              "a new request is served (%s, %d items) after %.0f ms" % (r["terminal"], r["deltas"],
                                                                       waited))
        RESULTS.setdefault("rejoin_served_after_ms", []).append(round(waited))

    rejoin(node_loss(cl, "the serving worker", worker_conn))
    rejoin(node_loss(cl, "the gateway", "streamwire-gateway"))

    # 3: SIGKILL of the serving worker
    print("3 worker killed mid-stream", flush=True)
    t = {}

    def kill_serving(n):
        if n == 30 and not t:
            w = cl.serving()
            t["w"], t["t"] = w, time.time()
            os.kill(cl.pid(w), signal.SIGKILL)

    r = sse(cl.gw, on_delta=kill_serving)
    detect = (time.time() - t["t"]) * 1000 if t else -1
    check(r["terminal"] == "response.failed" and r["error"] == "instance_lost",
          "the stream ends instance_lost (%s %s) in %.0f ms" % (r["terminal"], r["error"], detect))
    victim = t.get("w") or "w1"
    got, ok = cl.wait_instances(lambda g: victim not in g, 10)
    check(ok, "%s left the registry (%s)" % (victim, got))
    outcomes = [sse(cl.gw, max_tokens=10)["terminal"] for _ in range(4)]
    check(all(o == "response.incomplete" for o in outcomes),
          "traffic moved to the other worker: %s" % outcomes)
    RESULTS["worker_kill"] = {"detect_ms": round(detect)}
    cl.start_worker(victim, cl.urls(1, 2, 3))
    cl.wait_instances(lambda g: g == ["w1", "w2"], 20)

    # 4: SIGSTOP / SIGCONT
    print("4 worker paused (SIGSTOP) mid-stream", flush=True)
    t = {}

    def stop_serving(n):
        if n == 30 and not t:
            w = cl.serving()
            t["w"], t["t"] = w, time.time()
            os.kill(cl.pid(w), signal.SIGSTOP)

    r = sse(cl.gw, on_delta=stop_serving)
    detect = (time.time() - t["t"]) * 1000 if t else -1
    victim = t.get("w") or "w2"
    check(r["terminal"] == "response.failed" and r["error"] == "instance_lost",
          "the stream ends instance_lost (%s %s) in %.0f ms" % (r["terminal"], r["error"], detect))
    check(detect <= 1500, "within the freeze bound (1.5 s): %.0f ms" % detect)
    # The gateway declared it dead (and quarantines it). Its report to the
    # registry is refused when the store saw a keep-alive newer than the
    # evidence (a last refresh just before the freeze): then other routers
    # judge the entry by its lease instead. So the registry is reported on,
    # not required.
    lost = gateway_metric(cl, "streamwire_frontend_instances_lost_total")
    check(lost >= 2, "the gateway declared %s dead (instances lost so far: %d)" % (victim, lost))
    got, ok = cl.wait_instances(lambda g: victim not in g, 10)
    print("        registry: %s" % ("tombstoned" if ok else "kept until its lease lapses (%s)" % got))
    os.kill(cl.pid(victim), signal.SIGCONT)
    got, ok = cl.wait_instances(lambda g: victim in g, 15)
    check(ok, "%s registered again after SIGCONT (%s)" % (victim, got))
    out = subprocess.run([cl.cli, "generate", "--server", cl.urls(1, 2, 3), "--endpoint",
                          "demo.llm.gen", "--instance-id", victim, "--max-tokens", "5"],
                         capture_output=True, text=True, timeout=30)
    check(out.returncode == 1 and "token-4" in out.stdout,
          "%s serves again (exit %d: incomplete after 5)" % (victim, out.returncode))
    RESULTS["worker_pause"] = {"detect_ms": round(detect)}

    # 5: a partition, with a worker in its own network namespace
    print("5 partition: a worker cut off from NATS while alive", flush=True)
    netns = os.path.join(a.root, "scripts", "cluster.d", "netns.sh")
    setup = subprocess.run([netns, "setup", a.state], capture_output=True, text=True)
    if setup.returncode != 0:
        check(False, "netns setup (needs root and iproute2): %s" % setup.stderr.strip())
    else:
        host_ip = setup.stdout.strip()
        nsname = open(os.path.join(a.state, "netns.name")).read().strip()
        urls = ",".join("nats://%s:%s" % (host_ip, cl.read("n%d.port" % i)) for i in (1, 2, 3))
        # its own endpoint, so that `generate` routes to it through the
        # registry (and so reports it dead there when it is lost)
        cl.start_worker("w3", urls, prefix=["ip", "netns", "exec", nsname],
                        endpoint="part.llm.gen")
        got, ok = cl.wait_instances(lambda g: "w3" in g, 15)
        check(ok, "w3 (in the namespace) registered (%s)" % got)
        res = {}

        def gen():
            out = subprocess.run([cl.cli, "generate", "--server", cl.urls(1, 2, 3), "--endpoint",
                                  "part.llm.gen", "--json"],
                                 capture_output=True, text=True, timeout=60)
            res["out"], res["end"] = out.stdout, time.time()

        th = threading.Thread(target=gen)
        th.start()
        time.sleep(1.0)
        t0 = time.time()
        subprocess.run([netns, "down", a.state], check=False)
        th.join(60)
        last = res.get("out", "").strip().splitlines()[-1:] or ["{}"]
        term = json.loads(last[0]) if last[0].startswith("{") else {}
        detect = (res.get("end", time.time()) - t0) * 1000
        check(term.get("reason") == "instance_lost",
              "the stream ends instance_lost (%s) in %.0f ms" % (term.get("reason"), detect))
        check(detect <= 3000, "within the bound: %.0f ms" % detect)
        got, ok = cl.wait_instances(lambda g: "w3" not in g, 10)
        check(ok, "w3 reported dead (%s)" % got)
        subprocess.run([netns, "up", a.state], check=False)
        got, ok = cl.wait_instances(lambda g: "w3" in g, 30)
        check(ok, "w3 reconnected and registered again (%s)" % got)
        lines, seqs = [], []
        for _ in range(20):  # routers lift their quarantine once it registers again
            out = subprocess.run([cl.cli, "generate", "--server", cl.urls(1, 2, 3), "--endpoint",
                                  "part.llm.gen", "--max-tokens", "5", "--json"],
                                 capture_output=True, text=True, timeout=30)
            lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
            seqs = [l["seq"] for l in lines if "seq" in l]
            if seqs:
                break
            time.sleep(0.5)
        check(seqs == [1, 2, 3, 4, 5] and sum("terminal" in l for l in lines) == 1,
              "w3 serves again, each item once, one terminal (%s; %s)" % (seqs, lines[-1:]))
        RESULTS["partition"] = {"detect_ms": round(detect)}
        os.kill(cl.pid("w3"), signal.SIGKILL)

    # 6: rolling restart under load
    print("6 rolling restart of every worker under load", flush=True)

    def restart_workers():
        for w, urls in (("w1", cl.urls(1, 2, 3)), ("w2", cl.urls(2, 3, 1))):
            os.kill(cl.pid(w), signal.SIGTERM)
            for _ in range(100):
                try:
                    os.kill(cl.pid(w), 0)
                    time.sleep(0.1)
                except ProcessLookupError:
                    break
            cl.start_worker(w, urls)
            time.sleep(1)

    RESULTS["rolling_restart"] = rolling_restart(cl.gw, restart_workers)

    with open(os.path.join(a.state, "results.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)
    print(json.dumps(RESULTS))
    print("%d check(s) failed" % len(FAILED) if FAILED else "all checks passed")
    return min(len(FAILED), 100)


if __name__ == "__main__":
    sys.exit(main())
