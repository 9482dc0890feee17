/* Fuzz target: the calibration overlay reader on arbitrary bytes; what it
 * accepts must write back to a document it reads to the same overlay. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/cost.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_cost_calibration *cal;
    if (px_cost_calibration_parse((const char *)data, size, "fuzz", &cal, NULL) != PX_OK)
        return 0;
    char *text = px_cost_calibration_dump(cal);
    if (text) {
        px_cost_calibration *back;
        if (px_cost_calibration_parse(text, strlen(text), "fuzz-dump", &back, NULL) != PX_OK)
            abort();
        char *again = px_cost_calibration_dump(back);
        if (!again || strcmp(text, again) != 0)
            abort();
        for (size_t i = 0; i < px_cost_calibration_count(back); i++) {
            const px_cost_correction *c = px_cost_calibration_at(back, i);
            size_t idx;
            px_cost_calibration_lookup(back, c->device, c->cls, c->dtype, c->valid_lo, &idx);
        }
        free(again);
        px_cost_calibration_free(back);
    }
    free(text);
    px_cost_calibration_free(cal);
    return 0;
}
