/* ingress/chaos.c -- the fault-injection hooks of ingress/chaos.h, for the
 * tests and the CLI's demo worker. Compiled only in the chaos build
 * (SW_CHAOS): never in the shipped libraries.
 *
 * Threads: the caller's. Locks: r->mu, as the responder API. */
#ifndef SW_CHAOS
#error "ingress/chaos.c is compiled in the chaos build only"
#endif

#include <stdlib.h>

#include "ingress/ingress_int.h"
#include "ingress/chaos.h"

static const swn_sent swn_sent_none = {0, 0, 0, 0};

sw_err
swx_responder_publish_raw(sw_responder *r, const void *bytes, size_t len)
{
    sw_err rv;
    if (r == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&r->mu);
    swn_resp_flush_now(r);
    rv = r->closed ? SW_ECLOSED : swn_resp_publish(r, bytes, len, &swn_sent_none);
    pthread_mutex_unlock(&r->mu);
    return rv;
}

void
swx_responder_lose_next(sw_responder *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->lose_next = 1;
    pthread_mutex_unlock(&r->mu);
}

void
swx_responder_fail_builds(sw_responder *r, int n)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->fail_builds = n > 0 ? n : 0;
    pthread_mutex_unlock(&r->mu);
}

void
swx_responder_fail_final_keep(sw_responder *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->fail_final_keep = 1;
    pthread_mutex_unlock(&r->mu);
}

sw_err
swx_responder_skip_seq(sw_responder *r)
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
            swn_resp_kick(r); /* covers the number; nothing to publish for it */
    }
    pthread_mutex_unlock(&r->mu);
    return rv;
}

void
swx_responder_abandon(sw_responder *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    swn_resp_flush_now(r); /* what was sent before goes out; nothing after */
    if (!r->terminated)
        swn_resp_mark_terminated(r);
    pthread_mutex_unlock(&r->mu);
    swn_unregister_stream(r);
}

sw_err
swx_responder_send_after_final(sw_responder *r, const void *data, size_t len)
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
    swn_resp_flush_now(r);
    blen = swp_data_body_size(r->rg.next_seq, len, 0, 0);
    if ((buf = malloc(blen)) == NULL) {
        pthread_mutex_unlock(&r->mu);
        return SW_ENOMEM;
    }
    (void)swp_data_body_write(buf, r->rg.next_seq, data, len, 0, NULL, 0);
    rv =
        r->closed ? SW_ECLOSED : swn_resp_publish_one(r, r->rg.next_seq, buf, blen, &swn_sent_none);
    r->rg.next_seq++;
    r->rg.pub_seq = r->rg.next_seq - 1;
    free(buf);
    pthread_mutex_unlock(&r->mu);
    return rv;
}

void
swx_ingress_drop_cancels(sw_ingress *ing, int n)
{
    if (ing != NULL)
        __atomic_store_n(&ing->drop_cancels, n, __ATOMIC_RELEASE);
}

int
swn_chaos_drop_cancel(sw_ingress *ing)
{
    int n = __atomic_load_n(&ing->drop_cancels, __ATOMIC_ACQUIRE);
    while (n > 0 && !__atomic_compare_exchange_n(&ing->drop_cancels, &n, n - 1, 0, __ATOMIC_ACQ_REL,
                                                 __ATOMIC_ACQUIRE)) {
    }
    return n > 0;
}

void
swx_ingress_drop_beats(sw_ingress *ing, int on)
{
    if (ing != NULL)
        __atomic_store_n(&ing->drop_beats, on != 0, __ATOMIC_RELAXED);
}

void
swx_ingress_drop_stream_probes(sw_ingress *ing, int on)
{
    if (ing != NULL)
        __atomic_store_n(&ing->drop_stream_probes, on != 0, __ATOMIC_RELAXED);
}

void
swx_ingress_probe_seq_ahead(sw_ingress *ing, uint64_t n)
{
    if (ing != NULL)
        __atomic_store_n(&ing->probe_seq_ahead, n, __ATOMIC_RELAXED);
}

