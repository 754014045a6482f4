"""streamwire -- Python binding of the streamwire C library (ctypes, no
dependencies beyond the standard library).

Workers::

    import streamwire as sw

    def handler(req):                      # runs on one of the library's handler threads
        for i in range(16):
            yield "token-%d" % i           # str (sent as UTF-8), bytes, bytearray, memoryview
        return sw.Completed()              # or sw.Incomplete("max_tokens"), sw.Failed(code, msg)

    with sw.Connection("nats://127.0.0.1:4222") as conn, \\
         sw.Registry(conn) as reg, \\
         sw.Worker(conn, "demo.llm.generate", handler, registry=reg) as w:
        w.wait()                            # until close() or a signal

Frontends::

    with sw.Router(conn, registry=reg) as router:
        with router.open("demo.llm.generate", "hello") as stream:
            for item in stream:             # sw.Item: .data (bytes), .text, .seq, .event
                print(item.text)
            print(stream.terminal)          # sw.Terminal: .status, .reason, .message, .error

``async for item in stream`` works too, and a handler may be an ``async def``
generator run on an asyncio loop (``Worker(..., loop=loop)``).

Cancellation: ``stream.cancel()`` on the frontend; in a handler,
``req.cancelled`` turns true and the next ``yield`` raises ``Cancelled``
inside the generator (catch it to clean up; the library sends the CANCELLED
terminal). Errors are ``StreamwireError`` subclasses named after the C
library's stable names: ``sw_err_name(SW_INSTANCE_LOST)`` is
``"instance_lost"``, raised as ``InstanceLostError`` with ``.name ==
"instance_lost"``; a name that ends in ``_error`` gets no second Error
(``"tls_error"`` is ``TlsError``; the doubled ``TlsErrorError`` is an
alias).

Threads: a Connection, Router or Worker may be used from any thread. A
Stream is for one consumer at a time; its cancel() and close() may come
from any thread (close waits for a consumer blocked in next_item, which the
cancel wakes). Handlers run on the library's handler
threads (``threads=``, default 4) and hold the GIL only while Python code
runs: every blocking call into the library releases it, so a handler that
sleeps or waits on I/O never stalls the other streams; a handler that
computes in pure Python holds the GIL as any Python thread does.

Ownership: a Connection holds the Workers, Routers and Registries made on
it until they are closed (a Worker dropped without close() serves on), and
Connection.close() closes those still open, then the connection.
Registry.close() closes the Routers made with it that are still open (the
library requires a registry to outlive its routers). A Request kept past
its handler no longer reaches the library's request: header() is None,
cancelled is True, deadline_left_ms is 0.
"""
import asyncio
import builtins
import concurrent.futures
import ctypes
import functools
import inspect
import threading
import time

from . import _lib
from ._lib import lib

__all__ = ["Connection", "Registry", "Worker", "Request", "Router", "Stream", "Item", "Terminal",
           "Event", "Completed", "Incomplete", "Failed", "Cancelled", "StreamwireError",
           "error_class", "version"]

STATUS_NAMES = {1: "completed", 2: "incomplete", 3: "failed", 4: "cancelled", 5: "error"}
_SW_ETIMEDOUT = 3
_SW_ECANCELLED = 5
_SW_ECLOSED = 4
_SW_EEOF = 15


def version():
    """The C library's version string."""
    return lib.sw_version().decode()


# ---------------------------------------------------------------- errors

class StreamwireError(Exception):
    """A streamwire error: .code (the C sw_err value), .name (its stable name,
    e.g. "instance_lost"), and the library's sentence as the message."""

    def __init__(self, code, detail=None):
        self.code = code
        self.name = lib.sw_err_name(code).decode()
        msg = lib.sw_strerror(code).decode()
        super().__init__("%s (%s)%s" % (msg, self.name, ": " + detail if detail else ""))


_classes = {}


def error_class(name):
    """The StreamwireError subclass for a stable name: "no_instances" ->
    NoInstancesError, "tls_error" -> TlsError (a name that ends in "_error"
    gets no second "Error"), "timeout" -> StreamwireTimeoutError (also a
    builtins.TimeoutError). Made on first use; the same class every time."""
    if name not in _classes:
        cls_name = "".join(p.capitalize() for p in name.split("_"))
        if not cls_name.endswith("Error"):
            cls_name += "Error"
        bases = (StreamwireError,)
        if hasattr(builtins, cls_name):  # "timeout": never shadow a builtin
            if issubclass(getattr(builtins, cls_name), Exception):
                bases += (getattr(builtins, cls_name),)
            cls_name = "Streamwire" + cls_name
        _classes[name] = type(cls_name, bases, {})
    return _classes[name]


