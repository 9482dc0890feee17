/* Fuzz target: quantity text.  Whatever px_qty_parse accepts must format
 * and parse back to exactly the same value and dimension. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char text[128];
    if (size >= sizeof text)
        size = sizeof text - 1;
    memcpy(text, data, size);
    text[size] = '\0';
    px_qty q;
    if (px_qty_parse(text, PX_DIM_NONE, &q, NULL) != PX_OK)
        return 0;
    char out[128];
    size_t n = px_qty_format(q.value, q.dim, out, sizeof out);
    if (n >= sizeof out)
        abort();
    px_qty back;
    px_err err;
    if (px_qty_parse(out, q.dim, &back, &err) != PX_OK)
        abort(); /* the printed form must parse */
    if (back.value != q.value || back.dim != q.dim)
        abort(); /* and give the same value exactly */
    /* The JSON form round-trips too. */
    json_t *j = px_qty_to_json(&q);
    if (!j)
        return 0;
    px_qty again;
    if (px_qty_from_json(j, q.dim, NULL, "fuzz", &again, NULL) != PX_OK || again.value != q.value)
        abort();
    json_decref(j);
    return 0;
}
