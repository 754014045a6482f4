"""streamwire._lib -- the C library through ctypes: loading, the mirrored
structs and the function prototypes. Internal; use the streamwire package.

The structs mirror include/streamwire/*.h field for field; python/tests
checks their sizes and offsets against the C compiler's on every build
(python/tests/abi.c). Every foreign call releases the GIL (ctypes.CDLL), so
a thread blocked in sw_stream_next or sw_responder_send never stalls the
other Python threads.
"""
import ctypes
import ctypes.util
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int64, c_size_t,
                    c_uint, c_uint32, c_uint64, c_void_p)

sw_duration = c_int64

LOG_FN = CFUNCTYPE(None, c_void_p, c_int, c_char_p)
STATE_FN = CFUNCTYPE(None, c_void_p, c_int, c_void_p)
HANDLER_FN = CFUNCTYPE(None, c_void_p, c_void_p)
CANCEL_FN = CFUNCTYPE(None, c_void_p, c_void_p)
ITEM_FN = CFUNCTYPE(None, c_void_p, c_void_p, c_void_p)
READY_FN = CFUNCTYPE(None, c_void_p, c_void_p)


class ConnOpts(Structure):
    _fields_ = [("url", c_char_p), ("name", c_char_p), ("connect_timeout_ms", sw_duration),
                ("max_reconnect", c_int), ("reconnect_wait_ms", sw_duration),
                ("no_send_asap", c_int), ("user", c_char_p), ("password", c_char_p),
                ("token", c_char_p), ("log", c_void_p), ("log_arg", c_void_p),
                ("on_state", c_void_p), ("on_state_arg", c_void_p), ("creds_file", c_char_p),
                ("nkey_seed_file", c_char_p), ("inbox_prefix", c_char_p), ("tls", c_int),
                ("tls_ca_file", c_char_p), ("tls_cert_file", c_char_p),
                ("tls_key_file", c_char_p), ("tls_skip_verify", c_int),
                ("seal_key_file", c_char_p), ("seal_open_key_file", c_char_p)]


class IngressOpts(Structure):
    _fields_ = [("endpoint", c_char_p), ("instance_id", c_char_p), ("handler", HANDLER_FN),
                ("handler_arg", c_void_p), ("max_inflight", c_uint), ("handler_threads", c_uint),
                ("max_request_bytes", c_size_t), ("send_timeout_ms", sw_duration),
                ("max_window", c_uint), ("frontend_probe_ms", sw_duration),
                ("frontend_timeout_ms", sw_duration), ("coalesce_us", sw_duration),
                ("log", c_void_p), ("log_arg", c_void_p), ("frontend_probe_misses", c_uint),
                ("max_held_finals", c_uint), ("max_request_age_ms", sw_duration),
                ("handler_inline", c_int)]


class RouterOpts(Structure):
    _fields_ = [("router_id", c_char_p), ("credit_window", c_uint), ("heartbeat_ms", sw_duration),
                ("inactivity_ms", sw_duration), ("gap_timeout_ms", sw_duration),
                ("final_linger_ms", sw_duration), ("max_streams", c_uint),
                ("registry", c_void_p), ("policy", c_int), ("probe_interval_ms", sw_duration),
                ("probe_timeout_ms", sw_duration), ("probe_misses", c_uint),
                ("quarantine_ms", sw_duration), ("log", c_void_p), ("log_arg", c_void_p),
                ("migration_limit", c_int), ("credit_window_max", c_uint),
                ("credit_bytes", c_size_t), ("credit_bytes_max", c_size_t)]


class Header(Structure):
    _fields_ = [("key", c_char_p), ("value", c_char_p)]


class RequestOpts(Structure):
    _fields_ = [("endpoint", c_char_p), ("instance_id", c_char_p), ("deadline_ms", sw_duration),
                ("max_tokens", c_uint32), ("credit_window", c_uint), ("heartbeat_ms", sw_duration),
                ("on_item", c_void_p), ("on_item_arg", c_void_p), ("headers", POINTER(Header)),
                ("nheaders", c_size_t), ("on_ready", c_void_p), ("on_ready_arg", c_void_p),
                ("migration_limit", c_int), ("migrate", c_void_p), ("migrate_arg", c_void_p)]


class RegistryOpts(Structure):
    _fields_ = [("backend", c_char_p), ("backend_ops", c_void_p), ("bucket", c_char_p),
                ("lease_ms", sw_duration), ("refresh_ms", sw_duration), ("replicas", c_uint),
                ("log", c_void_p), ("log_arg", c_void_p)]


class Registration(Structure):
    _fields_ = [("instance_id", c_char_p), ("endpoint", c_char_p), ("request_subject", c_char_p),
                ("control_subject", c_char_p)]


