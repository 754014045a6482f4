/* bench/sc_loss.c -- streamwire-bench: scenario 7: instance loss (SIGKILL /
 * SIGSTOP of a worker in a child process, dead reports through the registry),
 * and the hidden mode --worker-mode.
 *
 * Threads and locks: g_loss_mu guards the victim and its report times
 * (registry log and watch callbacks); g_b.mu guards router B's picks (its
 * thread and callbacks). */
#include "bench.h"

/* ------------------------------------------------------------------ 7: instance loss (issue 4) */

/* Workers run in child processes (this binary with --worker-mode), each
 * registered in the registry bucket LOSS_BUCKET with default options.
 * Router A (this process; own sw_conn, sw_registry and sw_router, default
 * options) holds a stream to the victim and is the one that detects the loss
 * and reports it. Router B (own sw_conn, sw_registry and sw_router, probes
 * effectively off) sends a short request, routed by the registry, every
 * 2 ms, and logs which instance each one was routed to. */

int
loss_worker_main(const char *url, const char *bucket, const char *inst)
{
    sw_ingress_opts io;
    sw_ingress *ing = NULL;
    sw_registry_opts ro;
    sw_registry *reg = NULL;
    sw_registration rg;
    sw_err e;
    char line[64];
    pid_t parent = getppid();

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_sw_work = sw_connect(url, "bench-loss-worker");
    sw_ingress_opts_init(&io);
    io.endpoint = EP_LOSS;
    io.instance_id = inst;
    io.handler = sw_bench_handler;
    io.max_inflight = 256;
    if ((e = sw_ingress_start(&ing, g_sw_work, &io)) != SW_OK)
        die("loss worker: sw_ingress_start: %s", sw_err_name(e));
    sw_registry_opts_init(&ro);
    ro.bucket = bucket;
    if ((e = sw_registry_open(&reg, g_sw_work, &ro)) != SW_OK ||
        (e = sw_ingress_registration(ing, &rg)) != SW_OK ||
        (e = sw_registry_register(reg, &rg)) != SW_OK)
        die("loss worker: registry: %s", sw_err_name(e));
    printf("ready\n");
    while (fgets(line, sizeof(line), stdin) != NULL)
        if (strncmp(line, "quit", 4) == 0)
            break;
    (void)sw_registry_deregister(reg, inst);
    sw_registry_close(reg);
    sw_ingress_destroy(ing);
    sw_conn_close(g_sw_work);
    nats_Close();
    return 0;
}

static pthread_mutex_t g_loss_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_loss_victim[SW_MAX_TOKEN + 1]; /* "" between trials */
static int64_t g_loss_rep_t;                 /* A's registry logged "reported <victim> dead" */
static int64_t g_loss_rm_a_t;                /* REMOVED <victim> in A's registry handle */
static int64_t g_loss_rm_b_t;                /* REMOVED <victim> in B's registry handle */

static int
loss_is_victim_locked(const char *id)
{
    return g_loss_victim[0] != '\0' && id != NULL && strcmp(id, g_loss_victim) == 0;
}

/* Router A's registry log: the line the registry writes once the tombstone
 * of a dead report is stored ("registry: reported <id> dead (...)") is the
 * report's completion time. */
static void
loss_reg_log(void *arg, sw_log_level lvl, const char *msg)
{
    static const char pre[] = "registry: reported ";
    int64_t t = now_ns();
    (void)arg;
    if (strncmp(msg, pre, sizeof(pre) - 1) == 0) {
        const char *id = msg + sizeof(pre) - 1;
        size_t l;
        pthread_mutex_lock(&g_loss_mu);
        l = strlen(g_loss_victim);
        if (l > 0 && strncmp(id, g_loss_victim, l) == 0 && id[l] == ' ' && g_loss_rep_t == 0)
            g_loss_rep_t = t;
        pthread_mutex_unlock(&g_loss_mu);
    }
    if (cfg.verbose)
        progress("  [A registry %s] %s", sw_log_level_name(lvl), msg);
}

void
loss_rt_log(void *arg, sw_log_level lvl, const char *msg)
{
    progress("  [%s %s] %s", (const char *)arg, sw_log_level_name(lvl), msg);
}

