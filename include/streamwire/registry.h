/*
 * streamwire/registry.h -- the discovery registry: workers register with a
 * lease, routers list and watch live instances and report dead ones.
 *
 * Backends are a const table of operations (sw_registry_backend), selected by
 * name: "nats-kv" (JetStream KV, the default; needs nats-server -js) and
 * "memory" (in-process, for unit tests). Every backend passes the same
 * conformance suite (tests/integration/test_registry.c, built on the memory
 * backend as the unit test test_registry_mem and on JetStream KV as the
 * integration test test_registry).
 *
 * Liveness without per-key TTL (nats-server 2.9): a worker rewrites its entry
 * every refresh_ms (default lease_ms / 3). A router counts an entry live while
 * it has seen a new revision of it within the entry's lease (the lease_ms the
 * worker announced in it; the router's own lease_ms for an entry that
 * announces none), measured on its own monotonic clock from the moment it
 * observed the revision; an entry first seen (at start-up too) counts as
 * seen then. No other clock is compared with the router's (not the store's
 * timestamp, not the worker's), so routers need no clock agreement. So an
 * entry that stops being refreshed is dead for every router after lease_ms
 * (for a router started after it stopped: at most lease_ms after start),
 * even though nothing deletes it.
 *
 * Reporting a dead instance writes a tombstone (InstanceInfo.dead) guarded by
 * the revision the reporter saw: if the worker refreshed in between (it is
 * alive) the report fails with SW_EBUSY and changes nothing. A live worker
 * that finds its entry tombstoned registers again with a new revision.
 *
 * Thread safety: every function is thread-safe. Watch callbacks run on a
 * registry thread, never concurrently with each other, with no lock held.
 */
#ifndef STREAMWIRE_REGISTRY_H
#define STREAMWIRE_REGISTRY_H

#include <streamwire/streamwire.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sw_registry sw_registry;

/* One instance as the registry knows it. Strings are owned by whatever
 * returned the struct (see each function). */
typedef struct sw_instance {
    const char *instance_id;
    const char *endpoint;
    const char *request_subject;
    const char *control_subject;
    const char *host;
    uint32_t pid;
    int64_t started_unix_ms;
    uint32_t lease_ms;
    uint64_t revision; /* backend revision of this entry */
    int64_t age_ms;    /* since the entry was last refreshed, as this process sees it */
    int draining;      /* shutting down: do not route new requests */
} sw_instance;

typedef enum sw_registry_event {
    SW_REGISTRY_ADDED = 1,   /* new live instance (or back after being dead) */
    SW_REGISTRY_UPDATED = 2, /* refreshed with a change (draining, labels) */
    SW_REGISTRY_REMOVED = 3  /* deregistered, reported dead, or lease expired */
} sw_registry_event;

/* Watch callback. inst and its strings are valid only during the call. */
typedef void (*sw_registry_watch_fn)(void *arg, sw_registry_event ev, const sw_instance *inst);

/* --- backends (plugins) ------------------------------------------------- */

/* 2 adds `ping`; a backend that says 1 (and has no such field) still opens. */
#define SW_REGISTRY_BACKEND_VERSION 2

/* A raw entry: key, value bytes, revision, and the backend's timestamp of that
 * revision (Unix ms; 0 if unknown; informational: liveness never uses it). */
typedef struct sw_registry_entry {
    const char *key;
    const uint8_t *value;
    size_t len;
    uint64_t revision;
    int64_t created_unix_ms;
} sw_registry_entry;

typedef void (*sw_registry_entry_fn)(void *arg, const sw_registry_entry *e, int deleted);

