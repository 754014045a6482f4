/* egress/rx.c -- see rx.h. Pure: no locks, no clock, no I/O. */
#include <stdlib.h>
#include <string.h>

#include "common/sw_common.h"
#include "egress/rx.h"

size_t
swe_q_bytes(size_t len, size_t elen)
{
    return (sizeof(swe_q) + len + elen + 1 + 15) & ~(size_t)15;
}

/* The length of a data item's event name (0: none, or not data). */
static size_t
in_elen(const swe_rx_in *in)
{
    if (in->kind != SWE_IN_DATA || in->event == NULL || in->event[0] == '\0')
        return 0;
    return strnlen(in->event, SW_MAX_EVENT);
}

/* The node bytes of in (0: a heartbeat, which takes none). */
static size_t
in_q_bytes(const swe_rx_in *in)
{
    if (in->kind == SWE_IN_FINAL)
        return swe_q_bytes(0, 0);
    if (in->kind != SWE_IN_DATA)
        return 0;
    return swe_q_bytes(in->len, in_elen(in));
}

void
swe_rx_runs(swe_rx_in *in, size_t n)
{
    /* Backwards: [i, j) is the longest stretch from item i that continues
     * its sequence and fits SWE_QBLOCK_MAX; sum its bytes. As i moves back
     * j can only move back too. */
    size_t j = n, sum = 0;
    for (size_t i = n; i-- > 0;) {
        size_t b = in_q_bytes(&in[i]);
        if (b == 0 || b > SWE_QBLOCK_MAX) {
            in[i].run_bytes = 0; /* a heartbeat, or too large for any block */
            j = i;
            sum = 0;
            continue;
        }
        if (i + 1 < j && in[i + 1].seq != in[i].seq + 1) {
            j = i + 1; /* the sequence breaks after i */
            sum = 0;
        }
        sum += b;
        while (sum > SWE_QBLOCK_MAX)
            sum -= in_q_bytes(&in[--j]);
        in[i].run_bytes = j - i >= 2 ? sum : 0; /* one node alone needs no block */
    }
}

/* Frees a node (NULL ok): its block's reference, or itself. */
static void
q_free(swe_q *q)
{
    if (q == NULL)
        return;
    if (q->blk == NULL)
        free(q);
    else if (--q->blk->refs == 0)
        free(q->blk);
}

static void
q_free_list(swe_q *q)
{
    while (q != NULL) {
        swe_q *n = q->next;
        q_free(q);
        q = n;
    }
}

static void
rx_clear_hold(swe_rx *rx)
{
    rx->hold_top = 0;
    if (rx->hold == NULL || rx->held == 0)
        return;
    for (size_t i = 0; i < rx->hold_cap; i++) {
        q_free(rx->hold[i]);
        rx->hold[i] = NULL;
    }
    rx->held = 0;
}

/* A sign of life at now (a heartbeat, an item with a new seq, a worker
 * starting): silence counts from here, and no ask is due before
 * cfg.idle_hb_ms + cfg.hb_ms of it. */
static void
rx_alive(swe_rx *rx, int64_t now)
{
    rx->last_rx_ms = now;
    rx->ask_wait = 0;
}

static void
act_zero(const swe_rx *rx, swe_rx_act *act)
{
    memset(act, 0, sizeof(*act));
    act->gen = rx->gen;
}

/* Reassembly, credit and timers as a worker starts (the first one, and
 * each one after a migration): its seqs from 1, the window granted. */
static void
rx_worker_start(swe_rx *rx, int64_t now)
{
    rx->expected = 1;
    rx->final_seq = 0;
    rx->w_status = 0;
    rx->w_err = SW_OK;
    if (rx->txt != NULL)
        rx->txt->w_reason[0] = rx->txt->w_msg[0] = '\0';
    rx->window = rx->window0 = rx->cfg.window;
    rx->wmax = 0; /* until this worker answers */
    rx->last_grant_ms = now;
    rx->consumed = 0;
    rx->credit_sent = rx->granted = rx->cfg.window;
    memset(rx->grants, 0, sizeof(rx->grants));
    rx->grants[0] = rx->cfg.window;
    rx->bytes_on = 0; /* until this worker answers */
    rx->in_bytes = rx->consumed_bytes = 0;
    rx->byte_sent = rx->wbytes = rx->cfg.window_bytes;
    rx->ngrants = rx->gnext = 1;
    rx->gap_since_ms = 0;
    rx->last_resend_ms = 0;
    rx->regrant_ms = INT64_MIN; /* (no terminal yet: the union's open-stream half) */
    rx_alive(rx, now);
    rx->answered = 0;
}

void
swe_rx_init(swe_rx *rx, const swe_rx_cfg *cfg, int64_t now)
{
    memset(rx, 0, sizeof(*rx));
    rx->cfg = *cfg;
    /* A gap gets at least SW_GAP_TIMEOUT_MIN_MS: a worker resends a seq at
     * most every 50 ms (a RESEND flood's bound), and the asks every
     * gap_ms/4 need room for a second resend of a copy that was lost. */
    if (rx->cfg.gap_ms < SW_GAP_TIMEOUT_MIN_MS)
        rx->cfg.gap_ms = SW_GAP_TIMEOUT_MIN_MS;
    /* The reorder window covers what the worker may have sent past a gap. */
    rx->hold_cap = (size_t)cfg->window + 2;
    rx->mig_left = cfg->migrations;
    rx_worker_start(rx, now);
}

