"""python/tests/test_binding.py -- the Python binding against a real
nats-server (JetStream on, a temp dir, a port picked at run time): every
terminal kind, cancel seen from both sides, a worker process killed
mid-stream, the GIL (a slow handler does not stall other streams), async
handlers and async frontends, typed items, error classes, and both ways
between Python and the C CLI.

    STREAMWIRE_LIB=build/libstreamwire.so STREAMWIRE_CLI=build/streamwire \\
    STREAMWIRE_ABI=build/python/sw_python_abi python3 -m unittest discover -s python/tests

(ctest runs it as `python_binding`.)
"""
import asyncio
import ctypes
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import streamwire as sw  # noqa: E402
from streamwire import _lib  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CLI = os.environ.get("STREAMWIRE_CLI", os.path.join(ROOT, "build", "streamwire"))
ABI = os.environ.get("STREAMWIRE_ABI")


def die_with_parent():
    """preexec_fn: the child is killed when this process dies, even by a
    crash (a segfault in a foreign call left its nats-server running), as
    the C harness does (support/natsd.c)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Nats:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sw-py-")
        self.port = free_port()
        self.url = "nats://127.0.0.1:%d" % self.port
        self.proc = subprocess.Popen(["nats-server", "-js", "-a", "127.0.0.1", "-p",
                                      str(self.port), "-sd", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=die_with_parent)
        deadline = time.time() + 15
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nats-server did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


NATS = None


def setUpModule():
    global NATS
    NATS = Nats()


def tearDownModule():
    NATS.stop()


def tokens(n, prefix="token-"):
    return [("%s%d" % (prefix, i)).encode() for i in range(n)]


class Base(unittest.TestCase):
    def setUp(self):
        self.conn = sw.Connection(NATS.url)
        self.router = sw.Router(self.conn)
        self.workers = []

    def tearDown(self):
        self.router.close()
        for w in self.workers:
            w.close()
        self.conn.close()

    def worker(self, endpoint, handler, **kw):
        w = sw.Worker(self.conn, endpoint, handler, **kw)
        self.workers.append(w)
        return w

    def run_stream(self, endpoint, instance, payload=b"x", **kw):
        with self.router.open(endpoint, payload, instance_id=instance, **kw) as s:
            items, term = s.read_all()
        return [i.data for i in items], term


class TestAbi(unittest.TestCase):
    def test_structs_match_c(self):
        """The ctypes mirrors have the C compiler's sizes and offsets."""
        if not ABI:
            self.skipTest("STREAMWIRE_ABI not set (ctest sets it)")
        c = json.loads(subprocess.check_output([ABI]).decode())
        self.assertEqual(set(c), set(_lib.MIRRORED))
        for name, fields in c.items():
            cls = _lib.MIRRORED[name]
            self.assertEqual(fields["size"], __import__("ctypes").sizeof(cls), name)
            for f, off in fields.items():
                if f != "size":
                    self.assertEqual(getattr(cls, f).offset, off, "%s.%s" % (name, f))


