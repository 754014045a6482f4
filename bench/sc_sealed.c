/* bench/sc_sealed.c -- streamwire-bench: scenario "sealed" (issue 13). The
 * same streamwire runs through connections that seal (a cluster key: every
 * message sealed by the sender's transport and opened by the receiver's)
 * and through the unsealed ones, alternating, in the same run: a long
 * stream of 64 B and 1 KiB items, short streams at concurrency 64, and
 * per-item latency at a fixed rate. In its rows the "raw" column holds the
 * unsealed streamwire figure, so the ratio is sealed / unsealed (goals:
 * items/s >= 0.8x, p99 <= +20 us). Uses the public API only, and libsodium
 * directly for the AEAD's own cost ("AEAD floor" rows: what one seal and one
 * open of a message of the sealed run's size cost per item, against what
 * the 0.8x goal leaves per item). */
#include "bench.h"

#include <sodium.h>

#define INST_SEALED "benchsealed"

static bench_world s_w;
static char s_key[64] = "";

/* A cluster key file (what `streamwire keygen` writes: 64 hex digits,
 * mode 0600) in a temp file. */
static void
write_key(void)
{
    unsigned char raw[32];
    FILE *u = fopen("/dev/urandom", "rb"), *f;
    int fd;
    if (u == NULL || fread(raw, 1, sizeof(raw), u) != sizeof(raw))
        die("cannot read /dev/urandom");
    fclose(u);
    snprintf(s_key, sizeof(s_key), "/tmp/swbench-key-XXXXXX");
    if ((fd = mkstemp(s_key)) < 0 || (f = fdopen(fd, "w")) == NULL)
        die("cannot write a key file");
    for (size_t i = 0; i < sizeof(raw); i++)
        fprintf(f, "%02x", raw[i]);
    fprintf(f, "\n");
    fclose(f);
}

static void
sealed_world(void)
{
    if (s_w.router != NULL)
        return;
    write_key();
    bench_world_open(&s_w, "sealed", s_key, cfg.send_asap, INST_SEALED);
    unlink(s_key); /* read at connect; nothing keeps it on disk */
}

void
scen_sealed_fini(void)
{
    bench_world_close(&s_w);
}

/* Runs fn with the sealed world in place of the unsealed one. */
#define WITH_SEALED(code)               \
    do {                                \
        sw_router *keep_r = g_router;   \
        const char *keep_i = g_sw_inst; \
        g_router = s_w.router;          \
        g_sw_inst = INST_SEALED;        \
        code;                           \
        g_router = keep_r;              \
        g_sw_inst = keep_i;             \
    } while (0)

/* The AEAD's own cost, us per item, for messages of msg_len bytes carrying
 * per_msg items: seal and open, each timed over >= 50 ms of work. aes: 1 for
 * AES-256-GCM, 0 for XChaCha20-Poly1305 (what the transport uses). The AD
 * is about what the transport binds (a subject and the fixed fields). */
static void
aead_cost(int aes, size_t msg_len, double per_msg, double *seal_us, double *open_us)
{
    unsigned char key[32], npub[24], ad[96];
    unsigned char *pt = malloc(msg_len), *ct = malloc(msg_len + 16);
    unsigned long long clen = 0, plen = 0;
    if (pt == NULL || ct == NULL)
        die("out of memory");
    randombytes_buf(key, sizeof(key));
    randombytes_buf(npub, sizeof(npub));
    memset(ad, 'a', sizeof(ad));
    memset(pt, 'p', msg_len);
    for (int op = 0; op < 2; op++) {
        unsigned long iters = 0;
        int64_t t0 = now_ns(), t;
        do {
            for (int k = 0; k < 16; k++) {
                int rc;
                if (op == 0) {
                    npub[0] = (unsigned char)++iters; /* a fresh nonce per seal */
                    rc = aes ? crypto_aead_aes256gcm_encrypt(ct, &clen, pt, msg_len, ad, sizeof(ad),
                                                             NULL, npub, key)
                             : crypto_aead_xchacha20poly1305_ietf_encrypt(
                                   ct, &clen, pt, msg_len, ad, sizeof(ad), NULL, npub, key);
                } else {
                    /* the message sealed last, opened again and again */
                    iters++;
                    rc = aes ? crypto_aead_aes256gcm_decrypt(pt, &plen, NULL, ct, clen, ad,
                                                             sizeof(ad), npub, key)
                             : crypto_aead_xchacha20poly1305_ietf_decrypt(
                                   pt, &plen, NULL, ct, clen, ad, sizeof(ad), npub, key);
                }
                if (rc != 0)
                    die("AEAD floor: libsodium refused its own message");
            }
            t = now_ns() - t0;
        } while (t < 50000000);
        *(op == 0 ? seal_us : open_us) = (double)t / 1e3 / (double)iters / per_msg;
    }
    sodium_memzero(key, sizeof(key));
    free(pt);
    free(ct);
}

