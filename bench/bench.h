/* bench/bench.h -- streamwire-bench: what its files share (split from
 * streamwire_bench.c). The bench measures streamwire against raw nats.c, in
 * one run:
 *
 * Every scenario is measured twice, back to back, against the same
 * nats-server: once with traffic done by hand on nats.c ("raw": publish on a
 * per-request subject, subscribe, count) and once through the full library
 * (ingress + egress in this process, each on its own sw_conn, default options
 * unless stated). The table shows both figures and streamwire/raw.
 *
 *   1  long stream: 1 stream x N items of 64 B and 1 KiB   items/s, MB/s
 *      (also: a blocking sw_stream_next consumer, and the credit protocol's
 *      cost: default credit window vs a 1<<20 window)
 *   2  many short streams of 10 items at concurrency 1, 64, 1024   streams/s
 *   3  per-item latency at a fixed rate, producer send -> consumer receive
 *   4  time to first item
 *   5  idle open streams at the frontend: RSS per stream (the worker side runs
 *      in a child process so the frontend's memory is measured alone)
 *   6  optional, --callgrind: instructions per item under callgrind
 *
 * and, with no raw counterpart (issues 4 and 5; workers and frontends that
 * get killed run in child processes: this binary in a hidden mode):
 *
 *   7  instance loss: SIGKILL / SIGSTOP of a worker mid-stream -> terminal
 *      at the consumer; dead report -> another router stops routing there
 *   8  cancellation: sw_stream_cancel -> the handler's cancel callback;
 *      SIGKILL of a frontend -> the worker cancels its stream
 *   9  slow consumers: 1,000 streams read at one item per 10 ms: peak
 *      frontend RSS against the credit-window bound, loss, nats.c drops
 *
 * Only the public API (streamwire.h, nats.h) is used, except in stages.c:
 * the latency breakdown sets the transport's timing taps
 * (transport/sw_transport.h). See BENCHMARKS.md.
 *
 * Files: main.c (options, --help, the scenario table {name, fn} and the loop),
 * report.c (rows, goals, table and JSON), spawn.c (nats-server, child
 * processes and hidden modes' plumbing), world.c (connections, responders),
 * util.c (clocks, stats, latch), one sc_*.c per scenario (its hidden mode,
 * if any, with it). Threads: scenarios run one at a time on the main thread
 * and start their own helper threads; each file says which locks it has.
 */
#ifndef SW_BENCH_H
#define SW_BENCH_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "natsd.h"

/* Scenario 6 (optional): under valgrind --tool=callgrind --instr-atstart=no,
 * --callgrind collects only during each long- and short-stream run and dumps
 * one profile per run (instructions per item = dump total / items). The
 * client requests are no-ops outside valgrind. */
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define BENCH_HAVE_CALLGRIND 1
#endif
#endif
#ifndef BENCH_HAVE_CALLGRIND
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(x) ((void)(x))
#endif

extern char **environ;

#define BREQ_MAGIC 0x53574231u /* "SWB1" */
#define K_SEND 1               /* send n items of size bytes at rate/s (0 = flat out) */
#define K_IDLE 2               /* hold the stream open, send nothing */

#define IDLE_RAW_SUBJ "bench.idle.raw"
#define EP_MAIN "bench.sw.main"
#define INST_MAIN "benchmain"
#define EP_BIG "bench.sw.bigwin"
#define INST_BIG "benchbigwin"
#define EP_IDLE "bench.sw.idle"
#define INST_IDLE "benchidle"
#define EP_LOSS "bench.sw.loss"    /* workers in child processes, found via the registry */
#define LOSS_BUCKET "swbench_loss" /* registry bucket of the loss scenario */
#define EP_CANCEL "bench.sw.cancel"
#define INST_CANCEL "benchcancel"
#define EP_SLOW "bench.sw.slow"
#define INST_SLOW "benchslow"

#define MAX_LIST 8
#define BIG_WINDOW (1u << 20)

