/* Fuzz target: the scenario pack reader (plexus.pack/1) must refuse any
 * input cleanly, and whatever it accepts must hold sane scenarios. */
#include "base/common.h"

#include "plexus/sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_sim_pack pack;
    px_err err;
    if (px_sim_pack_parse((const char *)data, size, "fuzz/pack.json", &pack, &err) != PX_OK)
        return 0;
    if (pack.n_scenarios == 0 || pack.n_scenarios > PX_SIM_PACK_MAX_SCENARIOS)
        __builtin_trap();
    for (size_t i = 0; i < pack.n_scenarios; i++) {
        const px_sim_scenario *s = &pack.scenarios[i];
        if (!s->name || !s->inventory || !s->model || !s->objective ||
            s->prompt_tokens > s->context)
            __builtin_trap();
    }
    px_sim_pack_release(&pack);
    return 0;
}
