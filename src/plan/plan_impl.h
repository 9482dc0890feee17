/* Private declarations shared by the planner's files. */
#ifndef PX_PLAN_IMPL_H
#define PX_PLAN_IMPL_H

#include "plexus/plan.h"

#define PX__PLAN_MAX_PREC   4
#define PX__PLAN_POOL       48
#define PX__PLAN_MAX_REJECT 256
#define PX__PLAN_SEQ_UNITS  64

/* Why a candidate lost, machine-readable (docs/formats/plan.md). */
typedef enum px__plan_reason {
    PX__REJ_MEMORY = 0,
    PX__REJ_CONTRACT,
    PX__REJ_CAPABILITY,
    PX__REJ_NO_PATH,
    PX__REJ_SLO,
    PX__REJ_BUDGET,
    PX__REJ_DOMINATED,
    PX__REJ_COUNT_
} px__plan_reason;

const char *px__plan_reason_name(px__plan_reason r);

/* A precision option the contract allows on every region it touches. */
typedef struct px__plan_prec {
    px_cost_precision prec;
    char label[128];
    px_verdict verdict; /* ALLOWED or ALLOWED_AFTER_VALIDATION */
} px__plan_prec;

/* A tensor-parallel group inside one island: the unit of a sequence. */
typedef struct px__plan_unit {
    uint32_t devices[PX_COST_MAX_TP];
    uint32_t tp;
    uint32_t klass, node, island;
    double speed; /* aggregate memory bandwidth, B/s */
    double mem;   /* aggregate usable memory, bytes */
    double usd_h, watts;
} px__plan_unit;

/* An evaluated single-pipeline candidate. */
typedef struct px__plan_cand {
    px_cost_pipeline pipe;
    px_cost_workload wl;
    double tpot_s, ttft_s, throughput, joules_per_token, usd_per_hour, tokens_per_usd;
    double transfer_s, score;
    double host_use;    /* the share of host_node's cores it keeps busy (0..1) */
    uint32_t host_node; /* the node whose cores it uses most; PX_HW_NONE: none declared */
    bool meets_slo, within_budget;
    uint32_t prec_index;
    uint64_t key;
    char origin[32];
} px__plan_cand;

typedef struct px__plan_reject {
    px__plan_reason reason;
    uint64_t key;
    char devices[160];
    char message[320];
    char cause[200];
    double margin; /* dominated: how much worse on the objective (fraction) */
    double tpot_s, throughput;
    bool has_figures;
} px__plan_reject;

/* A layout: one or more replicas serving the same requests, each at its
 * own batch (wls[i]; the rest of the workload is wl's). */
typedef struct px__plan_layout {
    px_cost_pipeline *replicas;
    px_cost_workload *wls; /* per replica */
    uint32_t n_replicas, cap;
    px_cost_workload wl; /* replica 0's, and the default of a push */
    uint32_t prec_index;
} px__plan_layout;

typedef struct px__plan_ctx {
    const px_plan_request *req; /* points at resolved */
    px_plan_request resolved;   /* the request with defaults filled in */
    px_cost_fleet *fleet;
    const px_cost_model *model;
    const px_cost_params *cp;
    const px_contract *contract; /* the request's, or the implied one */
    px_contract_device *cdev;    /* per fleet device */
    bool *usable;                /* per fleet device */
    uint32_t *class_avail;       /* usable devices per class */
    px__plan_prec prec[PX__PLAN_MAX_PREC];
    uint32_t n_prec;
    bool implied_contract;       /* no contract given: stored precision only */
    px_contract *owned_contract; /* the implied one, when loaded here */
    px__plan_cand *pool;         /* best candidates, sorted by score */
    size_t n_pool;
    px__plan_reject *rej;
    size_t n_rej;
    size_t n_evaluated;
    px_cost_estimate *scratch; /* one estimate for evaluations */
    px_strbuf notes;           /* lines for the explanation */
    char precision_note[320];  /* why products are costed as they are ("" when plain) */
} px__plan_ctx;

