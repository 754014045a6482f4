/* tests/unit/test_sched.c -- the shared deadline scheduler (ticker, due
 * times) and the peer-liveness state machine (common/sched.c). No server;
 * the peer table is driven with explicit times. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/sched.h"

/* ---------------------------------------------------------------- ticker */

typedef struct tick_rec {
    pthread_mutex_t mu;
    int calls;
    int64_t last;
} tick_rec;

static void
on_tick(void *arg, int64_t now)
{
    tick_rec *r = arg;
    pthread_mutex_lock(&r->mu);
    r->calls++;
    r->last = now;
    pthread_mutex_unlock(&r->mu);
}

static int
tick_calls(tick_rec *r)
{
    int n;
    pthread_mutex_lock(&r->mu);
    n = r->calls;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* A kick makes the call come long before the period; stop joins. */
static void
test_ticker_kick_and_stop(void **state)
{
    swi_ticker t;
    tick_rec r = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
    int64_t t0 = swi_now_ms();
    (void)state;
    assert_int_equal(swi_ticker_start(&t, 60000, on_tick, &r), 0);
    swi_ticker_kick(&t);
    while (tick_calls(&r) == 0 && swi_now_ms() - t0 < 10000)
        ;
    assert_int_equal(tick_calls(&r), 1);
    assert_true(swi_now_ms() - t0 < 10000);
    swi_ticker_stop(&t);
    swi_ticker_stop(&t); /* idempotent */
    swi_ticker_fini(&t);
    assert_int_equal(tick_calls(&r), 1);
}

/* With no kick it calls every period. */
static void
test_ticker_period(void **state)
{
    swi_ticker t;
    tick_rec r = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
    int64_t t0 = swi_now_ms();
    (void)state;
    assert_int_equal(swi_ticker_start(&t, 5, on_tick, &r), 0);
    while (tick_calls(&r) < 3 && swi_now_ms() - t0 < 10000) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    swi_ticker_stop(&t);
    swi_ticker_fini(&t);
    assert_true(tick_calls(&r) >= 3);
    assert_true(swi_now_ms() - t0 >= 10); /* three calls need at least two periods */
}

/* A ticker whose fn rests it: on call 1 (60 s: no call follows by itself),
 * and on call 3 after kicking itself (the kick made while fn ran cuts the
 * rest short). Calls 2, 4, ... come every period. */
typedef struct rest_rec {
    tick_rec rec;
    swi_ticker *t;
} rest_rec;

static void
on_tick_rest(void *arg, int64_t now)
{
    rest_rec *rr = arg;
    on_tick(&rr->rec, now);
    if (tick_calls(&rr->rec) == 1) {
        swi_ticker_rest(rr->t, 60000);
    } else if (tick_calls(&rr->rec) == 3) {
        swi_ticker_kick(rr->t);
        swi_ticker_rest(rr->t, 60000);
    }
}

static void
test_ticker_rest(void **state)
{
    swi_ticker t;
    rest_rec rr = {{PTHREAD_MUTEX_INITIALIZER, 0, 0}, &t};
    struct timespec ms = {0, 1000000};
    int64_t t0;
    (void)state;
    assert_int_equal(swi_ticker_start(&t, 5, on_tick_rest, &rr), 0);
    t0 = swi_now_ms();
    while (tick_calls(&rr.rec) == 0 && swi_now_ms() - t0 < 10000)
        nanosleep(&ms, NULL);
    assert_int_equal(tick_calls(&rr.rec), 1);
    t0 = swi_now_ms();
    while (swi_now_ms() - t0 < 300) /* 60 periods */
        nanosleep(&ms, NULL);
    assert_int_equal(tick_calls(&rr.rec), 1); /* resting */
    swi_ticker_kick(&t);
    t0 = swi_now_ms();
    /* call 2 (the kick), 3 (a period later: it kicks itself and rests),
     * 4 at once (that kick), then every period again */
    while (tick_calls(&rr.rec) < 8 && swi_now_ms() - t0 < 10000)
        nanosleep(&ms, NULL);
    assert_true(tick_calls(&rr.rec) >= 8);
    assert_true(swi_now_ms() - t0 < 10000);
    swi_ticker_stop(&t);
    swi_ticker_fini(&t);
}

/* A zeroed ticker that never started stops as a no-op. */
static void
test_ticker_never_started(void **state)
{
    swi_ticker t;
    (void)state;
    memset(&t, 0, sizeof(t));
    swi_ticker_stop(&t);
    swi_ticker_kick(&t);
    swi_ticker_fini(&t);
}

/* Kicks from another thread while the ticker stops (a message handler
 * waking a router being destroyed): no call after the stop, nothing used
 * after it is released (the stop used to destroy the lock such a kick was
 * taking: a TSan report from test_cli). */
typedef struct kicker {
    swi_ticker *t;
    int done; /* atomic */
    long kicks;
} kicker;

static void *
kicker_main(void *arg)
{
    kicker *k = arg;
    while (!__atomic_load_n(&k->done, __ATOMIC_ACQUIRE)) {
        swi_ticker_kick(k->t);
        k->kicks++;
    }
    return NULL;
}

static void
test_ticker_kick_races_stop(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        swi_ticker t;
        tick_rec r = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
        kicker k = {&t, 0, 0};
        pthread_t th;
        int calls;
        assert_int_equal(swi_ticker_start(&t, 60000, on_tick, &r), 0);
        assert_int_equal(pthread_create(&th, NULL, kicker_main, &k), 0);
        while (tick_calls(&r) == 0)
            sched_yield();
        swi_ticker_stop(&t);
        calls = tick_calls(&r);
        for (int i = 0; i < 1000; i++) /* kicks after the stop */
            sched_yield();
        assert_int_equal(tick_calls(&r), calls);
        __atomic_store_n(&k.done, 1, __ATOMIC_RELEASE);
        pthread_join(th, NULL);
        assert_true(k.kicks > 0);
        swi_ticker_fini(&t);
        swi_ticker_fini(&t); /* idempotent */
    }
}

/* ---------------------------------------------------------------- due times */

typedef struct due_obj {
    uint8_t id[SW_REQUEST_ID_BYTES];
    int refs;
    int64_t *due;
} due_obj;

static void
due_ref(void *v)
{
    ((due_obj *)v)->refs++;
}

static int
vec_has(const swi_ptrvec *vec, const void *p)
{
    for (size_t i = 0; i < vec->n; i++)
        if (vec->v[i] == p)
            return 1;
    return 0;
}

/* The scan takes (and references) exactly the attached objects due by the
 * time; a detached object is never taken, whatever it writes to its cell. */
