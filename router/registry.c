/* router/registry.c -- the registry core on top of a backend table:
 * encoding, leases and liveness, dead reports with a revision guard,
 * re-registration of wrongly removed workers, and watchers.
 *
 * Threads: the registry's ticker (common/sched.h; reg_tick every
 * REG_TICK_MS, and at once when kicked) does the keep-alive writes, expires
 * entries whose lease ran out, and delivers watch events in order.
 * The backend's watch callback (reg_on_entry) runs on a backend thread (KV)
 * or on the writer's thread (memory backend: synchronously inside put/del,
 * possibly of another handle, which may hold that handle's wmu); it only
 * updates the view and queues events.
 *
 * Locks, in this order (a thread holding one never takes an earlier one):
 *   wmu  serialises every write of our own entries (register, keep-alive,
 *        draining, deregister); held across the backend put/del.
 *   mu   the view, our own entries, the watchers and the event queue; never
 *        held across a backend call.
 * Then the backend's own lock (registry_mem.c: its bucket lock, taken
 * inside put/del/list, under wmu but never under mu).
 * No user callback runs with wmu or mu held: watch callbacks are called by
 * reg_tick after dropping mu (sw_registry_unwatch waits on `dispatching`),
 * and every log line is written after the locks are released (what happened
 * under a lock is noted there and logged afterwards). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sched.h"
#include "common/sw_common.h"
#include "proto/sw_codec.h"
#include "transport/envelope.h"
#include "transport/sw_transport.h"
#include <streamwire/registry.h>

#define REG_MAX_VALUE (64 * 1024)
#define REG_TICK_MS 50
#define REG_FORGET_LEASES 20 /* a dead entry is forgotten after this many leases */
#define REG_PING_MS 250      /* the store is asked at most this often while leases lapse */
#define REG_KEY_MAX (SW_MAX_ENDPOINT + SW_MAX_TOKEN + 2)

typedef struct reg_view {
    char key[REG_KEY_MAX];
    swp_instance *info;
    uint64_t rev;
    int64_t seen_ms;  /* monotonic time this revision counts from */
    int64_t grace_ms; /* its lease does not lapse before this (the store came back) */
    int live;
    /* A dead report of ours was refused (the entry looked refreshed, or
     * our view was behind the store): written when its lease lapses here. */
    int report_pending;
    char report_reason[96];
} reg_view;

typedef struct reg_own {
    char key[REG_KEY_MAX];
    char instance[SW_MAX_TOKEN + 1];
    char endpoint[SW_MAX_ENDPOINT + 1];
    char req_subj[SWP_MAX_SUBJECT + 1];
    char ctl_subj[SWP_MAX_SUBJECT + 1];
    int64_t started_unix_ms;
    int draining;
    uint64_t rev;
    int64_t next_refresh_ms;
} reg_own;

typedef struct reg_event {
    struct reg_event *next;
    int target; /* watcher id, 0 = every watcher */
    sw_registry_event ev;
    swp_instance *info; /* owned copy */
    uint64_t rev;
    int64_t age_ms;
} reg_event;

typedef struct reg_watcher {
    int id;
    sw_registry_watch_fn fn;
    void *arg;
} reg_watcher;

struct sw_registry {
    const sw_registry_backend *be;
    sw_registry_stats st; /* counters (mu) */
    char bucket[SW_MAX_TOKEN + 1];
    const swt_sealer *sealer; /* the connection's: values sealed under their key (or NULL) */
    sw_conn *conn;            /* NULL for a backend that needs none */
    void *bs;
    void *bw;
    swi_logger log;
    unsigned lease_ms, refresh_ms;
    char host[64];
    /* Serialises every write of our own entries (register, keep-alive,
     * draining, deregister), so a refresh in flight can neither resurrect a
     * deregistered entry nor undo a draining flag. Order: wmu, then mu
     * (see the file's header). */
    pthread_mutex_t wmu;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    reg_view *view;
    size_t nview, capview;
    reg_own *own;
    size_t nown, capown;
    reg_watcher *w;
    size_t nw, capw;
    int next_id;
    int dispatching;      /* watcher id whose callback runs now */
    unsigned lost_events; /* events not queued for lack of memory, not yet logged */
    reg_event *eh, *et;
    swi_ticker ticker; /* runs reg_tick */
    int stopping;
    /* The store's health, for leases (mu): the last time anything was seen
     * written to it (a newer revision, or one of our writes), the last
     * ping, and whether it failed. */
    int64_t activity_ms, ping_ms;
    int store_down;
    unsigned held; /* lapsed entries held in the last look (logged once) */
    int log_back;  /* the store answers again: to be logged */
};

/* ---------------------------------------------------------------- helpers */

static void
reg_count(sw_registry *reg, uint64_t *field)
{
    pthread_mutex_lock(&reg->mu);
    (*field)++;
    pthread_mutex_unlock(&reg->mu);
}

void
sw_registry_stats_get(sw_registry *reg, sw_registry_stats *out)
{
    if (reg == NULL || out == NULL)
        return;
    pthread_mutex_lock(&reg->mu);
    *out = reg->st;
    out->live = 0;
    for (size_t i = 0; i < reg->nview; i++)
        if (reg->view[i].live)
            out->live++;
    out->store_down = (uint64_t)reg->store_down;
    pthread_mutex_unlock(&reg->mu);
}

const char *swr_registry_bucket(const sw_registry *reg);
const char *
swr_registry_bucket(const sw_registry *reg)
{
    return reg->bucket;
}