def _raise_for(code, detail=None):
    if code != 0:
        name = lib.sw_err_name(code).decode()
        raise error_class(name)(code, detail)


# Every stable name of the C library, as module attributes (InvalidArgumentError, ...).
for _code in list(range(0, 22)) + list(range(100, 110)):
    _n = lib.sw_err_name(_code).decode()
    if _n != "unknown_error" and _n != "ok":
        _cls = error_class(_n)
        globals()[_cls.__name__] = _cls
        __all__.append(_cls.__name__)
        if _n.endswith("_error"):
            # the doubled name these classes had before (TlsErrorError,
            # NatsErrorError, ...): an alias of the same class
            _old = _cls.__name__ + "Error"
            globals()[_old] = _cls
            __all__.append(_old)


class Cancelled(Exception):
    """Raised inside a handler's generator when its stream was cancelled
    (the frontend cancelled, went away, or the deadline passed)."""


def _b(s):
    """A C string argument: None, str (as UTF-8), bytes or bytearray.
    Anything else raises TypeError (bytes(1) would be one zero byte, which
    C reads as an empty string)."""
    if s is None:
        return None
    if isinstance(s, str):
        return s.encode()
    if isinstance(s, (bytes, bytearray)):
        return bytes(s)
    raise TypeError("expected str or bytes, not %s" % type(s).__name__)


def _data(v, what):
    """The bytes of an item or payload: str (as UTF-8), bytes, bytearray or
    memoryview. Anything else raises TypeError: bytes(5) would be five zero
    bytes, not "5"."""
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError("%s must be str, bytes, bytearray or memoryview, not %s"
                    % (what, type(v).__name__))


# ---------------------------------------------------------------- results and items

class Completed:
    """A handler's result: the stream completed (finish reason, default "stop")."""

    def __init__(self, reason="stop"):
        self.reason = reason


class Incomplete:
    """A handler's result: finished early for a reason, e.g. "max_tokens"."""

    def __init__(self, reason):
        self.reason = reason


class Failed:
    """A handler's result: failed with an application code ([a-z0-9_], <= 64
    characters, e.g. "engine_error") and a message."""

    def __init__(self, code, message=""):
        self.code = code
        self.message = message


class Event:
    """A typed item a handler yields: a name ("refusal", "metrics", or the
    application's), its data, and whether it may be shed under pressure."""

    def __init__(self, name, data, droppable=False):
        self.name = name
        self.data = data
        self.droppable = droppable


class Item:
    """A data item as the frontend receives it."""
    __slots__ = ("data", "seq", "event", "droppable")

    def __init__(self, data, seq, event, droppable):
        self.data = data
        self.seq = seq
        self.event = event
        self.droppable = droppable

    @property
    def text(self):
        return self.data.decode("utf-8", errors="replace")

    def __repr__(self):
        return "Item(seq=%d, data=%r%s)" % (self.seq, self.data,
                                           ", event=%r" % self.event if self.event else "")


class Terminal:
    """How a stream ended: .status ("completed", "incomplete", "failed",
    "cancelled" or "error"), .reason ("stop", "max_tokens", an application
    code, "cancelled", or the error's name), .message, .error (the
    error's name for status "error", else None), .migrations (times the
    stream moved to another instance) and .instances (those it was sent to,
    in order: one that had gone when picked included)."""

    def __init__(self, status, reason, message, error, migrations=0, instances=()):
        self.status = status
        self.reason = reason
        self.message = message
        self.error = error
        self.migrations = migrations
        self.instances = list(instances)

    @property
    def ok(self):
        return self.status == "completed"

    def __repr__(self):
        return "Terminal(%s, %r%s)" % (self.status, self.reason,
                                       ", %r" % self.message if self.message else "")


# ---------------------------------------------------------------- connection

