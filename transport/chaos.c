/* transport/chaos.c -- the test hooks of transport/chaos.h (SW_CHAOS):
 * never in the shipped libraries. */
#ifndef SW_CHAOS
#error "transport/chaos.c is for the chaos build only"
#endif

#include <string.h>

#include "common/sw_common.h"
#include "transport/chaos.h"
#include "transport/conn_int.h"

void
swx_conn_fail_sub_complete(sw_conn *c, int n)
{
    if (c != NULL)
        __atomic_store_n(&c->chaos_no_complete, n, __ATOMIC_RELEASE);
}

void
swx_conn_fail_publishes(sw_conn *c, const char *prefix, int n, int nats_status)
{
    if (c == NULL)
        return;
    swi_strlcpy(c->chaos_fail_prefix, prefix ? prefix : "", sizeof(c->chaos_fail_prefix));
    c->chaos_fail_status = nats_status;
    __atomic_store_n(&c->chaos_fail_pubs, n, __ATOMIC_RELEASE);
}

int
swx_conn_publishes_to_fail(sw_conn *c)
{
    return c ? __atomic_load_n(&c->chaos_fail_pubs, __ATOMIC_ACQUIRE) : 0;
}

int
swt_chaos_fail_publish(sw_conn *c, const char *subj)
{
    int n = __atomic_load_n(&c->chaos_fail_pubs, __ATOMIC_ACQUIRE);
    if (n <= 0 || strncmp(subj, c->chaos_fail_prefix, strlen(c->chaos_fail_prefix)) != 0)
        return 0;
    while (n > 0 && !__atomic_compare_exchange_n(&c->chaos_fail_pubs, &n, n - 1, 0,
                                                 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return n > 0 ? c->chaos_fail_status : 0;
}