class TestTerminals(Base):
    def test_completed_in_order(self):
        def h(req):
            self.assertEqual(req.text, "hello")
            for t in tokens(50):
                yield t
            return sw.Completed()
        w = self.worker("py.t.done", h)
        data, term = self.run_stream("py.t.done", w.instance_id, "hello")
        self.assertEqual(data, tokens(50))
        self.assertEqual((term.status, term.reason, term.error), ("completed", "stop", None))
        self.assertTrue(term.ok)

    def test_str_items_and_plain_return(self):
        def h(req):
            yield "caf\u00e9"
            yield b"\x00\xff"
        w = self.worker("py.t.str", h)
        data, term = self.run_stream("py.t.str", w.instance_id)
        self.assertEqual(data, ["caf\u00e9".encode(), b"\x00\xff"])
        self.assertEqual(term.status, "completed")

    def test_incomplete_max_tokens(self):
        def h(req):
            n = req.max_tokens or 100
            for t in tokens(n):
                yield t
            return sw.Incomplete("max_tokens")
        w = self.worker("py.t.inc", h)
        data, term = self.run_stream("py.t.inc", w.instance_id, max_tokens=7)
        self.assertEqual(data, tokens(7))
        self.assertEqual((term.status, term.reason), ("incomplete", "max_tokens"))

    def test_failed_with_code(self):
        def h(req):
            yield "a"
            return sw.Failed("engine_error", "CUDA out of memory")
        w = self.worker("py.t.fail", h)
        data, term = self.run_stream("py.t.fail", w.instance_id)
        self.assertEqual(data, [b"a"])
        self.assertEqual((term.status, term.reason, term.message),
                         ("failed", "engine_error", "CUDA out of memory"))

    def test_exception_fails_the_stream(self):
        def h(req):
            yield "a"
            raise ValueError("boom")
        w = self.worker("py.t.exc", h)
        data, term = self.run_stream("py.t.exc", w.instance_id)
        self.assertEqual(data, [b"a"])
        self.assertEqual(term.status, "failed")
        self.assertEqual(term.reason, "handler_error")
        self.assertIn("boom", term.message)

    def test_result_yielded_last(self):
        def h(req):
            yield "a"
            yield sw.Incomplete("length")
            yield "never sent"
        w = self.worker("py.t.yres", h)
        data, term = self.run_stream("py.t.yres", w.instance_id)
        self.assertEqual(data, [b"a"])
        self.assertEqual((term.status, term.reason), ("incomplete", "length"))

    def test_typed_items(self):
        def h(req):
            yield sw.Event("refusal", "I can't")
            yield "plain"
            yield sw.Event("metrics", b'{"tokens":1}', droppable=True)
        w = self.worker("py.t.typed", h)
        with self.router.open("py.t.typed", b"x", instance_id=w.instance_id) as s:
            items, term = s.read_all()
        self.assertEqual([(i.event, i.data, i.droppable) for i in items],
                         [("refusal", b"I can't", False), ("", b"plain", False),
                          ("metrics", b'{"tokens":1}', True)])
        self.assertEqual(term.status, "completed")

    def test_bad_event_name_fails_the_stream(self):
        def h(req):
            yield sw.Event("has space", "x")
        w = self.worker("py.t.badev", h)
        data, term = self.run_stream("py.t.badev", w.instance_id)
        self.assertEqual(data, [])
        self.assertEqual((term.status, term.reason, term.message),
                         ("failed", "send_failed", "invalid_argument"))

    def test_item_types(self):
        """bytearray and memoryview items are sent as their bytes; an int
        (or any other type) fails the stream with handler_error instead of
        being sent: bytes(3) is three zero bytes. A payload is checked the
        same way, before anything is sent."""
        def ok(req):
            yield bytearray(b"ba")
            yield memoryview(b"mv")
            yield sw.Event("metrics", bytearray(b"{}"))
        w = self.worker("py.t.types", ok)
        data, term = self.run_stream("py.t.types", w.instance_id, bytearray(b"p"))
        self.assertEqual(data, [b"ba", b"mv", b"{}"])
        self.assertEqual(term.status, "completed")

        closed = []

        def bad(req):
            try:
                if req.text == "event":
                    yield sw.Event("metrics", 5)
                else:
                    yield "a"
                    yield 3  # a token id, say
                yield "never sent"
            finally:
                closed.append(req.text)
        w = self.worker("py.t.int", bad)
        data, term = self.run_stream("py.t.int", w.instance_id, "int")
        self.assertEqual(data, [b"a"])
        self.assertEqual((term.status, term.reason), ("failed", "handler_error"))
        self.assertIn("TypeError", term.message)
        self.assertIn("not int", term.message)
        data, term = self.run_stream("py.t.int", w.instance_id, "event")
        self.assertEqual(data, [])
        self.assertEqual((term.status, term.reason), ("failed", "handler_error"))
        self.assertIn("not int", term.message)
        self.assertEqual(sorted(closed), ["event", "int"])  # the generators were closed
        with self.assertRaises(TypeError):
            self.router.open("py.t.int", 5, instance_id=w.instance_id)

    def test_no_responders_and_no_instances(self):
        data, term = self.run_stream("py.t.nobody", "nobody")
        self.assertEqual((term.status, term.error), ("error", "no_responders"))
        reg = sw.Registry(self.conn, bucket="py_t_empty")
        try:
            with sw.Router(self.conn, registry=reg) as r, r.open("py.t.none", b"x") as s:
                items, term = s.read_all()
            self.assertEqual(items, [])
            self.assertEqual((term.status, term.reason, term.error),
                             ("error", "no_instances", "no_instances"))
        finally:
            reg.close()

    def test_deadline(self):
        def h(req):
            yield "a"
            time.sleep(2)
            yield "b"
        w = self.worker("py.t.dl", h)
        data, term = self.run_stream("py.t.dl", w.instance_id, deadline_ms=300)
        self.assertEqual(data, [b"a"])
        self.assertEqual((term.status, term.error), ("error", "deadline_exceeded"))


