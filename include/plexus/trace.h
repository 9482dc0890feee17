/*
 * plexus/trace.h: the trace of a run, and deterministic replay.
 *
 * A trace (`plexus.trace/1`, docs/formats/trace.md) is a JSON Lines file: a
 * header line, then one event per line.  Events are inputs (inventory,
 * model, contract, objective, seeds), decisions (plans, mitigations), each
 * with a stable id derived from its inputs, observations (timings and
 * telemetry, marked nondeterministic), faults and outcomes.  Every line
 * carries a hash chain over the lines before it, so an edited, dropped or
 * reordered line is detected.
 *
 * Replay reads the trace back and hands each decision to a deriver
 * registered under the decision's name.  The deriver recomputes the
 * decision from the recorded inputs and observations; replay compares the
 * result with what was recorded and reports "identical" or the first
 * divergence.
 *
 *     px_trace_writer *w;
 *     px_trace_writer_open("run.trace", "plan", &w, &err);
 *     px_trace_input(w, "inventory", inventory_json, &err);
 *     char id[PX_TRACE_ID_LEN];
 *     px_trace_decision(w, "plan", inputs_json, plan_json, id, &err);
 *     px_trace_writer_close(w, &err);
 *
 *     px_trace_replay_report rep;
 *     px_trace_replay("run.trace", derivers, n_derivers, ctx, &rep, &err);
 *
 * Traces are untrusted input: the reader bounds line length, event count
 * and JSON nesting, and refuses anything malformed with the line number.
 * A writer is not thread-safe; callers serialize access.
 */
#ifndef PLEXUS_TRACE_H
#define PLEXUS_TRACE_H

#include "plexus/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PX_TRACE_SCHEMA "plexus.trace/1"
/* Length of an id or chain hash buffer: 64 hex digits and a NUL. */
#define PX_TRACE_ID_LEN 65

typedef enum px_trace_kind {
    PX_TRACE_INPUT = 0,
    PX_TRACE_DECISION,
    PX_TRACE_OBSERVATION,
    PX_TRACE_FAULT,
    PX_TRACE_MITIGATION,
    PX_TRACE_OUTCOME,
    PX_TRACE_KIND_COUNT_
} px_trace_kind;

const char *px_trace_kind_name(px_trace_kind kind);

/* ---- writing ---- */

typedef struct px_trace_writer px_trace_writer;

/* Creates (truncates) path and writes the header naming the command that
 * produced the trace.  Returns an owned writer (px_trace_writer_close). */
PX_NODISCARD px_status px_trace_writer_open(const char *path, const char *command,
                                            px_trace_writer **out, px_err *err);
/* Flushes, fsyncs and closes; frees w even on failure.  NULL is a no-op. */
PX_NODISCARD px_status px_trace_writer_close(px_trace_writer *w, px_err *err);

/* Records an input under a name ("inventory", "model", "seed").  data is
 * borrowed.  The input's content hash is recorded with it; id_out (may be
 * NULL) receives that hash. */
PX_NODISCARD px_status px_trace_input(px_trace_writer *w, const char *name, const json_t *data,
                                      char id_out[PX_TRACE_ID_LEN], px_err *err);
/* Records a decision: `inputs` names what it was derived from (borrowed),
 * `output` is the decision (borrowed).  Its id is the SHA-256 of the name
 * and the canonical inputs, so the same inputs give the same id on every
 * machine; id_out (may be NULL) receives it. */
PX_NODISCARD px_status px_trace_decision(px_trace_writer *w, const char *name, const json_t *inputs,
                                         const json_t *output, char id_out[PX_TRACE_ID_LEN],
                                         px_err *err);
/* Records a mitigation decision: like a decision, kept apart by kind. */
PX_NODISCARD px_status px_trace_mitigation(px_trace_writer *w, const char *name,
                                           const json_t *inputs, const json_t *output,
                                           char id_out[PX_TRACE_ID_LEN], px_err *err);
