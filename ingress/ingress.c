/* ingress/ingress.c -- the worker side.
 *
 * Threads:
 *   - nats.c delivers requests (request subscription) and controls (control
 *     subscription) on its own threads; those callbacks never run user code
 *     except the cancel callback, which they call with no lock held;
 *   - `handler_threads` pool threads run the user's handler;
 *   - one timer thread sends heartbeats, enforces deadlines and retires
 *     finished streams whose final was never acknowledged.
 *
 * Locks: ing->mu guards the stream table, the work queue and counters;
 * r->mu guards one responder. They are never held together. Publishing
 * happens under r->mu (it is our lock, and it keeps one stream's items in
 * sequence order on the wire).
 *
 * Lifetimes: the ingress and each responder are reference counted. A
 * responder holds a reference on its ingress, so a retained responder stays a
 * valid object after sw_ingress_destroy (its calls then return SW_ECLOSED). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sw_common.h"
#include "ingress/ring.h"
#include "ingress/sw_ingress_internal.h"
#include "proto/sw_codec.h"
#include "transport/sw_transport.h"

#define SWI_MAX_CONTROL_BYTES 8192 /* an ACK_FINALS of 256 ids is 4.7 KB */
#define SWI_TICK_MS 25 /* heartbeat and deadline precision */
#define SWI_LINGER_MIN_MS 2000
/* Coalescing: a stream whose last publish ended less than SWI_HOT_US ago
 * hands its items to the ingress's sender thread, which puts every item
 * queued meanwhile into one message (at most SWI_BATCH_ITEMS items and
 * SWI_BATCH_BYTES bytes). A stream that was quiet publishes inline. */
#define SWI_HOT_US 200 /* default of sw_ingress_opts.coalesce_us */
#define SWI_BATCH_ITEMS 128
#define SWI_BATCH_BYTES (64 * 1024)
#define SWI_MSG_STACK 4096

struct sw_responder {
    sw_ingress *ing;
    atomic_int refs;  /* memory */
    int holds;        /* user holds: 1 for the handler call + retains (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;

    uint8_t id[SW_REQUEST_ID_BYTES];
    char idhex[SW_REQUEST_ID_HEX];
    char resp_subj[SWP_MAX_SUBJECT + 1];
    char router_id[SW_MAX_TOKEN + 1];
    uint8_t *payload;
    size_t plen;
    uint32_t max_tokens;

    uint64_t credit_limit; /* may send seq <= credit_limit (UINT64_MAX: no flow control) */
    uint32_t window;
    int capped; /* window lowered to the ingress's max_window */
    /* next_seq, pub_seq, acked and the kept bodies (ingress/ring.h). Items
     * acked+1 .. pub_seq went out; pub_seq+1 .. next_seq-1 wait in the ring
     * to be published, in order, by the one thread that has set `sending`
     * (it drops mu while it publishes). */
    swn_ring rg;
    int sending;
    int in_sendq;      /* on ing->sq (under ing->smu) */
    int lose_next;     /* chaos: the next kept item misses its first publish */
    int fe_cancelled;  /* the frontend cancelled or killed it (or is gone): it wants nothing more */
    int beats_batched; /* resp_subj is sw.rsp.<router_id>.<id>: heartbeats go in batches */
    int64_t next_tick_ms; /* the timer looks at r only from then on (atomic; 0 = next tick) */
    sw_err pub_err;    /* a failed publish of queued items, told to the next send or finish */
    int64_t last_end_us; /* when the last publish of items returned */

    uint32_t hb_ms;
    int64_t last_pub_ms;
    int64_t deadline_ms; /* absolute monotonic, -1 = none */
    int64_t done_ms;     /* when the terminal went out */
    uint64_t final_seq;

    int terminated; /* terminal sent, abandoned or killed: nothing more goes out */
    int cancelled;
    int closed; /* ingress destroyed */
    int registered;
    int counted; /* counts in ing->inflight */
    sw_cancel_fn cancel_fn;
    void *cancel_arg;
    int cancel_fired;

    sw_responder *qnext;
    sw_responder *snext; /* ing->sq, under ing->smu */
    sw_responder *all_prev, *all_next; /* every live responder (ing->all), under ing->mu */
};

struct sw_ingress {
    sw_conn *conn;
    swi_logger log;
    atomic_int refs;
    char endpoint[SW_MAX_ENDPOINT + 1];
    char instance_id[SW_MAX_TOKEN + 1];
    char req_subj[SWT_SUBJECT_MAX];
    char ctl_subj[SWT_SUBJECT_MAX];
    sw_handler_fn handler;
    void *handler_arg;
    unsigned max_inflight;
    unsigned nthreads;
    unsigned send_timeout_ms;
    unsigned max_window;
    int64_t hot_us; /* coalesce_us; 0 = off */
    size_t max_req;

    swt_sub *req_sub;
    swt_sub *ctl_sub;

    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work queue, drain progress */
    pthread_cond_t tick_cv; /* timer thread */
    swi_idmap streams;
    sw_responder *all; /* every responder not yet freed, registered or not */
    sw_responder *q_head, *q_tail;
    pthread_t *threads;
    unsigned started_threads;
    pthread_t timer;
    int timer_started;
    pthread_t live;
    int live_started;
    /* the sender thread and the streams waiting for it */
    pthread_mutex_t smu;
    pthread_cond_t scv;
    sw_responder *sq_head, *sq_tail;
    pthread_t sender;
    int sender_on;   /* running and taking work (under smu) */
    int sender_idle; /* waiting on scv */
    int sender_stop;
    pthread_mutex_t live_mu;
    struct swi_frontend *fe; /* frontends being probed, under live_mu */
    size_t nfe, capfe;
    swt_sub *live_sub; /* sw.lv.<instance>.*: probe answers */
    unsigned probe_ms, probe_timeout_ms;
    int stopping;
    int draining;
    int destroyed;
    unsigned inflight;
    double drop_rate;
    sw_ingress_stats st;
};

/* ---------------------------------------------------------------- refs */

static void
ing_unref(sw_ingress *ing)
{
    if (atomic_fetch_sub(&ing->refs, 1) != 1)
        return;
    swi_idmap_fini(&ing->streams);
    free(ing->fe);
    pthread_mutex_destroy(&ing->live_mu);
    pthread_mutex_destroy(&ing->smu);
    pthread_cond_destroy(&ing->scv);
    pthread_mutex_destroy(&ing->mu);
    pthread_cond_destroy(&ing->cv);
    pthread_cond_destroy(&ing->tick_cv);
    free(ing->threads);
    free(ing);
}

static void
resp_ref(sw_responder *r)
{
    atomic_fetch_add(&r->refs, 1);
}

/* A reference unless the responder is already being freed (its count hit
 * zero and it waits for ing->mu to leave ing->all). 1 if taken. */
static int
resp_tryref(sw_responder *r)
{
    int v = atomic_load(&r->refs);
    while (v > 0)
        if (atomic_compare_exchange_weak(&r->refs, &v, v + 1))
            return 1;
    return 0;
}

static void
resp_unref(sw_responder *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    swn_ring_free(&r->rg);
    free(r->payload);
    pthread_mutex_lock(&r->ing->mu);
    if (r->all_prev != NULL)
        r->all_prev->all_next = r->all_next;
    else if (r->ing->all == r)
        r->ing->all = r->all_next;
    if (r->all_next != NULL)
        r->all_next->all_prev = r->all_prev;
    pthread_mutex_unlock(&r->ing->mu);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    ing_unref(r->ing);
    free(r);
}

/* ---------------------------------------------------------------- publish */

/* Packs a complete final wrapper with protobuf-c, for rejections, which
 * have no stream state (stream items go through the ring and resp_build).
 * *out is malloc'd. */
static sw_err
resp_pack_final(const uint8_t id[SW_REQUEST_ID_BYTES], const char *instance, uint64_t seq,
                const swp_terminal *term, size_t max, uint8_t **out, size_t *outlen)
{
    swp_item w = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
    w.version = SW_PROTOCOL_VERSION;
    w.request_id.data = (uint8_t *)id;
    w.request_id.len = SW_REQUEST_ID_BYTES;
    w.seq = seq;
    w.instance_id = (char *)instance;
    w.complete_final = 1;
    w.terminal = (swp_terminal *)term;
    return swp_encode_alloc(&w, max ? max : SIZE_MAX, out, outlen);
}

static int
resp_should_drop(sw_ingress *ing)
{
    uint32_t v;
    if (ing->drop_rate <= 0.0)
        return 0;
    swi_random(&v, sizeof(v));
    return (double)v / 4294967296.0 < ing->drop_rate;
}

static size_t
resp_max_payload(const sw_responder *r)
{
    size_t max = sw_conn_max_payload(r->ing->conn);
    return max ? max : SIZE_MAX;
}

/* The longest item body that fits in a message with any header. */
static size_t
resp_max_body(const sw_responder *r)
{
    size_t max = resp_max_payload(r);
    return max > SWP_HDR_MAX ? max - SWP_HDR_MAX : 0;
}

static void resp_uncount(sw_responder *r);
static void resp_tick_soon(sw_responder *r);

/* What a publish adds to the ingress's counters. */
typedef struct swi_sent {
    int64_t items, msgs, resent, beats;
} swi_sent;

/* Adds (sign 1) or takes back (sign -1) a publish's counts. */
static void
ing_count(sw_ingress *ing, const swi_sent *d, int sign)
{
    pthread_mutex_lock(&ing->mu);
    ing->st.items_sent += (uint64_t)(sign * d->items);
    ing->st.messages_sent += (uint64_t)(sign * d->msgs);
    ing->st.items_resent += (uint64_t)(sign * d->resent);
    ing->st.heartbeats += (uint64_t)(sign * d->beats);
    pthread_mutex_unlock(&ing->mu);
}

