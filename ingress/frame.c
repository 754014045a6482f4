/* ingress/frame.c -- message framing: wrapper headers, the batch builder
 * (one message of several kept items), message buffers, and the packed
 * final of a rejection.
 *
 * Threads: whichever publishes (a producer, the sender, the timer, a
 * control callback). Locks: none taken; swn_resp_build and swn_resp_hdr
 * read the responder with r->mu held by the caller. */
#include <stdlib.h>
#include <string.h>

#include "ingress/ingress_int.h"

/* Packs a complete final wrapper with protobuf-c, for rejections, which
 * have no stream state (stream items go through the ring and swn_resp_build).
 * *out is malloc'd. */
sw_err
swn_resp_pack_final(const uint8_t id[SW_REQUEST_ID_BYTES], const char *instance, uint64_t seq,
                    const swp_terminal *term, size_t max, uint8_t **out, size_t *outlen)
{
    swp_item w = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
    w.version = SW_PROTOCOL_VERSION;
    w.request_id.data = (uint8_t *)id;
    w.request_id.len = SW_REQUEST_ID_BYTES;
    w.seq = seq;
    w.instance_id = (char *)instance;
    w.complete_final = 1;
    w.terminal = (swp_terminal *)term;
    return swp_encode_alloc(&w, max ? max : SIZE_MAX, out, outlen);
}

static size_t
resp_max_payload(const sw_responder *r)
{
    size_t max = sw_conn_max_payload(r->ing->conn);
    return max ? max : SIZE_MAX;
}

/* The longest item body that fits in a message with any header. */
size_t
swn_resp_max_body(const sw_responder *r)
{
    size_t max = resp_max_payload(r);
    return max > SWP_HDR_MAX ? max - SWP_HDR_MAX : 0;
}

/* The wrapper header for a message whose items run from seq `first` to
 * `last`. The frontend knows the instance it sent to: say it with seq 1 and
 * the final only, not with every token. */
void
swn_resp_hdr(const sw_responder *r, uint64_t first, uint64_t last, int resent, swp_hdr *h)
{
    h->request_id = r->id;
    h->instance_id =
        first <= 1 || (r->final_seq != 0 && last >= r->final_seq) ? r->ing->instance_id : NULL;
    h->credit_window = r->capped ? r->window : 0;
    h->credit_window_max = r->grow && first <= 1 ? r->wmax : 0;
    h->credit_bytes = first <= 1 ? r->credit_bytes : 0;
    h->resent = resent;
}

int
swn_msgbuf_fit(swn_msgbuf *m, size_t need)
{
    uint8_t *np;
    if (need <= m->cap)
        return 0;
    if ((np = malloc(need)) == NULL)
        return -1;
    if (m->p != m->stack)
        free(m->p);
    m->p = np;
    m->cap = need;
    return 0;
}

void
swn_msgbuf_init(swn_msgbuf *m)
{
    m->p = m->stack;
    m->cap = sizeof(m->stack);
}

void
swn_msgbuf_free(swn_msgbuf *m)
{
    if (m->p != m->stack)
        free(m->p);
}

/* Builds one message of the kept items from seq `from` up to `to` (r->mu
 * held): the first one in the wrapper, the rest in `batch`, as many as fit
 * in SWN_BATCH_ITEMS, ing->batch_bytes and the max payload (always at least
 * one). Numbers with no kept body are passed over, and so, on a first send
 * (!resent), are items the test-only loss injection marked. *last gets the
 * highest seq the message accounts for, *nitems the items in it (0: nothing
 * to publish) and *data_items (if not NULL) those of them that are not the
 * final. Returns the message length; 0 and *last = from - 1 without
 * memory. */
size_t
swn_resp_build(sw_responder *r, uint64_t from, uint64_t to, int resent, swn_msgbuf *m,
               uint64_t *last, unsigned *nitems, unsigned *data_items)
{
    size_t max = resp_max_payload(r), total = SWP_HDR_MAX, n;
    size_t limit = max < r->ing->batch_bytes ? max : r->ing->batch_bytes;
    uint64_t first = 0, q;
    unsigned k = 0, final = 0;
    swp_hdr h;

    *nitems = 0;
    /* First pass: which items go in. */
    for (q = from; q <= to && k < SWN_BATCH_ITEMS; q++) {
        size_t blen, add;
        int lose;
        if (swn_ring_get(&r->rg, q, &blen, &lose) == NULL || (!resent && lose))
            continue;
        add = blen + (k ? SWP_PREFIX_MAX : 0);
        if (k > 0 && total + add > limit)
            break;
        if (k == 0)
            first = q;
        total += add;
        k++;
    }
    *last = q - 1;
    if (k == 0)
        return 0;
#ifdef SW_CHAOS
    if (!resent && r->fail_builds > 0) { /* swx_responder_fail_builds */
        r->fail_builds--;
        *last = from - 1;
        return 0;
    }
#endif
    if (swn_msgbuf_fit(m, total) != 0) {
        *last = from - 1;
        return 0;
    }
    swn_resp_hdr(r, first, *last, resent, &h);
    n = swp_hdr_write(&h, m->p);
    for (q = first, k = 0; q <= *last; q++) {
        size_t blen;
        int lose;
        const uint8_t *b = swn_ring_get(&r->rg, q, &blen, &lose);
        if (b == NULL || (!resent && lose))
            continue;
        if (k > 0)
            n += swp_batch_prefix(m->p + n, blen);
        memcpy(m->p + n, b, blen);
        n += blen;
        k++;
        if (q == r->final_seq)
            final = 1;
    }
    *nitems = k;
    if (data_items != NULL)
        *data_items = k - final;
    return n;
}