typedef struct sw_registry_backend {
    const char *name;
    unsigned version; /* SW_REGISTRY_BACKEND_VERSION */
    /* Opens the store named `bucket`. *state is the backend's. */
    sw_err (*open)(void **state, sw_conn *conn, const char *bucket, uint32_t max_age_ms);
    void (*close)(void *state);
    /* Writes key. expect_rev == 0: create or overwrite. Otherwise only if the
     * current revision equals expect_rev (SW_EBUSY if not, SW_ENOTFOUND if the
     * key does not exist). *rev gets the new revision. */
    sw_err (*put)(void *state, const char *key, const uint8_t *val, size_t len, uint64_t expect_rev,
                  uint64_t *rev);
    /* Removes key (no error if absent). */
    sw_err (*del)(void *state, const char *key);
    /* Calls fn for every current entry. */
    sw_err (*list)(void *state, sw_registry_entry_fn fn, void *arg);
    /* Calls fn for every later change, from a backend thread (or the
     * writer's: calls may run at once), until unwatch, which returns once
     * no call runs (a backend may first replay current entries: the core
     * drops revisions it already knows). Returns a handle in *watch. */
    sw_err (*watch)(void *state, sw_registry_entry_fn fn, void *arg, void **watch);
    void (*unwatch)(void *state, void *watch);
    /* Optional (NULL: open is used): opens with the store options below.
     * The KV backend creates a missing bucket with `replicas` copies. */
    sw_err (*open_opts)(void **state, sw_conn *conn, const char *bucket, uint32_t max_age_ms,
                        unsigned replicas);
    /* Version 2, optional (NULL: unknown): SW_OK if the store answers now,
     * within about half a second. The registry asks only when a lease lapses
     * with nothing written to the store for half a lease (every live worker
     * writes every third of one):
     * then, while the store does not answer (a JetStream cluster electing a
     * new leader for the bucket), lapsed entries are held rather than
     * removed (at most SW_REGISTRY_HOLD_MAX_LEASES leases), since a store
     * that cannot be written is not a fleet that died. */
    sw_err (*ping)(void *state);
} sw_registry_backend;

/* Lapsed entries are held for at most this many leases (and 30 s at least)
 * while the store does not answer. */
#define SW_REGISTRY_HOLD_MAX_LEASES 10

/* The built-in backends. */
SW_API const sw_registry_backend *sw_registry_backend_nats_kv(void);
SW_API const sw_registry_backend *sw_registry_backend_memory(void);
/* Looks a backend up by name ("nats-kv", "memory"); NULL if unknown. */
SW_API const sw_registry_backend *sw_registry_backend_find(const char *name);

/* --- the registry ------------------------------------------------------- */

typedef struct sw_registry_opts {
    const char *backend;                    /* "nats-kv" (default) or "memory" */
    const sw_registry_backend *backend_ops; /* overrides `backend` */
    const char *bucket;                     /* default "streamwire_instances" */
    sw_duration lease_ms;   /* default 3000. A worker announces its lease in its entry, and
                               routers judge each entry by the lease it announces. */
    sw_duration refresh_ms; /* default lease_ms / 3 */
    unsigned replicas;      /* copies of a bucket the registry creates (JetStream KV in a
                               cluster: 3 survives a node); default 1. An existing bucket
                               keeps its own. */
    sw_log_fn log;
    void *log_arg;
} sw_registry_opts;

SW_API void sw_registry_opts_init(sw_registry_opts *opts);

/* Opens (and for nats-kv creates if missing) the registry and starts
 * watching it. conn may be NULL for the memory backend.
 * Errors: SW_EINVAL (unknown backend, bad bucket name, backend table of the
 * wrong version or missing entries), SW_ENOMEM, SW_NO_RESPONDERS (the
 * server has no JetStream: nobody answers its API), SW_ENATS... (other NATS
 * errors, wrapped). The nats-kv backend retries, for up to 20 s, failures
 * that pass by themselves in a JetStream cluster that is still electing
 * leaders (a timeout, "temporarily unavailable"), so the call may block
 * that long; a server without JetStream fails at once. */
SW_API SW_NODISCARD sw_err sw_registry_open(sw_registry **out, sw_conn *conn,
                                            const sw_registry_opts *opts);

/* Stops keep-alives (entries registered through this handle are NOT
 * deregistered: call sw_registry_deregister first for a clean exit), stops
 * watching, frees. NULL ok. Must not be called from a watch callback
 * (it waits for the thread that runs them). */
SW_API void sw_registry_close(sw_registry *reg);

/* What a worker registers: one instance serving one endpoint. The registry
 * does not need an sw_ingress; sw_ingress_registration fills this from one. */
typedef struct sw_registration {
    const char *instance_id;     /* required; an sw_validate_token name */
    const char *endpoint;        /* required; ns.component.endpoint (sw_validate_endpoint) */
    const char *request_subject; /* required; a NATS subject without wildcards */
    const char *control_subject; /* required; a NATS subject without wildcards */
} sw_registration;

/* Fills *out from the ingress's public getters. The strings belong to the
 * ingress: valid while it lives (until sw_ingress_destroy).
 * Errors: SW_EINVAL (ing or out NULL). */
SW_API sw_err sw_ingress_registration(const sw_ingress *ing, sw_registration *out);

