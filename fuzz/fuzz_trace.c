/* Fuzz target: the trace reader on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "plexus/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_trace_limits lim = {.max_line = 1 << 16, .max_events = 10000};
    px_trace_reader *r;
    if (px_trace_reader_open_memory((const char *)data, size, "fuzz", &lim, &r, NULL) != PX_OK)
        return 0;
    px_trace_event ev;
    bool done = false;
    while (!done && px_trace_next(r, &ev, &done, NULL) == PX_OK)
        ;
    px_trace_reader_free(r);
    return 0;
}
