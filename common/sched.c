/* common/sched.c -- see sched.h: the ticker thread, due-time snapshots, and
 * the peer-liveness table. The ticker's lock (t->mu) is held only to wait
 * and to read or set stop, kicked and rest_ms, never while fn runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "common/sched.h"

/* ---------------------------------------------------------------- ticker */

static void *
swi_ticker_main(void *arg)
{
    swi_ticker *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        int64_t until = swi_now_ms() + (t->rest_ms ? t->rest_ms : t->period_ms);
        t->rest_ms = 0;
        while (!t->stop && !t->kicked && swi_now_ms() < until)
            swi_cond_wait_until(&t->cv, &t->mu, until);
        if (t->stop)
            break;
        t->kicked = 0;
        pthread_mutex_unlock(&t->mu);
        t->fn(t->arg, swi_now_ms());
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int
swi_ticker_start(swi_ticker *t, unsigned period_ms, void (*fn)(void *arg, int64_t now), void *arg)
{
    memset(t, 0, sizeof(*t));
    t->period_ms = period_ms ? period_ms : 1;
    t->fn = fn;
    t->arg = arg;
    pthread_mutex_init(&t->mu, NULL);
    swi_cond_init(&t->cv);
    if (pthread_create(&t->th, NULL, swi_ticker_main, t) != 0) {
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
        return -1;
    }
    t->inited = 1;
    __atomic_store_n(&t->started, 1, __ATOMIC_RELEASE);
    return 0;
}

void
swi_ticker_kick(swi_ticker *t)
{
    if (!__atomic_load_n(&t->started, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&t->mu);
    if (!t->stop) {
        t->kicked = 1;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
}

void
swi_ticker_rest(swi_ticker *t, unsigned ms)
{
    if (ms == 0)
        swi_ticker_resting(t, 0);
    pthread_mutex_lock(&t->mu);
    t->rest_ms = ms;
    pthread_mutex_unlock(&t->mu);
}

void
swi_ticker_stop(swi_ticker *t)
{
    if (!__atomic_load_n(&t->started, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->th, NULL);
    /* mu and cv stay: a kick that saw `started` a moment ago takes mu
     * next, finds `stop` and does nothing (swi_ticker_fini frees them).
     * They used to be destroyed here, under such a kick (a probe reply
     * waking a router being destroyed: TSan). */
    __atomic_store_n(&t->started, 0, __ATOMIC_RELEASE);
}

void
swi_ticker_fini(swi_ticker *t)
{
    swi_ticker_stop(t);
    if (t->inited) {
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
        t->inited = 0;
    }
}

/* ---------------------------------------------------------------- due times */

static int
swi_take_all(void *val, void *arg)
{
    void (*ref)(void *val) = *(void (**)(void *))arg;
    ref(val);
    return 1;
}

void
swi_idmap_snapshot_all(const swi_idmap *m, swi_ptrvec *vec, void (*ref)(void *val))
{
    swi_idmap_snapshot(m, vec, swi_take_all, &ref);
}

/* ---------------------------------------------------------------- due tables */

void
swi_duetab_init(swi_duetab *t)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->mu, NULL);
}

void
swi_duetab_fini(swi_duetab *t)
{
    for (size_t i = 0; i < t->nchunks; i++)
        free(t->chunks[i]);
    free(t->chunks);
    free(t->free);
    pthread_mutex_destroy(&t->mu);
    memset(t, 0, sizeof(*t));
}

/* The cell of index i and its chunk. */
#define DUE_CHUNK(t, i) ((t)->chunks[(i) / SWI_DUETAB_CHUNK])
#define DUE_SLOT(i) ((i) % SWI_DUETAB_CHUNK)

/* Adds one chunk, its cells to the free list (highest first, so the lowest
 * is given out first). t->mu held. 0, or -1 no memory. */
static int
duetab_grow(swi_duetab *t)
{
    swi_duechunk *c;
    size_t base = t->nchunks * SWI_DUETAB_CHUNK;
    if (base + SWI_DUETAB_CHUNK > UINT32_MAX)
        return -1;
    if (t->nchunks == t->chunks_cap) {
        size_t nc = t->chunks_cap ? 2 * t->chunks_cap : 4;
        swi_duechunk **nv = realloc(t->chunks, nc * sizeof(*nv));
        if (nv == NULL)
            return -1;
        t->chunks = nv;
        t->chunks_cap = nc;
    }
    if (base + SWI_DUETAB_CHUNK > t->free_cap) { /* room for every cell, so release never fails */
        size_t nc = t->free_cap ? 2 * t->free_cap : SWI_DUETAB_CHUNK;
        uint32_t *nf;
        while (nc < base + SWI_DUETAB_CHUNK)
            nc *= 2;
        if ((nf = realloc(t->free, nc * sizeof(*nf))) == NULL)
            return -1;
        t->free = nf;
        t->free_cap = nc;
    }
    /* aligned to the cells' size, so that a cell finds its chunk's mark
     * (aligned_alloc: the size a multiple of it, checked in sched.h) */
    if ((c = aligned_alloc(sizeof(c->due), sizeof(*c))) == NULL)
        return -1;
    for (size_t i = 0; i < SWI_DUETAB_CHUNK; i++) {
        c->due[i] = INT64_MAX;
        c->val[i] = NULL;
        if (i < SWI_DUETAB_CHUNK - 1) /* cell 0, the mark, is never given out */
            t->free[t->nfree++] = (uint32_t)(base + SWI_DUETAB_CHUNK - 1 - i);
    }
    t->chunks[t->nchunks++] = c;
    return 0;
}

int64_t *
swi_duetab_add(swi_duetab *t, void *val, int64_t due)
{
    int64_t *cell = NULL;
    pthread_mutex_lock(&t->mu);
    if (t->nfree > 0 || duetab_grow(t) == 0) {
        uint32_t i = t->free[--t->nfree];
        swi_duechunk *c = DUE_CHUNK(t, i);
        c->val[DUE_SLOT(i)] = val;
        cell = &c->due[DUE_SLOT(i)];
        swi_due_set(cell, due);
        if (val != NULL)
            t->attached++;
    }
    pthread_mutex_unlock(&t->mu);
    return cell;
}

/* The index of a cell this table gave out (t->mu held), or -1. */
static long
duetab_index(const swi_duetab *t, const int64_t *cell)
{
    for (size_t k = 0; k < t->nchunks; k++) {
        const int64_t *d = t->chunks[k]->due;
        if (cell > d && cell < d + SWI_DUETAB_CHUNK) /* (d[0], the mark, is no object's) */
            return (long)(k * SWI_DUETAB_CHUNK + (size_t)(cell - d));
    }
    return -1;
}

/* Sets the object of a cell (NULL: detached), and with release also gives
 * the cell back. One function for the three changes, under t->mu. */
static void
duetab_set(swi_duetab *t, int64_t *cell, void *val, int release)
{
    long i;
    if (cell == NULL)
        return;
    pthread_mutex_lock(&t->mu);
    if ((i = duetab_index(t, cell)) >= 0) {
        void **slot = &DUE_CHUNK(t, i)->val[DUE_SLOT(i)];
        t->attached += (val != NULL) - (*slot != NULL);
        *slot = val;
        if (release) {
            swi_due_set(cell, INT64_MAX);
            t->free[t->nfree++] = (uint32_t)i; /* room: free_cap covers every cell */
        } else if (val != NULL) {
            /* A scan leaves detached cells out of the mark: the attached
             * one's time goes in now (t->mu keeps scans out meanwhile; a
             * later write lowers the mark itself). */
            (void)swi_due_lower(swi_due_mark(cell), __atomic_load_n(cell, __ATOMIC_SEQ_CST));
        }
    }
    pthread_mutex_unlock(&t->mu);
}

void
swi_duetab_attach(swi_duetab *t, int64_t *cell, void *val)
{
    if (val != NULL)
        duetab_set(t, cell, val, 0);
}

size_t
swi_duetab_attached(swi_duetab *t)
{
    size_t n;
    pthread_mutex_lock(&t->mu);
    n = t->attached;
    pthread_mutex_unlock(&t->mu);
    return n;
}

void
swi_duetab_detach(swi_duetab *t, int64_t *cell)
{
    duetab_set(t, cell, NULL, 0);
}

void
swi_duetab_release(swi_duetab *t, int64_t *cell)
{
    duetab_set(t, cell, NULL, 1);
}

void
swi_duetab_snapshot(swi_duetab *t, swi_ptrvec *vec, int64_t by, void (*ref)(void *val))
{
    pthread_mutex_lock(&t->mu);
    swi_ptrvec_reserve(vec, t->attached);
    for (size_t k = 0; k < t->nchunks; k++) {
        swi_duechunk *c = t->chunks[k];
        int64_t low = INT64_MAX;
        size_t j;
        if (!swi_due_by(&c->due[0], by))
            continue; /* nothing in the chunk is due yet */
        /* Reset the mark, then read the cells: a write meanwhile is either
         * read here or lowers the reset mark itself (swi_due_set,
         * swi_due_sooner). The mark left is the earliest attached cell's
         * (attaching lowers it: duetab_set). */
        (void)__atomic_exchange_n(&c->due[0], INT64_MAX, __ATOMIC_SEQ_CST);
        for (j = 1; j < SWI_DUETAB_CHUNK && vec->n < vec->cap; j++) {
            int64_t d = __atomic_load_n(&c->due[j], __ATOMIC_SEQ_CST);
            if (c->val[j] == NULL)
                continue;
            if (d < low) /* taken or not: one taken stays due until its owner moves it */
                low = d;
            if (d > by)
                continue;
            __builtin_prefetch(c->val[j], 1); /* the objects are cold: overlap the misses */
            vec->v[vec->n++] = c->val[j];
        }
        if (j < SWI_DUETAB_CHUNK) /* vec full: the cells not read are due at the next scan */
            low = INT64_MIN;
        (void)swi_due_lower(&c->due[0], low); /* (a write meanwhile may have lowered it further) */
    }
    for (size_t i = 0; i < vec->n; i++)
        ref(vec->v[i]);
    pthread_mutex_unlock(&t->mu);
}

/* ---------------------------------------------------------------- peers */

void
swi_peers_init(swi_peers *p, unsigned interval_ms, unsigned timeout_ms, unsigned misses)
{
    memset(p, 0, sizeof(*p));
    p->interval_ms = interval_ms;
    p->timeout_ms = timeout_ms;
    p->misses = misses ? misses : 1;
    p->settle_ms = SWI_PEERS_SETTLE_MS;
    p->nr_grace_ms = SWI_PEERS_NR_GRACE_MS;
    swi_random(&p->probe_seq, sizeof(p->probe_seq));
    p->probe_seq &= (UINT64_C(1) << 62) - 1; /* never wraps to 0 */
}

uint64_t
swi_peers_probe_id(swi_peers *p, const char *id)
{
    swi_peer *e = swi_peers_find(p, id);
    return e != NULL ? e->probe_id : 0;
}

int
swi_peers_is_current(swi_peers *p, const char *id, uint64_t probe_id)
{
    swi_peer *e = swi_peers_find(p, id);
    return e != NULL && probe_id != 0 && e->probe_id == probe_id;
}

void
swi_peers_beats_learn(swi_peers *p, const char *id, uint64_t incarnation, uint64_t counter)
{
    swi_peer *e = swi_peers_find(p, id);
    uint64_t floor = counter ? counter - 1 : 0;
    if (e == NULL)
        return;
    if (incarnation == 0) { /* a worker from before the counters */
        e->beat_legacy = 1;
        return;
    }
    e->beat_legacy = 0;
    if (e->beat_inc != incarnation) { /* first answer, or the process restarted */
        e->beat_inc = incarnation;
        e->beat_last = floor;
    } else if (floor > e->beat_last) {
        e->beat_last = floor;
    }
}

int
swi_peers_beats_take(swi_peers *p, const char *id, uint64_t incarnation, uint64_t counter)
{
    swi_peer *e = swi_peers_find(p, id);
    if (e != NULL && e->beat_legacy && incarnation == 0)
        return 1;
    if (e == NULL || incarnation == 0)
        return 0; /* (none named by a worker whose answer named one: not its process's) */
    if (incarnation != e->beat_inc) {
        e->probe_soon = 1; /* not learned yet: ask now (one probe out at a time) */
        return 0;
    }
    if (e->beat_inc == 0 || counter <= e->beat_last)
        return 0;
    e->beat_last = counter;
    return 1;
}

void
swi_peers_fini(swi_peers *p)
{
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

swi_peer *
swi_peers_find(swi_peers *p, const char *id)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->v[i].id, id) == 0)
            return &p->v[i];
    return NULL;
}