typedef struct breq {
    uint32_t magic, kind, n, size, rate, pad;
} breq;

/* ------------------------------------------------------------------ config */

typedef struct bench_cfg {
    const char *server_url; /* NULL: start our own */
    pid_t server_pid;       /* --server-pid: the --server's process, measured (0: none) */
    const char *nats_server;
    const char *json_path;
    const char *only;
    int quick;
    int send_asap;
    int handler_pool; /* --handler-pool: start_ingress's workers use the pool */
    unsigned reps;
    unsigned long items;
    size_t sizes[MAX_LIST];
    int nsizes;
    unsigned conc[MAX_LIST];
    int nconc;
    unsigned short_items;
    double short_secs;
    unsigned rate;
    double lat_secs;
    unsigned lat_segs;    /* 0: the default */
    unsigned lat_idle;    /* --latency-idle N: idle streams open at the frontend meanwhile */
    const char *lat_dump; /* --latency-dump FILE, or NULL */
    unsigned ttfi_n;
    unsigned idle_n;
    double idle_cpu_secs;
    int verbose;
    unsigned window;        /* credit_window for the streamwire runs; 0 = router default */
    int side;               /* 0 both, 1 raw only, 2 streamwire only (for profiling) */
    int callgrind;          /* wrap each long-stream run in callgrind client requests */
    unsigned trials;        /* loss: trials per kind; cancel: frontend SIGKILL trials */
    unsigned cancel_trials; /* cancel -> handler trials */
    unsigned slow_streams, slow_items, slow_delay_ms, slow_threads;
    int frozen_fe;    /* cancel: keep another frontend SIGSTOPped during the SIGKILL trials */
    unsigned live_fe; /* cancel: this many other live frontends (routers) stream meanwhile */
    const char *cli;  /* cli: the streamwire binary (NULL: next to this binary's dir) */
    unsigned long cli_items; /* cli: items of the one stream */
} bench_cfg;

extern bench_cfg cfg;

extern const char *g_url;
extern char g_cmdline[1024];
extern char g_load_start[64], g_load_end[64];

/* ------------------------------------------------------------------ latch */

typedef struct latch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int set;
} latch;

/* ------------------------------------------------------------------ results */

typedef struct row {
    char scenario[40];
    char param[48];
    char metric[24];
    double raw, sw;
    int lower_better;
    int prec;
    char note[200];
} row;

/* ------------------------------------------------------------------ 1 + 3: one stream */

/* Where each item's latency went (bench/stages.c): n entries each, ns;
 * STAGE_NONE for an item with no breakdown (wire may be < 0: received
 * before its publish returned). */
#define STAGE_NONE INT64_MIN
typedef struct stage_times {
    int64_t *send, *recv, *pub, *wire;
} stage_times;

typedef struct stream_run {
    unsigned long n;
    size_t size;
    unsigned rate;
    int64_t *lat;       /* n entries, or NULL */
    stage_times *stage; /* the latency breakdown (n entries each), or NULL */
    int hold_all;       /* raw: the subscription's pending limits hold all n items (lossless,
                           as a nats.c user who must not lose any sets them); else nats.c's
                           defaults, whose drops are counted */
    /* out */
    double secs;
    double cpu_us, srv_cpu_us; /* this process / nats-server CPU during the run */
    double csw;                /* context switches of this process during the run */
    unsigned long received;
    int64_t dropped;
    int ok;
    char err[160];
} stream_run;

/* bench/stages.c: the latency breakdown. stages_arm before a stream's run
 * (pub: the connection the items are published on, rx: the one they
 * arrive on; NULL for raw's), stages_disarm after; the sender calls
 * stages_sending just before it sends item i (streamwire) or
 * stages_raw_published after raw's publish of it (buf: the item); the
 * consumer calls stages_received in its callback (via_library: 1
 * streamwire, 0 raw). stages_disarm works out `out`. */
