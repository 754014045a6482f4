/* cmd/conn.c -- the NATS connection flags every subcommand shares
 * (--user, --password, --token, --creds, --nkey, --inbox-prefix, --tls*,
 * --key-file, --open-key-file),
 * their application to sw_conn_opts, the arguments that pass them on to
 * child processes (demo), and the message for a failed connection, which
 * names the flag to look at. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "transport/envelope.h"
#include "transport/seal.h"

void
cli_conn_rows(cli_conn_flags *f, cli_opt rows[CLI_CONN_NOPTS])
{
    const cli_opt r[CLI_CONN_NOPTS] = {
        {"user", CLI_STRING, "NAME",
         "NATS user name (with --password, or the password\nin $STREAMWIRE_NATS_PASSWORD)",
         &f->user, 0, 0, NULL, 0},
        {"password", CLI_STRING, "PASS", "NATS password (visible in ps: prefer the environment)",
         &f->password, 0, 0, NULL, 0},
        {"token", CLI_STRING, "TOKEN", "NATS token (or $STREAMWIRE_NATS_TOKEN)", &f->token, 0, 0,
         NULL, 0},
        {"creds", CLI_STRING, "FILE", "NATS user credentials file (JWT and nkey seed)", &f->creds,
         0, 0, NULL, 0},
        {"nkey", CLI_STRING, "FILE", "NATS user nkey seed file (\"SU...\")", &f->nkey, 0, 0, NULL,
         0},
        {"inbox-prefix", CLI_STRING, "PREFIX",
         "reply subjects start with PREFIX instead of _INBOX\n(so that permissions can confine "
         "them)",
         &f->inbox_prefix, 0, 0, NULL, 0},
        {"tls", CLI_FLAG, NULL, "connect with TLS (implied by --tls-ca, --tls-cert)", &f->tls, 0, 0,
         NULL, 0},
        {"tls-ca", CLI_STRING, "FILE", "CA certificate(s), PEM, that the server's must chain to",
         &f->tls_ca, 0, 0, NULL, 0},
        {"tls-cert", CLI_STRING, "FILE", "client certificate, PEM (with --tls-key)", &f->tls_cert,
         0, 0, NULL, 0},
        {"tls-key", CLI_STRING, "FILE", "client private key, PEM", &f->tls_key, 0, 0, NULL, 0},
        {"tls-insecure", CLI_FLAG, NULL, "do not verify the server's certificate (tests only)",
         &f->tls_insecure, 0, 0, NULL, 0},
        {"key-file", CLI_STRING, "FILE",
         "cluster key (streamwire keygen): seal everything sent\nand refuse everything received "
         "unsealed (mode 0600)",
         &f->key_file, 0, 0, NULL, 0},
        {"open-key-file", CLI_STRING, "FILE",
         "a second cluster key that opens but never seals:\nfor a key rotation (with --key-file; "
         "docs/PROTOCOL.md)",
         &f->open_key_file, 0, 0, NULL, 0},
    };
    memcpy(rows, r, sizeof(r));
}

void
cli_conn_apply(const cli_conn_flags *f, sw_conn_opts *o)
{
    o->user = f->user;
    o->password = f->password;
    if (o->user != NULL && o->password == NULL)
        o->password = getenv("STREAMWIRE_NATS_PASSWORD");
    o->token = f->token ? f->token : getenv("STREAMWIRE_NATS_TOKEN");
    o->creds_file = f->creds;
    o->nkey_seed_file = f->nkey;
    o->inbox_prefix = f->inbox_prefix;
    o->tls = f->tls;
    o->tls_ca_file = f->tls_ca;
    o->tls_cert_file = f->tls_cert;
    o->tls_key_file = f->tls_key;
    o->tls_skip_verify = f->tls_insecure;
    o->seal_key_file = f->key_file;
    o->seal_open_key_file = f->open_key_file;
}

int
cli_conn_check(const cli_cmd *cmd, const cli_conn_flags *f)
{
    if (f->creds != NULL && f->nkey != NULL)
        return cli_usage_error(cmd, "--creds and --nkey exclude each other");
    if ((f->tls_cert == NULL) != (f->tls_key == NULL))
        return cli_usage_error(cmd, "--tls-cert and --tls-key go together");
    if (f->password != NULL && f->user == NULL)
        return cli_usage_error(cmd, "--password needs --user");
    {
        const char *flag[5] = {"creds", "nkey", "tls-ca", "tls-cert", "tls-key"};
        const char *file[5] = {f->creds, f->nkey, f->tls_ca, f->tls_cert, f->tls_key};
        for (int i = 0; i < 5; i++) {
            FILE *fp;
            int err;
            if (file[i] == NULL)
                continue;
            if ((fp = fopen(file[i], "r")) == NULL)
                return cli_usage_error(cmd, "--%s: cannot read %s: %s", flag[i], file[i],
                                       strerror(errno));
            /* a directory opens, and only a read says EISDIR */
            err = getc(fp) == EOF && ferror(fp) ? errno : 0;
            fclose(fp);
            if (err != 0)
                return cli_usage_error(cmd, "--%s: cannot read %s: %s", flag[i], file[i],
                                       strerror(err));
        }
    }
    if (f->open_key_file != NULL && f->key_file == NULL)
        return cli_usage_error(cmd, "--open-key-file needs --key-file (the key that seals)");
    if (f->key_file != NULL) {
        /* checked here so that the reason reaches the user (sw_conn_open
         * only has an error code for it) */
        swt_seal_key k;
        char why[SWT_SEAL_WHY_MAX];
        sw_err e = swt_seal_key_load(f->key_file, &k, why, sizeof(why));
        swt_seal_key_wipe(&k);
        if (e != SW_OK)
            return cli_usage_error(cmd, "--key-file: %s", why);
        if (f->open_key_file != NULL) {
            /* The second key loads, and its id differs from the first's
             * (the connection's own check, with its reason). */
            swt_sealer *s = NULL;
            e = swt_sealer_load(&s, f->key_file, f->open_key_file, why, sizeof(why));
            swt_sealer_free(s);
            if (e != SW_OK)
                return cli_usage_error(cmd, "--open-key-file: %s", why);
        }
    }
    return CLI_EXIT_OK;
}