static void
test_duetab_snapshot(void **state)
{
    swi_duetab t;
    swi_ptrvec vec = {NULL, 0, 0};
    due_obj o[4];
    (void)state;
    swi_duetab_init(&t);
    for (int i = 0; i < 4; i++) {
        memset(&o[i], 0, sizeof(o[i]));
        assert_non_null(o[i].due = swi_duetab_add(&t, &o[i], INT64_MAX));
    }
    swi_due_set(o[0].due, 50);
    swi_due_set(o[1].due, 100);
    swi_due_set(o[2].due, 101);
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 2);
    assert_true(vec_has(&vec, &o[0]) && vec_has(&vec, &o[1]));
    assert_int_equal(o[0].refs + o[1].refs, 2);
    assert_int_equal(o[2].refs + o[3].refs, 0);
    swi_due_soon(o[3].due);
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 3);
    assert_int_equal(o[3].refs, 1);
    /* detached: its late writes are never taken */
    swi_duetab_detach(&t, o[0].due);
    swi_due_soon(o[0].due);
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 2);
    assert_false(vec_has(&vec, &o[0]));
    assert_int_equal(o[0].refs, 2); /* the two scans before */
    /* attached only when told */
    {
        due_obj late;
        memset(&late, 0, sizeof(late));
        assert_non_null(late.due = swi_duetab_add(&t, NULL, 0));
        swi_duetab_snapshot(&t, &vec, 100, due_ref);
        assert_false(vec_has(&vec, &late));
        swi_duetab_attach(&t, late.due, &late);
        swi_duetab_snapshot(&t, &vec, 100, due_ref);
        assert_true(vec_has(&vec, &late));
        assert_int_equal(late.refs, 1);
        swi_duetab_release(&t, late.due);
    }
    for (int i = 0; i < 4; i++)
        swi_duetab_release(&t, o[i].due);
    swi_duetab_snapshot(&t, &vec, INT64_MAX, due_ref);
    assert_int_equal(vec.n, 0);
    free(vec.v);
    swi_duetab_fini(&t);
}

/* Cells never move while the table grows, keep their values, are unique,
 * and a released cell is given out again (so the table stays as large as
 * the most objects it held at once). */
#define DUE_MANY 2000
static void
test_duetab_cells_stable(void **state)
{
    swi_duetab t;
    swi_ptrvec vec = {NULL, 0, 0};
    static due_obj o[DUE_MANY];
    int64_t *again;
    (void)state;
    swi_duetab_init(&t);
    for (int i = 0; i < DUE_MANY; i++) {
        memset(&o[i], 0, sizeof(o[i]));
        assert_non_null(o[i].due = swi_duetab_add(&t, &o[i], 1000 + i));
    }
    for (int i = 0; i < DUE_MANY; i++) {
        assert_int_equal(*o[i].due, 1000 + i);
        if (i > 0)
            assert_ptr_not_equal(o[i].due, o[i - 1].due);
    }
    swi_duetab_snapshot(&t, &vec, 1000 + DUE_MANY / 2 - 1, due_ref);
    assert_int_equal(vec.n, DUE_MANY / 2);
    for (size_t i = 0; i < vec.n; i++)
        assert_true(*((due_obj *)vec.v[i])->due < 1000 + DUE_MANY / 2);
    /* a released cell comes back, with the new due time */
    swi_duetab_release(&t, o[7].due);
    assert_int_equal(*o[7].due, INT64_MAX);
    again = swi_duetab_add(&t, &o[7], 5);
    assert_ptr_equal(again, o[7].due);
    assert_int_equal(t.nchunks, (DUE_MANY + SWI_DUETAB_CHUNK - 1) / SWI_DUETAB_CHUNK);
    /* releasing every cell needs no memory */
    for (int i = 0; i < DUE_MANY; i++)
        swi_duetab_release(&t, o[i].due);
    assert_int_equal(t.nfree, t.nchunks * (SWI_DUETAB_CHUNK - 1)); /* cell 0 of each: its mark */
    assert_int_equal(t.attached, 0);
    free(vec.v);
    swi_duetab_fini(&t);
}

/* The earliest due time of a chunk's attached cells (INT64_MAX: none). */
static int64_t
chunk_low(const swi_duechunk *c)
{
    int64_t low = INT64_MAX;
    for (size_t j = 1; j < SWI_DUETAB_CHUNK; j++)
        if (c->val[j] != NULL && __atomic_load_n(&c->due[j], __ATOMIC_SEQ_CST) < low)
            low = __atomic_load_n(&c->due[j], __ATOMIC_SEQ_CST);
    return low;
}

/* Each chunk's low-water mark: a scan skips a chunk with nothing due yet
 * and leaves its mark at its earliest attached cell; a lowered cell lowers
 * the mark and is found by the next scan; a raised one is left alone until
 * a scan looks; an object taken stays due until its cell moves. */