/* Publishes on subj. The counts go in before the bytes leave, so a peer
 * that has received them finds them counted, and come out again if the
 * publish fails. */
static sw_err
ing_publish_counted(sw_ingress *ing, const char *subj, const void *buf, size_t len,
                    const swi_sent *d)
{
    sw_err rv;
    ing_count(ing, d, 1);
    if ((rv = swt_publish(ing->conn, subj, NULL, buf, len)) != SW_OK)
        ing_count(ing, d, -1);
    return rv;
}

/* Publishes a packed wrapper on r's response subject (r->mu held). */
static sw_err
resp_publish(sw_responder *r, const uint8_t *buf, size_t len, const swi_sent *d)
{
    sw_err rv = ing_publish_counted(r->ing, r->resp_subj, buf, len, d);
    if (rv == SW_OK)
        r->last_pub_ms = swi_now_ms();
    return rv;
}

static const swi_sent swi_sent_none = {0, 0, 0, 0};

/* The wrapper header for a message whose items run from seq `first` to
 * `last`. The frontend knows the instance it sent to: say it with seq 1 and
 * the final only, not with every token. */
static void
resp_hdr(const sw_responder *r, uint64_t first, uint64_t last, int resent, swp_hdr *h)
{
    h->request_id = r->id;
    h->instance_id =
        first <= 1 || (r->final_seq != 0 && last >= r->final_seq) ? r->ing->instance_id : NULL;
    h->credit_window = r->capped ? r->window : 0;
    h->resent = resent;
}

/* The scratch a message is built in: on the stack when it fits. */
typedef struct swi_msgbuf {
    uint8_t *p;
    size_t cap;
    uint8_t stack[SWI_MSG_STACK];
} swi_msgbuf;

static int
msgbuf_fit(swi_msgbuf *m, size_t need)
{
    uint8_t *np;
    if (need <= m->cap)
        return 0;
    if ((np = malloc(need)) == NULL)
        return -1;
    if (m->p != m->stack)
        free(m->p);
    m->p = np;
    m->cap = need;
    return 0;
}

static void
msgbuf_init(swi_msgbuf *m)
{
    m->p = m->stack;
    m->cap = sizeof(m->stack);
}

static void
msgbuf_free(swi_msgbuf *m)
{
    if (m->p != m->stack)
        free(m->p);
}

/* Builds one message of the kept items from seq `from` up to `to` (r->mu
 * held): the first one in the wrapper, the rest in `batch`, as many as fit
 * in SWI_BATCH_ITEMS, SWI_BATCH_BYTES and the max payload (always at least
 * one). Numbers with no kept body are passed over, and so, on a first send
 * (!resent), are items the test-only loss injection marked. *last gets the
 * highest seq the message accounts for, *nitems the items in it (0: nothing
 * to publish) and *data_items (if not NULL) those of them that are not the
 * final. Returns the message length; 0 and *last = from - 1 without
 * memory. */
static size_t
resp_build(sw_responder *r, uint64_t from, uint64_t to, int resent, swi_msgbuf *m, uint64_t *last,
           unsigned *nitems, unsigned *data_items)
{
    size_t max = resp_max_payload(r), total = SWP_HDR_MAX, n;
    size_t limit = max < SWI_BATCH_BYTES ? max : SWI_BATCH_BYTES;
    uint64_t first = 0, q;
    unsigned k = 0, final = 0;
    swp_hdr h;

    *nitems = 0;
    /* First pass: which items go in. */
    for (q = from; q <= to && k < SWI_BATCH_ITEMS; q++) {
        size_t blen, add;
        int lose;
        if (swn_ring_get(&r->rg, q, &blen, &lose) == NULL || (!resent && lose))
            continue;
        add = blen + (k ? SWP_PREFIX_MAX : 0);
        if (k > 0 && total + add > limit)
            break;
        if (k == 0)
            first = q;
        total += add;
        k++;
    }
    *last = q - 1;
    if (k == 0)
        return 0;
    if (msgbuf_fit(m, total) != 0) {
        *last = from - 1;
        return 0;
    }
    resp_hdr(r, first, *last, resent, &h);
    n = swp_hdr_write(&h, m->p);
    for (q = first, k = 0; q <= *last; q++) {
        size_t blen;
        int lose;
        const uint8_t *b = swn_ring_get(&r->rg, q, &blen, &lose);
        if (b == NULL || (!resent && lose))
            continue;
        if (k > 0)
            n += swp_batch_prefix(m->p + n, blen);
        memcpy(m->p + n, b, blen);
        n += blen;
        k++;
        if (q == r->final_seq)
            final = 1;
    }
    *nitems = k;
    if (data_items != NULL)
        *data_items = k - final;
    return n;
}

/* Keeps the body of item seq, to be published and then kept for resend
 * (r->mu held, the ring keeps items). Takes ownership of buf on success;
 * SW_ENOMEM if the ring cannot hold it (nothing changed, buf still the
 * caller's). */
static sw_err
resp_keep(sw_responder *r, uint64_t seq, uint8_t *buf, size_t len)
{
    sw_err rv = swn_ring_keep(&r->rg, seq, buf, len, r->lose_next || resp_should_drop(r->ing));
    if (rv == SW_OK)
        r->lose_next = 0;
    return rv;
}

/* Publishes header + one body at once, for a stream without flow control
 * (no ring: nothing is kept, nothing is queued) and the chaos hooks (r->mu
 * held). */
static sw_err
resp_publish_one(sw_responder *r, uint64_t seq, const uint8_t *body, size_t blen,
                 const swi_sent *d)
{
    swi_msgbuf m;
    swp_hdr h;
    size_t n;
    sw_err rv;
    msgbuf_init(&m);
    if (msgbuf_fit(&m, SWP_HDR_MAX + blen) != 0)
        return SW_ENOMEM;
    resp_hdr(r, seq, seq, 0, &h);
    n = swp_hdr_write(&h, m.p);
    memcpy(m.p + n, body, blen);
    if (resp_should_drop(r->ing)) { /* test-only loss: counted as sent, never published */
        ing_count(r->ing, d, 1);
        rv = SW_OK;
    } else {
        rv = resp_publish(r, m.p, n + blen, d);
    }
    msgbuf_free(&m);
    return rv;
}

/* Publishes the queued items pub_seq+1 .. next_seq-1 in order, as few
 * messages as they fit in (r->mu held, r->sending set by the caller; mu is
 * dropped while publishing, so the producer can queue more meanwhile, and
 * they are taken too). A failed publish leaves the items kept: the
 * frontend's gap repair asks for them again. */
static void
resp_drain(sw_responder *r)
{
    swi_msgbuf m;
    if (!swn_ring_keeps(&r->rg))
        return; /* without flow control nothing is ever queued */
    msgbuf_init(&m);
    while (!r->closed && r->rg.pub_seq + 1 < r->rg.next_seq && !(r->terminated && r->final_seq == 0)) {
        uint64_t last;
        unsigned k, kd;
        size_t len = resp_build(r, r->rg.pub_seq + 1, r->rg.next_seq - 1, 0, &m, &last, &k, &kd);
        if (last < r->rg.pub_seq + 1) {
            resp_tick_soon(r); /* no memory for the message: the timer tries again */
            break;
        }
        if (k > 0) {
            swi_sent d = {kd, 1, 0, 0};
            sw_err rv;
            pthread_mutex_unlock(&r->mu);
            rv = ing_publish_counted(r->ing, r->resp_subj, m.p, len, &d);
            pthread_mutex_lock(&r->mu);
            if (rv == SW_OK)
                r->last_pub_ms = swi_now_ms();
            else
                r->pub_err = rv;
        }
        r->rg.pub_seq = last;
        r->last_end_us = swi_now_us();
        if (r->final_seq != 0 && r->rg.pub_seq >= r->final_seq)
            resp_uncount(r);
    }
    msgbuf_free(&m);
}

/* The error of a failed publish of queued items, reported once (r->mu
 * held). */
static sw_err
resp_take_pub_err(sw_responder *r)
{
    sw_err rv = r->pub_err;
    r->pub_err = SW_OK;
    return rv;
}

/* Publishes r's queued items as the one thread doing so (r->mu held, r->sending
 * clear); waiters on r->cv (sw_ingress_destroy, resp_flush_now) learn when
 * it is done. */
static void
resp_run_drain(sw_responder *r)
{
    r->sending = 1;
    resp_drain(r);
    r->sending = 0;
    pthread_cond_broadcast(&r->cv);
}

/* Hands stream r to the sender thread. 0 if the sender is not running. */
static int
ing_defer(sw_ingress *ing, sw_responder *r)
{
    int ok;
    pthread_mutex_lock(&ing->smu);
    ok = ing->sender_on;
    if (ok && !r->in_sendq) {
        r->in_sendq = 1;
        resp_ref(r);
        r->snext = NULL;
        if (ing->sq_tail != NULL)
            ing->sq_tail->snext = r;
        else
            ing->sq_head = r;
        ing->sq_tail = r;
        if (ing->sender_idle)
            pthread_cond_signal(&ing->scv);
    }
    pthread_mutex_unlock(&ing->smu);
    return ok;
}

/* Gets queued items of r on their way (r->mu held). If another thread is
 * publishing r's items it takes these too. If r published a moment ago
 * (a fast producer), the sender thread publishes them, so that this thread
 * goes on producing and what it queues meanwhile shares messages. Otherwise
 * (a quiet stream: lowest latency) this thread publishes them now. */
static void
resp_kick(sw_responder *r)
{
    if (r->sending || r->rg.pub_seq + 1 >= r->rg.next_seq)
        return;
    if (swi_now_us() - r->last_end_us < r->ing->hot_us && ing_defer(r->ing, r))
        return;
    resp_run_drain(r);
}

