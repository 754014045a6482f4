/* router/registry_mem.c -- the in-memory registry backend, for unit tests
 * and single-process use. Buckets are process-global by name, so several
 * sw_registry handles opened on the same bucket see each other, like
 * processes sharing a KV bucket. Watch callbacks run synchronously on the
 * writer's thread, after the bucket lock is released. */
#include <stdlib.h>
#include <string.h>

#include "common/sw_common.h"
#include <streamwire/registry.h>

typedef struct mem_entry {
    char *key;
    uint8_t *val;
    size_t len;
    uint64_t rev;
    int64_t created;
} mem_entry;

typedef struct mem_watch {
    struct mem_watch *next;
    sw_registry_entry_fn fn;
    void *arg;
    int busy; /* callbacks running */
    int gone;
} mem_watch;

typedef struct mem_bucket {
    struct mem_bucket *next;
    char *name;
    int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mem_entry *v;
    size_t n, cap;
    uint64_t rev;
    mem_watch *watches;
} mem_bucket;

static pthread_mutex_t mem_global = PTHREAD_MUTEX_INITIALIZER;
static mem_bucket *mem_buckets;

static sw_err
mem_open(void **state, sw_conn *conn, const char *bucket, uint32_t max_age_ms)
{
    mem_bucket *b;
    (void)conn;
    (void)max_age_ms;
    pthread_mutex_lock(&mem_global);
    for (b = mem_buckets; b != NULL; b = b->next)
        if (strcmp(b->name, bucket) == 0)
            break;
    if (b == NULL) {
        if ((b = calloc(1, sizeof(*b))) == NULL || (b->name = swi_strdup(bucket)) == NULL) {
            free(b);
            pthread_mutex_unlock(&mem_global);
            return SW_ENOMEM;
        }
        pthread_mutex_init(&b->mu, NULL);
        pthread_cond_init(&b->cv, NULL);
        b->next = mem_buckets;
        mem_buckets = b;
    }
    b->refs++;
    pthread_mutex_unlock(&mem_global);
    *state = b;
    return SW_OK;
}

static void
mem_close(void *state)
{
    mem_bucket *b = state, **pp;
    pthread_mutex_lock(&mem_global);
    if (--b->refs > 0) {
        pthread_mutex_unlock(&mem_global);
        return;
    }
    for (pp = &mem_buckets; *pp != NULL; pp = &(*pp)->next)
        if (*pp == b) {
            *pp = b->next;
            break;
        }
    pthread_mutex_unlock(&mem_global);
    for (size_t i = 0; i < b->n; i++) {
        free(b->v[i].key);
        free(b->v[i].val);
    }
    while (b->watches != NULL) {
        mem_watch *w = b->watches;
        b->watches = w->next;
        free(w);
    }
    free(b->v);
    free(b->name);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
}

static mem_entry *
mem_find(mem_bucket *b, const char *key)
{
    for (size_t i = 0; i < b->n; i++)
        if (strcmp(b->v[i].key, key) == 0)
            return &b->v[i];
    return NULL;
}

