/* cmd/cli.h -- shared pieces of the streamwire CLI: the option parser, the
 * log sink, output helpers and the stream runner used by `generate` and
 * `demo`. */
#ifndef SW_CMD_CLI_H
#define SW_CMD_CLI_H

#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <streamwire/metrics.h>
#include <streamwire/streamwire.h>

#if defined(__GNUC__)
#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CLI_PRINTF(a, b)
#endif

/* Exit statuses. */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1    /* stream ended in anything but completed; runtime error */
#define CLI_EXIT_USAGE 2   /* bad command line */
#define CLI_EXIT_CONNECT 3 /* could not connect to the NATS server */

/* ------------------------------------------------------------------------ */
/* Option parsing (one table per subcommand).                                */

typedef enum cli_kind {
    CLI_FLAG,   /* no value; out: int *, set to 1 */
    CLI_STRING, /* out: const char ** (points into argv) */
    CLI_INT,    /* out: long *, checked against [min, max] */
    CLI_CHOICE  /* out: const char **, one of choices "a|b|c" */
} cli_kind;

typedef struct cli_opt {
    const char *name; /* long name without the dashes: "tokens" */
    cli_kind kind;
    const char *metavar; /* "N", "URL"; NULL for flags */
    const char *help;    /* one or more lines ('\n' separated) */
    void *out;
    long min, max;       /* CLI_INT */
    const char *choices; /* CLI_CHOICE */
    int required;
} cli_opt;

typedef struct cli_cmd {
    const char *name;    /* "worker" */
    const char *summary; /* one line for `streamwire --help` */
    const char *about;   /* paragraph under the usage line; may be NULL */
    const char *epilog;  /* text after the options (exit statuses...); may be NULL */
    const cli_opt *opts;
    size_t nopts;
    const cli_opt *conn_opts; /* the NATS connection flags (cli_conn_rows), or NULL */
    size_t nconn;
} cli_cmd;

enum { CLI_PARSE_OK = 0, CLI_PARSE_HELP = 1, CLI_PARSE_ERROR = 2 };

/* Parses argv[1..argc-1] (argv[0] is the subcommand name) into the table's
 * outputs. Accepts --name VALUE, --name=VALUE, -h/--help and "--".
 * CLI_PARSE_HELP: usage was printed to stdout (exit 0). CLI_PARSE_ERROR: a
 * message was printed to stderr (exit 2). */
int cli_parse(const cli_cmd *cmd, int argc, char **argv);

/* Prints the full usage of cmd. */
void cli_usage(const cli_cmd *cmd, FILE *f);

/* Checks the common naming flags: a non-empty --server (when server is not
 * NULL), --endpoint (NULL allowed unless endpoint_required) and
 * --instance-id (NULL allowed). Returns CLI_EXIT_OK, or prints the usage
 * error and returns CLI_EXIT_USAGE. */
int cli_check_names(const cli_cmd *cmd, const char *server, const char *endpoint,
                    int endpoint_required, const char *instance);

/* Prints "streamwire CMD: <message>" and a hint to stderr; returns
 * CLI_EXIT_USAGE. */
int cli_usage_error(const cli_cmd *cmd, const char *fmt, ...) CLI_PRINTF(2, 3);

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */

/* Set by the SIGINT/SIGTERM handler installed with cli_catch_signals. An
 * atomic, not a volatile sig_atomic_t: the signal may land on any thread
 * (nats.c's among them) while the main thread reads it (TSan saw that
 * race); a lock-free atomic is as safe in a handler. */
extern atomic_int cli_signalled;

/* Installs a SIGINT/SIGTERM handler that sets cli_signalled and, when
 * wake_fd >= 0, writes one byte to wake_fd. SIGPIPE is ignored. */
void cli_catch_signals(int wake_fd);

/* Log sink: writes "[<arg>] level: msg" to stderr (arg is a const char *
 * tag). */
void cli_log_stderr(void *arg, sw_log_level level, const char *msg);

/* Monotonic milliseconds. */
int64_t cli_now_ms(void);
/* Sleeps ms (nanosleep, resumed after EINTR unless cli_signalled). */
void cli_sleep_ms(int64_t ms);

/* Writes data as the inside of a JSON string: ", \ and control bytes
 * escaped, every byte outside 0x20..0x7e as \u00XX. */
void cli_json_escape(FILE *f, const void *data, size_t len);
/* Writes data readably: printable ASCII as is, anything else as \xXX. */
void cli_print_readable(FILE *f, const void *data, size_t len);

/* ------------------------------------------------------------------------ */
/* NATS connection flags, shared by every subcommand (cmd/conn.c).            */

typedef struct cli_conn_flags {
    const char *user, *password, *token; /* password/token also from the environment:
                                            STREAMWIRE_NATS_PASSWORD, STREAMWIRE_NATS_TOKEN */
    const char *creds, *nkey, *inbox_prefix;
    const char *tls_ca, *tls_cert, *tls_key;
    int tls, tls_insecure;
    const char *key_file;      /* --key-file: the cluster key; everything is sealed */
    const char *open_key_file; /* --open-key-file: a second key that only opens (rotation) */
} cli_conn_flags;

