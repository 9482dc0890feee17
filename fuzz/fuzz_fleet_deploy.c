/*
 * libFuzzer target: deployment requests (POST /v1/deployments) from
 * arbitrary bytes, parsed under the API's JSON limits and checked as the
 * server checks them.  A refusal must hand out nothing and say why; an
 * accepted request's normalized spec must check again to itself.  Any
 * crash, leak or sanitizer report is a finding.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_json_limits lim = {
        .max_bytes = 1 << 20, .max_depth = 32, .max_string = 1 << 20, .max_elements = 10000};
    json_t *v = NULL;
    px_err err;
    if (px_json_parse((const char *)data, size, "fuzz.json", &lim, &v, &err) != PX_OK)
        return 0;
    err.msg[0] = '\0';
    json_t *spec = json_is_object(v) ? px__deploy_request_check(v, &err) : NULL;
    if (json_is_object(v) && !spec && !err.msg[0])
        abort(); /* a refusal says why */
    if (spec) {
        if (!px__deploy_name_valid(json_string_value(json_object_get(spec, "name"))))
            abort();
        json_t *again = px__deploy_request_check(spec, &err);
        if (!again || !json_equal(again, spec))
            abort(); /* the normalized form is a fixed point */
        json_decref(again);
    }
    json_decref(spec);
    json_decref(v);
    return 0;
}
