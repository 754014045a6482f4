/* router/registry_view.c -- the registry's view of the store: every entry
 * the backend's list and watch report (swr_reg_on_entry, on a backend
 * thread or on a writer's thread), judged by revision, opened when sealed,
 * checked against its key; a removal of one of our own live entries is
 * answered by registering again; a change is marked on its entry here
 * (swr_reg_dirty) and told to the watchers by the ticker
 * (registry_lease.c). Locks: registry.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/registry_int.h"

swp_instance *
swr_reg_info_copy(const swp_instance *in)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    swp_instance *out = NULL;
    if (swp_encode_alloc(in, REG_MAX_VALUE, &buf, &len) == SW_OK)
        (void)swp_decode_instance(buf, len, REG_MAX_VALUE, &out);
    free(buf);
    return out;
}

void
swr_reg_dirty(sw_registry *reg, reg_view *v)
{
    if (!v->dirty) {
        v->dirty = ++reg->dirty_seq; /* told in the order they changed */
        reg->ndirty++;
    }
    swi_ticker_kick(&reg->ticker);
}

void
swr_reg_info_drop(sw_registry *reg, const reg_view *v, swp_instance *p)
{
    if (p == NULL || p == reg->delivering || (v != NULL && (p == v->info || p == v->told)))
        return;
    swp_free(p);
}

int
swr_reg_step(const reg_view *v, const swp_instance *told, int lapsed)
{
    const swp_instance *want = v->live ? v->info : NULL;
    if (told != NULL && (want == NULL || lapsed))
        return SW_REGISTRY_REMOVED;
    if (told == NULL && want != NULL)
        return SW_REGISTRY_ADDED;
    if (told != NULL && want != NULL && told->draining != want->draining)
        return SW_REGISTRY_UPDATED;
    return 0;
}

void
swr_reg_settle(sw_registry *reg, reg_view *v)
{
    swp_instance *old = v->told, *info = v->info;
    v->told = v->live ? v->info : NULL;
    v->told_rev = v->rev;
    v->lapsed = 0;
    if (v->dirty) {
        v->dirty = 0;
        reg->ndirty--;
    }
    if (v->gone && v->told == NULL) {
        swr_reg_view_remove(reg, v); /* (drops info) */
        if (old != info)
            swr_reg_info_drop(reg, NULL, old);
    } else {
        swr_reg_info_drop(reg, v, old);
    }
}

void
swr_reg_view_lapse(sw_registry *reg, reg_view *v)
{
    if (!v->live)
        return;
    v->live = 0;
    if (v->told != NULL)
        v->lapsed = 1; /* (never told: nothing to take back) */
    swr_reg_dirty(reg, v);
}

reg_view *
swr_reg_view_find_key(sw_registry *reg, const char *key)
{
    for (size_t i = 0; i < reg->nview; i++)
        if (strcmp(reg->view[i].key, key) == 0)
            return &reg->view[i];
    return NULL;
}

reg_view *
swr_reg_view_find_instance(sw_registry *reg, const char *instance)
{
    for (size_t i = 0; i < reg->nview; i++)
        if (!reg->view[i].gone && strcmp(reg->view[i].info->instance_id, instance) == 0)
            return &reg->view[i];
    return NULL;
}

reg_own *
swr_reg_own_find(sw_registry *reg, const char *key)
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
    reg_view *v = swr_reg_view_find_key(reg, key);
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

/* How long a delete's revision is remembered: longer than a list may take
 * to deliver (the KV backend bounds one at 30 s); 20 of the handle's own
 * leases when that is longer. */
static int64_t
tomb_keep_ms(const sw_registry *reg)
{
    int64_t keep = REG_FORGET_LEASES * (int64_t)reg->lease_ms;
    return keep < 60000 ? 60000 : keep;
}

/* The revision key was deleted at, if that is remembered; 0 if not (mu
 * held). */
static uint64_t
tomb_rev(const sw_registry *reg, const char *key, int64_t now)
{
    for (size_t i = 0; i < reg->ntomb; i++)
        if (strcmp(reg->tomb[i].key, key) == 0)
            return now - reg->tomb[i].at_ms < tomb_keep_ms(reg) ? reg->tomb[i].rev : 0;
    return 0;
}

/* Remembers that key was deleted at rev (mu held). Drops what is past
 * keeping and the key's older delete first; when REG_TOMBS_MAX are kept
 * (or there is no memory for more), the delete with the lowest revision
 * gives way, the one being noted if it is that one: a watch made again
 * replays every delete marker still in the store, and old ones must not
 * push out recent ones. */