static void
rx_drop_history(swe_rx *rx)
{
    for (size_t i = 0, n = swe_rx_nhist(rx); i < n; i++)
        free(rx->hist->v[i]);
    free(rx->hist);
    rx->hist = NULL;
}

/* Drops the data queued for the consumer (not the item it holds). */
static void
rx_drop_queue(swe_rx *rx)
{
    q_free_list(rx->qh);
    rx->qh = rx->qt = NULL;
    rx->qlen = 0;
}

void
swe_rx_fini(swe_rx *rx)
{
    rx_clear_hold(rx);
    free(rx->hold);
    rx->hold = NULL;
    rx_drop_queue(rx);
    q_free(rx->cur);
    rx->cur = NULL;
    rx_drop_history(rx);
    free(rx->txt);
    rx->txt = NULL;
}

/* The texts, allocated at the first need; NULL without memory. */
static swe_rx_text *
rx_text(swe_rx *rx)
{
    if (rx->txt == NULL) {
        if ((rx->txt = malloc(sizeof(*rx->txt))) == NULL)
            return NULL;
        rx->txt->w_reason[0] = rx->txt->w_msg[0] = rx->txt->term_msg[0] = '\0';
    }
    return rx->txt;
}

/* Decides the terminal. The first decision wins; the one exception is a
 * worker's final not yet delivered, which item_after_final replaces.
 * Returns 1 if this call decided it. */
static int
rx_set_terminal(swe_rx *rx, sw_status status, sw_err err, const char *reason, const char *msg,
                uint64_t seq, int from_wire, int64_t now)
{
    if (rx->term_state == SWE_TERM_DELIVERED)
        return 0;
    if (rx->term_state == SWE_TERM_QUEUED && !(rx->term_from_wire && err == SW_ITEM_AFTER_FINAL))
        return 0;
    rx->term_state = SWE_TERM_QUEUED;
    rx->migrating = 0;
    rx->term_from_wire = from_wire;
    rx->term_ready_ms = from_wire ? now + rx->cfg.linger_ms : 0;
    rx->term.status = status;
    rx->term.error = err;
    /* The error's own name and text (static) stand in for what is not
     * given, and for everything when there is no memory for the texts. */
    rx->term.reason = status == SW_STATUS_ERROR ? sw_err_name(err) : "";
    rx->term.message = status == SW_STATUS_ERROR ? sw_strerror(err) : "";
    /* A reason is static or the worker's (rx->txt->w_reason): pointed at,
     * as is the worker's message. Any other message is copied; without
     * memory for it, the error's own text (static) stands in. */
    if (reason != NULL)
        rx->term.reason = reason;
    if (msg != NULL) {
        if (*msg == '\0' || (rx->txt != NULL && msg == rx->txt->w_msg)) {
            rx->term.message = msg;
        } else if (rx_text(rx) != NULL) {
            swi_textlcpy(rx->txt->term_msg, msg, sizeof(rx->txt->term_msg));
            rx->term.message = rx->txt->term_msg;
        }
    }
    rx->term_seq = seq;
    rx->gap_since_ms = 0;
    rx_clear_hold(rx);
    if (status == SW_STATUS_CANCELLED && !from_wire)
        rx_drop_queue(rx); /* (a worker's CANCELLED final comes after its items, delivered first) */
    return 1;
}

/* A loss that migration may repair (why: which one; the callers decide
 * which losses move a stream): enters `migrating` if migrations are left.
 * Returns 1 if the stream migrates (or already does). */
static int
rx_migrate(swe_rx *rx, sw_err why, int from_final, swe_rx_act *act)
{
    if (rx->migrating)
        return 1;
    if (rx->term_state != SWE_TERM_NONE || rx->mig_left == 0)
        return 0;
    rx->migrating = 1;
    rx->mig_why = why;
    rx->mig_from_final = from_final;
    rx_clear_hold(rx); /* past the last in-order item: the new worker sends it again */
    rx->gap_since_ms = 0;
    act->migrate = 1;
    return 1;
}

/* Ends the stream with a synthesized error, no migration, adding to act. */
static int
rx_end_error(swe_rx *rx, sw_err err, const char *msg, int kill, int64_t now, swe_rx_act *act)
{
    if (!rx_set_terminal(rx, SW_STATUS_ERROR, err, NULL, msg, 0, 0, now))
        return 0;
    act->ended = 1;
    act->kill = kill;
    act->wake = 1;
    return 1;
}

/* Ends the stream with a synthesized error, adding to act; a loss that
 * migration repairs migrates instead. */
static int
rx_fail(swe_rx *rx, sw_err err, const char *msg, int kill, int64_t now, swe_rx_act *act)
{
    if ((err == SW_INSTANCE_LOST || err == SW_STREAM_INCOMPLETE) && rx_migrate(rx, err, 0, act))
        return 0;
    return rx_end_error(rx, err, msg, kill, now, act);
}

int
swe_rx_fail(swe_rx *rx, sw_err err, const char *msg, int kill, int64_t now, swe_rx_act *act)
{
    act_zero(rx, act);
    return rx_fail(rx, err, msg, kill, now, act);
}