/* Publishes every queued item of r before returning (r->mu held; waits
 * for another thread that is publishing them). For the chaos hooks, whose
 * bytes must follow what was sent before them. */
static void
resp_flush_now(sw_responder *r)
{
    while (swn_ring_keeps(&r->rg) && !r->closed && r->rg.pub_seq + 1 < r->rg.next_seq) {
        if (!r->sending)
            resp_run_drain(r);
        else
            (void)swi_cond_wait_until(&r->cv, &r->mu, swi_now_ms() + 100);
    }
}

static void *
ing_sender_main(void *arg)
{
    sw_ingress *ing = arg;
    pthread_mutex_lock(&ing->smu);
    for (;;) {
        sw_responder *r;
        while (ing->sq_head == NULL && !ing->sender_stop) {
            ing->sender_idle = 1;
            pthread_cond_wait(&ing->scv, &ing->smu);
            ing->sender_idle = 0;
        }
        if ((r = ing->sq_head) == NULL)
            break; /* stopping, and nothing left */
        ing->sq_head = r->snext;
        if (ing->sq_head == NULL)
            ing->sq_tail = NULL;
        r->in_sendq = 0;
        pthread_mutex_unlock(&ing->smu);
        pthread_mutex_lock(&r->mu);
        if (!r->sending)
            resp_run_drain(r);
        pthread_mutex_unlock(&r->mu);
        resp_unref(r);
        pthread_mutex_lock(&ing->smu);
    }
    ing->sender_on = 0;
    pthread_mutex_unlock(&ing->smu);
    return NULL;
}

/* ---------------------------------------------------------------- stream end */

static void unregister_stream(sw_responder *r);

/* Bookkeeping once nothing more will be sent (r->mu held). */
static void
resp_uncount(sw_responder *r)
{
    sw_ingress *ing = r->ing;
    int counted = r->counted;
    r->counted = 0;
    if (counted) {
        pthread_mutex_lock(&ing->mu);
        ing->inflight--;
        ing->st.inflight = ing->inflight;
        pthread_cond_broadcast(&ing->cv);
        pthread_mutex_unlock(&ing->mu);
    }
}

/* Nothing more will be queued (r->mu held). The stream stops counting in
 * the ingress's inflight (which sw_ingress_drain waits for) once its final
 * is on the wire, or now if there is no final to publish. */
static void
resp_mark_terminated(sw_responder *r)
{
    resp_tick_soon(r);
    r->terminated = 1;
    r->done_ms = swi_now_ms();
    pthread_cond_broadcast(&r->cv);
    if (r->final_seq == 0 || r->rg.pub_seq >= r->final_seq)
        resp_uncount(r);
}

/* Sends the final wrapper (r->mu held, not terminated). */
static sw_err
resp_send_final(sw_responder *r, const swp_terminal *t, sw_status counted_as)
{
    sw_ingress *ing = r->ing;
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t seq = r->rg.next_seq;
    size_t max = resp_max_body(r);
    int kept;
    sw_err rv;

    if (r->closed)
        return SW_ECLOSED;
    rv = swp_final_body_alloc(seq, t, max, &buf, &len);
    if (rv == SW_EMSGSIZE) {
        /* A message too long for the bus: send the terminal without it. */
        swp_terminal t2 = *t;
        swp_error e2;
        if (t->error != NULL) {
            e2 = *t->error;
            e2.message = (char *)"";
            t2.error = &e2;
        }
        rv = swp_final_body_alloc(seq, &t2, max, &buf, &len);
    }
    if (rv != SW_OK)
        return rv;
    kept = swn_ring_keeps(&r->rg) && resp_keep(r, seq, buf, len) == SW_OK;
    if (swn_ring_keeps(&r->rg) && !kept)
        resp_flush_now(r); /* no room to keep it: still end the stream, after what
                              was queued before it */
    r->rg.next_seq++;
    r->final_seq = seq;
    if (!kept) { /* published now, not kept (without flow control nothing is) */
        swi_sent d = {0, 1, 0, 0};
        rv = r->closed ? SW_ECLOSED : resp_publish_one(r, seq, buf, len, &d);
        r->rg.pub_seq = seq;
        free(buf);
    } else if (r->pub_err != SW_OK) {
        rv = resp_take_pub_err(r); /* the final is kept, and resent if asked for */
    }
    resp_mark_terminated(r);
    if (kept)
        resp_kick(r); /* last: it may drop mu while publishing */
    pthread_mutex_lock(&ing->mu);
    ing->st.finished[counted_as]++;
    pthread_mutex_unlock(&ing->mu);
    if (r->window == 0)
        unregister_stream(r); /* nothing to resend, no ack will come */
    return rv;
}

/* Fills a FAILED terminal: a streamwire code (sw_code != SW_OK) or an
 * application code token. */
static void
term_failed(swp_terminal *t, swp_error *e, sw_err sw_code, const char *app_code,
            const char *message)
{
    t->status = STREAMWIRE__V1__STATUS__STATUS_FAILED;
    e->sw_code = (uint32_t)sw_code;
    if (app_code != NULL)
        e->app_code = (char *)app_code;
    e->message = (char *)(message ? message : sw_code != SW_OK ? sw_strerror(sw_code) : "");
    t->error = e;
}

/* Sends a FAILED final (r->mu held, not terminated). */
static sw_err
resp_send_failed(sw_responder *r, sw_err sw_code, const char *app_code, const char *message)
{
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    swp_error e = STREAMWIRE__V1__ERROR__INIT;
    term_failed(&t, &e, sw_code, app_code, message);
    return resp_send_final(r, &t, sw_code != SW_OK ? SW_STATUS_ERROR : SW_STATUS_FAILED);
}

/* Fires the cancel callback once, with no lock held. */
static void
resp_fire_cancel(sw_responder *r)
{
    sw_cancel_fn fn = NULL;
    void *arg = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->cancelled && !r->cancel_fired && r->cancel_fn != NULL) {
        r->cancel_fired = 1;
        fn = r->cancel_fn;
        arg = r->cancel_arg;
    }
    pthread_mutex_unlock(&r->mu);
    if (fn != NULL)
        fn(r, arg);
}

/* ---------------------------------------------------------------- table */

static void
unregister_stream(sw_responder *r)
{
    sw_ingress *ing = r->ing;
    int drop = 0;
    pthread_mutex_lock(&ing->mu);
    if (r->registered) {
        r->registered = 0;
        swi_idmap_del(&ing->streams, r->id);
        drop = 1;
    }
    pthread_mutex_unlock(&ing->mu);
    /* Every caller holds a reference of its own (user hold, control or timer
     * transient), so dropping the table's cannot free r under its lock. */
    if (drop)
        resp_unref(r);
}

/* ---------------------------------------------------------------- responder API */

const void *
sw_responder_payload(const sw_responder *r, size_t *len)
{
    if (r == NULL) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = r->plen;
    return r->payload;
}

uint32_t
sw_responder_max_tokens(const sw_responder *r)
{
    return r ? r->max_tokens : 0;
}

const char *
sw_responder_request_id(const sw_responder *r)
{
    return r ? r->idhex : "";
}

int64_t
sw_responder_deadline_left_ms(const sw_responder *r)
{
    int64_t left;
    if (r == NULL || r->deadline_ms < 0)
        return -1;
    left = r->deadline_ms - swi_now_ms();
    return left > 0 ? left : 0;
}

int
sw_responder_cancelled(const sw_responder *r)
{
    int c;
    if (r == NULL)
        return 1;
    pthread_mutex_lock((pthread_mutex_t *)&r->mu);
    c = r->cancelled || r->closed;
    pthread_mutex_unlock((pthread_mutex_t *)&r->mu);
    return c;
}

void
sw_responder_on_cancel(sw_responder *r, sw_cancel_fn fn, void *arg)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->cancel_fn = fn;
    r->cancel_arg = arg;
    r->cancel_fired = 0;
    pthread_mutex_unlock(&r->mu);
    resp_fire_cancel(r);
}

/* mode: 0 blocking, 1 non-blocking, 2 droppable */
static sw_err
resp_send(sw_responder *r, const void *data, size_t len, int mode)
{
    sw_ingress *ing;
    int64_t wait_until;
    uint8_t *buf = NULL;
    size_t blen = 0;
    uint64_t seq;
    sw_err rv;

    if (r == NULL || (data == NULL && len != 0))
        return SW_EINVAL;
    ing = r->ing;
    pthread_mutex_lock(&r->mu);
    wait_until = swi_now_ms() + ing->send_timeout_ms;
    for (;;) {
        if (r->closed) { /* the ingress is gone: that outranks a cancel */
            rv = SW_ECLOSED;
            goto out;
        }
        if (r->cancelled) {
            rv = SW_ECANCELLED;
            goto out;
        }
        if (r->terminated) {
            rv = SW_ECLOSED;
            goto out;
        }
        if (r->rg.next_seq <= r->credit_limit)
            break;
        if (mode == 2) {
            pthread_mutex_lock(&ing->mu);
            ing->st.items_shed++;
            pthread_mutex_unlock(&ing->mu);
            rv = SW_OK;
            goto out;
        }
        if (mode == 1) {
            rv = SW_EAGAIN;
            goto out;
        }
        if (swi_cond_wait_until(&r->cv, &r->mu, wait_until) != 0 && swi_now_ms() >= wait_until) {
            rv = SW_ETIMEDOUT;
            goto out;
        }
    }
    if (r->pub_err != SW_OK) { /* an earlier publish failed: say so once */
        rv = resp_take_pub_err(r);
        goto out;
    }
    seq = r->rg.next_seq;
    if (len > resp_max_body(r) || (blen = swp_data_body_size(seq, len, mode == 2)) >
                                      resp_max_body(r)) {
        rv = SW_EMSGSIZE; /* nothing consumed, the stream goes on */
        goto out;
    }
    if ((buf = malloc(blen)) == NULL) {
        rv = SW_ENOMEM;
        goto out;
    }
    (void)swp_data_body_write(buf, seq, data, len, mode == 2);
    if (!swn_ring_keeps(&r->rg)) { /* no flow control: published at once, not kept */
        swi_sent d = {1, 1, 0, 0};
        rv = resp_publish_one(r, seq, buf, blen, &d);
        free(buf);
        if (rv == SW_OK) {
            r->rg.next_seq++;
            r->rg.pub_seq = seq;
        }
        goto out;
    }
    if ((rv = resp_keep(r, seq, buf, blen)) != SW_OK) {
        free(buf);
        goto out;
    }
    r->rg.next_seq++;
    resp_kick(r); /* may drop mu while publishing */
out:
    pthread_mutex_unlock(&r->mu);
    return rv;
}

