/* router/registry_lease.c -- the registry's ticker (common/sched.h):
 * keep-alive writes of our own entries, expiry of entries whose lease ran
 * out (held while the store itself does not answer), refused dead reports
 * written once their entry lapses, and watchers told of changes in order
 * with no lock held (reg_tell). Locks: registry.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "router/registry_int.h"

/* ---------------------------------------------------------------- keep-alive */

/* Seals a value for its key when the connection seals (*buf replaced). */
sw_err
swr_reg_seal(const sw_registry *reg, const char *key, uint8_t **buf, size_t *len)
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

sw_err
swr_reg_own_encode(sw_registry *reg, const reg_own *o, uint8_t **buf, size_t *len)
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
    m.incarnation = o->incarnation;
    m.generation = o->generation;
    {
        sw_err e = swp_encode_alloc(&m, REG_MAX_VALUE, buf, len);
        return e == SW_OK ? swr_reg_seal(reg, o->key, buf, len) : e;
    }
}

/* One keep-alive write for own entry `key` (reg->mu NOT held). */
void
swr_reg_refresh(sw_registry *reg, const char *key)
{
    reg_own copy, *o;
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t rev = 0;
    sw_err rv;
    int overwritten = 0;

    pthread_mutex_lock(&reg->wmu);
    pthread_mutex_lock(&reg->mu);
    o = swr_reg_own_find(reg, key);
    if (o == NULL) {
        pthread_mutex_unlock(&reg->mu);
        pthread_mutex_unlock(&reg->wmu);
        return;
    }
    copy = *o;
    pthread_mutex_unlock(&reg->mu);

    /* A failed encode (no memory) ends as a failed put does: tried again
     * after REG_TICK_MS * 4, and logged. It used to return with the entry
     * still due, and the tick called this again at once for as long as
     * malloc failed (a busy loop taking wmu and mu). */
    rv = swr_reg_own_encode(reg, &copy, &buf, &len);
    if (rv == SW_OK)
        rv = reg->be->put(reg->bs, copy.key, buf, len, copy.rev, &rev);
    if (rv == SW_EBUSY || rv == SW_ENOTFOUND) {
        /* Someone else wrote our key: register again, as a new generation
         * (a tombstone of the old one, put back later, is then stale). */
        overwritten = 1; /* logged below, after wmu */
        pthread_mutex_lock(&reg->mu);
        if ((o = swr_reg_own_find(reg, key)) != NULL)
            copy.generation = ++o->generation;
        pthread_mutex_unlock(&reg->mu);
        free(buf);
        buf = NULL;
        rv = swr_reg_own_encode(reg, &copy, &buf, &len);
        if (rv == SW_OK)
            rv = reg->be->put(reg->bs, copy.key, buf, len, 0, &rev);
    }
    free(buf);
    pthread_mutex_lock(&reg->mu);
    o = swr_reg_own_find(reg, key);
    if (rv == SW_OK) {
        reg->activity_ms = swi_now_ms();
        swr_reg_store_back(reg, reg->activity_ms);
    }
    if (o != NULL) {
        if (rv == SW_OK)
            o->rev = rev;
        o->next_refresh_ms = swi_now_ms() + (rv == SW_OK ? reg->refresh_ms : REG_TICK_MS * 4);
        /* (From sw_registry_set_draining, the ticker may rest past it.) */
        swr_reg_due(reg, o->next_refresh_ms);
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

int64_t
swr_reg_hold_max(int64_t lease)
{
    int64_t m = SW_REGISTRY_HOLD_MAX_LEASES * lease;
    return m < 30000 ? 30000 : m;
}

int64_t
swr_reg_view_lease(const sw_registry *reg, const reg_view *v)
{
    return v->info->lease_ms ? (int64_t)v->info->lease_ms : (int64_t)reg->lease_ms;
}

void
swr_reg_due(sw_registry *reg, int64_t at)
{
    if (reg->rest_until != 0 && at < reg->rest_until) {
        reg->rest_until = 0;
        swi_ticker_kick(&reg->ticker);
    }
}

/* How long the ticker may rest after a look that found nothing to do: until
 * the first keep-alive, lease or forgetting falls due, at most
 * REG_REST_MAX_MS; 0 (look again within REG_TICK_MS) while the store or
 * our connection is down or a lapsed entry is held, when the look depends
 * on more than the clock (mu held). An idle handle used to look 20 times a
 * second. */
static unsigned
reg_rest_ms(const sw_registry *reg, int64_t now, int64_t up)
{
    int64_t next = now + REG_REST_MAX_MS;
    if (reg->store_down || reg->held > 0 || up < 0)
        return 0;
    for (size_t i = 0; i < reg->nown; i++)
        if (reg->own[i].next_refresh_ms < next)
            next = reg->own[i].next_refresh_ms;
    for (size_t i = 0; i < reg->nview; i++) {
        const reg_view *v = &reg->view[i];
        int64_t lease = swr_reg_view_lease(reg, v), at;
        if (v->live) {
            /* As the look's tests: not before its lease from the last
             * sighting, its grace, and our connection's return. */
            at = v->seen_ms + lease;
            if (v->grace_ms > at)
                at = v->grace_ms;
            if (up + lease > at)
                at = up + lease;
        } else {
            at = v->seen_ms + REG_FORGET_LEASES * lease;
        }
        if (at < next)
            next = at;
    }
    return next - now > REG_TICK_MS ? (unsigned)(next - now) : 0;
}

/* Calls the watchers whose id is in [lo, hi), in the order of their ids,
 * with ev for info (mu held; dropped around each call). One removed
 * meanwhile is skipped (sw_registry_unwatch); nothing here allocates. */
static void
reg_deliver(sw_registry *reg, int lo, int hi, sw_registry_event ev, const swp_instance *info,
            uint64_t rev, int64_t age_ms)
{
    sw_instance inst;
    int last = lo - 1;
    inst.instance_id = info->instance_id;
    inst.endpoint = info->endpoint;
    inst.request_subject = info->request_subject;
    inst.control_subject = info->control_subject;
    inst.host = info->host;
    inst.pid = info->pid;
    inst.started_unix_ms = (int64_t)info->started_unix_ms;
    inst.lease_ms = info->lease_ms;
    inst.revision = rev;
    inst.age_ms = age_ms;
    inst.draining = info->draining;
    for (;;) {
        reg_watcher w = {0, NULL, NULL};
        for (size_t j = 0; j < reg->nw; j++)
            if (reg->w[j].id > last && reg->w[j].id < hi && (w.fn == NULL || reg->w[j].id < w.id))
                w = reg->w[j];
        if (w.fn == NULL)
            return;
        last = w.id;
        reg->dispatching = w.id;
        pthread_mutex_unlock(&reg->mu);
        w.fn(w.arg, ev, &inst);
        pthread_mutex_lock(&reg->mu);
        reg->dispatching = 0;
        pthread_cond_broadcast(&reg->cv);
    }
}

/* Tells the watchers one step of a changed entry (mu held): what they
 * were told (`told`) is brought one step towards what the entry is --
 * REMOVED if it stopped being live since (even if live again), then ADDED,
 * or UPDATED when only its draining flag differs. The entry is clean once
 * they match; a deleted one (gone) is then dropped. The watchers there are
 * now are called, none added later: their snapshot has the step. */
static void
reg_tell(sw_registry *reg, int64_t now)
{
    reg_view *v = NULL;
    swp_instance *want, *what = NULL, *old = NULL;
    int ev;
    uint64_t rev = 0;
    int64_t age = 0;
    int hi = reg->next_id;
    char key[REG_KEY_MAX];

    if (reg->nw == 0) {                       /* nobody to tell: every entry settles at once */
        for (size_t i = reg->nview; i-- > 0;) /* (backwards: a settled entry may be dropped) */
            if (reg->view[i].dirty)
                swr_reg_settle(reg, &reg->view[i]);
        return;
    }
    for (size_t i = 0; i < reg->nview; i++) /* the one that changed first */
        if (reg->view[i].dirty && (v == NULL || reg->view[i].dirty < v->dirty))
            v = &reg->view[i];
    if (v == NULL) { /* (not reached: ndirty counts the dirty entries) */
        reg->ndirty = 0;
        return;
    }
    want = v->live ? v->info : NULL;
    ev = swr_reg_step(v, v->told, v->lapsed);
    if (ev == SW_REGISTRY_REMOVED) {
        what = v->told;
        rev = v->told_rev;
        age = now - v->seen_ms;
        v->told = NULL;
        v->lapsed = 0;
    } else {
        if (ev != 0) { /* ADDED, UPDATED */
            what = want;
            rev = v->rev;
        }
        old = v->told; /* (want itself, or one it replaced with nothing to tell) */
        v->told = want;
        v->told_rev = v->rev;
    }
    reg->delivering = what; /* kept, whatever the view does during the calls */
    snprintf(key, sizeof(key), "%s", v->key);
    if (v->told == want && !v->lapsed) {
        v->dirty = 0;
        reg->ndirty--;
        if (v->gone)
            swr_reg_view_remove(reg, v); /* (told is NULL: not live) */
        else
            swr_reg_info_drop(reg, v, old);
    } else {
        swr_reg_info_drop(reg, v, old);
    }
    if (what == NULL)
        return;
    reg_deliver(reg, 1, hi, ev, what, rev, age);
    reg->delivering = NULL;
    swr_reg_info_drop(reg, swr_reg_view_find_key(reg, key), what);
}

/* One tick on the registry's ticker (every REG_TICK_MS, or after a rest,
 * and at once when kicked): does everything that is due, one piece at a
 * time, then returns. */
void
swr_reg_tick(void *arg, int64_t now0)
{
    sw_registry *reg = arg;
    unsigned rest = 0;
    (void)now0;
    __atomic_fetch_add(&reg->ticks, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&reg->mu);
    reg->rest_until = 0; /* looking now: nothing to kick for */
    while (!reg->stopping) {
        int64_t now = swi_now_ms();
        char due[REG_KEY_MAX];
        char expired[SW_MAX_TOKEN + 1];
        unsigned held;
        int need_ping;
        int64_t up;
        char late_reason[96];

        /* Log lines the backend's callback queued (swr_reg_note). */
        if (reg->nh != NULL || reg->notes_dropped > 0) {
            reg_note *n = reg->nh;
            unsigned dropped = 0;
            if (n != NULL) {
                reg->nh = n->next;
                if (reg->nh == NULL)
                    reg->nt = NULL;
                reg->nnotes--;
            } else {
                dropped = reg->notes_dropped;
                reg->notes_dropped = 0;
            }
            pthread_mutex_unlock(&reg->mu);
            if (n != NULL)
                swi_log(&reg->log, n->level, "%s", n->msg);
            else
                swi_log(&reg->log, SW_LOG_WARN, "registry: %u log line(s) dropped", dropped);
            free(n);
            pthread_mutex_lock(&reg->mu);
            continue;
        }

        /* Watchers' news, one at a time, no lock held during callbacks: a
         * new watcher's snapshot first (its ADDED come before any change),
         * then every change not yet told. */
        if (reg->eh != NULL) {
            reg_event *e = reg->eh;
            reg->eh = e->next;
            if (reg->eh == NULL)
                reg->et = NULL;
            reg_deliver(reg, e->lo, e->hi, e->ev, e->info, e->rev, e->age_ms);
            swp_free(e->info);
            free(e);
            continue;
        }
        if (reg->ndirty > 0) {
            reg_tell(reg, now);
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
            int64_t lease = swr_reg_view_lease(reg, v);
            if (v->live && (now < v->grace_ms || up < 0 || now - up < lease))
                continue;
            if (v->live && now - v->seen_ms >= lease && reg_store_quiet(reg, now, lease) &&
                now - v->seen_ms < swr_reg_hold_max(lease)) {
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
                snprintf(expired, sizeof(expired), "%s", v->info->instance_id);
                if (v->report_pending) {
                    v->report_pending = 0;
                    snprintf(late_reason, sizeof(late_reason), "%s", v->report_reason);
                }
                swr_reg_view_lapse(reg, v);
            } else if (!v->live && v->told == NULL &&
                       now - v->seen_ms >= REG_FORGET_LEASES * lease) {
                /* The store's max age drops such entries without a delete
                 * event: forget them too, or the view only grows; their
                 * revision is kept as a delete's, while the store may
                 * still hold the value. */
                swr_reg_view_forget(reg, v, now);
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
                (void)reg->be->list(reg->bs, swr_reg_on_entry, reg);
            }
            pthread_mutex_lock(&reg->mu);
            reg->store_down = prv != SW_OK;
            if (prv != SW_OK)
                reg->st.store_pings_failed++;
            if (was_down && !reg->store_down) {
                reg->store_down = 1;
                swr_reg_store_back(reg, now);
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
                (void)swr_reg_report(reg, expired, 0, -1, late_reason);
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
            swr_reg_refresh(reg, due);
            pthread_mutex_lock(&reg->mu);
            continue;
        }
        /* Nothing due: rest until something is, or a kick. */
        rest = reg_rest_ms(reg, now, up);
        reg->rest_until = rest ? now + rest : 0;
        break;
    }
    pthread_mutex_unlock(&reg->mu);
    /* A kick between the unlock and this still cuts the rest short. */
    swi_ticker_rest(&reg->ticker, rest);
}