typedef px_status (*px__plan_place_fn)(px__plan_ctx *ctx, px__plan_layout *out, px_err *err);

/* Layouts.  A push gives the replica l->wl; push_wl its own workload. */
px_status px__plan_layout_push(px__plan_layout *l, const px_cost_pipeline *p, px_err *err);
px_status px__plan_layout_push_wl(px__plan_layout *l, const px_cost_pipeline *p,
                                  const px_cost_workload *wl, px_err *err);
/* Sets l->wl and every replica's workload to wl. */
void px__plan_layout_set_wl(px__plan_layout *l, const px_cost_workload *wl);
void px__plan_layout_release(px__plan_layout *l);
/* replicas.c: adds replicas to l while they help the objective (clones of
 * its first pipeline, and fresh pipelines on what is left); at the
 * throughput objective replaces l by a layout grown from another pool
 * candidate when that one serves more.  PX_ENOMEM. */
px_status px__plan_add_replicas(px__plan_ctx *ctx, px__plan_layout *l, px_err *err);
px_status px__plan_best_layout(px__plan_ctx *ctx, px__plan_layout *l, px_err *err);

/* Candidates: evaluate a pipeline under the request (contract cuts,
 * SLO, budget), score it, keep it in the pool or record its rejection. */
uint64_t px__plan_pipe_key(const px_cost_pipeline *p);
void px__plan_pipe_devices(const px__plan_ctx *ctx, const px_cost_pipeline *p, char *buf, size_t n);
/* Scores an evaluated estimate by the objective: lower is better. */
/* For throughput the pipeline counts as often as the fleet could copy it
 * (replicas of the same device classes), so small pipelines that replicate
 * well are not ranked below big ones that cannot. */
double px__plan_score(const px__plan_ctx *ctx, const px_cost_estimate *e,
                      const px_cost_pipeline *p);
double px__plan_replica_capacity(const px__plan_ctx *ctx, const px_cost_pipeline *p);
/* Evaluates a pipeline without touching the pool or the rejections:
 * false when the contract forbids it or it does not fit. */
bool px__plan_evaluate(px__plan_ctx *ctx, const px_cost_pipeline *p, const px_cost_workload *wl,
                       uint32_t prec_index, px__plan_cand *out);
/* Returns true when it entered the pool. */
bool px__plan_consider(px__plan_ctx *ctx, const px_cost_pipeline *p, const px_cost_workload *wl,
                       uint32_t prec_index, const char *origin);
void px__plan_reject_add(px__plan_ctx *ctx, px__plan_reason r, uint64_t key, const char *devices,
                         const char *cause, const char *fmt, ...) PX_PRINTF(6, 7);
/* The contract's verdict on the cuts and splits of a pipeline: FORBIDDEN
 * fills msg. */
px_verdict px__plan_check_structure(px__plan_ctx *ctx, const px_cost_pipeline *p, char *msg,
                                    size_t n);

/* Contract: precision options and the full verdict of a final plan. */
px_status px__plan_precisions(px__plan_ctx *ctx, px_err *err);
/* {"name", "digest", "verdict", "decisions": [...]} for a layout: every
 * transformation it applies, judged on the regions it touches.  *verdict
 * gets the most restrictive.  New reference; NULL on allocation failure. */
json_t *px__plan_contract_json(px__plan_ctx *ctx, const px__plan_layout *l, px_verdict *verdict);

/* A device sequence the layer search runs on. */
typedef struct px__plan_seq {
    uint32_t units[PX__PLAN_SEQ_UNITS];
    uint32_t n;
    bool force_first; /* the DP must start on units[0] */
} px__plan_seq;

typedef struct px__plan_seq_set {
    px__plan_seq *items;
    size_t n, cap;
} px__plan_seq_set;

/* units.c */
void px__plan_fill_unit(const px__plan_ctx *ctx, px__plan_unit *u);
/* Adds q unless an equal one is there.  PX_ENOMEM. */
px_status px__plan_seq_push(px__plan_seq_set *s, const px__plan_seq *q, px_err *err);
px_status px__plan_make_sequences(px__plan_ctx *ctx, const px__plan_unit *units, size_t nu,
                                  px__plan_seq_set *out, px_err *err);