#define DUE_MARKS 600 /* three chunks */
static void
test_duetab_marks(void **state)
{
    swi_duetab t;
    swi_ptrvec vec = {NULL, 0, 0};
    static due_obj o[DUE_MARKS];
    swi_duechunk *c1;
    (void)state;
    swi_duetab_init(&t);
    for (int i = 0; i < DUE_MARKS; i++) {
        memset(&o[i], 0, sizeof(o[i]));
        assert_non_null(o[i].due = swi_duetab_add(&t, &o[i], 10000 + i));
    }
    assert_int_equal(t.nchunks, 3);
    for (size_t k = 0; k < t.nchunks; k++) /* a cell's mark is its chunk's cell 0 */
        for (size_t j = 1; j < SWI_DUETAB_CHUNK; j++)
            if (t.chunks[k]->val[j] != NULL)
                assert_ptr_equal(swi_due_mark(&t.chunks[k]->due[j]), &t.chunks[k]->due[0]);
    swi_duetab_snapshot(&t, &vec, 10100, due_ref); /* reads chunk 0, skips 1 and 2 */
    assert_int_equal(vec.n, 101);
    for (size_t k = 0; k < t.nchunks; k++) /* each mark: its chunk's earliest */
        assert_int_equal(t.chunks[k]->due[0], chunk_low(t.chunks[k]));
    for (int i = 0; i < DUE_MARKS; i++)
        swi_due_set(o[i].due, 10000 + DUE_MARKS + i); /* later: the marks stay */
    vec.n = 0;
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 0);
    /* lowered: the mark follows, the next scan takes exactly it */
    c1 = t.chunks[1];
    swi_due_set(o[300].due, 50);
    assert_ptr_equal(swi_due_mark(o[300].due), &c1->due[0]);
    assert_int_equal(c1->due[0], 50);
    vec.n = 0;
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 1);
    assert_ptr_equal(vec.v[0], &o[300]);
    /* taken, not moved: still due at the next scan */
    vec.n = 0;
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 1);
    assert_int_equal(o[300].refs, 2);
    /* raised: the mark stays low until a scan, which sets it to the
     * chunk's earliest again */
    swi_due_set(o[300].due, 20000);
    assert_int_equal(c1->due[0], 50);
    vec.n = 0;
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 0);
    assert_int_equal(c1->due[0], chunk_low(c1));
    assert_true(c1->due[0] > 100);
    /* sooner: brought forward (the mark too), never put back */
    swi_due_sooner(o[301].due, 60);
    assert_int_equal(*o[301].due, 60);
    assert_int_equal(c1->due[0], 60);
    swi_due_sooner(o[301].due, 70);
    assert_int_equal(*o[301].due, 60);
    vec.n = 0;
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 1);
    assert_ptr_equal(vec.v[0], &o[301]);
    swi_due_set(o[301].due, 20000);
    vec.n = 0;
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 0);
    /* soon, in the last chunk */
    swi_due_soon(o[DUE_MARKS - 1].due);
    vec.n = 0;
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 1);
    assert_ptr_equal(vec.v[0], &o[DUE_MARKS - 1]);
    /* a detached cell written low lowers the mark (one scan looks), is
     * never taken, and does not count for the mark a scan leaves */
    swi_due_set(o[DUE_MARKS - 1].due, 30000);
    swi_duetab_detach(&t, o[5].due);
    swi_due_soon(o[5].due);
    assert_int_equal(t.chunks[0]->due[0], 0);
    vec.n = 0;
    swi_duetab_snapshot(&t, &vec, 100, due_ref);
    assert_int_equal(vec.n, 0);
    assert_int_equal(t.chunks[0]->due[0], chunk_low(t.chunks[0]));
    assert_true(t.chunks[0]->due[0] > 100);
    /* added detached, due now, while a scan reads its chunk and leaves it
     * out of the mark: attaching puts its time in, the next scan takes it
     * (a write of the same time would not) */
    {
        due_obj late;
        memset(&late, 0, sizeof(late));
        swi_due_set(o[DUE_MARKS - 1].due, 30000);
        swi_due_soon(o[DUE_MARKS - 2].due); /* the last chunk is read by the next scan */
        assert_non_null(late.due = swi_duetab_add(&t, NULL, 0));
        assert_ptr_equal(swi_due_mark(late.due), swi_due_mark(o[DUE_MARKS - 1].due));
        vec.n = 0;
        swi_duetab_snapshot(&t, &vec, 100, due_ref);
        assert_int_equal(vec.n, 1); /* o[DUE_MARKS - 2]; not the detached one */
        swi_due_set(o[DUE_MARKS - 2].due, 30000);
        vec.n = 0;
        swi_duetab_snapshot(&t, &vec, 100, due_ref);
        assert_int_equal(vec.n, 0);
        assert_true(swi_due_mark(late.due)[0] > 100);
        swi_duetab_attach(&t, late.due, &late);
        swi_due_soon(late.due); /* the same time: no write */
        vec.n = 0;
        swi_duetab_snapshot(&t, &vec, 100, due_ref);
        assert_int_equal(vec.n, 1);
        assert_ptr_equal(vec.v[0], &late);
        swi_duetab_release(&t, late.due);
    }
    for (int i = 0; i < DUE_MARKS; i++)
        swi_duetab_release(&t, o[i].due);
    free(vec.v);
    swi_duetab_fini(&t);
}

/* Writers moving cells up and down while a scanner scans: once they stop,
 * no chunk's mark is later than any of its attached cells (a write that
 * raced a scan's reset of the mark was either read by the scan or lowered
 * the mark itself), and a scan then takes exactly the cells due by its
 * time. As in the library, each cell has one setter (writer k sets the
 * cells k, k + 2, ...: its object's lock), and both writers bring any cell
 * forward (swi_due_sooner, swi_due_soon). The TSan build checks the
 * accesses (on x86 the orderings all compile to full fences: this cannot
 * catch a weakened one). */
#define DUE_RACE 1000
typedef struct due_race {
    swi_duetab *t;
    due_obj *o;
    unsigned seed, k;
    int stop;
} due_race;

static void *
due_race_writer(void *arg)
{
    due_race *r = arg;
    unsigned x = r->seed;
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        /* mostly later (as an idle stream's beats move it), now and then
         * due by the scans' time: so the scans reset marks that writers
         * are lowering */
        unsigned i;
        x = x * 1103515245u + 12345u;
        i = (x >> 8) % DUE_RACE;
        if ((x >> 4) % 16 == 0) { /* forward, any cell */
            if ((x >> 12) % 2)
                swi_due_soon(r->o[i].due);
            else
                swi_due_sooner(r->o[i].due, (int64_t)((x >> 12) % 1000));
        } else { /* its own cells, up or down */
            swi_due_set(r->o[(i & ~1u) + r->k].due, (x >> 3) % 16 == 0
                                                        ? (int64_t)((x >> 12) % 1000)
                                                        : 50000 + (int64_t)((x >> 12) % 50000));
        }
    }
    return NULL;
}

static void
due_race_ref(void *v)
{
    (void)v;
}

static void
test_duetab_marks_race(void **state)
{
    swi_duetab t;
    swi_ptrvec vec = {NULL, 0, 0};
    static due_obj o[DUE_RACE];
    due_race w[2];
    pthread_t th[2];
    (void)state;
    swi_duetab_init(&t);
    for (int i = 0; i < DUE_RACE; i++)
        assert_non_null(o[i].due = swi_duetab_add(&t, &o[i], 50000));
    for (int round = 0; round < 20; round++) {
        for (int k = 0; k < 2; k++) {
            w[k].t = &t;
            w[k].o = o;
            w[k].seed = (unsigned)(round * 2 + k + 1);
            w[k].k = (unsigned)k;
            w[k].stop = 0;
            assert_int_equal(pthread_create(&th[k], NULL, due_race_writer, &w[k]), 0);
        }
        for (int i = 0; i < 2000; i++) {
            vec.n = 0;
            swi_duetab_snapshot(&t, &vec, 1000, due_race_ref);
        }
        for (int k = 0; k < 2; k++) {
            __atomic_store_n(&w[k].stop, 1, __ATOMIC_RELEASE);
            pthread_join(th[k], NULL);
        }
        for (size_t k = 0; k < t.nchunks; k++)
            assert_true(t.chunks[k]->due[0] <= chunk_low(t.chunks[k]));
        {
            int64_t by = 1000;
            size_t want = 0;
            vec.n = 0;
            swi_duetab_snapshot(&t, &vec, by, due_race_ref);
            for (int i = 0; i < DUE_RACE; i++)
                if (*o[i].due <= by) {
                    want++;
                    assert_true(vec_has(&vec, &o[i]));
                }
            assert_int_equal(vec.n, want);
        }
    }
    for (int i = 0; i < DUE_RACE; i++)
        swi_duetab_release(&t, o[i].due);
    free(vec.v);
    swi_duetab_fini(&t);
}

/* ---------------------------------------------------------------- peers */

#define UP 0 /* a connection up since time 0 */

static size_t
round_at(swi_peers *p, int64_t now, int64_t up, swi_peer_id *send, swi_peer_lost *lost,
         size_t *nlost)
{
    return swi_peers_round(p, now, up, NULL, NULL, send, 8, lost, 8, nlost);
}

