#!/usr/bin/env python3
"""tests/browser/playground.py -- the gateway's playground page (GET /) in a
real browser (issue 12): Debian's chromium, headless, driven through
chromedriver's W3C WebDriver HTTP API (no Python packages beyond the
standard library).

It starts its own nats-server (JetStream, a temp dir, a free port), three
workers (8 tokens; 2,000 slow tokens; a refusal) and the gateway, then:

  1. loads the page; the model list fills from GET /v1/models;
  2. sends a prompt (a real click on Send): the 8 tokens appear in order and
     the status shows response.completed (stop);
  3. sends to the slow model, waits for a few tokens, clicks Stop: the
     status shows response.incomplete (cancelled), the text is a prefix
     token-0 token-1 ... of the stream, and it stops growing;
  4. sends to the refusing model: the refusal text shows, styled as one;
  5. saves a screenshot (PNG) next to the build.

Usage: playground.py --cli BUILD/streamwire --out DIR
Exit status 0 when every check passed.
"""
import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

FAILS = []


def check(cond, what):
    print("  %s  %s" % ("ok  " if cond else "FAIL", what), flush=True)
    if not cond:
        FAILS.append(what)
    return cond


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_for(fn, secs, what):
    deadline = time.time() + secs
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise RuntimeError("timed out waiting for %s (last: %r)" % (what, last))


def wait_line(proc, text, secs):
    """Reads proc's stdout until a line contains text; returns that line."""
    deadline = time.time() + secs
    os.set_blocking(proc.stdout.fileno(), False)
    buf = b""
    while time.time() < deadline:
        chunk = proc.stdout.read()
        if chunk:
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if text in line:
                    return line
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise RuntimeError("no '%s' from %s: %s" % (text, proc.args[:2], buf[-2000:]))


class WebDriver:
    """The few W3C WebDriver calls this test needs."""

    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port
        self.sid = None

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read().decode())["value"]
        except urllib.error.HTTPError as e:
            raise RuntimeError("webdriver %s %s: %s" % (method, path, e.read()[:500]))

    def start(self, binary):
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": binary,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1000,760",
                         "--no-first-run", "--disable-extensions"]}}}}
        self.sid = self.call("POST", "/session", caps)["sessionId"]

    def s(self, path):
        return "/session/%s%s" % (self.sid, path)

    def go(self, url):
        self.call("POST", self.s("/url"), {"url": url})

    def js(self, script, *args):
        return self.call("POST", self.s("/execute/sync"), {"script": script, "args": list(args)})

    def click(self, css):
        el = self.call("POST", self.s("/element"), {"using": "css selector", "value": css})
        eid = list(el.values())[0]
        self.call("POST", self.s("/element/%s/click" % eid), {})

    def screenshot(self, path):
        png = base64.b64decode(self.call("GET", self.s("/screenshot")))
        with open(path, "wb") as f:
            f.write(png)
        return png

    def quit(self):
        if self.sid:
            try:
                self.call("DELETE", self.s(""))
            except (OSError, RuntimeError):
                pass


STATUS = "const s=document.getElementById('status');" \
         "return [s.dataset.terminal||'', s.dataset.reason||'', s.textContent];"
OUT = "const o=document.getElementById('out');return [o.textContent, o.className];"


def choose(wd, model):
    wd.js("document.getElementById('model').value=arguments[0];", model)


def wait_terminal(wd, secs=30):
    return wait_for(lambda: (lambda t: t if t[0] else None)(wd.js(STATUS)), secs, "a terminal")