int
swi_peers_use(swi_peers *p, const char *id, int64_t now)
{
    swi_peer *e = swi_peers_find(p, id);
    if (e == NULL) {
        if (p->n == p->cap) {
            size_t ncap = p->cap ? p->cap * 2 : 8;
            swi_peer *nv = realloc(p->v, ncap * sizeof(*nv));
            if (nv == NULL)
                return -1;
            p->v = nv;
            p->cap = ncap;
        }
        e = &p->v[p->n++];
        memset(e, 0, sizeof(*e));
        swi_strlcpy(e->id, id, sizeof(e->id));
        e->gen = ++p->gen_seq;
        e->last_ok_ms = now;
        e->sent_ms = now; /* the first probe after one interval */
    }
    e->users++;
    return 0;
}

void
swi_peers_release(swi_peers *p, const char *id)
{
    swi_peer *e = swi_peers_find(p, id);
    if (e != NULL && --e->users == 0)
        *e = p->v[--p->n];
}

void
swi_peers_release_all(swi_peers *p, const char *id)
{
    swi_peer *e = swi_peers_find(p, id);
    if (e != NULL)
        *e = p->v[--p->n];
}

void
swi_peers_suspect(swi_peers *p, const char *id)
{
    swi_peer *e = swi_peers_find(p, id);
    if (e == NULL)
        return;
    e->suspect = 1; /* swi_peers_round probes it at once */
}