int
swe_rx_no_responders(swe_rx *rx, int may_move, const char *msg, int64_t now, swe_rx_act *act)
{
    act_zero(rx, act);
    /* The server answers a request with "no responders" at once, before
     * any worker could answer it: one that comes after an answer is not
     * the server's (anyone may publish the status). One that comes while
     * the stream is migrating is about the request it is leaving. */
    if (rx->answered || rx->migrating)
        return -1;
    /* The instance a migration picked went away between the pick and the
     * publish. Nothing ran the request, so it moves on, with nothing there
     * to cancel. */
    if (may_move && rx->gen > 0 && rx_migrate(rx, SW_NO_RESPONDERS, 1, act))
        return 0;
    return rx_end_error(rx, SW_NO_RESPONDERS, msg, 0, now, act);
}

int
swe_rx_unsealed(swe_rx *rx, const char *msg, int64_t now, swe_rx_act *act)
{
    act_zero(rx, act);
    /* (while the stream migrates, answered is still the worker it leaves:
     * a plain message then is no more that worker's) */
    if (rx->answered)
        return -1;
    return rx_end_error(rx, SW_AUTH_FAILED, msg, 1, now, act);
}

int
swe_rx_cancel(swe_rx *rx, int kill)
{
    if (rx->term_state == SWE_TERM_QUEUED && rx->qh != NULL) {
        /* A terminal decided while items still wait for the consumer (the
         * worker's final came inside the window): no data after the
         * consumer's cancel, and the stream it gets is not the one that
         * terminal describes, so it ends CANCELLED. The worker has finished
         * (or was told when the terminal was decided): nothing to send. */
        rx_drop_queue(rx);
        rx->term_state = SWE_TERM_NONE;
        (void)rx_set_terminal(rx, SW_STATUS_CANCELLED, SW_OK, "cancelled",
                              kill ? "killed by the frontend" : "cancelled by the frontend", 0, 0,
                              0);
        return 2;
    }
    if (rx->term_state != SWE_TERM_NONE)
        return 0;
    return rx_set_terminal(rx, SW_STATUS_CANCELLED, SW_OK, "cancelled",
                           kill ? "killed by the frontend" : "cancelled by the frontend", 0, 0, 0);
}

/* A node for in. blk (an in-order item): carved from the block of the
 * queue's last node (or of the one last popped) if it has room, else from
 * a new block for in's run (rx.h, swe_qblock); otherwise, and for a held
 * item (blk 0), malloc'd alone. */
static swe_q *
q_make(swe_rx *rx, const swe_rx_in *in, int blk)
{
    size_t len = in->kind == SWE_IN_DATA ? in->len : 0;
    size_t elen = in_elen(in);
    size_t need = swe_q_bytes(len, elen);
    swe_qblock *b = NULL;
    swe_q *q;
    if (blk) {
        const swe_q *last = rx->qt != NULL ? rx->qt : rx->cur;
        b = last != NULL ? last->blk : NULL;
        if (b != NULL && b->cap - b->used < need)
            b = NULL;
        if (b == NULL && in->run_bytes > need && in->run_bytes <= SWE_QBLOCK_MAX && rx->held == 0 &&
            (b = malloc(sizeof(*b) + in->run_bytes)) != NULL) {
            b->refs = 0;
            b->used = 0;
            b->cap = in->run_bytes;
        }
    }
    if (b != NULL) {
        q = (swe_q *)(void *)(b->mem + b->used);
        b->used += need;
        b->refs++;
    } else if ((q = malloc(need)) == NULL) {
        return NULL;
    }
    q->blk = b;
    q->next = NULL;
    q->seq = in->seq;
    q->final = in->kind == SWE_IN_FINAL;
    q->droppable = in->droppable;
    q->gen = 0;
    q->len = len;
    if (len)
        memcpy(q->data, in->data, len);
    if (elen)
        memcpy(q->data + len, in->event, elen);
    q->data[len + elen] = '\0';
    q->event = (const char *)q->data + len;
    return q;
}

/* A copy of a data item for the migrate callback. Past
 * SW_MIGRATION_HISTORY_MAX bytes the history goes, and migration with it. */
static void
rx_keep(swe_rx *rx, const swe_q *q)
{
    size_t sz = sizeof(*q) + q->len + strlen(q->event) + 1;
    swe_rx_hist *h;
    swe_q *c;
    if (rx->mig_left == 0)
        return;
    h = rx->hist;
    /* What the copy costs, its node and its slot, not only its data: items
     * of no data would keep a node each without bound. */
    if ((h != NULL ? h->bytes : 0) + sz + sizeof(h->v[0]) > SW_MIGRATION_HISTORY_MAX)
        goto off;
    if (h == NULL || h->n == h->cap) {
        size_t cap = h != NULL ? 2 * h->cap : 64;
        if ((h = realloc(h, sizeof(*h) + cap * sizeof(h->v[0]))) == NULL)
            goto off;
        if (rx->hist == NULL)
            h->n = h->bytes = 0;
        h->cap = cap;
        rx->hist = h;
    }
    if ((c = malloc(sz)) == NULL)
        goto off;
    memcpy(c, q, sz);
    c->event = (const char *)c->data + c->len;
    c->next = NULL;
    c->blk = NULL; /* a copy of its own (freed with free) */
    h->v[h->n++] = c;
    h->bytes += sz + sizeof(h->v[0]);
    return;
off:
    rx_drop_history(rx);
    rx->mig_left = 0;
}

