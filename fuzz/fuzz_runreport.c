/* Fuzz target: run reports as `plexus calibrate --from-run` reads them
 * (`plexus run -o json`, or a serving run's `plexus serve --run-report`)
 * on arbitrary bytes; what it accepts must be bounded and usable: each
 * run's stages within the limit, its rows and context finite. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "plexus/base.h"
#include "plexus/cost.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *doc;
    if (px_json_parse((const char *)data, size, "fuzz", NULL, &doc, NULL) != PX_OK)
        return 0;
    px_cost_run *runs;
    size_t n;
    if (px_cost_runs_parse(doc, "fuzz", &runs, &n, NULL) == PX_OK) {
        if (n > PX_COST_MAX_RUNS)
            abort();
        for (size_t i = 0; i < n; i++) {
            const px_cost_run *r = &runs[i];
            if (r->n_stages == 0 || r->n_stages > PX_COST_MAX_STAGES || r->n_prompts == 0 ||
                !isfinite(r->context) || r->context < 0)
                abort();
        }
        free(runs);
    }
    json_decref(doc);
    return 0;
}
