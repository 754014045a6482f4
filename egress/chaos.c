/* egress/chaos.c -- the test hooks of egress/chaos.h (SW_CHAOS): never in
 * the shipped libraries. */
#ifndef SW_CHAOS
#error "egress/chaos.c is for the chaos build only"
#endif

#include "egress/chaos.h"
#include "egress/egress_int.h"

void
swx_router_on_credit(sw_router *r, void (*fn)(sw_stream *s, void *arg), void *arg)
{
    if (r == NULL)
        return;
    r->credit_hook_arg = arg;
    r->credit_hook = fn;
}

void
swx_router_on_open_sent(sw_router *r, void (*fn)(sw_stream *s, void *arg), void *arg)
{
    if (r == NULL)
        return;
    r->open_hook_arg = arg;
    r->open_hook = fn;
}

void
swx_router_on_reroute(sw_router *r, void (*fn)(sw_stream *s, void *arg), void *arg)
{
    if (r == NULL)
        return;
    r->reroute_hook_arg = arg;
    r->reroute_hook = fn;
}

uint64_t
swx_router_ticks(sw_router *r)
{
    return r ? __atomic_load_n(&r->ticks, __ATOMIC_RELAXED) : 0;
}

void
swx_stream_id(sw_stream *s, uint8_t out[16])
{
    pthread_mutex_lock(&s->mu);
    memcpy(out, s->id, SW_REQUEST_ID_BYTES);
    pthread_mutex_unlock(&s->mu);
}

/* Feeds in to s as the mux does, with the reference its lookup would hold. */
static void
feed(sw_stream *s, const uint8_t id[16], const swe_rx_in *in)
{
    swe_stream_ref(s);
    swe_stream_on_item(s, id, in);
    swe_stream_unref(s);
}

void
swx_stream_feed(sw_stream *s, const uint8_t id[16], uint64_t seq, const char *data)
{
    swe_rx_in in;
    memset(&in, 0, sizeof(in));
    in.kind = SWE_IN_DATA;
    in.seq = seq;
    in.data = (const uint8_t *)data;
    in.len = strlen(data);
    in.event = "";
    feed(s, id, &in);
}

void
swx_stream_feed_final(sw_stream *s, const uint8_t id[16], uint64_t seq, sw_status status,
                      const char *reason)
{
    swe_rx_in in;
    memset(&in, 0, sizeof(in));
    in.kind = SWE_IN_FINAL;
    in.seq = seq;
    in.status = status;
    in.reason = reason;
    in.message = "";
    feed(s, id, &in);
}

void
swx_router_on_dispatch(sw_router *r, void (*fn)(sw_stream *s, void *arg), void *arg)
{
    if (r == NULL)
        return;
    r->dispatch_hook_arg = arg;
    r->dispatch_hook = fn;
}
