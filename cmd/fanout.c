/* cmd/fanout.c -- `streamwire generate --fanout N --chunks 1,5,20`: the
 * ordered fan-in demo (sw_merge, docs/MERGE.md). It starts N detector
 * workers in this process, each chunking the prompt with its own chunk size
 * and answering one "<start>-<end>:" item per chunk, sends the prompt to all
 * of them, and prints the merged frames: each covers the prompt up to the
 * reference index, with every detector's results up to there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include <streamwire/merge.h>

typedef struct detector {
    long chunk;
    long delay_ms;
} detector;

static void
detector_handler(sw_responder *r, void *arg)
{
    const detector *d = arg;
    size_t len;
    const char *text = sw_responder_payload(r, &len);
    for (size_t at = 0; at < len; at += (size_t)d->chunk) {
        size_t end = at + (size_t)d->chunk < len ? at + (size_t)d->chunk : len;
        char item[512];
        int n = snprintf(item, sizeof(item), "%zu-%zu:%.*s", at, end, (int)(end - at), text + at);
        if (n < 0 || (size_t)n >= sizeof(item))
            n = (int)sizeof(item) - 1;
        if (at > 0 && d->delay_ms > 0)
            cli_sleep_ms(d->delay_ms);
        if (sw_responder_send(r, item, (size_t)n) != SW_OK)
            return;
    }
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

/* Parses "1,5,20" into chunks[] (1..1000 each); the count, or -1. */
int
cli_fanout_parse_chunks(const char *list, long *chunks, int max)
{
    int n = 0;
    const char *p = list;
    while (p != NULL && *p != '\0') {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1000 || n == max || (*end != ',' && *end != '\0'))
            return -1;
        chunks[n++] = v;
        p = *end == ',' ? end + 1 : end;
    }
    return n > 0 ? n : -1;
}

int
cli_fanout_run(sw_conn *conn, sw_router *router, const char *endpoint, const char *text, int fanout,
               const long *chunks, int nchunks, long deadline_ms, int json)
{
    sw_ingress *ing[CLI_FANOUT_MAX] = {0};
    detector det[CLI_FANOUT_MAX];
    char ids[CLI_FANOUT_MAX][40];
    sw_merge *m = NULL;
    const sw_merge_frame *f;
    size_t tlen = strlen(text), covered = 0;
    int rc = CLI_EXIT_FAIL;
    sw_err e;

    for (int i = 0; i < fanout; i++) {
        sw_ingress_opts io;
        det[i].chunk = chunks[i % nchunks];
        det[i].delay_ms = 2;
        snprintf(ids[i], sizeof(ids[i]), "fanout-%d-%d", (int)getpid(), i);
        sw_ingress_opts_init(&io);
        io.endpoint = endpoint;
        io.instance_id = ids[i];
        io.handler = detector_handler;
        io.handler_arg = &det[i];
        if ((e = sw_ingress_start(&ing[i], conn, &io)) != SW_OK) {
            fprintf(stderr, "streamwire generate: cannot start detector %d: %s (%s)\n", i,
                    sw_strerror(e), sw_err_name(e));
            goto out;
        }
    }
    if (!json) {
        printf("fanout: %d detectors over %zu characters, chunks of", fanout, tlen);
        for (int i = 0; i < fanout; i++)
            printf(" %ld", det[i].chunk);
        printf("\n");
    }
    if ((e = sw_merge_create(&m, NULL)) != SW_OK)
        goto out;
    for (int i = 0; i < fanout; i++) {
        sw_request_opts q;
        sw_stream *s = NULL;
        sw_request_opts_init(&q);
        q.endpoint = endpoint;
        q.instance_id = ids[i];
        q.deadline_ms = deadline_ms;
        sw_merge_request_opts(m, &q);
        if ((e = sw_router_open(&s, router, &q, text, tlen)) != SW_OK ||
            (e = sw_merge_add(m, s)) != SW_OK) {
            fprintf(stderr, "streamwire generate: cannot open stream %d: %s (%s)\n", i,
                    sw_strerror(e), sw_err_name(e));
            goto out;
        }
    }
    for (;;) {
        e = sw_merge_next(m, &f, 60000);
        if (e != SW_OK) {
            fprintf(stderr, "streamwire generate: merge: %s (%s)\n", sw_strerror(e),
                    sw_err_name(e));
            goto out;
        }
        if (f->kind == SW_MERGE_TERMINAL)
            break;
        {
            /* the text up to the reference, past what earlier frames printed
             * (references never decrease: merge.h; a repeated one prints none) */
            size_t upto = f->reference < tlen ? (size_t)f->reference : tlen;
            if (json) {
                printf("{\"frame\":%llu,\"text\":\"", (unsigned long long)f->reference);
                cli_json_escape(stdout, text + covered, upto - covered);
                printf("\",\"results\":[");
                for (size_t i = 0; i < f->nparts; i++)
                    printf("%s%zu", i ? "," : "", f->parts[i].nitems);
                printf("]}\n");
            } else {
                printf("frame up to %4llu  \"%.*s\"", (unsigned long long)f->reference,
                       (int)(upto - covered), text + covered);
                for (size_t i = 0; i < f->nparts; i++)
                    printf("  | d%zu: %zu", i, f->parts[i].nitems);
                printf("\n");
            }
            covered = upto;
        }
    }
    if (json) {
        printf("{\"terminal\":\"%s\",\"reason\":\"", sw_status_name(f->terminal.status));
        cli_json_escape(stdout, f->terminal.reason, strlen(f->terminal.reason));
        printf("\",\"frames\":%llu,\"failed_stream\":%ld}\n", (unsigned long long)f->frames,
               f->failed_stream);
    } else {
        printf("-- %s (%s): %llu frames from %d detectors\n", sw_status_name(f->terminal.status),
               f->terminal.reason, (unsigned long long)f->frames, fanout);
    }
    rc = f->terminal.status == SW_STATUS_COMPLETED ? CLI_EXIT_OK : CLI_EXIT_FAIL;
out:
    sw_merge_destroy(m);
    for (int i = 0; i < fanout; i++)
        sw_ingress_destroy(ing[i]);
    fflush(stdout);
    return rc;
}