static swp_instance *
info_copy(const swp_instance *in)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    swp_instance *out = NULL;
    if (swp_encode_alloc(in, REG_MAX_VALUE, &buf, &len) == SW_OK)
        (void)swp_decode_instance(buf, len, REG_MAX_VALUE, &out);
    free(buf);
    return out;
}

/* Queues an event (reg->mu held). */
static void
reg_queue(sw_registry *reg, int target, sw_registry_event ev, const swp_instance *info,
          uint64_t rev, int64_t age_ms)
{
    reg_event *e;
    if (reg->nw == 0 && target == 0)
        return;
    if ((e = calloc(1, sizeof(*e))) == NULL || (e->info = info_copy(info)) == NULL) {
        free(e);
        /* Logged by reg_tick, without the lock. */
        reg->lost_events++;
        swi_ticker_kick(&reg->ticker);
        return;
    }
    e->target = target;
    e->ev = ev;
    e->rev = rev;
    e->age_ms = age_ms;
    if (reg->et)
        reg->et->next = e;
    else
        reg->eh = e;
    reg->et = e;
    swi_ticker_kick(&reg->ticker);
}

static reg_view *
view_find_key(sw_registry *reg, const char *key)
{
    for (size_t i = 0; i < reg->nview; i++)
        if (strcmp(reg->view[i].key, key) == 0)
            return &reg->view[i];
    return NULL;
}

static reg_view *
view_find_instance(sw_registry *reg, const char *instance)
{
    for (size_t i = 0; i < reg->nview; i++)
        if (strcmp(reg->view[i].info->instance_id, instance) == 0)
            return &reg->view[i];
    return NULL;
}

static reg_own *
own_find(sw_registry *reg, const char *key)
{
    for (size_t i = 0; i < reg->nown; i++)
        if (strcmp(reg->own[i].key, key) == 0)
            return &reg->own[i];
    return NULL;
}

/* The view entry for key, added empty if absent; NULL on no memory. */
static reg_view *
view_get_or_add(sw_registry *reg, const char *key)
{
    reg_view *v = view_find_key(reg, key);
    if (v != NULL)
        return v;
    if (reg->nview == reg->capview) {
        size_t ncap = reg->capview ? reg->capview * 2 : 16;
        reg_view *nv = realloc(reg->view, ncap * sizeof(*nv));
        if (nv == NULL)
            return NULL;
        reg->view = nv;
        reg->capview = ncap;
    }
    v = &reg->view[reg->nview++];
    memset(v, 0, sizeof(*v));
    snprintf(v->key, sizeof(v->key), "%s", key);
    return v;
}

static void
view_remove(sw_registry *reg, reg_view *v)
{
    swp_free(v->info);
    *v = reg->view[--reg->nview];
}

/* The store works (again) (mu held). If it was down, every live entry
 * gets a lease from now to be refreshed in, as its worker's keep-alives go
 * through again: none is dropped in the moment between the store coming
 * back and the first keep-alive. (A grace, not a sighting: seen_ms, which
 * dead reports are judged by, stays the last refresh really seen.) */
static void
reg_store_back(sw_registry *reg, int64_t now)
{
    if (!reg->store_down)
        return;
    reg->store_down = 0;
    reg->log_back = 1; /* logged by the ticker, without the lock */
    for (size_t i = 0; i < reg->nview; i++)
        if (reg->view[i].live)
            reg->view[i].grace_ms =
                now + (reg->view[i].info->lease_ms ? reg->view[i].info->lease_ms : reg->lease_ms);
}

static sw_err reg_report(sw_registry *reg, const char *instance_id, uint64_t revision,
                         int64_t silent_ms, const char *reason);
static sw_err reg_report_counted(sw_registry *reg, sw_err rv);

/* A refused report, kept for when the entry's lease lapses in this view
 * (a watch that lagged behind the store shows a dead worker's last refresh
 * late: the report is refused, and the entry would stay in the store for
 * every router that starts later). */
static void
reg_report_later(sw_registry *reg, const char *instance_id, const char *reason)
{
    reg_view *v;
    pthread_mutex_lock(&reg->mu);
    if ((v = view_find_instance(reg, instance_id)) != NULL && !v->info->dead) {
        v->report_pending = 1;
        snprintf(v->report_reason, sizeof(v->report_reason), "%s",
                 reason ? reason : "reported dead");
    }
    pthread_mutex_unlock(&reg->mu);
}

/* ---------------------------------------------------------------- backend events */