/* Hands one in-order item to the queue or, for the final, decides the
 * terminal. Takes ownership of q. */
static void
rx_accept(swe_rx *rx, swe_q *q, int64_t now, swe_rx_act *act)
{
    rx->expected = q->seq + 1;
    q->seq += rx->seq_base;
    q->gen = rx->gen;
    if (q->final && rx->w_status == SW_STATUS_ERROR && rx->w_err == SW_INSTANCE_LOST &&
        rx_migrate(rx, SW_INSTANCE_LOST, 1, act)) {
        /* The worker handed the stream back (it drains): acknowledged,
         * and the stream moves on. */
        act->ack_final = 1;
        q_free(q);
        return;
    }
    if (q->final) {
        /* The stream stays in its router's table until the terminal is
         * delivered (a late item after it must still find it). */
        (void)rx_set_terminal(rx, rx->w_status, rx->w_err, rx->txt ? rx->txt->w_reason : "",
                              rx->txt ? rx->txt->w_msg : "", q->seq, 1, now);
        act->ack_final = 1;
        act->wake = 1;
        q_free(q);
        return;
    }
    rx->gen_items++;
    if (rx->cfg.keep_history)
        rx_keep(rx, q);
    q->next = NULL;
    if (rx->qt)
        rx->qt->next = q;
    else
        rx->qh = q;
    rx->qt = q;
    rx->qlen++;
    if (rx->qlen > rx->st.peak_pending)
        rx->st.peak_pending = rx->qlen;
}

/* A RESEND of from..to, within what one control may span. */
static void
rx_ask_resend(swe_rx *rx, uint64_t from, uint64_t to, int64_t now, swe_rx_act *act)
{
    if (to < from)
        return;
    if (to - from > SWE_RESEND_SPAN_MAX)
        to = from + SWE_RESEND_SPAN_MAX;
    act->resend = 1;
    act->resend_from = from;
    act->resend_to = to;
    rx->last_resend_ms = now;
    rx->st.resend_requests++;
}

/* Records the terminal a worker's final carries. Returns 0, or -1 if an
 * item already held lies past it (item_after_final). */
static int
rx_note_final(swe_rx *rx, const swe_rx_in *in)
{
    rx->final_seq = in->seq;
    rx->w_status = in->status;
    rx->w_err = in->err;
    if ((in->reason == NULL || in->reason[0] == '\0') &&
        (in->message == NULL || in->message[0] == '\0')) {
        if (rx->txt != NULL) /* (no texts: none kept, none allocated) */
            rx->txt->w_reason[0] = rx->txt->w_msg[0] = '\0';
    } else if (rx_text(rx) != NULL) {
        swi_textlcpy(rx->txt->w_reason, in->reason ? in->reason : "", sizeof(rx->txt->w_reason));
        swi_textlcpy(rx->txt->w_msg, in->message ? in->message : "", sizeof(rx->txt->w_msg));
    }
    /* (not a scan of the hold: with a window of 1<<20 that was a million
     * slots at every final after a gap). A data item held at the final's
     * own seq counts too: two different items at one seq (the final was
     * taken for a duplicate of it, and the stream then had its data and no
     * final). */
    return rx->held > 0 && rx->hold_top >= in->seq ? -1 : 0;
}

/* 1 if final in says what the final recorded (rx_note_final) says: its
 * status, error and texts, cut as they were kept (a resend of it is the
 * same bytes). Without texts kept (none, or no memory for them) only the
 * status and error are compared. */
static int
rx_same_final(const swe_rx *rx, const swe_rx_in *in)
{
    char reason[SWE_REASON_MAX], msg[SWE_WMSG_MAX];
    if (in->status != rx->w_status || in->err != rx->w_err)
        return 0;
    if (rx->txt == NULL)
        return 1;
    swi_textlcpy(reason, in->reason ? in->reason : "", sizeof(reason));
    swi_textlcpy(msg, in->message ? in->message : "", sizeof(msg));
    return strcmp(reason, rx->txt->w_reason) == 0 && strcmp(msg, rx->txt->w_msg) == 0;
}

/* 1 if in is another item at the recorded final's seq: a data item, or a
 * final that says something else (two different finals). */
static int
rx_other_final(const swe_rx *rx, const swe_rx_in *in)
{
    return rx->final_seq != 0 && in->seq == rx->final_seq &&
           (in->kind == SWE_IN_DATA || (in->kind == SWE_IN_FINAL && !rx_same_final(rx, in)));
}

static int
rx_was_granted(const swe_rx *rx, uint64_t limit)
{
    for (unsigned i = 0; i < rx->ngrants; i++)
        if (rx->grants[i] == limit)
            return 1;
    return 0;
}

/* 1 if a heartbeat (nothing missing up to its last_seq) shows a worker
 * without a grant we made: it says it is stalled while our latest limits
 * let it send more, or it stopped exactly at an earlier item limit
 * although we granted more since. */
static int
rx_grant_lost(const swe_rx *rx, const swe_rx_in *in)
{
    if (in->last_seq + 1 != rx->expected)
        return 0;
    if (in->stalled && in->last_seq < rx->credit_sent &&
        (!rx->bytes_on || rx->in_bytes < rx->byte_sent))
        return 1;
    return in->last_seq < rx->credit_sent && rx_was_granted(rx, in->last_seq);
}

