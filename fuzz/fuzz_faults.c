/* Fuzz target: the faults file reader (plexus.faults/1) must refuse any
 * input cleanly, and whatever it accepts must survive a round trip. */
#include "base/common.h"

#include "plexus/sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_sim_faults f;
    px_err err;
    if (px_sim_faults_parse((const char *)data, size, "fuzz.json", &f, &err) != PX_OK)
        return 0;
    json_t *doc = px_sim_faults_to_json(&f);
    char *text = doc ? px_json_dump_line(doc) : NULL;
    if (text) {
        px_sim_faults g;
        if (px_sim_faults_parse(text, strlen(text), "round-trip.json", &g, &err) != PX_OK ||
            g.n != f.n)
            __builtin_trap();
        px_sim_faults_release(&g);
    }
    free(text);
    json_decref(doc);
    px_sim_faults_release(&f);
    return 0;
}
