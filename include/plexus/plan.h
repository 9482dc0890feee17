/*
 * plexus/plan.h: the planner.
 *
 * Given a hardware graph, a model, a numerical contract and an objective,
 * the planner returns an executable plan (`plexus.plan/1`,
 * docs/formats/plan.md): how the model is cut into pipeline stages, which
 * devices run each stage (tensor-parallel groups inside fast-link
 * islands), at what precision per region, where the KV cache lives, how
 * many replicas serve and at what batch; the predicted time per token, time
 * to first token, throughput, memory, energy and cost with their
 * uncertainty; the lower bound and the fraction of it reached; what binds;
 * the assumptions; every rejected alternative with a machine-readable
 * reason; and precomputed fallbacks for the loss of each device and the
 * degradation of each link its hops use.
 *
 * The search is hierarchical: feasibility pruning (memory, capability,
 * contract, policy constraints), lower bounds, device sequences chosen by
 * class (never all subsets of a big fleet), pipeline cuts by dynamic
 * programming over layers, tensor parallelism inside islands, precision
 * per region where the contract allows, KV placement, replicas and batch,
 * then ranking of the finalists by Monte Carlo (the probability of meeting
 * the SLO, not a point estimate).  Baseline policies (llama.cpp, exo,
 * GPUStack, one type per replica) sit in the same policy table and are
 * costed by the same model.
 *
 *     px_plan_request req;
 *     px_plan_request_default(&req);
 *     req.graph = graph;            // px_hw_graph, borrowed
 *     req.model = model;            // px_ir_model, borrowed
 *     req.contract = contract;      // px_contract or NULL (implied contract)
 *     req.objective = PX_PLAN_OBJ_LATENCY;
 *     px_plan *plan;
 *     if (px_plan_search(&req, &plan, &err) != PX_OK)
 *         fprintf(stderr, "plexus: %s\n", err.msg);
 *     char *text = px_plan_dump(plan);          // the plan document
 *     ...
 *     free(text);
 *     px_plan_free(plan);
 *
 * Plans are deterministic: the same inputs give a byte-identical document
 * and the same id.  A plan and a request are not thread-safe; distinct
 * searches may run in parallel on distinct graphs.
 */
#ifndef PLEXUS_PLAN_H
#define PLEXUS_PLAN_H

#include "plexus/base.h"
#include "plexus/contract.h"
#include "plexus/cost.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PX_PLAN_SCHEMA "plexus.plan/1"

typedef enum px_plan_objective {
    PX_PLAN_OBJ_LATENCY = 0, /* p99 time per output token */
    PX_PLAN_OBJ_TTFT,        /* p99 time to first token */
    PX_PLAN_OBJ_THROUGHPUT,  /* output tokens per second */
    PX_PLAN_OBJ_TOKENS_PER_DOLLAR,
    PX_PLAN_OBJ_JOULES_PER_TOKEN,
    PX_PLAN_OBJ_COUNT_
} px_plan_objective;

/* "latency", "ttft", "throughput", "tokens_per_dollar", "joules_per_token". */
const char *px_plan_objective_name(px_plan_objective o);
/* PX_EINVAL listing the names for anything else. */
PX_NODISCARD px_status px_plan_objective_parse(const char *text, px_plan_objective *out,
                                               px_err *err);

/* Limits a plan must meet.  0 means none. */
typedef struct px_plan_slo {
    double tpot_s;       /* time per output token */
    double ttft_s;       /* time to first token */
    double budget_usd_h; /* money per hour of all devices used */
} px_plan_slo;

/* Parses "tpot=50ms,ttft=500ms" into slo (fields not named are kept).
 * PX_EINVAL naming the bad item and the accepted keys. */
PX_NODISCARD px_status px_plan_slo_parse(const char *text, px_plan_slo *slo, px_err *err);
/* Parses a budget "10$/h" or "10 $/h".  PX_EINVAL. */
PX_NODISCARD px_status px_plan_budget_parse(const char *text, double *usd_per_hour, px_err *err);