void stages_arm(stage_times *out, unsigned long n, size_t size, sw_conn *pub, sw_conn *rx);
void stages_disarm(void);
void stages_sending(unsigned long i, const uint8_t *buf);
void stages_raw_published(unsigned long i, const uint8_t *buf, int64_t begin, int64_t end);
void stages_received(unsigned long i, const void *data, size_t len, int64_t now, int via_library);

/* ------------------------------------------------------------------ 2 + 4: short streams */

typedef struct one_res {
    int64_t ttfi;
    char err[160];
} one_res;

/* ------------------------------------------------------------------ 5: idle streams */

/* The worker side runs in a child process (this binary with --idle-worker),
 * so this process's RSS is the frontend's alone. Line protocol on its
 * stdin/stdout: "stat" -> "stat <rss_kb> <raw_reqs> <sw_held> <cpu_us>",
 * "release" -> "released", "quit". */

typedef struct child {
    pid_t pid;
    int to, from;
    char buf[512];
    size_t blen;
} child;

typedef struct cstat {
    long rss_kb;
    unsigned long raw, sw; /* streams the idle worker took in (never less) */
    long long cpu_us;
    unsigned long held; /* streams in its ingress's table now (sw_ingress_stats.streams_held) */
} cstat;

typedef struct goal {
    int issue;
    const char *name, *target;
    char measured[224];
    int known, met;
} goal;

/* ---------------------------------------------------------- util.c */

void loadavg(char *out, size_t cap);
int64_t now_ns(void);
void sleep_until_ns(int64_t t);
void sleep_ms(int ms);
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void stamp(uint8_t *buf, size_t size);
int64_t unstamp(const void *data, size_t len, int64_t now);
int cmp_i64(const void *a, const void *b);
/* Percentile of a sorted array (nearest rank). */
double pct(const int64_t *v, size_t n, double q);
double median(double *v, unsigned n);
long status_kb(const char *path, const char *key);
long self_rss_kb(void);
/* Context switches of this process, all threads (voluntary + involuntary). */
int64_t self_csw(void);
int64_t self_cpu_us(void);
/* Resets VmHWM to the current RSS (Linux >= 4.0). 0 ok. */
int reset_peak_rss(void);
void latch_init(latch *l);
void latch_fini(latch *l);
void latch_set(latch *l);
/* Waits up to timeout_ns (< 0: forever). 1 if set. */
int latch_wait(latch *l, int64_t timeout_ns);

/* ---------------------------------------------------------- spawn.c */

extern swh_nats g_nats;
extern char g_server_version[64];
void cleanup(void);
/* Async-signal-safe version of cleanup for SIGINT/SIGTERM. */
void on_signal(int sig);
/* Starts nats-server -js on a free port with a fresh store dir (support/natsd.c).
 * bin (--nats-server) is handed to the launcher as SW_NATS_SERVER; a name
 * without a slash is looked up on PATH first, as execlp did. NULL: the
 * launcher's default (SW_NATS_SERVER, else nats-server on PATH). Called
 * before any thread exists (it forks). */
void start_server(const char *bin);
void server_version(pid_t pid); /* fills g_server_version from the binary of pid */
long server_rss_kb(void);
/* Server CPU time in microseconds (utime + stime), -1 if unknown. */
int64_t server_cpu_us(void);
/* CPU time of a process in microseconds (utime + stime, /proc), -1 if unknown. */
int64_t pid_cpu_us(pid_t pid);
/* Starts the program at path (not this binary) with argv: its stdout to
 * out_fd, or (out_fd < 0) to a pipe whose read end goes to *pipe_rd; its
 * stderr to /dev/null unless --verbose. Killed if the bench exits first. */
pid_t spawn_prog(const char *path, char *const argv[], int out_fd, int *pipe_rd);
/* Waits up to wait_ms for it to exit (-1: for ever), then kills it; its
 * wait status (-1 unknown) and, if ru is not NULL, its CPU usage. */
