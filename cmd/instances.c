/* cmd/instances.c -- `streamwire instances`: the entries of the discovery
 * registry's bucket (not tombstoned or deleted), as a table or as JSON
 * lines. One look: a first sighting counts as seen now (registry.h), so a
 * listing shows every such entry, refreshed or not. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include <streamwire/registry.h>

int
cli_instances_main(int argc, char **argv)
{
    const char *server = NULL, *endpoint = NULL, *bucket = NULL;
    long lease = 0;
    int json = 0;
    const cli_opt opts[] = {
        {"server", CLI_STRING, "URL", "NATS server URL, e.g. nats://127.0.0.1:4222", &server, 0, 0,
         NULL, 1},
        {"endpoint", CLI_STRING, "NS.COMPONENT.ENDPOINT", "only instances serving this endpoint",
         &endpoint, 0, 0, NULL, 0},
        {"bucket", CLI_STRING, "NAME", "registry bucket (default streamwire_instances)", &bucket, 0,
         0, NULL, 0},
        {"lease-ms", CLI_INT, "MS",
         "the lease of an entry that announces none (workers\n"
         "announce theirs; default 3000). One look never lapses\n"
         "an entry. If this command creates the bucket, its\n"
         "max age is 20 times this, at least 60 s",
         &lease, 100, 3600000, NULL, 0},
        {"json", CLI_FLAG, NULL,
         "one JSON object per line:\n{\"instance\":\"...\",\"endpoint\":\"...\",\"age_ms\":N,...}",
         &json, 0, 0, NULL, 0},
    };
    cli_conn_flags conn_flags = {0};
    cli_opt conn_rows[CLI_CONN_NOPTS];
    const cli_cmd cmd = {
        "instances",
        "List the instances in the discovery registry (JetStream KV): every entry in\n"
        "the bucket that is not a tombstone (reported dead) or deleted (deregistered),\n"
        "draining ones included.",
        "This is one look at the bucket, not a router's watch: every entry counts as\n"
        "seen now (liveness never uses the store's timestamps), so age_ms is about 0\n"
        "and an entry is listed whether or not its worker still refreshes it. A worker\n"
        "that died without deregistering stays listed until a router that finds it\n"
        "lost reports it dead, or until its entry expires from the bucket (max age:\n"
        "20 leases of the process that created the bucket, at least 60 s; 60 s with\n"
        "the default 3000 ms lease).",
        "Exit status: 0 listed (even none); 1 registry error; 2 usage error;\n"
        "3 cannot connect to the NATS server.",
        opts,
        sizeof(opts) / sizeof(opts[0]),
        conn_rows,
        CLI_CONN_NOPTS,
    };
    sw_conn_opts copts;
    sw_registry_opts ropts;
    sw_conn *conn = NULL;
    sw_registry *reg = NULL;
    sw_instance *v = NULL;
    size_t n = 0;
    sw_err err;
    int rc;

    cli_conn_rows(&conn_flags, conn_rows);
    rc = cli_parse(&cmd, argc, argv);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if ((rc = cli_conn_check(&cmd, &conn_flags)) != CLI_EXIT_OK)
        return rc;
    if ((rc = cli_check_names(&cmd, server, endpoint, 0, NULL)) != CLI_EXIT_OK)
        return rc;

    sw_conn_opts_init(&copts);
    copts.url = server;
    copts.name = "streamwire-instances";
    cli_conn_apply(&conn_flags, &copts);
    err = sw_conn_open(&conn, &copts);
    if (err != SW_OK) {
        cli_conn_error("instances", server, &conn_flags, err);
        return CLI_EXIT_CONNECT;
    }
    sw_registry_opts_init(&ropts);
    if (bucket != NULL)
        ropts.bucket = bucket;
    ropts.lease_ms = lease;
    err = sw_registry_open(&reg, conn, &ropts);
    if (err == SW_OK)
        err = sw_registry_list(reg, endpoint, &v, &n);
    if (err != SW_OK) {
        cli_registry_error("instances", "read the registry", err, "");
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    if (!json)
        printf("%-20s %-28s %8s %-16s %7s %s\n", "INSTANCE", "ENDPOINT", "AGE_MS", "HOST", "PID",
               "STATE");
    for (size_t i = 0; i < n; i++) {
        if (json) {
            printf("{\"instance\":\"");
            cli_json_escape(stdout, v[i].instance_id, strlen(v[i].instance_id));
            printf("\",\"endpoint\":\"");
            cli_json_escape(stdout, v[i].endpoint, strlen(v[i].endpoint));
            printf("\",\"age_ms\":%lld,\"host\":\"", (long long)v[i].age_ms);
            cli_json_escape(stdout, v[i].host, strlen(v[i].host));
            printf("\",\"pid\":%u,\"revision\":%llu,\"draining\":%s,\"lease_ms\":%u,"
                   "\"subject\":\"",
                   v[i].pid, (unsigned long long)v[i].revision, v[i].draining ? "true" : "false",
                   v[i].lease_ms);
            cli_json_escape(stdout, v[i].request_subject, strlen(v[i].request_subject));
            printf("\"}\n");
        } else {
            printf("%-20s %-28s %8lld %-16s %7u %s\n", v[i].instance_id, v[i].endpoint,
                   (long long)v[i].age_ms, v[i].host, v[i].pid,
                   v[i].draining ? "draining" : "live");
        }
    }
    if (!json)
        printf("%zu live instance%s\n", n, n == 1 ? "" : "s");
    rc = CLI_EXIT_OK;
out:
    sw_instances_free(v, n);
    sw_registry_close(reg);
    sw_conn_close(conn);
    return rc;
}
