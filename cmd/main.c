/* cmd/main.c -- the streamwire CLI: subcommand dispatch. */
#include <string.h>

#include "cli.h"

typedef struct cli_sub {
    const char *name;
    const char *summary;
    int (*main)(int argc, char **argv);
} cli_sub;

static const cli_sub cli_subs[] = {
    {"demo", "run a live demo: a nats-server, workers, and one stream per terminal kind",
     cli_demo_main},
    {"worker", "serve an endpoint with the demo engine (and optional fault injection)",
     cli_worker_main},
    {"generate", "send one request and print its response stream and terminal", cli_generate_main},
    {"instances", "list the instances in the discovery registry", cli_instances_main},
    {"gateway", "HTTP front door: OpenAI Responses API with server-sent events", cli_gateway_main},
    {"keygen", "write a new cluster key for sealing (mode 0600)", cli_keygen_main},
};

static void
cli_main_usage(FILE *f)
{
    size_t i;

    fprintf(f, "Usage: streamwire COMMAND [options]\n"
               "       streamwire COMMAND --help\n"
               "       streamwire --version\n\n"
               "Response streams between frontends and workers over NATS, with exactly one\n"
               "typed terminal per stream.\n\n"
               "Commands:\n");
    for (i = 0; i < sizeof(cli_subs) / sizeof(cli_subs[0]); i++)
        fprintf(f, "  %-10s %s\n", cli_subs[i].name, cli_subs[i].summary);
    fprintf(f, "  %-10s %s\n", "help", "show this help, or `help COMMAND` for a command's");
    fprintf(f, "\nOptions:\n"
               "  -h, --help     show this help and exit\n"
               "  --version      print the version and exit\n\n"
               "Start here: streamwire demo (or scripts/demo from a source tree).\n");
}

static const cli_sub *
cli_find_sub(const char *name)
{
    size_t i;

    for (i = 0; i < sizeof(cli_subs) / sizeof(cli_subs[0]); i++) {
        if (strcmp(cli_subs[i].name, name) == 0)
            return &cli_subs[i];
    }
    return NULL;
}

int
main(int argc, char **argv)
{
    const cli_sub *sub;
    const char *cmd;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        cli_main_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        if (strcmp(cmd, "help") == 0 && argc > 2) {
            char help[] = "--help";
            char *hargv[3];

            sub = cli_find_sub(argv[2]);
            if (sub == NULL) {
                fprintf(stderr,
                        "streamwire: unknown command '%s'\n"
                        "Try 'streamwire --help' for the list of commands.\n",
                        argv[2]);
                return CLI_EXIT_USAGE;
            }
            hargv[0] = argv[2];
            hargv[1] = help;
            hargv[2] = NULL;
            return sub->main(2, hargv);
        }
        cli_main_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("streamwire %s (protocol %d)\n", sw_version(), SW_PROTOCOL_VERSION);
        return CLI_EXIT_OK;
    }
    sub = cli_find_sub(cmd);
    if (sub == NULL) {
        fprintf(stderr,
                "streamwire: unknown %s '%s'\n"
                "Try 'streamwire --help' for the list of commands.\n",
                cmd[0] == '-' ? "option" : "command", cmd);
        return CLI_EXIT_USAGE;
    }
    return sub->main(argc - 1, argv + 1);
}
