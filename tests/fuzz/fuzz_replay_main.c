/* tests/fuzz/fuzz_replay_main.c -- runs a libFuzzer target without libFuzzer,
 * so the normal test suite (and the sanitizer build) exercises the fuzz body.
 *
 *   fuzz_replay [-n ITERATIONS] [-s SEED] DIR_OR_FILE...
 *
 * Feeds every regular file given (directories are read one level deep, in
 * name order) to LLVMFuzzerTestOneInput, then ITERATIONS (default 20000)
 * inputs made by mutating randomly chosen corpus entries with a seeded PRNG
 * (bit flips, byte writes, inserts, deletes, truncation, chunk duplication,
 * splices, selector changes, and an occasional oversized input). A failing
 * property aborts inside the target; a SIGABRT handler then writes the input
 * to fuzz_replay-crash.bin in the working directory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected);

typedef struct blob {
    uint8_t *data;
    size_t len;
} blob;

typedef struct corpus {
    blob *v;
    size_t n, cap;
} corpus;

#define REPLAY_MAX_INPUT (70u * 1024u) /* a bit over the decoders' 64 KiB limit */

static uint64_t rng_state;

static uint64_t
rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static size_t
rng_below(size_t n)
{
    return n ? (size_t)(rng() % n) : 0;
}

static _Noreturn void
die(const char *what, const char *path)
{
    fprintf(stderr, "fuzz_replay: %s %s: %s\n", what, path, strerror(errno));
    exit(2);
}

static void
corpus_add(corpus *c, uint8_t *data, size_t len)
{
    if (c->n == c->cap) {
        size_t ncap = c->cap ? 2 * c->cap : 64;
        blob *nv = realloc(c->v, ncap * sizeof(*nv));
        if (nv == NULL) {
            fprintf(stderr, "fuzz_replay: out of memory\n");
            exit(2);
        }
        c->v = nv;
        c->cap = ncap;
    }
    c->v[c->n].data = data;
    c->v[c->n].len = len;
    c->n++;
}

static void
load_file(corpus *c, const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long len = -1;
    if (f == NULL)
        die("cannot open", path);
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        die("cannot size", path);
    buf = malloc((size_t)len + 1);
    if (buf == NULL || fread(buf, 1, (size_t)len, f) != (size_t)len)
        die("cannot read", path);
    fclose(f);
    corpus_add(c, buf, (size_t)len);
}

static int
cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void
load_path(corpus *c, const char *path)
{
    struct stat st;
    DIR *d;
    struct dirent *e;
    char **names = NULL;
    size_t n = 0, cap = 0;

    if (stat(path, &st) != 0)
        die("cannot stat", path);
    if (!S_ISDIR(st.st_mode)) {
        load_file(c, path);
        return;
    }
    if ((d = opendir(path)) == NULL)
        die("cannot open directory", path);
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, cap * sizeof(*names));
            if (names == NULL)
                die("out of memory reading", path);
        }
        names[n] = malloc(strlen(path) + strlen(e->d_name) + 2);
        if (names[n] == NULL)
            die("out of memory reading", path);
        sprintf(names[n], "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof(*names), cmp_names);
    for (size_t i = 0; i < n; i++) {
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode))
            load_file(c, names[i]);
        free(names[i]);
    }
    free(names);
}

/* The input being run, for the SIGABRT handler: a failing property aborts,
 * and the handler leaves the input in fuzz_replay-crash.bin (cwd) and says
 * how to reproduce it. Only async-signal-safe calls in the handler. */
static const uint8_t *volatile cur_data;
static volatile size_t cur_len;
static volatile long cur_iter = -1;

