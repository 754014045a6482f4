/* cmd/generate.c -- `streamwire generate`: sends one request and prints its
 * response stream, then its terminal. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include <streamwire/registry.h>

typedef struct gen_out {
    int json;
    int flush_each; /* a slow consumer (--read-delay-ms): every item shows at once */
} gen_out;

/* The stream has nothing more right now: what was printed goes out. */
static void
gen_on_idle(void *arg)
{
    (void)arg;
    fflush(stdout);
}

static void
gen_on_data(const sw_item *item, void *arg)
{
    const gen_out *g = arg;

    const char *ev = item->event != NULL ? item->event : "";
    if (g->json) {
        printf("{\"seq\":%llu,", (unsigned long long)item->seq);
        if (ev[0] != '\0') /* event names are [A-Za-z0-9._:-]: nothing to escape */
            printf("\"event\":\"%s\",", ev);
        printf("\"data\":\"");
        cli_json_escape(stdout, item->data, item->len);
        printf("\"}\n");
    } else {
        printf("%6llu  ", (unsigned long long)item->seq);
        if (ev[0] != '\0')
            printf("[%s] ", ev);
        cli_print_readable(stdout, item->data, item->len);
        printf("%s\n", item->droppable ? "  (droppable)" : "");
    }
    if (g->flush_each)
        fflush(stdout);
}

static void
gen_print_terminal(const cli_stream_result *res, int json)
{
    const char *status = sw_status_name(res->status);

    if (json) {
        printf("{\"terminal\":\"");
        cli_json_escape(stdout, status, strlen(status));
        printf("\",\"reason\":\"");
        cli_json_escape(stdout, res->reason, strlen(res->reason));
        printf("\",\"instance\":\"");
        cli_json_escape(stdout, res->instance, strlen(res->instance));
        printf("\",\"items\":%llu,\"elapsed_ms\":%lld,\"elapsed_us\":%lld",
               (unsigned long long)res->items, (long long)res->elapsed_ms,
               (long long)res->elapsed_us);
        if (res->first_item_us >= 0)
            printf(",\"first_item_us\":%lld", (long long)res->first_item_us);
        if (res->migrations > 0) {
            printf(",\"migrations\":%u,\"instances\":\"", res->migrations);
            cli_json_escape(stdout, res->instances, strlen(res->instances));
            printf("\"");
        }
        if (res->message[0] != '\0') {
            printf(",\"message\":\"");
            cli_json_escape(stdout, res->message, strlen(res->message));
            printf("\"");
        }
        printf("}\n");
    } else {
        printf("-- %s (%s) from instance %s: %llu items in %lld ms", status, res->reason,
               res->instance[0] != '\0' ? res->instance : "(none)", (unsigned long long)res->items,
               (long long)res->elapsed_ms);
        if (res->migrations > 0)
            printf(" after %u migration%s (%s)", res->migrations, res->migrations > 1 ? "s" : "",
                   res->instances);
        if (res->message[0] != '\0')
            printf(": %s", res->message);
        printf("\n");
    }
    fflush(stdout);
}

