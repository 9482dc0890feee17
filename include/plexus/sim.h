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
 * drop a device, pace admission), and carries it out; every tick it hands
 * the hook what an operator could observe (step and transfer times,
 * temperatures, heartbeats) and carries out the action it returns.
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
    double mtbf_s;              /* 0: no random failures of the domain itself */
    char parent[PX_SIM_ID_LEN]; /* the enclosing domain's id; "" for none */
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
PX_NODISCARD px_status px_sim_plan_from_json(const json_t *doc, const px_hw_graph *graph,
                                             px_sim_plan *out, px_err *err);
/* Frees what px_sim_plan_from_json allocated and zeroes the struct.
 * Hand-built plans (arena NULL) are only zeroed.  NULL is a no-op. */
void px_sim_plan_release(px_sim_plan *plan);
/* Checks a plan's numbers and indices.  PX_EINVAL naming the field. */
PX_NODISCARD px_status px_sim_plan_check(const px_sim_plan *plan, px_err *err);
/* Checks that a plan document (borrowed) was made on this inventory: its
 * /inventory/digest must be the graph's content id (px_hw_graph_digest),
 * or a device of the same name may be another device (an H100 read as an
 * A100).  inv_name names the inventory in the message.  A plan without a
 * digest passes.  PX_EINVAL naming both inventories and the fix; PX_ENOMEM. */
PX_NODISCARD px_status px_sim_plan_check_inventory(const json_t *plan_doc, const px_hw_graph *graph,
                                                   const char *inv_name, px_err *err);

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
PX_NODISCARD px_status px_sim_load_parse(const char *spec, px_sim_load *out, px_err *err);
/* Reads arrivals from JSON Lines text ({"t": s, "prompt_tokens": n,
 * "gen_tokens": m} per line; blank lines skipped) of len bytes (borrowed).
 * Bounded: 10,000,000 lines, 4 KiB per line, lengths 1..1,000,000, t
 * finite, >= 0 and non-decreasing.  PX_EPARSE / PX_ELIMIT naming the line. */
PX_NODISCARD px_status px_sim_load_read_trace(const char *text, size_t len, const char *name,
                                              px_sim_load *out, px_err *err);
void px_sim_load_release(px_sim_load *load); /* NULL is a no-op */
/* The output tokens per second the load offers in the long run: the mean
 * arrival rate times the mean generation length (a trace: its generated
 * tokens over its span).  0 when unknown. */
double px_sim_load_offered_tokens(const px_sim_load *load);
/* The load as JSON (for traces; arrivals included).  New reference. */
json_t *px_sim_load_to_json(const px_sim_load *load);
/* Reads px_sim_load_to_json's output back (borrowed).  PX_EPARSE. */
PX_NODISCARD px_status px_sim_load_from_json(const json_t *v, px_sim_load *out, px_err *err);

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
PX_NODISCARD px_status px_sim_faults_parse(const char *text, size_t len, const char *name,
                                           px_sim_faults *out, px_err *err);
PX_NODISCARD px_status px_sim_faults_load(const char *path, px_sim_faults *out, px_err *err);
void px_sim_faults_release(px_sim_faults *f); /* NULL is a no-op */
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
    /* SWITCH_PLAN (hooks version 2): install this plan after delay_s
     * instead of options.fallbacks[plan].  Borrowed: it must outlive the
     * run and share the primary plan's device table (the same inventory).
     * A plan already running or installed before (the primary included) is
     * switched back to, not added again, so a rollback names the plan it
     * returns to.  At most 64 distinct plans per run. */
    const px_sim_plan *install;
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

/* What an operator could observe of a running replication, handed to
 * on_tick (hooks version 2) every tick_s of simulated time.  Nothing here
 * names a fault: a lost device shows as heartbeats that stop, a slow link
 * as longer transfers, heat as a rising temperature.  Arrays are borrowed
 * for the call. */