sw_err
sw_responder_send(sw_responder *r, const void *data, size_t len)
{
    return resp_send(r, data, len, 0);
}

sw_err
sw_responder_try_send(sw_responder *r, const void *data, size_t len)
{
    return resp_send(r, data, len, 1);
}

sw_err
sw_responder_send_droppable(sw_responder *r, const void *data, size_t len)
{
    return resp_send(r, data, len, 2);
}

static sw_err
resp_check_open(sw_responder *r)
{
    if (r->closed)
        return SW_ECLOSED;
    if (r->cancelled)
        return SW_ECANCELLED;
    if (r->terminated)
        return SW_ECLOSED;
    return SW_OK;
}

sw_err
sw_responder_finish(sw_responder *r, sw_status status, const char *reason)
{
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    sw_err rv;
    if (r == NULL)
        return SW_EINVAL;
    if (status == SW_STATUS_COMPLETED) {
        t.status = STREAMWIRE__V1__STATUS__STATUS_COMPLETED;
        t.finish_reason = (char *)(reason ? reason : "stop");
    } else if (status == SW_STATUS_INCOMPLETE && reason != NULL && *reason != '\0') {
        t.status = STREAMWIRE__V1__STATUS__STATUS_INCOMPLETE;
        t.finish_reason = (char *)reason;
    } else {
        return SW_EINVAL;
    }
    if (strlen(t.finish_reason) > 256)
        return SW_EINVAL;
    pthread_mutex_lock(&r->mu);
    rv = resp_check_open(r);
    if (rv == SW_OK)
        rv = resp_send_final(r, &t, status);
    pthread_mutex_unlock(&r->mu);
    return rv;
}

sw_err
sw_responder_fail(sw_responder *r, const char *code, const char *message)
{
    sw_err rv;
    if (r == NULL || !swi_valid_code(code))
        return SW_EINVAL;
    pthread_mutex_lock(&r->mu);
    rv = resp_check_open(r);
    if (rv == SW_OK)
        rv = resp_send_failed(r, SW_OK, code, message);
    pthread_mutex_unlock(&r->mu);
    return rv;
}

void
sw_responder_retain(sw_responder *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->holds++;
    pthread_mutex_unlock(&r->mu);
}

static void
resp_drop_hold(sw_responder *r, const char *code, const char *message)
{
    int last;
    pthread_mutex_lock(&r->mu);
    last = --r->holds == 0;
    if (last && !r->terminated && !r->closed) {
        swi_log(&r->ing->log, SW_LOG_WARN, "stream %s released without a terminal: sending FAILED",
                r->idhex);
        (void)resp_send_failed(r, SW_OK, code, message);
    }
    pthread_mutex_unlock(&r->mu);
    if (last)
        resp_unref(r);
}

void
sw_responder_release(sw_responder *r)
{
    if (r == NULL)
        return;
    resp_drop_hold(r, "responder_released", "the responder was released without a terminal");
}

/* ---------------------------------------------------------------- chaos hooks */

sw_err
swi_responder_publish_raw(sw_responder *r, const void *bytes, size_t len)
{
    sw_err rv;
    if (r == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&r->mu);
    resp_flush_now(r);
    rv = r->closed ? SW_ECLOSED : resp_publish(r, bytes, len, &swi_sent_none);
    pthread_mutex_unlock(&r->mu);
    return rv;
}

void
swi_responder_lose_next(sw_responder *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->lose_next = 1;
    pthread_mutex_unlock(&r->mu);
}

sw_err
swi_responder_skip_seq(sw_responder *r)
{
    sw_err rv = SW_OK;
    if (r == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&r->mu);
    if (r->terminated || r->closed) {
        rv = SW_ECLOSED;
    } else {
        r->rg.next_seq++;
        if (!swn_ring_keeps(&r->rg))
            r->rg.pub_seq = r->rg.next_seq - 1;
        else
            resp_kick(r); /* covers the number; nothing to publish for it */
    }
    pthread_mutex_unlock(&r->mu);
    return rv;
}

void
swi_responder_abandon(sw_responder *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    resp_flush_now(r); /* what was sent before goes out; nothing after */
    if (!r->terminated)
        resp_mark_terminated(r);
    pthread_mutex_unlock(&r->mu);
    unregister_stream(r);
}

sw_err
swi_responder_send_after_final(sw_responder *r, const void *data, size_t len)
{
    uint8_t *buf = NULL;
    size_t blen = 0;
    sw_err rv;
    if (r == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&r->mu);
    if (!r->terminated || r->final_seq == 0) {
        pthread_mutex_unlock(&r->mu);
        return SW_EBUSY;
    }
    resp_flush_now(r);
    blen = swp_data_body_size(r->rg.next_seq, len, 0);
    if ((buf = malloc(blen)) == NULL) {
        pthread_mutex_unlock(&r->mu);
        return SW_ENOMEM;
    }
    (void)swp_data_body_write(buf, r->rg.next_seq, data, len, 0);
    rv = r->closed ? SW_ECLOSED : resp_publish_one(r, r->rg.next_seq, buf, blen, &swi_sent_none);
    r->rg.next_seq++;
    r->rg.pub_seq = r->rg.next_seq - 1;
    free(buf);
    pthread_mutex_unlock(&r->mu);
    return rv;
}

void
swi_ingress_set_drop_rate(sw_ingress *ing, double rate)
{
    if (ing != NULL)
        ing->drop_rate = rate < 0 ? 0 : rate > 1 ? 1 : rate;
}

/* ---------------------------------------------------------------- requests */

/* Answers a request that cannot be served with a one-item stream: a final
 * wrapper (seq 1) carrying a streamwire error code. */
static void
ing_reject(sw_ingress *ing, const char *subject, const uint8_t id[SW_REQUEST_ID_BYTES],
           sw_err code, const char *message)
{
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    swp_error e = STREAMWIRE__V1__ERROR__INIT;
    uint8_t *buf = NULL;
    size_t len = 0;
    term_failed(&t, &e, code, NULL, message);
    if (resp_pack_final(id, ing->instance_id, 1, &t, sw_conn_max_payload(ing->conn), &buf, &len) ==
        SW_OK)
        (void)swt_publish(ing->conn, subject, NULL, buf, len);
    free(buf);
}