def tokens_prefix(text):
    """The number of tokens if text is token-0token-1... exactly, else -1."""
    n, pos = 0, 0
    while pos < len(text):
        t = "token-%d" % n
        if not text.startswith(t, pos):
            return -1
        pos += len(t)
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        print("playground: chromium and chromium-driver are needed (scripts/deps)")
        return 1
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="sw-browser-")
    procs = []

    def spawn(argv, **kw):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, **kw)
        procs.append(p)
        return p

    wd = None
    try:
        nport = free_port()
        spawn(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(nport), "-sd", tmp])
        url = "nats://127.0.0.1:%d" % nport
        wait_for(lambda: socket.create_connection(("127.0.0.1", nport), 1).close() or True, 15,
                 "nats-server")
        for ep, wid, extra in (("pg.ok.gen", "pok", ["--tokens", "8", "--token-interval-ms", "20"]),
                               ("pg.long.gen", "plong",
                                ["--tokens", "2000", "--token-interval-ms", "20"]),
                               ("pg.refuse.gen", "pref", ["--refuse"])):
            w = spawn([a.cli, "worker", "--server", url, "--endpoint", ep, "--instance-id", wid,
                       "--lease-ms", "1000", "--quiet"] + extra)
            wait_line(w, "worker ready", 20)
        gw = spawn([a.cli, "gateway", "--server", url, "--listen", "127.0.0.1:0", "--model",
                    "ok=pg.ok.gen", "--model", "long=pg.long.gen", "--model", "refuse=pg.refuse.gen",
                    "--quiet", "--access-log", "off"])
        line = wait_line(gw, "gateway ready listen=", 20)
        gw_addr = line.split("listen=", 1)[1].strip()
        wait_for(lambda: urllib.request.urlopen("http://%s/readyz" % gw_addr, timeout=2).status
                 == 200, 20, "/readyz")

        dport = free_port()
        spawn([driver, "--port=%d" % dport])
        wait_for(lambda: json.loads(urllib.request.urlopen(
            "http://127.0.0.1:%d/status" % dport, timeout=2).read())["value"]["ready"], 20,
            "chromedriver")
        wd = WebDriver(dport)
        wd.start(chromium)

        print("1 the page loads and lists the models", flush=True)
        wd.go("http://%s/" % gw_addr)
        models = wait_for(lambda: wd.js(
            "return Array.from(document.getElementById('model').options).map(o=>o.value);"),
            15, "the model list")
        check(models == ["ok", "long", "refuse"], "the model list: %s" % models)

        print("2 a prompt streams to completion", flush=True)
        choose(wd, "ok")
        wd.click("#send")
        term = wait_terminal(wd)
        out, cls = wd.js(OUT)
        check(term[0] == "response.completed" and term[1] == "stop",
              "status: %s" % term[2])
        check(tokens_prefix(out) == 8, "the 8 tokens, in order, once: %r" % out)
        narr = wd.js("return document.getElementById('narr').textContent;")
        check(narr.startswith("end: completed"), "narration shows the end: %r" % narr)

        print("3 Stop cancels a long stream", flush=True)
        choose(wd, "long")
        wd.click("#send")
        wait_for(lambda: tokens_prefix(wd.js(OUT)[0]) >= 5, 20, "5 tokens")
        check(wd.js("return document.getElementById('stop').disabled;") is False,
              "Stop is enabled while streaming")
        t_stop = time.time()
        wd.click("#stop")
        term = wait_terminal(wd)
        took = (time.time() - t_stop) * 1000
        out1 = wd.js(OUT)[0]
        check(term[0] == "response.incomplete" and term[1] == "cancelled",
              "status after Stop: %s (%.0f ms)" % (term[2], took))
        n = tokens_prefix(out1)
        check(5 <= n < 2000, "the text is the stream's first %d tokens, in order" % n)
        time.sleep(0.5)
        check(wd.js(OUT)[0] == out1, "nothing arrives after the terminal")
        check(wd.js("return document.getElementById('stop').disabled;") is True,
              "Stop is disabled again")

        print("4 a refusal shows as one", flush=True)
        choose(wd, "refuse")
        wd.click("#send")
        term = wait_terminal(wd)
        out, cls = wd.js(OUT)
        check(term[0] == "response.completed", "status: %s" % term[2])
        check(out == "I'm sorry, but I can't help with that.", "refusal text: %r" % out)
        check("refusal" in cls, "styled as a refusal (class %r)" % cls)

        print("5 screenshot", flush=True)
        choose(wd, "ok")
        wd.click("#send")
        wait_terminal(wd)
        shot = os.path.join(a.out, "playground.png")
        png = wd.screenshot(shot)
        check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000,
              "a PNG of %d bytes in %s" % (len(png), shot))
    except RuntimeError as e:
        check(False, str(e))
    finally:
        if wd is not None:
            wd.quit()
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
        for p in reversed(procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