typedef struct px_sim_obs_stage {
    uint32_t replica, stage; /* of the running plan */
    uint32_t n_steps;        /* steps that finished on this stage during the tick */
    double step_p50_s;       /* median compute time of those steps; NAN when none */
    /* Median over those steps of the compute time divided by the time the
     * plan predicts for the same batch (its tokens and context): 1 when the
     * stage runs as planned.  NAN when none. */
    double step_ratio_p50;
    double last_step_t; /* when a step last finished here (-1: never) */
    /* The hop to the next stage (none on the last stage: n_xfers 0). */
    uint32_t n_xfers;
    double xfer_p50_s;     /* median transfer time, latency included; NAN when none */
    double xfer_ratio_p50; /* ...over the time the plan predicts for those bytes */
    uint32_t link;         /* index into the running plan's links, or PX_SIM_NONE */
} px_sim_obs_stage;

typedef struct px_sim_obs_device {
    double temp_k;
    double power_w;
    double clock;            /* fraction of the full clock it runs at now */
    bool throttled;          /* its clock is held down by heat */
    double last_heartbeat_t; /* a device answers every tick while it lives */
} px_sim_obs_device;

/* A probe of one contention domain of the running plan or the primary
 * plan: the time a probe of probe_bytes would take on it now (latency
 * included), so a link the plan no longer uses can still be watched. */
typedef struct px_sim_obs_link {
    uint32_t plan; /* 0: the primary plan; else the running plan's index */
    uint32_t link; /* index into that plan's links */
    double probe_s, nominal_s;
    uint32_t n_flows; /* transfers in flight on it */
} px_sim_obs_link;

typedef struct px_sim_obs {
    double t, tick_s;
    const px_sim_plan *plan;        /* the plan running now */
    const px_sim_obs_stage *stages; /* every stage of every replica of it */
    uint32_t n_stages;
    const px_sim_obs_device *devices; /* the whole device table */
    uint32_t n_devices;
    const px_sim_obs_link *links;
    uint32_t n_links;
    double probe_bytes;
    /* Since the run began: */
    double tokens, completed, failed, requeued, arrivals;
    double tokens_lost; /* generated, then lost with the requests that failed or restarted */
    uint32_t queued, in_flight; /* now */
} px_sim_obs;

/* The hook table.  version is PX_SIM_HOOKS_VERSION; the table only grows
 * at the end, and a version 1 table (version, on_fault, ctx) still works.
 * on_fault (optional, NULL: no action) is called when a fault starts
 * (injected or random; not for losses its own actions cause) and fills
 * *action (pre-set to NONE); it must not call back into the simulator
 * except px_sim_now.  It is the ground truth: a healer that must detect
 * faults by observation uses it only to score itself and to record the
 * faults injected.
 *
 * Version 2 adds: on_begin (optional) at the start of each replication
 * with its index and seed; on_tick (optional) every tick_s (> 0) of
 * simulated time with what could be observed (px_sim_obs), filling
 * *action like on_fault; on_end (optional) when the replication ends,
 * with its figures. */
