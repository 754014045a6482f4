/* router/registry_report.c -- dead reports: a tombstone written over an
 * entry, guarded by the revision the reporter saw, refused when the entry
 * was refreshed while the reporter heard nothing (and then written should
 * the entry go a whole lease without a refresh). Locks: registry.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/registry_int.h"

/* A refused report, kept for when the entry's lease lapses in this view
 * (a watch that lagged behind the store shows a dead worker's last refresh
 * late: the report is refused, and the entry would stay in the store for
 * every router that starts later). */
void
swr_reg_report_later(sw_registry *reg, const char *instance_id, const char *reason)
{
    reg_view *v;
    pthread_mutex_lock(&reg->mu);
    if ((v = swr_reg_view_find_instance(reg, instance_id)) != NULL && !v->info->dead) {
        v->report_pending = 1;
        snprintf(v->report_reason, sizeof(v->report_reason), "%s",
                 reason ? reason : "reported dead");
    }
    pthread_mutex_unlock(&reg->mu);
}

/* Counts a report's outcome: written, or refused (newer entry or gone). */
static sw_err
report_counted(sw_registry *reg, sw_err rv)
{
    if (rv == SW_OK || rv == SW_EBUSY || rv == SW_ENOTFOUND)
        swr_reg_count(reg,
                      rv == SW_OK ? &reg->st.dead_reports_sent : &reg->st.dead_reports_refused);
    return rv;
}

/* Writes the tombstone of instance_id, guarded by `revision` (0: the
 * view's), refused with SW_EBUSY if silent_ms >= 0 and this handle saw the
 * entry refreshed within the last silent_ms; SW_OK, nothing written or
 * counted, if the view holds its tombstone already. The outcome is counted
 * in the handle's stats. */
sw_err
swr_reg_report(sw_registry *reg, const char *instance_id, uint64_t revision, int64_t silent_ms,
               const char *reason)
{
    reg_view *v;
    swp_instance *tomb;
    char key[REG_KEY_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t rev;
    sw_err rv;

    if (reg == NULL || sw_validate_token(instance_id) != SW_OK)
        return SW_EINVAL;
    pthread_mutex_lock(&reg->mu);
    v = swr_reg_view_find_instance(reg, instance_id);
    if (v == NULL) {
        pthread_mutex_unlock(&reg->mu);
        return report_counted(reg, SW_ENOTFOUND);
    }
    if (v->info->dead) {
        pthread_mutex_unlock(&reg->mu);
        return SW_OK; /* reported already: not a tombstone this handle wrote */
    }
    if (silent_ms >= 0 && swi_now_ms() - v->seen_ms < silent_ms) {
        /* Refreshed while the reporter heard nothing: its keep-alive runs,
         * so the reporter's evidence is not death (its own connection, or
         * the path to the worker, may be what failed). Should the entry
         * go a whole lease without a refresh here, it is reported then. */
        pthread_mutex_unlock(&reg->mu);
        swr_reg_report_later(reg, instance_id, reason);
        return report_counted(reg, SW_EBUSY);
    }
    rev = revision ? revision : v->rev;
    snprintf(key, sizeof(key), "%s", v->key);
    tomb = swr_reg_info_copy(v->info);
    pthread_mutex_unlock(&reg->mu);
    if (tomb == NULL)
        return SW_ENOMEM;
    {
        /* A shallow copy: the decoded message keeps owning its fields. */
        swp_instance t = *tomb;
        t.dead = 1;
        t.dead_reason = (char *)(reason ? reason : "reported dead");
        t.reported_by = reg->host;
        rv = swp_encode_alloc(&t, REG_MAX_VALUE, &buf, &len);
        if (rv == SW_OK)
            rv = swr_reg_seal(reg, key, &buf, &len); /* only a key holder's tombstone opens */
    }
    swp_free(tomb);
    if (rv != SW_OK)
        return rv;
    rv = reg->be->put(reg->bs, key, buf, len, rev, NULL);
    free(buf);
    if (rv == SW_OK)
        swi_log(&reg->log, SW_LOG_INFO, "registry: reported %s dead (%s)", instance_id,
                reason ? reason : "reported dead");
    else if (rv == SW_EBUSY)
        swr_reg_report_later(reg, instance_id, reason); /* our view was behind the store */
    return report_counted(reg, rv);
}

sw_err
sw_registry_report_dead(sw_registry *reg, const char *instance_id, uint64_t revision,
                        const char *reason)
{
    return swr_reg_report(reg, instance_id, revision, -1, reason);
}

sw_err
sw_registry_report_silent(sw_registry *reg, const char *instance_id, sw_duration silent_ms,
                          const char *reason)
{
    if (silent_ms < 0)
        return SW_EINVAL;
    return swr_reg_report(reg, instance_id, 0, silent_ms, reason);
}
