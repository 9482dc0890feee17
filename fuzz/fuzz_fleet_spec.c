/*
 * libFuzzer target: what users and agents send the fleet server, from
 * arbitrary bytes.  The bytes are parsed under the API's JSON limits and
 * given both to the job specification compiler (POST /v1/jobs) and to
 * the scheduler as a node registration (POST /v1/agent/join); an accepted
 * job is then placed on the node.  A refusal must say why; any crash,
 * leak or sanitizer report is a finding.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/fleet.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_json_limits lim = {
        .max_bytes = 1 << 20, .max_depth = 32, .max_string = 1 << 20, .max_elements = 10000};
    json_t *v = NULL;
    px_err err;
    if (px_json_parse((const char *)data, size, "fuzz.json", &lim, &v, &err) != PX_OK)
        return 0;
    px_fleet_request *r = NULL;
    err.msg[0] = '\0';
    if (px_fleet_request_compile(v, &r, &err) != PX_OK) {
        if (r || !err.msg[0])
            abort(); /* a refusal hands out nothing and says why */
    }
    px_fleet_sched *s = NULL;
    if (px_fleet_sched_new(&s, &err) != PX_OK)
        abort();
    size_t index;
    err.msg[0] = '\0';
    bool node = px_fleet_sched_add_node(s, v, &index, &err) == PX_OK;
    if (!node && !err.msg[0])
        abort();
    if (r) {
        px_fleet_explanation *e = NULL;
        if (px_fleet_sched_place(s, r, "j-fuzz", &e, &err) == PX_OK) {
            if (px_fleet_explanation_placed(e) && !node)
                abort(); /* nothing to place on */
            json_t *why = px_fleet_explanation_to_json(e, s);
            json_decref(why);
            px_fleet_explanation_free(e);
        }
        px_fleet_sched_release(s, "j-fuzz");
    }
    px_fleet_request_free(r);
    px_fleet_sched_free(s);
    json_decref(v);
    return 0;
}
