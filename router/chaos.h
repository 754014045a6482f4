/* router/chaos.h -- test hooks of the router layer, for the chaos build
 * only (see ingress/chaos.h): they exist in the internal archive
 * sw_internal, which the tests link, and not in the shipped libstreamwire. */
#ifndef SW_ROUTER_CHAOS_H
#define SW_ROUTER_CHAOS_H

#ifndef SW_CHAOS
#error "router/chaos.h is for the chaos build only (link sw_internal, which defines SW_CHAOS)"
#endif

#include <stdint.h>

#include <streamwire/registry.h>

/* Test-only: how many times reg's ticker has run (a resting registry's
 * stays put: router/registry_lease.c). 0 for NULL. */
uint64_t swx_registry_ticks(sw_registry *reg);

/* Test-only: fn(arg) runs inside every swr_pool_create with a registry,
 * between its first list and the seeding of its table from it (NULL: none). */
void swx_pool_on_seed(void (*fn)(void *arg), void *arg);

#endif