int reap_prog(pid_t pid, int wait_ms, struct rusage *ru);
int child_line(child *c, char *out, size_t cap, int timeout_ms);
int child_cmd(child *c, const char *cmd, char *out, size_t cap);
void child_stat(child *c, cstat *st);
/* Starts this binary in a hidden mode (argv[1] onwards) with its stdin and
 * stdout on pipes; does not wait for it. Main thread only (the child's
 * PR_SET_PDEATHSIG fires when the spawning thread exits). */
void child_start(child *c, char *const argv[]);
/* Closes the pipes, kills the child if it has not exited within wait_ms,
 * and reaps it. */
void child_reap(child *c, int wait_ms);
void child_spawn(child *c, unsigned n);
void child_quit(child *c);

/* ---------------------------------------------------------- world.c */

/* The raw side runs in both of nats.c's publish modes, and each row
 * compares streamwire with the better one for that metric (issue 17):
 * send-asap (one socket write per publish, nats.c's latency mode) and
 * buffered (nats.c's flusher thread, its throughput mode). g_raw_mode picks
 * the connections and the responder subject of the raw runs; set it only
 * between runs, on the main thread. */
enum { RAW_ASAP, RAW_BUFFERED, RAW_MODES };
extern int g_raw_mode;
extern const char *const g_raw_mode_name[RAW_MODES];
natsConnection *raw_connect(const char *url, const char *name, int asap);
/* A connection that seals with the cluster key in key_file (NULL: plain),
 * with send-asap on (asap 1) or off, whatever --no-send-asap says. */
sw_conn *sw_connect_mode(const char *url, const char *name, const char *key_file, int asap);
/* Plain, send-asap as --no-send-asap says. */
sw_conn *sw_connect(const char *url, const char *name);
extern natsConnection *g_raw_fronts[RAW_MODES], *g_raw_works[RAW_MODES];
extern natsSubscription *g_raw_resp_subs[RAW_MODES];
/* Of the current g_raw_mode. */
natsConnection *raw_front(void);
natsConnection *raw_work(void);
const char *raw_req_subj(void);
/* The better of the two raw modes' figures (NaN ignored); *which (may be
 * NULL) gets the winner's mode. */
double raw_best(double asap, double buffered, int lower_better, int *which);
/* Rep by rep (the sides of a rep ran back to back), streamwire at its best
 * over raw at its best, a rate (higher better) in each of n reps: the
 * lowest and highest of those ratios (NAN without a rep with both). */
void rep_ratio_range(const double *raw_a, const double *raw_b, const double *sw_a,
                     const double *sw_b, unsigned n, double *lo, double *hi);
/* Appends "; raw best: <mode> (send-asap X, buffered Y)" to note. */
void raw_best_note(char *note, size_t cap, double asap, double buffered, int which, int prec);
/* Appends "<who> best: <mode> (send-asap A, buffered B)" to note. */
void best_note(char *note, size_t cap, const char *who, double asap, double buffered, int which,
               int prec);
/* The hand-written responder: publishes n items to the request's reply
 * subject, on nats.c's delivery thread of its one subscription. */
void raw_responder_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg);
extern sw_conn *g_sw_front, *g_sw_work;
extern sw_router *g_router;
extern sw_ingress *g_ing_main, *g_ing_big;
extern unsigned g_default_window;
void sw_bench_handler(sw_responder *r, void *arg);
/* The instance the short-stream runs address (INST_MAIN; the sealed
 * scenario points it at its own). */
extern const char *g_sw_inst;
/* Closed loop of short streams (sc_short.c): streams/s. */
double run_short(int sw, unsigned conc, unsigned long *errors, char *err, size_t errcap,
                 double *cpu, double *csw);
sw_ingress *start_ingress(const char *ep, const char *inst, unsigned max_inflight,
                          unsigned max_window);