class Connection:
    """A NATS connection (sw_conn). Keyword options follow sw_conn_opts:
    name, user, password, token, creds_file, nkey_seed_file, inbox_prefix,
    tls, tls_ca_file, tls_cert_file, tls_key_file, connect_timeout_ms,
    max_reconnect (-1 = forever, -2 = never). Raises ConnectionFailedError,
    NotAuthorizedError, TlsError, ..."""

    def __init__(self, url="nats://127.0.0.1:4222", **opts):
        o = _lib.ConnOpts()
        lib.sw_conn_opts_init(ctypes.byref(o))
        self._keep = [_b(url)]
        o.url = self._keep[0]
        for k, v in opts.items():
            if not hasattr(o, k):
                raise TypeError("unknown connection option %r" % k)
            if isinstance(v, str):
                v = _b(v)
                self._keep.append(v)
            setattr(o, k, v)
        h = ctypes.c_void_p()
        _raise_for(lib.sw_conn_open(ctypes.byref(h), ctypes.byref(o)), url)
        self._h = h
        # What uses this connection (workers, routers, registries), held
        # until each is closed: the library requires them closed before
        # the connection, so close() closes them first. Held strongly: a
        # Worker dropped without close() still serves (its ingress runs),
        # and its handler callback must live as long as the ingress.
        self._users_lock = threading.Lock()
        self._users = {}  # id -> object (insertion order)
        self._close_lock = threading.RLock()  # one close at a time

    def _use(self, obj):
        with self._users_lock:
            self._users[id(obj)] = obj

    def _unuse(self, obj):
        with self._users_lock:
            if self._users.get(id(obj)) is obj:
                del self._users[id(obj)]

    @property
    def handle(self):
        if self._h is None:
            raise error_class("closed")(_SW_ECLOSED)
        return self._h

    def close(self):
        """Closes the workers, routers and registries made on this
        connection that are still open (workers first, registries last),
        then the connection. From any thread: a close racing another
        returns once the connection is closed. Making a worker, router or
        registry on a connection while it closes is not allowed."""
        with self._close_lock:
            if self._h is None:
                return
            while True:
                with self._users_lock:
                    users = list(self._users.values())
                    self._users.clear()
                if not users:
                    break
                for kind in (Worker, Router, Registry):
                    for u in users:
                        if isinstance(u, kind):
                            u.close()
            h, self._h = self._h, None
            lib.sw_conn_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


class Registry:
    """The discovery registry (JetStream KV by default). Options: bucket,
    lease_ms, replicas, backend ("nats-kv" or "memory")."""

    def __init__(self, conn, bucket=None, lease_ms=0, replicas=0, backend=None):
        o = _lib.RegistryOpts()
        lib.sw_registry_opts_init(ctypes.byref(o))
        self._keep = [_b(bucket), _b(backend)]
        if bucket:
            o.bucket = self._keep[0]
        if backend:
            o.backend = self._keep[1]
        if lease_ms:
            o.lease_ms = lease_ms
        if replicas:
            o.replicas = replicas
        h = ctypes.c_void_p()
        _raise_for(lib.sw_registry_open(ctypes.byref(h), conn.handle, ctypes.byref(o)))
        self._h = h
        # Guards _h and _routers; held across the calls that use the
        # handle, so close() cannot free it under them. Reentrant: close()
        # closes the routers, which take it to leave _routers.
        self._lock = threading.RLock()
        self._routers = {}  # id -> Router made with registry=self, until closed
        self._conn = conn
        conn._use(self)

    def close(self):
        """Closes the Routers made with this registry that are still open
        (the library requires the registry to outlive its routers: their
        open streams end with error "closed"), then the registry. Workers
        registered through it serve on, but their entries are no longer
        kept alive (they expire after the lease): drain or close the
        Workers first for a clean exit."""
        with self._lock:
            if self._h is None:
                return
            for r in list(self._routers.values()):
                r.close()
            self._routers.clear()
            h, self._h = self._h, None
            lib.sw_registry_close(h)
        self._conn._unuse(self)

    def _handle(self):
        # self._lock held
        if self._h is None:
            raise error_class("closed")(_SW_ECLOSED, "the registry is closed")
        return self._h

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


# ---------------------------------------------------------------- worker