/* Fills order[0..nu) with unit indices, fastest first.  Not thread-safe. */
void px__plan_order_by_speed(const px__plan_unit *units, size_t nu, uint32_t *order);

/* The search (plexus policy) and its parts. */
px_status px__plan_units(px__plan_ctx *ctx, const bool *excluded, px__plan_unit **out, size_t *n,
                         px_err *err);
px_status px__plan_search_plexus(px__plan_ctx *ctx, px__plan_layout *out, px_err *err);
/* The batch sizes the search tries (at most 8): the request's when it
 * sets one, else 1 for latency and ttft, a ladder for the others. */
void px__plan_batches(const px__plan_ctx *ctx, uint32_t *b, size_t *n);
/* Best single pipeline on the devices not excluded, at a fixed workload
 * and precision (used for replicas and fallbacks).  PX_EINFEASIBLE. */
px_status px__plan_best_on(px__plan_ctx *ctx, const bool *excluded, const px_cost_workload *wl,
                           uint32_t prec_index, px__plan_cand *out, px_err *err);

/* DP sessions on explicit device orders, for the yardstick. */
typedef struct px__plan_dp_session px__plan_dp_session;
px_status px__plan_dp_session_new(px__plan_ctx *ctx, const px_cost_workload *wl,
                                  px__plan_dp_session **out, px_err *err);
void px__plan_dp_session_free(px__plan_dp_session *s);
/* Best cut over explicit units in this order, each holding at least one
 * block.  A unit of several devices needs an island no other unit of its
 * shape shares (the stage cache is keyed by it).  PX_EINFEASIBLE. */
px_status px__plan_dp_units(px__plan_dp_session *s, const px__plan_unit *units, size_t n,
                            bool bottleneck, px_cost_pipeline *out, double *value, px_err *err);
px_status px__plan_heuristic_pipe(px__plan_ctx *ctx, const px_cost_workload *wl, bool bottleneck,
                                  px_cost_pipeline *out, px_err *err);
/* A context for a request outside px_plan_search (yardsticks). */
px_status px__plan_open(const px_plan_request *req, px_cost_fleet **f, px_cost_model **m,
                        px__plan_ctx *ctx, px_err *err);
void px__plan_close(px_cost_fleet *f, px_cost_model *m, px__plan_ctx *ctx);

/* Baselines. */
px_status px__plan_llamacpp(px__plan_ctx *ctx, px__plan_layout *out, px_err *err);
px_status px__plan_exo(px__plan_ctx *ctx, px__plan_layout *out, px_err *err);
px_status px__plan_gpustack(px__plan_ctx *ctx, px__plan_layout *out, px_err *err);
px_status px__plan_single_type(px__plan_ctx *ctx, px__plan_layout *out, px_err *err);
px__plan_place_fn px__plan_policy_fn(const char *name);

/* Helpers shared by the baselines: a stage at stored precision. */
px_cost_stage px__plan_stage(const px__plan_ctx *ctx, const uint32_t *devices, uint32_t tp,
                             int32_t first, int32_t last, uint32_t prec_index);
/* Splits n_layers over n shares proportional to weights (largest
 * remainder, at least min_each each when possible) into counts. */
void px__plan_split_layers(const double *weights, size_t n, uint32_t n_layers, uint32_t min_each,
                           uint32_t *counts);
/* Builds a pipeline from per-device layer counts (devices in order, counts
 * may be 0 for a device that holds none). */
void px__plan_pipeline_from_counts(const px__plan_ctx *ctx, const uint32_t *devices,
                                   const uint32_t *counts, size_t n, uint32_t prec_index,
                                   px_cost_pipeline *out);

/* Byte counts for messages ("40.1 GiB"); durations use px_format_seconds. */
void px__plan_fmt_bytes(double b, char *buf, size_t n);