/* Use counts: a peer stays while a stream needs it. */
static void
test_peers_use_release(void **state)
{
    swi_peers p;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    assert_int_equal(swi_peers_use(&p, "a", 0), 0);
    assert_int_equal(swi_peers_use(&p, "a", 0), 0);
    assert_int_equal(swi_peers_use(&p, "b", 0), 0);
    assert_int_equal(p.n, 2);
    assert_int_equal(swi_peers_find(&p, "a")->users, 2);
    swi_peers_release(&p, "a");
    assert_non_null(swi_peers_find(&p, "a"));
    swi_peers_release(&p, "a");
    assert_null(swi_peers_find(&p, "a"));
    swi_peers_release(&p, "zz"); /* unknown: nothing */
    assert_int_equal(p.n, 1);
    {
        /* A peer removed and added again is a new entry (a new generation):
         * the ingress counts its streams per entry (liveness.c). */
        uint64_t g1 = swi_peers_find(&p, "b")->gen, g2;
        assert_true(g1 != 0);
        swi_peers_release_all(&p, "b");
        assert_int_equal(swi_peers_use(&p, "b", 0), 0);
        g2 = swi_peers_find(&p, "b")->gen;
        assert_true(g2 != 0 && g2 != g1);
        assert_int_equal(swi_peers_find(&p, "b")->users, 1);
    }
    swi_peers_fini(&p);
}

/* The first probe goes out one interval after the peer is added, then one
 * at a time: none while one is out. */
static void
test_peers_probe_schedule(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    swi_peers_use(&p, "a", 1000);
    assert_int_equal(round_at(&p, 1050, UP, send, lost, &nlost), 0);
    assert_int_equal(round_at(&p, 1100, UP, send, lost, &nlost), 1);
    assert_string_equal(send[0], "a");
    assert_int_equal(round_at(&p, 1250, UP, send, lost, &nlost), 0); /* still out */
    assert_int_equal(nlost, 0);
    swi_peers_fini(&p);
}

/* swi_peers_next_due: when a round next has something to do (the router's
 * ticker waits until then): the next probe one interval after the last,
 * a probe out's timeout, now for a suspect peer; INT64_MAX with none. A
 * round at the due time does act; one just before does not. */
static void
test_peers_next_due(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    assert_true(swi_peers_next_due(&p, 0) == INT64_MAX);
    swi_peers_use(&p, "a", 1000);
    swi_peers_use(&p, "b", 1040);
    assert_int_equal(swi_peers_next_due(&p, 1010), 1100); /* a's first probe */
    assert_int_equal(round_at(&p, 1099, UP, send, lost, &nlost), 0);
    assert_int_equal(round_at(&p, 1100, UP, send, lost, &nlost), 1); /* a's probe out */
    assert_int_equal(swi_peers_next_due(&p, 1100), 1140);            /* b's first probe */
    assert_int_equal(round_at(&p, 1140, UP, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_next_due(&p, 1140), 1400); /* a's probe times out */
    assert_int_equal(swi_peers_answer(&p, "a", 0, 1150, UP, NULL, NULL), 0);
    assert_int_equal(swi_peers_next_due(&p, 1150), 1200); /* a's next probe */
    swi_peers_suspect(&p, "a");
    assert_int_equal(swi_peers_next_due(&p, 1160), 1160); /* now */
    assert_int_equal(round_at(&p, 1160, UP, send, lost, &nlost), 1);
    assert_string_equal(send[0], "a");
    swi_peers_fini(&p);
}

/* `misses` unanswered probes in a row: lost, with its silence. */
static void
test_peers_lost_after_misses(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    swi_peers_use(&p, "a", 0);
    assert_int_equal(round_at(&p, 100, UP, send, lost, &nlost), 1);
    assert_int_equal(round_at(&p, 400, UP, send, lost, &nlost), 1); /* miss 1, probe again */
    assert_int_equal(nlost, 0);
    round_at(&p, 700, UP, send, lost, &nlost); /* miss 2 */
    assert_int_equal(nlost, 1);
    assert_string_equal(lost[0].id, "a");
    assert_int_equal(lost[0].silent_ms, 700);
    assert_int_equal(lost[0].unanswered_ms, 600); /* since the probe at 100 */
    swi_peers_fini(&p);
}

static int
alive_if(void *arg, const char *id, int64_t since)
{
    (void)id;
    (void)since;
    return *(const int *)arg;
}

/* A bounce of an earlier episode does not date the next run of misses: a
 * peer that bounced once, then proved alive (it streams), then went
 * silent, has been unanswered since the first probe of the new run. */
static void
test_peers_unanswered_not_from_old_bounce(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    int64_t silent = -1;
    int alive = 1;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    swi_peers_use(&p, "a", 0);
    assert_int_equal(round_at(&p, 100, UP, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 101, UP, &silent, NULL), 0); /* bounce */
    assert_int_equal(swi_peers_round(&p, 110, UP, alive_if, &alive, send, 8, lost, 8, &nlost), 1);
    /* the probe of 110 times out, but the peer streams: alive, probed again */
    assert_int_equal(swi_peers_round(&p, 410, UP, alive_if, &alive, send, 8, lost, 8, &nlost), 1);
    alive = 0;
    assert_int_equal(swi_peers_round(&p, 710, UP, alive_if, &alive, send, 8, lost, 8, &nlost), 1);
    swi_peers_round(&p, 1010, UP, alive_if, &alive, send, 8, lost, 8, &nlost);
    assert_int_equal(nlost, 1);
    assert_int_equal(lost[0].silent_ms, 600);
    assert_int_equal(lost[0].unanswered_ms, 600); /* from the probe of 410, not the bounce */
    swi_peers_fini(&p);
}

/* The unanswered time runs from the first probe of the run of misses, not
 * from the last answer: a sign of life between the two (an answer at 120,
 * then silence from the probe at 200) is no evidence either way. A miss
 * then an answer starts the next run afresh. */
static void
test_peers_unanswered_from_first_miss(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    int64_t silent = -1, unanswered = -1;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    swi_peers_use(&p, "a", 0);
    assert_int_equal(round_at(&p, 100, UP, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 0, 120, UP, &silent, &unanswered), 0);
    assert_int_equal(round_at(&p, 200, UP, send, lost, &nlost), 1);
    assert_int_equal(round_at(&p, 500, UP, send, lost, &nlost), 1); /* miss 1: from 200 */
    assert_int_equal(swi_peers_answer(&p, "a", 0, 510, UP, &silent, &unanswered), 0);
    assert_int_equal(round_at(&p, 600, UP, send, lost, &nlost), 1);
    assert_int_equal(round_at(&p, 900, UP, send, lost, &nlost), 1); /* miss 1: from 600 */
    round_at(&p, 1200, UP, send, lost, &nlost);                     /* miss 2: lost */
    assert_int_equal(nlost, 1);
    assert_int_equal(lost[0].silent_ms, 1200 - 510);
    assert_int_equal(lost[0].unanswered_ms, 1200 - 600);
    /* "no responders" after a timed-out probe: from that probe */
    swi_peers_release_all(&p, "a"); /* as the caller does with a lost peer */
    swi_peers_use(&p, "b", 1200);
    p.nr_grace_ms = 100;
    assert_int_equal(round_at(&p, 1300, UP, send, lost, &nlost), 1);
    assert_int_equal(round_at(&p, 1600, UP, send, lost, &nlost), 1); /* b: miss 1, from 1300 */
    assert_int_equal(swi_peers_answer(&p, "b", 1, 1601, UP, &silent, &unanswered), 0);
    assert_int_equal(round_at(&p, 1700, UP, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "b", 1, 1701, UP, &silent, &unanswered), 1);
    assert_int_equal(silent, 1701 - 1200);
    assert_int_equal(unanswered, 1701 - 1300);
    swi_peers_fini(&p);
}

/* An answer resets the misses and the silence. */
static void
test_peers_answer_resets(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    int64_t silent = -1;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    swi_peers_use(&p, "a", 0);
    round_at(&p, 100, UP, send, lost, &nlost);
    round_at(&p, 400, UP, send, lost, &nlost); /* miss 1 */
    assert_int_equal(swi_peers_find(&p, "a")->misses, 1);
    assert_int_equal(swi_peers_answer(&p, "a", 0, 450, UP, &silent, NULL), 0);
    assert_int_equal(swi_peers_find(&p, "a")->misses, 0);
    assert_int_equal(swi_peers_find(&p, "a")->last_ok_ms, 450);
    assert_int_equal(swi_peers_answer(&p, "nobody", 0, 450, UP, &silent, NULL), 0);
    swi_peers_fini(&p);
}

/* "No responders" is lost once it is confirmed: a probe sent nr_grace_ms
 * after the first bounced one bounces too. */
static void
test_peers_no_responders(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    int64_t silent = -1, unanswered = -1;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    assert_int_equal(p.nr_grace_ms, SWI_PEERS_NR_GRACE_MS);
    p.settle_ms = 0;
    p.nr_grace_ms = 100;
    swi_peers_use(&p, "a", 0);
    assert_int_equal(round_at(&p, 100, UP, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 101, UP, &silent, NULL), 0); /* first bounce */
    /* probed again at the next round, not one interval later */
    assert_int_equal(round_at(&p, 110, UP, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 111, UP, &silent, NULL),
                     0); /* within the grace */
    assert_int_equal(round_at(&p, 200, UP, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 201, UP, &silent, &unanswered), 1); /* lost */
    assert_int_equal(silent, 201);
    assert_int_equal(unanswered, 101); /* since the first bounced probe, sent at 100 */
    swi_peers_fini(&p);
}

/* A peer whose NATS node died has no subscriptions until it reconnects
 * elsewhere: "no responders" and then an answer is not a loss, and the next
 * bounce starts a new grace. */
static void
test_peers_no_responders_then_back(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    int64_t silent = -1;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    p.nr_grace_ms = 100;
    swi_peers_use(&p, "a", 0);
    round_at(&p, 100, UP, send, lost, &nlost);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 101, UP, &silent, NULL), 0);
    round_at(&p, 150, UP, send, lost, &nlost);
    assert_int_equal(swi_peers_answer(&p, "a", 0, 151, UP, &silent, NULL), 0); /* reconnected */
    assert_int_equal(swi_peers_find(&p, "a")->suspect, 0);
    assert_int_equal(round_at(&p, 160, UP, send, lost, &nlost), 0); /* back to the interval */
    assert_int_equal(round_at(&p, 251, UP, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 252, UP, &silent, NULL), 0); /* a new grace */
    round_at(&p, 300, UP, send, lost, &nlost);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 301, UP, &silent, NULL), 0);
    round_at(&p, 351, UP, send, lost, &nlost);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 352, UP, &silent, NULL), 1);
    assert_int_equal(nlost, 0);
    swi_peers_fini(&p);
}