int
swi_peers_probe_out(swi_peers *p, const char *id)
{
    const swi_peer *e = swi_peers_find(p, id);
    return e != NULL && e->outstanding;
}

int
swi_peers_deciding(swi_peers *p, const char *id)
{
    const swi_peer *e = swi_peers_find(p, id);
    return e != NULL && (e->suspect || e->nr_pending);
}

void
swi_peers_probe_soon(swi_peers *p, const char *id)
{
    swi_peer *e = swi_peers_find(p, id);
    if (e != NULL)
        e->probe_soon = 1;
}

/* 1 if this side's connection was up, and settled, for the whole time
 * since `since`. */
static int
swi_up_throughout(const swi_peers *p, int64_t up_since_ms, int64_t since)
{
    return up_since_ms >= 0 && up_since_ms + p->settle_ms <= since;
}

/* Since when the peer has left this side's questions unanswered: the
 * first probe of the run of misses, or an earlier bounced one of the same
 * run; never before its last sign of life (a bounce of an earlier episode
 * may still be on record). */
static int64_t
peer_unanswered_from(const swi_peer *e)
{
    int64_t from = e->misses > 0 ? e->miss_from_ms : INT64_MAX;
    if (e->nr_pending && e->nr_first_ms < from)
        from = e->nr_first_ms;
    if (from == INT64_MAX || from < e->last_ok_ms)
        from = e->last_ok_ms;
    return from;
}