/* Records an observation (timings, telemetry).  Observations are marked
 * nondeterministic: replay feeds them back instead of recomputing them. */
PX_NODISCARD px_status px_trace_observation(px_trace_writer *w, const char *name,
                                            const json_t *data, px_err *err);
/* Records an injected or detected fault, and an outcome. */
PX_NODISCARD px_status px_trace_fault(px_trace_writer *w, const char *name, const json_t *data,
                                      px_err *err);
PX_NODISCARD px_status px_trace_outcome(px_trace_writer *w, const char *name, const json_t *data,
                                        px_err *err);
/* Number of events written so far. */
uint64_t px_trace_writer_count(const px_trace_writer *w);

/* ---- reading ---- */

typedef struct px_trace_event {
    uint64_t seq;
    px_trace_kind kind;
    const char *name;
    char id[PX_TRACE_ID_LEN]; /* decisions, mitigations, inputs; "" otherwise */
    const json_t *inputs;     /* decisions and mitigations; else NULL */
    const json_t *data;       /* the payload (decision output for decisions) */
} px_trace_event;

typedef struct px_trace_limits {
    size_t max_line;   /* bytes per line; default 16 MiB */
    size_t max_events; /* default 10,000,000 */
    size_t max_file;   /* default 4 GiB */
} px_trace_limits;

typedef struct px_trace_reader px_trace_reader;

/* Opens a trace and checks its header.  lim may be NULL for the defaults.
 * Returns an owned reader (px_trace_reader_free). */
PX_NODISCARD px_status px_trace_reader_open(const char *path, const px_trace_limits *lim,
                                            px_trace_reader **out, px_err *err);
/* Opens a trace held in memory (borrowed; must outlive the reader). */
PX_NODISCARD px_status px_trace_reader_open_memory(const char *data, size_t len, const char *name,
                                                   const px_trace_limits *lim,
                                                   px_trace_reader **out, px_err *err);
void px_trace_reader_free(px_trace_reader *r); /* NULL is a no-op */
/* The header's command and tool version (borrowed from the reader). */
const char *px_trace_reader_command(const px_trace_reader *r);
const char *px_trace_reader_tool(const px_trace_reader *r);
/* Reads the next event into ev, valid until the next call.  Returns PX_OK
 * with *done = false for an event, PX_OK with *done = true at the end, or
 * an error naming the line (malformed JSON, a broken hash chain, a bad
 * sequence number, an unknown kind, a line over the limit). */
PX_NODISCARD px_status px_trace_next(px_trace_reader *r, px_trace_event *ev, bool *done,
                                     px_err *err);

/* ---- replay ---- */

/* Recomputes a decision from its recorded inputs.  `recorded` is the
 * recorded event (its inputs and output); `history` is every input and
 * observation read so far, as a JSON object of name -> latest data.  The
 * deriver returns the recomputed output in *out (a new reference). */
typedef px_status (*px_trace_derive_fn)(void *ctx, const px_trace_event *recorded,
                                        const json_t *history, json_t **out, px_err *err);

typedef struct px_trace_deriver {
    const char *name; /* decision name it handles */
    px_trace_derive_fn derive;
} px_trace_deriver;

typedef struct px_trace_replay_report {
    uint64_t n_events;
    uint64_t n_decisions; /* decisions and mitigations recomputed */
    uint64_t n_identical;
    uint64_t n_unreplayed; /* decisions with no deriver registered */
    bool diverged;
    uint64_t divergence_seq; /* first divergent event */
    char divergence[512];    /* what differed */
} px_trace_replay_report;

/* Replays the trace at path.  Returns PX_OK when every decision with a
 * deriver came out identical, PX_EDIVERGED at the first that did not (the
 * report says where and how), or a reading error for a malformed or
 * tampered trace. */
PX_NODISCARD px_status px_trace_replay(const char *path, const px_trace_deriver *derivers,
                                       size_t n_derivers, void *ctx, px_trace_replay_report *report,
                                       px_err *err);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_TRACE_H */