#define PX_SIM_HOOKS_VERSION 2
typedef struct px_sim_metrics px_sim_metrics;
typedef struct px_sim_hooks {
    int version;
    void (*on_fault)(void *ctx, const px_sim *sim, const px_sim_fault_event *ev,
                     px_sim_action *action);
    void *ctx;
    /* version 2 */
    double tick_s;
    void (*on_begin)(void *ctx, const px_sim *sim, uint32_t replication, uint64_t seed);
    void (*on_tick)(void *ctx, const px_sim *sim, const px_sim_obs *obs, px_sim_action *action);
    void (*on_end)(void *ctx, const px_sim *sim, const px_sim_metrics *m);
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
    /* (optional) called after each replication with how many are done
     * of how many, on the calling thread; NULL: none.  Not recorded. */
    void (*progress)(void *ctx, uint32_t done, uint32_t total);
    void *progress_ctx;
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

struct px_sim_metrics {
#define PX__SIM_FIELD(f, name, unit) double f;
    PX_SIM_METRICS(PX__SIM_FIELD)
#undef PX__SIM_FIELD
};

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
PX_NODISCARD px_status px_sim_run(const px_sim_plan *plan, const px_sim_load *load,
                                  const px_sim_faults *faults, const px_sim_options *options,
                                  px_sim_result *out, px_err *err);
void px_sim_result_release(px_sim_result *res); /* NULL is a no-op */

/* The result as JSON ("plexus.sim/1"): inputs' ids, per metric the mean
 * and interval and the per-replication values, per device figures.
 * Deterministic: the same result gives byte-identical canonical text.
 * New reference; NULL on allocation failure. */
json_t *px_sim_result_to_json(const px_sim_result *res, const px_sim_plan *plan);
/* A readable summary appended to out.  PX_ENOMEM. */
PX_NODISCARD px_status px_sim_result_report(const px_sim_result *res, const px_sim_plan *plan,
                                            px_strbuf *out);
/* The 97.5% quantile of Student's t with df degrees of freedom (df >= 1;
 * INFINITY for 0): px_stat_t_quantile(0.975, df). */
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
PX_NODISCARD px_status px_sim_options_from_json(const json_t *v, px_sim_options *opt, px_err *err);

/* ------------------------------------------------------------------ */
/* Policy comparison                                                   */
/* ------------------------------------------------------------------ */

/*
 * `plexus compare` runs several planning policies on the same scenarios
 * (docs/compare.md): each policy plans each scenario once, then every plan
 * is simulated under the same load, faults and seeds 1..N (common random
 * numbers), so differences between policies are paired by seed.  The
 * result separates model error (the plan's predicted TPOT against the
 * simulated one) from policy error (regret against the best policy on the
 * scenario, and the predicted gap to the exact optimum on small fleets).
 *
 *     px_sim_pack pack;
 *     if (px_sim_pack_load("data/packs/hetero.json", &pack, &err) != PX_OK) ...
 *     const char *policies[] = {"plexus", "llamacpp"};   // the first is the reference
 *     px_sim_compare_options opt;
 *     px_sim_compare_options_default(&opt);
 *     opt.policies = policies;
 *     opt.n_policies = 2;
 *     opt.seeds = 10;
 *     px_sim_comparison cmp;
 *     if (px_sim_compare(&pack, &opt, &cmp, &err) == PX_OK) {
 *         px_strbuf sb = PX_STRBUF_INIT;
 *         px_sim_comparison_report(&cmp, &sb);   // or _to_json, _svg
 *         ...
 *         px_strbuf_release(&sb);
 *         px_sim_comparison_release(&cmp);
 *     }
 *     px_sim_pack_release(&pack);
 */

#define PX_SIM_PACK_SCHEMA          "plexus.pack/1"
#define PX_SIM_COMPARE_SCHEMA       "plexus.compare/1"
#define PX_SIM_PACK_MAX_SCENARIOS   256
#define PX_SIM_COMPARE_MAX_POLICIES 16
#define PX_SIM_COMPARE_MAX_SEEDS    1000

/* One scenario of a pack (docs/formats/pack.md).  Strings belong to the
 * pack's arena; paths are already resolved against the pack's folder. */
typedef struct px_sim_scenario {
    const char *name;      /* unique within the pack */
    const char *inventory; /* path of a plexus.inventory/1 file */
    const char *model;     /* preset name or model file path ("llama-3-8b") */
    const char *load;      /* load spec; NULL: Poisson sized to the plans */
    const char *objective; /* planner objective name ("latency") */
    const char *slo;       /* "tpot=50ms,ttft=500ms" or NULL */
    const char *faults;    /* plexus.faults/1 path or NULL */
    uint32_t context, prompt_tokens, gen_tokens;
    uint32_t batch; /* 0: the planner chooses */
} px_sim_scenario;

typedef struct px_sim_pack {
    px_sim_scenario *scenarios;
    size_t n_scenarios;
    px_arena *arena;
} px_sim_pack;

/* Reads a pack of len bytes (borrowed; need not be NUL-terminated) named
 * path: a plexus.pack/1 document, or a plain plexus.inventory/1 document
 * (one scenario with the defaults of docs/formats/pack.md, inventory =
 * path).  Relative paths inside resolve against path's folder.  Bounded
 * (1 MiB, depth 8, 256 scenarios) and strict: unknown members, duplicate
 * names, bad objectives, SLOs, load specs and numbers out of range are
 * refused with "path: /scenarios/2/objective: ..." and the fix.  On
 * success `out` owns its strings (px_sim_pack_release).  PX_EPARSE,
 * PX_ELIMIT, PX_ENOMEM. */
PX_NODISCARD px_status px_sim_pack_parse(const char *text, size_t len, const char *path,
                                         px_sim_pack *out, px_err *err);
/* Reads the file at path (at most 1 MiB) and parses it.  PX_ENOTFOUND and
 * PX_EIO from reading as well. */
PX_NODISCARD px_status px_sim_pack_load(const char *path, px_sim_pack *out, px_err *err);
/* Frees the pack's strings and zeroes it.  NULL is a no-op. */
void px_sim_pack_release(px_sim_pack *pack);

/* The figures compared: X(enum suffix, name, unit, higher is better). */
#define PX_SIM_CMP_METRICS(X)                           \
    X(TPOT_P50, "tpot_p50_s", "s", false)               \
    X(TPOT_P99, "tpot_p99_s", "s", false)               \
    X(TTFT_P99, "ttft_p99_s", "s", false)               \
    X(TOKENS_PER_S, "tokens_per_s", "1/s", true)        \
    X(JOULES_PER_TOKEN, "joules_per_token", "J", false) \
    X(USD_PER_MTOKEN, "usd_per_mtoken", "$", false)     \
    X(FAILED, "failed", "", false)

typedef enum px_sim_cmp_metric {
#define PX__SIM_CMP_ENUM(e, name, unit, higher) PX_SIM_CMP_##e,
    PX_SIM_CMP_METRICS(PX__SIM_CMP_ENUM)
#undef PX__SIM_CMP_ENUM
        PX_SIM_CMP_COUNT_
} px_sim_cmp_metric;

/* "tpot_p50_s", ...; "unknown" out of range. */
const char *px_sim_cmp_metric_name(px_sim_cmp_metric m);
bool px_sim_cmp_metric_higher_is_better(px_sim_cmp_metric m);
/* PX_EINVAL listing the names. */
PX_NODISCARD px_status px_sim_cmp_metric_parse(const char *text, px_sim_cmp_metric *out,
                                               px_err *err);

/* The mean of n paired differences and its 95% Student-t interval.
 * significant: the interval excludes 0.  With no spread (every difference
 * equal) the interval is the point; with fewer than two pairs it is
 * unbounded (lo = -inf, hi = +inf) unless the one difference is 0. */
typedef struct px_sim_paired {
    double mean, lo, hi;
    uint32_t n; /* pairs used */
    bool significant;
} px_sim_paired;

/* Pairs a[i] - b[i] over i < n, leaving out pairs where either side is
 * not finite (a run with no completed request has no TPOT).  a and b are
 * borrowed.  Never fails; n = 0 gives mean NAN and no significance. */
void px_sim_paired_diff(const double *a, const double *b, size_t n, px_sim_paired *out);

typedef struct px_sim_compare_options {
    /* Borrowed; 1..16 names, the first is the reference.  A name may
     * repeat: a policy against itself must show no difference at all. */
    const char *const *policies;
    size_t n_policies;
    uint32_t seeds;           /* seeds 1..seeds (10); at most 1000 */
    double duration_s;        /* simulated time per seed; 0 (default): sized to the load */
    px_sim_cmp_metric metric; /* the figure regret and "best" use (TPOT_P50) */
    /* true (default): each scenario is judged on its objective's own
     * figure (latency: tpot_p50_s, ttft: ttft_p99_s, throughput:
     * tokens_per_s, tokens_per_dollar: usd_per_mtoken, joules_per_token:
     * joules_per_token) and `metric` only for the plot; false: on
     * `metric` everywhere (the CLI's --metric). */
    bool metric_by_objective;
    const char *faults;   /* borrowed path; replaces every scenario's faults; NULL */
    bool random_failures; /* draw failures from MTBFs (true) */
    /* The exact yardstick (px_plan_exact) on fleets of at most this many
     * devices: 6 by default (seconds); up to 8 (minutes); 0: off. */
    uint32_t exact_max_devices;
    /* (optional) called on the calling thread before each long step with
     * what it is ("scenario S: policy P (2 of 5)"); NULL: none. */
    void (*progress)(void *ctx, const char *step);
    void *progress_ctx;
} px_sim_compare_options;

void px_sim_compare_options_default(px_sim_compare_options *opt);

/* One policy on one scenario. */
typedef struct px_sim_policy_outcome {
    const char *policy;
    bool feasible;      /* false: no plan, or one the simulator refused */
    const char *reason; /* why not, when not feasible; else NULL */
    const char *plan_id;
    uint32_t n_devices, n_stages, n_replicas, batch;
    double predicted_tpot_p50_s; /* the plan's own p50 */
    double predicted_tokens_per_s;
    double *samples;                       /* seeds x PX_SIM_CMP_COUNT_, seed-major */
    px_sim_ci stats[PX_SIM_CMP_COUNT_];    /* over seeds (finite values) */
    px_sim_paired diff[PX_SIM_CMP_COUNT_]; /* this minus the reference, by seed */
    double model_error;                    /* simulated TPOT p50 mean / predicted - 1 */
    double regret;    /* against the scenario's best policy on the metric (>= 0) */
    double exact_gap; /* predicted TPOT / exact optimum - 1; NAN when not computed */
} px_sim_policy_outcome;

typedef struct px_sim_scenario_outcome {
    const char *name;
    const char *load;   /* the load spec used */
    const char *faults; /* the faults file used, or NULL */
    const char *objective;
    size_t n_devices; /* devices of the inventory */
    double duration_s;
    double exact_tpot_s;             /* px_plan_exact's optimum; NAN when not computed */
    const char *best;                /* the best policy on the metric; NULL when none is feasible */
    px_sim_policy_outcome *policies; /* in the order of the options */
    px_sim_cmp_metric metric;        /* the figure "best" and regret use here */
} px_sim_scenario_outcome;

/* One policy over every scenario. */
typedef struct px_sim_policy_overall {
    const char *policy;
    /* this / reference - 1 per (scenario, seed) pair, pooled: a relative
     * paired difference that does not mix the scenarios' scales. */
    px_sim_paired rel_diff[PX_SIM_CMP_COUNT_];
    double mean_regret; /* over the scenarios where it is feasible */
    uint32_t wins;      /* scenarios where it is (tied) best */
    uint32_t n_feasible;
} px_sim_policy_overall;

/* A whole comparison.  Value struct; px_sim_comparison_release frees it. */
typedef struct px_sim_comparison {
    const char **policies;
    size_t n_policies;
    uint32_t seeds;
    px_sim_cmp_metric metric;
    px_sim_scenario_outcome *scenarios;
    size_t n_scenarios;
    px_sim_policy_overall *overall; /* n_policies */
    px_arena *arena;
} px_sim_comparison;

/* Plans every scenario with every policy (once; fallbacks off), simulates
 * each plan for seeds 1..N under the scenario's load and faults, and
 * computes the statistics above.  pack and opt are borrowed.  A policy
 * that finds no plan is reported infeasible, not an error.  On success
 * `out` owns everything (px_sim_comparison_release).  Deterministic: the
 * same inputs give identical numbers.  PX_EINVAL for bad options (unknown
 * policy, seeds out of range); the inventory, model, faults and
 * simulator errors prefixed with the scenario's name; PX_ENOMEM.
 * Distinct comparisons may run in parallel. */
PX_NODISCARD px_status px_sim_compare(const px_sim_pack *pack, const px_sim_compare_options *opt,
                                      px_sim_comparison *out, px_err *err);
void px_sim_comparison_release(px_sim_comparison *c); /* NULL is a no-op */

/* The comparison as a plexus.compare/1 document (docs/compare.md):
 * per scenario and policy the samples, means, intervals, paired
 * differences, model and policy error; the overall figures.  Numbers
 * rounded to 10 significant digits; infinities and NaN become null.
 * New reference; NULL on allocation failure. */
json_t *px_sim_comparison_to_json(const px_sim_comparison *c);
/* Tables per scenario and overall, appended to out.  PX_ENOMEM. */
PX_NODISCARD px_status px_sim_comparison_report(const px_sim_comparison *c, px_strbuf *out);
/* A box and strip plot of metric's distribution over seeds, one panel per
 * scenario and one row per policy: plain, deterministic SVG.  PX_ENOMEM. */
PX_NODISCARD px_status px_sim_comparison_svg(const px_sim_comparison *c, px_sim_cmp_metric metric,
                                             px_strbuf *out);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_SIM_H */