/* A precomputed answer to the loss of one device. */
typedef struct px__plan_fallback {
    uint32_t lost;
    bool feasible;
    char devices[160];
    uint32_t n_replicas;
    double tpot_s, throughput;
    char note[160];
} px__plan_fallback;

/* What to do when a link the plan uses degrades. */
typedef enum px__plan_link_action {
    PX__LINK_KEEP = 0,       /* keep the plan: nothing beats it on the slowed link */
    PX__LINK_AVOID_SENDER,   /* re-plan without the hop's sending device */
    PX__LINK_AVOID_RECEIVER, /* re-plan without the hop's receiving device */
    PX__LINK_DROP_REPLICA,   /* drop the replica that uses it; the others serve */
} px__plan_link_action;

/* "keep", "avoid-sender", "avoid-receiver", "drop-replica". */
const char *px__plan_link_action_name(px__plan_link_action a);

/* A precomputed answer to the degradation of one hop's link. */
typedef struct px__plan_link_fallback {
    uint32_t from, to;       /* fleet devices: sender and receiver of the hop */
    uint32_t replica, stage; /* the hop leaves this stage (or is its all-reduce) */
    bool allreduce;          /* a ring link of the stage's tensor-parallel group */
    char via[64];            /* the route's narrowest link: its id or kind */
    px__plan_link_action action;
    bool feasible;
    char devices[160]; /* the stages that serve ("" for drop-replica) */
    uint32_t n_replicas;
    double tpot_s, throughput;                   /* of the answer */
    double degraded_tpot_s, degraded_throughput; /* the plan as it is, link slowed */
    char note[384];
} px__plan_link_fallback;

/* A baseline's layout, costed by the same model. */
typedef struct px__plan_baseline {
    char name[32];
    bool feasible;
    bool contract_ok;
    char why[320];
    char devices[160];
    uint32_t n_replicas, n_stages, batch;
    double tpot_s, ttft_s, throughput, usd_per_hour, joules_per_token;
} px__plan_baseline;

/* Everything the document is built from. */
typedef struct px__plan_result {
    px__plan_layout layout;
    px_cost_estimate *est; /* one per replica */
    px_cost_uncertain mc;  /* replica 0 */
    double throughput, usd_per_hour, power_w, p_fail;
    double tpot_p50, tpot_p99, ttft_p50, ttft_p99;
    px_cost_bound bound;
    double placed_bound_s;
    px__plan_fallback *fb;
    size_t n_fb;
    px__plan_link_fallback *lfb;
    size_t n_lfb;
    px__plan_baseline bl[8];
    size_t n_bl;
    json_t *contract; /* owned */
    px_verdict verdict;
    const char *policy;
} px__plan_result;

/* fallback.c: the answers to the loss of each device of an evaluated
 * layout (r->fb) and to the degradation of each link its hops use
 * (r->lfb).  PX_ENOMEM. */
px_status px__plan_fallbacks(px__plan_ctx *ctx, px__plan_result *r, px_err *err);

json_t *px__plan_document(px__plan_ctx *ctx, px__plan_result *r);
/* explain.c: the pool's runners-up as dominated (or SLO) rejections; the
 * explanation sentences (new reference); whether a layout uses an emulated
 * device. */
void px__plan_add_dominated(px__plan_ctx *ctx, const px__plan_result *r);
json_t *px__plan_explanation(px__plan_ctx *ctx, const px__plan_result *r);
bool px__plan_layout_emulated(const px__plan_ctx *ctx, const px__plan_layout *l);

/* The plan object (plan.c) and its document (plan_json.c). */
struct px_plan {
    json_t *doc;
    char id[65];
    px_plan_summary summary;
    char policy[32];
    px__plan_layout layout;
    px_cost_fleet *fleet;
    px_cost_model *model;
};

/* Rounds to `digits` significant decimal digits. */
double px__plan_round(double x, int digits);
/* Canonical text with short floats. Owned. */
char *px__plan_dump_json(const json_t *doc);

#endif
