/* bench/sc_migration.c -- streamwire-bench: scenario "migration" (issue 15).
 *
 * Two workers in child processes (sc_loss.c's --worker-mode, registered in
 * LOSS_BUCKET); a router with migration_limit 1 opens a stream routed by the
 * registry (500 items/s of 64 B); after 10 items the worker serving it is
 * SIGKILLed at a random moment of the probe cycle. Measured: the SIGKILL to
 * the first item from the other instance at the consumer, over cfg.trials
 * trials (20; 2 with --quick). A fresh worker replaces the victim between
 * trials. streamwire-only rows (raw nats.c has no migration to compare).
 *
 * Threads and locks: the sink's fields are written by the router's delivery
 * thread under k->mu and read by the main thread under it. */
#include "bench.h"

typedef struct msink {
    pthread_mutex_t mu;
    unsigned long items;
    char first[SW_MAX_TOKEN + 1]; /* the instance of the first item */
    int64_t t_new;                /* first item from another instance */
    int term;
    char reason[64];
} msink;

static void
m_item(sw_stream *s, const sw_item *it, void *arg)
{
    msink *k = arg;
    int64_t t = now_ns();
    (void)s;
    pthread_mutex_lock(&k->mu);
    if (it->kind == SW_ITEM_DATA) {
        if (k->items++ == 0)
            snprintf(k->first, sizeof(k->first), "%s", it->instance_id);
        else if (k->t_new == 0 && strcmp(it->instance_id, k->first) != 0)
            k->t_new = t;
    } else {
        k->term = 1;
        snprintf(k->reason, sizeof(k->reason), "%s", it->terminal.reason);
    }
    pthread_mutex_unlock(&k->mu);
}

void
scen_migration(void)
{
    unsigned ntr = cfg.trials;
    int64_t *lat = calloc(ntr + 1, sizeof(int64_t));
    size_t n = 0;
    lkid kid[3];
    sw_conn *c;
    sw_registry *reg = NULL;
    sw_router *rt = NULL;
    sw_registry_opts rgo;
    sw_router_opts rto;
    unsigned moved = 0;
    char note[200], err[160] = "";
    sw_err e;

    if (lat == NULL)
        die("out of memory");
    progress("8 migration: %u SIGKILL trials, migration_limit 1 (workers in child processes)", ntr);
    memset(kid, 0, sizeof(kid));
    c = sw_connect(g_url, "bench-migration");
    sw_registry_opts_init(&rgo);
    rgo.bucket = LOSS_BUCKET;
    if ((e = sw_registry_open(&reg, c, &rgo)) != SW_OK) {
        snprintf(err, sizeof(err), "skipped: sw_registry_open: %s (needs nats-server -js)",
                 sw_err_name(e));
        progress("  %s", err);
        goto rows;
    }
    sw_router_opts_init(&rto);
    rto.registry = reg;
    rto.migration_limit = 1;
    rto.log = cfg.verbose ? loss_rt_log : NULL;
    rto.log_arg = (void *)"migration router";
    if ((e = sw_router_create(&rt, c, &rto)) != SW_OK)
        die("migration router: %s", sw_err_name(e));
    lkid_start(&kid[0]);
    lkid_start(&kid[1]);
    for (unsigned i = 0; i < ntr; i++) {
        breq q = {BREQ_MAGIC, K_SEND, 1000000, 64, 500, 0};
        msink k;
        sw_request_opts ro;
        sw_stream *s = NULL;
        lkid *v = NULL;
        int64_t kill_t, until;
        for (int j = 0; j < 3; j++)
            if (kid[j].state != 0)
                lkid_wait(&kid[j], reg, NULL);
        sleep_ms(50); /* the router's pool sees the newest one too */
        memset(&k, 0, sizeof(k));
        pthread_mutex_init(&k.mu, NULL);
        sw_request_opts_init(&ro);
        ro.endpoint = EP_LOSS;
        ro.on_item = m_item;
        ro.on_item_arg = &k;
        if ((e = sw_router_open(&s, rt, &ro, &q, sizeof(q))) != SW_OK)
            die("migration open: %s", sw_err_name(e));
        until = now_ns() + 5000000000LL;
        for (;;) {
            int ready;
            pthread_mutex_lock(&k.mu);
            ready = k.items >= 10 || k.term;
            pthread_mutex_unlock(&k.mu);
            if (ready || now_ns() > until)
                break;
            sleep_ms(1);
        }
        pthread_mutex_lock(&k.mu);
        for (int j = 0; j < 3; j++)
            if (kid[j].state == 2 && strcmp(kid[j].inst, k.first) == 0)
                v = &kid[j];
        pthread_mutex_unlock(&k.mu);
        if (v == NULL) {
            snprintf(err, sizeof(err), "trial %u: no item from a known worker (%.40s)", i + 1,
                     k.reason);
            progress("  %s", err);
            sw_stream_close(s);
            pthread_mutex_destroy(&k.mu);
            continue;
        }
        sleep_ms(rand() % 50); /* decorrelate the kill from the probe timer */
        kill_t = now_ns();
        kill(v->c.pid, SIGKILL);
        until = now_ns() + 10000000000LL;
        for (;;) {
            int done;
            pthread_mutex_lock(&k.mu);
            done = k.t_new != 0 || k.term;
            pthread_mutex_unlock(&k.mu);
            if (done || now_ns() > until)
                break;
            sleep_ms(1);
        }
        pthread_mutex_lock(&k.mu);
        if (k.t_new != 0) {
            lat[n++] = k.t_new - kill_t;
            moved++;
        } else {
            snprintf(err, sizeof(err), "trial %u: no item from another instance (%.40s)", i + 1,
                     k.term ? k.reason : "no terminal in 10 s");
            progress("  %s", err);
        }
        if (cfg.verbose)
            progress("  trial %u: %s killed; first item elsewhere after %.1f ms", i + 1, v->inst,
                     k.t_new ? (double)(k.t_new - kill_t) / 1e6 : NAN);
        pthread_mutex_unlock(&k.mu);
        sw_stream_close(s);
        pthread_mutex_destroy(&k.mu);
        child_reap(&v->c, 0);
        v->state = 0;
        lkid_start(v);
    }
    for (int j = 0; j < 3; j++)
        if (kid[j].state != 0) {
            ssize_t wr = write(kid[j].c.to, "quit\n", 5);
            (void)wr;
        }
    for (int j = 0; j < 3; j++)
        if (kid[j].state != 0)
            child_reap(&kid[j].c, 3000);
    sw_router_destroy(rt);
    sw_registry_close(reg);
rows:
    sw_conn_close(c);
    snprintf(note, sizeof(note),
             "moved in %u/%u trials; loss seen by a 'no responders' probe, confirmed 100 ms "
             "later%s%.100s",
             moved, ntr, err[0] ? "; " : "", err);
    lat_rows_sw("8 migration", "SIGKILL -> first item from the new instance", lat, n, "ms", 1, 1,
                note, "no goal set (issue 15 asks for the figure)");
    free(lat);
}