static void
ing_on_request(const swt_msg *msg, void *arg)
{
    sw_ingress *ing = arg;
    const char *reply = msg->reply;
    const uint8_t *data = msg->data;
    size_t len = msg->len;
    swp_request *req = NULL;
    sw_responder *r = NULL;
    uint8_t rid[SW_REQUEST_ID_BYTES];
    sw_err rv;
    int overloaded = 0, dup = 0;

    rv = swp_decode_request(data, len, ing->max_req, &req);
    if (rv != SW_OK) {
        pthread_mutex_lock(&ing->mu);
        ing->st.bad_requests++;
        pthread_mutex_unlock(&ing->mu);
        if (swt_is_response_subject(reply) &&
            swt_response_subject_id(reply, rid) == 0) {
            swi_log(&ing->log, SW_LOG_WARN, "bad request on %s: %s; answered with an error terminal",
                    ing->req_subj, sw_err_name(rv));
            ing_reject(ing, reply, rid, rv, sw_strerror(rv));
        } else {
            swi_log(&ing->log, SW_LOG_WARN, "bad request on %s: %s; no usable reply subject, dropped",
                    ing->req_subj, sw_err_name(rv));
        }
        goto done;
    }
    if (req->endpoint[0] != '\0' && strcmp(req->endpoint, ing->endpoint) != 0) {
        pthread_mutex_lock(&ing->mu);
        ing->st.bad_requests++;
        pthread_mutex_unlock(&ing->mu);
        ing_reject(ing, req->response_subject, req->request_id.data, SW_EINVAL,
                   "request for another endpoint");
        goto done;
    }

    if ((r = calloc(1, sizeof(*r))) == NULL)
        goto nomem;
    r->ing = ing;
    atomic_init(&r->refs, 2); /* table + user hold */
    r->holds = 1;
    pthread_mutex_init(&r->mu, NULL);
    swi_cond_init(&r->cv);
    memcpy(r->id, req->request_id.data, SW_REQUEST_ID_BYTES);
    swi_hex(r->idhex, r->id, SW_REQUEST_ID_BYTES);
    snprintf(r->resp_subj, sizeof(r->resp_subj), "%s", req->response_subject);
    snprintf(r->router_id, sizeof(r->router_id), "%s", req->router_id);
    {
        char std[SWT_SUBJECT_MAX];
        r->beats_batched =
            swt_subject_response(std, sizeof(std), r->router_id, r->idhex) == SW_OK &&
            strcmp(std, r->resp_subj) == 0;
    }
    r->max_tokens = req->max_tokens;
    r->window = req->credit_window;
    if (r->window > ing->max_window) {
        r->window = ing->max_window;
        r->capped = 1;
    }
    r->credit_limit = r->window ? r->window : UINT64_MAX;
    r->hb_ms = req->heartbeat_ms;
    if (r->hb_ms != 0 && r->hb_ms < 10)
        r->hb_ms = 10;
    r->last_pub_ms = swi_now_ms();
    r->deadline_ms = req->deadline_ms ? r->last_pub_ms + req->deadline_ms : -1;
    if (req->payload.len > 0) {
        if ((r->payload = malloc(req->payload.len)) == NULL)
            goto nomem;
        memcpy(r->payload, req->payload.data, req->payload.len);
        r->plen = req->payload.len;
    }
    if (swn_ring_init(&r->rg, r->window) != 0)
        goto nomem;

    pthread_mutex_lock(&ing->mu);
    if (ing->draining || ing->stopping) {
        overloaded = 1;
    } else if (swi_idmap_get(&ing->streams, r->id) != NULL) {
        dup = 1;
    } else if (ing->inflight >= ing->max_inflight) {
        overloaded = 1;
        ing->st.rejected_overload++;
    } else if (swi_idmap_put(&ing->streams, r->id, r) != 0) {
        pthread_mutex_unlock(&ing->mu);
        goto nomem;
    } else {
        atomic_fetch_add(&ing->refs, 1);
        r->all_next = ing->all;
        if (ing->all != NULL)
            ing->all->all_prev = r;
        ing->all = r;
        r->registered = 1;
        r->counted = 1;
        ing->inflight++;
        ing->st.inflight = ing->inflight;
        ing->st.requests++;
        if (ing->q_tail)
            ing->q_tail->qnext = r;
        else
            ing->q_head = r;
        ing->q_tail = r;
        pthread_cond_signal(&ing->cv);
    }
    pthread_mutex_unlock(&ing->mu);
    if (overloaded || dup) {
        if (overloaded) {
            swi_log(&ing->log, SW_LOG_WARN, "request %s rejected: overloaded (%u in flight)",
                    r->idhex, ing->max_inflight);
            ing_reject(ing, req->response_subject, r->id, SW_EOVERLOADED,
                       "the instance is at its concurrency limit");
        }
        goto free_r;
    }
    goto done;

nomem:
    swi_log(&ing->log, SW_LOG_ERROR, "out of memory accepting a request");
    ing_reject(ing, req->response_subject, req->request_id.data, SW_ENOMEM, "worker out of memory");
free_r:
    if (r != NULL) {
        swn_ring_free(&r->rg);
        free(r->payload);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free(r);
    }
done:
    swp_free(req);
}

static void *
ing_worker_main(void *arg)
{
    sw_ingress *ing = arg;
    for (;;) {
        sw_responder *r;
        pthread_mutex_lock(&ing->mu);
        while (ing->q_head == NULL && !ing->stopping)
            pthread_cond_wait(&ing->cv, &ing->mu);
        if (ing->q_head == NULL) {
            pthread_mutex_unlock(&ing->mu);
            return NULL;
        }
        r = ing->q_head;
        ing->q_head = r->qnext;
        if (ing->q_head == NULL)
            ing->q_tail = NULL;
        r->qnext = NULL;
        pthread_mutex_unlock(&ing->mu);

        if (!sw_responder_cancelled(r))
            ing->handler(r, ing->handler_arg);
        resp_drop_hold(r, "handler_returned", "the handler returned without a terminal");
    }
}

/* ---------------------------------------------------------------- control */

static void
resp_cancel(sw_responder *r, int kill)
{
    sw_ingress *ing = r->ing;
    int newly = 0;
    pthread_mutex_lock(&r->mu);
    if (!r->cancelled) {
        r->cancelled = 1;
        newly = 1;
    }
    r->fe_cancelled = 1;
    if (!r->terminated) {
        if (kill) {
            r->rg.pub_seq = r->rg.next_seq - 1; /* nothing queued goes out any more */
            resp_mark_terminated(r);
        } else {
            swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
            t.status = STREAMWIRE__V1__STATUS__STATUS_CANCELLED;
            t.finish_reason = (char *)"cancelled";
            (void)resp_send_final(r, &t, SW_STATUS_CANCELLED);
        }
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (newly) {
        pthread_mutex_lock(&ing->mu);
        ing->st.cancels++;
        pthread_mutex_unlock(&ing->mu);
        resp_fire_cancel(r);
    }
    if (kill)
        unregister_stream(r);
}

static void
resp_resend(sw_responder *r, uint64_t from, uint64_t to)
{
    swi_msgbuf m;
    msgbuf_init(&m);
    pthread_mutex_lock(&r->mu);
    if (!r->closed && swn_ring_resend_range(&r->rg, &from, &to)) {
        while (from <= to) {
            uint64_t last;
            unsigned k;
            size_t len = resp_build(r, from, to, 1, &m, &last, &k, NULL);
            if (last < from)
                break; /* no memory */
            if (k > 0) {
                swi_sent d = {0, 0, k, 0};
                (void)resp_publish(r, m.p, len, &d);
            }
            from = last + 1;
        }
    }
    pthread_mutex_unlock(&r->mu);
    msgbuf_free(&m);
}

static void
ing_probe_reply(sw_ingress *ing, const swt_msg *msg, sw_responder *r)
{
    swp_probe_reply p = STREAMWIRE__V1__PROBE_REPLY__INIT;
    uint8_t buf[256];
    size_t len;
    const char *reply = msg->reply;
    if (reply == NULL)
        return;
    p.version = SW_PROTOCOL_VERSION;
    p.instance_id = ing->instance_id;
    pthread_mutex_lock(&ing->mu);
    p.inflight = ing->inflight;
    p.draining = ing->draining != 0;
    pthread_mutex_unlock(&ing->mu);
    if (r != NULL) {
        pthread_mutex_lock(&r->mu);
        p.known = !r->terminated || r->final_seq != 0;
        p.last_seq = r->rg.next_seq - 1;
        pthread_mutex_unlock(&r->mu);
    }
    if (swp_encode(&p, buf, sizeof(buf), &len) == SW_OK)
        (void)swt_publish(ing->conn, reply, NULL, buf, len);
}

/* The registered stream with this request id, with a reference; NULL if
 * none. */
static sw_responder *
ing_find(sw_ingress *ing, const uint8_t *id)
{
    sw_responder *r;
    pthread_mutex_lock(&ing->mu);
    if ((r = swi_idmap_get(&ing->streams, id)) != NULL)
        resp_ref(r);
    pthread_mutex_unlock(&ing->mu);
    return r;
}

/* A CREDIT (limit, ack), or with `final` the frontend's word that the final
 * arrived: releases what was acknowledged, and retires a stream whose final
 * was. */
static void
resp_credit(sw_responder *r, uint64_t limit, uint64_t ack, int final)
{
    int retire;
    pthread_mutex_lock(&r->mu);
    if (r->window != 0 && limit > r->credit_limit) {
        r->credit_limit = limit;
        pthread_cond_broadcast(&r->cv);
    }
    if (final && r->final_seq != 0)
        ack = r->final_seq;
    ack = swn_ring_ack(&r->rg, ack); /* clamped to next_seq - 1 */
    retire = r->terminated && r->final_seq != 0 && ack >= r->final_seq;
    pthread_mutex_unlock(&r->mu);
    if (retire)
        unregister_stream(r);
}

static void
ing_on_control(const swt_msg *msg, void *arg)
{
    sw_ingress *ing = arg;
    swp_control *c = NULL;
    sw_responder *r = NULL;
    sw_err rv = swp_decode_control(msg->data, msg->len, SWI_MAX_CONTROL_BYTES, &c);
    if (rv != SW_OK) {
        swi_log(&ing->log, SW_LOG_WARN, "bad control message: %s", sw_err_name(rv));
        goto done;
    }
    if (c->request_id.len == SW_REQUEST_ID_BYTES)
        r = ing_find(ing, c->request_id.data);
    switch (c->kind) {
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE:
        ing_probe_reply(ing, msg, r);
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL:
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL:
        if (r != NULL)
            resp_cancel(r, c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL);
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT:
        if (r != NULL)
            resp_credit(r, c->credit_limit, c->ack_seq, 0);
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS:
        for (size_t i = 0; i < c->n_final_acks; i++) {
            sw_responder *a = ing_find(ing, c->final_acks[i].data);
            if (a != NULL) {
                resp_credit(a, 0, 0, 1);
                resp_unref(a);
            }
        }
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND:
        if (r != NULL)
            resp_resend(r, c->resend_from, c->resend_to);
        break;
    default:
        break;
    }
done:
    if (r != NULL)
        resp_unref(r);
    swp_free(c);
}

/* ---------------------------------------------------------------- timer */

/* Takes a reference on r for a snapshot: always (arg NULL), or only if the
 * timer has something to check on it by *(int64_t *)arg. */
static int
resp_take(void *v, void *arg)
{
    sw_responder *r = v;
    if (arg != NULL && __atomic_load_n(&r->next_tick_ms, __ATOMIC_RELAXED) > *(const int64_t *)arg)
        return 0;
    resp_ref(r);
    return 1;
}

/* Snapshot of the registered responders, each with a reference: all
 * (due_by NULL), or those with a timer check due by *due_by. */
static void
ing_snapshot(sw_ingress *ing, swi_ptrvec *vec, const int64_t *due_by)
{
    pthread_mutex_lock(&ing->mu);
    swi_idmap_snapshot(&ing->streams, vec, resp_take, (void *)(uintptr_t)due_by);
    pthread_mutex_unlock(&ing->mu);
}

/* Makes the timer look at r at its next tick (a state change may have made
 * a check due earlier than computed). */
static void
resp_tick_soon(sw_responder *r)
{
    __atomic_store_n(&r->next_tick_ms, 0, __ATOMIC_RELAXED);
}

/* How long a finished stream whose final was not acknowledged is kept. */
static int64_t
resp_linger_ms(const sw_responder *r)
{
    return 4 * (int64_t)r->hb_ms + SWI_LINGER_MIN_MS;
}

/* A finished stream whose frontend still wants its final: heartbeats go on
 * so that a lost final is asked for (r->mu held). */
static int
resp_final_unacked(const sw_responder *r)
{
    return !r->closed && !r->fe_cancelled && r->final_seq != 0 && r->rg.acked < r->final_seq;
}

/* When the timer next has to look at r (r->mu held): its deadline, its next
 * heartbeat, the end of a final's linger; now if items wait to go out. Only
 * ever later than the truth if a state change forgets resp_tick_soon. */
static void
resp_plan_tick(sw_responder *r)
{
    int64_t due = INT64_MAX;
    if (r->closed) {
        /* nothing more to do */
    } else if (!r->terminated) {
        if (r->rg.pub_seq + 1 < r->rg.next_seq)
            due = 0;
        if (r->deadline_ms >= 0 && r->deadline_ms < due)
            due = r->deadline_ms;
        if (r->hb_ms != 0 && r->last_pub_ms + (int64_t)r->hb_ms < due)
            due = r->last_pub_ms + (int64_t)r->hb_ms;
    } else {
        due = r->done_ms + resp_linger_ms(r);
        if (resp_final_unacked(r) && r->hb_ms != 0 && r->last_pub_ms + (int64_t)r->hb_ms < due)
            due = r->last_pub_ms + (int64_t)r->hb_ms;
    }
    __atomic_store_n(&r->next_tick_ms, due, __ATOMIC_RELAXED);
}

#define RESP_AT(vec, i) ((sw_responder *)(vec).v[i])

/* The heartbeats one timer tick sends, by frontend: one HeartbeatBatch per
 * frontend (sw.rsp.<router>.hb) instead of a message per stream. Owned by
 * the timer thread; the groups live for one tick (a frontend that is gone
 * leaves nothing behind), the encode scratch is reused. */
#define SWI_BEATS_PER_MSG 1024
typedef struct swi_beatgrp {
    char subj[SWT_SUBJECT_MAX]; /* sw.rsp.<router>.hb */
    uint8_t (*ids)[SW_REQUEST_ID_BYTES];
    uint64_t *last;
    size_t n, cap;
} swi_beatgrp;
typedef struct swi_beats {
    swi_beatgrp *g;
    size_t n, cap;
    swp_beat *one;  /* SWI_BEATS_PER_MSG, for encoding */
    swp_beat **ptr; /* SWI_BEATS_PER_MSG */
} swi_beats;

/* Queues one beat. 0 ok, -1 no memory (the beat is not queued). */
static int
beats_add(swi_beats *b, const char *subj, const uint8_t *id, uint64_t last_seq)
{
    swi_beatgrp *g = NULL;
    for (size_t i = 0; i < b->n; i++)
        if (strcmp(b->g[i].subj, subj) == 0) {
            g = &b->g[i];
            break;
        }
    if (g == NULL) {
        if (b->n == b->cap) {
            size_t nc = b->cap ? 2 * b->cap : 4;
            swi_beatgrp *ng = realloc(b->g, nc * sizeof(*ng));
            if (ng == NULL)
                return -1;
            b->g = ng;
            b->cap = nc;
        }
        g = &b->g[b->n++];
        memset(g, 0, sizeof(*g));
        snprintf(g->subj, sizeof(g->subj), "%s", subj);
    }
    if (g->n == g->cap) {
        size_t nc = g->cap ? 2 * g->cap : 64;
        uint8_t(*ni)[SW_REQUEST_ID_BYTES] = realloc(g->ids, nc * sizeof(*ni));
        uint64_t *nl;
        if (ni == NULL)
            return -1;
        g->ids = ni;
        if ((nl = realloc(g->last, nc * sizeof(*nl))) == NULL)
            return -1;
        g->last = nl;
        g->cap = nc;
    }
    memcpy(g->ids[g->n], id, SW_REQUEST_ID_BYTES);
    g->last[g->n] = last_seq;
    g->n++;
    return 0;
}

static void
beats_clear(swi_beats *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free(b->g[i].ids);
        free(b->g[i].last);
    }
    b->n = 0;
}

