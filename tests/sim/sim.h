/* tests/sim/sim.h -- a seeded, single-threaded discrete-event simulator for
 * streamwire's pure state machines, in the manner of FoundationDB's
 * simulation testing.
 *
 * Everything that varies comes from one 64-bit seed: the workload, the
 * faults, and the order of events that fall due at the same millisecond. A
 * run is a pure function of (seed, steps, profile), so a failing seed
 * replays exactly, message by message.
 *
 * The pieces:
 *   - sim_rng: xorshift64* seeded from the seed (splitmix64);
 *   - time: simulated milliseconds, only advanced by the event loop;
 *   - events: a min-heap by (time, insertion order), each a callback;
 *   - the bus: nodes exchange byte strings (real encoded wire messages),
 *     each delivery an event. The fault model drops, duplicates and delays
 *     (delay jitter reorders), cuts node pairs (partitions), freezes nodes
 *     (their deliveries wait until they thaw) and kills nodes (deliveries
 *     to them vanish; a request to a dead node bounces as "no responders").
 * The models of workers and frontends (sim_models.c) sit on top and feed
 * the bytes to the library's codec and state machines. */
#ifndef SW_SIM_H
#define SW_SIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct sim sim;

/* ---------------------------------------------------------------- rng */

typedef struct sim_rng {
    uint64_t s;
} sim_rng;

void sim_rng_seed(sim_rng *r, uint64_t seed);
uint64_t sim_rng_next(sim_rng *r);
/* Uniform in [0, n); 0 when n is 0. */
uint64_t sim_rng_below(sim_rng *r, uint64_t n);
/* 1 with probability p (0..1). */
int sim_rng_chance(sim_rng *r, double p);

/* ---------------------------------------------------------------- faults */

typedef struct sim_faults {
    double drop;       /* each delivery is lost with this probability */
    double dup;        /* ... or delivered twice */
    int64_t delay_min; /* ms */
    int64_t delay_max; /* ms; jitter between min and max reorders */
    double hostile;    /* per step: a hostile message is injected */
} sim_faults;

/* ---------------------------------------------------------------- events */

typedef void (*sim_fn)(sim *s, void *arg, uint64_t a, uint64_t b);

/* Schedules fn(s, arg, a, b) at now + delay_ms (>= 0). */
void sim_at(sim *s, int64_t delay_ms, sim_fn fn, void *arg, uint64_t a, uint64_t b);

/* ---------------------------------------------------------------- bus */

#define SIM_MAX_NODES 64

/* What a node does with a delivered message (bytes valid during the call). */
typedef void (*sim_recv_fn)(sim *s, void *node, int from, int kind, const uint8_t *data,
                            size_t len);

/* Adds a node; returns its index. */
int sim_node_add(sim *s, void *node, sim_recv_fn recv);
/* Sends bytes from one node to another through the fault model. `kind` is
 * the caller's label (request, item, control...). A request (bounce = 1) to
 * a killed node comes back to the sender as a zero-length message of kind
 * bounce_kind, as NATS's "no responders" does. */
void sim_send(sim *s, int from, int to, int kind, const uint8_t *data, size_t len, int bounce,
              int bounce_kind);
/* Sends bytes with no fault applied (in-process, like a local call). */
void sim_send_reliable(sim *s, int from, int to, int kind, const uint8_t *data, size_t len,
                       int64_t delay_ms);

void sim_kill(sim *s, int node);
void sim_freeze(sim *s, int node, int64_t for_ms);
int sim_alive(const sim *s, int node);
int sim_frozen(const sim *s, int node);
/* Cuts (on = 1) or heals the link between a and b, both ways. */
void sim_partition(sim *s, int a, int b, int on);

/* ---------------------------------------------------------------- run */

sim *sim_new(uint64_t seed, const sim_faults *f);
void sim_free(sim *s);
int64_t sim_now(const sim *s);
sim_rng *sim_rand(sim *s);
const sim_faults *sim_fault_model(const sim *s);
/* Runs events until none is left, the time passes until_ms, or stop is set
 * (sim_stop). Returns the number of events run. */
uint64_t sim_run(sim *s, int64_t until_ms);
void sim_stop(sim *s);

/* Counters of the bus. */
typedef struct sim_bus_stats {
    uint64_t sent, delivered, dropped, duplicated, bounced, to_dead, cut;
} sim_bus_stats;
void sim_bus_stats_get(const sim *s, sim_bus_stats *out);

#endif
