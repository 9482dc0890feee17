/*
 * libFuzzer target: the "running" list of an agent's registration or
 * heartbeat, as a replica that does not schedule reads it before asking
 * the database which of that work the node must stop.  From arbitrary
 * bytes, parsed under the API's JSON limits: the list handed to the
 * database is a JSON array of at most PX__RUNNING_MAX objects, each with
 * exactly a job id of 1 to 63 bytes and an attempt and a rank in
 * 0..1000000, whatever came in.  Any crash, leak or sanitizer report is
 * a finding.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_entry(const json_t *e)
{
    const char *id = json_string_value(json_object_get(e, "job"));
    const json_t *att = json_object_get(e, "attempt"), *rank = json_object_get(e, "rank");
    if (!json_is_object(e) || json_object_size(e) != 3 || !id || !id[0] || strlen(id) > 63 ||
        !json_is_integer(att) || !json_is_integer(rank) || json_integer_value(att) < 0 ||
        json_integer_value(att) > 1000000 || json_integer_value(rank) < 0 ||
        json_integer_value(rank) > 1000000)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_json_limits lim = {
        .max_bytes = 1 << 20, .max_depth = 32, .max_string = 1 << 20, .max_elements = 10000};
    json_t *v = NULL;
    px_err err;
    if (px_json_parse((const char *)data, size, "fuzz.json", &lim, &v, &err) != PX_OK)
        return 0;
    char *text = px__standby_running_text(v);
    json_t *out = text ? json_loads(text, 0, NULL) : NULL;
    if (text && (!json_is_array(out) || json_array_size(out) > PX__RUNNING_MAX))
        abort();
    for (size_t i = 0; i < json_array_size(out); i++)
        check_entry(json_array_get(out, i));
    json_decref(out);
    free(text);
    json_decref(v);
    return 0;
}
