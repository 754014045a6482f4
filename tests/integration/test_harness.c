/* tests/integration/test_harness.c -- the test nats-server launcher's own
 * promises (support/natsd.c): the sweep of stale temp dirs that every
 * swh_nats_start runs never removes the dir of a live owner, even while its
 * server is down for a restart (CI caught a parallel test doing exactly
 * that), and does remove the dir of an owner that died. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

static int
exists(const char *dir)
{
    struct stat st;
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The dir looks untouched for two minutes (the sweep's age test). */
static void
age(const char *dir)
{
    struct timeval tv[2];
    gettimeofday(&tv[0], NULL);
    tv[0].tv_sec -= 120;
    tv[1] = tv[0];
    assert_int_equal(utimes(dir, tv), 0);
}

/* Another process starts (and stops) a server: its sweep runs. */
static void
sweep_in_child(void)
{
    pid_t p = fork();
    int st;
    assert_true(p >= 0);
    if (p == 0) {
        swh_nats n;
        int rc = swh_nats_start(&n, NULL);
        swh_nats_stop(&n);
        _exit(rc == 0 ? 0 : 1);
    }
    assert_int_equal(waitpid(p, &st, 0), p);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void
test_sweep_spares_a_live_owner(void **state)
{
    swh_nats a;
    char dir[256];
    (void)state;
    assert_int_equal(swh_nats_start(&a, NULL), 0);
    snprintf(dir, sizeof(dir), "%s", a.dir);
    swh_nats_stop_keep(&a); /* down, as in a restart: the server's pid is gone */
    age(dir);
    sweep_in_child();
    assert_true(exists(dir)); /* the owner lives: kept */
    assert_int_equal(swh_nats_restart(&a, 0), 0);
    swh_nats_stop(&a);
    assert_false(exists(dir));
}

static void
test_sweep_removes_a_dead_owners_dir(void **state)
{
    char dir[256] = "";
    int fds[2], st;
    pid_t p;
    (void)state;
    assert_int_equal(pipe(fds), 0);
    p = fork();
    assert_true(p >= 0);
    if (p == 0) { /* a run that is killed: its server stops, its dir stays */
        swh_nats n;
        if (swh_nats_start(&n, NULL) != 0)
            _exit(1);
        swh_nats_stop_keep(&n);
        (void)!write(fds[1], n.dir, strlen(n.dir) + 1);
        _exit(0); /* without swh_nats_stop: the lock goes with the process */
    }
    close(fds[1]);
    assert_true(read(fds[0], dir, sizeof(dir)) > 0);
    close(fds[0]);
    assert_int_equal(waitpid(p, &st, 0), p);
    assert_true(exists(dir));
    age(dir);
    sweep_in_child();
    assert_false(exists(dir));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sweep_spares_a_live_owner),
        cmocka_unit_test(test_sweep_removes_a_dead_owners_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
