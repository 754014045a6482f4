/* tests/unit/test_nkey.c -- transport/nkey.c: the public key of a NATS user
 * nkey seed (`--nkey FILE`). The integration test test_security proves the
 * derivation against a real nats-server; these cases pin the encoding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "transport/sw_transport.h"

/* The example pair from the NATS documentation (nkey authentication). */
#define DOC_SEED "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY"
#define DOC_PUBLIC "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"

static void
test_documented_pair(void **state)
{
    char pub[SWT_NKEY_PUBLIC_LEN + 1];
    (void)state;
    assert_int_equal(swt_nkey_user_public(DOC_SEED, pub), SW_OK);
    assert_string_equal(pub, DOC_PUBLIC);
    assert_int_equal(strlen(pub), SWT_NKEY_PUBLIC_LEN);
}

/* A fresh Ed25519 seed encodes as "SU..." (58 characters) and yields a
 * "U..." public key (56), the same each time; another seed, another key. */
static void
test_round_trip_random(void **state)
{
    (void)state;
    assert_int_equal(swi_init(), SW_OK);
    for (int i = 0; i < 200; i++) {
        uint8_t raw[32];
        char seed[SWT_NKEY_SEED_LEN + 1], pub[SWT_NKEY_PUBLIC_LEN + 1],
            again[SWT_NKEY_PUBLIC_LEN + 1];
        randombytes_buf(raw, sizeof(raw));
        assert_int_equal(swt_nkey_user_seed_encode(raw, seed), SW_OK);
        assert_int_equal(strlen(seed), SWT_NKEY_SEED_LEN);
        assert_memory_equal(seed, "SU", 2);
        assert_int_equal(swt_nkey_user_public(seed, pub), SW_OK);
        assert_int_equal(pub[0], 'U');
        assert_int_equal(strlen(pub), SWT_NKEY_PUBLIC_LEN);
        assert_int_equal(swt_nkey_user_public(seed, again), SW_OK);
        assert_string_equal(pub, again);
        if (i == 0) {
            char other_seed[SWT_NKEY_SEED_LEN + 1], other[SWT_NKEY_PUBLIC_LEN + 1];
            raw[0] ^= 1;
            assert_int_equal(swt_nkey_user_seed_encode(raw, other_seed), SW_OK);
            assert_int_equal(swt_nkey_user_public(other_seed, other), SW_OK);
            assert_string_not_equal(other, pub);
        }
    }
}

static void
test_rejects(void **state)
{
    char pub[SWT_NKEY_PUBLIC_LEN + 1];
    char bad[SWT_NKEY_SEED_LEN + 1];
    (void)state;
    /* wrong checksum */
    snprintf(bad, sizeof(bad), "%s", DOC_SEED);
    bad[SWT_NKEY_SEED_LEN - 1] = bad[SWT_NKEY_SEED_LEN - 1] == 'A' ? 'B' : 'A';
    assert_int_equal(swt_nkey_user_public(bad, pub), SW_EAUTH);
    assert_string_equal(pub, "");
    /* a character outside base32 */
    snprintf(bad, sizeof(bad), "%s", DOC_SEED);
    bad[10] = '0';
    assert_int_equal(swt_nkey_user_public(bad, pub), SW_EAUTH);
    /* too short */
    assert_int_equal(swt_nkey_user_public("SUACSS", pub), SW_EAUTH);
    assert_int_equal(swt_nkey_user_public("", pub), SW_EAUTH);
    /* a public key is not a seed */
    assert_int_equal(swt_nkey_user_public(DOC_PUBLIC "AA", pub), SW_EAUTH);
    /* another key type's prefix ("SA...", an account seed) is refused */
    snprintf(bad, sizeof(bad), "%s", DOC_SEED);
    bad[1] = 'A';
    assert_int_equal(swt_nkey_user_public(bad, pub), SW_EAUTH);
    assert_int_equal(swt_nkey_user_public(NULL, pub), SW_EINVAL);
}

static char g_path[64];

static void
write_file(const char *text)
{
    FILE *f;
    snprintf(g_path, sizeof(g_path), "/tmp/sw-nkey-%d", (int)getpid());
    f = fopen(g_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void
test_from_file(void **state)
{
    char pub[SWT_NKEY_PUBLIC_LEN + 1];
    (void)state;
    /* a bare seed file, with a newline */
    write_file(DOC_SEED "\n");
    assert_int_equal(swt_nkey_public_from_file(g_path, pub), SW_OK);
    assert_string_equal(pub, DOC_PUBLIC);
    /* the seed block of a .creds file, after a JWT block */
    write_file("-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJqd3QiLCJhbGciOiJlZDI1NTE5In0.e30.sig\n"
               "------END NATS USER JWT------\n\n"
               "************************* IMPORTANT *************************\n"
               "-----BEGIN USER NKEY SEED-----\n" DOC_SEED "\n"
               "------END USER NKEY SEED------\n");
    assert_int_equal(swt_nkey_public_from_file(g_path, pub), SW_OK);
    assert_string_equal(pub, DOC_PUBLIC);
    /* no seed in it */
    write_file("hello\nSUPER\n");
    assert_int_equal(swt_nkey_public_from_file(g_path, pub), SW_EAUTH);
    /* a seed inside a longer base32 run is not taken */
    write_file("AAAA" DOC_SEED "\n");
    assert_int_equal(swt_nkey_public_from_file(g_path, pub), SW_EAUTH);
    unlink(g_path);
    /* no such file */
    assert_int_equal(swt_nkey_public_from_file(g_path, pub), SW_EAUTH);
    assert_int_equal(swt_nkey_public_from_file(NULL, pub), SW_EINVAL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_documented_pair),
        cmocka_unit_test(test_round_trip_random),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_from_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
