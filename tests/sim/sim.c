/* tests/sim/sim.c -- see sim.h. */
#include <stdlib.h>
#include <string.h>

#include "tests/sim/sim.h"

/* ---------------------------------------------------------------- rng */

void
sim_rng_seed(sim_rng *r, uint64_t seed)
{
    /* splitmix64, so that nearby seeds give unrelated streams */
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    r->s = (z ^ (z >> 31)) | 1;
}

uint64_t
sim_rng_next(sim_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

uint64_t
sim_rng_below(sim_rng *r, uint64_t n)
{
    return n == 0 ? 0 : sim_rng_next(r) % n;
}

int
sim_rng_chance(sim_rng *r, double p)
{
    if (p <= 0)
        return 0;
    return (double)(sim_rng_next(r) >> 11) * (1.0 / 9007199254740992.0) < p;
}

/* ---------------------------------------------------------------- state */

typedef struct sim_ev {
    int64_t at;
    uint64_t order; /* insertion order: ties run first-in first-out */
    sim_fn fn;
    void *arg;
    uint64_t a, b;
} sim_ev;

typedef struct sim_node {
    void *node;
    sim_recv_fn recv;
    int dead;
    int64_t frozen_until; /* deliveries before this wait for it */
} sim_node;

/* A message in flight (the event's arg). */
typedef struct sim_pkt {
    int from, to, kind;
    size_t len;
    uint8_t data[];
} sim_pkt;

struct sim {
    sim_rng rng;
    sim_faults f;
    int64_t now;
    uint64_t order;
    sim_ev *heap;
    size_t n, cap;
    sim_node nodes[SIM_MAX_NODES];
    int nnodes;
    uint64_t cut[SIM_MAX_NODES]; /* bit j of cut[i]: i and j cannot talk */
    int stop;
    sim_bus_stats st;
};

static int
sim_ev_before(const sim_ev *x, const sim_ev *y)
{
    return x->at < y->at || (x->at == y->at && x->order < y->order);
}

void
sim_at(sim *s, int64_t delay_ms, sim_fn fn, void *arg, uint64_t a, uint64_t b)
{
    sim_ev e;
    size_t i;
    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 1024;
        sim_ev *nv = realloc(s->heap, ncap * sizeof(*nv));
        if (nv == NULL)
            abort(); /* a test tool: out of memory ends the run */
        s->heap = nv;
        s->cap = ncap;
    }
    e.at = s->now + (delay_ms > 0 ? delay_ms : 0);
    e.order = s->order++;
    e.fn = fn;
    e.arg = arg;
    e.a = a;
    e.b = b;
    i = s->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!sim_ev_before(&e, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
}

static sim_ev
sim_pop(sim *s)
{
    sim_ev top = s->heap[0], last = s->heap[--s->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->n)
            break;
        if (c + 1 < s->n && sim_ev_before(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!sim_ev_before(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->n > 0)
        s->heap[i] = last;
    return top;
}

sim *
sim_new(uint64_t seed, const sim_faults *f)
{
    sim *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    sim_rng_seed(&s->rng, seed);
    if (f != NULL)
        s->f = *f;
    return s;
}

void
sim_free(sim *s)
{
    if (s == NULL)
        return;
    /* Packets still in flight are owned by their events. */
    for (size_t i = 0; i < s->n; i++)
        if (s->heap[i].fn == NULL)
            free(s->heap[i].arg);
    free(s->heap);
    free(s);
}

int64_t
sim_now(const sim *s)
{
    return s->now;
}

sim_rng *
sim_rand(sim *s)
{
    return &s->rng;
}

const sim_faults *
sim_fault_model(const sim *s)
{
    return &s->f;
}

void
sim_stop(sim *s)
{
    s->stop = 1;
}

/* ---------------------------------------------------------------- bus */

int
sim_node_add(sim *s, void *node, sim_recv_fn recv)
{
    if (s->nnodes == SIM_MAX_NODES)
        abort();
    s->nodes[s->nnodes].node = node;
    s->nodes[s->nnodes].recv = recv;
    return s->nnodes++;
}

void
sim_kill(sim *s, int node)
{
    s->nodes[node].dead = 1;
}

void
sim_freeze(sim *s, int node, int64_t for_ms)
{
    s->nodes[node].frozen_until = s->now + for_ms;
}

int
sim_alive(const sim *s, int node)
{
    return !s->nodes[node].dead;
}

int
sim_frozen(const sim *s, int node)
{
    return s->nodes[node].frozen_until > s->now;
}

void
sim_partition(sim *s, int a, int b, int on)
{
    if (on) {
        s->cut[a] |= 1ull << b;
        s->cut[b] |= 1ull << a;
    } else {
        s->cut[a] &= ~(1ull << b);
        s->cut[b] &= ~(1ull << a);
    }
}

/* Packets travel as events with fn == NULL (see sim_run). */
static void
sim_post(sim *s, int from, int to, int kind, const uint8_t *data, size_t len, int64_t delay)
{
    sim_pkt *p = malloc(sizeof(*p) + len);
    if (p == NULL)
        abort();
    p->from = from;
    p->to = to;
    p->kind = kind;
    p->len = len;
    if (len)
        memcpy(p->data, data, len);
    sim_at(s, delay, NULL, p, 0, 0);
}

static int64_t
sim_delay(sim *s)
{
    int64_t span = s->f.delay_max - s->f.delay_min;
    return s->f.delay_min + (span > 0 ? (int64_t)sim_rng_below(&s->rng, (uint64_t)span + 1) : 0);
}

void
sim_send(sim *s, int from, int to, int kind, const uint8_t *data, size_t len, int bounce,
         int bounce_kind)
{
    s->st.sent++;
    if (s->cut[from] & (1ull << to)) {
        s->st.cut++;
        return;
    }
    if (s->nodes[to].dead) {
        s->st.to_dead++;
        if (bounce) {
            s->st.bounced++;
            sim_post(s, to, from, bounce_kind, NULL, 0, sim_delay(s));
        }
        return;
    }
    if (sim_rng_chance(&s->rng, s->f.drop)) {
        s->st.dropped++;
        return;
    }
    sim_post(s, from, to, kind, data, len, sim_delay(s));
    if (sim_rng_chance(&s->rng, s->f.dup)) {
        s->st.duplicated++;
        sim_post(s, from, to, kind, data, len, sim_delay(s));
    }
}

void
sim_send_reliable(sim *s, int from, int to, int kind, const uint8_t *data, size_t len,
                  int64_t delay_ms)
{
    s->st.sent++;
    sim_post(s, from, to, kind, data, len, delay_ms);
}

void
sim_bus_stats_get(const sim *s, sim_bus_stats *out)
{
    *out = s->st;
}

/* ---------------------------------------------------------------- run */

uint64_t
sim_run(sim *s, int64_t until_ms)
{
    uint64_t ran = 0;
    s->stop = 0;
    while (s->n > 0 && !s->stop) {
        sim_ev e;
        if (s->heap[0].at > until_ms)
            break;
        e = sim_pop(s);
        s->now = e.at;
        if (e.fn != NULL) {
            e.fn(s, e.arg, e.a, e.b);
        } else {
            sim_pkt *p = e.arg;
            sim_node *to = &s->nodes[p->to];
            if (to->dead || (s->cut[p->from] & (1ull << p->to))) {
                free(p); /* died or was cut off while the packet flew */
            } else if (to->frozen_until > s->now) {
                /* A frozen process reads its socket when it thaws. */
                sim_at(s, to->frozen_until - s->now, NULL, p, 0, 0);
                continue;
            } else {
                s->st.delivered++;
                to->recv(s, to->node, p->from, p->kind, p->data, p->len);
                free(p);
            }
        }
        ran++;
    }
    if (!s->stop && s->n > 0 && s->heap[0].at > until_ms && s->now < until_ms)
        s->now = until_ms; /* stepped up to the limit: the clock stands there */
    return ran;
}