size_t
swi_peers_round(swi_peers *p, int64_t now, int64_t up_since_ms,
                int (*alive)(void *arg, const char *id, int64_t since), void *arg,
                swi_peer_id *send, size_t max_send, swi_peer_lost *lost, size_t max_lost,
                size_t *nlost)
{
    size_t nsend = 0;
    *nlost = 0;
    for (size_t i = 0; i < p->n; i++) {
        swi_peer *e = &p->v[i];
        if (e->outstanding && now - e->sent_ms >= (int64_t)p->timeout_ms) {
            e->outstanding = 0;
            if (!swi_up_throughout(p, up_since_ms, e->sent_ms)) {
                /* Our own connection was down meanwhile: proves nothing. */
            } else if (alive != NULL && alive(arg, e->id, e->sent_ms)) {
                e->misses = 0;
                e->suspect = 0;
                e->nr_pending = 0;
                e->last_ok_ms = now;
            } else {
                if (e->misses++ == 0)
                    e->miss_from_ms = e->sent_ms;
                if ((e->misses >= p->misses || e->suspect) && *nlost < max_lost) {
                    memcpy(lost[*nlost].id, e->id, sizeof(e->id));
                    lost[*nlost].silent_ms = now - e->last_ok_ms;
                    lost[*nlost].unanswered_ms = now - peer_unanswered_from(e);
                    (*nlost)++;
                    e->misses = 0;
                    e->nr_pending = 0;
                    continue;
                }
            }
        }
        if (up_since_ms < 0)
            continue; /* no probe goes out while we are disconnected */
        if (!e->outstanding &&
            (e->suspect || e->probe_soon || now - e->sent_ms >= (int64_t)p->interval_ms) &&
            nsend < max_send) {
            e->outstanding = 1;
            e->probe_soon = 0;
            e->sent_ms = now;
            e->probe_id = ++p->probe_seq;
            memcpy(send[nsend], e->id, sizeof(e->id));
            nsend++;
        }
    }
    return nsend;
}

