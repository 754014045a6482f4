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

uint64_t
swx_router_ticks(sw_router *r)
{
    return r ? __atomic_load_n(&r->ticks, __ATOMIC_RELAXED) : 0;
}