class CTerminal(Structure):
    _fields_ = [("status", c_int), ("error", c_int), ("reason", c_char_p), ("message", c_char_p),
                ("migrations", c_uint), ("instances", c_char_p)]


class CItem(Structure):
    _fields_ = [("kind", c_int), ("seq", c_uint64), ("data", c_void_p), ("len", c_size_t),
                ("droppable", c_int), ("terminal", CTerminal), ("instance_id", c_char_p),
                ("event", c_char_p)]


MIRRORED = {"sw_conn_opts": ConnOpts, "sw_ingress_opts": IngressOpts,
            "sw_router_opts": RouterOpts, "sw_request_opts": RequestOpts,
            "sw_registry_opts": RegistryOpts, "sw_registration": Registration,
            "sw_terminal": CTerminal, "sw_item": CItem, "sw_header": Header}


def _find_library():
    """STREAMWIRE_LIB, then the build tree next to this package, then the
    system's search path (an install prefix in ld.so.conf or LD_LIBRARY_PATH)."""
    env = os.environ.get("STREAMWIRE_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for rel in ("../../build/libstreamwire.so", "../../build/libstreamwire.so.0"):
        p = os.path.normpath(os.path.join(here, rel))
        if os.path.exists(p):
            return p
    found = ctypes.util.find_library("streamwire")
    if found:
        return found
    raise OSError("libstreamwire.so not found: build it (cmake --build build), install it, "
                  "or set STREAMWIRE_LIB to its path")


lib = ctypes.CDLL(_find_library())


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


vp = c_void_p
_proto("sw_err_name", c_char_p, c_int)
_proto("sw_strerror", c_char_p, c_int)
_proto("sw_status_name", c_char_p, c_int)
_proto("sw_version", c_char_p)
_proto("sw_conn_opts_init", None, POINTER(ConnOpts))
_proto("sw_conn_open", c_int, POINTER(vp), POINTER(ConnOpts))
_proto("sw_conn_close", None, vp)
_proto("sw_ingress_opts_init", None, POINTER(IngressOpts))
_proto("sw_ingress_start", c_int, POINTER(vp), vp, POINTER(IngressOpts))
_proto("sw_ingress_destroy", None, vp)
_proto("sw_ingress_drain", c_int, vp, sw_duration)
_proto("sw_ingress_instance_id", c_char_p, vp)
_proto("sw_ingress_registration", c_int, vp, POINTER(Registration))
_proto("sw_responder_payload", c_void_p, vp, POINTER(c_size_t))
_proto("sw_responder_max_tokens", c_uint32, vp)
_proto("sw_responder_resume_from", c_uint64, vp)
_proto("sw_responder_migratable", c_int, vp)
_proto("sw_responder_request_id", c_char_p, vp)
_proto("sw_responder_header", c_char_p, vp, c_char_p)
_proto("sw_responder_trace_id", c_char_p, vp)
_proto("sw_responder_deadline_left_ms", c_int64, vp)
_proto("sw_responder_cancelled", c_int, vp)
_proto("sw_responder_send", c_int, vp, c_char_p, c_size_t)
_proto("sw_responder_send_event", c_int, vp, c_char_p, c_char_p, c_size_t, c_uint)
_proto("sw_responder_finish", c_int, vp, c_int, c_char_p)
_proto("sw_responder_fail", c_int, vp, c_char_p, c_char_p)
_proto("sw_router_opts_init", None, POINTER(RouterOpts))
_proto("sw_router_create", c_int, POINTER(vp), vp, POINTER(RouterOpts))
_proto("sw_router_destroy", None, vp)
_proto("sw_request_opts_init", None, POINTER(RequestOpts))
_proto("sw_router_open", c_int, POINTER(vp), vp, POINTER(RequestOpts), c_char_p, c_size_t)
_proto("sw_stream_next", c_int, vp, POINTER(POINTER(CItem)), sw_duration)
_proto("sw_stream_cancel", c_int, vp)
_proto("sw_stream_close", None, vp)
_proto("sw_stream_request_id", c_char_p, vp)
_proto("sw_stream_instance_id", c_char_p, vp)
_proto("sw_registry_opts_init", None, POINTER(RegistryOpts))
_proto("sw_registry_open", c_int, POINTER(vp), vp, POINTER(RegistryOpts))
_proto("sw_registry_close", None, vp)
_proto("sw_registry_register", c_int, vp, POINTER(Registration))
_proto("sw_registry_deregister", c_int, vp, c_char_p)
_proto("sw_err_from_name", c_int, c_char_p, POINTER(c_int))
