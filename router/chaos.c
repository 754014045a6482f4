/* router/chaos.c -- the test hooks of router/chaos.h (SW_CHAOS): never in
 * the shipped libraries. */
#ifndef SW_CHAOS
#error "router/chaos.c is for the chaos build only"
#endif

#include "router/chaos.h"
#include "router/registry_int.h"

uint64_t
swx_registry_ticks(sw_registry *reg)
{
    return reg ? __atomic_load_n(&reg->ticks, __ATOMIC_RELAXED) : 0;
}
