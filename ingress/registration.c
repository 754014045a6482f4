/* ingress/registration.c -- sw_ingress_registration: the description of a
 * running ingress that sw_registry_register takes (the registry itself knows
 * nothing of sw_ingress). No locks, no threads: it only reads the ingress's
 * immutable public getters. */
#include <stddef.h>

#include <streamwire/registry.h>

sw_err
sw_ingress_registration(const sw_ingress *ing, sw_registration *out)
{
    if (ing == NULL || out == NULL)
        return SW_EINVAL;
    out->instance_id = sw_ingress_instance_id(ing);
    out->endpoint = sw_ingress_endpoint(ing);
    out->request_subject = sw_ingress_request_subject(ing);
    out->control_subject = sw_ingress_control_subject(ing);
    return SW_OK;
}