/* Publishes the collected heartbeats, in messages that fit the max payload
 * (about 31 bytes a beat), and drops the groups. */
static void
beats_flush(sw_ingress *ing, swi_beats *b)
{
    uint64_t failed = 0;
    size_t max = sw_conn_max_payload(ing->conn), per = SWI_BEATS_PER_MSG;
    if (b->n == 0)
        return;
    if (max != 0 && (max < 256 || (max - 128) / 32 < per))
        per = max < 256 ? 1 : (max - 128) / 32;
    if (b->one == NULL) {
        b->one = calloc(SWI_BEATS_PER_MSG, sizeof(*b->one));
        b->ptr = calloc(SWI_BEATS_PER_MSG, sizeof(*b->ptr));
    }
    for (size_t i = 0; i < b->n; i++) {
        swi_beatgrp *g = &b->g[i];
        for (size_t at = 0; at < g->n; at += per) {
            swp_beats m = STREAMWIRE__V1__HEARTBEAT_BATCH__INIT;
            size_t k = g->n - at < per ? g->n - at : per, len;
            uint8_t *buf = NULL;
            if (b->one == NULL || b->ptr == NULL) {
                failed += g->n - at;
                break;
            }
            for (size_t j = 0; j < k; j++) {
                streamwire__v1__stream_beat__init(&b->one[j]);
                b->one[j].request_id.data = g->ids[at + j];
                b->one[j].request_id.len = SW_REQUEST_ID_BYTES;
                b->one[j].last_seq = g->last[at + j];
                b->ptr[j] = &b->one[j];
            }
            m.version = SW_PROTOCOL_VERSION;
            m.instance_id = ing->instance_id;
            m.n_beats = k;
            m.beats = b->ptr;
            {
                swi_sent d = {0, 0, 0, (int64_t)k};
                if (swp_encode_alloc(&m, SIZE_MAX, &buf, &len) != SW_OK ||
                    ing_publish_counted(ing, g->subj, buf, len, &d) != SW_OK)
                    failed += k;
            }
            free(buf);
        }
    }
    beats_clear(b);
    if (failed)
        swi_log(&ing->log, SW_LOG_WARN, "%llu heartbeat(s) could not be published",
                (unsigned long long)failed);
}

static void
beats_free(swi_beats *b)
{
    beats_clear(b);
    free(b->g);
    free(b->one);
    free(b->ptr);
}

/* Heartbeats r if it has been quiet for hb_ms and nothing is queued (r->mu
 * held). The beat counts only what went out (pub_seq), so the frontend asks
 * for anything missing up to there. A stream answered on a streamwire
 * router's own subject (sw.rsp.<router>.<id>) gets it in the tick's batch
 * for that router; any other response subject gets a heartbeat wrapper of
 * its own on it. */
static void
resp_heartbeat(sw_responder *r, int64_t now, swi_beats *beats)
{
    char subj[SWT_SUBJECT_MAX];
    if (r->hb_ms == 0 || now - r->last_pub_ms < (int64_t)r->hb_ms || r->sending ||
        r->rg.pub_seq + 1 < r->rg.next_seq)
        return;
    if (r->beats_batched) {
        if (swt_subject_beats(subj, sizeof(subj), r->router_id) == SW_OK &&
            beats_add(beats, subj, r->id, r->rg.pub_seq) == 0)
            r->last_pub_ms = now;
        return;
    }
    {
        swp_item w = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
        swp_heartbeat h = STREAMWIRE__V1__HEARTBEAT__INIT;
        uint8_t buf[SWP_HDR_MAX + 32];
        size_t len;
        w.version = SW_PROTOCOL_VERSION;
        w.request_id.data = r->id;
        w.request_id.len = SW_REQUEST_ID_BYTES;
        w.instance_id = r->ing->instance_id;
        w.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
        h.last_seq = r->rg.pub_seq;
        w.heartbeat = &h;
        if (swp_encode(&w, buf, sizeof(buf), &len) == SW_OK) {
            swi_sent d = {0, 0, 0, 1};
            (void)resp_publish(r, buf, len, &d);
        }
    }
}

static void
ing_tick_one(sw_responder *r, int64_t now, swi_beats *beats)
{
    int deadline = 0, retire = 0;
    pthread_mutex_lock(&r->mu);
    if (!r->terminated && !r->closed) {
        if (r->deadline_ms >= 0 && now >= r->deadline_ms) {
            deadline = !r->cancelled;
            r->cancelled = 1;
            (void)resp_send_failed(r, SW_DEADLINE_EXCEEDED, NULL, "the request deadline passed");
        } else {
            if (!r->sending && r->rg.pub_seq + 1 < r->rg.next_seq && swn_ring_keeps(&r->rg))
                resp_run_drain(r); /* stranded (no memory for a message earlier) */
            resp_heartbeat(r, now, beats);
        }
    } else if (r->terminated) {
        /* A final never acknowledged: keep it for resend for a while, then
         * let go. Heartbeats go on meanwhile, so a lost final is asked for. */
        retire = now - r->done_ms >= resp_linger_ms(r);
        if (!retire && resp_final_unacked(r))
            resp_heartbeat(r, now, beats);
    }
    resp_plan_tick(r);
    pthread_mutex_unlock(&r->mu);
    if (deadline)
        resp_fire_cancel(r);
    if (retire)
        unregister_stream(r);
}

