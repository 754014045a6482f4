/* cmd/keygen.c -- `streamwire keygen --out FILE`: writes a new cluster key
 * for sealing (docs/PROTOCOL.md "Security: sealing") with mode 0600. Never
 * prints the key; refuses to replace a file without --force (then the new
 * key goes to a temporary file in the same directory, renamed over the old
 * one, so the old key is never half overwritten). Single-threaded. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "cli.h"
#include "common/sw_common.h"
#include "transport/seal.h"

/* Writes all of buf to fd, then fsync. 0 or an errno. */
static int
keygen_write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? errno : EIO;
        buf += n;
        len -= (size_t)n;
    }
    if (fchmod(fd, 0600) != 0 || fsync(fd) != 0)
        return errno;
    return 0;
}

int
cli_keygen_main(int argc, char **argv)
{
    const char *out = NULL;
    int force = 0;
    const cli_opt opts[] = {
        {"out", CLI_STRING, "FILE", "where to write the key (created with mode 0600)", &out, 0, 0,
         NULL, 1},
        {"force", CLI_FLAG, NULL,
         "replace FILE if it exists (the old key is lost: every process\nthat uses it must get "
         "the new one)",
         &force, 0, 0, NULL, 0},
    };
    const cli_cmd cmd = {
        "keygen",
        "Write a new cluster key for sealing: 32 random bytes as one line of 64 hex\n"
        "digits, in a file of mode 0600. Every worker, frontend and gateway of a sealed\n"
        "cluster gets the same file (--key-file FILE). To rotate, give every process\n"
        "the new key with --open-key-file, then swap the two, then drop the old one\n"
        "(docs/SECURITY.md). The key is never printed; its public key id is.",
        NULL,
        "Exit status: 0 written; 1 FILE exists (without --force) or cannot be written;\n"
        "2 usage error.",
        opts,
        sizeof(opts) / sizeof(opts[0]),
        NULL,
        0,
    };
    swt_seal_key key, check;
    char hex[SWT_SEAL_KEY_HEX + 1];
    char text[256];
    char why[SWT_SEAL_WHY_MAX];
    char *tmp = NULL;
    const char *target;
    int fd = -1, rc, e;
    size_t len;
    sw_err err;

    rc = cli_parse(&cmd, argc, argv);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if (out == NULL || out[0] == '\0')
        return cli_usage_error(&cmd, "--out FILE must not be empty");
    if (swt_seal_key_generate(&key) != SW_OK) {
        fprintf(stderr, "streamwire keygen: libsodium failed to initialise\n");
        return CLI_EXIT_FAIL;
    }
    swt_seal_key_hex(&key, hex);
    len = (size_t)snprintf(text, sizeof(text),
                           "# streamwire cluster key (sealing). Keep it secret: mode 0600.\n"
                           "# key id %08x\n%s\n",
                           (unsigned)key.id, hex);
    sodium_memzero(hex, sizeof(hex));

    if (force) {
        tmp = malloc(strlen(out) + 16);
        if (tmp == NULL) {
            rc = CLI_EXIT_FAIL;
            fprintf(stderr, "streamwire keygen: out of memory\n");
            goto done;
        }
        sprintf(tmp, "%s.tmp.XXXXXX", out);
        fd = mkstemp(tmp); /* mode 0600 */
        target = tmp;
    } else {
        fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        target = out;
    }
    if (fd < 0) {
        e = errno;
        if (e == EEXIST && !force)
            fprintf(stderr,
                    "streamwire keygen: %s exists; not replacing it.\n"
                    "  Pass --force to replace it (the old key is then lost).\n",
                    out);
        else
            fprintf(stderr, "streamwire keygen: cannot create %s: %s\n", target, strerror(e));
        rc = CLI_EXIT_FAIL;
        goto done;
    }
    e = keygen_write_all(fd, text, len);
    if (close(fd) != 0 && e == 0)
        e = errno;
    fd = -1;
    if (e == 0 && force && rename(tmp, out) != 0)
        e = errno;
    if (e != 0) {
        fprintf(stderr, "streamwire keygen: cannot write %s: %s\n", out, strerror(e));
        unlink(target);
        rc = CLI_EXIT_FAIL;
        goto done;
    }
    /* Read it back as every process will. */
    err = swt_seal_key_load(out, &check, why, sizeof(why));
    if (err != SW_OK || check.id != key.id || sodium_memcmp(check.k, key.k, sizeof(key.k)) != 0) {
        fprintf(stderr, "streamwire keygen: %s does not read back: %s\n", out,
                err != SW_OK ? why : "different key");
        rc = CLI_EXIT_FAIL;
    } else {
        printf("wrote a new cluster key to %s (mode 0600, key id %08x)\n", out, (unsigned)key.id);
        rc = CLI_EXIT_OK;
    }
    swt_seal_key_wipe(&check);
done:
    sodium_memzero(text, sizeof(text));
    swt_seal_key_wipe(&key);
    free(tmp);
    return rc;
}
