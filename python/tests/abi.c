/* python/tests/abi.c -- prints the sizes and field offsets of the C structs
 * the Python binding mirrors with ctypes (python/streamwire/_lib.py), as
 * JSON, so test_binding.py can check that both agree on this build. */
#include <stddef.h>
#include <stdio.h>

#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#define S(t) printf("%s\"%s\": {\"size\": %zu", first ? "" : ", ", #t, sizeof(t)), first = 0
#define F(t, f) printf(", \"%s\": %zu", #f, offsetof(t, f))
#define E() printf("}")

int
main(void)
{
    int first = 1;
    printf("{");
    S(sw_conn_opts);
    F(sw_conn_opts, url);
    F(sw_conn_opts, log);
    F(sw_conn_opts, creds_file);
    F(sw_conn_opts, tls_skip_verify);
    F(sw_conn_opts, seal_key_file);
    F(sw_conn_opts, seal_open_key_file);
    E();
    S(sw_ingress_opts);
    F(sw_ingress_opts, handler);
    F(sw_ingress_opts, max_window);
    F(sw_ingress_opts, log);
    F(sw_ingress_opts, max_held_finals);
    F(sw_ingress_opts, max_request_age_ms);
    F(sw_ingress_opts, handler_inline);
    E();
    S(sw_router_opts);
    F(sw_router_opts, registry);
    F(sw_router_opts, policy);
    F(sw_router_opts, quarantine_ms);
    F(sw_router_opts, log_arg);
    F(sw_router_opts, migration_limit);
    F(sw_router_opts, credit_bytes_max);
    E();
    S(sw_request_opts);
    F(sw_request_opts, max_tokens);
    F(sw_request_opts, on_item);
    F(sw_request_opts, nheaders);
    F(sw_request_opts, on_ready_arg);
    F(sw_request_opts, migration_limit);
    F(sw_request_opts, migrate_arg);
    E();
    S(sw_registry_opts);
    F(sw_registry_opts, lease_ms);
    F(sw_registry_opts, replicas);
    F(sw_registry_opts, log_arg);
    E();
    S(sw_registration);
    F(sw_registration, control_subject);
    E();
    S(sw_terminal);
    F(sw_terminal, message);
    F(sw_terminal, instances);
    E();
    S(sw_item);
    F(sw_item, seq);
    F(sw_item, len);
    F(sw_item, terminal);
    F(sw_item, instance_id);
    F(sw_item, event);
    E();
    S(sw_header);
    E();
    printf("}\n");
    return 0;
}