static void *
ing_timer_main(void *arg)
{
    sw_ingress *ing = arg;
    swi_ptrvec vec = {NULL, 0, 0};
    swi_beats beats = {NULL, 0, 0, NULL, NULL};
    pthread_mutex_lock(&ing->mu);
    while (!ing->stopping) {
        swi_cond_wait_until(&ing->tick_cv, &ing->mu, swi_now_ms() + SWI_TICK_MS);
        if (ing->stopping)
            break;
        pthread_mutex_unlock(&ing->mu);
        int64_t now = swi_now_ms();
        ing_snapshot(ing, &vec, &now); /* only streams with something due */
        for (size_t i = 0; i < vec.n; i++) {
            ing_tick_one(RESP_AT(vec, i), now, &beats);
            resp_unref(RESP_AT(vec, i));
        }
        beats_flush(ing, &beats);
        pthread_mutex_lock(&ing->mu);
    }
    pthread_mutex_unlock(&ing->mu);
    beats_free(&beats);
    free(vec.v);
    return NULL;
}

/* ---------------------------------------------------------------- frontend liveness */

/* Core NATS cannot tell a publisher that nobody listens any more, so the
 * worker asks: every probe_ms it sends a request to each frontend that has a
 * live stream here (sw.rtr.<router>). A dead process has no subscription,
 * and the server answers "no responders" at once; a frozen one times out. */

/* One frontend with streams here. The table is unbounded and guarded by
 * ing->live_mu; probes are asynchronous (replies on sw.lv.<instance>.*), so
 * a frozen frontend never delays the check of the others. */
typedef struct swi_frontend {
    char id[SW_MAX_TOKEN + 1];
    int seen;        /* still has a stream here this round */
    int outstanding; /* a probe is in flight */
    int64_t sent_ms;
    int misses;
} swi_frontend;

typedef char swi_fe_id[SW_MAX_TOKEN + 1];

static swi_frontend *
fe_find(sw_ingress *ing, const char *id)
{
    for (size_t i = 0; i < ing->nfe; i++)
        if (strcmp(ing->fe[i].id, id) == 0)
            return &ing->fe[i];
    return NULL;
}

static void
fe_remove(sw_ingress *ing, swi_frontend *e)
{
    *e = ing->fe[--ing->nfe];
}

static void
ing_cancel_frontend(sw_ingress *ing, const char *router_id, const char *why)
{
    swi_ptrvec vec = {NULL, 0, 0};
    unsigned n = 0;
    ing_snapshot(ing, &vec, NULL);
    for (size_t i = 0; i < vec.n; i++) {
        sw_responder *r = RESP_AT(vec, i);
        if (strcmp(r->router_id, router_id) == 0) {
            int finished;
            pthread_mutex_lock(&r->mu);
            finished = r->terminated;
            pthread_mutex_unlock(&r->mu);
            if (!finished && !sw_responder_cancelled(r)) {
                resp_cancel(r, 1);
                n++;
            } else if (finished) {
                /* A final waiting for an ack that will never come. */
                unregister_stream(r);
            }
        }
        resp_unref(r);
    }
    free(vec.v);
    if (n == 0) {
        swi_log(&ing->log, SW_LOG_DEBUG, "frontend %s %s; no stream of it was running", router_id,
                why);
        return;
    }
    pthread_mutex_lock(&ing->mu);
    ing->st.frontends_lost++;
    pthread_mutex_unlock(&ing->mu);
    swi_log(&ing->log, SW_LOG_WARN, "frontend %s %s: cancelled %u stream(s)", router_id, why, n);
}

/* A frontend answered a probe, or the server said nobody is there. */
static void
ing_on_live_reply(const swt_msg *msg, void *arg)
{
    sw_ingress *ing = arg;
    const char *id = swt_subject_last_token(msg->subject);
    swi_fe_id gone = "";
    swi_frontend *e;
    if (id == NULL)
        return;
    pthread_mutex_lock(&ing->live_mu);
    if ((e = fe_find(ing, id)) != NULL) {
        if (msg->no_responders) {
            snprintf(gone, sizeof(gone), "%s", e->id);
            fe_remove(ing, e);
        } else {
            e->outstanding = 0;
            e->misses = 0;
        }
    }
    pthread_mutex_unlock(&ing->live_mu);
    if (gone[0] != '\0')
        ing_cancel_frontend(ing, gone, "is gone (no responders)");
}

static void *
ing_live_main(void *arg)
{
    sw_ingress *ing = arg;
    swi_ptrvec vec = {NULL, 0, 0};
    swi_fe_id *send = NULL, *lost = NULL;
    size_t cap = 0;
    for (;;) {
        size_t nsend = 0, nlost = 0;
        int64_t now;
        pthread_mutex_lock(&ing->mu);
        if (!ing->stopping)
            swi_cond_wait_until(&ing->tick_cv, &ing->mu, swi_now_ms() + ing->probe_ms);
        if (ing->stopping) {
            pthread_mutex_unlock(&ing->mu);
            break;
        }
        pthread_mutex_unlock(&ing->mu);
        /* Every registered stream names its frontend (router_id never
         * changes); finished ones lingering for an ack count too. */
        ing_snapshot(ing, &vec, NULL);
        pthread_mutex_lock(&ing->live_mu);
        for (size_t i = 0; i < ing->nfe; i++)
            ing->fe[i].seen = 0;
        for (size_t i = 0; i < vec.n; i++) {
            const char *rid = RESP_AT(vec, i)->router_id;
            swi_frontend *e = fe_find(ing, rid);
            if (e == NULL) {
                if (ing->nfe == ing->capfe) {
                    size_t ncap = ing->capfe ? ing->capfe * 2 : 16;
                    swi_frontend *nv = realloc(ing->fe, ncap * sizeof(*nv));
                    if (nv == NULL)
                        continue;
                    ing->fe = nv;
                    ing->capfe = ncap;
                }
                e = &ing->fe[ing->nfe++];
                memset(e, 0, sizeof(*e));
                snprintf(e->id, sizeof(e->id), "%s", rid);
            }
            e->seen = 1;
        }
        if (cap < ing->nfe) {
            swi_fe_id *ns = realloc(send, ing->nfe * sizeof(*ns));
            swi_fe_id *nl = ns ? realloc(lost, ing->nfe * sizeof(*nl)) : NULL;
            if (ns != NULL)
                send = ns;
            if (nl != NULL) {
                lost = nl;
                cap = ing->nfe;
            }
        }
        now = swi_now_ms();
        for (size_t i = 0; i < ing->nfe;) {
            swi_frontend *e = &ing->fe[i];
            if (!e->seen) {
                fe_remove(ing, e);
                continue;
            }
            if (e->outstanding && now - e->sent_ms >= (int64_t)ing->probe_timeout_ms) {
                e->outstanding = 0;
                if (++e->misses >= 2 && nlost < cap) {
                    memcpy(lost[nlost++], e->id, sizeof(swi_fe_id));
                    fe_remove(ing, e);
                    continue;
                }
            }
            if (!e->outstanding && nsend < cap) {
                e->outstanding = 1;
                e->sent_ms = now;
                memcpy(send[nsend++], e->id, sizeof(swi_fe_id));
            }
            i++;
        }
        pthread_mutex_unlock(&ing->live_mu);
        for (size_t i = 0; i < vec.n; i++)
            resp_unref(RESP_AT(vec, i));
        for (size_t i = 0; i < nsend; i++) {
            char subj[SWT_SUBJECT_MAX], reply[SWT_SUBJECT_MAX];
            if (swt_subject_router(subj, sizeof(subj), send[i]) != SW_OK ||
                swt_subject_live_reply(reply, sizeof(reply), ing->instance_id, send[i]) != SW_OK)
                continue;
            (void)swt_publish(ing->conn, subj, reply, NULL, 0);
        }
        for (size_t i = 0; i < nlost; i++)
            ing_cancel_frontend(ing, lost[i], "did not answer two probes");
    }
    free(vec.v);
    free(send);
    free(lost);
    return NULL;
}

/* ---------------------------------------------------------------- lifecycle */

void
sw_ingress_opts_init(sw_ingress_opts *o)
{
    if (o == NULL)
        return;
    memset(o, 0, sizeof(*o));
    o->max_inflight = 64;
    o->handler_threads = 4;
    o->send_timeout_ms = 30000;
    o->max_window = 1024;
    o->frontend_probe_ms = 250;
    o->frontend_timeout_ms = 1000;
}

static sw_err
ing_subscribe(sw_ingress *ing, swt_sub **sub, const char *subj, swt_msg_fn cb)
{
    return swt_subscribe(ing->conn, sub, subj, cb, ing);
}

static void ing_stop(sw_ingress *ing);