typedef struct px_plan_request {
    const px_hw_graph *graph;    /* borrowed; required */
    const px_ir_model *model;    /* borrowed; required */
    const px_contract *contract; /* borrowed; NULL: the implied contract
                                    (stored precision, deterministic) */
    px_plan_objective objective;
    px_plan_slo slo;
    /* The workload.  batch 0 lets the planner choose (1 for latency and
     * ttft objectives); micro_batches 0 lets it choose. */
    px_cost_workload workload;
    const char *policy;     /* "plexus" (default) or a baseline's name */
    px_cost_params cost;    /* cost model parameters */
    bool compare_baselines; /* cost every baseline on the same inputs */
    bool fallbacks;         /* precompute fallbacks for the loss of one device and
                               the degradation of one link (default on) */
    uint32_t max_rejected;  /* rejected candidates kept (default 12) */
    /* Devices the plan may not use (fleet indices, borrowed; may be NULL).
     * Fallback planning uses it; so may a caller. */
    const bool *excluded;
    /* The largest tensor-parallel degree a stage may have; 0: any.  The
     * stage workers of `plexus run`, `plexus serve` and deployments run one device
     * per stage: 1. */
    uint32_t max_tp;
} px_plan_request;

/* Defaults: latency objective, planner-chosen batch, context 4096, prompt
 * 512, 256 new tokens, policy "plexus", fallbacks on. */
void px_plan_request_default(px_plan_request *req);

/* Policies: "plexus" and the baselines "llamacpp", "exo", "gpustack",
 * "single-type".  Index i < px_plan_policy_count(). */
size_t px_plan_policy_count(void);
const char *px_plan_policy_name(size_t i);
const char *px_plan_policy_summary(size_t i);
/* Whether a policy of this name exists. */
bool px_plan_policy_exists(const char *name);

typedef struct px_plan px_plan;

/* Plans.  On success *out is owned (px_plan_free).
 * Errors: PX_EINVAL (missing graph or model, bad parameters, unknown
 * policy); PX_EINFEASIBLE when no placement fits (err says why: the model
 * fits in total memory but in no feasible cut, names the largest block
 * and the devices, or the contract forbids what would be needed);
 * PX_ENOMEM. */
PX_NODISCARD px_status px_plan_search(const px_plan_request *req, px_plan **out, px_err *err);
void px_plan_free(px_plan *p); /* NULL is a no-op */

/* The plan document (`plexus.plan/1`).  New reference; NULL on
 * allocation failure. */
json_t *px_plan_to_json(const px_plan *p);
/* The document as canonical text (sorted keys, fixed float formatting),
 * byte-identical for equal inputs.  Returns owned memory (free()). */
char *px_plan_dump(const px_plan *p);
/* The plan's content id: SHA-256 of the canonical document without "id". */
const char *px_plan_id(const px_plan *p);

/* A short readable report: stages, predictions with intervals, the bound
 * fraction, what binds, top rejected alternatives and the baselines.
 * Appends to out.  PX_ENOMEM. */
PX_NODISCARD px_status px_plan_report(const px_plan *p, px_strbuf *out);
/* An SVG drawing of the stages on the devices and links.  PX_ENOMEM. */
PX_NODISCARD px_status px_plan_svg(const px_plan *p, px_strbuf *out);

/* Headline figures, for tests and benchmarks. */
typedef struct px_plan_summary {
    const char *policy;
    px_plan_objective objective;
    uint32_t n_replicas, n_stages, n_devices;
    uint32_t batch, micro_batches; /* replica 0's */
    uint32_t batch_total;          /* sequences in flight over all replicas */
    px_cost_interval tpot_s, ttft_s, throughput;
    double tpot_point_s, throughput_point; /* point estimates (no sampling) */
    double joules_per_token, usd_per_hour, tokens_per_usd;
    double bound_fraction; /* lower bound / predicted TPOT p50 */
    double p_meet_slo;
    bool emulated;
    size_t n_rejected, n_fallbacks, n_candidates;
    size_t n_link_fallbacks; /* entries of "link_fallbacks" */
} px_plan_summary;