/* The CREDIT to send: the current limits. */
static void
rx_credit_act(const swe_rx *rx, swe_rx_act *act)
{
    act->credit = 1;
    act->credit_limit = rx->credit_sent;
    act->credit_ack = rx->expected - 1;
    act->credit_bytes = rx->bytes_on ? rx->byte_sent : 0;
}

/* 1 if a data item of len, not a duplicate, takes the data bytes received
 * from this worker past the highest byte limit granted plus the largest
 * item seen (max_cost includes this one): the worker ignores byte credit. */
static int
rx_bytes_over(const swe_rx *rx, size_t len)
{
    return rx->bytes_on && rx->in_bytes + len > rx->byte_sent + (rx->max_cost - SW_ITEM_COST);
}

void
swe_rx_on_item(swe_rx *rx, const swe_rx_in *in, int64_t now, swe_rx_act *act)
{
    int is_hb = in->kind == SWE_IN_HEARTBEAT;
    sw_err fail = SW_OK;
    const char *fail_msg = NULL;

    act_zero(rx, act);
    if (rx->migrating)
        return; /* from the worker left behind */
    if (rx->term_state != SWE_TERM_NONE) {
        /* Something arrived after the terminal was decided: an item past
         * the final, or another final at its seq, is item_after_final while
         * the worker's final is not delivered, and counted after. */
        if (!is_hb && rx->final_seq != 0 && (in->seq > rx->final_seq || rx_other_final(rx, in))) {
            if (rx->term_state == SWE_TERM_QUEUED && rx->term_from_wire) {
                if (rx_set_terminal(rx, SW_STATUS_ERROR, SW_ITEM_AFTER_FINAL, NULL,
                                    "the worker sent an item after its final marker", 0, 0, now)) {
                    act->ended = 1;
                    act->wake = 1;
                }
            } else {
                act->after_final = 1;
            }
        }
        return;
    }
    /* Only what moves the stream on is a sign of life (last_rx_ms, which
     * also excuses the instance's unanswered probes): a heartbeat (the
     * caller feeds only those its worker's counter shows fresh:
     * egress/mux.c), and an item with a new seq (below). A duplicate may
     * be a sealed item recorded on the bus and replayed: it opens, and
     * must not keep a frozen worker's stream, or its instance, alive. */
    rx->answered = 1;
    if (is_hb) {
        rx_alive(rx, now);
        rx->st.heartbeats++;
        /* Heartbeats follow the items they count on the wire: anything
         * missing up to last_seq was lost. */
        if (in->last_seq >= rx->expected && now - rx->last_resend_ms >= SWE_BEAT_ASK_MS) {
            if (rx->gap_since_ms == 0)
                rx->gap_since_ms = now;
            rx_ask_resend(rx, rx->expected, in->last_seq, now, act);
        } else if (rx_grant_lost(rx, in) &&
                   (rx->regrant_ms == INT64_MIN || now - rx->regrant_ms >= SWE_BEAT_ASK_MS)) {
            /* Nothing missing, and the worker stopped where an earlier
             * grant ended although we granted more since: the grant again,
             * once per SWE_BEAT_ASK_MS (every beat of a batch that names
             * the stream 4,096 times used to send one). */
            rx->regrant_ms = now;
            rx_credit_act(rx, act);
        }
        return;
    }
    if (rx->final_seq != 0 &&
        (in->seq > rx->final_seq || (in->kind == SWE_IN_DATA && in->seq == rx->final_seq))) {
        fail = SW_ITEM_AFTER_FINAL;
        fail_msg = "the worker sent an item after its final marker";
        goto fail;
    }
    if (in->credit_window != 0 && in->credit_window < rx->window) {
        /* The worker grants less than we asked (its max_window): adopt its
         * window, or we would wait for credit it never needs. */
        rx->window = in->credit_window;
        if (rx->window0 > rx->window)
            rx->window0 = rx->window;
        if (rx->credit_sent > rx->consumed + rx->window)
            rx->credit_sent = rx->window > rx->consumed ? rx->window : rx->consumed;
    }
    if (in->credit_window_max != 0 && rx->wmax == 0)
        rx->wmax =
            in->credit_window_max < rx->cfg.window_max ? in->credit_window_max : rx->cfg.window_max;
    if (in->credit_bytes != 0 && rx->cfg.window_bytes != 0)
        rx->bytes_on = 1;
    if (in->seq < rx->expected) {
        if (in->kind == SWE_IN_FINAL && rx->final_seq == 0) {
            /* No final was taken, so that seq was a data item's: two
             * items at one seq. */
            fail = SW_ITEM_AFTER_FINAL;
            fail_msg = "the worker sent a final marker at a data item's seq";
            goto fail;
        }
        rx->st.duplicates++;
        return;
    }
    if (in->kind == SWE_IN_DATA && in->seq > rx->granted) {
        /* Beyond the credit granted: the worker ignores flow control.
         * Nothing of it is queued. */
        fail = SW_FLOW_VIOLATION;
        fail_msg = "the worker sent an item beyond the credit it was granted";
        goto fail;
    }
    if (in->kind == SWE_IN_FINAL) {
        if (rx->final_seq != 0 && rx->final_seq != in->seq) {
            fail = SW_ITEM_AFTER_FINAL;
            fail_msg = "the worker sent two final markers";
            goto fail;
        }
        if (rx->final_seq == in->seq) {
            /* The final is held (past a gap): this one is a resend of it,
             * a duplicate, or says something else. Either way what the
             * held one said stays recorded: the second used to overwrite
             * it before the hold found the slot taken. */
            if (!rx_same_final(rx, in)) {
                fail = SW_ITEM_AFTER_FINAL;
                fail_msg = "the worker sent two different final markers";
                goto fail;
            }
            rx->st.duplicates++;
            return;
        }
        if (rx_note_final(rx, in) != 0) {
            fail = SW_ITEM_AFTER_FINAL;
            fail_msg = "the worker sent an item after its final marker";
            goto fail;
        }
    }
    if (in->kind == SWE_IN_DATA && in->len + SW_ITEM_COST > rx->max_cost)
        rx->max_cost = in->len + SW_ITEM_COST;
    if (in->seq == rx->expected) {
        swe_q *q;
        if (in->kind == SWE_IN_DATA && rx_bytes_over(rx, in->len))
            goto bytes_over;
        if ((q = q_make(rx, in, 1)) == NULL) {
            fail = SW_ENOMEM;
            goto fail;
        }
        rx_alive(rx, now);
        rx->in_bytes += q->len;
        rx_accept(rx, q, now, act);
        while (rx->term_state == SWE_TERM_NONE && rx->held > 0) {
            swe_q **slot = &rx->hold[rx->expected % rx->hold_cap];
            if (*slot == NULL || (*slot)->seq != rx->expected)
                break;
            q = *slot;
            *slot = NULL;
            rx->held--;
            rx->st.reordered++;
            rx_accept(rx, q, now, act);
        }
        if (rx->held == 0) {
            rx->gap_since_ms = 0;
            rx->hold_top = 0;
        }
        act->wake = 1;
        return;
    }
    /* A gap: hold the item and ask for the missing range. */
    if (in->seq - rx->expected >= rx->hold_cap) {
        fail = SW_SEQUENCE_GAP;
        fail_msg = "an item arrived beyond the reorder window";
        goto fail;
    }
    if (rx->hold == NULL && (rx->hold = calloc(rx->hold_cap, sizeof(*rx->hold))) == NULL) {
        fail = SW_ENOMEM;
        goto fail;
    }
    {
        swe_q **slot = &rx->hold[in->seq % rx->hold_cap];
        if (*slot != NULL) {
            rx->st.duplicates++;
            return;
        }
        if (in->kind == SWE_IN_DATA && rx_bytes_over(rx, in->len))
            goto bytes_over;
        /* malloc'd alone: a held node from a block would keep the whole
         * block, consumed items and all, until the gap closes (rx.h) */
        if ((*slot = q_make(rx, in, 0)) == NULL) {
            fail = SW_ENOMEM;
            goto fail;
        }
        rx_alive(rx, now);
        rx->in_bytes += (*slot)->len;
        rx->held++;
        if (in->seq > rx->hold_top)
            rx->hold_top = in->seq;
        if (rx->gap_since_ms == 0) {
            rx->gap_since_ms = now;
            rx_ask_resend(rx, rx->expected, in->seq - 1, now, act);
        }
    }
    return;
bytes_over:
    fail = SW_FLOW_VIOLATION;
    fail_msg = "the worker sent more data bytes than the byte credit it was granted";
fail:
    (void)rx_fail(rx, fail, fail_msg, 1, now, act);
}

