/*
 * plexus/sim.h: the discrete-event simulator.
 *
 * The simulator serves a load (docs/formats/load.md) on a plan and reports
 * what the plan would do under it: time to first token and per output
 * token (p50/p95/p99), throughput, utilization and stranded capacity per
 * device, energy, money, failed and dropped requests, each with a 95%
 * confidence interval over independent replications (Student's t over the
 * replication means).  It models continuous batching at the first stage,
 * pipelined micro-batches, stage compute times drawn around the plan's
 * predictions, transfers that share link bandwidth within contention
 * domains (processor sharing), a first-order thermal model with throttling,
 * power caps, random failures correlated by failure domain, and faults read
 * from a faults file (docs/formats/faults.md).
 *
 * The engine is deterministic: a binary-heap event queue keyed by (time,
 * insertion sequence), seeded generators with one derived stream per
 * purpose, no wall clock, and no allocation per event (pools are sized
 * before the run).  The same inputs and seed give byte-identical results.
 *
 *     px_sim_plan plan;
 *     px_sim_plan_from_json(plan_doc, graph, &plan, &err);  // graph may be NULL
 *     px_sim_load load;
 *     px_sim_load_parse("poisson:rate=5,prompt=128,gen=64", &load, &err);
 *     px_sim_options opt;
 *     px_sim_options_default(&opt);
 *     opt.duration_s = 60;
 *     opt.replications = 5;
 *     px_sim_result res;
 *     if (px_sim_run(&plan, &load, NULL, &opt, &res, &err) == PX_OK) {
 *         json_t *doc = px_sim_result_to_json(&res);
 *         ...
 *         json_decref(doc);
 *         px_sim_result_release(&res);
 *     }
 *     px_sim_load_release(&load);
 *     px_sim_plan_release(&plan);
 *
 * Self-healing plugs in through px_sim_hooks: on each fault the engine asks
 * the hook for an action (none, switch to a fallback plan after a delay,
 * drop a device, pace admission), and carries it out.
 *
 * Thread safety: a run touches only its own state; distinct runs may go
 * on in parallel on the same (read-only) plan, load and faults.
 */
#ifndef PLEXUS_SIM_H
#define PLEXUS_SIM_H

#include "plexus/base.h"
#include "plexus/hw.h"
#include "plexus/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PX_SIM_NONE        UINT32_MAX
#define PX_SIM_MAX_TP      16 /* devices of one stage */
#define PX_SIM_MAX_DOMAINS 8  /* failure domains of one device */
#define PX_SIM_ID_LEN      96 /* device, domain and link names */

/* ------------------------------------------------------------------ */
/* The plan as the simulator sees it                                   */
/* ------------------------------------------------------------------ */

/* A device.  Zero figures mean "not modelled": no thermal model when
 * thermal_limit_k or thermal_tau_s is 0, no random failures when mtbf_s
 * is 0. */
typedef struct px_sim_device {
    char id[PX_SIM_ID_LEN];
    double power_active_w, power_idle_w;
    double thermal_limit_k;   /* throttling starts at this temperature */
    double thermal_tau_s;     /* thermal time constant */
    double thermal_r_k_per_w; /* thermal resistance; 0: derived (see faults.md) */
    double mtbf_s;
    double usd_per_hour;
    double mem_capacity;                  /* bytes */
    double mem_kv_reserved;               /* bytes of KV cache the plan reserves on it */
    uint32_t domains[PX_SIM_MAX_DOMAINS]; /* failure domains (indices) */
    uint32_t n_domains;
} px_sim_device;

/* A failure domain (rack, power feed): its loss takes every member down. */
typedef struct px_sim_domain {
    char id[PX_SIM_ID_LEN];
    double mtbf_s; /* 0: no random failures of the domain itself */
} px_sim_domain;

/* A contention domain: links whose transfers share one bandwidth. */
typedef struct px_sim_link {
    char id[PX_SIM_ID_LEN];
    double bandwidth; /* B/s shared by every transfer in flight */
} px_sim_link;

