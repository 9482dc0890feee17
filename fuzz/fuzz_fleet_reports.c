/*
 * libFuzzer target: what a deployment's front end reports (POST
 * /v1/deployments/NAME/observations and /incidents) from arbitrary bytes,
 * parsed under the API's JSON limits and checked as the server checks
 * them.  A refusal must hand out nothing and say why; an accepted
 * observation's normalized form must check again to itself.  Any crash,
 * leak or sanitizer report is a finding.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > PX__DEPLOY_INCIDENT_MAX)
        return 0; /* the server refuses larger bodies before parsing */
    px_json_limits lim = {
        .max_bytes = 1 << 20, .max_depth = 32, .max_string = 1 << 20, .max_elements = 10000};
    json_t *v = NULL;
    px_err err;
    if (px_json_parse((const char *)data, size, "fuzz.json", &lim, &v, &err) != PX_OK)
        return 0;
    err.msg[0] = '\0';
    json_t *obs = px__deploy_observation_check(v, &err);
    if (!obs && !err.msg[0])
        abort(); /* a refusal says why */
    if (obs) {
        json_t *again = px__deploy_observation_check(obs, &err);
        if (!again || !json_equal(again, obs))
            abort(); /* the normalized form is a fixed point */
        json_decref(again);
    }
    err.msg[0] = '\0';
    json_t *inc = px__deploy_incident_check(v, &err);
    if (!inc && !err.msg[0])
        abort();
    json_decref(inc);
    json_decref(obs);
    /* The predictions read from a plan record never fail on its shape. */
    json_decref(px__deploy_predicted(v));
    json_decref(v);
    return 0;
}
