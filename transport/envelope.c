/* transport/envelope.c -- sealed envelopes of whole messages (see
 * envelope.h). Bounded hand-written protobuf walking: the outer message has
 * three fields and is parsed without protobuf-c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "proto/sw_codec.h"
#include "transport/envelope.h"
#include "transport/sw_transport.h"

#define ENV_RID 16

/* One cluster key and the keys derived from it once per process. */
typedef struct env_keyset {
    swt_seal_key key;
    swt_seal_subkey inst_f2w, inst_w2f, registry;
} env_keyset;

struct swt_sealer {
    env_keyset cur;  /* seals and opens */
    env_keyset open; /* opens only (rotation); valid when has_open */
    int has_open;
};

static sw_err
keyset_init(env_keyset *ks, const swt_seal_key *key)
{
    sw_err e;
    ks->key = *key;
    if ((e = swt_seal_derive(&ks->key, SWT_SEAL_INST_F2W, NULL, &ks->inst_f2w)) != SW_OK ||
        (e = swt_seal_derive(&ks->key, SWT_SEAL_INST_W2F, NULL, &ks->inst_w2f)) != SW_OK ||
        (e = swt_seal_derive(&ks->key, SWT_SEAL_REGISTRY, NULL, &ks->registry)) != SW_OK)
        return e;
    return SW_OK;
}

static void
keyset_wipe(env_keyset *ks)
{
    swt_seal_key_wipe(&ks->key);
    swt_seal_subkey_wipe(&ks->inst_f2w);
    swt_seal_subkey_wipe(&ks->inst_w2f);
    swt_seal_subkey_wipe(&ks->registry);
}

sw_err
swt_sealer_from_keys(swt_sealer **out, const swt_seal_key *key, const swt_seal_key *open_key)
{
    swt_sealer *s;
    sw_err e;
    if (out == NULL || key == NULL)
        return SW_EINVAL;
    *out = NULL;
    if (open_key != NULL && open_key->id == key->id)
        return SW_EINVAL; /* a receiver could not tell them apart */
    if ((s = sodium_malloc(sizeof(*s))) == NULL)
        return SW_ENOMEM;
    memset(s, 0, sizeof(*s));
    e = keyset_init(&s->cur, key);
    if (e == SW_OK && open_key != NULL) {
        s->has_open = 1;
        e = keyset_init(&s->open, open_key);
    }
    if (e != SW_OK) {
        swt_sealer_free(s);
        return e;
    }
    *out = s;
    return SW_OK;
}

sw_err
swt_sealer_from_key(swt_sealer **out, const swt_seal_key *key)
{
    return swt_sealer_from_keys(out, key, NULL);
}

sw_err
swt_sealer_load(swt_sealer **out, const char *key_file, const char *open_key_file, char *why,
                size_t why_len)
{
    swt_seal_key k, k2;
    sw_err e;
    if (out == NULL)
        return SW_EINVAL;
    *out = NULL;
    memset(&k2, 0, sizeof(k2));
    if ((e = swt_seal_key_load(key_file, &k, why, why_len)) != SW_OK)
        return e;
    if (open_key_file != NULL &&
        (e = swt_seal_key_load(open_key_file, &k2, why, why_len)) != SW_OK) {
        swt_seal_key_wipe(&k);
        return e;
    }
    if (open_key_file != NULL && k2.id == k.id) {
        if (why != NULL && why_len > 0)
            snprintf(why, why_len, "%s and %s have the same key id (%s): make a new key", key_file,
                     open_key_file,
                     sodium_memcmp(k.k, k2.k, sizeof(k.k)) == 0 ? "the same key" : "a collision");
        e = SW_EINVAL;
    } else {
        e = swt_sealer_from_keys(out, &k, open_key_file != NULL ? &k2 : NULL);
    }
    swt_seal_key_wipe(&k);
    swt_seal_key_wipe(&k2);
    return e;
}

void
swt_sealer_free(swt_sealer *s)
{
    if (s == NULL)
        return;
    keyset_wipe(&s->cur);
    keyset_wipe(&s->open);
    sodium_free(s); /* zeroes the whole guarded page */
}

uint32_t
swt_sealer_key_id(const swt_sealer *s)
{
    return s ? s->cur.key.id : 0;
}

