#!/usr/bin/env python3
"""A streamwire worker in Python: streams token-0 .. token-<N-1> for every
request, as `streamwire worker` does, and registers in the discovery
registry so routers and the gateway find it.

    python3 python/examples/worker.py --server nats://127.0.0.1:4222 \\
        --endpoint demo.llm.gen [--instance-id ID] [--tokens N] [--token-interval-ms MS] \\
        [--replicas N] [--health-listen HOST:PORT]

It honours max_tokens (the stream then ends incomplete, "max_tokens"), stops
when the frontend cancels, and on SIGTERM or Ctrl-C drains: it stops taking
requests, lets open streams finish (--drain-grace-ms), deregisters and exits 0.
It prints "worker ready instance=ID" once it serves. --replicas is the
registry bucket's replica count when this worker is the one that creates it
(in a three-node cluster: 3, as the C workers and the gateway are given).
--health-listen serves GET /healthz over HTTP: 200 while the worker serves,
503 once it drains (the container healthcheck).
"""
import argparse
import http.server
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import streamwire as sw  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="NATS server URL(s), comma separated")
    ap.add_argument("--endpoint", required=True, help="ns.component.endpoint to serve")
    ap.add_argument("--instance-id", help="this instance's id (default: random)")
    ap.add_argument("--tokens", type=int, default=16, help="items per request (default 16)")
    ap.add_argument("--token-interval-ms", type=int, default=0,
                    help="pause between items (default 0)")
    ap.add_argument("--threads", type=int, default=4, help="handler threads (default 4)")
    ap.add_argument("--registry", choices=["nats-kv", "none"], default="nats-kv",
                    help="register in the discovery registry (default nats-kv)")
    ap.add_argument("--bucket", help="registry bucket (default streamwire_instances)")
    ap.add_argument("--lease-ms", type=int, default=0, help="registry lease (default 3000)")
    ap.add_argument("--replicas", type=int, default=0,
                    help="replicas of the registry bucket if this worker creates it "
                         "(default 1; 3 in a three-node cluster)")
    ap.add_argument("--health-listen", metavar="HOST:PORT",
                    help="serve GET /healthz (200 while serving, 503 once draining)")
    ap.add_argument("--drain-grace-ms", type=int, default=5000,
                    help="on SIGTERM, how long open streams may finish (default 5000)")
    a = ap.parse_args()

    def handler(req):
        total = a.tokens
        limited = req.max_tokens and req.max_tokens < total
        if limited:
            total = req.max_tokens
        for i in range(total):
            if i and a.token_interval_ms:
                time.sleep(a.token_interval_ms / 1000.0)  # releases the GIL
            yield "token-%d" % i
        return sw.Incomplete("max_tokens") if limited else sw.Completed()

    try:
        conn = sw.Connection(a.server, name="streamwire-pyworker", max_reconnect=-1)
    except sw.StreamwireError as e:
        print("worker.py: cannot connect to %s: %s" % (a.server, e), file=sys.stderr)
        return 3
    reg = None
    if a.registry != "none":
        try:
            reg = sw.Registry(conn, bucket=a.bucket, lease_ms=a.lease_ms, replicas=a.replicas)
        except sw.StreamwireError as e:
            print("worker.py: cannot open the nats-kv registry (bucket %s, %d replicas): %s"
                  % (a.bucket or "streamwire_instances", a.replicas or 1, e), file=sys.stderr)
            conn.close()
            return 1
    w = sw.Worker(conn, a.endpoint, handler, registry=reg, instance_id=a.instance_id,
                  threads=a.threads)
    stop = {"sig": False}
    health = serve_health(a.health_listen, stop) if a.health_listen else None

    def on_signal(signum, frame):
        stop["sig"] = True
        w._stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print("worker ready instance=%s endpoint=%s%s"
          % (w.instance_id, a.endpoint,
             " health=%s:%d" % health.server_address[:2] if health else ""), flush=True)
    while not w.wait(0.2):
        pass
    w.drain(a.drain_grace_ms)
    w.close()
    if reg is not None:
        reg.close()
    conn.close()
    if health is not None:
        health.shutdown()
    return 0


def serve_health(listen, stop):
    """GET /healthz on listen (HOST:PORT) from a thread: 200 "ok" until a
    signal asks the worker to stop, then 503 "draining"."""
    host, _, port = listen.rpartition(":")

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/healthz":
                self.send_error(404)
                return
            code, body = (503, b"draining\n") if stop["sig"] else (200, b"ok\n")
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer((host or "0.0.0.0", int(port)), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


if __name__ == "__main__":
    sys.exit(main())