/* 1 if the stream asked for idle heartbeats, so that its silence is asked
 * after (rx.h). */
static int
rx_asks(const swe_rx *rx)
{
    return rx->cfg.idle_hb_ms > rx->cfg.hb_ms;
}

/* When the next ask is due (rx.h: a stream that asked for idle heartbeats,
 * silent idle_hb_ms + hb_ms, then every hb_ms), INT64_MAX if it asked for
 * none. */
static int64_t
rx_ask_due(const swe_rx *rx)
{
    if (!rx_asks(rx))
        return INT64_MAX;
    return rx->last_rx_ms + (rx->ask_wait != 0 ? (int64_t)rx->ask_wait
                                               : (int64_t)rx->cfg.idle_hb_ms + rx->cfg.hb_ms);
}

/* The silence that ends the stream (rx.h): inactivity_ms, later by how
 * late its first ask was when it asks; INT64_MAX while it has not asked
 * yet (the ask, due first, comes before it). */
static int64_t
rx_silence_limit(const swe_rx *rx)
{
    int64_t on_time = (int64_t)rx->cfg.idle_hb_ms + rx->cfg.hb_ms;
    if (!rx_asks(rx) || on_time >= (int64_t)rx->cfg.inactivity_ms ||
        rx->ask_wait == UINT32_MAX) /* no asks, none before the limit, or not known */
        return rx->cfg.inactivity_ms;
    if (rx->ask_wait == 0)
        return INT64_MAX;
    return (int64_t)rx->cfg.inactivity_ms + rx->ask_late;
}