void
swt_env_classify(const char *subject, swt_env_class *out)
{
    out->to_worker = 0;
    out->msg_type = SWT_SEAL_MSG_ITEM; /* a response subject of the frontend's choosing */
    switch (swt_subject_kind_of(subject)) {
    case SWT_SUBJ_REQUEST:
        out->to_worker = 1;
        out->msg_type = SWT_SEAL_MSG_REQUEST;
        break;
    case SWT_SUBJ_CONTROL:
        out->to_worker = 1;
        out->msg_type = SWT_SEAL_MSG_CONTROL;
        break;
    case SWT_SUBJ_LIVE_REPLY:
        out->to_worker = 1;
        out->msg_type = SWT_SEAL_MSG_PROBE_REPLY;
        break;
    case SWT_SUBJ_BEATS:
        out->msg_type = SWT_SEAL_MSG_HEARTBEAT_BATCH;
        break;
    case SWT_SUBJ_PROBE_REPLY:
        out->msg_type = SWT_SEAL_MSG_PROBE_REPLY;
        break;
    case SWT_SUBJ_ROUTER:
        out->msg_type = SWT_SEAL_MSG_PROBE;
        break;
    case SWT_SUBJ_OTHER:
        break;
    }
}

/* Messages whose field 2 is the request id. */
static int
has_rid_field(uint8_t msg_type)
{
    return msg_type == SWT_SEAL_MSG_REQUEST || msg_type == SWT_SEAL_MSG_ITEM ||
           msg_type == SWT_SEAL_MSG_CONTROL;
}

/* ---------------------------------------------------------------- protobuf walking */

/* One top-level field: its number, wire type, and for varints the value,
 * for length-delimited fields the bytes. 0, or -1 when malformed. */
typedef struct pb_field {
    uint32_t num;
    int wt;
    uint64_t v;
    const uint8_t *b;
    size_t blen;
} pb_field;

static int
rd_field(const uint8_t *p, size_t len, size_t *off, pb_field *f)
{
    uint64_t tag;
    if (swp_read_varint(p, len, off, &tag) != 0 || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff)
        return -1;
    f->num = (uint32_t)(tag >> 3);
    f->wt = (int)(tag & 7);
    switch (f->wt) {
    case 0:
        return swp_read_varint(p, len, off, &f->v);
    case 1:
        if (len - *off < 8)
            return -1;
        *off += 8;
        return 0;
    case 5:
        if (len - *off < 4)
            return -1;
        *off += 4;
        return 0;
    case 2:
        if (swp_read_varint(p, len, off, &f->v) != 0 || f->v > len - *off)
            return -1;
        f->b = p + *off;
        f->blen = (size_t)f->v;
        *off += f->blen;
        return 0;
    default:
        return -1;
    }
}

int
swt_env_is_sealed(const uint8_t *buf, size_t len)
{
    size_t off = 0;
    pb_field f;
    if (buf == NULL)
        return 0;
    for (int i = 0; i < 3 && off < len; i++) {
        if (rd_field(buf, len, &off, &f) != 0)
            return 0;
        if (f.num == 15 && f.wt == 2)
            return 1;
    }
    return 0;
}

/* The message's request id: its last top-level field 2 (protobuf's rule),
 * when that is 16 bytes. 1 found, 0 none, -1 malformed. */
static int
find_rid(const uint8_t *p, size_t len, const uint8_t **rid)
{
    size_t off = 0;
    pb_field f;
    int found = 0;
    while (off < len) {
        if (rd_field(p, len, &off, &f) != 0)
            return -1;
        if (f.num == 2 && f.wt == 2) {
            found = f.blen == ENV_RID;
            *rid = f.b;
        }
    }
    return found;
}

/* ---------------------------------------------------------------- seal and open */

typedef struct env_keys {
    swt_seal_subkey stream; /* derived for a stream scope */
    const swt_seal_subkey *use;
    uint8_t ctx[32];
    swt_seal_ad ad;
} env_keys;

/* The key and associated data for a message of class cl on subject, with
 * request id rid (or NULL). */