/* Suspect (the registry removed it): probed at the next round, and one
 * miss decides. */
static void
test_peers_suspect(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    (void)state;
    swi_peers_init(&p, 100, 300, 3);
    p.settle_ms = 0;
    swi_peers_use(&p, "a", 0);
    swi_peers_suspect(&p, "a");
    swi_peers_suspect(&p, "nobody");
    assert_int_equal(round_at(&p, 10, UP, send, lost, &nlost), 1);
    round_at(&p, 310, UP, send, lost, &nlost);
    assert_int_equal(nlost, 1);
    swi_peers_fini(&p);
}

static int
always_alive(void *arg, const char *id, int64_t since)
{
    (void)arg;
    (void)id;
    (void)since;
    return 1;
}

/* A peer that shows life another way (it streams) is not missed. */
static void
test_peers_alive_by_activity(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    (void)state;
    swi_peers_init(&p, 100, 300, 1);
    p.settle_ms = 0;
    swi_peers_use(&p, "a", 0);
    swi_peers_round(&p, 100, UP, always_alive, NULL, send, 8, lost, 8, &nlost);
    swi_peers_round(&p, 400, UP, always_alive, NULL, send, 8, lost, 8, &nlost);
    assert_int_equal(nlost, 0);
    assert_int_equal(swi_peers_find(&p, "a")->last_ok_ms, 400);
    swi_peers_fini(&p);
}

/* Issue 11 #7: while this side's own connection is down nothing is judged
 * and nothing is probed; a probe sent before it came back proves nothing,
 * timed out or answered "no responders". */
static void
test_peers_own_connection_down(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    int64_t silent = -1;
    (void)state;
    swi_peers_init(&p, 100, 300, 1);
    p.settle_ms = 0; /* the settle time has its own case below */
    swi_peers_use(&p, "a", 0);
    assert_int_equal(round_at(&p, 100, UP, send, lost, &nlost), 1);
    /* down from 150 on */
    assert_int_equal(round_at(&p, 400, -1, send, lost, &nlost), 0);
    assert_int_equal(nlost, 0);
    assert_int_equal(round_at(&p, 2000, -1, send, lost, &nlost), 0);
    assert_int_equal(nlost, 0);
    /* back at 2100: a new probe, judged normally */
    assert_int_equal(round_at(&p, 2100, 2100, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 2101, 2150, &silent, NULL),
                     0); /* bounced again */
    assert_int_equal(round_at(&p, 2300, 2150, send, lost, &nlost), 1);
    round_at(&p, 2600, 2150, send, lost, &nlost);
    assert_int_equal(nlost, 1);
    swi_peers_fini(&p);
}

/* After this side's connection comes back, the peers need time to
 * reconnect and resubscribe: a probe sent within settle_ms of the return
 * proves nothing, "no responders" included (a router back before its
 * worker must not declare it lost). */