typedef struct px_sim_stage {
    uint32_t devices[PX_SIM_MAX_TP]; /* indices into plan->devices */
    uint32_t n_devices;
    /* One decode step of a full micro-batch at the planned context, and
     * the prefill of a full micro-batch's prompts: median and p99. */
    double decode_s, decode_p99_s;
    double prefill_s, prefill_p99_s;
    /* Share of the decode step that does not grow with the batch's
     * context (weights streamed once per step); the rest scales with the
     * tokens held in the KV cache.  In [0, 1].  A step of a group with
     * cap = ceil(batch / micro_batches) slots takes
     *   decode_s * (wf + (1 - wf) * ctx_sum / (cap * context))      (if any
     *                                                     sequence decodes)
     * + prefill_s * new_prompt_tokens / (cap * prompt_tokens),
     * each term times a lognormal factor with median 1 whose p99 matches
     * the stage's p99, stretched by throttling and power caps. */
    double weight_fraction;
    /* The hop to the next stage (ignored on the last stage): bytes per
     * decode step of a full micro-batch, fixed latency, and the contention
     * domain (index into plan->links) the bytes flow through. */
    double xfer_bytes, xfer_latency_s;
    uint32_t link;
    uint32_t next_device; /* first device of the next stage, for link faults */
} px_sim_stage;

typedef struct px_sim_replica {
    px_sim_stage *stages;
    uint32_t n_stages;
    uint32_t batch;         /* sequences in flight at most */
    uint32_t micro_batches; /* >= 1; groups cycling through the stages */
} px_sim_replica;

/* A plan: plain data, built by px_sim_plan_from_json or by hand (tests).
 * Arrays are owned by `arena` when built from JSON (px_sim_plan_release
 * frees them); hand-built plans leave arena NULL and own their arrays. */
typedef struct px_sim_plan {
    char id[80];
    px_sim_device *devices;
    size_t n_devices;
    px_sim_domain *domains;
    size_t n_domains;
    px_sim_link *links;
    size_t n_links;
    px_sim_replica *replicas;
    size_t n_replicas;
    uint32_t context, prompt_tokens, gen_tokens; /* the predictions' workload */
    double predicted_throughput;                 /* tokens/s, the plan's own p50 (0: unknown) */
    bool emulated;                               /* simulated or emulated devices */
    px_arena *arena;
} px_sim_plan;

/* Builds the simulator's view of a plan document (`plexus.plan/1`,
 * borrowed).  graph (borrowed, may be NULL) supplies device power, thermal
 * figures, MTBF, price, failure domains and the links between stages;
 * without it the device table holds only the plan's devices with assumed
 * figures and hops take the plan's transfer time on a private link.  With
 * it the device table is the whole inventory, so plans made on one
 * inventory share device indices.  On success `out` owns its arrays
 * (px_sim_plan_release).  PX_EPARSE naming the JSON pointer of a missing or
 * malformed member; PX_ENOTFOUND for a device absent from the graph;
 * PX_ENOMEM. */
px_status px_sim_plan_from_json(const json_t *doc, const px_hw_graph *graph, px_sim_plan *out,
                                px_err *err);
/* Frees what px_sim_plan_from_json allocated and zeroes the struct.
 * Hand-built plans (arena NULL) are only zeroed.  NULL is a no-op. */
void px_sim_plan_release(px_sim_plan *plan);
/* Checks a plan's numbers and indices.  PX_EINVAL naming the field. */
px_status px_sim_plan_check(const px_sim_plan *plan, px_err *err);

/* ------------------------------------------------------------------ */
/* Loads                                                               */
/* ------------------------------------------------------------------ */

typedef enum px_sim_load_kind {
    PX_SIM_LOAD_POISSON = 0,
    PX_SIM_LOAD_BURSTY, /* on/off Markov-modulated Poisson */
    PX_SIM_LOAD_TRACE,  /* recorded arrivals */
} px_sim_load_kind;

typedef enum px_sim_len_kind {
    PX_SIM_LEN_FIXED = 0,
    PX_SIM_LEN_UNIFORM,     /* a..b inclusive */
    PX_SIM_LEN_EXPONENTIAL, /* mean a, at least 1 */
} px_sim_len_kind;

typedef struct px_sim_len {
    px_sim_len_kind kind;
    uint32_t a, b;
} px_sim_len;

