/* bench/stages.c -- streamwire-bench: where an item's latency goes, in the
 * latency scenario (3). Each item's time from its stamp to the consumer's
 * callback is split into
 *
 *   send     the sender's time from the stamp to nats.c's publish;
 *   publish  the nats.c publish call (a socket write with send-asap);
 *   wire     from the publish's return to nats.c's callback at the
 *            receiver: the server and two thread wake-ups, the same code on
 *            both sides;
 *   receive  the receiver's from nats.c's callback to the consumer's
 *            (streamwire; raw's callback is the consumer's: 0).
 *
 * Streamwire's times come from the transport's timing taps
 * (swt_conn_set_tap): the one place the bench reaches past the public API.
 * An item is recognised at each tap by its stamp (the payload's first 8
 * bytes, which end the message: a bench item is neither droppable nor an
 * event). The publisher records, by item index, the stamp it sent and its
 * publish's begin and end; the consumer records the stamp it got, when
 * nats.c handed over the message that carried it, and when the consumer
 * saw it. The parts are worked out at stages_disarm, after the run, so an
 * item received before its publish returned is counted too. An item
 * without a timed publish (streamwire's sender thread published it: the
 * handler sent it within coalesce_us of the previous publish) or whose
 * stamps do not agree at every point (a lost message shifts the indexes;
 * an item published with others carries another's stamp at the message's
 * end) has no breakdown, and the rows say how many items they cover. A sealed connection's taps see
 * ciphertext: no breakdown at all (the latency scenario does not seal).
 *
 * Threads: the worker's handler (or raw's publisher) thread records the
 * publish; the receiving nats.c thread records the receipt; the main
 * thread arms and, once the run is over, disarms and works out the parts.
 * Every array slot is accessed atomically: a run given up on a stall may
 * leave a thread that still records into them. */
#include "bench.h"

#include "transport/sw_transport.h"

/* Per item index; kept from one arming to the next and never freed (a
 * thread of a run given up on a stall may still write into them). */
typedef struct stage_slots {
    int64_t *pub_stamp, *pub_begin, *pub_end; /* the publisher's */
    int64_t *rx_stamp, *rx_ns, *cb_ns;        /* the consumer's */
} stage_slots;

static struct {
    int on;      /* armed (atomic) */
    size_t size; /* the items' size: the stamp is len - size into a message (atomic) */
    unsigned long n, cap;
    stage_slots sl;
    stage_times *out;
    sw_conn *tapped[2];
} g_st;

/* the item this thread is about to publish (-1: none) and its stamp */
static _Thread_local long tl_item = -1;
static _Thread_local int64_t tl_stamp;
/* the last message the receiving thread was handed: when, and its stamp */
static _Thread_local int64_t tl_rx_ns, tl_rx_stamp;

static void
slot_set(int64_t *v, unsigned long i, int64_t x)
{
    __atomic_store_n(&v[i], x, __ATOMIC_RELAXED);
}

static int64_t
slot_get(const int64_t *v, unsigned long i)
{
    return __atomic_load_n(&v[i], __ATOMIC_RELAXED);
}

/* The stamp of an item of g_st.size bytes at the end of a message, or -1. */
static int64_t
msg_stamp(const uint8_t *data, size_t len)
{
    size_t size = __atomic_load_n(&g_st.size, __ATOMIC_RELAXED);
    int64_t t;
    if (data == NULL || size < 8 || len < size)
        return -1;
    memcpy(&t, data + len - size, 8);
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
    if (at == SWT_TAP_PUB_BEGIN) {
        slot_set(g_st.sl.pub_stamp, (unsigned long)tl_item, tl_stamp);
        slot_set(g_st.sl.pub_begin, (unsigned long)tl_item, now_ns());
    } else {
        slot_set(g_st.sl.pub_end, (unsigned long)tl_item, now_ns());
        tl_item = -1;
    }
}

static int64_t *
slots_alloc(unsigned long n)
{
    int64_t *v = calloc(n, sizeof(int64_t));
    if (v == NULL)
        die("out of memory");
    return v;
}

void
stages_arm(stage_times *out, unsigned long n, size_t size, sw_conn *pub, sw_conn *rx)
{
    stage_slots *s = &g_st.sl;
    if (n > g_st.cap) { /* (the scenario's segments are all the same size: once) */
        s->pub_stamp = slots_alloc(n);
        s->pub_begin = slots_alloc(n);
        s->pub_end = slots_alloc(n);
        s->rx_stamp = slots_alloc(n);
        s->rx_ns = slots_alloc(n);
        s->cb_ns = slots_alloc(n);
        g_st.cap = n; /* the smaller ones are left to a late thread: a few KB, once */
    }
    for (unsigned long i = 0; i < n; i++) {
        slot_set(s->pub_stamp, i, -1);
        slot_set(s->pub_begin, i, -1);
        slot_set(s->pub_end, i, -1);
        slot_set(s->rx_stamp, i, -1);
        slot_set(s->rx_ns, i, -1);
        slot_set(s->cb_ns, i, -1);
    }
    g_st.n = n;
    __atomic_store_n(&g_st.size, size, __ATOMIC_RELAXED);
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
    const stage_slots *s = &g_st.sl;
    stage_times *out = g_st.out;
    if (!__atomic_load_n(&g_st.on, __ATOMIC_ACQUIRE))
        return;
    __atomic_store_n(&g_st.on, 0, __ATOMIC_RELEASE);
    for (int k = 0; k < 2; k++)
        if (g_st.tapped[k] != NULL)
            swt_conn_set_tap(g_st.tapped[k], NULL, NULL);
    for (unsigned long i = 0; i < g_st.n; i++) {
        int64_t stamp = slot_get(s->rx_stamp, i), b = slot_get(s->pub_begin, i);
        int64_t e = slot_get(s->pub_end, i), rx = slot_get(s->rx_ns, i);
        int64_t cb = slot_get(s->cb_ns, i);
        out->send[i] = out->recv[i] = out->pub[i] = out->wire[i] = STAGE_NONE;
        if (stamp < 0 || slot_get(s->pub_stamp, i) != stamp || b < stamp || e < b || rx < 0 ||
            cb < rx)
            continue; /* not the same item at every point: no breakdown */
        out->send[i] = b - stamp;
        out->pub[i] = e - b;
        out->wire[i] = rx - e; /* (< 0: received before the publish returned) */
        out->recv[i] = cb - rx;
    }
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
stages_raw_published(unsigned long i, const uint8_t *buf, int64_t begin, int64_t end)
{
    int64_t stamp;
    if (!__atomic_load_n(&g_st.on, __ATOMIC_ACQUIRE) || i >= g_st.n)
        return;
    memcpy(&stamp, buf, 8);
    slot_set(g_st.sl.pub_stamp, i, stamp);
    slot_set(g_st.sl.pub_begin, i, begin);
    slot_set(g_st.sl.pub_end, i, end);
}

void
stages_received(unsigned long i, const void *data, size_t len, int64_t now, int via_library)
{
    int64_t stamp;
    if (!__atomic_load_n(&g_st.on, __ATOMIC_ACQUIRE) || i >= g_st.n || len < 8)
        return;
    memcpy(&stamp, data, 8);
    slot_set(g_st.sl.rx_stamp, i, stamp);
    slot_set(g_st.sl.cb_ns, i, now);
    /* raw: nats.c's callback is the consumer's; streamwire: the message
     * nats.c last handed this thread, if it carried this item */
    slot_set(g_st.sl.rx_ns, i, !via_library ? now : tl_rx_stamp == stamp ? tl_rx_ns : -1);
}