static void
reg_on_entry(void *arg, const sw_registry_entry *e, int deleted)
{
    sw_registry *reg = arg;
    swp_instance *info = NULL;
    reg_view *v;
    reg_own *own;
    int64_t now = swi_now_ms();
    char wronged[SW_MAX_TOKEN + 1]; /* own instance removed while alive: logged after unlock */

    wronged[0] = '\0';
    if (!deleted) {
        const uint8_t *val = e->value;
        size_t vlen = e->len;
        uint8_t *opened = NULL;
        sw_err rv;
        if (reg->sealer != NULL || swt_env_is_sealed(e->value, e->len)) {
            /* Sealed registry: an entry or tombstone that does not open under
             * its own key (unsealed, another key, moved, forged) is ignored. */
            size_t n = 0;
            if (reg->sealer == NULL || (opened = malloc(e->len ? e->len : 1)) == NULL ||
                swt_env_open_kv(reg->sealer, e->key, e->value, e->len, opened, e->len, &n) !=
                    SW_OK) {
                free(opened);
                swi_log(&reg->log, SW_LOG_WARN,
                        "registry: entry %s does not open with %s: ignored (auth_failed)", e->key,
                        reg->sealer ? "the cluster key" : "no key (it is sealed)");
                reg_count(reg, &reg->st.entries_ignored);
                return;
            }
            val = opened;
            vlen = n;
        }
        rv = swp_decode_instance(val, vlen, REG_MAX_VALUE, &info);
        free(opened);
        if (rv != SW_OK) {
            swi_log(&reg->log, SW_LOG_WARN, "registry: entry %s does not decode (%s): ignored",
                    e->key, sw_err_name(rv));
            reg_count(reg, &reg->st.entries_ignored);
            return;
        }
        {
            /* An entry lives under <endpoint>.<instance> and nowhere else:
             * one under another key (stale or forged) naming a live
             * instance must not stand for it (issue 11 #11). */
            char want[REG_KEY_MAX];
            int n = snprintf(want, sizeof(want), "%s.%s", info->endpoint, info->instance_id);
            if (n < 0 || (size_t)n >= sizeof(want) || strcmp(want, e->key) != 0) {
                swi_log(&reg->log, SW_LOG_WARN,
                        "registry: entry %s names %s.%s: not its own key, ignored", e->key,
                        info->endpoint, info->instance_id);
                swp_free(info);
                reg_count(reg, &reg->st.entries_ignored);
                return;
            }
        }
    }
    pthread_mutex_lock(&reg->mu);
    v = view_find_key(reg, e->key);
    own = own_find(reg, e->key);
    if (v != NULL && e->revision <= v->rev) {
        /* An older revision than we know (list/watch overlap). */
        pthread_mutex_unlock(&reg->mu);
        swp_free(info);
        return;
    }
    reg->activity_ms = now; /* the store was written: it works */
    reg_store_back(reg, now);
    if (deleted || info->dead) {
        if (!deleted)
            reg->st.dead_reports_received++; /* mu held */
        if (v != NULL && v->live)
            reg_queue(reg, 0, SW_REGISTRY_REMOVED, v->info, v->rev, now - v->seen_ms);
        if (deleted) {
            if (v != NULL)
                view_remove(reg, v);
        } else if ((v = view_get_or_add(reg, e->key)) != NULL) {
            swp_free(v->info);
            v->info = info;
            info = NULL;
            v->rev = e->revision;
            v->seen_ms = now;
            v->live = 0;
        }
        if (own != NULL) {
            /* We are alive: whoever removed us was wrong. */
            snprintf(wronged, sizeof(wronged), "%s", own->instance);
            own->rev = 0;
            own->next_refresh_ms = now;
            swi_ticker_kick(&reg->ticker);
        }
        pthread_mutex_unlock(&reg->mu);
        swp_free(info);
        if (wronged[0] != '\0')
            swi_log(&reg->log, SW_LOG_WARN,
                    "registry: instance %s was %s while alive; registering again", wronged,
                    deleted ? "deleted" : "reported dead");
        return;
    }
    if (v == NULL && (v = view_get_or_add(reg, e->key)) == NULL) {
        pthread_mutex_unlock(&reg->mu);
        swp_free(info);
        return;
    }
    {
        int was_live = v->live;
        int drain_changed = v->info != NULL && v->info->draining != info->draining;
        /* Judged only by when this process saw the revision, on its own
         * monotonic clock: no other clock (the store's created_unix_ms, the
         * worker's refreshed_unix_ms) is compared with ours, so a router
         * whose clock disagrees still sees live workers. A first sight
         * counts as seen now: an entry abandoned before this process
         * started is live for at most one lease. */
        swp_free(v->info);
        v->info = info;
        info = NULL;
        v->rev = e->revision;
        v->seen_ms = now;
        v->live = 1;
        if (!was_live)
            reg_queue(reg, 0, SW_REGISTRY_ADDED, v->info, v->rev, 0);
        else if (drain_changed)
            reg_queue(reg, 0, SW_REGISTRY_UPDATED, v->info, v->rev, 0);
    }
    pthread_mutex_unlock(&reg->mu);
}

/* ---------------------------------------------------------------- keep-alive */

/* Seals a value for its key when the connection seals (*buf replaced). */
static sw_err
reg_seal(const sw_registry *reg, const char *key, uint8_t **buf, size_t *len)
{
    uint8_t *out;
    size_t n = 0;
    sw_err e;
    if (reg->sealer == NULL)
        return SW_OK;
    if ((out = malloc(*len + SWT_ENV_OVERHEAD)) == NULL)
        return SW_ENOMEM;
    e = swt_env_seal_kv(reg->sealer, key, *buf, *len, out, *len + SWT_ENV_OVERHEAD, &n);
    free(*buf);
    *buf = NULL;
    if (e != SW_OK) {
        free(out);
        return e;
    }
    *buf = out;
    *len = n;
    return SW_OK;
}

static sw_err
own_encode(sw_registry *reg, const reg_own *o, uint8_t **buf, size_t *len)
{
    swp_instance m = STREAMWIRE__V1__INSTANCE_INFO__INIT;
    m.version = SW_PROTOCOL_VERSION;
    m.instance_id = (char *)o->instance;
    m.endpoint = (char *)o->endpoint;
    m.request_subject = (char *)o->req_subj;
    m.control_subject = (char *)o->ctl_subj;
    m.started_unix_ms = (uint64_t)o->started_unix_ms;
    m.host = reg->host;
    m.pid = (uint32_t)getpid();
    m.refreshed_unix_ms = (uint64_t)swi_unix_ms();
    m.lease_ms = reg->lease_ms;
    m.draining = o->draining != 0;
    {
        sw_err e = swp_encode_alloc(&m, REG_MAX_VALUE, buf, len);
        return e == SW_OK ? reg_seal(reg, o->key, buf, len) : e;
    }
}