/* Another streamwire world beside the main one (the sealed scenario's, the
 * short streams' other publish mode): two connections (sealed with
 * key_file when not NULL; send-asap on or off), a router, and an ingress
 * on EP_MAIN as instance inst sized for the largest --concurrency. */
typedef struct bench_world {
    sw_conn *front, *work;
    sw_router *router;
    sw_ingress *ing;
} bench_world;
void bench_world_open(bench_world *w, const char *tag, const char *key_file, int asap,
                      const char *inst);
void bench_world_close(bench_world *w);
/* Streamwire in the other publish mode (send-asap off when the main world
 * has it on, the default; on with --no-send-asap): its own connections,
 * router and ingress (instance INST_ALT), made on first use, so that the
 * long- and short-stream rows compare streamwire at its best for the metric
 * with raw at its best, as the raw side is measured in both modes. Each
 * scenario closes it when done: its threads would only add noise to the
 * scenarios that follow. */
#define INST_ALT "benchmainalt"
bench_world *bench_alt_world(void);
void bench_alt_world_close(void);

/* ---------------------------------------------------------- report.c */

extern row g_rows[256];
extern int g_nrows;
row *add_row(const char *scen, const char *param, const char *metric, double raw, double sw,
             int lower_better, int prec, const char *note);
extern double g_goal_long64, g_goal_long1k;
extern double g_goal_short64, g_goal_short1;
/* their ratios' range over the reps (rep_ratio_range) */
extern double g_goal_long64_rng[2], g_goal_long1k_rng[2], g_goal_short64_rng[2],
    g_goal_short1_rng[2];
/* CPU per 64 B item, this process + nats-server: streamwire, and raw in
 * its mode with the lower sum */
extern double g_goal_cpu64_sw, g_goal_cpu64_raw;
extern double g_goal_cli; /* the CLI end to end, sw / raw at its best */
/* "" or the raw mode whose every rep lost items: raw's best is then not
 * known, and the CLI goal is not called met */
extern const char *g_goal_cli_raw_failed;
extern double g_goal_p99_raw, g_goal_p99_sw, g_goal_p99_seg;
extern double g_goal_p99_lib;     /* p99 of streamwire's own time per item (bench/stages.c) */
extern double g_goal_p99_own_gap; /* the p99 gap that own time makes on raw's samples */
extern double g_goal_p99_ci_lo, g_goal_p99_ci_hi; /* the pooled gap's 90 % interval (bootstrap) */
extern double g_goal_idle_bps;
extern double g_goal_idle_cpu_front, g_goal_idle_cpu_worker;   /* % of one core */
extern double g_goal_idle_cpu_front0, g_goal_idle_cpu_worker0; /* the same, no stream open */
extern double g_goal_idle_ci_front, g_goal_idle_ci_worker;     /* ~90 % half-widths of the costs */
extern double g_goal_idle_drift_front, g_goal_idle_drift_worker; /* no-stream after - before */
extern unsigned g_goal_idle_window;
extern double g_credit_cost[MAX_LIST];
void print_table(void);
void print_goals(void);
void write_json(const char *path);

/* ---------------------------------------------------------- sc_long.c */

/* Raw: a publisher thread on the worker connection publishes n messages on a
 * fresh subject; an async subscription on the frontend connection counts
 * them. nats.c's default pending limits apply (no flow control): drops are
 * reported. */
void run_raw_stream(stream_run *r);
/* Streamwire: one sw_router_open; the worker's handler sends n items and
 * finishes. Callback consumer (blocking = 0) or sw_stream_next (1). */
void run_sw_stream(stream_run *r, const char *ep, const char *inst, unsigned window, int blocking);
void scen_long(void);

/* ---------------------------------------------------------- sc_short.c */

/* Raw request-many as written by hand: subscribe to a fresh inbox, publish
 * the request with it as reply subject, take n messages, unsubscribe. */
