/* bench/stages.c -- streamwire-bench: where an item's latency goes, in the
 * latency scenario (3). Each item's time from its stamp to the consumer's
 * callback is split into
 *
 *   send     the sender's time from the stamp to nats.c's publish;
 *   receive  the receiver's from nats.c's callback to the consumer's
 *            (streamwire; raw's callback is the consumer's: 0);
 *   publish  the nats.c publish call (a socket write with send-asap);
 *   wire     from the publish's return to nats.c's callback at the
 *            receiver: the server and two thread wake-ups, the same code on
 *            both sides.
 *
 * Streamwire's times come from the transport's timing taps
 * (swt_conn_set_tap): the one place the bench reaches past the public API.
 * An item is recognised at each tap by its stamp (the payload's first 8
 * bytes, at the end of the message); one it cannot match (a message that
 * went through the sender thread, a batch) has no breakdown and is left
 * out of it, and the rows say how many items they cover.
 *
 * Threads: the worker's handler (or raw's publisher) thread records the
 * publish times; the receiving nats.c thread records the rest. The publish
 * times reach the receiver through NATS (relaxed atomics on the arrays).
 * One armed stream at a time (the scenario runs them one by one). */
#include "bench.h"

#include "transport/sw_transport.h"

static struct {
    int on;                       /* armed (atomic) */
    size_t size;                  /* the items' size: the stamp is len - size into a message */
    unsigned long n;              /* items of the armed stream */
    int64_t *pub_begin, *pub_end; /* by item index (atomic access); kept from one arming to the
                                     next, never freed: a publisher may still be in its tap */
    unsigned long cap;
    stage_times *out;
    sw_conn *tapped[2];
} g_st;

/* the item this thread is about to publish (-1: none) and its stamp */
static _Thread_local long tl_item = -1;
static _Thread_local int64_t tl_stamp;
/* the last message the receiving thread was handed: when, and its stamp */
static _Thread_local int64_t tl_rx_ns, tl_rx_stamp;

/* The stamp of an item of g_st.size bytes at the end of a message, or -1. */
static int64_t
msg_stamp(const uint8_t *data, size_t len)
{
    int64_t t;
    if (data == NULL || g_st.size < 8 || len < g_st.size)
        return -1;
    memcpy(&t, data + len - g_st.size, 8);
    return t;
}

static void
stages_tap(void *arg, swt_tap_point at, const uint8_t *data, size_t len)
{
    (void)arg;
    if (at == SWT_TAP_RX) {
        tl_rx_ns = now_ns();
        tl_rx_stamp = msg_stamp(data, len);
        return;
    }
    if (tl_item < 0 || msg_stamp(data, len) != tl_stamp)
        return; /* not the item this thread is sending (a heartbeat, a grant, ...) */
    __atomic_store_n(at == SWT_TAP_PUB_BEGIN ? &g_st.pub_begin[tl_item] : &g_st.pub_end[tl_item],
                     now_ns(), __ATOMIC_RELAXED);
    if (at == SWT_TAP_PUB_END)
        tl_item = -1;
}

void
stages_arm(stage_times *out, unsigned long n, size_t size, sw_conn *pub, sw_conn *rx)
{
    if (n > g_st.cap) { /* (the scenario's segments are all the same size: once) */
        int64_t *b = calloc(n, sizeof(int64_t)), *e = calloc(n, sizeof(int64_t));
        if (b == NULL || e == NULL)
            die("out of memory");
        g_st.pub_begin = b; /* the smaller ones are left to a late tap: a few KB, once */
        g_st.pub_end = e;
        g_st.cap = n;
    }
    for (unsigned long i = 0; i < n; i++) {
        out->send[i] = out->recv[i] = out->pub[i] = out->wire[i] = -1;
        g_st.pub_begin[i] = g_st.pub_end[i] = -1;
    }
    g_st.n = n;
    g_st.size = size;
    g_st.out = out;
    g_st.tapped[0] = pub;
    g_st.tapped[1] = rx;
    for (int k = 0; k < 2; k++)
        if (g_st.tapped[k] != NULL)
            swt_conn_set_tap(g_st.tapped[k], stages_tap, NULL);
    __atomic_store_n(&g_st.on, 1, __ATOMIC_RELEASE);
}

void
stages_disarm(void)
{
    if (!__atomic_load_n(&g_st.on, __ATOMIC_ACQUIRE))
        return;
    __atomic_store_n(&g_st.on, 0, __ATOMIC_RELEASE);
    for (int k = 0; k < 2; k++)
        if (g_st.tapped[k] != NULL)
            swt_conn_set_tap(g_st.tapped[k], NULL, NULL);
    /* a publisher may still be in its tap (its last item was received
     * before its publish returned): the arrays stay */
    g_st.out = NULL;
    g_st.tapped[0] = g_st.tapped[1] = NULL;
}

void
stages_sending(unsigned long i, const uint8_t *buf)
{
    if (!__atomic_load_n(&g_st.on, __ATOMIC_ACQUIRE) || i >= g_st.n)
        return;
    tl_item = (long)i;
    memcpy(&tl_stamp, buf, 8);
}

void
stages_raw_published(unsigned long i, int64_t begin, int64_t end)
{
    if (!__atomic_load_n(&g_st.on, __ATOMIC_ACQUIRE) || i >= g_st.n)
        return;
    __atomic_store_n(&g_st.pub_begin[i], begin, __ATOMIC_RELAXED);
    __atomic_store_n(&g_st.pub_end[i], end, __ATOMIC_RELAXED);
}

void
stages_received(unsigned long i, const void *data, size_t len, int64_t now, int via_library)
{
    int64_t stamp, b, e, rx;
    if (!__atomic_load_n(&g_st.on, __ATOMIC_ACQUIRE) || i >= g_st.n || len < 8)
        return;
    memcpy(&stamp, data, 8);
    b = __atomic_load_n(&g_st.pub_begin[i], __ATOMIC_RELAXED);
    e = __atomic_load_n(&g_st.pub_end[i], __ATOMIC_RELAXED);
    rx = via_library ? tl_rx_ns : now; /* raw: nats.c's callback is the consumer's */
    if (b < 0 || e < b || rx < e || (via_library && tl_rx_stamp != stamp))
        return; /* not matched at every point (or received before its publish
                   returned): no breakdown for this item */
    g_st.out->send[i] = b - stamp;
    g_st.out->recv[i] = now - rx;
    g_st.out->pub[i] = e - b;
    g_st.out->wire[i] = rx - e;
}