typedef struct px_sim_arrival {
    double t;
    uint32_t prompt_tokens, gen_tokens;
} px_sim_arrival;

typedef struct px_sim_load {
    px_sim_load_kind kind;
    double rate;     /* requests/s, long-run mean */
    double burst;    /* bursty: rate while on / mean rate (> 1) */
    double period_s; /* bursty: mean length of one on+off cycle */
    px_sim_len prompt, gen;
    px_sim_arrival *arrivals; /* trace: owned, sorted by t */
    size_t n_arrivals;
    char source[256]; /* trace: the file name */
} px_sim_load;

/* Parses a load spec: "poisson:rate=5,prompt=128,gen=64",
 * "bursty:rate=5,burst=4,period=10s,prompt=uniform:64-256,gen=exp:128" or
 * "trace:FILE" (reads FILE, JSON Lines).  Lengths are N, uniform:A-B or
 * exp:MEAN.  On success `out` owns its arrivals (px_sim_load_release).
 * PX_EINVAL naming the item and the accepted keys; trace errors as
 * px_sim_load_read_trace; PX_EIO. */
px_status px_sim_load_parse(const char *spec, px_sim_load *out, px_err *err);
/* Reads arrivals from JSON Lines text ({"t": s, "prompt_tokens": n,
 * "gen_tokens": m} per line; blank lines skipped) of len bytes (borrowed).
 * Bounded: 10,000,000 lines, 4 KiB per line, lengths 1..1,000,000, t
 * finite, >= 0 and non-decreasing.  PX_EPARSE / PX_ELIMIT naming the line. */
px_status px_sim_load_read_trace(const char *text, size_t len, const char *name, px_sim_load *out,
                                 px_err *err);
void px_sim_load_release(px_sim_load *load);
/* The load as JSON (for traces; arrivals included).  New reference. */
json_t *px_sim_load_to_json(const px_sim_load *load);
/* Reads px_sim_load_to_json's output back (borrowed).  PX_EPARSE. */
px_status px_sim_load_from_json(const json_t *v, px_sim_load *out, px_err *err);

/* ------------------------------------------------------------------ */
/* Faults                                                              */
/* ------------------------------------------------------------------ */

#define PX_SIM_FAULTS_SCHEMA "plexus.faults/1"

typedef enum px_sim_fault_kind {
    PX_SIM_FAULT_DEVICE_LOSS = 0, /* target: a device */
    PX_SIM_FAULT_DOMAIN_LOSS,     /* target: a failure domain */
    PX_SIM_FAULT_LINK_DEGRADE,    /* target: "a>b" (devices) */
    PX_SIM_FAULT_THERMAL,         /* target: a device or "*"; ambient */
    PX_SIM_FAULT_POWER_CAP,       /* target: a device or "*"; limit */
    PX_SIM_FAULT_KIND_COUNT_
} px_sim_fault_kind;

/* "device-loss", "domain-loss", "link-degrade", "thermal", "power-cap". */
const char *px_sim_fault_kind_name(px_sim_fault_kind k);

typedef struct px_sim_fault {
    px_sim_fault_kind kind;
    double at_s;
    double duration_s; /* 0: until the end of the run */
    char target[2 * PX_SIM_ID_LEN];
    double latency_s;        /* link-degrade: added latency */
    double bandwidth_factor; /* link-degrade: (0, 1] */
    double period_s, duty;   /* link-degrade: intermittent when period > 0 */
    double ambient_k;        /* thermal */
    double power_limit_w;    /* power-cap */
} px_sim_fault;

typedef struct px_sim_faults {
    px_sim_fault *items; /* owned, in file order */
    size_t n;
} px_sim_faults;

/* Reads a faults document of len bytes (borrowed; need not be
 * NUL-terminated).  Bounded (1 MiB, 10,000 faults, depth 8) and strict:
 * unknown members, unknown kinds, missing targets, negative or non-finite
 * times, factors outside (0, 1] are refused with a message naming
 * "name: /faults/3/bandwidth_factor" and the fix.  Targets are checked
 * against a plan when a run starts.  PX_EPARSE, PX_ELIMIT, PX_ENOMEM. */