int64_t
swe_rx_next_due(const swe_rx *rx)
{
    int64_t due = INT64_MAX, gap = rx->cfg.gap_ms, limit;
    if (rx->term_state == SWE_TERM_NONE) {
        if (rx->cfg.deadline_ms >= 0)
            due = rx->cfg.deadline_ms;
        if (rx->migrating)
            return due; /* only the deadline is judged */
        limit = rx_silence_limit(rx);
        if (limit != INT64_MAX && rx->last_rx_ms + limit < due)
            due = rx->last_rx_ms + limit;
        if (rx_ask_due(rx) < due)
            due = rx_ask_due(rx);
        if (rx->gap_since_ms != 0) {
            if (rx->gap_since_ms + gap < due)
                due = rx->gap_since_ms + gap;
            if (rx->last_resend_ms + gap / 4 < due)
                due = rx->last_resend_ms + gap / 4;
        }
    } else if (rx->term_state == SWE_TERM_QUEUED && rx->term_ready_ms != SWE_TERM_WOKEN) {
        due = rx->term_ready_ms;
    }
    return due;
}

void
swe_rx_tick(swe_rx *rx, int64_t now, int64_t quiet, swe_rx_act *act)
{
    act_zero(rx, act);
    if (rx->term_state == SWE_TERM_NONE) {
        if (rx->cfg.deadline_ms >= 0 && now >= rx->cfg.deadline_ms) {
            (void)rx_fail(rx, SW_DEADLINE_EXCEEDED, "the request deadline passed", 1, now, act);
        } else if (rx->migrating) {
            /* only the deadline is judged */
        } else if (rx->gap_since_ms != 0 && quiet - rx->gap_since_ms >= rx->cfg.gap_ms) {
            (void)rx_fail(rx, SW_SEQUENCE_GAP, "a sequence gap was not repaired in time", 1, now,
                          act);
        } else if (quiet - rx->last_rx_ms >= rx_silence_limit(rx)) {
            (void)rx_fail(rx, SW_STREAM_INCOMPLETE,
                          "no item or heartbeat within the inactivity timeout", 1, now, act);
        } else if (rx->gap_since_ms != 0 && now - rx->last_resend_ms >= rx->cfg.gap_ms / 4) {
            /* Everything the worker may have sent past the gap: the reorder
             * window, but never beyond the credit granted (+1: the final
             * needs none). */
            uint64_t to = rx->expected + rx->hold_cap - 1;
            if (to > rx->granted + 1)
                to = rx->granted + 1;
            rx_ask_resend(rx, rx->expected, to, now, act);
        }
        if (rx->term_state == SWE_TERM_NONE && !rx->migrating && quiet >= rx_ask_due(rx)) {
            /* Silent past the idle spacing and a heartbeat more: an idle
             * beat was lost, or the worker lost the stream. Asked again
             * at most every hb_ms while the silence lasts (counted from
             * now: a late scan does not bring the next ask closer). */
            int64_t wait = now - rx->last_rx_ms + rx->cfg.hb_ms;
            int64_t late = quiet - rx->last_rx_ms - rx->cfg.idle_hb_ms - rx->cfg.hb_ms;
            act->ask = 1;
            if (rx->ask_wait == 0) /* the first: the silence limit moves by its lateness */
                rx->ask_late = late < (int64_t)UINT32_MAX / 2 ? (uint32_t)late : UINT32_MAX / 2;
            rx->ask_wait = wait < (int64_t)UINT32_MAX - 1 ? (uint32_t)wait : UINT32_MAX - 1;
        }
    } else if (rx->term_state == SWE_TERM_QUEUED && now >= rx->term_ready_ms &&
               rx->term_ready_ms != SWE_TERM_WOKEN) {
        /* A lingering terminal is ready: the consumer is woken once (a
         * consumer that is behind takes it when it comes to it; a waiting
         * sw_stream_next waits to term_ready_ms by itself). It used to be
         * woken at every scan, 40 times a second, until it took it. */
        act->wake = 1;
        rx->term_ready_ms = SWE_TERM_WOKEN;
    }
}

/* Makes the reorder window cover a credit window of w (the worker may
 * send that far past a gap). Held items span less than the old capacity,
 * so they land in distinct slots of the new one. 0 ok, -1 no memory. */
static int
rx_hold_fit(swe_rx *rx, uint64_t w)
{
    size_t cap = (size_t)w + 2;
    swe_q **nh;
    if (cap <= rx->hold_cap)
        return 0;
    if (rx->hold == NULL) {
        rx->hold_cap = cap;
        return 0;
    }
    if ((nh = calloc(cap, sizeof(*nh))) == NULL)
        return -1;
    for (size_t i = 0; i < rx->hold_cap; i++)
        if (rx->hold[i] != NULL)
            nh[rx->hold[i]->seq % cap] = rx->hold[i];
    free(rx->hold);
    rx->hold = nh;
    rx->hold_cap = cap;
    return 0;
}

/* Window tuning, at a grant (rx.h): grow while the consumer keeps up with
 * a fast worker (the byte window too, when it binds or soon will), shrink
 * to the byte bound when larger items came. */
