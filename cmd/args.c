/* cmd/args.c -- the one option parser every subcommand uses. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define CLI_HELP_COL 32

static const cli_opt *
cli_find(const cli_cmd *cmd, const char *name, size_t len)
{
    size_t i;

    for (i = 0; i < cmd->nopts; i++) {
        if (strlen(cmd->opts[i].name) == len && strncmp(cmd->opts[i].name, name, len) == 0)
            return &cmd->opts[i];
    }
    for (i = 0; cmd->conn_opts != NULL && i < cmd->nconn; i++) {
        if (strlen(cmd->conn_opts[i].name) == len &&
            strncmp(cmd->conn_opts[i].name, name, len) == 0)
            return &cmd->conn_opts[i];
    }
    return NULL;
}

static int
cli_choice_ok(const char *choices, const char *v)
{
    size_t vlen = strlen(v);
    const char *p = choices;

    while (p != NULL && *p != '\0') {
        const char *end = strchr(p, '|');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);

        if (len == vlen && strncmp(p, v, len) == 0)
            return 1;
        p = end != NULL ? end + 1 : NULL;
    }
    return 0;
}

static void
cli_opt_label(const cli_opt *o, char *buf, size_t cap)
{
    if (o->kind == CLI_FLAG)
        snprintf(buf, cap, "--%s", o->name);
    else if (o->kind == CLI_CHOICE && o->metavar == NULL)
        snprintf(buf, cap, "--%s %s", o->name, o->choices);
    else
        snprintf(buf, cap, "--%s %s", o->name, o->metavar != NULL ? o->metavar : "VALUE");
}

static void
cli_usage_row(const cli_opt *o, FILE *f)
{
    char label[128];
    const char *h = o->help != NULL ? o->help : "";
    int col;

    cli_opt_label(o, label, sizeof(label));
    col = fprintf(f, "  %s", label);
    if (col >= CLI_HELP_COL - 1) {
        fputc('\n', f);
        col = 0;
    }
    fprintf(f, "%*s", CLI_HELP_COL - col, "");
    while (*h != '\0') {
        const char *nl = strchr(h, '\n');
        size_t len = nl != NULL ? (size_t)(nl - h) : strlen(h);

        fprintf(f, "%.*s", (int)len, h);
        if (nl == NULL)
            break;
        fprintf(f, "\n%*s", CLI_HELP_COL, "");
        h = nl + 1;
    }
    if (o->required)
        fprintf(f, " (required)");
    fputc('\n', f);
}

void
cli_usage(const cli_cmd *cmd, FILE *f)
{
    char label[128];
    size_t i;

    fprintf(f, "Usage: streamwire %s", cmd->name);
    for (i = 0; i < cmd->nopts; i++) {
        if (cmd->opts[i].required) {
            cli_opt_label(&cmd->opts[i], label, sizeof(label));
            fprintf(f, " %s", label);
        }
    }
    fprintf(f, " [options]\n\n");
    if (cmd->summary != NULL)
        fprintf(f, "%s\n\n", cmd->summary);
    if (cmd->about != NULL)
        fprintf(f, "%s\n\n", cmd->about);
    fprintf(f, "Options:\n");
    for (i = 0; i < cmd->nopts; i++)
        cli_usage_row(&cmd->opts[i], f);
    fprintf(f, "  -h, --help%*sshow this help and exit\n", CLI_HELP_COL - 12, "");
    if (cmd->conn_opts != NULL) {
        fprintf(f, "\nNATS connection options (docs/SECURITY.md):\n");
        for (i = 0; i < cmd->nconn; i++)
            cli_usage_row(&cmd->conn_opts[i], f);
    }
    if (cmd->epilog != NULL)
        fprintf(f, "\n%s\n", cmd->epilog);
}

int
cli_usage_error(const cli_cmd *cmd, const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fprintf(stderr, "streamwire %s: ", cmd->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'streamwire %s --help' for usage.\n", cmd->name);
    return CLI_EXIT_USAGE;
}

static int
cli_set(const cli_cmd *cmd, const cli_opt *o, const char *v)
{
    switch (o->kind) {
    case CLI_FLAG:
        *(int *)o->out = 1;
        return 0;
    case CLI_STRING:
        *(const char **)o->out = v;
        return 0;
    case CLI_CHOICE:
        if (!cli_choice_ok(o->choices, v)) {
            cli_usage_error(cmd, "--%s: '%s' is not one of %s", o->name, v, o->choices);
            return -1;
        }
        *(const char **)o->out = v;
        return 0;
    case CLI_INT: {
        char *end = NULL;
        long x;

        errno = 0;
        x = strtol(v, &end, 10);
        if (v[0] == '\0' || end == NULL || *end != '\0') {
            cli_usage_error(cmd, "--%s: '%s' is not an integer", o->name, v);
            return -1;
        }
        if (errno == ERANGE || x < o->min || x > o->max) {
            cli_usage_error(cmd, "--%s: %s is out of range (%ld..%ld)", o->name, v, o->min, o->max);
            return -1;
        }
        *(long *)o->out = x;
        return 0;
    }
    }
    return -1;
}

int
cli_parse(const cli_cmd *cmd, int argc, char **argv)
{
    unsigned char seen[64] = {0};
    size_t i;
    int a;

    for (a = 1; a < argc; a++) {
        const char *arg = argv[a];
        const char *name, *eq, *value = NULL;
        const cli_opt *o;
        size_t nlen;

        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            cli_usage(cmd, stdout);
            return CLI_PARSE_HELP;
        }
        if (strcmp(arg, "--") == 0) {
            if (a + 1 < argc) {
                cli_usage_error(cmd, "unexpected argument '%s'", argv[a + 1]);
                return CLI_PARSE_ERROR;
            }
            break;
        }
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (arg[0] == '-' && arg[1] != '\0')
                cli_usage_error(cmd, "unknown option '%s' (options are long: --name)", arg);
            else
                cli_usage_error(cmd, "unexpected argument '%s'", arg);
            return CLI_PARSE_ERROR;
        }
        name = arg + 2;
        eq = strchr(name, '=');
        nlen = eq != NULL ? (size_t)(eq - name) : strlen(name);
        o = cli_find(cmd, name, nlen);
        if (o == NULL) {
            cli_usage_error(cmd, "unknown option '--%.*s'", (int)nlen, name);
            return CLI_PARSE_ERROR;
        }
        if (o->kind == CLI_FLAG) {
            if (eq != NULL) {
                cli_usage_error(cmd, "option '--%s' takes no value", o->name);
                return CLI_PARSE_ERROR;
            }
        } else if (eq != NULL) {
            value = eq + 1;
        } else if (a + 1 < argc) {
            value = argv[++a];
        } else {
            cli_usage_error(cmd, "option '--%s' needs a value (%s)", o->name,
                            o->metavar != NULL ? o->metavar : o->choices);
            return CLI_PARSE_ERROR;
        }
        if (cli_set(cmd, o, value) != 0)
            return CLI_PARSE_ERROR;
        if (o >= cmd->opts && o < cmd->opts + cmd->nopts && (size_t)(o - cmd->opts) < sizeof(seen))
            seen[o - cmd->opts] = 1;
    }
    for (i = 0; i < cmd->nopts && i < sizeof(seen); i++) {
        if (cmd->opts[i].required && !seen[i]) {
            cli_usage_error(cmd, "missing required option --%s", cmd->opts[i].name);
            return CLI_PARSE_ERROR;
        }
    }
    return CLI_PARSE_OK;
}

/* 1 if a --server value names no server: empty, blanks and commas only. */
static int
cli_blank_urls(const char *s)
{
    for (; *s != '\0'; s++)
        if (!isspace((unsigned char)*s) && *s != ',')
            return 0;
    return 1;
}

int
cli_check_names(const cli_cmd *cmd, const char *server, const char *endpoint, int endpoint_required,
                const char *instance)
{
    if (server != NULL && cli_blank_urls(server))
        return cli_usage_error(cmd, "--server: empty URL");
    if ((endpoint != NULL || endpoint_required) && sw_validate_endpoint(endpoint) != SW_OK)
        return cli_usage_error(cmd,
                               "--endpoint: '%s' is not NS.COMPONENT.ENDPOINT (three tokens of "
                               "[A-Za-z0-9_-], 1..64 chars each)",
                               endpoint ? endpoint : "");
    if (instance != NULL && sw_validate_token(instance) != SW_OK)
        return cli_usage_error(cmd, "--instance-id: '%s' is not 1..64 chars of [A-Za-z0-9_-]",
                               instance);
    return CLI_EXIT_OK;
}