int
cli_generate_main(int argc, char **argv)
{
    const char *server = NULL, *endpoint = NULL, *instance = NULL, *prompt = "hello";
    long migration_limit = 0;
    long max_tokens = 0, cancel_after = -1, read_delay = 0, timeout = 0, linger = 20;
    long heartbeat = 0, window = 0, window_max = 0, credit_bytes = 0, credit_bytes_max = 0,
         inactivity = 0, gap_timeout = 0, payload_bytes = -1;
    const char *policy = "round_robin", *bucket = NULL, *router_id = NULL;
    int json = 0, verbose = 0;
    long fanout = 0;
    const char *chunk_list = "1,5,20";
    long chunks[CLI_FANOUT_MAX];
    int nchunks = 0;
    const cli_opt opts[] = {
        {"server", CLI_STRING, "URL", "NATS server URL, e.g. nats://127.0.0.1:4222", &server, 0, 0,
         NULL, 1},
        {"endpoint", CLI_STRING, "NS.COMPONENT.ENDPOINT", "endpoint to call", &endpoint, 0, 0, NULL,
         1},
        {"instance-id", CLI_STRING, "ID",
         "send to this instance directly; default: pick a live\ninstance from the discovery "
         "registry (JetStream KV)",
         &instance, 0, 0, NULL, 0},
        {"router-id", CLI_STRING, "ID",
         "this frontend's router id (its response subjects are\nsw.rsp.ID.*; what NATS "
         "permissions grant); default random",
         &router_id, 0, 0, NULL, 0},
        {"policy", CLI_CHOICE, "round_robin|random|least_inflight",
         "how to pick an instance without --instance-id\n(default round_robin)", &policy, 0, 0,
         "round_robin|random|least_inflight", 0},
        {"bucket", CLI_STRING, "NAME", "registry bucket (default streamwire_instances)", &bucket, 0,
         0, NULL, 0},
        {"prompt", CLI_STRING, "TEXT", "request payload (default \"hello\")", &prompt, 0, 0, NULL,
         0},
        {"fanout", CLI_INT, "N",
         "ordered fan-in demo: start N detector workers here\n(chunks from --chunks), send the "
         "prompt to all of\nthem and print the merged frames (docs/MERGE.md)",
         &fanout, 1, CLI_FANOUT_MAX, NULL, 0},
        {"chunks", CLI_STRING, "LIST",
         "the detectors' chunk sizes in characters, comma\nseparated, reused in turn (default "
         "1,5,20)",
         &chunk_list, 0, 0, NULL, 0},
        {"payload-bytes", CLI_INT, "N",
         "send N bytes ('x' repeated) instead of --prompt\n(e.g. more than the server's max "
         "payload)",
         &payload_bytes, 0, 1L << 30, NULL, 0},
        {"max-tokens", CLI_INT, "N", "max_tokens hint for the engine (default 0 = unset)",
         &max_tokens, 0, 4294967295L, NULL, 0},
        {"cancel-after", CLI_INT, "K",
         "cancel the stream after K data items (0 = at once),\nthen read on to the terminal",
         &cancel_after, 0, 100000000, NULL, 0},
        {"read-delay-ms", CLI_INT, "MS",
         "sleep after each data item: a slow consumer, to\nsee flow control work (default 0)",
         &read_delay, 0, 3600000, NULL, 0},
        {"timeout-ms", CLI_INT, "MS",
         "request deadline; the stream ends with error\ndeadline_exceeded when it passes "
         "(default 0 = none)",
         &timeout, 0, 4294967295L, NULL, 0},
        {"json", CLI_FLAG, NULL,
         "one JSON object per line: {\"seq\":N,\"data\":\"...\"} per item\n(with "
         "\"event\":\"NAME\" for a typed item), then the\nterminal {\"terminal\":...}",
         &json, 0, 0, NULL, 0},
        {"final-linger-ms", CLI_INT, "MS",
         "hold the terminal this long after the final to catch\nitems sent after it "
         "(item_after_final) (default 20)",
         &linger, 0, 600000, NULL, 0},
        {"heartbeat-ms", CLI_INT, "MS", "heartbeat interval asked of the worker (default 250)",
         &heartbeat, 0, 600000, NULL, 0},
        {"inactivity-ms", CLI_INT, "MS",
         "silence that ends the stream with stream_incomplete\n(default 4 * heartbeat + 500)",
         &inactivity, 0, 3600000, NULL, 0},
        {"gap-timeout-ms", CLI_INT, "MS",
         "how long a sequence gap may stay open before\nsequence_gap (default 500, at least 200)",
         &gap_timeout, 0, 3600000, NULL, 0},
        {"window", CLI_INT, "N",
         "first credit window: items in flight (default 256);\nit grows for a fast stream up to "
         "--window-max",
         &window, 0, 1000000, NULL, 0},
        {"window-max", CLI_INT, "N",
         "the most the window grows to (default 16384, at most\n1000000; the worker may cap it "
         "lower); = --window for\na fixed window",
         &window_max, 0, 1000000, NULL, 0},
        {"credit-bytes", CLI_INT, "N",
         "byte credit: the data bytes the worker may send past\nwhat this consumer took at first, "
         "the most a\nstream that never kept up queues (default 1048576)",
         &credit_bytes, 256, 1073741824, NULL, 0},
        {"credit-bytes-max", CLI_INT, "N",
         "the most the byte credit grows to while this consumer\nkeeps up with large items "
         "(default 4194304, and at\nleast --credit-bytes); = --credit-bytes for a fixed one",
         &credit_bytes_max, 256, 1073741824, NULL, 0},
        {"migration-limit", CLI_INT, "N",
         "move the stream to another instance up to N times\nwhen its worker is lost or drains "
         "(default 0;\nneeds the registry: no --instance-id or --fanout)",
         &migration_limit, 0, SW_MAX_MIGRATIONS, NULL, 0},
        {"verbose", CLI_FLAG, NULL, "print library log lines to stderr", &verbose, 0, 0, NULL, 0},
    };
    cli_conn_flags conn_flags = {0};
    cli_opt conn_rows[CLI_CONN_NOPTS];
    const cli_cmd cmd = {
        "generate",
        "Send one request to an endpoint instance and print the response stream: the\n"
        "data items in order, then exactly one terminal.",
        "Terminals: completed (stop), incomplete (max_tokens), failed (<app code>),\n"
        "cancelled (cancelled), error (<reason>: stream_incomplete, item_after_final,\n"
        "decode_error, sequence_gap, no_responders, deadline_exceeded,\n"
        "payload_too_large, instance_lost, ...). SIGINT cancels the stream.",
        "Exit status: 0 completed; 1 any other terminal; 2 usage error;\n"
        "3 cannot connect to the NATS server.",
        opts,
        sizeof(opts) / sizeof(opts[0]),
        conn_rows,
        CLI_CONN_NOPTS,
    };
    gen_out g;
    sw_conn_opts copts;
    sw_router_opts ropts;
    sw_conn *conn = NULL;
    sw_router *router = NULL;
    sw_registry *reg = NULL;
    cli_stream_req req;
    cli_stream_result res;
    char *padding = NULL;
    sw_err err;
    int rc;

    cli_conn_rows(&conn_flags, conn_rows);
    rc = cli_parse(&cmd, argc, argv);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if ((rc = cli_conn_check(&cmd, &conn_flags)) != CLI_EXIT_OK)
        return rc;
    if ((rc = cli_check_names(&cmd, server, endpoint, 1, instance)) != CLI_EXIT_OK)
        return rc;
    if (credit_bytes_max != 0 &&
        (size_t)credit_bytes_max < (credit_bytes ? (size_t)credit_bytes : SW_CREDIT_BYTES_DEFAULT))
        return cli_usage_error(&cmd, "--credit-bytes-max is less than --credit-bytes (default "
                                     "1048576): the byte credit would start above its most");
    /* Migration moves the stream to an instance the registry picks. */
    if (migration_limit > 0 && instance != NULL)
        return cli_usage_error(&cmd,
                               "--migration-limit needs the registry: not with --instance-id");
    if (migration_limit > 0 && fanout > 0)
        return cli_usage_error(&cmd, "--migration-limit needs the registry: not with --fanout");
    if (fanout > 0) {
        if ((nchunks = cli_fanout_parse_chunks(chunk_list, chunks, CLI_FANOUT_MAX)) < 0)
            return cli_usage_error(&cmd, "--chunks: a comma list of 1..16 sizes of 1..1000");
        if (instance != NULL)
            return cli_usage_error(&cmd, "--fanout starts its own detectors: no --instance-id");
        instance = "fanout"; /* no registry: the detectors are addressed directly */
    }

    memset(&req, 0, sizeof(req));
    req.endpoint = endpoint;
    req.instance_id = instance;
    req.deadline_ms = (uint32_t)timeout;
    req.max_tokens = (uint32_t)max_tokens;
    req.heartbeat_ms = (unsigned)heartbeat;
    req.cancel_after = cancel_after;
    req.read_delay_ms = read_delay;
    req.migration_limit = (int)migration_limit;
    if (payload_bytes >= 0) {
        padding = malloc((size_t)payload_bytes + 1);
        if (padding == NULL) {
            fprintf(stderr, "streamwire generate: out of memory for %ld payload bytes\n",
                    payload_bytes);
            return CLI_EXIT_FAIL;
        }
        memset(padding, 'x', (size_t)payload_bytes);
        req.payload = padding;
        req.len = (size_t)payload_bytes;
    } else {
        req.payload = prompt;
        req.len = strlen(prompt);
    }
    /* Items are written in blocks, flushed whenever the stream has nothing
     * more to take (gen_on_idle): a fast stream costs a write per block, not
     * per item (a line-buffered stdout made a system call per item), and a
     * slow one still shows each item as it arrives. (--fanout prints its
     * frames line by line, as before.) */
    if (fanout == 0)
        setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    g.json = json;
    g.flush_each = read_delay > 0;
    req.on_data = gen_on_data;
    req.on_data_arg = &g;
    req.on_idle = gen_on_idle;

    cli_catch_signals(-1);
    sw_conn_opts_init(&copts);
    copts.url = server;
    copts.name = "streamwire-generate";
    cli_conn_apply(&conn_flags, &copts);
    copts.log = verbose ? cli_log_stderr : NULL;
    copts.log_arg = (void *)"generate";
    err = sw_conn_open(&conn, &copts);
    if (err != SW_OK) {
        cli_conn_error("generate", server, &conn_flags, err);
        free(padding);
        return CLI_EXIT_CONNECT;
    }
    sw_router_opts_init(&ropts);
    if (instance == NULL) {
        sw_registry_opts gopts;
        sw_registry_opts_init(&gopts);
        if (bucket != NULL)
            gopts.bucket = bucket;
        gopts.log = verbose ? cli_log_stderr : NULL;
        gopts.log_arg = (void *)"generate";
        err = sw_registry_open(&reg, conn, &gopts);
        if (err != SW_OK) {
            cli_registry_error("generate", "open the registry", err, " or pass --instance-id");
            rc = CLI_EXIT_FAIL;
            goto out;
        }
        ropts.registry = reg;
        (void)sw_policy_from_name(policy, &ropts.policy);
    }
    ropts.router_id = router_id;
    ropts.final_linger_ms = (unsigned)linger;
    ropts.heartbeat_ms = (unsigned)heartbeat;
    ropts.inactivity_ms = (unsigned)inactivity;
    ropts.gap_timeout_ms = (unsigned)gap_timeout;
    ropts.credit_window = (unsigned)window;
    ropts.credit_window_max = (unsigned)window_max;
    ropts.credit_bytes = (size_t)credit_bytes;
    ropts.credit_bytes_max = (size_t)credit_bytes_max;
    ropts.log = verbose ? cli_log_stderr : NULL;
    ropts.log_arg = (void *)"generate";
    err = sw_router_create(&router, conn, &ropts);
    if (err != SW_OK) {
        fprintf(stderr, "streamwire generate: cannot create a router: %s (%s)\n", sw_strerror(err),
                sw_err_name(err));
        rc = CLI_EXIT_FAIL;
        goto out;
    }

    if (fanout > 0) {
        rc = cli_fanout_run(conn, router, endpoint, payload_bytes >= 0 ? padding : prompt,
                            (int)fanout, chunks, nchunks, timeout, json);
        goto out;
    }
    err = cli_run_stream(router, &req, &res);
    if (err != SW_OK) {
        fprintf(stderr, "streamwire generate: cannot open the stream: %s (%s)\n", sw_strerror(err),
                sw_err_name(err));
        rc = err == SW_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
        goto out;
    }
    if (!res.got_terminal) {
        fprintf(stderr, "streamwire generate: %s\n", res.reason);
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    gen_print_terminal(&res, json);
    rc = res.status == SW_STATUS_COMPLETED ? CLI_EXIT_OK : CLI_EXIT_FAIL;

out:
    sw_router_destroy(router);
    sw_registry_close(reg);
    sw_conn_close(conn);
    free(padding);
    return rc;
}