px_status px_sim_faults_parse(const char *text, size_t len, const char *name, px_sim_faults *out,
                              px_err *err);
px_status px_sim_faults_load(const char *path, px_sim_faults *out, px_err *err);
void px_sim_faults_release(px_sim_faults *f);
/* The faults as a plexus.faults/1 document.  New reference. */
json_t *px_sim_faults_to_json(const px_sim_faults *f);

/* ------------------------------------------------------------------ */
/* Hooks for self-healing                                              */
/* ------------------------------------------------------------------ */

typedef struct px_sim px_sim; /* one running replication, opaque */

typedef enum px_sim_action_kind {
    PX_SIM_ACT_NONE = 0,
    PX_SIM_ACT_SWITCH_PLAN, /* install options.fallbacks[plan] after delay_s */
    PX_SIM_ACT_DROP_DEVICE, /* take `device` out of service now */
    PX_SIM_ACT_PACE,        /* admit at most `max_batch` sequences per micro-batch */
} px_sim_action_kind;

typedef struct px_sim_action {
    px_sim_action_kind kind;
    uint32_t plan;      /* SWITCH_PLAN: index into options.fallbacks */
    double delay_s;     /* SWITCH_PLAN: detection + switch time */
    uint32_t device;    /* DROP_DEVICE */
    uint32_t max_batch; /* PACE */
    /* Requeue the requests a lost replica held (their progress is lost)
     * instead of failing them. */
    bool requeue;
} px_sim_action;

/* What happened, as the hook sees it. */
typedef struct px_sim_fault_event {
    double t;
    px_sim_fault_kind kind;
    uint32_t device;      /* device-loss (also each member of a lost domain) */
    uint32_t domain;      /* domain-loss, else PX_SIM_NONE */
    bool injected;        /* from the faults file (false: a random failure) */
    uint32_t n_in_flight; /* requests on the replica(s) it stopped */
} px_sim_fault_event;

/* The hook table.  version is PX_SIM_HOOKS_VERSION; the table only grows
 * at the end.  on_fault (optional, NULL: no action) is called when a
 * fault starts (injected or random; not for losses its own actions cause)
 * and fills *action (pre-set to NONE); it must not call back into the
 * simulator except px_sim_now. */
#define PX_SIM_HOOKS_VERSION 1
typedef struct px_sim_hooks {
    int version;
    void (*on_fault)(void *ctx, const px_sim *sim, const px_sim_fault_event *ev,
                     px_sim_action *action);
    void *ctx;
} px_sim_hooks;

/* Simulated time of a running replication, seconds. */
double px_sim_now(const px_sim *sim);

/* ------------------------------------------------------------------ */
/* Running                                                             */
/* ------------------------------------------------------------------ */

typedef struct px_sim_options {
    double duration_s;            /* simulated time per replication (60) */
    double warmup_s;              /* requests arriving earlier are not measured (0) */
    uint64_t seed;                /* base seed (1) */
    uint32_t replications;        /* independent replications (5), 1..1000 */
    uint32_t queue_limit;         /* waiting requests kept; more are dropped (100000) */
    bool random_failures;         /* draw failures from MTBFs (true) */
    double failure_accel;         /* multiplies every failure rate (1) */
    double ambient_k;             /* ambient temperature (298.15 K) */
    double throttle_clock;        /* clock fraction while throttled (0.7) */
    const px_sim_hooks *hooks;    /* borrowed; may be NULL */
    const px_sim_plan *fallbacks; /* borrowed; same device table as the plan */
    size_t n_fallbacks;
} px_sim_options;

void px_sim_options_default(px_sim_options *opt);

/* Per device, one replication (or their means). */
typedef struct px_sim_device_stats {
    double utilization; /* busy / alive time */
    double energy_j;
    double max_temp_k;
    double throttled_s;
    double lost_at_s; /* -1 when it survived */
} px_sim_device_stats;