/* One keep-alive write for own entry `key` (reg->mu NOT held). */
static void
reg_refresh(sw_registry *reg, const char *key)
{
    reg_own copy, *o;
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t rev = 0;
    sw_err rv;
    int overwritten = 0;

    pthread_mutex_lock(&reg->wmu);
    pthread_mutex_lock(&reg->mu);
    o = own_find(reg, key);
    if (o == NULL) {
        pthread_mutex_unlock(&reg->mu);
        pthread_mutex_unlock(&reg->wmu);
        return;
    }
    copy = *o;
    pthread_mutex_unlock(&reg->mu);

    if (own_encode(reg, &copy, &buf, &len) != SW_OK) {
        pthread_mutex_unlock(&reg->wmu);
        return;
    }
    rv = reg->be->put(reg->bs, copy.key, buf, len, copy.rev, &rev);
    if (rv == SW_EBUSY || rv == SW_ENOTFOUND) {
        overwritten = 1; /* logged below, after wmu */
        rv = reg->be->put(reg->bs, copy.key, buf, len, 0, &rev);
    }
    free(buf);
    pthread_mutex_lock(&reg->mu);
    o = own_find(reg, key);
    if (rv == SW_OK) {
        reg->activity_ms = swi_now_ms();
        reg_store_back(reg, reg->activity_ms);
    }
    if (o != NULL) {
        if (rv == SW_OK)
            o->rev = rev;
        o->next_refresh_ms = swi_now_ms() + (rv == SW_OK ? reg->refresh_ms : REG_TICK_MS * 4);
    }
    pthread_mutex_unlock(&reg->mu);
    pthread_mutex_unlock(&reg->wmu);
    if (overwritten)
        swi_log(
            &reg->log, SW_LOG_WARN,
            "registry: entry of live instance %s was changed by someone else; registering again",
            copy.instance);
    if (rv != SW_OK)
        swi_log(&reg->log, SW_LOG_ERROR, "registry: refresh of %s failed: %s", copy.instance,
                sw_err_name(rv));
}

/* ---------------------------------------------------------------- thread */

/* Nothing was seen written to the store for half a lease (every live
 * worker writes every third of one), and the backend can be asked whether
 * it answers (mu held). */
static int
reg_store_quiet(const sw_registry *reg, int64_t now, int64_t lease)
{
    return reg->be->version >= 2 && reg->be->ping != NULL && now - reg->activity_ms >= lease / 2;
}

/* How long a lapsed entry may be held while the store does not answer. */
static int64_t
reg_hold_max(int64_t lease)
{
    int64_t m = SW_REGISTRY_HOLD_MAX_LEASES * lease;
    return m < 30000 ? 30000 : m;
}

/* One tick on the registry's ticker (every REG_TICK_MS, and at once when
 * kicked): does everything that is due, one piece at a time, then returns. */