/* Rows: the AEAD's cost per item at the sealed run's message size, each
 * cipher libsodium offers here, against the goal's budget per item: what
 * sealed may add to unsealed's time per item and still be >= 0.8x. */
static void
aead_floor_rows(const char *param, size_t size, double unsealed_ips, uint64_t items, uint64_t msgs)
{
    double per_msg = msgs ? (double)items / (double)msgs : 1.0;
    /* a batched item: payload + seq, kind, length and field tags (~8 B) */
    size_t msg_len = (size_t)(per_msg * (double)(size + 8) + 0.5);
    double budget = unsealed_ips > 0 ? 1e6 / (0.8 * unsealed_ips) - 1e6 / unsealed_ips : NAN;
    char note[200];
    add_row("13 sealed", param, "items/message (sealed)", 1.0, per_msg, 0, 1,
            "coalescing in the sealed runs; one seal and one open per message");
    for (int aes = 0; aes <= 1; aes++) {
        double s = NAN, o = NAN;
        char p2[64];
        snprintf(p2, sizeof(p2), "%zu B, %s", size, aes ? "AES-256-GCM" : "XChaCha20-Poly1305");
        if (aes && !crypto_aead_aes256gcm_is_available()) {
            add_row("13 sealed", p2, "AEAD floor us/item", budget, NAN, 1, 2,
                    "libsodium's AES-256-GCM is not available on this CPU");
            continue;
        }
        aead_cost(aes, msg_len, per_msg, &s, &o);
        snprintf(note, sizeof(note),
                 "libsodium%s, %zu B messages: seal %.2f + open %.2f us/item; raw column = "
                 "the 0.8x budget per item",
                 aes ? "" : " (the transport's AEAD)", msg_len, s, o);
        add_row("13 sealed", p2, "AEAD floor us/item", budget, s + o, 1, 2, note);
    }
}