class Request:
    """What a handler gets: the payload (bytes; .text decodes it), the
    max_tokens hint, the request id, headers, the trace id, the deadline,
    and whether the stream was cancelled.

    A Request may be kept past its handler (handed to another thread, say),
    but the library frees the request once the handler has returned (for
    an async handler: once its handler thread is done with it). From then
    on header() returns None, cancelled is True and deadline_left_ms is 0;
    payload, text, max_tokens, resume_from, request_id and trace_id are
    copies and keep their values."""

    def __init__(self, resp):
        self._r = resp
        # shut when the handler thread is done with the request: the
        # library may free the responder then (_Gate)
        self._gate = _Gate()
        n = ctypes.c_size_t()
        p = lib.sw_responder_payload(resp, ctypes.byref(n))
        self.payload = ctypes.string_at(p, n.value) if p else b""
        self.max_tokens = lib.sw_responder_max_tokens(resp)
        # migration: the consumer already has items 1..resume_from-1 (0 = a new stream)
        self.resume_from = lib.sw_responder_resume_from(resp)
        self.request_id = lib.sw_responder_request_id(resp).decode()
        self.trace_id = lib.sw_responder_trace_id(resp).decode()

    @property
    def text(self):
        return self.payload.decode("utf-8", errors="replace")

    def _call(self, default, fn, *args):
        return self._gate.call(default, fn, *args)

    def header(self, key):
        v = self._call(None, lib.sw_responder_header, self._r, _b(key))
        return v.decode() if v is not None else None

    @property
    def cancelled(self):
        """True once the stream was cancelled (or, for an async handler,
        given up because its loop stopped)."""
        return self._call(1, lib.sw_responder_cancelled, self._r) != 0

    @property
    def deadline_left_ms(self):
        """Milliseconds left before the deadline, or None without one (0
        once the handler is done with the request)."""
        v = self._call(0, lib.sw_responder_deadline_left_ms, self._r)
        return None if v < 0 else v


class _Gate:
    """An async handler's coroutine reaches its responder only through this,
    and only while the library's handler thread still waits for it: once
    that thread gives up (the loop stopped), the responder may be freed and
    every call returns its default instead.

    No lock is held across a call: a send may block (waiting for credit)
    for as long as send_timeout_ms. close() shuts the gate, then runs
    `unblock` if given (it fails the stream, so a blocked send returns at
    once), then waits for the calls in progress to return. The handler
    thread closes it on every way out, before the responder can go."""

    __slots__ = ("cv", "open", "busy")

    def __init__(self):
        self.cv = threading.Condition()
        self.open = True
        self.busy = 0

    def call(self, default, fn, *args):
        with self.cv:
            if not self.open:
                return default
            self.busy += 1
        try:
            return fn(*args)
        finally:
            with self.cv:
                self.busy -= 1
                self.cv.notify_all()

    def close(self, unblock=None):
        with self.cv:
            self.open = False
        try:
            if unblock is not None:
                unblock()
        finally:
            with self.cv:
                while self.busy:
                    self.cv.wait()


# How long an async handler's loop may be not running before the handler
# thread gives its request up (a loop between two run_* calls is briefly
# not running).
_LOOP_GRACE_S = 1.0


def _send(resp, value):
    """Sends one yielded value; returns the C error code."""
    if isinstance(value, Event):
        data = b"" if value.data is None else _data(value.data, "an Event's data")
        return lib.sw_responder_send_event(resp, _b(value.name), data, len(data),
                                           1 if value.droppable else 0)
    data = _data(value, "a yielded item")
    return lib.sw_responder_send(resp, data, len(data))


def _finish(resp, result):
    if result is None or isinstance(result, Completed):
        return lib.sw_responder_finish(resp, 1, _b(result.reason if result else "stop"))
    if isinstance(result, Incomplete):
        return lib.sw_responder_finish(resp, 2, _b(result.reason))
    if isinstance(result, Failed):
        return lib.sw_responder_fail(resp, _b(result.code), _b(result.message or ""))
    return lib.sw_responder_fail(resp, b"handler_error",
                                 _b("the handler returned %r, not a Completed, Incomplete "
                                    "or Failed" % (result,)))


_RESULTS = (Completed, Incomplete, Failed)


# Open Workers, held until closed: a Worker's C ingress calls its ctypes
# callback, so neither may be collected while it serves, even when the
# program has dropped both the Worker and its Connection (a cycle the
# garbage collector would otherwise free under the running ingress).
_LIVE_WORKERS = set()