static void
reg_tick(void *arg, int64_t now0)
{
    sw_registry *reg = arg;
    (void)now0;
    pthread_mutex_lock(&reg->mu);
    while (!reg->stopping) {
        int64_t now = swi_now_ms();
        char due[REG_KEY_MAX];
        char expired[SW_MAX_TOKEN + 1];
        unsigned held;
        int need_ping;
        int64_t up;
        char late_reason[96];

        /* Log lines noted under the lock, written without it. */
        if (reg->lost_events > 0) {
            unsigned lost = reg->lost_events;
            reg->lost_events = 0;
            pthread_mutex_unlock(&reg->mu);
            swi_log(&reg->log, SW_LOG_ERROR,
                    "registry: out of memory queueing events: %u watch event(s) lost", lost);
            pthread_mutex_lock(&reg->mu);
            continue;
        }

        /* Events, in order, one at a time, no lock held during callbacks. */
        if (reg->eh != NULL) {
            reg_event *e = reg->eh;
            reg_watcher *snap;
            size_t nsnap = reg->nw;
            reg->eh = e->next;
            if (reg->eh == NULL)
                reg->et = NULL;
            /* Call the watchers as they were when the event was taken; one
             * removed meanwhile is skipped (sw_registry_unwatch). */
            snap = malloc((nsnap ? nsnap : 1) * sizeof(*snap));
            for (size_t i = 0; snap != NULL && i < nsnap; i++)
                snap[i] = reg->w[i];
            for (size_t i = 0; snap != NULL && i < nsnap; i++) {
                reg_watcher w = snap[i];
                sw_instance inst;
                int present = 0;
                if (e->target != 0 && e->target != w.id)
                    continue;
                for (size_t j = 0; j < reg->nw; j++)
                    present |= reg->w[j].id == w.id;
                if (!present)
                    continue;
                inst.instance_id = e->info->instance_id;
                inst.endpoint = e->info->endpoint;
                inst.request_subject = e->info->request_subject;
                inst.control_subject = e->info->control_subject;
                inst.host = e->info->host;
                inst.pid = e->info->pid;
                inst.started_unix_ms = (int64_t)e->info->started_unix_ms;
                inst.lease_ms = e->info->lease_ms;
                inst.revision = e->rev;
                inst.age_ms = e->age_ms;
                inst.draining = e->info->draining;
                reg->dispatching = w.id;
                pthread_mutex_unlock(&reg->mu);
                w.fn(w.arg, e->ev, &inst);
                pthread_mutex_lock(&reg->mu);
                reg->dispatching = 0;
                pthread_cond_broadcast(&reg->cv);
            }
            free(snap);
            swp_free(e->info);
            free(e);
            continue;
        }

        /* Leases: an entry not refreshed within lease_ms is dead. One at a
         * time, so that its log line is written without the lock. But
         * when nothing at all was written to the store for half a lease, the
         * store itself may be down (a JetStream cluster electing the
         * bucket's leader: every keep-alive fails): it is asked (ping),
         * and while it does not answer, lapsed entries are held. */
        expired[0] = '\0';
        late_reason[0] = '\0';
        held = 0;
        need_ping = 0;
        /* Our own connection down: no refresh can reach us, and silence is
         * no evidence; once it is back, silence counts from then (the watch
         * is made again and catches up). */
        up = reg->conn != NULL ? swt_conn_up_since_ms(reg->conn) : 0;
        for (size_t i = 0; i < reg->nview && expired[0] == '\0' && !need_ping; i++) {
            reg_view *v = &reg->view[i];
            /* Each entry by the lease its worker announced. */
            int64_t lease = v->info->lease_ms ? (int64_t)v->info->lease_ms : (int64_t)reg->lease_ms;
            if (v->live && (now < v->grace_ms || up < 0 || now - up < lease))
                continue;
            if (v->live && now - v->seen_ms >= lease && reg_store_quiet(reg, now, lease) &&
                now - v->seen_ms < reg_hold_max(lease)) {
                if (now - reg->ping_ms >= REG_PING_MS) {
                    need_ping = 1;
                    break;
                }
                if (reg->store_down) {
                    held++;
                    continue;
                }
            }
            if (v->live && now - v->seen_ms >= lease) {
                v->live = 0;
                snprintf(expired, sizeof(expired), "%s", v->info->instance_id);
                if (v->report_pending) {
                    v->report_pending = 0;
                    snprintf(late_reason, sizeof(late_reason), "%s", v->report_reason);
                }
                reg_queue(reg, 0, SW_REGISTRY_REMOVED, v->info, v->rev, now - v->seen_ms);
            } else if (!v->live && now - v->seen_ms >= REG_FORGET_LEASES * lease) {
                /* The store's max age drops such entries without a delete
                 * event: forget them too, or the view only grows. */
                view_remove(reg, v);
                i--;
            }
        }
        if (need_ping) {
            int was_down = reg->store_down;
            sw_err prv;
            reg->ping_ms = now;
            pthread_mutex_unlock(&reg->mu);
            prv = reg->be->ping(reg->bs);
            if (prv == SW_OK) {
                /* It answers: before anything is expired on the silence of
                 * our own watch (which may be what broke, e.g. after our
                 * reconnect), read the store again: an entry its worker
                 * refreshed comes back with a newer revision. */
                (void)reg->be->list(reg->bs, reg_on_entry, reg);
            }
            pthread_mutex_lock(&reg->mu);
            reg->store_down = prv != SW_OK;
            if (prv != SW_OK)
                reg->st.store_pings_failed++;
            if (was_down && !reg->store_down) {
                reg->store_down = 1;
                reg_store_back(reg, now);
            }
            if (reg->store_down && !was_down) {
                pthread_mutex_unlock(&reg->mu);
                swi_log(&reg->log, SW_LOG_WARN,
                        "registry: nothing was written to the store for half a lease and it does "
                        "not answer (%s): lapsed entries are held until it does",
                        sw_err_name(prv));
                pthread_mutex_lock(&reg->mu);
            }
            continue;
        }
        if (reg->log_back) {
            reg->log_back = 0;
            pthread_mutex_unlock(&reg->mu);
            swi_log(&reg->log, SW_LOG_INFO,
                    "registry: the store answers again; held entries have a lease to be "
                    "refreshed in");
            pthread_mutex_lock(&reg->mu);
            continue;
        }
        if (held != reg->held) {
            unsigned n = reg->held = held;
            if (n > 0) {
                pthread_mutex_unlock(&reg->mu);
                swi_log(&reg->log, SW_LOG_INFO,
                        "registry: %u lapsed entr%s held while the store does not answer", n,
                        n == 1 ? "y" : "ies");
                pthread_mutex_lock(&reg->mu);
                continue;
            }
        }
        if (expired[0] != '\0') {
            pthread_mutex_unlock(&reg->mu);
            swi_log(&reg->log, SW_LOG_INFO, "registry: lease of %s expired", expired);
            if (late_reason[0] != '\0') {
                /* A whole lease without a refresh, after our report was
                 * refused: reported now, against the last revision seen. */
                (void)reg_report_counted(reg, reg_report(reg, expired, 0, -1, late_reason));
            }
            pthread_mutex_lock(&reg->mu);
            continue;
        }

        /* Keep-alives. */
        due[0] = '\0';
        {
            /* The most overdue entry first, so a slow write never starves
             * the others. */
            int64_t oldest = now + 1;
            for (size_t i = 0; i < reg->nown; i++) {
                if (reg->own[i].next_refresh_ms <= now && reg->own[i].next_refresh_ms < oldest) {
                    oldest = reg->own[i].next_refresh_ms;
                    snprintf(due, sizeof(due), "%s", reg->own[i].key);
                }
            }
        }
        if (due[0] != '\0') {
            pthread_mutex_unlock(&reg->mu);
            reg_refresh(reg, due);
            pthread_mutex_lock(&reg->mu);
            continue;
        }
        break; /* nothing due: the next tick or kick comes back */
    }
    pthread_mutex_unlock(&reg->mu);
}

/* ---------------------------------------------------------------- API */

const sw_registry_backend *
sw_registry_backend_find(const char *name)
{
    if (name == NULL || strcmp(name, "nats-kv") == 0)
        return sw_registry_backend_nats_kv();
    if (strcmp(name, "memory") == 0)
        return sw_registry_backend_memory();
    return NULL;
}