static sw_err
env_prepare(const swt_sealer *s, const char *subject, const swt_env_class *cl, const uint8_t *rid,
            const env_keyset *ks, env_keys *k)
{
    size_t sl = strlen(subject);
    memset(&k->ad, 0, sizeof(k->ad));
    k->ad.msg_type = cl->msg_type;
    if (sl <= SWT_SEAL_CONTEXT_MAX) {
        k->ad.context = subject;
        k->ad.context_len = sl;
    } else { /* longer than the AD's context field: bound to its hash */
        crypto_generichash(k->ctx, sizeof(k->ctx), (const unsigned char *)subject, sl, NULL, 0);
        k->ad.context = (const char *)k->ctx;
        k->ad.context_len = sizeof(k->ctx);
    }
    if (cl->msg_type == SWT_SEAL_MSG_INSTANCE_INFO) { /* registry values (entries, tombstones) */
        k->use = &ks->registry;
        return SW_OK;
    }
    if (rid == NULL) {
        k->use = cl->to_worker ? &ks->inst_f2w : &ks->inst_w2f;
        return SW_OK;
    }
    k->use = &k->stream;
    return swt_seal_derive(&ks->key, cl->to_worker ? SWT_SEAL_STREAM_F2W : SWT_SEAL_STREAM_W2F, rid,
                           &k->stream);
}

static sw_err
env_seal(const swt_sealer *s, const char *subject, const swt_env_class *clp, const uint8_t *msg,
         size_t len, uint8_t *out, size_t out_cap, size_t *out_len)
{
    swt_env_class cl = *clp;
    env_keys k;
    const uint8_t *rid = NULL;
    uint8_t nonce[SWT_SEAL_NONCE_BYTES];
    size_t ct_len = len + SWT_SEAL_TAG_BYTES, sealed_len, n = 0, got = 0;
    sw_err e;
    if (s == NULL || subject == NULL || (msg == NULL && len != 0) || out == NULL || out_len == NULL)
        return SW_EINVAL;
    *out_len = 0;
    if (len > SWT_SEAL_MAX_PLAINTEXT || len + SWT_ENV_OVERHEAD > out_cap)
        return SW_EMSGSIZE;
    if (has_rid_field(cl.msg_type)) {
        int found = find_rid(msg, len, &rid);
        if (found < 0)
            return SW_EINVAL; /* not a protobuf message: the receiver could not check it */
        if (found == 0)
            rid = NULL;
    }
    if ((e = env_prepare(s, subject, &cl, rid, &s->cur, &k)) != SW_OK)
        return e;
    sealed_len = 1 + swp_varint_size(s->cur.key.id) + 2 + SWT_SEAL_NONCE_BYTES + 1 +
                 swp_varint_size(ct_len) + ct_len;
    out[n++] = (1 << 3) | 0; /* version */
    out[n++] = 1;
    if (rid != NULL) {
        out[n++] = (2 << 3) | 2;
        out[n++] = ENV_RID;
        memcpy(out + n, rid, ENV_RID);
        n += ENV_RID;
    }
    out[n++] = (15 << 3) | 2;
    n += swp_varint_write(out + n, sealed_len);
    out[n++] = (1 << 3) | 0;
    n += swp_varint_write(out + n, s->cur.key.id);
    out[n++] = (3 << 3) | 2;
    out[n++] = SWT_SEAL_NONCE_BYTES;
    {
        size_t nonce_at = n;
        n += SWT_SEAL_NONCE_BYTES;
        out[n++] = (4 << 3) | 2;
        n += swp_varint_write(out + n, ct_len);
        e = swt_seal(k.use, &k.ad, msg, len, nonce, out + n, out_cap - n, &got);
        memcpy(out + nonce_at, nonce, SWT_SEAL_NONCE_BYTES);
    }
    if (k.use == &k.stream)
        swt_seal_subkey_wipe(&k.stream);
    if (e != SW_OK)
        return e;
    *out_len = n + got;
    return SW_OK;
}