size_t
cli_conn_argv(const cli_conn_flags *f, const char **argv, size_t cap)
{
    size_t n = 0;
#define CLI_PASS(flag, val)                  \
    do {                                     \
        if ((val) != NULL && n + 2 <= cap) { \
            argv[n++] = flag;                \
            argv[n++] = (val);               \
        }                                    \
    } while (0)
    CLI_PASS("--user", f->user);
    CLI_PASS("--password", f->password);
    CLI_PASS("--token", f->token);
    CLI_PASS("--creds", f->creds);
    CLI_PASS("--nkey", f->nkey);
    CLI_PASS("--inbox-prefix", f->inbox_prefix);
    CLI_PASS("--tls-ca", f->tls_ca);
    CLI_PASS("--tls-cert", f->tls_cert);
    CLI_PASS("--tls-key", f->tls_key);
    CLI_PASS("--key-file", f->key_file);
    CLI_PASS("--open-key-file", f->open_key_file);
#undef CLI_PASS
    if (f->tls && n < cap)
        argv[n++] = "--tls";
    if (f->tls_insecure && n < cap)
        argv[n++] = "--tls-insecure";
    return n;
}

void
cli_conn_error(const char *cmd, const char *url, const cli_conn_flags *f, sw_err err)
{
    const char *hint = "";
    switch (err) {
    case SW_EAUTH:
        hint = f->creds   ? " (check --creds)"
               : f->nkey  ? " (check --nkey and the server's nkey list)"
               : f->user  ? " (check --user and --password)"
               : f->token ? " (check --token)"
                          : " (the server wants credentials: --user, --token, --creds or --nkey)";
        break;
    case SW_ETLS:
        hint = f->tls || f->tls_ca || f->tls_cert
                   ? " (check --tls-ca, --tls-cert and --tls-key)"
                   : " (the server requires TLS: add --tls and --tls-ca)";
        break;
    case SW_EINVAL:
        hint = " (check the connection flags)";
        break;
    default:
        break;
    }
    fprintf(stderr, "streamwire %s: cannot connect to NATS server at %s: %s (%s)%s\n", cmd, url,
            sw_strerror(err), sw_err_name(err), hint);
}

void
cli_registry_error(const char *cmd, const char *what, sw_err err, const char *alt)
{
    fprintf(stderr, "streamwire %s: cannot %s: %s (%s)\n", cmd, what, sw_strerror(err),
            sw_err_name(err));
    if (err == SW_NO_RESPONDERS || err == SW_ETIMEDOUT)
        fprintf(stderr, "  (does the server run JetStream, nats-server -js?%s)\n", alt);
}