class _Held:
    """A C handle that calls on other threads use while one closes it:
    each call holds it while it runs (use/done), and close waits for them
    before the handle is freed (the C library's destroy must not run while
    another call on the handle is under way)."""

    def __init__(self, h):
        self._cv = threading.Condition(threading.RLock())
        self.h = h
        self._holders = {}  # thread id -> calls of that thread under way
        self._closing = False
        self._free = None  # a close left to the last call (see close)

    def use(self):
        """The handle, held until done(); None once closing or closed."""
        with self._cv:
            if self.h is None or self._closing:
                return None
            me = threading.get_ident()
            self._holders[me] = self._holders.get(me, 0) + 1
            return self.h

    def done(self):
        free = None
        with self._cv:
            me = threading.get_ident()
            self._holders[me] -= 1
            if not self._holders[me]:
                del self._holders[me]
            if not self._holders and self._free is not None:
                free, self._free = self._free, None
            self._cv.notify_all()
        if free is not None:
            self._finish(free)

    def _finish(self, free):
        try:
            free(self.h)
        finally:
            with self._cv:
                self.h = None
                self._cv.notify_all()

    def close(self, free):
        """Waits for the calls under way, then free(h), once. A close
        racing another returns when the handle is freed. A close on a
        thread that is itself inside a call (a signal handler that ran
        while it was) cannot wait for that call: the handle is freed when
        the call ends, and close returns at once."""
        with self._cv:
            if self._closing:
                if threading.get_ident() not in self._holders:
                    while self.h is not None:
                        self._cv.wait()
                return
            if self.h is None:
                return
            self._closing = True
            if threading.get_ident() in self._holders:
                self._free = free
                return
            while self._holders:
                self._cv.wait()
        self._finish(free)