class TestErrors(Base):
    def test_error_classes(self):
        with self.assertRaises(sw.InvalidArgumentError) as cm:
            self.router.open("not an endpoint", b"x", instance_id="w")
        self.assertEqual(cm.exception.name, "invalid_argument")
        self.assertEqual(cm.exception.code, 1)
        self.assertIs(sw.error_class("instance_lost"), sw.InstanceLostError)
        self.assertTrue(issubclass(sw.NoInstancesError, sw.StreamwireError))
        with self.assertRaises(sw.ConnectionFailedError):
            sw.Connection("nats://127.0.0.1:%d" % free_port(), connect_timeout_ms=300,
                          max_reconnect=0)
        with self.assertRaises(sw.InvalidArgumentError):
            self.worker("bad endpoint", lambda r: iter(()))
        with self.assertRaises(TypeError):
            sw.Connection(NATS.url, no_such_option=1)

    def test_error_class_names(self):
        """Stable names that end in _error are not given a second Error:
        TlsError (as documented), NatsError, DecodeError, ProtocolError,
        CryptoError; the doubled names they had stay as aliases."""
        for name, cls in [("tls_error", "TlsError"), ("nats_error", "NatsError"),
                          ("decode_error", "DecodeError"), ("protocol_error", "ProtocolError"),
                          ("crypto_error", "CryptoError")]:
            self.assertEqual(sw.error_class(name).__name__, cls)
            self.assertIs(getattr(sw, cls), sw.error_class(name))
            self.assertIs(getattr(sw, cls + "Error"), sw.error_class(name))
            self.assertIn(cls, sw.__all__)
        self.assertIs(sw.error_class("instance_lost"), sw.InstanceLostError)
        self.assertFalse([n for n in dir(sw) if n.endswith("ErrorError")
                          and getattr(sw, n).__name__.endswith("ErrorError")])
        # a CA file that does not load: the library's SW_ETLS
        with self.assertRaises(sw.TlsError) as cm:
            sw.Connection(NATS.url, tls_ca_file="/nonexistent/ca.pem", connect_timeout_ms=1000,
                          max_reconnect=0)
        self.assertEqual(cm.exception.name, "tls_error")
        self.assertEqual(type(cm.exception).__name__, "TlsError")

    def test_closed_router(self):
        r = sw.Router(self.conn)
        r.close()
        with self.assertRaises(sw.ClosedError):
            r.open("py.e.x", b"x", instance_id="w")


    def test_router_close_racing_open(self):
        """Router.close() on one thread while others open streams: an
        open() under way is waited for (its stream ends "closed" or
        completed), a later one raises ClosedError; the router was freed
        under an open() in flight before."""
        w = self.worker("py.race.ro", lambda req: iter([b"a"]))
        outcomes = {"streams": 0, "closed": 0, "other": []}
        lock = threading.Lock()
        for loop in range(30):
            r = sw.Router(self.conn)
            go = threading.Event()

            def opener():
                go.wait()
                for _ in range(50):
                    try:
                        s = r.open("py.race.ro", b"x", instance_id=w.instance_id)
                    except sw.ClosedError:
                        with lock:
                            outcomes["closed"] += 1
                        return
                    items, term = s.read_all()
                    s.close()
                    with lock:
                        outcomes["streams"] += 1
                        if term.status != "completed" and term.error != "closed":
                            outcomes["other"].append((term.status, term.error))
            ts = [threading.Thread(target=opener) for _ in range(3)]
            for t in ts:
                t.start()
            go.set()
            time.sleep(0.001 * (loop % 5))
            r.close()
            for t in ts:
                t.join(20)
                self.assertFalse(t.is_alive(), "an opener hangs after close (loop %d)" % loop)
            with self.assertRaises(sw.ClosedError):
                r.open("py.race.ro", b"x", instance_id=w.instance_id)
        self.assertEqual(outcomes["other"], [])
        self.assertEqual(outcomes["closed"], 90)  # every opener ended on ClosedError
        self.assertGreater(outcomes["streams"], 0)

    def test_worker_close_racing_drain(self):
        """Worker.close() while drain() runs on another thread waits for the
        drain (which lets the open stream finish) instead of freeing the
        ingress under it."""
        def slow(req):
            for _ in range(20):
                time.sleep(0.01)
                yield "s"
        w = self.worker("py.race.wd", slow)
        s = self.router.open("py.race.wd", b"x", instance_id=w.instance_id)
        self.assertEqual(s.next_item(5000).data, b"s")
        t = threading.Thread(target=w.drain, args=(5000,))
        t.start()
        time.sleep(0.02)
        w.close()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertIsNone(w._h)
        items, term = s.read_all()
        s.close()
        self.assertEqual(term.status, "completed")
        self.assertEqual(len(items), 19)

    def test_connection_close_closes_its_users(self):
        # The library requires routers, workers and registries closed
        # before their connection (their timers use it); Connection.close
        # closes the ones still open first, so a script that closes the
        # connection first does not leave them on freed memory.
        c = sw.Connection(NATS.url)
        reg = sw.Registry(c, backend="memory")
        w = sw.Worker(c, "py.users.x", lambda r: iter([b"a", b"b"]), registry=reg)
        r = sw.Router(c, registry=reg)
        with r.open("py.users.x", b"x", instance_id=w.instance_id) as s:
            items, term = s.read_all()
        self.assertEqual([i.data for i in items], [b"a", b"b"])
        self.assertEqual(term.status, "completed")
        c.close()
        self.assertIsNone(w._h)
        self.assertIsNone(r._h)
        self.assertIsNone(reg._h)
        time.sleep(0.1)  # a router tick after the close would have used it
        with self.assertRaises(sw.ClosedError):
            r.open("py.users.x", b"x", instance_id=w.instance_id)
        r.close()  # and closing again is a no-op
        w.close()
        reg.close()
        c.close()


class TestCancel(Base):
    def test_frontend_cancel_reaches_the_handler(self):
        seen = {"cancelled": False, "flag": False, "sent": 0}
        started = threading.Event()

        def h(req):
            try:
                for t in tokens(100000):
                    seen["sent"] += 1
                    started.set()
                    time.sleep(0.002)
                    yield t
            except sw.Cancelled:
                seen["cancelled"] = True
                seen["flag"] = req.cancelled
                raise
        w = self.worker("py.c.fe", h)
        with self.router.open("py.c.fe", b"x", instance_id=w.instance_id) as s:
            got = []
            for item in s:
                got.append(item.data)
                if len(got) == 20:
                    s.cancel()
            term = s.terminal
        self.assertEqual(got, tokens(len(got)))  # in order, no gaps
        self.assertGreaterEqual(len(got), 20)
        self.assertEqual(term.status, "cancelled")
        deadline = time.time() + 5
        while not seen["cancelled"] and time.time() < deadline:
            time.sleep(0.01)
        self.assertTrue(seen["cancelled"], "the handler saw Cancelled")
        self.assertTrue(seen["flag"], "req.cancelled was true")
        self.assertLess(seen["sent"], 100000)

    def test_close_cancels(self):
        gone = threading.Event()

        def h(req):
            try:
                while True:
                    time.sleep(0.005)
                    yield "x"
            except sw.Cancelled:
                gone.set()
                raise
        w = self.worker("py.c.close", h)
        with self.router.open("py.c.close", b"x", instance_id=w.instance_id) as s:
            s.next_item(5000)
        self.assertTrue(gone.wait(5), "closing the stream cancelled the handler")

    def test_c_frontend_cancels_python_worker(self):
        """The CLI's generate --cancel-after against a Python worker."""
        gone = threading.Event()

        def h(req):
            try:
                for t in tokens(100000):
                    time.sleep(0.002)
                    yield t
            except sw.Cancelled:
                gone.set()
                raise
        w = self.worker("py.c.cli", h)
        out = subprocess.run([CLI, "generate", "--server", NATS.url, "--endpoint", "py.c.cli",
                              "--instance-id", w.instance_id, "--cancel-after", "5", "--json"],
                             capture_output=True, timeout=30)
        lines = [json.loads(x) for x in out.stdout.decode().splitlines()]
        self.assertEqual(lines[-1]["terminal"], "cancelled")
        self.assertEqual([x["data"] for x in lines[:5]], ["token-%d" % i for i in range(5)])
        self.assertTrue(gone.wait(5))