static void
tomb_note(sw_registry *reg, const char *key, uint64_t rev, int64_t now)
{
    reg_tomb *t = NULL;
    for (size_t i = 0; i < reg->ntomb;) {
        if (now - reg->tomb[i].at_ms >= tomb_keep_ms(reg) || strcmp(reg->tomb[i].key, key) == 0)
            reg->tomb[i] = reg->tomb[--reg->ntomb];
        else
            i++;
    }
    if (reg->ntomb == reg->captomb && reg->captomb < REG_TOMBS_MAX) {
        size_t ncap = reg->captomb ? 2 * reg->captomb : 8;
        reg_tomb *nt = realloc(reg->tomb, ncap * sizeof(*nt));
        if (nt != NULL) {
            reg->tomb = nt;
            reg->captomb = ncap;
        }
    }
    if (reg->ntomb < reg->captomb) {
        t = &reg->tomb[reg->ntomb++];
    } else if (reg->ntomb > 0) {
        t = &reg->tomb[0];
        for (size_t i = 1; i < reg->ntomb; i++)
            if (reg->tomb[i].rev < t->rev)
                t = &reg->tomb[i];
        if (rev < t->rev)
            return; /* older than every one kept */
    } else {
        return; /* no memory for the first one */
    }
    snprintf(t->key, sizeof(t->key), "%s", key);
    t->rev = rev;
    t->at_ms = now;
}

void
swr_reg_view_remove(sw_registry *reg, reg_view *v)
{
    swp_instance *info = v->info;
    if (v->told != NULL) {
        v->gone = 1; /* the ticker removes it once REMOVED is told */
        swr_reg_dirty(reg, v);
        return;
    }
    if (v->dirty)
        reg->ndirty--;
    *v = reg->view[--reg->nview];
    swr_reg_info_drop(reg, NULL, info);
}

void
swr_reg_view_forget(sw_registry *reg, reg_view *v, int64_t now)
{
    tomb_note(reg, v->key, v->rev, now);
    swr_reg_view_remove(reg, v);
}

/* The store works (again) (mu held). If it was down, every live entry
 * gets a lease from now to be refreshed in, as its worker's keep-alives go
 * through again: none is dropped in the moment between the store coming
 * back and the first keep-alive. (A grace, not a sighting: seen_ms, which
 * dead reports are judged by, stays the last refresh really seen.) */
void
swr_reg_store_back(sw_registry *reg, int64_t now)
{
    if (!reg->store_down)
        return;
    reg->store_down = 0;
    reg->log_back = 1; /* logged by the ticker, without the lock */
    swr_reg_due(reg, now);
    for (size_t i = 0; i < reg->nview; i++)
        if (reg->view[i].live)
            reg->view[i].grace_ms = now + swr_reg_view_lease(reg, &reg->view[i]);
}

void
swr_reg_note(sw_registry *reg, sw_log_level level, const char *fmt, ...)
{
    char line[512];
    reg_note *n = NULL;
    va_list ap;
    int len;
    if (reg->log.fn == NULL)
        return;
    va_start(ap, fmt);
    len = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (len < 0)
        return;
    if ((size_t)len >= sizeof(line))
        len = (int)sizeof(line) - 1;
    pthread_mutex_lock(&reg->mu);
    if (reg->nnotes < REG_NOTES_MAX && (n = malloc(sizeof(*n) + (size_t)len + 1)) != NULL) {
        n->next = NULL;
        n->level = level;
        memcpy(n->msg, line, (size_t)len + 1);
        if (reg->nt != NULL)
            reg->nt->next = n;
        else
            reg->nh = n;
        reg->nt = n;
        reg->nnotes++;
    } else {
        reg->notes_dropped++;
    }
    swi_ticker_kick(&reg->ticker);
    pthread_mutex_unlock(&reg->mu);
}

/* ---------------------------------------------------------------- backend events */

/* Our own live entry was written over in the store (a tombstone, a
 * delete): write it again at once, unguarded, as a new generation, so that
 * a tombstone of the old one is stale everywhere (mu held). */
static void
own_register_again(sw_registry *reg, reg_own *own, int64_t now)
{
    own->rev = 0;
    own->generation++;
    own->next_refresh_ms = now;
    swi_ticker_kick(&reg->ticker);
}