/* The scalar figures of one replication: X(field, json name, unit). */
#define PX_SIM_METRICS(X)                               \
    X(ttft_mean_s, "ttft_mean_s", "s")                  \
    X(ttft_p50_s, "ttft_p50_s", "s")                    \
    X(ttft_p95_s, "ttft_p95_s", "s")                    \
    X(ttft_p99_s, "ttft_p99_s", "s")                    \
    X(tpot_p50_s, "tpot_p50_s", "s")                    \
    X(tpot_p95_s, "tpot_p95_s", "s")                    \
    X(tpot_p99_s, "tpot_p99_s", "s")                    \
    X(tokens_per_s, "tokens_per_s", "1/s")              \
    X(requests_per_s, "requests_per_s", "1/s")          \
    X(arrivals, "arrivals", "")                         \
    X(completed, "completed", "")                       \
    X(failed, "failed", "")                             \
    X(dropped, "dropped", "")                           \
    X(in_flight_at_end, "in_flight_at_end", "")         \
    X(energy_j, "energy_j", "J")                        \
    X(joules_per_token, "joules_per_token", "J")        \
    X(usd, "usd", "$")                                  \
    X(usd_per_token, "usd_per_token", "$")              \
    X(mean_utilization, "mean_utilization", "")         \
    X(stranded_compute, "stranded_compute", "")         \
    X(stranded_kv_fraction, "stranded_kv_fraction", "") \
    X(stranded_kv_bytes, "stranded_kv_bytes", "B")      \
    X(device_losses, "device_losses", "")               \
    X(plan_switches, "plan_switches", "")               \
    X(throttled_s, "throttled_s", "s")                  \
    X(events, "events", "")

typedef struct px_sim_metrics {
#define PX__SIM_FIELD(f, name, unit) double f;
    PX_SIM_METRICS(PX__SIM_FIELD)
#undef PX__SIM_FIELD
} px_sim_metrics;

/* A mean with its 95% confidence interval over replications. */
typedef struct px_sim_ci {
    double mean, lo, hi;
} px_sim_ci;

typedef struct px_sim_result {
    uint32_t n_replications;
    size_t n_devices;
    px_sim_metrics *runs;         /* n_replications */
    px_sim_device_stats *devices; /* n_replications x n_devices, run-major */
    px_sim_metrics mean, lo, hi;  /* 95% t intervals (lo = hi = mean for one run) */
    char plan_id[80];
    double duration_s;
    uint64_t seed;
    bool emulated;
} px_sim_result;

/* Runs options->replications independent replications (seed of
 * replication r derived from options->seed and r) and aggregates them.
 * plan, load, faults (may be NULL), options and everything they point to
 * are borrowed.  On success `out` owns its arrays (px_sim_result_release).
 * PX_EINVAL for a bad plan or option (the message names it); PX_ENOTFOUND
 * for a fault target the plan lacks ("faults[2].target: device "n9.gpu0"
 * is not in the plan's inventory"); PX_ENOMEM. */
px_status px_sim_run(const px_sim_plan *plan, const px_sim_load *load, const px_sim_faults *faults,
                     const px_sim_options *options, px_sim_result *out, px_err *err);
void px_sim_result_release(px_sim_result *res);

/* The result as JSON ("plexus.sim/1"): inputs' ids, per metric the mean
 * and interval and the per-replication values, per device figures.
 * Deterministic: the same result gives byte-identical canonical text.
 * New reference; NULL on allocation failure. */
json_t *px_sim_result_to_json(const px_sim_result *res, const px_sim_plan *plan);
/* A readable summary appended to out.  PX_ENOMEM. */
px_status px_sim_result_report(const px_sim_result *res, const px_sim_plan *plan, px_strbuf *out);
/* The 97.5% quantile of Student's t with df degrees of freedom (df >= 1). */
double px_sim_t975(uint32_t df);

/* ------------------------------------------------------------------ */
/* Replay                                                              */
/* ------------------------------------------------------------------ */

/* The derivers for decisions `plexus simulate --trace` records: "simulate"
 * recomputes the whole result from the recorded inputs ("plan", "load",
 * "faults", "options", and "inventory" when one was given).  Returns a
 * static table of *n entries. */
const px_trace_deriver *px_sim_replay_derivers(size_t *n);
/* The inputs object recorded with the "simulate" decision. */
json_t *px_sim_options_to_json(const px_sim_options *opt);
px_status px_sim_options_from_json(const json_t *v, px_sim_options *opt, px_err *err);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_SIM_H */