class Worker:
    """Serves an endpoint (an sw_ingress) with a Python handler, and
    registers it when a Registry is given. The handler gets a Request and is
    a generator (or an async generator with loop=) that yields str (sent as
    UTF-8), bytes, bytearray, memoryview or Event items and returns -- or
    yields last -- a Completed, Incomplete or Failed. An exception in it,
    or an item of another type (an int, None, ...), fails the stream with
    code "handler_error". Options: instance_id, threads, max_inflight,
    send_timeout_ms, max_window.

    The Connection holds the Worker until close() (or the connection's
    close): one the program drops without closing serves on, and its
    handler stays alive with it."""

    def __init__(self, conn, endpoint, handler, registry=None, instance_id=None, threads=0,
                 max_inflight=0, send_timeout_ms=0, max_window=0, loop=None):
        self._handler = handler
        self._loop = loop
        if inspect.isasyncgenfunction(handler) and loop is None:
            raise TypeError("an async generator handler needs loop=")
        self._cb = _lib.HANDLER_FN(self._on_request)
        self._stop = threading.Event()
        o = _lib.IngressOpts()
        lib.sw_ingress_opts_init(ctypes.byref(o))
        self._keep = [_b(endpoint), _b(instance_id)]
        o.endpoint = self._keep[0]
        if instance_id:
            o.instance_id = self._keep[1]
        o.handler = self._cb
        if threads:
            o.handler_threads = threads
        if max_inflight:
            o.max_inflight = max_inflight
        if send_timeout_ms:
            o.send_timeout_ms = send_timeout_ms
        if max_window:
            o.max_window = max_window
        h = ctypes.c_void_p()
        _raise_for(lib.sw_ingress_start(ctypes.byref(h), conn.handle, ctypes.byref(o)), endpoint)
        self._held = _Held(h)
        self._reg = registry
        self._conn = conn
        conn._use(self)
        _LIVE_WORKERS.add(self)
        self.instance_id = lib.sw_ingress_instance_id(h).decode()
        if registry is not None:
            rg = _lib.Registration()
            rv = lib.sw_ingress_registration(h, ctypes.byref(rg))
            if rv == 0:
                with registry._lock:
                    rv = (lib.sw_registry_register(registry._h, ctypes.byref(rg))
                          if registry._h is not None else _SW_ECLOSED)
            if rv != 0:
                self.close()
                _raise_for(rv, "registering %s" % self.instance_id)

    # Runs on a library handler thread (ctypes takes the GIL for it).
    def _on_request(self, resp, arg):
        req = None
        try:
            req = Request(resp)
            if inspect.isasyncgenfunction(self._handler):
                self._wait_async(resp, req)
            else:
                self._drive(resp, req)
        except BaseException as e:  # never let an exception unwind into C
            try:
                lib.sw_responder_fail(resp, b"handler_error", _b(repr(e)[:400]))
            except BaseException:
                pass
        finally:
            # this return lets the library free the responder: a Request
            # the handler kept no longer reaches it (a call of another
            # thread under way is waited for)
            if req is not None:
                req._gate.close()

    def _drive(self, resp, req):
        try:
            gen = self._handler(req)
        except Exception as e:
            lib.sw_responder_fail(resp, b"handler_error", _b(repr(e)[:400]))
            return
        if not inspect.isgenerator(gen):
            # a plain function: an iterable of items, or a result
            if isinstance(gen, _RESULTS) or gen is None:
                _finish(resp, gen)
                return
            gen = iter(gen)
        result = None
        try:
            value = next(gen)
            while True:
                if isinstance(value, _RESULTS):
                    result = value
                    break
                try:
                    rv = _send(resp, value)
                except TypeError:
                    gen.close()
                    raise
                if rv in (_SW_ECANCELLED, _SW_ECLOSED):
                    try:
                        gen.throw(Cancelled())
                    except (Cancelled, StopIteration):
                        pass
                    gen.close()
                    return  # the library sends the CANCELLED terminal
                if rv != 0:
                    gen.close()
                    lib.sw_responder_fail(resp, b"send_failed", lib.sw_err_name(rv))
                    return
                value = next(gen)
        except StopIteration as stop:
            result = stop.value
        except Cancelled:
            return
        except Exception as e:
            lib.sw_responder_fail(resp, b"handler_error", _b(repr(e)[:400]))
            return
        _finish(resp, result)

    def _wait_async(self, resp, req):
        """Runs an async handler on self._loop and waits for it on this
        (library) thread. If the loop is not running for _LOOP_GRACE_S (it
        stopped, or never ran), the request is given up: the stream fails
        with handler_error, the coroutine is cancelled (when the loop runs
        again) and can no longer reach the responder, and this thread
        returns, so the worker can close."""
        gate = req._gate
        fut = asyncio.run_coroutine_threadsafe(self._drive_async(resp, req, gate), self._loop)
        idle_since = None
        why = None  # set: the stream is failed with it, waking a blocked send
        try:
            while True:
                done, _ = concurrent.futures.wait([fut], timeout=0.1)
                if done:
                    try:
                        fut.result()
                    except BaseException as e:
                        # its task was cancelled, or it raised: a send it
                        # started may still run in the executor
                        why = _b(repr(e)[:400])
                        raise
                    return
                if self._loop.is_running():
                    idle_since = None
                    continue
                now = time.monotonic()
                if idle_since is None:
                    idle_since = now
                elif now - idle_since >= _LOOP_GRACE_S:
                    why = (b"the asyncio loop given as loop= is not running "
                           b"(stopped, or never started): the request was given up")
                    fut.cancel()
                    return
        finally:
            # on every way out: this thread's return lets the library free
            # the responder, so no call of the coroutine may still use it
            gate.close(None if why is None else
                       functools.partial(lib.sw_responder_fail, resp, b"handler_error", why))

    async def _drive_async(self, resp, req, gate):
        loop = asyncio.get_running_loop()
        agen = self._handler(req)
        result = None
        try:
            async for value in agen:
                if isinstance(value, _RESULTS):
                    result = value
                    break
                rv = await loop.run_in_executor(
                    None, functools.partial(gate.call, _SW_ECLOSED, _send, resp, value))
                if rv in (_SW_ECANCELLED, _SW_ECLOSED):
                    try:
                        await agen.athrow(Cancelled())
                    except (Cancelled, StopAsyncIteration):
                        pass
                    return
                if rv != 0:
                    gate.call(None, lib.sw_responder_fail, resp, b"send_failed",
                              lib.sw_err_name(rv))
                    return
        except Cancelled:
            return
        except Exception as e:
            gate.call(None, lib.sw_responder_fail, resp, b"handler_error", _b(repr(e)[:400]))
            return
        finally:
            await agen.aclose()
        await loop.run_in_executor(None, functools.partial(gate.call, None, _finish, resp, result))

    def wait(self, timeout=None):
        """Blocks until close() is called (from another thread or a signal
        handler); returns True then, False on timeout."""
        return self._stop.wait(timeout)

    def _deregister(self):
        reg, self._reg = self._reg, None
        if reg is not None and self._h is not None:
            with reg._lock:
                if reg._h is not None:
                    lib.sw_registry_deregister(reg._h, _b(self.instance_id))

    @property
    def _h(self):
        return self._held.h

    def drain(self, grace_ms=5000):
        """Deregisters (routers stop picking this instance), stops taking
        requests, and lets the open ones finish for up to grace_ms. A
        close() on another thread meanwhile waits for it."""
        self._deregister()
        h = self._held.use()
        if h is not None:
            try:
                lib.sw_ingress_drain(h, grace_ms)
            finally:
                self._held.done()

    def close(self):
        """Deregisters, stops serving (open streams are cancelled), frees.
        Must not be called from the handler. From any thread: a drain()
        under way on another is waited for first."""
        self._deregister()
        self._held.close(lib.sw_ingress_destroy)
        self._conn._unuse(self)
        _LIVE_WORKERS.discard(self)
        self._stop.set()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


# ---------------------------------------------------------------- frontend