static sw_err
env_open(const swt_sealer *s, const char *subject, const swt_env_class *clp, const uint8_t *buf,
         size_t len, uint8_t *pt, size_t pt_cap, size_t *pt_len)
{
    swt_env_class cl = *clp;
    env_keys k;
    const uint8_t *rid = NULL, *nonce = NULL, *ct = NULL, *inner_rid = NULL;
    size_t nonce_len = 0, ct_len = 0, off = 0;
    uint64_t key_id = 0;
    int version = 0, have_sealed = 0, inner;
    const env_keyset *ks;
    pb_field f;
    sw_err e;
    if (pt_len != NULL)
        *pt_len = 0;
    if (s == NULL || subject == NULL || buf == NULL || pt == NULL || pt_len == NULL)
        return SW_AUTH_FAILED;
    while (off < len) {
        if (rd_field(buf, len, &off, &f) != 0)
            return SW_AUTH_FAILED;
        if (f.num == 1 && f.wt == 0 && f.v == 1 && !version) {
            version = 1;
        } else if (f.num == 2 && f.wt == 2 && f.blen == ENV_RID && rid == NULL) {
            rid = f.b;
        } else if (f.num == 15 && f.wt == 2 && !have_sealed) {
            size_t o2 = 0;
            pb_field g;
            have_sealed = 1;
            while (o2 < f.blen) {
                if (rd_field(f.b, f.blen, &o2, &g) != 0)
                    return SW_AUTH_FAILED;
                if (g.num == 1 && g.wt == 0)
                    key_id = g.v;
                else if (g.num == 3 && g.wt == 2)
                    nonce = g.b, nonce_len = g.blen;
                else if (g.num == 4 && g.wt == 2)
                    ct = g.b, ct_len = g.blen;
                else
                    return SW_AUTH_FAILED;
            }
        } else {
            return SW_AUTH_FAILED; /* nothing else travels in the clear */
        }
    }
    if (!version || !have_sealed || ct == NULL || key_id > UINT32_MAX)
        return SW_AUTH_FAILED;
    if (rid != NULL && !has_rid_field(cl.msg_type))
        return SW_AUTH_FAILED;
    /* The key by its id: the sealing key, or during a rotation the one
     * that only opens; any other id fails like any other forgery. */
    if (key_id == s->cur.key.id)
        ks = &s->cur;
    else if (s->has_open && key_id == s->open.key.id)
        ks = &s->open;
    else
        return SW_AUTH_FAILED;
    if ((e = env_prepare(s, subject, &cl, rid, ks, &k)) != SW_OK)
        return SW_AUTH_FAILED;
    e = swt_open(k.use, (uint32_t)key_id, &k.ad, nonce, nonce_len, ct, ct_len, pt, pt_cap, pt_len);
    if (k.use == &k.stream)
        swt_seal_subkey_wipe(&k.stream);
    if (e != SW_OK) { /* too large for pt included: the bytes are not authenticated */
        *pt_len = 0;
        return SW_AUTH_FAILED;
    }
    /* The plaintext's own request id is the envelope's (the sender took it
     * from there): the receiver acts only on the plaintext. */
    inner = has_rid_field(cl.msg_type) ? find_rid(pt, *pt_len, &inner_rid) : 0;
    if (inner < 0 || (rid != NULL) != (inner == 1) ||
        (rid != NULL && memcmp(rid, inner_rid, ENV_RID) != 0)) {
        sodium_memzero(pt, *pt_len);
        *pt_len = 0;
        return SW_AUTH_FAILED;
    }
    return SW_OK;
}

sw_err
swt_env_seal(const swt_sealer *s, const char *subject, const uint8_t *msg, size_t len, uint8_t *out,
             size_t out_cap, size_t *out_len)
{
    swt_env_class cl;
    if (subject == NULL)
        return SW_EINVAL;
    swt_env_classify(subject, &cl);
    return env_seal(s, subject, &cl, msg, len, out, out_cap, out_len);
}

sw_err
swt_env_open(const swt_sealer *s, const char *subject, const uint8_t *buf, size_t len, uint8_t *pt,
             size_t pt_cap, size_t *pt_len)
{
    swt_env_class cl;
    if (pt_len != NULL)
        *pt_len = 0;
    if (subject == NULL)
        return SW_AUTH_FAILED;
    swt_env_classify(subject, &cl);
    return env_open(s, subject, &cl, buf, len, pt, pt_cap, pt_len);
}

/* Registry values: the registry key as the context, the registry key. */
static const swt_env_class kv_class = {0, SWT_SEAL_MSG_INSTANCE_INFO};

sw_err
swt_env_seal_kv(const swt_sealer *s, const char *key, const uint8_t *msg, size_t len, uint8_t *out,
                size_t out_cap, size_t *out_len)
{
    if (key == NULL)
        return SW_EINVAL;
    return env_seal(s, key, &kv_class, msg, len, out, out_cap, out_len);
}

sw_err
swt_env_open_kv(const swt_sealer *s, const char *key, const uint8_t *buf, size_t len, uint8_t *pt,
                size_t pt_cap, size_t *pt_len)
{
    if (pt_len != NULL)
        *pt_len = 0;
    if (key == NULL)
        return SW_AUTH_FAILED;
    return env_open(s, key, &kv_class, buf, len, pt, pt_cap, pt_len);
}
