/* streamwire/merge.h -- ordered fan-in of several streams by processed
 * index (design doc 002, "maximum processed_index" aggregation).
 *
 * An orchestrator sends one generation to N detector streams; each item a
 * detector sends covers the text up to a `processed_index` (and from a
 * `start_index`). sw_merge reads the N streams and returns merged frames in
 * order, each holding every stream's items up to one reference index:
 *
 *   1. wait until every stream that has not ended has an item past the
 *      last frame's reference (at first: any item);
 *   2. the reference is the largest processed_index among those items;
 *   3. wait until every stream has an item at or past the reference (or
 *      has ended), then take from each stream its items up to and including
 *      the reference; an item past it stays queued for the next frame;
 *   4. repeat until every stream ended; then one terminal.
 *
 * Frames are therefore bounded by the slowest stream. Memory: the merge
 * reads a stream (blocking mode) only while it needs that stream's items,
 * so a stream that runs ahead stops at its credit window; what the merge
 * itself holds (the items up to the reference, waiting for a frame) is
 * bounded by max_queued_bytes: a stream whose index runs so far ahead that
 * the others' items up to it do not fit ends the merged result with error
 * payload_too_large (failed_stream: the stream whose item went over). If a
 * stream ends with anything but completed or
 * incomplete, the merged result ends with that stream's terminal and the
 * other streams are cancelled. Exactly one terminal, as for every stream.
 *
 * References never decrease. Items whose indices go backwards within a
 * stream (overlapping chunks that end earlier than an earlier chunk) are
 * taken in stream order: a frame takes a stream's queued items from the
 * front while their index is at or below the reference. Such an item
 * travels with the item before it if the merge had read it when it made
 * that frame (it reads a stream only as far as a frame needs); otherwise it
 * comes with the next frame. It sets no reference of its own (it is covered
 * already): the next frame waits for its stream's next item past the last
 * reference as usual, or, once every stream ended, is a last frame at the
 * same reference as the one before. docs/MERGE.md has the details.
 *
 * Threads: one consumer calls sw_merge_next; sw_merge_add before the first
 * sw_merge_next. The streams' on_ready hooks (set by sw_merge_request_opts)
 * run on library threads and only wake the consumer. */
#ifndef STREAMWIRE_MERGE_H
#define STREAMWIRE_MERGE_H

#include <streamwire/streamwire.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sw_merge sw_merge;

/* Reads an item's indices. Returns 0 and fills *processed (and *start,
 * which may stay 0) and *skip (bytes of a header to leave out of the item
 * data in frames), or -1 if the item carries no index: the merged result
 * then ends with error decode_error. */
typedef int (*sw_merge_index_fn)(const sw_item *item, uint64_t *start, uint64_t *processed,
                                 size_t *skip, void *arg);

/* The default index reader: the item starts with a header
 * "<processed_index>:" or "<start_index>-<processed_index>:" in ASCII
 * decimal (at most 20 digits each), which is left out of the frame's data.
 * "42:Detector A found nothing" -> start 0, processed 42, data "Detector A
 * found nothing". */
SW_API int sw_merge_index_header(const sw_item *item, uint64_t *start, uint64_t *processed,
                                 size_t *skip, void *arg);

typedef struct sw_merge_opts {
    sw_merge_index_fn index; /* NULL = sw_merge_index_header */
    void *index_arg;
    size_t max_streams;      /* default 64 */
    size_t max_queued_bytes; /* 0 = SW_MERGE_MAX_QUEUED_DEFAULT (16 MiB): items held for
                                frames, with ~48 bytes of overhead each */
} sw_merge_opts;

#define SW_MERGE_MAX_QUEUED_DEFAULT ((size_t)16 << 20)

SW_API void sw_merge_opts_init(sw_merge_opts *o);
SW_API SW_NODISCARD sw_err sw_merge_create(sw_merge **out, const sw_merge_opts *o);

/* Prepares the options of a request whose stream will be added: blocking
 * mode (on_item NULL) with the merge's on_ready hook. Keeps every other
 * field (set endpoint, deadline, ... before or after). */
SW_API void sw_merge_request_opts(sw_merge *m, sw_request_opts *q);

/* Adds a stream opened with options from sw_merge_request_opts. The merge
 * owns it from now on (it closes it in sw_merge_destroy): do not call
 * sw_stream_next on it. Streams are numbered 0, 1, ... in the order added.
 * SW_EINVAL (NULL, or after the first sw_merge_next), SW_EBUSY (max_streams
 * reached), SW_ENOMEM; on an error the stream stays the caller's. */
SW_API sw_err sw_merge_add(sw_merge *m, sw_stream *s);

/* One item of one stream in a frame. */
typedef struct sw_merge_item {
    uint64_t start_index, processed_index;
    const void *data; /* the item's data without its index header */
    size_t len;
    const char *event; /* the item's event name ("" for a plain item) */
} sw_merge_item;

typedef struct sw_merge_part {
    size_t stream; /* index of the stream (order of sw_merge_add) */
    const sw_merge_item *items;
    size_t nitems; /* may be 0: the stream had nothing up to the reference */
} sw_merge_part;

typedef enum sw_merge_kind { SW_MERGE_FRAME = 1, SW_MERGE_TERMINAL = 2 } sw_merge_kind;

typedef struct sw_merge_frame {
    sw_merge_kind kind;
    uint64_t reference;         /* FRAME: the processed_index every part is complete up to;
                                   never below the frame before's */
    const sw_merge_part *parts; /* FRAME: one per stream, in stream order */
    size_t nparts;
    sw_terminal terminal; /* TERMINAL: completed when every stream completed; else the first
                             stream's terminal that was not (incomplete, failed, error) */
    long failed_stream;   /* TERMINAL: the stream whose terminal it is, or -1 */
    uint64_t frames;      /* TERMINAL: frames delivered */
} sw_merge_frame;

/* The next frame, or the terminal (once). *frame stays valid until the next
 * call or sw_merge_destroy. SW_OK, SW_ETIMEDOUT (nothing within timeout_ms;
 * < 0 waits forever), SW_EEOF (the terminal was delivered), SW_EINVAL (NULL,
 * or no stream added). Running out of memory is not a return value: the
 * merged result ends (SW_OK, a terminal: error SW_ENOMEM, reason "no_memory";
 * failed_stream -1, or the stream that could not be read). */
SW_API sw_err sw_merge_next(sw_merge *m, const sw_merge_frame **frame, int64_t timeout_ms);

/* Cancels streams still open, closes every stream, frees. NULL ok. */
SW_API void sw_merge_destroy(sw_merge *m);

#ifdef __cplusplus
}
#endif

#endif