void
sw_registry_opts_init(sw_registry_opts *o)
{
    if (o == NULL)
        return;
    memset(o, 0, sizeof(*o));
    o->backend = "nats-kv";
    o->bucket = "streamwire_instances";
    o->lease_ms = 3000;
}

static int
backend_ok(const sw_registry_backend *be)
{
    return be != NULL && be->version >= 1 && be->version <= SW_REGISTRY_BACKEND_VERSION &&
           be->name != NULL && be->open != NULL && be->close != NULL && be->put != NULL &&
           be->del != NULL && be->list != NULL && be->watch != NULL && be->unwatch != NULL;
}

sw_err
sw_registry_open(sw_registry **out, sw_conn *conn, const sw_registry_opts *o)
{
    sw_registry *reg;
    const sw_registry_backend *be;
    const char *bucket;
    sw_err rv;

    if (out == NULL || o == NULL)
        return SW_EINVAL;
    *out = NULL;
    be = o->backend_ops ? o->backend_ops : sw_registry_backend_find(o->backend);
    bucket = o->bucket ? o->bucket : "streamwire_instances";
    if (!backend_ok(be) || sw_validate_token(bucket) != SW_OK)
        return SW_EINVAL;
    if (o->lease_ms < 0 || o->lease_ms > UINT32_MAX || o->refresh_ms < 0 ||
        o->refresh_ms > UINT32_MAX)
        return SW_EINVAL;
    if ((rv = swi_init()) != SW_OK)
        return rv;
    if ((reg = calloc(1, sizeof(*reg))) == NULL)
        return SW_ENOMEM;
    reg->be = be;
    snprintf(reg->bucket, sizeof(reg->bucket), "%s", bucket);
    reg->sealer = conn != NULL ? swt_conn_sealer(conn) : NULL;
    reg->conn = conn;
    reg->log.fn = o->log;
    reg->log.arg = o->log_arg;
    reg->lease_ms = o->lease_ms ? (unsigned)o->lease_ms : 3000;
    reg->refresh_ms = o->refresh_ms ? (unsigned)o->refresh_ms : reg->lease_ms / 3;
    if (reg->refresh_ms == 0 || reg->refresh_ms >= reg->lease_ms)
        reg->refresh_ms = reg->lease_ms / 3 ? reg->lease_ms / 3 : 1;
    if (gethostname(reg->host, sizeof(reg->host) - 1) != 0)
        snprintf(reg->host, sizeof(reg->host), "unknown");
    pthread_mutex_init(&reg->wmu, NULL);
    pthread_mutex_init(&reg->mu, NULL);
    swi_cond_init(&reg->cv);
    reg->next_id = 1;
    /* The ticker first: the backend's callbacks below kick it. */
    if (swi_ticker_start(&reg->ticker, REG_TICK_MS, reg_tick, reg) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    /* Garbage collection of abandoned entries: well past any lease. */
    {
        uint32_t age = 20 * reg->lease_ms < 60000 ? 60000 : 20 * reg->lease_ms;
        rv = be->open_opts != NULL ? be->open_opts(&reg->bs, conn, bucket, age, o->replicas)
                                   : be->open(&reg->bs, conn, bucket, age);
    }
    if (rv != SW_OK)
        goto fail;
    pthread_mutex_lock(&reg->mu);
    reg->activity_ms = swi_now_ms(); /* it answered */
    pthread_mutex_unlock(&reg->mu);
    /* Watch before listing, so nothing falls between the two; the
     * revision check drops whatever both report. */
    if ((rv = be->watch(reg->bs, reg_on_entry, reg, &reg->bw)) != SW_OK)
        goto fail;
    if ((rv = be->list(reg->bs, reg_on_entry, reg)) != SW_OK)
        goto fail;
    *out = reg;
    return SW_OK;
fail:
    sw_registry_close(reg);
    return rv;
}

void
sw_registry_close(sw_registry *reg)
{
    if (reg == NULL)
        return;
    if (reg->bw != NULL)
        reg->be->unwatch(reg->bs, reg->bw);
    pthread_mutex_lock(&reg->mu);
    reg->stopping = 1;
    pthread_mutex_unlock(&reg->mu);
    swi_ticker_stop(&reg->ticker); /* no-op if it never started */
    if (reg->bs != NULL)
        reg->be->close(reg->bs);
    while (reg->eh != NULL) {
        reg_event *e = reg->eh;
        reg->eh = e->next;
        swp_free(e->info);
        free(e);
    }
    for (size_t i = 0; i < reg->nview; i++)
        swp_free(reg->view[i].info);
    free(reg->view);
    free(reg->own);
    free(reg->w);
    pthread_mutex_destroy(&reg->wmu);
    pthread_mutex_destroy(&reg->mu);
    pthread_cond_destroy(&reg->cv);
    free(reg);
}

unsigned
sw_registry_lease_ms(const sw_registry *reg)
{
    return reg ? reg->lease_ms : 0;
}

/* Copies src into dst[cap]; 0 if it does not fit. */
static int
copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        return 0;
    memcpy(dst, src, n + 1);
    return 1;
}