/* Watcher on a registry handle: the first REMOVED of the victim. */
static void
loss_watch(void *arg, sw_registry_event ev, const sw_instance *inst)
{
    int64_t t = now_ns();
    int64_t *slot = arg;
    if (ev != SW_REGISTRY_REMOVED)
        return;
    pthread_mutex_lock(&g_loss_mu);
    if (loss_is_victim_locked(inst->instance_id) && *slot == 0)
        *slot = t;
    pthread_mutex_unlock(&g_loss_mu);
}

typedef struct bsub {
    struct bsub *next;
    sw_stream *s;
    int64_t t_open;
    size_t idx; /* in the pick log */
    atomic_int done;
    int status;
    sw_err err;
} bsub;

typedef struct bpick {
    int64_t t;  /* when sw_router_open returned (the pick is made inside it) */
    int victim; /* routed to the current victim */
    int result; /* -1 open, 0 failed, 1 completed */
} bpick;

static struct {
    sw_conn *conn;
    sw_registry *reg;
    sw_router *rt;
    int watch;
    pthread_t th;
    atomic_int stop;
    pthread_mutex_t mu;
    bpick *log;
    size_t n, cap;
    unsigned long opened, failed, open_errors;
    unsigned long f_incomplete, f_lost, f_noresp, f_other, f_stuck; /* failures by cause */
    bsub *grave; /* reaped, freed after the router is destroyed */
} g_b = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void
b_item(sw_stream *s, const sw_item *it, void *arg)
{
    bsub *x = arg;
    (void)s;
    if (it->kind == SW_ITEM_TERMINAL) {
        x->status = (int)it->terminal.status;
        x->err = it->terminal.error;
        atomic_store(&x->done, 1);
    }
}

/* Closes B's finished streams (all: every one; else those with a terminal
 * and those open for more than 3 s, which count as failed). */
static void
b_reap(bsub **head, int all)
{
    int64_t now = now_ns();
    bsub **pp = head;
    while (*pp != NULL) {
        bsub *x = *pp;
        int done = atomic_load(&x->done);
        if (done || all || now - x->t_open > 3000000000LL) {
            int ok = done && x->status == SW_STATUS_COMPLETED;
            sw_stream_close(x->s);
            pthread_mutex_lock(&g_b.mu);
            g_b.log[x->idx].result = ok;
            if (!ok) {
                g_b.failed++;
                if (!done)
                    g_b.f_stuck++;
                else if (x->err == SW_STREAM_INCOMPLETE)
                    g_b.f_incomplete++;
                else if (x->err == SW_INSTANCE_LOST)
                    g_b.f_lost++;
                else if (x->err == SW_NO_RESPONDERS)
                    g_b.f_noresp++;
                else
                    g_b.f_other++;
            }
            pthread_mutex_unlock(&g_b.mu);
            *pp = x->next;
            x->next = g_b.grave;
            g_b.grave = x;
        } else {
            pp = &x->next;
        }
    }
}

static void *
b_main(void *arg)
{
    bsub *live = NULL;
    breq q = {BREQ_MAGIC, K_SEND, 1, 64, 0, 0};
    (void)arg;
    while (!atomic_load(&g_b.stop)) {
        sw_request_opts ro;
        bsub *x = calloc(1, sizeof(*x));
        int64_t t;
        sw_err e;
        if (x == NULL)
            die("out of memory");
        atomic_init(&x->done, 0);
        sw_request_opts_init(&ro);
        ro.endpoint = EP_LOSS;
        ro.on_item = b_item;
        ro.on_item_arg = x;
        e = sw_router_open(&x->s, g_b.rt, &ro, &q, sizeof(q));
        t = now_ns();
        if (e != SW_OK) {
            g_b.open_errors++;
            free(x);
            sleep_ms(2);
            continue;
        }
        x->t_open = t;
        {
            int victim;
            pthread_mutex_lock(&g_loss_mu);
            victim = loss_is_victim_locked(sw_stream_instance_id(x->s));
            pthread_mutex_unlock(&g_loss_mu);
            pthread_mutex_lock(&g_b.mu);
            if (g_b.n == g_b.cap) {
                size_t ncap = g_b.cap ? g_b.cap * 2 : 4096;
                bpick *nv = realloc(g_b.log, ncap * sizeof(*nv));
                if (nv == NULL)
                    die("out of memory");
                g_b.log = nv;
                g_b.cap = ncap;
            }
            x->idx = g_b.n;
            g_b.log[g_b.n].t = t;
            g_b.log[g_b.n].victim = victim;
            g_b.log[g_b.n].result = -1;
            g_b.n++;
            g_b.opened++;
            pthread_mutex_unlock(&g_b.mu);
        }
        x->next = live;
        live = x;
        b_reap(&live, 0);
        sleep_until_ns(t + 2000000LL);
    }
    b_reap(&live, 1);
    return NULL;
}

