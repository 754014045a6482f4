/* egress/merge.c -- sw_merge: ordered fan-in of streams by processed index
 * (include/streamwire/merge.h). Drives the pure state machine of
 * egress/merge_core.c from blocking-mode streams: it takes an item from a
 * stream only when the state machine needs that stream, so a stream that
 * runs ahead waits at its credit window.
 *
 * Threads: the consumer's (sw_merge_next); the streams' on_ready hooks on
 * library threads only set a flag and signal. Locks: m->mu guards `woken`
 * (and the condition variable); everything else is the consumer's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sw_common.h"
#include "egress/egress_int.h"
#include "egress/merge_core.h"
#include <streamwire/merge.h>

struct sw_merge {
    sw_merge_opts o;
    swm_core core;
    sw_stream **streams;
    size_t n, cap;
    int started, done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int woken; /* a stream may have something new (m->mu) */
    /* the frame handed out last */
    sw_merge_frame frame;
    sw_merge_part *parts;
    sw_merge_item **items; /* per part */
    swm_item **taken;      /* per part: the queued items behind items[] (freed on next call) */
    char reason[SWE_REASON_MAX], message[SWE_WMSG_MAX]; /* (as a stream's terminal carries them) */
    uint64_t frames;
    int eof;                         /* the terminal was handed out */
    long incomplete;                 /* the first stream that ended incomplete, or -1 */
    char inc_reason[SWE_REASON_MAX]; /* its reason */
};

void
sw_merge_opts_init(sw_merge_opts *o)
{
    if (o == NULL)
        return;
    memset(o, 0, sizeof(*o));
    o->max_streams = 64;
    o->max_queued_bytes = SW_MERGE_MAX_QUEUED_DEFAULT;
}

/* A terminal the merge decides itself. */
static sw_terminal
merge_term(sw_status status, sw_err err, const char *reason, const char *message)
{
    sw_terminal t;
    memset(&t, 0, sizeof(t));
    t.status = status;
    t.error = err;
    t.reason = reason;
    t.message = message;
    t.instances = "";
    return t;
}

static int
dec_u64(const char *p, size_t n, size_t *i, uint64_t *v)
{
    size_t start = *i;
    uint64_t x = 0;
    while (*i < n && p[*i] >= '0' && p[*i] <= '9') {
        if (*i - start >= 20 || x > (UINT64_MAX - 9) / 10)
            return -1;
        x = x * 10 + (uint64_t)(p[*i] - '0');
        (*i)++;
    }
    if (*i == start)
        return -1;
    *v = x;
    return 0;
}

int
sw_merge_index_header(const sw_item *item, uint64_t *start, uint64_t *processed, size_t *skip,
                      void *arg)
{
    const char *p = item->data;
    size_t n = item->len, i = 0;
    uint64_t a = 0, b = 0;
    (void)arg;
    if (p == NULL || dec_u64(p, n, &i, &a) != 0)
        return -1;
    if (i < n && p[i] == '-') {
        i++;
        if (dec_u64(p, n, &i, &b) != 0)
            return -1;
    } else {
        b = a;
        a = 0;
    }
    if (i >= n || p[i] != ':')
        return -1;
    *start = a;
    *processed = b;
    *skip = i + 1;
    return 0;
}

sw_err
sw_merge_create(sw_merge **out, const sw_merge_opts *o)
{
    sw_merge *m;
    if (out == NULL)
        return SW_EINVAL;
    *out = NULL;
    if ((m = calloc(1, sizeof(*m))) == NULL)
        return SW_ENOMEM;
    if (o != NULL)
        m->o = *o;
    else
        sw_merge_opts_init(&m->o);
    if (m->o.index == NULL)
        m->o.index = sw_merge_index_header;
    if (m->o.max_streams == 0)
        m->o.max_streams = 64;
    if (m->o.max_queued_bytes == 0)
        m->o.max_queued_bytes = SW_MERGE_MAX_QUEUED_DEFAULT;
    m->incomplete = -1;
    swm_core_init(&m->core);
    pthread_mutex_init(&m->mu, NULL);
    swi_cond_init(&m->cv);
    *out = m;
    return SW_OK;
}