static void
rx_tune(swe_rx *rx, int64_t now)
{
    uint64_t cap = rx->wmax;
    int64_t since = now - rx->last_grant_ms;
    int keeps_up;
    rx->last_grant_ms = now;
    if (cap == 0 || (rx->cfg.window_bytes != 0 && !rx->bytes_on))
        return; /* a fixed window: the worker did not answer (both) */
    keeps_up = since < SW_WINDOW_GROW_MS && rx->qlen <= rx->window / 4;
    /* The byte window: only where it is what caps the window (its items at
     * the largest cost are fewer than the most the window may grow to),
     * the window has come within a factor of 2 of it, and the consumer
     * keeps up in bytes too (large items: a quarter of the item window may
     * be more than the whole byte window). */
    if (keeps_up && rx->wbytes != 0 && rx->wbytes < rx->cfg.window_bytes_max &&
        rx->cfg.window_max > rx->cfg.window && rx->max_cost != 0 &&
        rx->wbytes / rx->max_cost < cap && (uint64_t)rx->window * rx->max_cost * 2 > rx->wbytes &&
        rx->in_bytes - rx->consumed_bytes <= rx->wbytes / 4) {
        uint64_t b = rx->wbytes * 2;
        rx->wbytes = b < rx->cfg.window_bytes_max ? b : rx->cfg.window_bytes_max;
    }
    if (rx->wbytes != 0 && rx->max_cost != 0 && rx->wbytes / rx->max_cost < cap)
        cap = rx->wbytes / rx->max_cost;
    if (cap < rx->window0)
        cap = rx->window0;
    if (rx->window > cap) {
        rx->window = (uint32_t)cap;
    } else if (rx->window < cap && keeps_up) {
        uint64_t w = (uint64_t)rx->window * 2;
        if (w > cap)
            w = cap;
        if (rx_hold_fit(rx, w) == 0)
            rx->window = (uint32_t)w;
    }
}

/* After the consumer took an item: a grant when half of either window
 * (items, or bytes with byte credit) was consumed since the last one. The
 * new limits are consumed + window and consumed bytes + window_bytes,
 * each only if it moves (a window the tuning shrank may have nothing new
 * to grant). */
static void
rx_grant(swe_rx *rx, int64_t now, swe_rx_act *act)
{
    uint64_t limit, blimit;
    if (rx->consumed + rx->window / 2 < rx->credit_sent &&
        (!rx->bytes_on || rx->consumed_bytes + rx->wbytes / 2 < rx->byte_sent))
        return;
    rx_tune(rx, now);
    limit = rx->consumed + rx->window;
    blimit = rx->bytes_on ? rx->consumed_bytes + rx->wbytes : 0;
    if (limit <= rx->credit_sent && blimit <= rx->byte_sent)
        return;
    if (limit > rx->credit_sent)
        rx->credit_sent = limit;
    if (blimit > rx->byte_sent)
        rx->byte_sent = blimit;
    rx->grants[rx->gnext] = rx->credit_sent;
    rx->gnext = (unsigned char)((rx->gnext + 1) % 4);
    if (rx->ngrants < 4)
        rx->ngrants++;
    if (rx->credit_sent > rx->granted)
        rx->granted = rx->credit_sent;
    rx_credit_act(rx, act);
}

int
swe_rx_pop(swe_rx *rx, int64_t now, sw_item *out, swe_rx_act *act)
{
    act_zero(rx, act);
    q_free(rx->cur);
    rx->cur = NULL;
    if (rx->qh != NULL) {
        swe_q *q = rx->qh;
        rx->qh = q->next;
        if (rx->qh == NULL)
            rx->qt = NULL;
        rx->qlen--;
        rx->cur = q;
        memset(out, 0, sizeof(*out));
        out->kind = SW_ITEM_DATA;
        out->seq = q->seq;
        out->data = q->data;
        out->len = q->len;
        out->droppable = q->droppable;
        out->event = q->event;
        rx->st.items++;
        if (q->gen != rx->gen)
            return 1; /* the worker it came from is gone: no credit for it */
        rx->consumed++;
        rx->consumed_bytes += q->len;
        if (!rx->migrating)
            rx_grant(rx, now, act);
        return 1;
    }
    if (rx->term_state == SWE_TERM_QUEUED && now >= rx->term_ready_ms) {
        rx->term_state = SWE_TERM_DELIVERED;
        memset(out, 0, sizeof(*out));
        out->kind = SW_ITEM_TERMINAL;
        out->event = "";
        out->seq = rx->term_seq;
        out->terminal = rx->term;
        out->terminal.migrations = (unsigned)rx->st.migrations;
        return 2;
    }
    return 0;
}

int
swe_rx_migration_failed(swe_rx *rx, sw_err err, const char *msg, int64_t now, swe_rx_act *act)
{
    act_zero(rx, act);
    if (!rx->migrating)
        return 0;
    rx->migrating = 0;
    rx->mig_left = 0;
    return rx_fail(rx, err, msg, 0, now, act);
}

void
swe_rx_migrated(swe_rx *rx, int64_t now)
{
    if (!rx->migrating)
        return;
    rx->migrating = 0;
    rx->mig_left--;
    rx->gen++;
    rx->st.migrations++;
    rx->seq_base += rx->gen_items;
    rx->gen_items = 0;
    rx_clear_hold(rx);
    rx_worker_start(rx, now);
}

void
swe_rx_not_known(swe_rx *rx)
{
    if (rx_asks(rx))
        rx->ask_wait = UINT32_MAX;
}

void
swe_rx_silence_from(swe_rx *rx, int64_t since)
{
    if (since > rx->last_rx_ms)
        rx_alive(rx, since);
    /* (also when something arrived since then: a gap open before is
     * still judged from then) */
    if (rx->gap_since_ms != 0 && rx->gap_since_ms < since)
        rx->gap_since_ms = since;
}
