/* Private declarations shared by the trace writer, reader and replay. */
#ifndef PX_TRACE_IMPL_H
#define PX_TRACE_IMPL_H

#include "base/common.h"
#include "plexus/trace.h"

/* The chain hash of a line: SHA-256 over the previous chain (hex) and the
 * line's canonical text without its "chain" member. */
px_status px__trace_chain(const char prev[PX_TRACE_ID_LEN], const char *line, size_t len,
                          char out[PX_TRACE_ID_LEN]);
/* The id of a decision: SHA-256 over its name and canonical inputs. */
px_status px__trace_decision_id(const char *name, const json_t *inputs, char out[PX_TRACE_ID_LEN]);
/* Parses a kind name; returns PX_TRACE_KIND_COUNT_ when unknown. */
px_trace_kind px__trace_kind_parse(const char *name);

#endif