static void
merge_on_ready(sw_stream *s, void *arg)
{
    sw_merge *m = arg;
    (void)s;
    pthread_mutex_lock(&m->mu);
    m->woken = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

void
sw_merge_request_opts(sw_merge *m, sw_request_opts *q)
{
    if (m == NULL || q == NULL)
        return;
    q->on_item = NULL;
    q->on_item_arg = NULL;
    q->on_ready = merge_on_ready;
    q->on_ready_arg = m;
}

sw_err
sw_merge_add(sw_merge *m, sw_stream *s)
{
    size_t lane;
    if (m == NULL || s == NULL || m->started)
        return SW_EINVAL;
    if (m->n >= m->o.max_streams)
        return SW_EBUSY;
    if (m->n == m->cap) {
        size_t ncap = m->cap ? 2 * m->cap : 4;
        sw_stream **ns = realloc(m->streams, ncap * sizeof(*ns));
        if (ns == NULL)
            return SW_ENOMEM;
        m->streams = ns;
        m->cap = ncap;
    }
    if (swm_core_add(&m->core, &lane) != 0)
        return SW_ENOMEM;
    m->streams[m->n++] = s;
    return SW_OK;
}

/* Frees what the last frame handed out. */
static void
frame_release(sw_merge *m)
{
    for (size_t i = 0; i < m->frame.nparts; i++) {
        swm_item *it = m->taken ? m->taken[i] : NULL;
        while (it != NULL) {
            swm_item *nx = it->next;
            free(it);
            it = nx;
        }
        if (m->taken)
            m->taken[i] = NULL;
        if (m->items) {
            free(m->items[i]);
            m->items[i] = NULL;
        }
    }
    m->frame.nparts = 0;
}

/* Ends the merged result with terminal t of stream `who` (-1: ours), and
 * cancels every stream still open. */
static void
merge_end(sw_merge *m, const sw_terminal *t, long who)
{
    for (size_t i = 0; i < m->n; i++)
        if (!m->core.lanes[i].ended)
            (void)sw_stream_cancel(m->streams[i]);
    memset(&m->frame, 0, sizeof(m->frame));
    m->frame.kind = SW_MERGE_TERMINAL;
    m->frame.terminal = *t;
    swi_textlcpy(m->reason, t->reason ? t->reason : "", sizeof(m->reason));
    swi_textlcpy(m->message, t->message ? t->message : "", sizeof(m->message));
    m->frame.terminal.reason = m->reason;
    m->frame.terminal.message = m->message;
    m->frame.failed_stream = who;
    m->frame.frames = m->frames;
    m->done = 1;
}

/* Takes one item or the terminal of stream i, without waiting. 1 taken, 0
 * nothing yet, -1 the merged result ended (m->frame is its terminal). */
static int
pull(sw_merge *m, size_t i)
{
    const sw_item *it = NULL;
    sw_err e = sw_stream_next(m->streams[i], &it, 0);
    if (e == SW_ETIMEDOUT)
        return 0;
    if (e != SW_OK) {
        sw_terminal t =
            merge_term(SW_STATUS_ERROR, e, sw_err_name(e), "a merged stream could not be read");
        merge_end(m, &t, (long)i);
        return -1;
    }
    if (it->kind == SW_ITEM_TERMINAL) {
        if (it->terminal.status == SW_STATUS_COMPLETED ||
            it->terminal.status == SW_STATUS_INCOMPLETE) {
            if (it->terminal.status == SW_STATUS_INCOMPLETE && m->incomplete < 0) {
                m->incomplete = (long)i;
                swi_textlcpy(m->inc_reason, it->terminal.reason ? it->terminal.reason : "",
                             sizeof(m->inc_reason));
            }
            swm_core_end(&m->core, i);
            return 1;
        }
        merge_end(m, &it->terminal, (long)i);
        return -1;
    }
    {
        uint64_t start = 0, idx = 0;
        size_t skip = 0;
        swm_item *q;
        if (m->o.index(it, &start, &idx, &skip, m->o.index_arg) != 0 || skip > it->len) {
            sw_terminal t = merge_term(SW_STATUS_ERROR, SW_DECODE_ERROR, "decode_error",
                                       "an item of a merged stream carries no processed index");
            merge_end(m, &t, (long)i);
            return -1;
        }
        q = swm_item_new(start, idx, (const uint8_t *)it->data + skip, it->len - skip, it->event);
        if (q == NULL) {
            sw_terminal t = merge_term(SW_STATUS_ERROR, SW_ENOMEM, "no_memory", "out of memory");
            merge_end(m, &t, -1);
            return -1;
        }
        swm_core_push(&m->core, i, q);
        if (m->core.bytes > m->o.max_queued_bytes) {
            /* Another stream's index is so far ahead that the items up to
             * it do not fit (a hostile or broken index, or a frame larger
             * than the application allowed). */
            sw_terminal t = merge_term(SW_STATUS_ERROR, SW_EMSGSIZE, "payload_too_large",
                                       "the items up to the merge's reference exceed "
                                       "max_queued_bytes");
            merge_end(m, &t, (long)i);
            return -1;
        }
        return 1;
    }
}

/* Builds the frame up to reference from the state machine's queues. */
static int
frame_build(sw_merge *m, uint64_t reference)
{
    if (m->parts == NULL) {
        m->parts = calloc(m->n, sizeof(*m->parts));
        m->items = calloc(m->n, sizeof(*m->items));
        m->taken = calloc(m->n, sizeof(*m->taken));
        if (m->parts == NULL || m->items == NULL || m->taken == NULL)
            return -1;
    }
    memset(&m->frame, 0, sizeof(m->frame));
    m->frame.kind = SW_MERGE_FRAME;
    m->frame.reference = reference;
    m->frame.parts = m->parts;
    m->frame.failed_stream = -1;
    for (size_t i = 0; i < m->n; i++) {
        size_t k = 0, cnt = 0;
        swm_item *it = swm_core_take(&m->core, i, reference, &cnt);
        m->taken[i] = it;
        m->frame.nparts = i + 1;
        m->items[i] = cnt ? calloc(cnt, sizeof(sw_merge_item)) : NULL;
        if (cnt && m->items[i] == NULL)
            return -1;
        for (; it != NULL; it = it->next, k++) {
            m->items[i][k].start_index = it->start;
            m->items[i][k].processed_index = it->index;
            m->items[i][k].data = it->data;
            m->items[i][k].len = it->len;
            m->items[i][k].event = it->event;
        }
        m->parts[i].stream = i;
        m->parts[i].items = m->items[i];
        m->parts[i].nitems = cnt;
    }
    m->frames++;
    return 0;
}

sw_err
sw_merge_next(sw_merge *m, const sw_merge_frame **frame, int64_t timeout_ms)
{
    int64_t until = timeout_ms < 0 ? INT64_MAX : swi_now_ms() + timeout_ms;
    if (m == NULL || frame == NULL || m->n == 0)
        return SW_EINVAL;
    *frame = NULL;
    m->started = 1;
    if (m->eof)
        return SW_EEOF;
    if (m->frame.kind == SW_MERGE_FRAME)
        frame_release(m);
    for (;;) {
        size_t need = 0;
        uint64_t ref = 0;
        int st, r;
        char f_reason[SWE_REASON_MAX], f_message[SWE_WMSG_MAX];
        if (m->done) { /* the terminal, once */
            m->eof = 1;
            *frame = &m->frame;
            return SW_OK;
        }
        pthread_mutex_lock(&m->mu);
        m->woken = 0;
        pthread_mutex_unlock(&m->mu);
        st = swm_core_step(&m->core, &need, &ref);
        if (st == SWM_FRAME) {
            if (frame_build(m, ref) != 0) {
                sw_terminal t =
                    merge_term(SW_STATUS_ERROR, SW_ENOMEM, "no_memory", "out of memory");
                frame_release(m);
                merge_end(m, &t, -1);
                continue;
            }
            *frame = &m->frame;
            return SW_OK;
        }
        if (st == SWM_DONE) {
            /* every stream ended: completed, or the first incomplete one's reason */
            if (m->incomplete >= 0) {
                sw_terminal t = merge_term(SW_STATUS_INCOMPLETE, SW_OK, m->inc_reason, "");
                merge_end(m, &t, m->incomplete);
            } else {
                sw_terminal t = merge_term(SW_STATUS_COMPLETED, SW_OK, "stop", "");
                merge_end(m, &t, -1);
            }
            continue;
        }
        if ((r = pull(m, need)) != 0)
            continue; /* an item, an end, or the merged terminal */
        /* Nothing yet from the stream it needs: a stream it does not need
         * now that has failed ends the merged result now, with that
         * stream's terminal and no stream read ahead: taken if it is the
         * stream's next item, else (items the merge has not read are
         * queued before it) copied, before merge_end's cancel replaces it.
         * Before, it waited for the needed stream, for ever if that one
         * only beat. */
        for (size_t i = 0; i < m->n && !m->done; i++) {
            sw_terminal t;
            int q;
            if (i == need || m->core.lanes[i].ended)
                continue;
            q = swe_stream_queued_failure(m->streams[i], &t, f_reason, sizeof(f_reason), f_message,
                                          sizeof(f_message));
            if (q == 1)
                (void)pull(m, i);
            else if (q == 2)
                merge_end(m, &t, (long)i);
        }
        if (m->done)
            continue;
        /* nothing yet from the stream it needs: wait for a wake-up (and look
         * again every 100 ms, so a missed hook cannot stall it) */
        pthread_mutex_lock(&m->mu);
        if (!m->woken) {
            int64_t now = swi_now_ms();
            if (now >= until) {
                pthread_mutex_unlock(&m->mu);
                return SW_ETIMEDOUT;
            }
            (void)swi_cond_wait_until(&m->cv, &m->mu, until < now + 100 ? until : now + 100);
        }
        pthread_mutex_unlock(&m->mu);
    }
}

void
sw_merge_destroy(sw_merge *m)
{
    if (m == NULL)
        return;
    if (m->frame.kind == SW_MERGE_FRAME)
        frame_release(m);
    for (size_t i = 0; i < m->n; i++) {
        if (!m->core.lanes[i].ended)
            (void)sw_stream_cancel(m->streams[i]);
        sw_stream_close(m->streams[i]);
    }
    swm_core_fini(&m->core);
    free(m->streams);
    free(m->parts);
    free(m->items);
    free(m->taken);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}
