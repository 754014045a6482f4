/* tests/install/main.c -- a minimal streamwire consumer: built against an
 * installed copy (CMake package and pkg-config) by run.sh. Exits 0 when the
 * library it runs with matches the headers it was compiled with. */
#include <stdio.h>
#include <string.h>

#include <streamwire/streamwire.h>

#define STR_(x) #x
#define STR(x) STR_(x)

int
main(void)
{
    const char *want = STR(SW_VERSION_MAJOR) "." STR(SW_VERSION_MINOR) "." STR(SW_VERSION_PATCH);
    const char *ver = sw_version();
    const char *msg = sw_strerror(SW_ETIMEDOUT);
    sw_err parsed = SW_OK;

    printf("streamwire %s: %s = \"%s\"\n", ver, sw_err_name(SW_ETIMEDOUT), msg);
    if (strcmp(ver, want) != 0) {
        fprintf(stderr, "version mismatch: library %s, headers %s\n", ver, want);
        return 1;
    }
    if (strcmp(msg, "operation timed out") != 0 || strcmp(sw_strerror(-1), "unknown error") != 0)
        return 1;
    if (sw_err_from_name("instance_lost", &parsed) != SW_OK || parsed != SW_INSTANCE_LOST)
        return 1;
    if (sw_validate_endpoint("ns.component.endpoint") != SW_OK)
        return 1;
    return 0;
}