int one_raw_stream(unsigned n, size_t size, one_res *o);
int one_sw_stream(unsigned n, size_t size, one_res *o);
void scen_short(void);

/* ---------------------------------------------------------- sc_latency.c */

/* Raw and streamwire alternate in short segments (a new stream each), so a
 * burst of load from elsewhere on a shared machine hits both alike. */
void scen_latency(void);

/* ---------------------------------------------------------- sc_first_item.c */

void scen_ttfi(void);
void scen_sealed(void);
/* What scenarios made for themselves, freed before the shared connections. */
void scen_long_fini(void);
void scen_sealed_fini(void);
void scen_short_fini(void);

/* ---------------------------------------------------------- sc_idle.c */

void scen_idle(void);
/* Idle streams in the background of another scenario: n streams opened by
 * g_router to an idle worker in a child process (sc_idle.c), which holds
 * them and sends nothing but heartbeats; closed and the child reaped by
 * idle_background_close. */
typedef struct idle_bg {
    child c;
    sw_stream **ss;
    unsigned n;
} idle_bg;
void idle_background_open(idle_bg *b, unsigned n);
void idle_background_close(idle_bg *b);
int idle_worker_main(const char *url, unsigned n);

/* ---------------------------------------------------------- sc_loss.c */

/* Workers run in child processes (this binary with --worker-mode), each
 * registered in the registry bucket LOSS_BUCKET with default options.
 * Router A (this process; own sw_conn, sw_registry and sw_router, default
 * options) holds a stream to the victim and is the one that detects the loss
 * and reports it. Router B (own sw_conn, sw_registry and sw_router, probes
 * effectively off) sends a short request, routed by the registry, every
 * 2 ms, and logs which instance each one was routed to. */

int loss_worker_main(const char *url, const char *bucket, const char *inst);
void loss_rt_log(void *arg, sw_log_level lvl, const char *msg);
/* The rows of a streamwire-only latency set (raw column "-"): "p50 <unit>"
 * (note50), "p99 <unit>" (note99) and, when with_max, "max <unit>". v holds n
 * ns values, sorted in place; unit is "ms" or "us". Returns the p99. */
double lat_rows_sw(const char *scen, const char *param, int64_t *v, size_t n, const char *unit,
                   int prec, int with_max, const char *note50, const char *note99);
extern double g_goal_kill_p99, g_goal_stop_p99, g_goal_report_p99;
extern double g_goal_after_report;
extern unsigned g_goal_loss_n;
void scen_loss(void);

/* A worker in a child process (--worker-mode), registered in LOSS_BUCKET
 * on EP_LOSS (sc_loss.c; sc_migration.c uses them too). */
typedef struct lkid {
    child c;
    char inst[SW_MAX_TOKEN + 1];
    int state; /* 0 free, 1 starting, 2 ready */
    unsigned seq;
} lkid;
void lkid_start(lkid *k);
/* Waits for its "ready" and for registry handles a and b (b may be NULL) to
 * list it. */
void lkid_wait(lkid *k, sw_registry *a, sw_registry *b);

/* ---------------------------------------------------------- sc_migration.c */

void scen_migration(void);

/* ---------------------------------------------------------- sc_cancel.c */

/* Hidden mode --frontend-mode URL: a frontend process that, on "go", opens a
 * stream to INST_CANCEL, prints "streaming <request id>" after the first
 * item and reads until it is killed. */
int frontend_main(const char *url);
extern double g_goal_cancel_p99, g_goal_fekill_p99;
void scen_cancel(void);

/* ---------------------------------------------------------- sc_slow.c */

int slow_worker_main(const char *url, unsigned n);
extern double g_goal_slow_peak_mib, g_goal_slow_bound_mib;
extern double g_goal_slow_pending;
extern unsigned g_goal_slow_window, g_goal_slow_n;
extern int g_goal_slow_lossless;
void scen_slow(void);
void scen_cli(void);

/* ---------------------------------------------------------- main.c */

#endif
