/* tests/fuzz/fuzz_subjects.c -- fuzz body for the parsers of subjects
 * (transport/subjects.c). A subject is chosen by whoever publishes: every
 * item's subject is parsed for its request id (swt_response_subject_id),
 * every message on the mux is asked whether it is a heartbeat batch
 * (swt_is_beats_subject), a request's reply subject must pass
 * swt_is_response_subject, and a sealed message is bound to its subject's
 * kind (swt_subject_kind_of).
 *
 * Input: the bytes, up to the first NUL and at most 1 KiB, are the subject.
 * Properties (abort() on violation, so libFuzzer and the replay driver both
 * see a crash), each against a plain reference written from the header's
 * words, not from the implementation:
 *   - swt_response_subject_id is 0 exactly when the subject's last token
 *     (after its last '.') is 32 lowercase hex digits, and then the id's
 *     hex is that token; on -1 the id is untouched;
 *   - swt_is_beats_subject is 1 exactly when the last token is "hb";
 *   - swt_mux_subject says BEATS for such a subject, else ID (with the same
 *     id) exactly when swt_response_subject_id says 0, else OTHER;
 *   - swt_subject_last_token is NULL exactly when there is no '.' or
 *     nothing after the last one, else the byte after it;
 *   - swt_is_response_subject implies the prefix "sw.rsp.";
 *   - swt_subject_kind_of is one of the kinds, and SWT_SUBJ_BEATS only for a
 *     subject that swt_is_beats_subject accepts;
 *   - swt_is_live_reply_for(s, "rtr-1") is 1 exactly when s is "sw.lv." +
 *     a name sw_validate_token accepts + ".rtr-1";
 *   - swt_js_ack_parse accepts exactly a "$JS.ACK." subject shorter than
 *     SWT_SUBJECT_MAX of 9 or 11-16 non-empty tokens whose five numbers
 *     (from the 5th, or the 7th) are 1-20 digits within 64 bits, gives
 *     those numbers, and leaves its output untouched otherwise.
 * Nothing reads past the NUL (ASan in the fuzz and sanitizer builds).
 *
 * Built with -fsanitize=fuzzer (tests/fuzz/CMakeLists.txt) and with
 * fuzz_replay_main.c as a plain program that the normal suite runs
 * (tests/unit/CMakeLists.txt, test fuzz_subjects_replay). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/sw_transport.h"

#define SUBJ_MAX 1024

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected);

static unsigned long g_ids, g_other;

void
fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected)
{
    *decoded = g_ids;
    *rejected = g_other;
}

static void
check(int ok, const char *what, const char *subject)
{
    if (!ok) {
        fprintf(stderr, "fuzz_subjects: %s: \"%s\"\n", what, subject);
        abort();
    }
}

static int
ref_is_lower_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s;
    size_t n = 0;
    const char *dot, *last;
    uint8_t id[SW_REQUEST_ID_BYTES], untouched[SW_REQUEST_ID_BYTES];
    int want_id, rv, kind;

    while (n < size && n < SUBJ_MAX && data[n] != 0)
        n++;
    if ((s = malloc(n + 1)) == NULL) /* exactly the string: ASan sees any overread */
        return 0;
    if (n > 0) /* (an empty input may come as NULL) */
        memcpy(s, data, n);
    s[n] = '\0';
    dot = strrchr(s, '.');

    /* the request id */
    want_id = dot != NULL && strlen(dot + 1) == 2 * SW_REQUEST_ID_BYTES;
    for (size_t i = 0; want_id && i < 2 * SW_REQUEST_ID_BYTES; i++)
        want_id = ref_is_lower_hex(dot[1 + i]);
    memset(id, 0xa5, sizeof(id));
    memcpy(untouched, id, sizeof(id));
    rv = swt_response_subject_id(s, id);
    check(rv == 0 || rv == -1, "swt_response_subject_id returned neither 0 nor -1", s);
    check((rv == 0) == want_id, "swt_response_subject_id disagrees with the reference", s);
    if (rv == 0) {
        char hex[2 * SW_REQUEST_ID_BYTES + 1];
        for (int i = 0; i < SW_REQUEST_ID_BYTES; i++)
            snprintf(hex + 2 * i, 3, "%02x", id[i]);
        check(memcmp(hex, dot + 1, 2 * SW_REQUEST_ID_BYTES) == 0, "the id is not the token", s);
        g_ids++;
    } else {
        check(memcmp(id, untouched, sizeof(id)) == 0, "a refused subject wrote the id", s);
        g_other++;
    }

    /* heartbeat batches, the last token, the response prefix, the kind */
    check(swt_is_beats_subject(s) == (dot != NULL && strcmp(dot + 1, "hb") == 0),
          "swt_is_beats_subject disagrees with the reference", s);
    {
        /* the mux's one read of a subject: the two answers above, in that order */
        uint8_t mid[SW_REQUEST_ID_BYTES];
        int beats = dot != NULL && strcmp(dot + 1, "hb") == 0;
        swt_mux_kind mk;
        memset(mid, 0xa5, sizeof(mid));
        mk = swt_mux_subject(s, mid);
        check(mk == (beats     ? SWT_MUX_BEATS
                     : want_id ? SWT_MUX_ID
                               : SWT_MUX_OTHER),
              "swt_mux_subject disagrees with the reference", s);
        check(memcmp(mid, mk == SWT_MUX_ID ? id : untouched, sizeof(mid)) == 0,
              "swt_mux_subject's id is not swt_response_subject_id's", s);
    }
    last = swt_subject_last_token(s);
    check(dot == NULL || dot[1] == '\0' ? last == NULL : last == dot + 1,
          "swt_subject_last_token is not after the last dot", s);
    if (swt_is_response_subject(s))
        check(strncmp(s, "sw.rsp.", 7) == 0, "a response subject without its prefix", s);
    kind = (int)swt_subject_kind_of(s);
    check(kind >= (int)SWT_SUBJ_OTHER && kind <= (int)SWT_SUBJ_ROUTER, "an unknown kind", s);
    if (kind == (int)SWT_SUBJ_BEATS)
        check(swt_is_beats_subject(s), "kind BEATS for a subject that is not one", s);
    {
        /* a liveness probe's reply subject for router rtr-1 */
        static const char tail[] = ".rtr-1";
        size_t tl = sizeof(tail) - 1;
        int want = 0;
        if (n > 6 + tl && strncmp(s, "sw.lv.", 6) == 0 && strcmp(s + n - tl, tail) == 0) {
            size_t in = n - 6 - tl;
            char *inst = malloc(in + 1);
            if (inst != NULL) {
                memcpy(inst, s + 6, in);
                inst[in] = '\0';
                want = sw_validate_token(inst) == SW_OK;
                free(inst);
            }
        }
        check(swt_is_live_reply_for(s, "rtr-1") == want,
              "swt_is_live_reply_for disagrees with the reference", s);
    }
    {
        /* a JetStream reply: accepted exactly in the reference's form, and
         * its numbers are the tokens at their places */
        swt_js_ack a, keep;
        const char *tok[17];
        size_t nt = 0, first = 0;
        int want = strncmp(s, "$JS.ACK.", 8) == 0 && strlen(s) < SWT_SUBJECT_MAX;
        for (const char *p = s; want && nt < 17;) {
            const char *q = strchr(p, '.');
            tok[nt++] = p;
            if (q == NULL)
                break;
            p = q + 1;
        }
        want = want && (nt == 9 || (nt >= 11 && nt <= 16));
        first = nt == 9 ? 4 : 6;
        for (size_t i = 0; want && i < nt; i++) {
            size_t tn = strcspn(tok[i], ".");
            if (tn == 0)
                want = 0;
            if (want && i >= first && i < first + 5) {
                want = tn <= 20 && strspn(tok[i], "0123456789") == tn;
                errno = 0;
                (void)strtoull(tok[i], NULL, 10);
                want = want && errno == 0; /* (ERANGE past 64 bits) */
            }
        }
        memset(&a, 0x5a, sizeof(a));
        keep = a;
        rv = swt_js_ack_parse(s, &a);
        check(rv == 0 || rv == -1, "swt_js_ack_parse returned neither 0 nor -1", s);
        check((rv == 0) == want, "swt_js_ack_parse disagrees with the reference", s);
        if (rv == 0) {
            check(strtoull(tok[first + 1], NULL, 10) == a.stream_seq &&
                      strtoull(tok[first + 2], NULL, 10) == a.consumer_seq &&
                      strtoull(tok[first + 4], NULL, 10) == a.pending,
                  "swt_js_ack_parse's numbers are not the tokens", s);
        } else {
            check(memcmp(&a, &keep, sizeof(a)) == 0, "a refused reply wrote the metadata", s);
        }
    }
    free(s);
    return 0;
}