static void
put_str(const char *s)
{
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

static void
on_abort(int sig)
{
    static const char path[] = "fuzz_replay-crash.bin";
    char num[24];
    int fd, i = (int)sizeof(num) - 1;
    long it = cur_iter;
    num[i] = '\0';
    do {
        num[--i] = (char)('0' + (it < 0 ? 0 : it % 10));
        it /= 10;
    } while (it > 0 && i > 0);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        size_t off = 0;
        while (off < cur_len) {
            ssize_t w = write(fd, cur_data + off, cur_len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        close(fd);
    }
    put_str("fuzz_replay: input that failed written to ");
    put_str(path);
    put_str(cur_iter < 0 ? " (a corpus file or fixed case)\n" : " (mutation #");
    if (cur_iter >= 0) {
        put_str(num + i);
        put_str("; rerun with the same -s and -n to reproduce)\n");
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void
run_one(const uint8_t *data, size_t len, long iter)
{
    cur_data = data;
    cur_len = len;
    cur_iter = iter;
    LLVMFuzzerTestOneInput(data, len);
}

/* Mutates buf[*len] in place (capacity REPLAY_MAX_INPUT). */
static void
mutate(uint8_t *buf, size_t *len, const corpus *c)
{
    /* mostly one change, so many inputs stay close to valid */
    int nops = rng_below(4) == 0 ? 2 + (int)rng_below(5) : 1;
    for (int op = 0; op < nops; op++) {
        size_t n = *len;
        switch (rng_below(10)) {
        case 0: /* flip a bit */
            if (n)
                buf[rng_below(n)] ^= (uint8_t)(1u << rng_below(8));
            break;
        case 1: /* write a random or interesting byte */
            if (n) {
                static const uint8_t special[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x08, 0x12, 0x0a};
                buf[rng_below(n)] =
                    rng_below(2) ? (uint8_t)rng() : special[rng_below(sizeof(special))];
            }
            break;
        case 2: /* insert a byte */
            if (n < REPLAY_MAX_INPUT) {
                size_t at = rng_below(n + 1);
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = (uint8_t)rng();
                *len = n + 1;
            }
            break;
        case 3: /* delete a range */
            if (n > 1) {
                size_t at = 1 + rng_below(n - 1), k = 1 + rng_below(n - at);
                memmove(buf + at, buf + at + k, n - at - k);
                *len = n - k;
            }
            break;
        case 4: /* truncate */
            if (n > 1)
                *len = 1 + rng_below(n - 1);
            break;
        case 5: { /* duplicate a chunk in place */
            if (n > 1) {
                size_t at = 1 + rng_below(n - 1), k = 1 + rng_below(n - at);
                if (n + k <= REPLAY_MAX_INPUT) {
                    memmove(buf + at + k, buf + at, n - at);
                    *len = n + k;
                }
            }
            break;
        }
        case 6: { /* splice: append the tail of another entry */
            const blob *o = &c->v[rng_below(c->n)];
            if (o->len > 1) {
                size_t from = 1 + rng_below(o->len - 1), k = o->len - from;
                if (n + k <= REPLAY_MAX_INPUT) {
                    memcpy(buf + n, o->data + from, k);
                    *len = n + k;
                }
            }
            break;
        }
        case 7: /* feed the message to another decoder */
            if (n)
                buf[0] = (uint8_t)rng();
            break;
        case 8: /* a varint that claims a huge length */
            if (n > 2) {
                size_t at = 1 + rng_below(n - 1);
                buf[at] = 0xff;
                if (at + 1 < n)
                    buf[at + 1] = 0xff;
            }
            break;
        default: /* overwrite a range with noise */
            if (n > 1) {
                size_t at = 1 + rng_below(n - 1), k = 1 + rng_below(n - at < 8 ? n - at : 8);
                for (size_t i = 0; i < k; i++)
                    buf[at + i] = (uint8_t)rng();
            }
            break;
        }
    }
}

int
main(int argc, char **argv)
{
    corpus c = {NULL, 0, 0};
    unsigned long iterations = 20000;
    uint64_t seed = 0x5717ea3d;
    uint8_t *buf;
    size_t nfiles;
    int opt_end = 0;

    for (int i = 1; i < argc; i++) {
        if (!opt_end && strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            iterations = strtoul(argv[++i], NULL, 10);
        } else if (!opt_end && strcmp(argv[i], "-s") == 0 && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 0);
        } else if (!opt_end && strcmp(argv[i], "--") == 0) {
            opt_end = 1;
        } else if (!opt_end && argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [-n ITERATIONS] [-s SEED] DIR_OR_FILE...\n", argv[0]);
            return 2;
        } else {
            load_path(&c, argv[i]);
        }
    }
    nfiles = c.n;
    if (nfiles == 0) {
        fprintf(stderr, "fuzz_replay: no corpus files given\n");
        return 2;
    }

    signal(SIGABRT, on_abort);

    /* 1. every corpus file as is */
    for (size_t i = 0; i < nfiles; i++)
        run_one(c.v[i].data, c.v[i].len, -1);

    /* 2. a few fixed edge cases */
    {
        static const uint8_t empty_sel[] = {0, 1, 2, 3, 4};
        for (size_t i = 0; i < sizeof(empty_sel); i++)
            run_one(&empty_sel[i], 1, -1);
        run_one(NULL, 0, -1);
    }

    /* 3. large hostile inputs (1 MiB), each decoded with no length limit by
     * the body's allocation check: dense unknown fields, repeated headers,
     * final acks and beats far past their caps, a scalar repeated 500k
     * times, deep nesting. The heap each may take is bounded (fuzz_decode.c). */
    {
        const size_t big = 1u << 20;
        uint8_t *lb = malloc(big + 1);
        static const uint8_t unit_unknown[] = {0x98, 0x06, 0x01}; /* field 99 varint */
        static const uint8_t unit_version[] = {0x08, 0x01};       /* field 1 varint */
        static const uint8_t unit_header[] = {0x5a, 0x04, 0x0a, 0x00, 0x12, 0x00}; /* headers {} */
        static const uint8_t unit_ack[] = {0x4a, 0x00};   /* final_acks "" */
        static const uint8_t unit_beat[] = {0x1a, 0x00};  /* beats {} */
        static const uint8_t unit_batch[] = {0x62, 0x00}; /* batch {} */
        static const struct {
            int sel;
            const uint8_t *unit;
            size_t n;
        } shapes[] = {
            {0, unit_unknown, sizeof(unit_unknown)}, {1, unit_unknown, sizeof(unit_unknown)},
            {2, unit_unknown, sizeof(unit_unknown)}, {5, unit_unknown, sizeof(unit_unknown)},
            {0, unit_version, sizeof(unit_version)}, {0, unit_header, sizeof(unit_header)},
            {2, unit_ack, sizeof(unit_ack)},         {5, unit_beat, sizeof(unit_beat)},
            {1, unit_batch, sizeof(unit_batch)},     {4, unit_header, sizeof(unit_header)},
        };
        if (lb == NULL)
            return 2;
        for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
            size_t n = 1;
            lb[0] = (uint8_t)shapes[k].sel;
            while (n + shapes[k].n <= big) {
                memcpy(lb + n, shapes[k].unit, shapes[k].n);
                n += shapes[k].n;
            }
            run_one(lb, n, -1);
        }
        free(lb);
    }

    /* 4. mutations */
    buf = malloc(REPLAY_MAX_INPUT + 1);
    if (buf == NULL)
        return 2;
    rng_state = seed;
    for (unsigned long it = 0; it < iterations; it++) {
        const blob *b = &c.v[rng_below(c.n)];
        size_t len = b->len < REPLAY_MAX_INPUT ? b->len : REPLAY_MAX_INPUT;
        memcpy(buf, b->data, len);
        if (it % 2000 == 1999) {
            /* an oversized input: past the 64 KiB limit */
            size_t big = 64u * 1024u + 1 + rng_below(4096);
            memset(buf + len, 0, big > len ? big - len : 0);
            len = big;
        }
        mutate(buf, &len, &c);
        run_one(buf, len, (long)it);
    }
    {
        unsigned long decoded, rejected;
        fuzz_decode_stats(&decoded, &rejected);
        printf("fuzz_replay: %zu corpus files + %lu mutated inputs (seed 0x%llx): "
               "%lu decoded (and re-encoded), %lu rejected: ok\n",
               nfiles, iterations, (unsigned long long)seed, decoded, rejected);
        /* the corpus must reach past the decoders' validation */
        if (decoded == 0) {
            fprintf(stderr, "fuzz_replay: nothing decoded: corpus broken?\n");
            return 1;
        }
    }
    free(buf);
    for (size_t i = 0; i < c.n; i++)
        free(c.v[i].data);
    free(c.v);
    return 0;
}