/* Tells every watcher about one change; b->mu is not held on entry. */
static void
mem_notify(mem_bucket *b, const sw_registry_entry *e, int deleted)
{
    mem_watch *w;
    pthread_mutex_lock(&b->mu);
    for (w = b->watches; w != NULL; w = w->next) {
        if (w->gone)
            continue;
        w->busy++;
        pthread_mutex_unlock(&b->mu);
        w->fn(w->arg, e, deleted);
        pthread_mutex_lock(&b->mu);
        w->busy--;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
}

static sw_err
mem_put(void *state, const char *key, const uint8_t *val, size_t len, uint64_t expect_rev,
        uint64_t *rev)
{
    mem_bucket *b = state;
    mem_entry *e;
    uint8_t *copy = malloc(len ? len : 1), *notify_val;
    char *notify_key;
    sw_registry_entry ne;
    if (copy == NULL)
        return SW_ENOMEM;
    memcpy(copy, val, len);
    pthread_mutex_lock(&b->mu);
    e = mem_find(b, key);
    if (expect_rev != 0 && (e == NULL || e->rev != expect_rev)) {
        pthread_mutex_unlock(&b->mu);
        free(copy);
        return e == NULL ? SW_ENOTFOUND : SW_EBUSY;
    }
    if (e == NULL) {
        if (b->n == b->cap) {
            size_t ncap = b->cap ? b->cap * 2 : 16;
            mem_entry *nv = realloc(b->v, ncap * sizeof(*nv));
            if (nv == NULL) {
                pthread_mutex_unlock(&b->mu);
                free(copy);
                return SW_ENOMEM;
            }
            b->v = nv;
            b->cap = ncap;
        }
        e = &b->v[b->n];
        if ((e->key = swi_strdup(key)) == NULL) {
            pthread_mutex_unlock(&b->mu);
            free(copy);
            return SW_ENOMEM;
        }
        e->val = NULL;
        b->n++;
    }
    free(e->val);
    e->val = copy;
    e->len = len;
    e->rev = ++b->rev;
    e->created = swi_unix_ms();
    if (rev != NULL)
        *rev = e->rev;
    /* Copies for the notification, made under the lock. */
    notify_key = swi_strdup(key);
    notify_val = malloc(len ? len : 1);
    if (notify_val != NULL)
        memcpy(notify_val, val, len);
    ne.key = notify_key;
    ne.value = notify_val;
    ne.len = len;
    ne.revision = e->rev;
    ne.created_unix_ms = e->created;
    pthread_mutex_unlock(&b->mu);
    if (notify_key != NULL && notify_val != NULL)
        mem_notify(b, &ne, 0);
    free(notify_key);
    free(notify_val);
    return SW_OK;
}

static sw_err
mem_del(void *state, const char *key)
{
    mem_bucket *b = state;
    mem_entry *e;
    sw_registry_entry ne;
    char *k;
    pthread_mutex_lock(&b->mu);
    e = mem_find(b, key);
    if (e == NULL) {
        pthread_mutex_unlock(&b->mu);
        return SW_OK;
    }
    k = e->key;
    free(e->val);
    *e = b->v[--b->n];
    ne.key = k;
    ne.value = NULL;
    ne.len = 0;
    ne.revision = ++b->rev;
    ne.created_unix_ms = swi_unix_ms();
    pthread_mutex_unlock(&b->mu);
    mem_notify(b, &ne, 1);
    free(k);
    return SW_OK;
}

static sw_err
mem_list(void *state, sw_registry_entry_fn fn, void *arg)
{
    mem_bucket *b = state;
    sw_registry_entry *snap;
    size_t n;
    pthread_mutex_lock(&b->mu);
    n = b->n;
    snap = calloc(n ? n : 1, sizeof(*snap));
    if (snap == NULL) {
        pthread_mutex_unlock(&b->mu);
        return SW_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t *v = malloc(b->v[i].len ? b->v[i].len : 1);
        snap[i].key = swi_strdup(b->v[i].key);
        if (v != NULL)
            memcpy(v, b->v[i].val, b->v[i].len);
        snap[i].value = v;
        snap[i].len = b->v[i].len;
        snap[i].revision = b->v[i].rev;
        snap[i].created_unix_ms = b->v[i].created;
    }
    pthread_mutex_unlock(&b->mu);
    for (size_t i = 0; i < n; i++) {
        if (snap[i].key != NULL && snap[i].value != NULL)
            fn(arg, &snap[i], 0);
        free((void *)snap[i].key);
        free((void *)snap[i].value);
    }
    free(snap);
    return SW_OK;
}

static sw_err
mem_watch_add(void *state, sw_registry_entry_fn fn, void *arg, void **handle)
{
    mem_bucket *b = state;
    mem_watch *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return SW_ENOMEM;
    w->fn = fn;
    w->arg = arg;
    pthread_mutex_lock(&b->mu);
    w->next = b->watches;
    b->watches = w;
    pthread_mutex_unlock(&b->mu);
    *handle = w;
    return SW_OK;
}

static void
mem_unwatch(void *state, void *handle)
{
    mem_bucket *b = state;
    mem_watch *w = handle, **pp;
    pthread_mutex_lock(&b->mu);
    w->gone = 1;
    while (w->busy > 0)
        pthread_cond_wait(&b->cv, &b->mu);
    for (pp = &b->watches; *pp != NULL; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    pthread_mutex_unlock(&b->mu);
    free(w);
}

static const sw_registry_backend mem_backend = {
    .name = "memory",
    .version = SW_REGISTRY_BACKEND_VERSION,
    .open = mem_open,
    .close = mem_close,
    .put = mem_put,
    .del = mem_del,
    .list = mem_list,
    .watch = mem_watch_add,
    .unwatch = mem_unwatch,
};

const sw_registry_backend *
sw_registry_backend_memory(void)
{
    return &mem_backend;
}