static unsigned g_lkid_seq;

void
lkid_start(lkid *k)
{
    char *argv[6];
    k->seq = ++g_lkid_seq;
    snprintf(k->inst, sizeof(k->inst), "lw%d-%u", (int)getpid(), k->seq);
    argv[0] = (char *)"streamwire-bench";
    argv[1] = (char *)"--worker-mode";
    argv[2] = (char *)g_url;
    argv[3] = (char *)LOSS_BUCKET;
    argv[4] = k->inst;
    argv[5] = NULL;
    child_start(&k->c, argv);
    k->state = 1;
}

/* 1 if the registry handle lists inst as live on EP_LOSS. */
static int
reg_has(sw_registry *reg, const char *inst)
{
    sw_instance *v = NULL;
    size_t n = 0;
    int found = 0;
    if (sw_registry_list(reg, EP_LOSS, &v, &n) != SW_OK)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].instance_id, inst) == 0)
            found = 1;
    sw_instances_free(v, n);
    return found;
}

/* Waits for the worker's "ready" and for both routers' registry views to
 * list it. */
void
lkid_wait(lkid *k, sw_registry *a, sw_registry *b)
{
    char line[64];
    int64_t until;
    if (k->state == 1) {
        if (child_line(&k->c, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0)
            die("loss worker %s did not start", k->inst);
        k->state = 2;
    }
    until = now_ns() + 10000000000LL;
    while (!reg_has(a, k->inst) || (b != NULL && !reg_has(b, k->inst))) {
        if (now_ns() > until)
            die("loss worker %s registered but is not listed by both routers after 10 s", k->inst);
        sleep_ms(2);
    }
}

typedef struct asink {
    atomic_ulong items;
    int64_t t_term;
    int status;
    sw_err err;
    char reason[96];
    latch done;
} asink;

static void
a_item(sw_stream *s, const sw_item *it, void *arg)
{
    asink *k = arg;
    (void)s;
    if (it->kind == SW_ITEM_DATA) {
        atomic_fetch_add(&k->items, 1);
        return;
    }
    k->t_term = now_ns();
    k->status = (int)it->terminal.status;
    k->err = it->terminal.error;
    snprintf(k->reason, sizeof(k->reason), "%s", it->terminal.reason);
    latch_set(&k->done);
}

typedef struct ltrial {
    int stop; /* 0 SIGKILL, 1 SIGSTOP */
    int ok;   /* the trial ran to the end */
    int64_t start_t, kill_t, term_t, rep_t, rm_a_t, rm_b_t, end_t;
    int lost; /* terminal was error instance_lost */
    char term[64];
    /* from B's pick log */
    int64_t b_last_dead_t; /* B's last pick of the victim in the trial */
    unsigned dead_picks, after_report, after_report_failed, after_view;
    int64_t after_report_lag; /* latest such pick - report */
} ltrial;

/* The rows of a streamwire-only latency set (raw column "-"): "p50 <unit>"
 * (note50), "p99 <unit>" (note99) and, when with_max, "max <unit>". v holds n
 * ns values, sorted in place; unit is "ms" or "us". Returns the p99. */
double
lat_rows_sw(const char *scen, const char *param, int64_t *v, size_t n, const char *unit, int prec,
            int with_max, const char *note50, const char *note99)
{
    double div = strcmp(unit, "ms") == 0 ? 1e6 : 1e3;
    double p99;
    char metric[16];
    qsort(v, n, sizeof(*v), cmp_i64);
    p99 = pct(v, n, 0.99) / div;
    snprintf(metric, sizeof(metric), "p50 %s", unit);
    add_row(scen, param, metric, NAN, pct(v, n, 0.50) / div, 1, prec, note50);
    snprintf(metric, sizeof(metric), "p99 %s", unit);
    add_row(scen, param, metric, NAN, p99, 1, prec, note99);
    if (with_max) {
        snprintf(metric, sizeof(metric), "max %s", unit);
        add_row(scen, param, metric, NAN, n ? (double)v[n - 1] / div : NAN, 1, prec, "");
    }
    return p99;
}

/* goal inputs (issue 4) */
double g_goal_kill_p99 = NAN, g_goal_stop_p99 = NAN, g_goal_report_p99 = NAN;
double g_goal_after_report = NAN;
unsigned g_goal_loss_n;

static void
loss_rows(ltrial *tr, unsigned ntr, const char *err)
{
    int64_t *v = calloc(ntr + 1, sizeof(int64_t));
    size_t n;
    double p99;
    char param[48], note[200];
    unsigned lost[2] = {0, 0}, ran[2] = {0, 0}, after[2] = {0, 0}, afterf[2] = {0, 0};
    unsigned reported = 0, dead_picks[2] = {0, 0}, after_view[2] = {0, 0};
    int64_t lag[2] = {0, 0};
    if (v == NULL)
        die("out of memory");
    for (unsigned i = 0; i < ntr; i++)
        if (tr[i].ok) {
            ran[tr[i].stop]++;
            lost[tr[i].stop] += tr[i].lost;
            after[tr[i].stop] += tr[i].after_report;
            afterf[tr[i].stop] += tr[i].after_report_failed;
            dead_picks[tr[i].stop] += tr[i].dead_picks;
            after_view[tr[i].stop] += tr[i].after_view;
            if (tr[i].after_report_lag > lag[tr[i].stop])
                lag[tr[i].stop] = tr[i].after_report_lag;
            reported += tr[i].rep_t != 0;
        }
    for (int stop = 0; stop < 2; stop++) {
        const char *sig = stop ? "SIGSTOP" : "SIGKILL";
        n = 0;
        for (unsigned i = 0; i < ntr; i++)
            if (tr[i].ok && tr[i].stop == stop && tr[i].term_t)
                v[n++] = tr[i].term_t - tr[i].kill_t;
        snprintf(param, sizeof(param), "%s mid-stream -> terminal, %zu trials", sig, n);
        snprintf(note, sizeof(note),
                 "terminal instance_lost in %u/%u; router A defaults (probe %s)%s%.100s",
                 lost[stop], ran[stop], stop ? "100 ms, timeout 300 ms x 2 misses" : "100 ms",
                 err[0] ? "; " : "", err);
        p99 = lat_rows_sw("7 instance loss", param, v, n, "ms", 1, 1, note,
                          stop ? "goal <= 1500 ms (issue 4)" : "goal <= 250 ms (issue 4)");
        if (stop)
            g_goal_stop_p99 = p99;
        else
            g_goal_kill_p99 = p99;
    }
    /* the report's write, after the consumer's terminal */
    n = 0;
    for (unsigned i = 0; i < ntr; i++)
        if (tr[i].ok && tr[i].rep_t && tr[i].term_t)
            v[n++] = tr[i].rep_t - tr[i].term_t;
    snprintf(param, sizeof(param), "A's terminal -> report stored, %zu trials", n);
    snprintf(note, sizeof(note),
             "report time = router A's registry logs the stored tombstone; %u/%u trials "
             "reported",
             reported, ran[0] + ran[1]);
    lat_rows_sw("7 instance loss", param, v, n, "ms", 2, 0, note, "");
    for (int stop = 1; stop >= 0; stop--) {
        const char *sig = stop ? "SIGSTOP" : "SIGKILL";
        n = 0;
        for (unsigned i = 0; i < ntr; i++)
            if (tr[i].ok && tr[i].stop == stop && tr[i].rep_t && tr[i].b_last_dead_t)
                v[n++] = tr[i].b_last_dead_t - tr[i].rep_t;
        snprintf(param, sizeof(param), "report -> B's last pick of it, %s", sig);
        snprintf(note, sizeof(note),
                 stop ? "signed; B: own conn+registry+router, probes off, a request every 2 ms "
                        "round robin over all live workers"
                      : "< 0: B had stopped before the report (its own no-responders re-route "
                        "quarantines locally)");
        lat_rows_sw("7 instance loss", param, v, n, "ms", 1, 1, note, "");
    }
    n = 0;
    for (unsigned i = 0; i < ntr; i++)
        if (tr[i].ok && tr[i].rep_t && tr[i].rm_b_t)
            v[n++] = tr[i].rm_b_t - tr[i].rep_t;
    snprintf(param, sizeof(param), "report -> REMOVED at router B, %zu trials", n);
    lat_rows_sw("7 instance loss", param, v, n, "ms", 2, 1,
                "watch event in B's registry handle; from then on B's pool can pick survivors "
                "only",
                "");
    /* goal: report -> all other routers = max(B stops picking, B's view) */
    n = 0;
    for (unsigned i = 0; i < ntr; i++)
        if (tr[i].ok && tr[i].rep_t && tr[i].rm_b_t) {
            int64_t a = tr[i].rm_b_t, b = tr[i].b_last_dead_t ? tr[i].b_last_dead_t : a;
            v[n++] = (a > b ? a : b) - tr[i].rep_t;
        }
    qsort(v, n, sizeof(*v), cmp_i64);
    g_goal_report_p99 = pct(v, n, 0.99) / 1e6;
    for (int stop = 1; stop >= 0; stop--) {
        snprintf(param, sizeof(param), "B requests to dead after report, %s",
                 stop ? "SIGSTOP" : "SIGKILL");
        snprintf(note, sizeof(note),
                 "%u trials; %u failed; latest %.1f ms after the report; %u after B's REMOVED "
                 "event; %u picks of it since the %s",
                 ran[stop], afterf[stop], (double)lag[stop] / 1e6, after_view[stop],
                 dead_picks[stop], stop ? "stop" : "kill");
        add_row("7 instance loss", param, "count", NAN, after[stop], 1, 0, note);
    }
    snprintf(note, sizeof(note),
             "one every 2 ms; %lu failed: stream_incomplete %lu, instance_lost %lu, "
             "no_responders %lu, other %lu, closed by the bench before a terminal %lu; "
             "open errors %lu",
             g_b.failed, g_b.f_incomplete, g_b.f_lost, g_b.f_noresp, g_b.f_other, g_b.f_stuck,
             g_b.open_errors);
    add_row("7 instance loss", "router B, whole scenario", "requests", NAN, (double)g_b.opened, 0,
            0, note);
    g_goal_after_report = after[0] + after[1];
    g_goal_loss_n = ran[0] + ran[1];
    free(v);
}

void
scen_loss(void)
{
    unsigned T = cfg.trials, ntr = 2 * cfg.trials;
    ltrial *tr = calloc(ntr, sizeof(*tr));
    lkid kid[3];
    sw_conn *ca;
    sw_registry *rega = NULL;
    sw_router *rta = NULL;
    sw_registry_opts rgo;
    sw_router_opts rto;
    int wa = 0;
    sw_err e;
    char err[160] = "";

    if (tr == NULL)
        die("out of memory");
    progress("7 instance loss: %u SIGKILL + %u SIGSTOP trials, alternating (workers in child "
             "processes, registry bucket %s)",
             T, T, LOSS_BUCKET);
    memset(kid, 0, sizeof(kid));
    ca = sw_connect(g_url, "bench-loss-router-a");
    sw_registry_opts_init(&rgo);
    rgo.bucket = LOSS_BUCKET;
    rgo.log = loss_reg_log;
    if ((e = sw_registry_open(&rega, ca, &rgo)) != SW_OK) {
        snprintf(err, sizeof(err), "skipped: sw_registry_open: %s (needs nats-server -js)",
                 sw_err_name(e));
        progress("  %s", err);
        sw_conn_close(ca);
        loss_rows(tr, 0, err);
        free(tr);
        return;
    }
    if ((e = sw_registry_watch(rega, loss_watch, &g_loss_rm_a_t, &wa)) != SW_OK)
        die("sw_registry_watch: %s", sw_err_name(e));
    sw_router_opts_init(&rto);
    rto.registry = rega;
    rto.log = cfg.verbose ? loss_rt_log : NULL;
    rto.log_arg = (void *)"router A";
    if ((e = sw_router_create(&rta, ca, &rto)) != SW_OK)
        die("router A: %s", sw_err_name(e));

    g_b.conn = sw_connect(g_url, "bench-loss-router-b");
    sw_registry_opts_init(&rgo);
    rgo.bucket = LOSS_BUCKET;
    if ((e = sw_registry_open(&g_b.reg, g_b.conn, &rgo)) != SW_OK ||
        (e = sw_registry_watch(g_b.reg, loss_watch, &g_loss_rm_b_t, &g_b.watch)) != SW_OK)
        die("router B registry: %s", sw_err_name(e));
    sw_router_opts_init(&rto);
    rto.registry = g_b.reg;
    rto.probe_interval_ms = 3600000; /* effectively off: B learns only from the registry
                                        (and from no-responders on its own requests) */
    if ((e = sw_router_create(&g_b.rt, g_b.conn, &rto)) != SW_OK)
        die("router B: %s", sw_err_name(e));

    lkid_start(&kid[0]);
    lkid_start(&kid[1]);
    lkid_wait(&kid[0], rega, g_b.reg);
    lkid_wait(&kid[1], rega, g_b.reg);
    atomic_store(&g_b.stop, 0);
    if (pthread_create(&g_b.th, NULL, b_main, NULL) != 0)
        die("pthread_create");

    for (unsigned i = 0; i < ntr; i++) {
        ltrial *t = &tr[i];
        lkid *v = NULL, *fresh = NULL;
        asink *k;
        sw_stream *s = NULL;
        sw_request_opts ro;
        breq q = {BREQ_MAGIC, K_SEND, 1000000, 64, 500, 0};
        int64_t until;
        t->stop = (int)(i % 2);
        for (int j = 0; j < 3; j++)
            if (kid[j].state != 0)
                lkid_wait(&kid[j], rega, g_b.reg);
        for (int j = 0; j < 3; j++)
            if (kid[j].state == 2 && (v == NULL || kid[j].seq < v->seq))
                v = &kid[j];
        if ((k = calloc(1, sizeof(*k))) == NULL)
            die("out of memory");
        latch_init(&k->done);
        pthread_mutex_lock(&g_loss_mu);
        snprintf(g_loss_victim, sizeof(g_loss_victim), "%s", v->inst);
        g_loss_rep_t = g_loss_rm_a_t = g_loss_rm_b_t = 0;
        t->start_t = now_ns();
        pthread_mutex_unlock(&g_loss_mu);
        sw_request_opts_init(&ro);
        ro.endpoint = EP_LOSS;
        ro.instance_id = v->inst;
        ro.on_item = a_item;
        ro.on_item_arg = k;
        if ((e = sw_router_open(&s, rta, &ro, &q, sizeof(q))) != SW_OK)
            die("router A open: %s", sw_err_name(e));
        until = now_ns() + 5000000000LL;
        while (atomic_load(&k->items) < 10 && !latch_wait(&k->done, 0) && now_ns() < until)
            sleep_ms(1);
        if (atomic_load(&k->items) < 10) {
            snprintf(err, sizeof(err),
                     "trial %u: stream to %.24s got %lu items before the kill (%.40s)", i, v->inst,
                     atomic_load(&k->items), k->reason);
            progress("  %s", err);
        }
        /* decorrelate the kill from the probe timer */
        sleep_ms(rand() % 50);
        t->kill_t = now_ns();
        kill(v->c.pid, t->stop ? SIGSTOP : SIGKILL);
        for (int j = 0; j < 3; j++)
            if (kid[j].state == 0 && fresh == NULL)
                fresh = &kid[j];
        lkid_start(fresh);
        if (latch_wait(&k->done, 10000000000LL)) {
            t->term_t = k->t_term;
            t->lost = k->status == SW_STATUS_ERROR && k->err == SW_INSTANCE_LOST;
            snprintf(t->term, sizeof(t->term), "%s/%.40s", sw_status_name(k->status), k->reason);
        } else {
            snprintf(t->term, sizeof(t->term), "none in 10 s");
        }
        /* the report and both registry views */
        until = now_ns() + 5000000000LL;
        for (;;) {
            int have;
            pthread_mutex_lock(&g_loss_mu);
            have = g_loss_rep_t && g_loss_rm_a_t && g_loss_rm_b_t;
            pthread_mutex_unlock(&g_loss_mu);
            if (have || now_ns() > until)
                break;
            sleep_ms(2);
        }
        sleep_ms(40); /* B makes some more picks */
        pthread_mutex_lock(&g_loss_mu);
        t->rep_t = g_loss_rep_t;
        t->rm_a_t = g_loss_rm_a_t;
        t->rm_b_t = g_loss_rm_b_t;
        g_loss_victim[0] = '\0';
        pthread_mutex_unlock(&g_loss_mu);
        t->end_t = now_ns();
        t->ok = 1;
        sw_stream_close(s);
        latch_fini(&k->done);
        free(k);
        if (cfg.verbose || !t->lost || !t->rep_t)
            progress("  trial %u %s %s: terminal %s after %.1f ms; report %+.1f ms; "
                     "B view %+.1f ms",
                     i + 1, t->stop ? "SIGSTOP" : "SIGKILL", v->inst, t->term,
                     t->term_t ? (double)(t->term_t - t->kill_t) / 1e6 : NAN,
                     t->rep_t ? (double)(t->rep_t - t->kill_t) / 1e6 : NAN,
                     t->rm_b_t && t->rep_t ? (double)(t->rm_b_t - t->rep_t) / 1e6 : NAN);
        if (t->stop) {
            kill(v->c.pid, SIGKILL);
            kill(v->c.pid, SIGCONT);
        }
        child_reap(&v->c, 0);
        v->state = 0;
    }
    atomic_store(&g_b.stop, 1);
    pthread_join(g_b.th, NULL);

    /* B's picks per trial window */
    for (unsigned i = 0; i < ntr; i++) {
        ltrial *t = &tr[i];
        int64_t ref = t->rep_t;
        for (size_t j = 0; j < g_b.n; j++) {
            bpick *p = &g_b.log[j];
            if (p->t < t->start_t || p->t >= t->end_t || !p->victim)
                continue;
            t->b_last_dead_t = p->t; /* the log is in time order */
            if (p->t < t->kill_t)
                continue;
            t->dead_picks++;
            if (ref && p->t > ref) {
                t->after_report++;
                t->after_report_failed += p->result == 0;
                if (p->t - ref > t->after_report_lag)
                    t->after_report_lag = p->t - ref;
            }
            if (t->rm_b_t && p->t > t->rm_b_t)
                t->after_view++;
        }
    }
    loss_rows(tr, ntr, err);

    sw_router_destroy(g_b.rt);
    while (g_b.grave != NULL) {
        bsub *x = g_b.grave;
        g_b.grave = x->next;
        free(x);
    }
    sw_registry_unwatch(g_b.reg, g_b.watch);
    sw_registry_close(g_b.reg);
    sw_conn_close(g_b.conn);
    free(g_b.log);
    g_b.log = NULL;
    for (int j = 0; j < 3; j++)
        if (kid[j].state != 0) {
            ssize_t w = write(kid[j].c.to, "quit\n", 5);
            (void)w;
        }
    for (int j = 0; j < 3; j++)
        if (kid[j].state != 0)
            child_reap(&kid[j].c, 3000);
    sw_router_destroy(rta);
    sw_registry_unwatch(rega, wa);
    sw_registry_close(rega);
    sw_conn_close(ca);
    free(tr);
}