/* The rows of the connection flags, pointing into f (cmd/conn.c). A
 * subcommand passes them in its cli_cmd (conn_opts, nconn): cli_parse
 * accepts them and cli_usage lists them in their own section. */
#define CLI_CONN_NOPTS 13
void cli_conn_rows(cli_conn_flags *f, cli_opt rows[CLI_CONN_NOPTS]);

/* Copies the flags into o (after sw_conn_opts_init). */
void cli_conn_apply(const cli_conn_flags *f, sw_conn_opts *o);
/* Checks flag combinations; CLI_EXIT_OK or a printed usage error
 * (CLI_EXIT_USAGE). */
int cli_conn_check(const cli_cmd *cmd, const cli_conn_flags *f);
/* The flags as arguments for a child process: fills argv (up to cap
 * entries, pointing into f) and returns how many. */
size_t cli_conn_argv(const cli_conn_flags *f, const char **argv, size_t cap);
/* "streamwire CMD: cannot connect to NATS server at URL: ..." with a hint
 * naming the flag to check for auth and TLS failures. */
void cli_conn_error(const char *cmd, const char *url, const cli_conn_flags *f, sw_err err);
/* "streamwire CMD: cannot WHAT: ..." for a failed registry call, with a
 * hint when the error is what a server without JetStream gives
 * (no_responders, or a timeout), followed by alt (" or pass --instance-id";
 * "" for none). */
void cli_registry_error(const char *cmd, const char *what, sw_err err, const char *alt);

/* ------------------------------------------------------------------------ */
/* --metrics-listen (cmd/metrics_http.c): GET /metrics from one thread.       */

typedef struct cli_metrics_http cli_metrics_http;
/* 1 if addr is HOST:PORT (a host of at most 127 bytes, a port of 0..65535). */
int cli_metrics_addr_ok(const char *addr);
/* Listens on addr ("HOST:PORT"; port 0 picks one) and serves m. 0, or -1
 * with the reason printed to stderr. */
int cli_metrics_http_start(cli_metrics_http **out, const char *addr, sw_metrics *m);
/* The port it listens on (useful with port 0). */
int cli_metrics_http_port(const cli_metrics_http *h);
void cli_metrics_http_stop(cli_metrics_http *h);

/* ------------------------------------------------------------------------ */
/* Stream runner: opens one stream on a router and reads it to its terminal. */

typedef struct cli_stream_req {
    const char *endpoint;
    const char *instance_id;
    uint32_t deadline_ms;
    uint32_t max_tokens;
    unsigned heartbeat_ms;
    const void *payload;
    size_t len;
    long cancel_after;   /* cancel after this many data items; -1 = never */
    long read_delay_ms;  /* sleep after each data item */
    int64_t give_up_ms;  /* > 0: stop waiting for a terminal after this long */
    int migration_limit; /* sw_request_opts.migration_limit */
    void (*on_data)(const sw_item *item, void *arg); /* may be NULL */
    void *on_data_arg;
    /* Called (may be NULL) when the stream has nothing to take right now,
     * before waiting for more: where buffered output is flushed, so that a
     * fast stream is written in large blocks and a slow one still shows each
     * item as it comes. */
    void (*on_idle)(void *arg);
} cli_stream_req;

typedef struct cli_stream_result {
    int got_terminal; /* 0 when gave up or interrupted before one */
    int interrupted;  /* a signal arrived (the stream was cancelled) */
    sw_status status;
    sw_err error;
    char reason[128];
    char message[1024];
    char instance[SW_MAX_TOKEN + 1];
    uint64_t terminal_seq;
    uint64_t items;        /* data items received */
    int64_t elapsed_ms;    /* from just before sw_router_open to the terminal */
    int64_t elapsed_us;    /* the same in microseconds */
    int64_t first_item_us; /* from just before sw_router_open to the first data item; -1: none */
    unsigned migrations;   /* the terminal's */
    char instances[(SW_MAX_TOKEN + 1) * (SW_MAX_MIGRATIONS + 2)]; /* a re-route's first too */
} cli_stream_result;

/* Returns the sw_router_open error (SW_OK when the stream was opened and
 * read; see res->got_terminal). On a signal (cli_signalled) the stream is
 * cancelled once and reading goes on to its terminal. */
sw_err cli_run_stream(sw_router *router, const cli_stream_req *req, cli_stream_result *res);

/* ------------------------------------------------------------------------ */
/* Subcommands: argv[0] is the subcommand name. Return the exit status.      */

int cli_worker_main(int argc, char **argv);
int cli_generate_main(int argc, char **argv);
int cli_demo_main(int argc, char **argv);
int cli_instances_main(int argc, char **argv);
int cli_gateway_main(int argc, char **argv);
int cli_keygen_main(int argc, char **argv);

/* generate --fanout (cmd/fanout.c): N in-process detectors, one merged
 * stream of frames (sw_merge). */
#define CLI_FANOUT_MAX 16
int cli_fanout_parse_chunks(const char *list, long *chunks, int max);
int cli_fanout_run(sw_conn *conn, sw_router *router, const char *endpoint, const char *text,
                   int fanout, const long *chunks, int nchunks, long deadline_ms, int json);

#endif
