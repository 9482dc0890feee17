/* Fuzz target: what a stage worker reads from the wire must be refused
 * cleanly when malformed: frame headers, and FAULT payloads (a fault a
 * worker would apply to itself).  Whatever a FAULT payload parse accepts
 * must be a fault a worker can apply: a known kind, a finite factor of at
 * least 1, a link probability within [0, 1]. */
#include "base/common.h"

#include <math.h>

#include "rt/pipeline_impl.h"
#include "rt/worker_fault.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_err err;
    if (size >= PX_RT_FRAME_HEADER_BYTES) {
        px_rt_frame_header h;
        if (px_rt_frame_header_decode(data, PX_RT_FRAME_MAX_PAYLOAD, "fuzz", &h, &err) == PX_OK &&
            (h.length > PX_RT_FRAME_MAX_PAYLOAD || h.magic != PX_RT_FRAME_MAGIC))
            __builtin_trap();
    }
    px_rt_fault f;
    if (size > UINT32_MAX || px__rt_wfault_parse(data, (uint32_t)size, "fuzz", &f, &err) != PX_OK)
        return 0;
    if ((unsigned)f.kind >= PX_RT_FAULT_KIND_COUNT_ || f.kind == PX_RT_FAULT_KILL ||
        f.kind == PX_RT_FAULT_STOP)
        __builtin_trap();
    if (f.kind == PX_RT_FAULT_SLOW && !(isfinite(f.factor) && f.factor >= 1))
        __builtin_trap();
    if (f.kind == PX_RT_FAULT_LINK &&
        !(f.link.loss >= 0 && f.link.loss <= 1 && f.link.flip >= 0 && f.link.flip <= 1))
        __builtin_trap();
    return 0;
}
