/* tests/unit/test_keygen.c -- `streamwire keygen` as a black box: the file
 * is mode 0600 (whatever the umask), loads with swt_seal_key_load, the key
 * never appears in the output, two keys differ, an existing file is not
 * replaced without --force, --help and usage errors. Needs no NATS server.
 * Single-threaded; runs the CLI (SW_CLI_PATH) as a child. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sw_common.h"
#include "transport/seal.h"

static char g_dir[64], g_key[128], g_out[128];
static char g_output[8192]; /* stdout + stderr of the last run */

static int
setup_all(void **state)
{
    (void)state;
    if (swi_init() != SW_OK)
        return -1;
    snprintf(g_dir, sizeof(g_dir), "/tmp/test_keygen.XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return -1;
    snprintf(g_key, sizeof(g_key), "%s/cluster.key", g_dir);
    snprintf(g_out, sizeof(g_out), "%s/output", g_dir);
    return 0;
}

static int
teardown_all(void **state)
{
    (void)state;
    unlink(g_key);
    unlink(g_out);
    rmdir(g_dir);
    return 0;
}

/* Runs the CLI with up to 4 arguments under umask um; returns its exit
 * status and leaves its output in g_output. */
static int
run(mode_t um, const char *a1, const char *a2, const char *a3, const char *a4)
{
    const char *argv[] = {"streamwire", a1, a2, a3, a4, NULL};
    int status, fd;
    ssize_t n;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        fd = open(g_out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(127);
        umask(um);
        execv(SW_CLI_PATH, (char *const *)argv);
        _exit(127);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    fd = open(g_out, O_RDONLY);
    assert_true(fd >= 0);
    n = read(fd, g_output, sizeof(g_output) - 1);
    close(fd);
    g_output[n > 0 ? n : 0] = '\0';
    return WEXITSTATUS(status);
}

static mode_t
file_mode(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_mode & 07777;
}

static void
load(swt_seal_key *k)
{
    char why[SWT_SEAL_WHY_MAX];
    if (swt_seal_key_load(g_key, k, why, sizeof(why)) != SW_OK)
        fail_msg("%s", why);
}

/* The output names the file and the key id, never the key. */
static void
assert_no_key_in_output(const swt_seal_key *k)
{
    char hex[SWT_SEAL_KEY_HEX + 1], id[16];
    swt_seal_key_hex(k, hex);
    assert_null(strstr(g_output, hex));
    hex[16] = '\0'; /* nor a piece of it */
    assert_null(strstr(g_output, hex));
    snprintf(id, sizeof(id), "%08x", (unsigned)k->id);
    assert_non_null(strstr(g_output, id));
}

static void
test_writes_0600_and_loads(void **state)
{
    swt_seal_key k;
    (void)state;
    unlink(g_key);
    assert_int_equal(run(0, "keygen", "--out", g_key, NULL), 0); /* umask 0: still 0600 */
    assert_int_equal(file_mode(g_key), 0600);
    load(&k);
    assert_no_key_in_output(&k);
    assert_non_null(strstr(g_output, g_key));
    swt_seal_key_wipe(&k);
}

static void
test_two_keys_differ(void **state)
{
    swt_seal_key a, b;
    (void)state;
    unlink(g_key);
    assert_int_equal(run(022, "keygen", "--out", g_key, NULL), 0);
    load(&a);
    unlink(g_key);
    assert_int_equal(run(022, "keygen", "--out", g_key, NULL), 0);
    load(&b);
    assert_memory_not_equal(a.k, b.k, sizeof(a.k));
    assert_int_not_equal(a.id, b.id);
    swt_seal_key_wipe(&a);
    swt_seal_key_wipe(&b);
}

static void
test_overwrite_refused_then_forced(void **state)
{
    swt_seal_key before, after;
    (void)state;
    unlink(g_key);
    assert_int_equal(run(022, "keygen", "--out", g_key, NULL), 0);
    load(&before);
    assert_int_equal(run(022, "keygen", "--out", g_key, NULL), 1);
    assert_non_null(strstr(g_output, "--force"));
    load(&after);
    assert_memory_equal(before.k, after.k, sizeof(before.k)); /* untouched */
    /* --force replaces it, and makes a too-open file 0600 again */
    assert_int_equal(chmod(g_key, 0644), 0);
    assert_int_equal(run(022, "keygen", "--out", g_key, "--force"), 0);
    assert_int_equal(file_mode(g_key), 0600);
    load(&after);
    assert_memory_not_equal(before.k, after.k, sizeof(before.k));
    assert_no_key_in_output(&after);
    swt_seal_key_wipe(&before);
    swt_seal_key_wipe(&after);
}

static void
test_help_and_usage(void **state)
{
    (void)state;
    assert_int_equal(run(022, "keygen", "--help", NULL, NULL), 0);
    assert_non_null(strstr(g_output, "--out FILE"));
    assert_non_null(strstr(g_output, "--force"));
    assert_int_equal(run(022, "keygen", NULL, NULL, NULL), 2);
    assert_non_null(strstr(g_output, "--out"));
    assert_int_equal(run(022, "keygen", "--out", "", NULL), 2);
    assert_int_equal(run(022, "--help", NULL, NULL, NULL), 0);
    assert_non_null(strstr(g_output, "keygen"));
    /* a directory that does not exist */
    assert_int_equal(run(022, "keygen", "--out", "/nonexistent-dir/k", NULL), 1);
    assert_non_null(strstr(g_output, "cannot create"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writes_0600_and_loads),
        cmocka_unit_test(test_two_keys_differ),
        cmocka_unit_test(test_overwrite_refused_then_forced),
        cmocka_unit_test(test_help_and_usage),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