sw_err
sw_registry_register(sw_registry *reg, const sw_registration *r)
{
    reg_own o;
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t rev = 0;
    sw_err rv;
    int n;

    if (reg == NULL || r == NULL || sw_validate_token(r->instance_id) != SW_OK ||
        sw_validate_endpoint(r->endpoint) != SW_OK || !swp_valid_subject(r->request_subject) ||
        !swp_valid_subject(r->control_subject))
        return SW_EINVAL;
    /* Copied: the caller may free *r when this returns. */
    memset(&o, 0, sizeof(o));
    if (!copy_str(o.instance, sizeof(o.instance), r->instance_id) ||
        !copy_str(o.endpoint, sizeof(o.endpoint), r->endpoint) ||
        !copy_str(o.req_subj, sizeof(o.req_subj), r->request_subject) ||
        !copy_str(o.ctl_subj, sizeof(o.ctl_subj), r->control_subject))
        return SW_EINVAL;
    n = snprintf(o.key, sizeof(o.key), "%s.%s", o.endpoint, o.instance);
    if (n < 0 || (size_t)n >= sizeof(o.key))
        return SW_EINVAL;
    o.started_unix_ms = swi_unix_ms();

    pthread_mutex_lock(&reg->wmu);
    pthread_mutex_lock(&reg->mu);
    if (own_find(reg, o.key) != NULL) {
        pthread_mutex_unlock(&reg->mu);
        pthread_mutex_unlock(&reg->wmu);
        return SW_EEXIST;
    }
    pthread_mutex_unlock(&reg->mu);
    if ((rv = own_encode(reg, &o, &buf, &len)) == SW_OK)
        rv = reg->be->put(reg->bs, o.key, buf, len, 0, &rev);
    free(buf);
    if (rv != SW_OK) {
        pthread_mutex_unlock(&reg->wmu);
        return rv;
    }
    o.rev = rev;
    o.next_refresh_ms = swi_now_ms() + reg->refresh_ms;
    pthread_mutex_lock(&reg->mu);
    if (reg->nown == reg->capown) {
        size_t ncap = reg->capown ? reg->capown * 2 : 4;
        reg_own *nv = realloc(reg->own, ncap * sizeof(*nv));
        if (nv == NULL) {
            pthread_mutex_unlock(&reg->mu);
            (void)reg->be->del(reg->bs, o.key);
            pthread_mutex_unlock(&reg->wmu);
            return SW_ENOMEM;
        }
        reg->own = nv;
        reg->capown = ncap;
    }
    reg->own[reg->nown++] = o;
    swi_ticker_kick(&reg->ticker);
    pthread_mutex_unlock(&reg->mu);
    pthread_mutex_unlock(&reg->wmu);
    swi_log(&reg->log, SW_LOG_INFO, "registry: registered %s (revision %llu)", o.instance,
            (unsigned long long)rev);
    return SW_OK;
}

static reg_own *
own_find_instance(sw_registry *reg, const char *instance)
{
    for (size_t i = 0; i < reg->nown; i++)
        if (strcmp(reg->own[i].instance, instance) == 0)
            return &reg->own[i];
    return NULL;
}

sw_err
sw_registry_set_draining(sw_registry *reg, const char *instance_id)
{
    reg_own *o;
    char key[REG_KEY_MAX];
    if (reg == NULL || instance_id == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&reg->mu);
    o = own_find_instance(reg, instance_id);
    if (o == NULL) {
        pthread_mutex_unlock(&reg->mu);
        return SW_ENOTFOUND;
    }
    o->draining = 1;
    snprintf(key, sizeof(key), "%s", o->key);
    pthread_mutex_unlock(&reg->mu);
    reg_refresh(reg, key);
    return SW_OK;
}

sw_err
sw_registry_deregister(sw_registry *reg, const char *instance_id)
{
    reg_own *o;
    char key[REG_KEY_MAX];
    sw_err rv;
    if (reg == NULL || instance_id == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&reg->wmu);
    pthread_mutex_lock(&reg->mu);
    o = own_find_instance(reg, instance_id);
    if (o == NULL) {
        pthread_mutex_unlock(&reg->mu);
        pthread_mutex_unlock(&reg->wmu);
        return SW_ENOTFOUND;
    }
    snprintf(key, sizeof(key), "%s", o->key);
    *o = reg->own[--reg->nown];
    pthread_mutex_unlock(&reg->mu);
    rv = reg->be->del(reg->bs, key);
    pthread_mutex_unlock(&reg->wmu);
    return rv;
}

/* Writes the tombstone of instance_id, guarded by `revision` (0: the
 * view's), refused with SW_EBUSY if silent_ms >= 0 and this handle saw the
 * entry refreshed within the last silent_ms. */