class Stream:
    """One response stream, read in blocking mode: iterate it (or ``async
    for``) for its Items; .terminal is set once the iteration ends. For one
    consumer at a time; cancel() and close() may be called from any thread.

    close() from another thread while the consumer waits in next_item (or
    an ``async for`` whose executor thread does, after its task was
    cancelled): the stream is cancelled, which wakes that consumer with the
    CANCELLED terminal (unless it had one already), and close() waits for it
    to leave next_item before it frees the stream. A consumer that calls
    next_item again after the close, without a terminal, gets ClosedError."""

    def __init__(self, handle, keep):
        self._h = handle
        self._keep = keep
        # guards _h, _readers, _closing: the C library's sw_stream_close
        # must not run while a sw_stream_next of the stream is under way
        self._lock = threading.Condition(threading.RLock())
        self._readers = 0  # threads in next_item's sw_stream_next (and reading its item)
        self._reader_ids = {}  # their thread ids -> count
        self._closing = False
        self._close_left = False  # close() left the free to the last reader
        self.terminal = None
        self._inst = ""
        self.request_id = lib.sw_stream_request_id(handle).decode()

    @property
    def instance_id(self):
        """The instance serving the stream ("" until known); kept after close."""
        with self._lock:
            if self._h is not None:
                self._inst = lib.sw_stream_instance_id(self._h).decode()
            return self._inst

    def next_item(self, timeout_ms=200):
        """The next Item, or None once the terminal has arrived (then
        .terminal is set). Raises TimeoutError when nothing came within
        timeout_ms (the stream goes on), ClosedError when the stream was
        closed before its terminal was read."""
        if self.terminal is not None:
            return None
        with self._lock:
            h = self._h
            if h is None or self._closing:
                if self.terminal is not None:
                    return None
                raise error_class("closed")(_SW_ECLOSED)
            self._readers += 1
            me = threading.get_ident()
            self._reader_ids[me] = self._reader_ids.get(me, 0) + 1
        try:
            return self._next(h, timeout_ms)
        finally:
            with self._lock:
                self._readers -= 1
                me = threading.get_ident()
                self._reader_ids[me] -= 1
                if not self._reader_ids[me]:
                    del self._reader_ids[me]
                if not self._readers and self._close_left:
                    self._close_left = False
                    h, self._h = self._h, None
                    lib.sw_stream_close(h)
                self._lock.notify_all()

    def _next(self, h, timeout_ms):
        # the item *p points to is valid until the next call or close:
        # copied out here, before next_item lets close() in
        p = ctypes.POINTER(_lib.CItem)()
        rv = lib.sw_stream_next(h, ctypes.byref(p), timeout_ms)
        if rv == _SW_ETIMEDOUT:
            raise builtins.TimeoutError("no item within %d ms" % timeout_ms)
        if rv == _SW_EEOF:
            return None
        _raise_for(rv)
        it = p.contents
        if it.kind == 1:
            ev = it.event.decode() if it.event else ""
            return Item(ctypes.string_at(it.data, it.len) if it.len else b"", it.seq, ev,
                        bool(it.droppable))
        t = it.terminal
        if it.instance_id:
            self._inst = it.instance_id.decode()
        status = STATUS_NAMES.get(t.status, "unknown")
        self.terminal = Terminal(status, t.reason.decode() if t.reason else "",
                                 t.message.decode() if t.message else "",
                                 lib.sw_err_name(t.error).decode() if status == "error" else None,
                                 t.migrations,
                                 [x for x in (t.instances or b"").decode().split(",") if x])
        return None

    def __iter__(self):
        while True:
            try:
                item = self.next_item(200)
            except builtins.TimeoutError:
                continue
            if item is None:
                return
            yield item

    def __aiter__(self):
        return self._agen()

    async def _agen(self):
        loop = asyncio.get_running_loop()
        while True:
            try:
                item = await loop.run_in_executor(None, self.next_item, 200)
            except builtins.TimeoutError:
                continue
            if item is None:
                return
            yield item

    def read_all(self):
        """Every item, then the terminal: (list of Items, Terminal)."""
        items = list(self)
        return items, self.terminal

    def cancel(self):
        """Asks the worker to stop; the terminal will be CANCELLED (unless
        another came first)."""
        with self._lock:
            if self._h is not None:
                lib.sw_stream_cancel(self._h)

    def close(self):
        """Frees the stream (cancelling it if it is still open). From any
        thread: a consumer blocked in next_item is woken (by the cancel)
        and waited for first. A second close, or one racing it, returns
        once the stream is freed."""
        with self._lock:
            mine = threading.get_ident() in self._reader_ids
            if self._closing:
                while self._h is not None and not mine:
                    self._lock.wait()
                return
            if self._h is None:
                return
            self._closing = True
            h = self._h
            if self._readers:
                lib.sw_stream_cancel(h)  # wakes them: the next item is the terminal
                if mine:
                    # a signal handler that ran while this thread was in
                    # next_item: that call frees the stream when it ends
                    self._close_left = True
                    return
                while self._readers:
                    self._lock.wait()
            self._h = None
            lib.sw_stream_close(h)
            self._lock.notify_all()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Router:
    """The frontend side (an sw_router): opens streams to workers, directly
    (instance_id=) or through a Registry by policy ("round_robin", "random",
    "least_inflight"). Options: router_id, credit_window, heartbeat_ms,
    migration_limit (streams move to another instance when theirs is lost or
    drains, at most that many times; docs/MIGRATION.md). A Router made
    with a registry is closed by that registry's close() if still open."""

    _POLICIES = {"round_robin": 0, "random": 1, "least_inflight": 2}

    def __init__(self, conn, registry=None, policy="round_robin", router_id=None,
                 credit_window=0, heartbeat_ms=0, migration_limit=0):
        o = _lib.RouterOpts()
        lib.sw_router_opts_init(ctypes.byref(o))
        self._keep = [_b(router_id)]
        if router_id:
            o.router_id = self._keep[0]
        if policy not in self._POLICIES:
            raise ValueError("policy must be one of %s" % ", ".join(self._POLICIES))
        o.policy = self._POLICIES[policy]
        if credit_window:
            o.credit_window = credit_window
        if heartbeat_ms:
            o.heartbeat_ms = heartbeat_ms
        o.migration_limit = migration_limit
        self._registry = registry
        self._conn = conn
        h = ctypes.c_void_p()
        if registry is None:
            _raise_for(lib.sw_router_create(ctypes.byref(h), conn.handle, ctypes.byref(o)))
            self._held = _Held(h)
        else:
            # the registry must outlive the router: it holds the router
            # until the router closes, and closes it first (Registry.close)
            with registry._lock:
                o.registry = registry._handle()
                _raise_for(lib.sw_router_create(ctypes.byref(h), conn.handle, ctypes.byref(o)))
                self._held = _Held(h)
                registry._routers[id(self)] = self
        conn._use(self)

    def open(self, endpoint, payload=b"", instance_id=None, max_tokens=0, deadline_ms=0,
             headers=None, credit_window=0, migration_limit=0):
        """Sends a request; returns its Stream. Errors that happen before
        anything is sent raise (InvalidArgumentError, ClosedError, ...);
        everything after arrives as the stream's terminal (no_instances,
        no_responders, instance_lost, ...)."""
        q = _lib.RequestOpts()
        lib.sw_request_opts_init(ctypes.byref(q))
        keep = [_b(endpoint), _b(instance_id)]
        q.endpoint = keep[0]
        if instance_id:
            q.instance_id = keep[1]
        q.max_tokens = max_tokens
        q.deadline_ms = deadline_ms
        q.credit_window = credit_window
        q.migration_limit = migration_limit
        if headers:
            arr = (_lib.Header * len(headers))()
            for i, (k, v) in enumerate(headers.items()):
                kb, vb = _b(k), _b(v)
                keep += [kb, vb]
                arr[i].key, arr[i].value = kb, vb
            keep.append(arr)
            q.headers = arr
            q.nheaders = len(headers)
        data = b"" if payload is None else _data(payload, "the payload")
        h = ctypes.c_void_p()
        r = self._held.use()
        if r is None:
            raise error_class("closed")(_SW_ECLOSED)
        try:
            rv = lib.sw_router_open(ctypes.byref(h), r, ctypes.byref(q), data, len(data))
        finally:
            self._held.done()
        _raise_for(rv, endpoint)
        return Stream(h, keep)

    @property
    def _h(self):
        return self._held.h

    def close(self):
        """Ends the router's open streams (error "closed"; their Streams
        stay valid objects until closed) and frees it. From any thread: an
        open() under way on another is waited for first (its Stream then
        ends "closed" with the others); a later open() raises ClosedError."""
        self._held.close(lib.sw_router_destroy)
        if self._registry is not None:
            with self._registry._lock:
                if self._registry._routers.get(id(self)) is self:
                    del self._registry._routers[id(self)]
        self._conn._unuse(self)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()