void
swr_reg_on_entry(void *arg, const sw_registry_entry *e, int deleted)
{
    sw_registry *reg = arg;
    swp_instance *info = NULL;
    reg_view *v;
    reg_own *own;
    uint64_t tomb;
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
                swr_reg_note(reg, SW_LOG_WARN,
                             "registry: entry %s does not open with %s: ignored (auth_failed)",
                             e->key, reg->sealer ? "the cluster key" : "no key (it is sealed)");
                swr_reg_count(reg, &reg->st.entries_ignored);
                return;
            }
            val = opened;
            vlen = n;
        }
        rv = swp_decode_instance(val, vlen, REG_MAX_VALUE, &info);
        free(opened);
        if (rv != SW_OK) {
            swr_reg_note(reg, SW_LOG_WARN, "registry: entry %s does not decode (%s): ignored",
                         e->key, sw_err_name(rv));
            swr_reg_count(reg, &reg->st.entries_ignored);
            return;
        }
        {
            /* An entry lives under <endpoint>.<instance> and nowhere else:
             * one under another key (stale or forged) naming a live
             * instance must not stand for it (issue 11 #11). */
            char want[REG_KEY_MAX];
            int n = snprintf(want, sizeof(want), "%s.%s", info->endpoint, info->instance_id);
            if (n < 0 || (size_t)n >= sizeof(want) || strcmp(want, e->key) != 0) {
                swr_reg_note(reg, SW_LOG_WARN,
                             "registry: entry %s names %s.%s: not its own key, ignored", e->key,
                             info->endpoint, info->instance_id);
                swp_free(info);
                swr_reg_count(reg, &reg->st.entries_ignored);
                return;
            }
        }
    }
    pthread_mutex_lock(&reg->mu);
    v = swr_reg_view_find_key(reg, e->key);
    own = swr_reg_own_find(reg, e->key);
    tomb = v == NULL ? tomb_rev(reg, e->key, now) : 0;
    if ((v != NULL && e->revision <= v->rev) || (tomb != 0 && e->revision <= tomb)) {
        /* An older revision than we know (list/watch overlap), or one from
         * before the key was deleted (a list's value delivered after the
         * watch's delete). */
        pthread_mutex_unlock(&reg->mu);
        swp_free(info);
        return;
    }
    reg->activity_ms = now; /* the store was written: it works */
    swr_reg_store_back(reg, now);
    if (!deleted && info->dead && info->incarnation != 0 && v != NULL && v->live &&
        (v->info->incarnation == info->incarnation
             ? info->generation < v->info->generation
             : info->started_unix_ms < v->info->started_unix_ms)) {
        /* A tombstone of an EARLIER registration than the live entry we
         * hold (an older generation of it, or an older registration's, by
         * the worker's own start times): one recorded and put back (review
         * question 5). It kills nothing here; the worker, which sees it over
         * its own key, registers again at once. A tombstone of a later
         * registration (one our view missed, say after a reconnect) counts. */
        int mine = own != NULL;
        char inst[SW_MAX_TOKEN + 1];
        snprintf(inst, sizeof(inst), "%s", v->info->instance_id);
        reg->st.entries_ignored++; /* mu held */
        if (own != NULL)
            own_register_again(reg, own, now);
        pthread_mutex_unlock(&reg->mu);
        swp_free(info);
        swr_reg_note(reg, SW_LOG_WARN,
                     "registry: a tombstone of an earlier registration of %s was put back: "
                     "ignored%s",
                     inst, mine ? "; registering again" : "");
        return;
    }
    if (deleted || info->dead) {
        if (!deleted)
            reg->st.dead_reports_received++; /* mu held */
        if (v != NULL)
            swr_reg_view_lapse(reg, v);
        if (deleted) {
            if (v != NULL) {
                /* Kept (gone) while its REMOVED is owed: older values of
                 * the key are refused by this revision meanwhile. */
                v->rev = e->revision;
                swr_reg_view_remove(reg, v);
            }
            tomb_note(reg, e->key, e->revision, now);
        } else if ((v = view_get_or_add(reg, e->key)) != NULL) {
            swp_instance *old = v->info;
            v->info = info;
            info = NULL;
            swr_reg_info_drop(reg, v, old); /* kept if the watchers' told one */
            v->rev = e->revision;
            v->seen_ms = now;
            v->live = 0;
            v->gone = 0;
            swr_reg_due(reg, now + REG_FORGET_LEASES * swr_reg_view_lease(reg, v));
        }
        if (own != NULL) {
            /* We are alive: whoever removed us was wrong. */
            snprintf(wronged, sizeof(wronged), "%s", own->instance);
            own_register_again(reg, own, now);
        }
        pthread_mutex_unlock(&reg->mu);
        swp_free(info);
        if (wronged[0] != '\0')
            swr_reg_note(reg, SW_LOG_WARN,
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
        swp_instance *old = v->info;
        /* Judged only by when this process saw the revision, on its own
         * monotonic clock: no other clock (the store's created_unix_ms, the
         * worker's refreshed_unix_ms) is compared with ours, so a router
         * whose clock disagrees still sees live workers. A first sight
         * counts as seen now: an entry abandoned before this process
         * started is live for at most one lease. */
        v->info = info;
        info = NULL;
        v->rev = e->revision;
        v->seen_ms = now;
        v->live = 1;
        v->gone = 0;
        /* Its lease may be shorter than the ticker's rest (a new entry, or
         * one whose worker now announces a shorter lease). */
        swr_reg_due(reg, now + swr_reg_view_lease(reg, v));
        if (was_live && !v->dirty && v->told == old && old->draining == v->info->draining) {
            /* A refresh, nothing to tell: the watchers' info is this one. */
            v->told = v->info;
            v->told_rev = v->rev;
        } else {
            swr_reg_dirty(reg, v); /* ADDED, UPDATED (draining), or owed already */
        }
        swr_reg_info_drop(reg, v, old);
    }
    pthread_mutex_unlock(&reg->mu);
}