void
swx_ingress_hold_sender(sw_ingress *ing, int hold)
{
    if (ing == NULL)
        return;
    pthread_mutex_lock(&ing->smu);
    ing->sender_hold = hold != 0;
    pthread_cond_signal(&ing->scv);
    pthread_mutex_unlock(&ing->smu);
}

void
swx_ingress_send_counts(sw_ingress *ing, uint64_t *handoffs, uint64_t *timer_releases)
{
    if (handoffs != NULL)
        *handoffs = ing ? __atomic_load_n(&ing->handoffs, __ATOMIC_RELAXED) : 0;
    if (timer_releases != NULL)
        *timer_releases = ing ? __atomic_load_n(&ing->timer_releases, __ATOMIC_RELAXED) : 0;
}

void
swx_ingress_tick_counts(sw_ingress *ing, uint64_t *timer, uint64_t *live)
{
    if (timer != NULL)
        *timer = ing ? __atomic_load_n(&ing->timer_ticks, __ATOMIC_RELAXED) : 0;
    if (live != NULL)
        *live = ing ? __atomic_load_n(&ing->live_ticks, __ATOMIC_RELAXED) : 0;
}

size_t
swx_ingress_batch_bytes(sw_ingress *ing)
{
    return ing != NULL ? ing->batch_bytes : 0;
}

void
swx_ingress_set_hold_us(sw_ingress *ing, int64_t us)
{
    if (ing != NULL)
        __atomic_store_n(&ing->hold_us, us < 0 ? 0 : us, __ATOMIC_RELAXED);
}

void
swx_ingress_set_drop_rate(sw_ingress *ing, double rate)
{
    if (ing != NULL)
        ing->drop_rate = rate < 0 ? 0 : rate > 1 ? 1 : rate;
}

size_t
swx_ingress_frontends(sw_ingress *ing, const char *router_id, unsigned *users)
{
    size_t n;
    pthread_mutex_lock(&ing->live_mu);
    n = ing->peers.n;
    if (users != NULL)
        *users = 0;
    if (users != NULL && router_id != NULL) {
        const swi_peer *e = swi_peers_find(&ing->peers, router_id);
        *users = e != NULL ? e->users : 0;
    }
    pthread_mutex_unlock(&ing->live_mu);
    return n;
}

size_t
swx_ingress_early_cancels(sw_ingress *ing)
{
    size_t n;
    pthread_mutex_lock(&ing->mu);
    n = ing->early.map.live;
    pthread_mutex_unlock(&ing->mu);
    return n;
}

uint64_t
swx_ingress_request_bytes(sw_ingress *ing)
{
    return __atomic_load_n(&ing->req_bytes, __ATOMIC_RELAXED);
}

void
swx_ingress_on_frontend_gone(sw_ingress *ing, swx_ingress_gone_fn fn, void *arg)
{
    pthread_mutex_lock(&ing->live_mu);
    ing->gone_fn = fn;
    ing->gone_arg = arg;
    pthread_mutex_unlock(&ing->live_mu);
}

static pthread_mutex_t g_subscribed_mu = PTHREAD_MUTEX_INITIALIZER;
static swx_ingress_subscribed_fn g_subscribed_fn;
static void *g_subscribed_arg;

void
swx_ingress_on_subscribed(swx_ingress_subscribed_fn fn, void *arg)
{
    pthread_mutex_lock(&g_subscribed_mu);
    g_subscribed_fn = fn;
    g_subscribed_arg = arg;
    pthread_mutex_unlock(&g_subscribed_mu);
}

void
swn_chaos_subscribed(sw_ingress *ing)
{
    swx_ingress_subscribed_fn fn;
    void *arg;
    pthread_mutex_lock(&g_subscribed_mu);
    fn = g_subscribed_fn;
    arg = g_subscribed_arg;
    pthread_mutex_unlock(&g_subscribed_mu);
    if (fn != NULL)
        fn(ing->conn, ing->req_subj, arg);
}