static sw_err
reg_report(sw_registry *reg, const char *instance_id, uint64_t revision, int64_t silent_ms,
           const char *reason)
{
    reg_view *v;
    swp_instance *tomb;
    char key[REG_KEY_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t rev;
    sw_err rv;

    if (reg == NULL || sw_validate_token(instance_id) != SW_OK)
        return SW_EINVAL;
    pthread_mutex_lock(&reg->mu);
    v = view_find_instance(reg, instance_id);
    if (v == NULL) {
        pthread_mutex_unlock(&reg->mu);
        return SW_ENOTFOUND;
    }
    if (v->info->dead) {
        pthread_mutex_unlock(&reg->mu);
        return SW_OK;
    }
    if (silent_ms >= 0 && swi_now_ms() - v->seen_ms < silent_ms) {
        /* Refreshed while the reporter heard nothing: its keep-alive runs,
         * so the reporter's evidence is not death (its own connection, or
         * the path to the worker, may be what failed). Should the entry
         * go a whole lease without a refresh here, it is reported then. */
        pthread_mutex_unlock(&reg->mu);
        reg_report_later(reg, instance_id, reason);
        return SW_EBUSY;
    }
    rev = revision ? revision : v->rev;
    snprintf(key, sizeof(key), "%s", v->key);
    tomb = info_copy(v->info);
    pthread_mutex_unlock(&reg->mu);
    if (tomb == NULL)
        return SW_ENOMEM;
    {
        /* A shallow copy: the decoded message keeps owning its fields. */
        swp_instance t = *tomb;
        t.dead = 1;
        t.dead_reason = (char *)(reason ? reason : "reported dead");
        t.reported_by = reg->host;
        rv = swp_encode_alloc(&t, REG_MAX_VALUE, &buf, &len);
        if (rv == SW_OK)
            rv = reg_seal(reg, key, &buf, &len); /* only a key holder's tombstone opens */
    }
    swp_free(tomb);
    if (rv != SW_OK)
        return rv;
    rv = reg->be->put(reg->bs, key, buf, len, rev, NULL);
    free(buf);
    if (rv == SW_OK)
        swi_log(&reg->log, SW_LOG_INFO, "registry: reported %s dead (%s)", instance_id,
                reason ? reason : "reported dead");
    else if (rv == SW_EBUSY)
        reg_report_later(reg, instance_id, reason); /* our view was behind the store */
    return rv;
}

/* Counts a report's outcome: written, or refused (newer entry or gone). */
static sw_err
reg_report_counted(sw_registry *reg, sw_err rv)
{
    if (reg != NULL && (rv == SW_OK || rv == SW_EBUSY || rv == SW_ENOTFOUND))
        reg_count(reg, rv == SW_OK ? &reg->st.dead_reports_sent : &reg->st.dead_reports_refused);
    return rv;
}

sw_err
sw_registry_report_dead(sw_registry *reg, const char *instance_id, uint64_t revision,
                        const char *reason)
{
    return reg_report_counted(reg, reg_report(reg, instance_id, revision, -1, reason));
}

sw_err
sw_registry_report_silent(sw_registry *reg, const char *instance_id, sw_duration silent_ms,
                          const char *reason)
{
    if (silent_ms < 0)
        return SW_EINVAL;
    return reg_report_counted(reg, reg_report(reg, instance_id, 0, silent_ms, reason));
}

void
sw_instances_free(sw_instance *v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        free((void *)v[i].instance_id);
        free((void *)v[i].endpoint);
        free((void *)v[i].request_subject);
        free((void *)v[i].control_subject);
        free((void *)v[i].host);
    }
    free(v);
}

sw_err
sw_registry_list(sw_registry *reg, const char *endpoint, sw_instance **out, size_t *n)
{
    sw_instance *v;
    size_t k = 0;
    int64_t now = swi_now_ms();
    if (reg == NULL || out == NULL || n == NULL)
        return SW_EINVAL;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&reg->mu);
    v = calloc(reg->nview ? reg->nview : 1, sizeof(*v));
    if (v == NULL) {
        pthread_mutex_unlock(&reg->mu);
        return SW_ENOMEM;
    }
    for (size_t i = 0; i < reg->nview; i++) {
        reg_view *e = &reg->view[i];
        sw_instance *d = &v[k];
        if (!e->live || (endpoint != NULL && strcmp(e->info->endpoint, endpoint) != 0))
            continue;
        d->instance_id = swi_strdup(e->info->instance_id);
        d->endpoint = swi_strdup(e->info->endpoint);
        d->request_subject = swi_strdup(e->info->request_subject);
        d->control_subject = swi_strdup(e->info->control_subject);
        d->host = swi_strdup(e->info->host);
        d->pid = e->info->pid;
        d->started_unix_ms = (int64_t)e->info->started_unix_ms;
        d->lease_ms = e->info->lease_ms;
        d->revision = e->rev;
        d->age_ms = now - e->seen_ms;
        d->draining = e->info->draining;
        k++;
        if (!d->instance_id || !d->endpoint || !d->request_subject || !d->control_subject ||
            !d->host) {
            pthread_mutex_unlock(&reg->mu);
            sw_instances_free(v, k);
            return SW_ENOMEM;
        }
    }
    pthread_mutex_unlock(&reg->mu);
    *out = v;
    *n = k;
    return SW_OK;
}

sw_err
sw_registry_watch(sw_registry *reg, sw_registry_watch_fn fn, void *arg, int *id)
{
    int64_t now = swi_now_ms();
    if (reg == NULL || fn == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&reg->mu);
    if (reg->nw == reg->capw) {
        size_t ncap = reg->capw ? reg->capw * 2 : 4;
        reg_watcher *nv = realloc(reg->w, ncap * sizeof(*nv));
        if (nv == NULL) {
            pthread_mutex_unlock(&reg->mu);
            return SW_ENOMEM;
        }
        reg->w = nv;
        reg->capw = ncap;
    }
    reg->w[reg->nw].id = reg->next_id++;
    reg->w[reg->nw].fn = fn;
    reg->w[reg->nw].arg = arg;
    if (id != NULL)
        *id = reg->w[reg->nw].id;
    reg->nw++;
    for (size_t i = 0; i < reg->nview; i++)
        if (reg->view[i].live)
            reg_queue(reg, reg->w[reg->nw - 1].id, SW_REGISTRY_ADDED, reg->view[i].info,
                      reg->view[i].rev, now - reg->view[i].seen_ms);
    pthread_mutex_unlock(&reg->mu);
    return SW_OK;
}

void
sw_registry_unwatch(sw_registry *reg, int id)
{
    if (reg == NULL)
        return;
    pthread_mutex_lock(&reg->mu);
    for (size_t i = 0; i < reg->nw; i++)
        if (reg->w[i].id == id) {
            memmove(&reg->w[i], &reg->w[i + 1], (reg->nw - i - 1) * sizeof(reg->w[0]));
            reg->nw--;
            break;
        }
    while (reg->dispatching == id)
        pthread_cond_wait(&reg->cv, &reg->mu);
    pthread_mutex_unlock(&reg->mu);
}