sw_err
sw_ingress_start(sw_ingress **out, sw_conn *conn, const sw_ingress_opts *o)
{
    sw_ingress *ing;
    sw_err rv;
    const char *drop;

    if (out == NULL || conn == NULL || o == NULL || o->handler == NULL)
        return SW_EINVAL;
    *out = NULL;
    if (sw_validate_endpoint(o->endpoint) != SW_OK)
        return SW_EINVAL;
    if (o->instance_id != NULL && sw_validate_token(o->instance_id) != SW_OK)
        return SW_EINVAL;
    if ((rv = swi_init()) != SW_OK)
        return rv;
    if (o->coalesce_us < 0 && o->coalesce_us != SW_COALESCE_OFF)
        return SW_EINVAL;
    if ((ing = calloc(1, sizeof(*ing))) == NULL)
        return SW_ENOMEM;
    atomic_init(&ing->refs, 1);
    ing->conn = conn;
    ing->log.fn = o->log;
    ing->log.arg = o->log_arg;
    snprintf(ing->endpoint, sizeof(ing->endpoint), "%s", o->endpoint);
    if (o->instance_id != NULL)
        snprintf(ing->instance_id, sizeof(ing->instance_id), "%s", o->instance_id);
    else
        swi_random_token(ing->instance_id);
    ing->handler = o->handler;
    ing->handler_arg = o->handler_arg;
    ing->max_inflight = o->max_inflight ? o->max_inflight : 64;
    ing->nthreads = o->handler_threads ? o->handler_threads : 4;
    ing->send_timeout_ms = o->send_timeout_ms ? o->send_timeout_ms : 30000;
    ing->max_window = o->max_window ? o->max_window : 1024;
    ing->hot_us = o->coalesce_us == SW_COALESCE_OFF ? 0 : o->coalesce_us ? o->coalesce_us : SWI_HOT_US;
    ing->probe_ms = o->frontend_probe_ms ? o->frontend_probe_ms : 250;
    ing->probe_timeout_ms = o->frontend_timeout_ms ? o->frontend_timeout_ms : 1000;
    ing->max_req = o->max_request_bytes ? o->max_request_bytes : sw_conn_max_payload(conn);
    if (ing->max_req == 0)
        ing->max_req = 1024 * 1024;
    if ((drop = getenv("SW_TEST_DROP_RATE")) != NULL)
        swi_ingress_set_drop_rate(ing, atof(drop));
    pthread_mutex_init(&ing->mu, NULL);
    pthread_mutex_init(&ing->live_mu, NULL);
    pthread_mutex_init(&ing->smu, NULL);
    pthread_cond_init(&ing->scv, NULL);
    swi_cond_init(&ing->cv);
    swi_cond_init(&ing->tick_cv);
    if (swi_idmap_init(&ing->streams, 64) != 0 ||
        (ing->threads = calloc(ing->nthreads, sizeof(pthread_t))) == NULL) {
        rv = SW_ENOMEM;
        goto fail;
    }
    if (swt_subject_request(ing->req_subj, sizeof(ing->req_subj), ing->endpoint,
                            ing->instance_id) != SW_OK ||
        swt_subject_control(ing->ctl_subj, sizeof(ing->ctl_subj), ing->instance_id) != SW_OK) {
        rv = SW_EINVAL;
        goto fail;
    }
    for (unsigned i = 0; i < ing->nthreads; i++) {
        if (pthread_create(&ing->threads[i], NULL, ing_worker_main, ing) != 0) {
            rv = SW_ENOMEM;
            goto fail;
        }
        ing->started_threads++;
    }
    if (pthread_create(&ing->timer, NULL, ing_timer_main, ing) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    ing->timer_started = 1;
    if (pthread_create(&ing->live, NULL, ing_live_main, ing) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    ing->live_started = 1;
    ing->sender_on = 1;
    if (pthread_create(&ing->sender, NULL, ing_sender_main, ing) != 0) {
        ing->sender_on = 0;
        rv = SW_ENOMEM;
        goto fail;
    }
    {
        char lv[SWT_SUBJECT_MAX];
        (void)swt_subject_live_reply(lv, sizeof(lv), ing->instance_id, NULL);
        if ((rv = ing_subscribe(ing, &ing->live_sub, lv, ing_on_live_reply)) != SW_OK)
            goto fail;
    }
    if ((rv = ing_subscribe(ing, &ing->ctl_sub, ing->ctl_subj, ing_on_control)) != SW_OK ||
        (rv = ing_subscribe(ing, &ing->req_sub, ing->req_subj, ing_on_request)) != SW_OK)
        goto fail;
    /* Make sure the server has the interest before anyone is told we exist. */
    (void)swt_flush(conn, 5000);
    swi_log(&ing->log, SW_LOG_INFO, "serving %s as instance %s on %s", ing->endpoint,
            ing->instance_id, ing->req_subj);
    *out = ing;
    return SW_OK;
fail:
    ing_stop(ing);
    ing_unref(ing);
    return rv;
}

sw_err
sw_ingress_drain(sw_ingress *ing, int64_t grace_ms)
{
    swi_ptrvec vec = {NULL, 0, 0};
    int64_t until;
    sw_err rv = SW_OK;

    if (ing == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&ing->mu);
    ing->draining = 1;
    pthread_mutex_unlock(&ing->mu);
    swt_sub_close(ing->conn, &ing->req_sub);
    until = swi_now_ms() + (grace_ms > 0 ? grace_ms : 0);
    pthread_mutex_lock(&ing->mu);
    while (ing->inflight > 0 && swi_now_ms() < until)
        swi_cond_wait_until(&ing->cv, &ing->mu, until);
    if (ing->inflight > 0)
        rv = SW_ETIMEDOUT;
    pthread_mutex_unlock(&ing->mu);
    if (rv == SW_OK)
        return SW_OK;
    /* Out of time: end what is left. The frontend sees instance_lost. */
    ing_snapshot(ing, &vec, NULL);
    for (size_t i = 0; i < vec.n; i++) {
        sw_responder *r = RESP_AT(vec, i);
        int newly = 0;
        pthread_mutex_lock(&r->mu);
        if (!r->terminated) {
            newly = !r->cancelled;
            r->cancelled = 1;
            (void)resp_send_failed(r, SW_INSTANCE_LOST, NULL, "the worker is shutting down");
        }
        pthread_mutex_unlock(&r->mu);
        if (newly)
            resp_fire_cancel(r);
        resp_unref(r);
    }
    free(vec.v);
    return rv;
}

/* Stops threads and subscriptions; safe on a half-built ingress. */
static void
ing_stop(sw_ingress *ing)
{
    swt_sub_close(ing->conn, &ing->req_sub);
    swt_sub_close(ing->conn, &ing->ctl_sub);
    swt_sub_close(ing->conn, &ing->live_sub);
    pthread_mutex_lock(&ing->mu);
    ing->stopping = 1;
    pthread_cond_broadcast(&ing->cv);
    pthread_cond_broadcast(&ing->tick_cv);
    pthread_mutex_unlock(&ing->mu);
    for (unsigned i = 0; i < ing->started_threads; i++)
        pthread_join(ing->threads[i], NULL);
    ing->started_threads = 0;
    if (ing->timer_started) {
        pthread_join(ing->timer, NULL);
        ing->timer_started = 0;
    }
    if (ing->live_started) {
        pthread_join(ing->live, NULL);
        ing->live_started = 0;
    }
    /* Last: it publishes what the others queued (finals included), then
     * quits; from then on every stream publishes inline. */
    pthread_mutex_lock(&ing->smu);
    if (ing->sender_on) {
        ing->sender_stop = 1;
        pthread_cond_signal(&ing->scv);
        pthread_mutex_unlock(&ing->smu);
        pthread_join(ing->sender, NULL);
    } else {
        pthread_mutex_unlock(&ing->smu);
    }
}

void
sw_ingress_destroy(sw_ingress *ing)
{
    swi_ptrvec vec = {NULL, 0, 0};
    if (ing == NULL)
        return;
    (void)sw_ingress_drain(ing, 0);
    ing_stop(ing);
    /* Requests still queued never reached a handler: drop their hold. */
    for (;;) {
        sw_responder *r;
        pthread_mutex_lock(&ing->mu);
        r = ing->q_head;
        if (r != NULL) {
            ing->q_head = r->qnext;
            if (ing->q_head == NULL)
                ing->q_tail = NULL;
        }
        pthread_mutex_unlock(&ing->mu);
        if (r == NULL)
            break;
        resp_drop_hold(r, "handler_returned", "shutting down");
    }
    /* Every responder still alive, registered or not (a retained one whose
     * final was acknowledged is no longer registered): closed from now on. */
    pthread_mutex_lock(&ing->mu);
    for (sw_responder *r = ing->all; r != NULL; r = r->all_next)
        vec.cap++;
    vec.v = calloc(vec.cap ? vec.cap : 1, sizeof(*vec.v));
    for (sw_responder *r = ing->all; vec.v != NULL && r != NULL; r = r->all_next)
        if (resp_tryref(r))
            vec.v[vec.n++] = r;
    pthread_mutex_unlock(&ing->mu);
    for (size_t i = 0; i < vec.n; i++) {
        sw_responder *r = RESP_AT(vec, i);
        pthread_mutex_lock(&r->mu);
        r->closed = 1;
        pthread_cond_broadcast(&r->cv);
        /* A thread publishing r's items (mu dropped) finishes before the
         * caller may close the connection. */
        while (r->sending)
            (void)swi_cond_wait_until(&r->cv, &r->mu, swi_now_ms() + 100);
        pthread_mutex_unlock(&r->mu);
        unregister_stream(r);
        resp_unref(r);
    }
    free(vec.v);
    swi_log(&ing->log, SW_LOG_INFO, "instance %s stopped", ing->instance_id);
    ing_unref(ing);
}

const char *
sw_ingress_instance_id(const sw_ingress *ing)
{
    return ing ? ing->instance_id : "";
}

const char *
sw_ingress_endpoint(const sw_ingress *ing)
{
    return ing ? ing->endpoint : "";
}

const char *
sw_ingress_request_subject(const sw_ingress *ing)
{
    return ing ? ing->req_subj : "";
}

const char *
sw_ingress_control_subject(const sw_ingress *ing)
{
    return ing ? ing->ctl_subj : "";
}

void
sw_ingress_stats_get(sw_ingress *ing, sw_ingress_stats *out)
{
    if (ing == NULL || out == NULL)
        return;
    pthread_mutex_lock(&ing->mu);
    *out = ing->st;
    out->streams_held = ing->streams.live;
    pthread_mutex_unlock(&ing->mu);
}