static void
test_peers_settle_after_reconnect(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    int64_t silent = -1;
    (void)state;
    swi_peers_init(&p, 100, 300, 1);
    assert_int_equal(p.settle_ms, SWI_PEERS_SETTLE_MS);
    swi_peers_use(&p, "a", 0);
    /* back at 5000 */
    assert_int_equal(round_at(&p, 5000, 5000, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 5001, 5000, &silent, NULL), 0);
    assert_int_equal(round_at(&p, 5100, 5000, send, lost, &nlost), 1);
    round_at(&p, 5400, 5000, send, lost, &nlost);
    assert_int_equal(nlost, 0);
    /* settled: judged again */
    assert_int_equal(round_at(&p, 7000, 5000, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 7001, 5000, &silent, NULL), 0); /* first bounce */
    assert_int_equal(round_at(&p, 7100, 5000, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 7101, 5000, &silent, NULL), 1); /* confirmed */
    swi_peers_fini(&p);
}

/* At most max_send probes and max_lost losses per round; the rest wait. */
static void
test_peers_round_caps(void **state)
{
    swi_peers p;
    swi_peer_id send[2];
    swi_peer_lost lost[1];
    size_t nlost;
    char id[8];
    (void)state;
    swi_peers_init(&p, 100, 300, 1);
    p.settle_ms = 0;
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "p%d", i);
        swi_peers_use(&p, id, 0);
    }
    assert_int_equal(swi_peers_round(&p, 100, UP, NULL, NULL, send, 2, lost, 1, &nlost), 2);
    assert_int_equal(swi_peers_round(&p, 101, UP, NULL, NULL, send, 2, lost, 1, &nlost), 2);
    assert_int_equal(swi_peers_round(&p, 102, UP, NULL, NULL, send, 2, lost, 1, &nlost), 1);
    swi_peers_round(&p, 400, UP, NULL, NULL, send, 2, lost, 1, &nlost);
    assert_int_equal(nlost, 1);
    swi_peers_fini(&p);
}

/* Probe ids: each probe gets a new one; only an answer echoing the last
 * one counts (a recorded answer replayed later does not). */
static void
test_peers_probe_ids(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    uint64_t first, second;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    swi_peers_use(&p, "a", 0);
    assert_int_equal(swi_peers_probe_id(&p, "a"), 0);
    assert_int_equal(round_at(&p, 100, UP, send, lost, &nlost), 1);
    first = swi_peers_probe_id(&p, "a");
    assert_true(first != 0);
    assert_true(swi_peers_is_current(&p, "a", first));
    assert_false(swi_peers_is_current(&p, "a", 0));
    assert_false(swi_peers_is_current(&p, "nobody", first));
    round_at(&p, 500, UP, send, lost, &nlost); /* a miss, and a new probe */
    second = swi_peers_probe_id(&p, "a");
    assert_true(second != first);
    assert_false(swi_peers_is_current(&p, "a", first)); /* the old answer is stale */
    assert_true(swi_peers_is_current(&p, "a", second));
    swi_peers_fini(&p);
}

/* Heartbeat batches' replay defence: nothing is taken before a current
 * probe answer names the incarnation; then only that incarnation, with a
 * counter above every one taken and above the answer's less one; a restart
 * (a new incarnation in an answer) starts over. */
static void
test_peers_beats_replay(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    assert_false(swi_peers_beats_take(&p, "a", 7, 1)); /* not in the table */
    swi_peers_use(&p, "a", 0);
    assert_int_equal(round_at(&p, 10, UP, send, lost, &nlost), 0); /* first probe at 100 */
    assert_false(swi_peers_beats_take(&p, "a", 7, 1));             /* no answer yet ... */
    assert_int_equal(round_at(&p, 20, UP, send, lost, &nlost), 1); /* ... so: probe now */
    assert_int_equal(round_at(&p, 30, UP, send, lost, &nlost), 0); /* once */
    swi_peers_beats_learn(&p, "a", 7, 10);                         /* its last batch was 10 */
    assert_false(swi_peers_beats_take(&p, "a", 7, 3));             /* recorded before the answer */
    assert_false(swi_peers_beats_take(&p, "a", 7, 9));
    assert_true(swi_peers_beats_take(&p, "a", 7, 10));  /* sent just before it, late */
    assert_false(swi_peers_beats_take(&p, "a", 7, 10)); /* the same batch again */
    assert_true(swi_peers_beats_take(&p, "a", 7, 12));  /* gaps: batches to other routers */
    assert_false(swi_peers_beats_take(&p, "a", 7, 11));
    /* A batch that names no incarnation from a worker whose answer named
     * one (a forger with a worker's credentials): not taken, and it does
     * not raise the counter over the worker's own batches (before, a
     * counter of 2^64 - 1 here refused every later one). */
    assert_false(swi_peers_beats_take(&p, "a", 0, UINT64_MAX));
    assert_false(swi_peers_beats_take(&p, "a", 8, 13)); /* another incarnation */
    swi_peers_beats_learn(&p, "a", 7, 5);               /* an older answer lowers nothing */
    assert_false(swi_peers_beats_take(&p, "a", 7, 12));
    assert_true(swi_peers_beats_take(&p, "a", 7, 13));
    swi_peers_beats_learn(&p, "a", 9, 1); /* it restarted: a new incarnation */
    assert_false(swi_peers_beats_take(&p, "a", 7, 14));
    assert_true(swi_peers_beats_take(&p, "a", 9, 1));
    swi_peers_beats_learn(&p, "a", 0, 50);            /* 0: a worker from before the counters */
    assert_true(swi_peers_beats_take(&p, "a", 0, 0)); /* its batches carry none either */
    assert_true(swi_peers_beats_take(&p, "a", 9, 2));
    swi_peers_beats_learn(&p, "a", 9, 3); /* an answer names one again */
    assert_false(swi_peers_beats_take(&p, "a", 0, 0));
    swi_peers_release(&p, "a"); /* gone from the table: nothing is taken */
    assert_false(swi_peers_beats_take(&p, "a", 9, 3));
    swi_peers_fini(&p);
}

/* The bounded, expiring id set (early cancels, served requests). */
static void
test_idq(void **state)
{
    swi_idq q;
    uint8_t id[16];
    (void)state;
    assert_int_equal(swi_idq_init(&q, 3, 100), 0);
    memset(id, 0, sizeof(id));
    for (uint8_t i = 1; i <= 3; i++) {
        id[0] = i;
        swi_idq_add(&q, id, "r1", 0);
    }
    id[0] = 1;
    assert_non_null(swi_idq_find(&q, id, 50));
    assert_null(swi_idq_find(&q, id, 100)); /* expired */
    /* full: the oldest goes */
    id[0] = 4;
    swi_idq_add(&q, id, "r1", 10);
    id[0] = 1;
    assert_null(swi_idq_find(&q, id, 20));
    id[0] = 4;
    assert_non_null(swi_idq_find(&q, id, 20));
    /* take checks the tag, and forgets */
    assert_int_equal(swi_idq_take(&q, id, "r2"), 0);
    assert_int_equal(swi_idq_take(&q, id, "r1"), 1);
    assert_null(swi_idq_find(&q, id, 20));
    assert_int_equal(swi_idq_take(&q, id, NULL), 0);
    /* never more than max entries, whatever is added */
    for (int i = 0; i < 1000; i++) {
        id[0] = (uint8_t)i;
        id[1] = (uint8_t)(i >> 8);
        swi_idq_add(&q, id, "r", 30 + i);
        assert_true(q.n <= 3);
    }
    swi_idq_fini(&q);
}