class TestStreamClose(Base):
    """Stream.close() from another thread than the consumer's, which may be
    blocked in sw_stream_next: close used to free the stream under it (a
    heap corruption abort, or a use after free under ASan, within a few
    hundred loops)."""

    def endless(self, endpoint):
        handled = []
        started = []

        def h(req):
            started.append(req.request_id)
            try:
                while True:
                    time.sleep(0.005)
                    yield "x"
            except sw.Cancelled:
                handled.append(req.request_id)
                raise
        return self.worker(endpoint, h, threads=8), handled, started

    def assert_handlers_cancelled(self, handled, started, n):
        # A close right after the open can overtake its request (the CANCEL
        # goes to the worker's control subscription, the request to its
        # request one): the worker then never starts it, and there is no
        # handler to tell. Every handler that did start sees the cancel.
        deadline = time.time() + 10
        while sorted(handled) != sorted(started) and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(sorted(handled), sorted(started),
                         "every handler that started saw its stream cancelled")
        self.assertGreaterEqual(len(started), n - n // 10, "most requests ran")

    def test_close_from_another_thread(self):
        w, handled, started = self.endless("py.sc.thr")
        n = 150
        outcomes = []
        for i in range(n):
            s = self.router.open("py.sc.thr", b"x", instance_id=w.instance_id)
            seen = {"items": 0, "terminals": 0, "error": None}

            def consume():
                try:
                    for item in s:
                        assert item.data == b"x", item
                        seen["items"] += 1
                    seen["terminals"] += 1
                    # iterating again: the terminal is not handed out twice
                    seen["after"] = list(s)
                except sw.ClosedError:
                    seen["error"] = "closed"
            t = threading.Thread(target=consume)
            t.start()
            time.sleep(0.002 + (i % 10) * 0.004)
            s.close()
            t.join(10)
            self.assertFalse(t.is_alive(), "the consumer hangs after close (loop %d)" % i)
            s.close()  # again: a no-op
            outcomes.append((seen["terminals"], seen["error"],
                             s.terminal.status if s.terminal else None, seen.get("after")))
        for terminals, error, status, after in outcomes:
            if error is None:
                # close() cancelled the stream and woke the consumer with it
                self.assertEqual((terminals, status, after), (1, "cancelled", []))
            else:
                # close() came between two reads: the next one is refused
                self.assertEqual((terminals, status), (0, None))
        self.assertEqual(len(outcomes), n)
        self.assertGreater(sum(1 for o in outcomes if o[0] == 1), n // 2)
        self.assert_handlers_cancelled(handled, started, n)

    def test_async_timeout_around_a_stream(self):
        """asyncio.wait_for around `with router.open(..) as s: async for ..`:
        on the timeout the task is cancelled while the executor thread is
        still in next_item, and the with block's close() must wait for it."""
        w, handled, started = self.endless("py.sc.async")
        n = 150
        got = []

        async def consume():
            with self.router.open("py.sc.async", b"x", instance_id=w.instance_id) as s:
                got.append(s)
                async for item in s:
                    self.assertEqual(item.data, b"x")

        async def main():
            timeouts = 0
            for i in range(n):
                try:
                    await asyncio.wait_for(consume(), 0.01 + (i % 10) * 0.005)
                except asyncio.TimeoutError:
                    timeouts += 1
            return timeouts
        self.assertEqual(asyncio.run(main()), n)
        self.assertEqual(len(got), n)
        for s in got:
            self.assertIsNone(s._h)
            self.assertIn(s.terminal and s.terminal.status, (None, "cancelled"))
            if s.terminal is None:  # closed between two reads
                with self.assertRaises(sw.ClosedError):
                    s.next_item(0)
            else:  # closed while a read waited: it got the CANCELLED terminal
                self.assertIsNone(s.next_item(0))
        self.assert_handlers_cancelled(handled, started, n)


class TestLifetimes(Base):
    def test_dropped_worker_keeps_serving(self):
        """A Worker the program drops without close(): the Connection holds
        it (and its handler callback) until the connection closes. It used
        to be collected while its ingress still served: the next request
        called a freed callback (a segfault)."""
        c = sw.Connection(NATS.url)

        def h(req):
            yield "a"
            yield req.text

        def start():
            w = sw.Worker(c, "py.l.drop", h, instance_id="pydropped")  # not kept
            return w.instance_id
        try:
            iid = start()
            for _ in range(3):
                gc.collect()
            for i in range(5):
                data, term = self.run_stream("py.l.drop", iid, "r%d" % i)
                self.assertEqual(data, [b"a", b"r%d" % i])
                self.assertEqual(term.status, "completed")
        finally:
            c.close()
        # the connection's close closed it: nobody serves the instance now
        data, term = self.run_stream("py.l.drop", iid)
        self.assertEqual(data, [])
        self.assertEqual((term.status, term.error), ("error", "no_responders"))
        # and a closed Worker is let go
        w = sw.Worker(self.conn, "py.l.drop2", h)
        ref = __import__("weakref").ref(w)
        w.close()
        del w
        gc.collect()
        self.assertIsNone(ref())

    def test_dropped_connection_and_worker_keep_serving(self):
        """The program drops the Connection as well as the Worker: the two
        made a garbage cycle the collector freed under the running ingress
        (a segfault at the next request). Open Workers are held until
        closed."""
        def h(req):
            yield "b"

        def start():
            c = sw.Connection(NATS.url)
            sw.Worker(c, "py.l.drop3", h, instance_id="pydropped3")  # neither kept
        start()
        for _ in range(3):
            gc.collect()
        for i in range(3):
            data, term = self.run_stream("py.l.drop3", "pydropped3", "r%d" % i)
            self.assertEqual(data, [b"b"])
            self.assertEqual(term.status, "completed")
        for w in list(sw._LIVE_WORKERS):
            if w.instance_id == "pydropped3":
                w._conn.close()
        self.assertFalse([w for w in sw._LIVE_WORKERS if w.instance_id == "pydropped3"])

    def test_close_from_a_signal_handler(self):
        """Stream.close() in a signal handler that runs while the same
        thread is in next_item, and Worker.close() in one that runs during
        its drain(): neither can wait for a call of its own thread, so the
        handle is freed when that call ends. Both used to wait for ever."""
        import signal as sig

        def slow(req):
            for _ in range(300):
                time.sleep(0.01)
                yield "t"
        w = self.worker("py.l.sig", slow)
        s = self.router.open("py.l.sig", b"x", instance_id=w.instance_id)
        old = sig.signal(sig.SIGALRM, lambda *a: s.close())
        try:
            sig.setitimer(sig.ITIMER_REAL, 0.3)
            n = 0
            t0 = time.time()
            try:
                for _ in s:
                    n += 1
            except sw.ClosedError:
                pass
            self.assertLess(time.time() - t0, 5)
            self.assertGreater(n, 5)
            self.assertIsNone(s._h)  # freed when next_item returned
            # a drain interrupted by a close from a signal handler
            s2 = self.router.open("py.l.sig", b"x", instance_id=w.instance_id)
            self.assertEqual(s2.next_item(5000).data, b"t")
            sig.signal(sig.SIGALRM, lambda *a: w.close())
            sig.setitimer(sig.ITIMER_REAL, 0.2)
            t0 = time.time()
            w.drain(1500)
            self.assertLess(time.time() - t0, 5)
            self.assertIsNone(w._h)
            s2.close()
        finally:
            sig.setitimer(sig.ITIMER_REAL, 0)
            sig.signal(sig.SIGALRM, old)

    def test_connection_closed_twice_at_once(self):
        """Connection.close() on two threads at once closes its users and
        the connection once (both called sw_conn_close before: a double
        free)."""
        for _ in range(20):
            c = sw.Connection(NATS.url)
            w = sw.Worker(c, "py.l.cc", lambda req: iter([b"a"]))
            r = sw.Router(c)
            go = threading.Event()
            ts = [threading.Thread(target=lambda: (go.wait(), c.close())) for _ in range(2)]
            for t in ts:
                t.start()
            go.set()
            for t in ts:
                t.join(10)
                self.assertFalse(t.is_alive())
            self.assertIsNone(c._h)
            self.assertIsNone(w._h)
            self.assertIsNone(r._h)
            with self.assertRaises(sw.ClosedError):
                c.handle

    def test_c_strings_are_str_or_bytes(self):
        """A header value, an id or a reason that is not str or bytes raises
        TypeError: bytes(1) was one zero byte, which C read as empty."""
        with self.assertRaises(TypeError):
            self.router.open("py.l.x", b"x", instance_id="w", headers={"n": 1})
        with self.assertRaises(TypeError):
            self.router.open("py.l.x", b"x", instance_id=7)

    def test_registry_close_closes_its_routers(self):
        """The library requires a registry to outlive the routers made with
        it. Registry.close() closes those still open first: their streams
        end with error "closed", and they refuse new ones. It used to free
        the registry under them (a use after free at the router's next
        pick or close). A closed registry is refused for new Routers and
        Workers."""
        reg = sw.Registry(self.conn, backend="memory")
        w = self.worker("py.l.reg", lambda req: iter([b"a", b"b"]), registry=reg)

        def slow(req):
            while True:
                time.sleep(0.01)
                yield "s"
        ws = self.worker("py.l.regslow", slow, registry=reg)
        r = sw.Router(self.conn, registry=reg)
        other = sw.Router(self.conn)  # no registry: not the registry's
        try:
            with r.open("py.l.reg", b"x") as s:
                items, term = s.read_all()
            self.assertEqual([i.data for i in items], [b"a", b"b"])
            self.assertEqual(term.status, "completed")
            open_stream = r.open("py.l.regslow", b"x")
            self.assertEqual(open_stream.next_item(5000).data, b"s")
            reg.close()
            self.assertIsNone(r._h)
            self.assertIsNone(reg._h)
            self.assertEqual(reg._routers, {})
            items, term = open_stream.read_all()
            self.assertEqual((term.status, term.error), ("error", "closed"))
            open_stream.close()
            with self.assertRaises(sw.ClosedError):
                r.open("py.l.reg", b"x")
            with self.assertRaises(sw.ClosedError):
                sw.Router(self.conn, registry=reg)
            with self.assertRaises(sw.ClosedError):
                sw.Worker(self.conn, "py.l.reg2", lambda req: iter(()), registry=reg)
            # the others go on
            self.assertIsNotNone(other._h)
            data, term = self.run_stream("py.l.reg", w.instance_id)
            self.assertEqual(data, [b"a", b"b"])
            r.close()  # a no-op now
            reg.close()
        finally:
            other.close()
            r.close()
            reg.close()
        self.assertIsNotNone(ws._h)

    def test_request_used_after_the_handler_returned(self):
        """A Request kept past its sync handler (here by another thread that
        watches it): once the handler has returned the library frees the
        responder, so the Request no longer reaches it -- header() is None,
        cancelled is True, deadline_left_ms is 0 -- while its copies
        (payload, request_id, ...) stay. It used to read the freed
        responder (cancelled came back False, under ASan a use after
        free)."""
        kept = []
        during = []
        polls = {"n": 0, "stop": False}

        def h(req):
            during.append((req.header("k"), req.cancelled, req.deadline_left_ms is not None))
            kept.append(req)
            until = time.time() + 5
            while polls["n"] < 20 and time.time() < until:  # the watcher is under way
                time.sleep(0.001)
            yield "a"

        def watch():  # calls the Request across the handler's return
            while not polls["stop"]:
                if kept:
                    kept[0].cancelled
                    kept[0].header("k")
                    polls["n"] += 1
                time.sleep(0.0005)
        t = threading.Thread(target=watch)
        t.start()
        try:
            w = self.worker("py.l.req", h)
            with self.router.open("py.l.req", b"hello", instance_id=w.instance_id,
                                  headers={"k": "v"}, deadline_ms=60000) as s:
                items, term = s.read_all()
            self.assertEqual([i.data for i in items], [b"a"])
            self.assertEqual(term.status, "completed")
            self.assertEqual(during, [("v", False, True)])
            req = kept[0]
            deadline = time.time() + 5
            while not req.cancelled and time.time() < deadline:
                time.sleep(0.01)
        finally:
            polls["stop"] = True
            t.join(5)
        self.assertTrue(req.cancelled)
        self.assertIsNone(req.header("k"))
        self.assertEqual(req.deadline_left_ms, 0)
        self.assertEqual((req.payload, req.text), (b"hello", "hello"))
        self.assertEqual(req.request_id, s.request_id)
        self.assertGreater(polls["n"], 0)


class TestProcesses(Base):
    def test_worker_process_killed_mid_stream(self):
        env = dict(os.environ)
        p = subprocess.Popen([sys.executable, os.path.join(ROOT, "python", "examples", "worker.py"),
                              "--server", NATS.url, "--endpoint", "py.p.kill", "--instance-id",
                              "pykill", "--tokens", "100000", "--token-interval-ms", "5",
                              "--registry", "none"], stdout=subprocess.PIPE, env=env)
        try:
            line = p.stdout.readline().decode()
            self.assertIn("worker ready instance=pykill", line)
            got = []
            with self.router.open("py.p.kill", b"x", instance_id="pykill") as s:
                t0 = None
                for item in s:
                    got.append(item.data)
                    if len(got) == 10:
                        p.send_signal(signal.SIGKILL)
                        t0 = time.time()
                term = s.terminal
            took = (time.time() - t0) * 1000
            self.assertEqual(got, tokens(len(got)))
            self.assertEqual((term.status, term.error), ("error", "instance_lost"))
            self.assertLess(took, 3000)
        finally:
            p.kill()
            p.wait()

    def test_example_worker_replicas_and_health(self):
        """worker.py --replicas reaches the registry bucket it creates: a
        single node cannot hold 3 copies, so the worker says it cannot open
        the registry and exits 1 (it used to have no --replicas at all and
        created the bucket with one copy, whatever the cluster). With
        --health-listen it answers GET /healthz: 200 while it serves, 503
        once SIGTERM drains it."""
        worker = os.path.join(ROOT, "python", "examples", "worker.py")
        p = subprocess.run([sys.executable, worker, "--server", NATS.url, "--endpoint",
                            "py.p.r3", "--bucket", "py_p_r3", "--replicas", "3"],
                           capture_output=True, timeout=60)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("cannot open the nats-kv registry (bucket py_p_r3, 3 replicas)", err)
        self.assertEqual(p.stdout, b"")

        p = subprocess.Popen([sys.executable, worker, "--server", NATS.url, "--endpoint",
                              "py.p.health", "--instance-id", "pyhealth", "--bucket", "py_p_r1",
                              "--replicas", "1", "--tokens", "100000", "--token-interval-ms", "5",
                              "--drain-grace-ms", "1500", "--health-listen", "127.0.0.1:0"],
                             stdout=subprocess.PIPE)
        try:
            line = p.stdout.readline().decode()
            self.assertIn("worker ready instance=pyhealth", line)
            url = "http://%s/healthz" % line.split("health=")[1].strip()
            with urllib.request.urlopen(url, timeout=5) as resp:
                self.assertEqual((resp.status, resp.read()), (200, b"ok\n"))
            with sw.Registry(self.conn, bucket="py_p_r1") as reg, \
                    sw.Router(self.conn, registry=reg) as r:
                with r.open("py.p.health", b"x") as s:
                    self.assertEqual(s.next_item(5000).data, b"token-0")
                    p.send_signal(signal.SIGTERM)
                    code = None
                    deadline = time.time() + 5
                    while code != 503 and time.time() < deadline:
                        try:
                            urllib.request.urlopen(url, timeout=5).close()
                        except urllib.error.HTTPError as e:
                            code = e.code
                        time.sleep(0.05)
                    self.assertEqual(code, 503)
            self.assertEqual(p.wait(15), 0)
        finally:
            p.kill()
            p.wait()
            p.stdout.close()

    def test_compose_python_worker(self):
        """docker-compose.yml: every service has a healthcheck, and every
        worker that may create the registry bucket (the C workers, the
        Python worker, the gateway) creates it with 3 replicas."""
        try:
            import yaml
        except ImportError:
            self.skipTest("PyYAML not installed")
        with open(os.path.join(ROOT, "docker-compose.yml")) as f:
            services = yaml.safe_load(f)["services"]
        self.assertIn("workerpy", services)
        for name, svc in services.items():
            self.assertIn("test", svc.get("healthcheck", {}), name)
            cmd = svc.get("command", [])
            if not name.startswith("nats"):
                self.assertIn("--replicas", cmd, name)
                self.assertEqual(cmd[cmd.index("--replicas") + 1], "3", name)
        py = services["workerpy"]
        listen = py["command"][py["command"].index("--health-listen") + 1]
        self.assertIn("http://%s/healthz" % listen, py["healthcheck"]["test"])

    def test_python_worker_to_c_frontend_and_back(self):
        """streamwire generate reads a Python worker; Python reads `streamwire worker`."""
        def h(req):
            for t in tokens(12):
                yield t
        w = self.worker("py.p.cli", h)
        out = subprocess.run([CLI, "generate", "--server", NATS.url, "--endpoint", "py.p.cli",
                              "--instance-id", w.instance_id, "--json"], capture_output=True,
                             timeout=30)
        lines = [json.loads(x) for x in out.stdout.decode().splitlines()]
        self.assertEqual([x["data"] for x in lines[:-1]], ["token-%d" % i for i in range(12)])
        self.assertEqual(lines[-1]["terminal"], "completed")
        self.assertEqual(out.returncode, 0)

        c = subprocess.Popen([CLI, "worker", "--server", NATS.url, "--endpoint", "py.p.cw",
                              "--instance-id", "cworker", "--tokens", "9", "--registry", "none",
                              "--quiet"], stdout=subprocess.PIPE)
        try:
            self.assertIn("worker ready", c.stdout.readline().decode())
            data, term = self.run_stream("py.p.cw", "cworker")
            self.assertEqual(data, tokens(9))
            self.assertEqual(term.status, "completed")
        finally:
            c.terminate()
            c.wait(10)

    def test_registry_routing_and_example_worker(self):
        """The example worker registers; a Router with the Registry finds it."""
        p = subprocess.Popen([sys.executable, os.path.join(ROOT, "python", "examples", "worker.py"),
                              "--server", NATS.url, "--endpoint", "py.p.reg", "--instance-id",
                              "pyreg", "--tokens", "5", "--lease-ms", "1000"],
                             stdout=subprocess.PIPE)
        try:
            self.assertIn("worker ready", p.stdout.readline().decode())
            with sw.Registry(self.conn, lease_ms=1000) as reg, \
                    sw.Router(self.conn, registry=reg) as r:
                deadline = time.time() + 10
                while True:
                    with r.open("py.p.reg", b"x") as s:
                        items, term = s.read_all()
                    if term.status == "completed" or time.time() > deadline:
                        break
                    time.sleep(0.1)
                self.assertEqual([i.data for i in items], tokens(5))
                self.assertEqual(s.instance_id, "pyreg")
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(15), 0)
        finally:
            p.kill()
            p.wait()


class TestSealed(unittest.TestCase):
    def test_sealed_and_mixed(self):
        """A cluster key (streamwire keygen) through Connection(seal_key_file=):
        sealed both sides stream; a frontend without the key gets
        auth_failed at once; a bad key file raises NotPermittedError."""
        d = tempfile.mkdtemp(prefix="sw-py-key-")
        key = os.path.join(d, "cluster.key")
        try:
            subprocess.run([CLI, "keygen", "--out", key], check=True, capture_output=True)
            with sw.Connection(NATS.url, seal_key_file=key) as wc, \
                    sw.Connection(NATS.url, seal_key_file=key) as fc, \
                    sw.Connection(NATS.url) as uc:
                def h(req):
                    for t in tokens(20):
                        yield t
                with sw.Worker(wc, "py.s.gen", h) as w, sw.Router(fc) as r, sw.Router(uc) as u:
                    with r.open("py.s.gen", b"x", instance_id=w.instance_id) as s:
                        items, term = s.read_all()
                    self.assertEqual([i.data for i in items], tokens(20))
                    self.assertEqual(term.status, "completed")
                    with u.open("py.s.gen", b"x", instance_id=w.instance_id) as s:
                        items, term = s.read_all()
                    self.assertEqual(items, [])
                    self.assertEqual((term.status, term.error), ("error", "auth_failed"))
            os.chmod(key, 0o644)
            with self.assertRaises(sw.NotPermittedError):
                sw.Connection(NATS.url, seal_key_file=key)
        finally:
            shutil.rmtree(d, ignore_errors=True)


class TestGil(Base):
    def test_slow_handler_does_not_stall_others(self):
        """One handler sleeps 3 s between items; another stream completes
        meanwhile, promptly."""
        def h(req):
            if req.text == "slow":
                yield "s0"
                time.sleep(3)
                yield "s1"
            else:
                for t in tokens(200):
                    yield t
        w = self.worker("py.g.slow", h, threads=4)
        slow = self.router.open("py.g.slow", b"slow", instance_id=w.instance_id)
        self.assertEqual(slow.next_item(5000).data, b"s0")
        t0 = time.time()
        data, term = self.run_stream("py.g.slow", w.instance_id, b"fast")
        took = time.time() - t0
        self.assertEqual(data, tokens(200))
        self.assertEqual(term.status, "completed")
        self.assertLess(took, 1.5, "the fast stream waited for the slow handler")
        slow.close()

    def test_consumer_threads_run_in_parallel(self):
        """Two Python consumers blocked in next_item do not block each other."""
        def h(req):
            for t in tokens(300):
                time.sleep(0.001)
                yield t
        w = self.worker("py.g.par", h)
        results = []

        def consume():
            results.append(self.run_stream("py.g.par", w.instance_id))
        ts = [threading.Thread(target=consume) for _ in range(4)]
        t0 = time.time()
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        self.assertEqual(len(results), 4)
        for data, term in results:
            self.assertEqual(data, tokens(300))
            self.assertEqual(term.status, "completed")
        self.assertLess(time.time() - t0, 10)


class TestAsync(Base):
    def test_async_handler_and_async_frontend(self):
        loop = asyncio.new_event_loop()
        th = threading.Thread(target=loop.run_forever, daemon=True)
        th.start()

        async def h(req):
            for i in range(30):
                await asyncio.sleep(0.001)
                yield "a%d" % i
            yield sw.Incomplete("max_tokens")
        w = None
        try:
            w = self.worker("py.a.gen", h, loop=loop)

            async def consume():
                got = []
                with self.router.open("py.a.gen", b"x", instance_id=w.instance_id) as s:
                    async for item in s:
                        got.append(item.text)
                    return got, s.terminal
            got, term = asyncio.run(consume())
            self.assertEqual(got, ["a%d" % i for i in range(30)])
            self.assertEqual((term.status, term.reason), ("incomplete", "max_tokens"))
        finally:
            # The worker first, while the loop runs: the handler's coroutine
            # resumes on the loop after its terminal went out, and closing
            # waits for the handler. Stopping the loop first could strand
            # it (the consumer may see the terminal before the coroutine
            # resumes): w.close() then waited for ever (a CI run hung here).
            if w is not None:
                w.close()
            loop.call_soon_threadsafe(loop.stop)
            th.join(5)

    def test_async_handler_loop_stops(self):
        """The loop given as loop= stops while a handler's coroutine waits
        on it: the stream fails with handler_error naming the loop (it used
        to hang: the handler thread waited for the coroutine for ever), the
        worker closes, and the coroutine, if the loop ever runs again, no
        longer touches the finished request."""
        loop = asyncio.new_event_loop()
        th = threading.Thread(target=loop.run_forever, daemon=True)
        th.start()
        started = threading.Event()
        ended = []

        async def h(req):
            try:
                yield "first"
                started.set()
                await asyncio.sleep(1.5)  # the loop stops meanwhile
                yield "after"
            finally:
                ended.append(req.cancelled)
        w = self.worker("py.a.stop", h, loop=loop)
        try:
            with self.router.open("py.a.stop", b"x", instance_id=w.instance_id) as s:
                self.assertTrue(started.wait(10))
                loop.call_soon_threadsafe(loop.stop)
                th.join(5)
                self.assertFalse(th.is_alive())
                t0 = time.time()
                items, term = s.read_all()
            self.assertLess(time.time() - t0, 10)
            self.assertEqual([i.text for i in items], ["first"])
            self.assertEqual((term.status, term.reason), ("failed", "handler_error"))
            self.assertIn("loop", term.message)
            t0 = time.time()
            w.close()
            self.assertLess(time.time() - t0, 10)
            self.assertEqual(ended, [])
            # The loop runs again: the coroutine is cancelled, its cleanup
            # runs and sees the request as cancelled without reaching the
            # responder the library has freed.
            th = threading.Thread(target=loop.run_forever, daemon=True)
            th.start()
            for _ in range(50):
                if ended:
                    break
                time.sleep(0.1)
            self.assertEqual(ended, [True])
        finally:
            w.close()
            loop.call_soon_threadsafe(loop.stop)
            th.join(5)

    def test_async_handler_loop_stops_during_a_blocked_send(self):
        """The loop stops while the coroutine's send waits for credit (its
        consumer does not read): the request is given up within seconds
        and the handler thread is free again. Before, giving up waited for
        the gate's lock, held across that send until send_timeout_ms: the
        worker's one handler thread stayed blocked, and the next request
        waited behind it."""
        loop = asyncio.new_event_loop()
        th = threading.Thread(target=loop.run_forever, daemon=True)
        th.start()
        blocked = threading.Event()

        async def h(req):
            if req.text == "second":
                yield "y"
                return
            for i in range(100):
                if i == 4:
                    blocked.set()  # t4 waits for credit (a window of 4)
                yield "t%d" % i
        w = self.worker("py.a.blk", h, loop=loop, threads=1, send_timeout_ms=60000)
        try:
            with self.router.open("py.a.blk", b"first", instance_id=w.instance_id,
                                  credit_window=4) as s:
                self.assertTrue(blocked.wait(10))
                time.sleep(0.3)  # the send waits for credit
                loop.call_soon_threadsafe(loop.stop)
                th.join(5)
                self.assertFalse(th.is_alive())
                t0 = time.time()
                data, term = self.run_stream("py.a.blk", w.instance_id, b"second")
                self.assertLess(time.time() - t0, 10)
                self.assertEqual((term.status, term.reason), ("failed", "handler_error"))
                items, term = s.read_all()
                self.assertEqual([i.text for i in items], ["t%d" % i for i in range(len(items))])
                self.assertEqual((term.status, term.reason), ("failed", "handler_error"))
                self.assertIn("loop", term.message)
        finally:
            w.close()
            if not th.is_alive():
                th = threading.Thread(target=loop.run_forever, daemon=True)
                th.start()
            loop.call_soon_threadsafe(loop.stop)
            th.join(5)

    def test_async_handler_task_cancelled_during_a_blocked_send(self):
        """The handler's task is cancelled (as asyncio.run does to tasks
        left at exit) while its send waits for credit on an executor
        thread: the handler thread fails the stream and waits for that
        send before it returns and the library frees the responder.
        Before, it returned at once with the send still running on it."""
        loop = asyncio.new_event_loop()
        th = threading.Thread(target=loop.run_forever, daemon=True)
        th.start()
        blocked = threading.Event()

        async def h(req):
            for i in range(100):
                if i == 4:
                    blocked.set()  # t4 waits for credit (a window of 4)
                yield "t%d" % i

        def cancel_all():
            for t in asyncio.all_tasks(loop):
                t.cancel()
        w = self.worker("py.a.cxl", h, loop=loop, send_timeout_ms=60000)
        try:
            with self.router.open("py.a.cxl", b"x", instance_id=w.instance_id,
                                  credit_window=4) as s:
                self.assertTrue(blocked.wait(10))
                time.sleep(0.3)  # the send waits for credit
                loop.call_soon_threadsafe(cancel_all)
                t0 = time.time()
                items, term = s.read_all()
                self.assertLess(time.time() - t0, 10)
                self.assertEqual([i.text for i in items], ["t%d" % i for i in range(len(items))])
                self.assertEqual((term.status, term.reason), ("failed", "handler_error"))
                self.assertIn("Cancelled", term.message)
            # the worker serves on
            data, term = self.run_stream("py.a.cxl", w.instance_id, b"x", credit_window=256)
            self.assertEqual(data[:3], [b"t0", b"t1", b"t2"])
            self.assertEqual(term.status, "completed")
        finally:
            w.close()
            loop.call_soon_threadsafe(loop.stop)
            th.join(5)

    def test_async_handler_loop_not_running(self):
        """A loop that never runs: each request fails with handler_error
        within seconds instead of holding a handler thread for ever."""
        loop = asyncio.new_event_loop()

        async def h(req):
            yield "x"
        w = self.worker("py.a.idle", h, loop=loop)
        try:
            t0 = time.time()
            data, term = self.run_stream("py.a.idle", w.instance_id)
            self.assertLess(time.time() - t0, 10)
            self.assertEqual(data, [])
            self.assertEqual((term.status, term.reason), ("failed", "handler_error"))
            self.assertIn("loop", term.message)
        finally:
            w.close()
            loop.close()

    def test_async_handler_needs_a_loop(self):
        async def h(req):
            yield "x"
        with self.assertRaises(TypeError):
            self.worker("py.a.noloop", h)


if __name__ == "__main__":
    unittest.main()