/* Worker side: registers the described instance and keeps its lease alive
 * from a registry thread until deregistered. If the entry is found
 * tombstoned or deleted while the worker lives, it registers again.
 * Every field of *r is validated and copied: the caller may free or reuse
 * *r and its strings as soon as the call returns.
 * Errors: SW_EINVAL (reg or r NULL, a field NULL or invalid), SW_EEXIST
 * (its instance id is already registered via this handle, on any endpoint:
 * the calls below name the id alone), SW_ENOMEM, backend errors. */
SW_API sw_err sw_registry_register(sw_registry *reg, const sw_registration *r);

/* Marks the entry draining (routers stop picking it) without removing it. */
SW_API sw_err sw_registry_set_draining(sw_registry *reg, const char *instance_id);

/* Stops the keep-alive and deletes the entry. SW_ENOTFOUND if this handle
 * did not register it. */
SW_API sw_err sw_registry_deregister(sw_registry *reg, const char *instance_id);

/* Router side: reports an instance dead. `revision` is the revision the
 * reporter last saw; 0 = the newest revision this handle's view has seen.
 * The write is guarded by it either way. Returns SW_OK when
 * the tombstone was written, or when this handle's view already holds one
 * for the instance (nothing is written: it is reported dead already),
 * SW_EBUSY when the entry has a newer revision (the instance refreshed: it
 * is alive), SW_ENOTFOUND when there is no entry; when the store fails
 * (SW_ETIMEDOUT, SW_NO_RESPONDERS, a NATS error), its error: that says
 * nothing of the entry, and the write may or may not have been made. */
SW_API sw_err sw_registry_report_dead(sw_registry *reg, const char *instance_id, uint64_t revision,
                                      const char *reason);

/* Router side: reports dead an instance that showed no sign of life to the
 * caller for the last silent_ms (a router counts it from the first probe
 * the instance left unanswered). The report is accepted only if this
 * handle has not seen the entry refreshed within that time: a worker whose
 * keep-alive still runs is not declared dead on the strength of a path that
 * failed (the reporter's own connection, a partition between the two).
 * SW_OK (tombstone written), SW_EBUSY (refreshed meanwhile, or a newer
 * revision), SW_ENOTFOUND, SW_EINVAL. */
SW_API sw_err sw_registry_report_silent(sw_registry *reg, const char *instance_id,
                                        sw_duration silent_ms, const char *reason);

/* Live instances serving `endpoint` (NULL = all), from this handle's watched
 * view. *out is an array of *n entries owned by the caller: free it with
 * sw_instances_free. */
SW_API sw_err sw_registry_list(sw_registry *reg, const char *endpoint, sw_instance **out,
                               size_t *n);
SW_API void sw_instances_free(sw_instance *v, size_t n);

/* Adds a watcher. Current live instances are reported as ADDED first.
 * Returns a watcher id (> 0) in *id for sw_registry_unwatch; SW_ENOMEM,
 * with no watcher added, when there is no memory for that snapshot.
 * Afterwards no change is lost, even while the registry's thread can
 * allocate nothing: telling a watcher needs no memory. For one instance
 * the events come in order (ADDED, then UPDATED or REMOVED); steps undone
 * before they were told may be skipped (an instance that came and went
 * within a tick may not be reported at all), so a watcher sees each
 * instance's state, not every step of it. */
SW_API sw_err sw_registry_watch(sw_registry *reg, sw_registry_watch_fn fn, void *arg, int *id);
/* Removes a watcher; when it returns, the callback is not running and will
 * not be called again. Must not be called from the callback. */
SW_API void sw_registry_unwatch(sw_registry *reg, int id);

/* What a registry handle did and saw (counters since sw_registry_open). */
typedef struct sw_registry_stats {
    uint64_t dead_reports_sent;     /* tombstones this handle wrote */
    uint64_t dead_reports_refused;  /* reports refused: the entry was newer (alive) or gone */
    uint64_t dead_reports_received; /* tombstones seen in the store (anyone's, ours included) */
    uint64_t entries_ignored;       /* values that did not decode, sat under another key, or did
                                       not open (sealing) */
    uint64_t live;                  /* gauge: live instances in this handle's view */
    uint64_t store_pings_failed;    /* the store did not answer when every lease lapsed (the
                                       lapsed entries were held, not removed) */
    uint64_t store_down;            /* gauge: 1 while the last such ping failed */
} sw_registry_stats;

SW_API void sw_registry_stats_get(sw_registry *reg, sw_registry_stats *out);

/* Lease of this registry handle, ms. */
SW_API unsigned sw_registry_lease_ms(const sw_registry *reg);

#ifdef __cplusplus
}
#endif
#endif
