/* What a deployment's front end sends the fleet server: its serving
 * figures and its incidents, over the API (POST
 * /v1/deployments/NAME/observations and /incidents). */
#include "base/common.h"

#include "plexus/fleet.h"

static px_status report(px_fleet_client *c, const char *deployment, const char *what,
                        const json_t *record, int64_t *seq, px_err *err)
{
    if (!deployment || !*deployment || !record)
        return px_err_set(err, PX_EINVAL,
                          "deployment report: a deployment name and a record "
                          "are needed");
    char *name = px_fleet_url_escape(deployment);
    if (!name)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_strbuf path = PX_STRBUF_INIT;
    px_status st = px_strbuf_addf(&path, "/v1/deployments/%s/%s", name, what);
    free(name);
    json_t *reply = NULL;
    if (st == PX_OK)
        st = px_fleet_client_call(c, "POST", path.buf, record, NULL, &reply, err);
    else
        px_err_set(err, PX_ENOMEM, "out of memory");
    if (st == PX_OK && seq)
        *seq = json_integer_value(json_object_get(reply, "seq"));
    json_decref(reply);
    px_strbuf_release(&path);
    return st;
}

px_status px_fleet_report_observation(px_fleet_client *c, const char *deployment,
                                      const json_t *observation, int64_t *seq, px_err *err)
{
    return report(c, deployment, "observations", observation, seq, err);
}

px_status px_fleet_report_incident(px_fleet_client *c, const char *deployment,
                                   const json_t *incident, int64_t *seq, px_err *err)
{
    return report(c, deployment, "incidents", incident, seq, err);
}