/* Keyed by (id, tag) (the early cancels): one tag's entry for an id does
 * not stand in the way of another's. Keyed by the id alone, a forged entry
 * (another router) made the genuine one's add a no-op, and its take then
 * failed on the tag. */
static void
test_idq_pairs(void **state)
{
    swi_idq q;
    uint8_t id[16], k1[16], k2[16], k3[16], k4[16];
    (void)state;
    memset(id, 7, sizeof(id));
    swi_idq_pair_key(k1, id, "evil");
    swi_idq_pair_key(k2, id, "r1");
    swi_idq_pair_key(k3, id, "r1");
    assert_memory_not_equal(k1, k2, 16);
    assert_memory_equal(k2, k3, 16);
    swi_idq_pair_key(k3, id, "r"); /* ("r", "1..." never meets "r1") */
    assert_memory_not_equal(k2, k3, 16);
    swi_idq_pair_key(k4, id, NULL);
    swi_idq_pair_key(k3, id, "");
    assert_memory_equal(k3, k4, 16);
    id[15] ^= 1;
    swi_idq_pair_key(k3, id, "r1");
    assert_memory_not_equal(k2, k3, 16);
    assert_int_equal(swi_idq_init(&q, 16, 1000), 0);
    swi_idq_add(&q, k1, "evil", 0);
    swi_idq_add(&q, k2, "r1", 0);
    assert_int_equal(q.n, 2);
    assert_int_equal(swi_idq_take(&q, k2, "r1"), 1);
    assert_int_equal(swi_idq_take(&q, k2, "r1"), 0);
    assert_non_null(swi_idq_find(&q, k1, 10)); /* the other stays */
    swi_idq_fini(&q);
}

/* Tests from a mutation-testing pass (session 41): each fails with a
 * mutant of the module that every test before it let live. */

/* swi_idmap_snapshot_all (the router's every-stream snapshot, frontend.c)
 * takes every value, each referenced once (kills sched.c:112 `return 1`
 * -> `return 0` in swi_take_all: nothing taken). */
static void
test_idmap_snapshot_all_takes_all(void **state)
{
    swi_idmap m;
    swi_ptrvec vec = {NULL, 0, 0};
    due_obj o[3];
    (void)state;
    assert_int_equal(swi_idmap_init(&m, 8), 0);
    for (int i = 0; i < 3; i++) {
        memset(&o[i], 0, sizeof(o[i]));
        o[i].id[0] = (uint8_t)(i + 1);
        assert_int_equal(swi_idmap_put(&m, o[i].id, &o[i]), 0);
    }
    swi_idmap_snapshot_all(&m, &vec, due_ref);
    assert_int_equal(vec.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_true(vec_has(&vec, &o[i]));
        assert_int_equal(o[i].refs, 1);
    }
    free(vec.v);
    swi_idmap_fini(&m);
}

/* A cell the table did not give out (another table's, a stray pointer, or
 * a chunk's mark) is ignored by attach, detach and release: the count of
 * attached cells stays, and the mark is never given out (kills sched.c:208
 * `k < nchunks` -> `<=`, sched.c:213 `return -1` -> `return 0`, and
 * sched.c:210 `cell > d` -> `>=`). */
static void
test_duetab_foreign_cell_ignored(void **state)
{
    swi_duetab t;
    due_obj o, x;
    int64_t stray = 5;
    int64_t *c2;
    (void)state;
    swi_duetab_init(&t);
    memset(&o, 0, sizeof(o));
    memset(&x, 0, sizeof(x));
    assert_non_null(o.due = swi_duetab_add(&t, &o, 100));
    assert_int_equal(swi_duetab_attached(&t), 1);
    swi_duetab_attach(&t, &stray, &x);
    assert_int_equal(swi_duetab_attached(&t), 1);
    swi_duetab_attach(&t, swi_due_mark(o.due), &x); /* the chunk's mark */
    assert_int_equal(swi_duetab_attached(&t), 1);
    swi_duetab_release(&t, &stray);
    swi_duetab_release(&t, swi_due_mark(o.due));
    assert_int_equal(swi_duetab_attached(&t), 1);
    assert_int_equal(stray, 5);
    /* what is given out next is a cell, not a mark */
    assert_non_null(c2 = swi_duetab_add(&t, &x, 200));
    assert_ptr_not_equal(c2, swi_due_mark(c2));
    assert_ptr_not_equal(c2, o.due);
    assert_int_equal(swi_duetab_attached(&t), 2);
    swi_duetab_release(&t, c2);
    swi_duetab_release(&t, o.due);
    assert_int_equal(swi_duetab_attached(&t), 0);
    swi_duetab_fini(&t);
}

/* Probe ids start at a random point below 2^62 (unguessable, and they never
 * wrap to 0): kills sched.c:318 `swi_random(...)` deleted (all start at 0),
 * sched.c:319 `& ((1 << 62) - 1)` -> `& (1 << 62)` (two values only) and
 * the mask deleted (a start above 2^62). A false pass needs 8 draws to
 * collide or all 8 to fall below 2^62 by chance (4^-8). */
static void
test_peers_probe_ids_random_start(void **state)
{
    uint64_t seen[8];
    size_t distinct = 0;
    (void)state;
    for (int i = 0; i < 8; i++) {
        swi_peers p;
        swi_peers_init(&p, 1000, 500, 3);
        assert_true(p.probe_seq < (UINT64_C(1) << 62));
        seen[i] = p.probe_seq;
        swi_peers_fini(&p);
    }
    for (int i = 0; i < 8; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= seen[j] == seen[i];
        distinct += !dup;
    }
    assert_true(distinct >= 3);
}

/* swi_peers_probe_out (probe.c: a "no responders" for a peer with no probe
 * out is not about a probe) and swi_peers_deciding (probe.c: no new probe
 * answer is trusted while a peer is being decided): neither is exercised
 * by test_sched (kills sched.c:444 `&&` -> `||`, sched.c:451 `&&` -> `||`
 * and `suspect || nr_pending` -> `&&`). */
