/* router/chaos.c -- the test hooks of router/chaos.h (SW_CHAOS): never in
 * the shipped libraries. */
#ifndef SW_CHAOS
#error "router/chaos.c is for the chaos build only"
#endif

#include "router/chaos.h"
#include "router/registry_int.h"

void (*swx_pool_seed_fn)(void *arg);
void *swx_pool_seed_arg;

void
swx_pool_on_seed(void (*fn)(void *arg), void *arg)
{
    swx_pool_seed_arg = arg;
    swx_pool_seed_fn = fn;
}

uint64_t
swx_registry_ticks(sw_registry *reg)
{
    return reg ? __atomic_load_n(&reg->ticks, __ATOMIC_RELAXED) : 0;
}
