/* Fuzz target: the --inject parser must refuse any input cleanly, every
 * refusal must quote the spec, and whatever it accepts must survive the
 * round trip through its canonical text. */
#include "base/common.h"

#include "plexus/heal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char spec[512];
    size_t n = size < sizeof spec - 1 ? size : sizeof spec - 1;
    memcpy(spec, data, n);
    spec[n] = 0;
    px_heal_inject a;
    px_err err;
    px_err_clear(&err);
    if (px_heal_inject_parse(spec, &a, &err) != PX_OK) {
        if (!strstr(err.msg, "--inject"))
            __builtin_trap();
        return 0;
    }
    char canon[512];
    if (px_heal_inject_format(&a, canon, sizeof canon) >= sizeof canon)
        __builtin_trap();
    px_heal_inject b;
    if (px_heal_inject_parse(canon, &b, &err) != PX_OK)
        __builtin_trap();
    if (memcmp(&a.fault, &b.fault, sizeof a.fault) || strcmp(a.target, b.target) ||
        strcmp(a.link_to, b.link_to) || a.at_token != b.at_token)
        __builtin_trap();
    json_t *j = px_heal_inject_to_json(&a);
    json_decref(j);

    /* Resolution against a small pipeline never fails loudly. */
    px_rt_pipeline_spec pipe;
    memset(&pipe, 0, sizeof pipe);
    pipe.n_stages = 2;
    px_strlcpy(pipe.stages[0].device, "local.cpu0", sizeof pipe.stages[0].device);
    px_strlcpy(pipe.stages[1].device, "local.emu-a", sizeof pipe.stages[1].device);
    px_rt_fault f;
    px_status st = px_heal_inject_resolve(&a, &pipe, &f, &err);
    if (st == PX_OK && f.stage >= pipe.n_stages)
        __builtin_trap();
    return 0;
}