int64_t
swi_peers_next_due(const swi_peers *p, int64_t now)
{
    int64_t next = INT64_MAX;
    for (size_t i = 0; i < p->n; i++) {
        const swi_peer *e = &p->v[i];
        int64_t at;
        if (e->outstanding)
            at = e->sent_ms + (int64_t)p->timeout_ms;
        else if (e->suspect || e->probe_soon)
            at = now;
        else
            at = e->sent_ms + (int64_t)p->interval_ms;
        if (at < next)
            next = at;
    }
    return next;
}

int
swi_peers_answer(swi_peers *p, const char *id, int no_responders, int64_t now, int64_t up_since_ms,
                 int64_t *silent_ms, int64_t *unanswered_ms)
{
    swi_peer *e = swi_peers_find(p, id);
    int64_t sent;
    if (e == NULL)
        return 0;
    sent = e->sent_ms;
    e->outstanding = 0;
    if (!no_responders) {
        e->last_ok_ms = now;
        e->misses = 0;
        e->suspect = 0;
        e->nr_pending = 0;
        return 0;
    }
    if (!swi_up_throughout(p, up_since_ms, sent))
        return 0;
    if (!e->nr_pending) {
        /* Maybe gone, maybe reconnecting to another node: ask again at
         * once, and decide only when a probe sent nr_grace_ms later
         * bounces too. */
        e->nr_pending = 1;
        e->nr_first_ms = sent;
    }
    if (sent - e->nr_first_ms < p->nr_grace_ms) {
        e->suspect = 1;
        return 0;
    }
    if (unanswered_ms != NULL)
        *unanswered_ms = now - peer_unanswered_from(e);
    e->misses = 0;
    e->nr_pending = 0;
    *silent_ms = now - e->last_ok_ms;
    return 1;
}

/* ---------------------------------------------------------------- idq */

int
swi_idq_init(swi_idq *q, size_t max, int64_t ttl_ms)
{
    memset(q, 0, sizeof(*q));
    q->max = max ? max : 1;
    q->ttl_ms = ttl_ms;
    return swi_idmap_init(&q->map, 64);
}

void
swi_idq_add(swi_idq *q, const uint8_t *id, const char *tag, int64_t now)
{
    swi_idq_entry *e;
    if (q->q == NULL && (q->q = calloc(q->max, sizeof(*q->q))) == NULL)
        return;
    if (swi_idmap_get(&q->map, id) != NULL)
        return;
    /* Forget the ones already taken or expired, and the oldest when full. */
    while (q->n > 0) {
        swi_idq_entry *old = q->q[q->head];
        if (old->live && q->n < q->max && now - old->at < q->ttl_ms)
            break;
        if (old->live)
            swi_idmap_del(&q->map, old->id);
        free(old);
        q->head = (q->head + 1) % q->max;
        q->n--;
    }
    if ((e = calloc(1, sizeof(*e))) == NULL)
        return;
    memcpy(e->id, id, sizeof(e->id));
    swi_strlcpy(e->tag, tag ? tag : "", sizeof(e->tag));
    e->at = now;
    if (swi_idmap_put(&q->map, id, e) != 0) {
        free(e);
        return;
    }
    e->live = 1;
    q->q[(q->head + q->n) % q->max] = e;
    q->n++;
}

swi_idq_entry *
swi_idq_find(swi_idq *q, const uint8_t *id, int64_t now)
{
    swi_idq_entry *e = swi_idmap_get(&q->map, id);
    return e != NULL && now - e->at < q->ttl_ms ? e : NULL;
}

int
swi_idq_take(swi_idq *q, const uint8_t *id, const char *tag)
{
    swi_idq_entry *e = swi_idmap_get(&q->map, id);
    if (e == NULL || (tag != NULL && strcmp(e->tag, tag) != 0))
        return 0;
    swi_idmap_del(&q->map, id);
    e->live = 0; /* freed when it leaves the ring */
    return 1;
}

void
swi_idq_pair_key(uint8_t key[16], const uint8_t *id, const char *tag)
{
    crypto_generichash_state st;
    const char *t = tag != NULL ? tag : "";
    (void)crypto_generichash_init(&st, NULL, 0, 16);
    (void)crypto_generichash_update(&st, id, 16);
    /* (with its length: no two pairs share their bytes) */
    (void)crypto_generichash_update(&st, (const unsigned char *)t, strlen(t) + 1);
    (void)crypto_generichash_final(&st, key, 16);
}

void
swi_idq_fini(swi_idq *q)
{
    for (size_t i = 0; i < q->n; i++)
        free(q->q[(q->head + i) % q->max]);
    free(q->q);
    swi_idmap_fini(&q->map);
    memset(q, 0, sizeof(*q));
}