void
scen_sealed(void)
{
    unsigned reps = cfg.reps < 32 ? cfg.reps : 32;
    char param[64], note[200];
    sealed_world();
    /* warm-up */
    {
        stream_run w;
        memset(&w, 0, sizeof(w));
        w.n = 1000;
        w.size = 64;
        WITH_SEALED(run_sw_stream(&w, EP_MAIN, INST_SEALED, cfg.window, 0));
    }
    for (int si = 0; si < cfg.nsizes; si++) {
        size_t size = cfg.sizes[si];
        double ips[2][32], cpu[2][32];
        sw_ingress_stats st0, st1;
        uint64_t sealed_items = 0, sealed_msgs = 0;
        for (unsigned rep = 0; rep < reps; rep++) {
            for (int sealed = 0; sealed <= 1; sealed++) {
                stream_run r;
                memset(&r, 0, sizeof(r));
                r.n = cfg.items;
                r.size = size;
                progress("sealed: long stream %zu B x %lu, %s, rep %u/%u", size, cfg.items,
                         sealed ? "sealed" : "unsealed", rep + 1, reps);
                if (sealed) {
                    sw_ingress_stats_get(s_w.ing, &st0);
                    WITH_SEALED(run_sw_stream(&r, EP_MAIN, INST_SEALED, cfg.window, 0));
                    sw_ingress_stats_get(s_w.ing, &st1);
                    sealed_items += st1.items_sent - st0.items_sent;
                    sealed_msgs += st1.messages_sent - st0.messages_sent;
                } else {
                    run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 0);
                }
                if (r.err[0])
                    progress("  %s", r.err);
                ips[sealed][rep] = r.secs > 0 ? (double)r.received / r.secs : NAN;
                cpu[sealed][rep] = r.received ? r.cpu_us / (double)r.received : NAN;
            }
        }
        snprintf(param, sizeof(param), "long %zu B x %lu", size, cfg.items);
        snprintf(note, sizeof(note), "raw column = unsealed streamwire; goal sealed >= 0.8x");
        add_row("13 sealed", param, "items/s", median(ips[0], reps), median(ips[1], reps), 0, 0,
                note);
        add_row("13 sealed", param, "CPU us/item", median(cpu[0], reps), median(cpu[1], reps), 1, 2,
                "frontend + worker in this process");
        aead_floor_rows(param, size, median(ips[0], reps), sealed_items, sealed_msgs);
    }
    {
        double rate[2][32], cpu[2][32], csw;
        unsigned long errors;
        char err[160];
        for (unsigned rep = 0; rep < reps; rep++)
            for (int sealed = 0; sealed <= 1; sealed++) {
                progress("sealed: short streams c=64, %s, rep %u/%u",
                         sealed ? "sealed" : "unsealed", rep + 1, reps);
                if (sealed)
                    WITH_SEALED(rate[1][rep] = run_short(1, 64, &errors, err, sizeof(err),
                                                         &cpu[1][rep], &csw));
                else
                    rate[0][rep] = run_short(1, 64, &errors, err, sizeof(err), &cpu[0][rep], &csw);
                if (errors)
                    progress("  %lu errors: %s", errors, err);
            }
        snprintf(param, sizeof(param), "short %u x 64 B, c=64", cfg.short_items);
        add_row("13 sealed", param, "streams/s", median(rate[0], reps), median(rate[1], reps), 0, 0,
                "raw column = unsealed streamwire");
        add_row("13 sealed", param, "CPU us/stream", median(cpu[0], reps), median(cpu[1], reps), 1,
                1, "");
    }
    {
        unsigned segs = cfg.quick ? 2 : 6;
        unsigned long per = (unsigned long)(cfg.rate * cfg.lat_secs) / segs, got[2] = {0, 0};
        int64_t *lat[2];
        if (per < 10)
            per = 10;
        for (int k = 0; k < 2; k++)
            if ((lat[k] = calloc(per * segs, sizeof(int64_t))) == NULL)
                die("out of memory");
        for (unsigned seg = 0; seg < segs; seg++)
            for (int sealed = 0; sealed <= 1; sealed++) {
                stream_run r;
                memset(&r, 0, sizeof(r));
                r.n = per;
                r.size = 64;
                r.rate = cfg.rate;
                r.lat = lat[sealed] + got[sealed];
                progress("sealed: latency at %u/s, %s, segment %u/%u", cfg.rate,
                         sealed ? "sealed" : "unsealed", seg + 1, segs);
                if (sealed)
                    WITH_SEALED(run_sw_stream(&r, EP_MAIN, INST_SEALED, cfg.window, 0));
                else
                    run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 0);
                got[sealed] += r.received < per ? r.received : per;
            }
        for (int k = 0; k < 2; k++)
            qsort(lat[k], got[k], sizeof(int64_t), cmp_i64);
        snprintf(param, sizeof(param), "latency 64 B at %u/s", cfg.rate);
        add_row("13 sealed", param, "p50 us", pct(lat[0], got[0], 0.5) / 1e3,
                pct(lat[1], got[1], 0.5) / 1e3, 1, 1, "raw column = unsealed streamwire");
        snprintf(note, sizeof(note), "sealed - unsealed = %+.1f us (goal <= +20)",
                 (pct(lat[1], got[1], 0.99) - pct(lat[0], got[0], 0.99)) / 1e3);
        add_row("13 sealed", param, "p99 us", pct(lat[0], got[0], 0.99) / 1e3,
                pct(lat[1], got[1], 0.99) / 1e3, 1, 1, note);
        free(lat[0]);
        free(lat[1]);
    }
}
