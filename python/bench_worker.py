#!/usr/bin/env python3
"""python/bench_worker.py -- a Python worker (python/examples/worker.py,
through the ctypes binding) against the C worker (`streamwire worker`), as
seen by the C frontend (`streamwire generate --json`), in the same run
against the same nats-server (issue 16). See BENCHMARKS.md "Python worker".

For each worker, alternating, REPS times: one stream of N tokens (items/s,
from the frontend's elapsed_us), and TTFI_RUNS single requests of one
token (time to first item, open -> first item, from first_item_us).

    python3 python/bench_worker.py --cli build/streamwire [--lib build/libstreamwire.so]
                                   [--tokens N] [--reps N] [--ttfi-runs N]
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def generate(cli, url, ep, inst, max_tokens=0):
    argv = [cli, "generate", "--server", url, "--endpoint", ep, "--instance-id", inst, "--json"]
    if max_tokens:
        argv += ["--max-tokens", str(max_tokens)]
    out = subprocess.run(argv, capture_output=True, timeout=300)
    last = json.loads(out.stdout.decode().splitlines()[-1])
    return last


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--lib", help="libstreamwire.so (default: the build tree's)")
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ttfi-runs", type=int, default=30)
    a = ap.parse_args()
    env = dict(os.environ)
    if a.lib:
        env["STREAMWIRE_LIB"] = a.lib
    tmp = tempfile.mkdtemp(prefix="sw-pybench-")
    port = free_port()
    url = "nats://127.0.0.1:%d" % port
    procs = [subprocess.Popen(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd",
                               tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        workers = {
            "C": ([a.cli, "worker", "--server", url, "--endpoint", "pb.c.gen", "--instance-id",
                   "cw", "--tokens", str(a.tokens), "--registry", "none", "--quiet"],
                  "pb.c.gen", "cw"),
            "Python": ([sys.executable, os.path.join(HERE, "examples", "worker.py"), "--server",
                        url, "--endpoint", "pb.py.gen", "--instance-id", "pyw", "--tokens",
                        str(a.tokens), "--registry", "none"], "pb.py.gen", "pyw"),
        }
        for name, (argv, ep, inst) in workers.items():
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
            procs.append(p)
            if "worker ready" not in p.stdout.readline().decode():
                raise RuntimeError("%s worker did not start" % name)
        res = {n: {"ips": [], "ttfi": []} for n in workers}
        for rep in range(a.reps):
            for name, (argv, ep, inst) in workers.items():
                print("  rep %d/%d: %s worker..." % (rep + 1, a.reps, name), file=sys.stderr,
                      flush=True)
                r = generate(a.cli, url, ep, inst)
                assert r["terminal"] == "completed" and r["items"] == a.tokens, r
                res[name]["ips"].append(r["items"] / (r["elapsed_us"] / 1e6))
                for _ in range(a.ttfi_runs // a.reps or 1):
                    r = generate(a.cli, url, ep, inst, max_tokens=1)
                    res[name]["ttfi"].append(r["first_item_us"])
        print("Python worker vs C worker, read by `streamwire generate` (C), same nats-server")
        print("%-36s %12s %12s %8s" % ("figure", "C worker", "Python", "Py/C"))
        c, p = res["C"], res["Python"]
        ci, pi = statistics.median(c["ips"]), statistics.median(p["ips"])
        print("%-36s %12.0f %12.0f %7.2fx" % ("items/s, one stream of %d" % a.tokens, ci, pi,
                                               pi / ci))
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            cs, ps = sorted(c["ttfi"]), sorted(p["ttfi"])
            cv = cs[min(len(cs) - 1, int(q * len(cs)))]
            pv = ps[min(len(ps) - 1, int(q * len(ps)))]
            print("%-36s %12.0f %12.0f %7.2fx" % ("time to first item %s (us)" % label, cv, pv,
                                                   pv / cv))
        print("(%d runs of each for time to first item; medians of %d long streams)"
              % (len(c["ttfi"]), a.reps))
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