static void
test_peers_probe_out_and_deciding(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    int64_t silent = -1;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    assert_false(swi_peers_probe_out(&p, "nobody"));
    assert_false(swi_peers_deciding(&p, "nobody"));
    swi_peers_use(&p, "a", 0);
    assert_false(swi_peers_probe_out(&p, "a"));
    assert_false(swi_peers_deciding(&p, "a"));
    assert_int_equal(round_at(&p, 100, UP, send, lost, &nlost), 1);
    assert_true(swi_peers_probe_out(&p, "a"));
    assert_false(swi_peers_deciding(&p, "a"));
    assert_int_equal(swi_peers_answer(&p, "a", 0, 120, UP, &silent, NULL), 0);
    assert_false(swi_peers_probe_out(&p, "a"));
    /* suspected (a stream's silence): deciding, without any bounce */
    swi_peers_suspect(&p, "a");
    assert_true(swi_peers_deciding(&p, "a"));
    assert_int_equal(round_at(&p, 130, UP, send, lost, &nlost), 1); /* probed at once */
    assert_int_equal(swi_peers_answer(&p, "a", 0, 140, UP, &silent, NULL), 0);
    assert_false(swi_peers_deciding(&p, "a"));
    /* a bounce inside the grace: pending (and suspect) until decided */
    assert_int_equal(round_at(&p, 300, UP, send, lost, &nlost), 1);
    assert_int_equal(swi_peers_answer(&p, "a", 1, 301, UP, &silent, NULL), 0);
    assert_true(swi_peers_deciding(&p, "a"));
    swi_peers_fini(&p);
}

/* A probe that timed out while the peer proved alive some other way (it
 * streams) ends the run of misses; and a peer reported lost starts its
 * count afresh (kills sched.c:500 and sched.c:512, `e->misses = 0;` deleted). */
static void
test_peers_misses_restart(void **state)
{
    swi_peers p;
    swi_peer_id send[8];
    swi_peer_lost lost[8];
    size_t nlost;
    int alive = 0;
    (void)state;
    swi_peers_init(&p, 100, 300, 2);
    p.settle_ms = 0;
    swi_peers_use(&p, "a", 0);
    assert_int_equal(swi_peers_round(&p, 100, UP, alive_if, &alive, send, 8, lost, 8, &nlost), 1);
    assert_int_equal(swi_peers_round(&p, 400, UP, alive_if, &alive, send, 8, lost, 8, &nlost), 1);
    assert_int_equal(nlost, 0); /* miss 1 */
    alive = 1;
    assert_int_equal(swi_peers_round(&p, 700, UP, alive_if, &alive, send, 8, lost, 8, &nlost), 1);
    assert_int_equal(nlost, 0); /* alive: the run ends */
    alive = 0;
    assert_int_equal(swi_peers_round(&p, 1000, UP, alive_if, &alive, send, 8, lost, 8, &nlost), 1);
    assert_int_equal(nlost, 0); /* miss 1 of a new run, not 2 */
    swi_peers_round(&p, 1300, UP, alive_if, &alive, send, 8, lost, 8, &nlost);
    assert_int_equal(nlost, 1); /* miss 2: lost */
    /* not released by the caller: the next loss needs two misses again */
    swi_peers_round(&p, 1400, UP, alive_if, &alive, send, 8, lost, 8, &nlost);
    swi_peers_round(&p, 1700, UP, alive_if, &alive, send, 8, lost, 8, &nlost);
    assert_int_equal(nlost, 0);
    swi_peers_round(&p, 2000, UP, alive_if, &alive, send, 8, lost, 8, &nlost);
    assert_int_equal(nlost, 1);
    swi_peers_fini(&p);
}

/* idq: entries are dated when added, whatever the clock reads (kills
 * sched.c:625 `e->at = now;` deleted: every entry dated 0, so expired past
 * ttl_ms of process time); a taken entry that leaves the ring later does
 * not take a re-added entry of the same id with it (kills sched.c:649
 * `e->live = 0;` deleted); an entry exactly ttl_ms old is forgotten when
 * the next one is added (kills sched.c:613 `< ttl_ms` -> `<=`). */
static void
test_idq_dates_and_reuse(void **state)
{
    swi_idq q;
    uint8_t x[16], y[16], z[16];
    (void)state;
    memset(x, 0, 16);
    memset(y, 0, 16);
    memset(z, 0, 16);
    x[0] = 1;
    y[0] = 2;
    z[0] = 3;
    assert_int_equal(swi_idq_init(&q, 2, 1000), 0);
    swi_idq_add(&q, x, "r", 50000);
    assert_non_null(swi_idq_find(&q, x, 50001));
    /* taken, then the same id again, then another: the second X stays */
    assert_int_equal(swi_idq_take(&q, x, "r"), 1);
    swi_idq_add(&q, x, "r", 50002);
    swi_idq_add(&q, y, "r", 50003);
    assert_non_null(swi_idq_find(&q, x, 50004));
    assert_int_equal(swi_idq_take(&q, x, "r"), 1);
    swi_idq_fini(&q);
    /* expiry at exactly ttl_ms: gone for find and for take */
    assert_int_equal(swi_idq_init(&q, 4, 1000), 0);
    swi_idq_add(&q, x, "r", 0);
    swi_idq_add(&q, z, "r", 1000);
    assert_null(swi_idq_find(&q, x, 1000));
    assert_int_equal(swi_idq_take(&q, x, "r"), 0);
    swi_idq_fini(&q);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ticker_kick_and_stop),
        cmocka_unit_test(test_ticker_period),
        cmocka_unit_test(test_ticker_rest),
        cmocka_unit_test(test_ticker_never_started),
        cmocka_unit_test(test_ticker_kick_races_stop),
        cmocka_unit_test(test_duetab_snapshot),
        cmocka_unit_test(test_duetab_cells_stable),
        cmocka_unit_test(test_duetab_marks),
        cmocka_unit_test(test_duetab_marks_race),
        cmocka_unit_test(test_peers_use_release),
        cmocka_unit_test(test_peers_probe_schedule),
        cmocka_unit_test(test_peers_next_due),
        cmocka_unit_test(test_peers_lost_after_misses),
        cmocka_unit_test(test_peers_answer_resets),
        cmocka_unit_test(test_peers_unanswered_from_first_miss),
        cmocka_unit_test(test_peers_unanswered_not_from_old_bounce),
        cmocka_unit_test(test_peers_no_responders),
        cmocka_unit_test(test_peers_no_responders_then_back),
        cmocka_unit_test(test_idq),
        cmocka_unit_test(test_idq_pairs),
        cmocka_unit_test(test_peers_probe_ids),
        cmocka_unit_test(test_peers_beats_replay),
        cmocka_unit_test(test_peers_suspect),
        cmocka_unit_test(test_peers_alive_by_activity),
        cmocka_unit_test(test_peers_own_connection_down),
        cmocka_unit_test(test_peers_round_caps),
        cmocka_unit_test(test_peers_settle_after_reconnect),
        cmocka_unit_test(test_idmap_snapshot_all_takes_all),
        cmocka_unit_test(test_duetab_foreign_cell_ignored),
        cmocka_unit_test(test_peers_probe_ids_random_start),
        cmocka_unit_test(test_peers_probe_out_and_deciding),
        cmocka_unit_test(test_peers_misses_restart),
        cmocka_unit_test(test_idq_dates_and_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