void px_plan_get_summary(const px_plan *p, px_plan_summary *out);
/* Replica r's pipeline (borrowed from the plan), or NULL. */
const px_cost_pipeline *px_plan_pipeline(const px_plan *p, uint32_t replica);
/* Replica r's workload (its batch; borrowed from the plan), or NULL. */
const px_cost_workload *px_plan_replica_workload(const px_plan *p, uint32_t replica);
/* The fleet view the plan was made on (borrowed from the plan). */
const px_cost_fleet *px_plan_fleet(const px_plan *p);

/* The exact yardstick for small instances: every ordered sequence of
 * disjoint groups of at most max_devices devices in all (a group is one
 * device or a tensor-parallel group of any devices whose count divides the
 * heads) and every cut, at the request's workload and the stored
 * precision; the best TPOT found.  PX_ELIMIT when the fleet has more
 * than 8 devices; PX_EINFEASIBLE when nothing fits. */
PX_NODISCARD px_status px_plan_exact(const px_plan_request *req, uint32_t max_devices, double *best,
                                     px_err *err);
/* The same optimum by mixed-integer programming (GLPK): layers to devices
 * minimising the bottleneck stage time of a throughput pipeline, for
 * medium fleets (up to 64 devices).  Gives the optimal bottleneck time
 * in *best_stage_s.  PX_ELIMIT beyond 64 devices; PX_EINFEASIBLE. */
PX_NODISCARD px_status px_plan_milp(const px_plan_request *req, double *best_stage_s, px_err *err);
/* The heuristic's answer to the same question as px_plan_milp. */
PX_NODISCARD px_status px_plan_heuristic_bottleneck(const px_plan_request *req,
                                                    double *best_stage_s, px_err *err);

/* ---- traces and replay ---- */

/* What a planning run read, as recorded in its trace.  All borrowed. */
typedef struct px_plan_trace_inputs {
    const json_t *inventory;    /* the inventory document as read; required */
    const char *model_spec;     /* the preset name or model file path; required */
    const json_t *contract_doc; /* the contract file's document, or NULL */
    const char *contract_name;  /* a built-in contract's name when contract_doc
                                   is NULL; both NULL: the implied contract */
} px_plan_trace_inputs;

/* Records a planning run in a trace (w borrowed): the inputs "inventory",
 * "model" (preset name, or file path with its SHA-256, and the
 * hyper-parameters), "contract" and "request" (objective, SLO, budget,
 * policy, workload), then the decision "plan" whose output is the plan
 * document px_plan_dump writes and whose inputs name the input ids.
 * req must be the request plan was searched with.  Errors: PX_EINVAL for a
 * missing argument, PX_EIO when the model file cannot be hashed, the
 * writer's errors, PX_ENOMEM. */
PX_NODISCARD px_status px_plan_trace_record(px_trace_writer *w, const px_plan_request *req,
                                            const px_plan_trace_inputs *in, const px_plan *plan,
                                            px_err *err);
/* Re-opens the model a trace recorded as px_plan_trace_record writes it:
 * presets by name, files by path, refused when absent or when their
 * SHA-256 differs from the recorded one.  Returns owned
 * (px_ir_model_free).  Errors: PX_EPARSE (a malformed record),
 * PX_EVALIDATE (the file changed), the reader's. */
PX_NODISCARD px_status px_plan_trace_open_model(const json_t *doc, px_ir_model **out, px_err *err);
/* The contract a trace recorded: *out NULL for the implied one, a
 * built-in by name, or the recorded document.  Errors: PX_EPARSE, the
 * contract reader's. */
PX_NODISCARD px_status px_plan_trace_open_contract(const json_t *doc, px_contract **out,
                                                   px_err *err);
/* The derivers for decisions px_plan_trace_record writes: "plan" rebuilds
 * the request from the recorded inputs (presets by name; model files
 * re-opened by path and refused when absent or when their SHA-256
 * differs), searches again and returns the plan document.  Returns a
 * static table of *n entries. */
const px_trace_deriver *px_plan_replay_derivers(size_t *n);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_PLAN_H */
