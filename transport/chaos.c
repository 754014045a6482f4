/* transport/chaos.c -- the test hooks of transport/chaos.h (SW_CHAOS):
 * never in the shipped libraries. */
#ifndef SW_CHAOS
#error "transport/chaos.c is for the chaos build only"
#endif

#include "transport/chaos.h"
#include "transport/conn_int.h"

void
swx_conn_fail_sub_complete(sw_conn *c, int n)
{
    if (c != NULL)
        __atomic_store_n(&c->chaos_no_complete, n, __ATOMIC_RELEASE);
}
