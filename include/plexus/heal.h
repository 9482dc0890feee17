/*
 * plexus/heal.h: self-healing.
 *
 * A loop over a running plan, in the simulator or in a real run:
 *
 *     observe -> detect -> localize -> candidates -> validate (simulator,
 *     contract, SLO) -> canary the safest -> expand or roll back
 *                                             -> incident record
 *
 * Faults come from a taxonomy (px_heal_fault_class).  Detection compares
 * what is observed with an envelope: the plan's predicted intervals, and
 * the run's own baseline (its first steps), so that a departure that
 * starts mid-run (a fault) is told apart from one present from the start
 * (a stale or lying topology report).  Localization tells a link from a
 * stage's compute from a device, from per-stage compute and per-hop
 * transfer times.  Mitigations are typed plan changes, never code: drop a
 * device and repartition, reroute, rebatch, change the parallel layout,
 * lower precision where the contract allows, pace for thermal headroom,
 * restart an isolated worker, fall back to a slower verified plan.  Each
 * candidate is simulated under the conditions observed and checked against
 * the contract and the SLO; the rejected ones keep their reason.  The
 * chosen one is canaried: its first steps are compared with its predicted
 * interval, and it is rolled back when they depart.  Hysteresis (separate
 * enter and exit thresholds and a minimum dwell) keeps two adaptations from
 * alternating.  Every incident is written as a `plexus.incident/1` record
 * (docs/formats/incident.md).
 *
 * Planned adaptations (contention, thermal pacing) and fault recovery are
 * kept apart: an incident says which it is (`kind`: "adaptation" or
 * "recovery") and its cause.
 *
 * Thread safety: objects here are used by one thread at a time.
 */
#ifndef PLEXUS_HEAL_H
#define PLEXUS_HEAL_H

#include "plexus/base.h"
#include "plexus/contract.h"
#include "plexus/hw.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/rt.h"
#include "plexus/sim.h"
#include "plexus/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Fault taxonomy                                                      */
/* ------------------------------------------------------------------ */

typedef enum px_heal_fault_class {
    PX_HEAL_NONE = 0,
    PX_HEAL_DEVICE_LOSS,     /* a device (its worker) is gone */
    PX_HEAL_DOMAIN_LOSS,     /* every device of a failure domain (a rack) */
    PX_HEAL_LINK_DEGRADE,    /* latency, bandwidth, loss; possibly intermittent */
    PX_HEAL_LINK_LOSS,       /* a link went away */
    PX_HEAL_INTERFERENCE,    /* a link shared with an unrelated flow */
    PX_HEAL_THERMAL,         /* a device slowing down as it heats */
    PX_HEAL_MEMORY_PRESSURE, /* a device's free memory below the plan's need */
    PX_HEAL_CORRUPTION,      /* silent numerical corruption by one backend */
    PX_HEAL_CRASH,           /* a worker process crashed */
    PX_HEAL_HANG,            /* a worker answers nothing */
    PX_HEAL_STALE_TOPOLOGY,  /* the inventory's figures do not match reality */
    PX_HEAL_FAULT_CLASS_COUNT_
} px_heal_fault_class;

/* "none", "device-loss", "domain-loss", "link-degrade", "link-loss",
 * "interference", "thermal", "memory-pressure", "corruption", "crash",
 * "hang", "stale-topology". */
const char *px_heal_fault_class_name(px_heal_fault_class c);

/* Where a fault is. */
typedef enum px_heal_locus_kind {
    PX_HEAL_AT_NOTHING = 0,
    PX_HEAL_AT_DEVICE,  /* stage's device (the process or the hardware) */
    PX_HEAL_AT_COMPUTE, /* stage's compute is slow, its links are not */
    PX_HEAL_AT_LINK,    /* the hop from stage `stage` to `to` */
    PX_HEAL_AT_DOMAIN,  /* a failure domain */
} px_heal_locus_kind;

typedef struct px_heal_locus {
    px_heal_locus_kind kind;
    uint32_t stage;  /* DEVICE, COMPUTE, LINK: the stage (LINK: the sender;
                        n_stages for the executor's hop into stage 0) */
    uint32_t to;     /* LINK: the receiving stage; n_stages: the executor */
    char device[96]; /* DEVICE, COMPUTE: the device id; LINK: "a>b" ids;
                        DOMAIN: the domain id */
} px_heal_locus;

/* "nothing", "device", "compute", "link", "domain". */
const char *px_heal_locus_kind_name(px_heal_locus_kind k);
/* {"kind", "stage", "to", "device"} (stage and to only where they apply).
 * New reference; NULL on allocation failure. */
json_t *px_heal_locus_to_json(const px_heal_locus *l);

/* ------------------------------------------------------------------ */
/* Injection into real runs                                            */
/* ------------------------------------------------------------------ */

/* A fault to inject into a real run, from `plexus run --inject SPEC`:
 *
 *     KIND:TARGET[:PARAM=VALUE,...]@WHEN
 *
 *   kill:stage1@token20                        device loss (SIGKILL)
 *   stop:stage1@token20                        hang (SIGSTOP)
 *   crash:stage0@token5                        the worker aborts
 *   link:stage0>stage1:latency=5ms@token10     link degradation; also
 *       bandwidth=1MB/s, loss=0.05, flip=0.01, period=200ms, duty=0.5, cut
 *   slow:stage1:factor=4,tau=500ms@token5      thermal throttling
 *   corrupt:stage1:magnitude=0.5,layer=1@token12   silent corruption
 *   memory:stage1:bytes=64MiB@token3           memory pressure
 *   clear:stage1@token30                       the stage's faults end
 *
 * A target is "stageN" or a device id of the plan ("local.emu-a"); a link
 * is "A>B" with B the next stage (or "executor" after the last).  WHEN is
 * "tokenN": before the first step begun once N tokens were produced (all
 * prompts together; token0 is before the first step). */
typedef struct px_heal_inject {
    px_rt_fault fault; /* kind and parameters; stage resolved later */
    char target[96];   /* as written: "stage1", "local.emu-a" */
    char link_to[96];  /* link faults: the receiving end as written */
    uint64_t at_token;
    char text[256]; /* the spec as given */
} px_heal_inject;

/* Parameters by kind (durations "5ms", "500us", "2s"; sizes "64MiB",
 * "1GB" or plain bytes; bandwidth "1MB/s"; docs/formats/inject.md):
 *   link:    latency (0..60s), bandwidth (>0), loss [0,0.999],
 *            flip [0,1], period (>0..1h), duty (0,1] (needs period;
 *            0.5 with period alone), resend (0..60s), seed (< 2^63), cut;
 *            at least one of latency, bandwidth, loss, flip, cut
 *   slow:    factor [1,1000] (required), tau (0..1h)
 *   corrupt: magnitude (0,1e6] (required), layer (-1..1000000), seed
 *   memory:  bytes (1 B..16 TiB, required)
 *   kill, stop, crash, clear: none
 * A spec is at most 255 bytes; N in tokenN at most 10^15. */
/* Parses one spec (borrowed).  Errors: PX_EINVAL naming the spec, the
 * part that is wrong and the accepted forms. */
PX_NODISCARD px_status px_heal_inject_parse(const char *spec, px_heal_inject *out, px_err *err);
/* Resolves the target against the pipeline that runs now: fills
 * out->stage (a device id names the stage that holds it).  Errors:
 * PX_ENOTFOUND naming the target and the stages there are; PX_EINVAL for
 * a link whose receiving end is not the sender's next hop. */
PX_NODISCARD px_status px_heal_inject_resolve(const px_heal_inject *in,
                                              const px_rt_pipeline_spec *spec, px_rt_fault *out,
                                              px_err *err);
/* The inject as JSON (for traces and incidents): {"text", "spec" (the
 * canonical spec, which parses back to the same inject), "kind",
 * "target", "link_to"?, "at_token", and the parameters in SI units}.
 * New reference; NULL on allocation failure. */
json_t *px_heal_inject_to_json(const px_heal_inject *in);
/* Writes the canonical spec of an inject ("link:stage0>stage1:
 * latency=5ms@token10") to buf (cap bytes, cut and terminated).  Returns
 * the length it needed, like snprintf. */
size_t px_heal_inject_format(const px_heal_inject *in, char *buf, size_t cap);

/* ------------------------------------------------------------------ */
/* Detection and localization                                          */
/* ------------------------------------------------------------------ */

/* Per stage and per hop, what the plan predicted (seconds per decode
 * step); NAN when unknown. */
typedef struct px_heal_envelope {
    uint32_t n_stages;
    double compute_p50[PX_RT_MAX_STAGES], compute_hi[PX_RT_MAX_STAGES];
    double xfer_p50[PX_RT_MAX_STAGES + 1],
        xfer_hi[PX_RT_MAX_STAGES + 1]; /* into stage i;
                                           [n]: to the executor */
    char device[PX_RT_MAX_STAGES][64]; /* each stage's device id, for loci and
                                          evidence ("" reads as "stageN") */
    /* What one more attended position adds to each stage's step (the
     * plan's attention_s_per_position); 0 or NAN: not known. */
    double attention_pos_s[PX_RT_MAX_STAGES];
    /* Whether each stage's kernels run on its host's cores (the cpu and
     * emulated devices): the detector allows its compute the host's
     * stretch (px_heal_detector_opts.host_stretch). */
    bool host_cores[PX_RT_MAX_STAGES];
} px_heal_envelope;

/* Builds the envelope from a pipeline spec's predictions (borrowed): the
 * stages' decode intervals and time per attended position; hops are
 * unknown (NAN) since a pipeline spec carries no per-hop prediction. */
void px_heal_envelope_from_spec(const px_rt_pipeline_spec *spec, px_heal_envelope *out);

typedef struct px_heal_detector_opts {
    uint32_t baseline_steps; /* decode steps that form the run's baseline (8) */
    double ratio;            /* a departure: observed over baseline above this (2.0) */
    double floor_s;          /* ...and by at least this much (0.0005 s) */
    uint32_t confirm;        /* consecutive departing steps to confirm (3) */
    double stale_ratio;      /* baseline over the plan's hi above this: stale (3.0) */
    /* How much slower a stage whose kernels run on the host's cores may
     * run than its baseline when the host is shared, before it departs:
     * its compute departs above ratio x host_stretch (1: none; at most
     * 64).  Stage workers, emulated devices and other replicas sharing a
     * host's cores slow each other as the load moves between them; that
     * is the host's, not a device fault. */
    double host_stretch;
} px_heal_detector_opts;

void px_heal_detector_opts_default(px_heal_detector_opts *o);

/* One decode step's timings, seconds. */
typedef struct px_heal_sample {
    uint64_t step;
    double t_s; /* run time at the step */
    uint32_t n_stages;
    double compute_s[PX_RT_MAX_STAGES];
    double xfer_s[PX_RT_MAX_STAGES + 1]; /* into stage i; [n]: to the executor */
    uint32_t rows; /* rows the step carried (sequences' tokens); 0: not known */
    /* Cache positions the step's rows attended to (each sequence's
     * position plus its tokens, summed); 0: not known.  Recorded in
     * traces; the detector expects a stage's attention to grow with it
     * (see observe). */
    uint64_t context;
    /* Of compute_s[i], the time stage i waited runnable for a core: the
     * host's other work, not the stage's device (0: none or not known). */
    double wait_s[PX_RT_MAX_STAGES];
    /* Of xfer_s[i], the time its receiver waited runnable for a core
     * ([n]: the executor's receiving thread, for the hop back to it). */
    double xfer_wait_s[PX_RT_MAX_STAGES + 1];
} px_heal_sample;

/* Fills a sample from a runtime step observation. */
void px_heal_sample_from_obs(const px_rt_step_obs *obs, double t_s, px_heal_sample *out);

typedef struct px_heal_finding {
    px_heal_fault_class cls; /* LINK_DEGRADE, THERMAL (compute slowing),
                                STALE_TOPOLOGY, or NONE */
    px_heal_locus locus;
    double ratio;        /* observed over baseline (or baseline over plan) */
    double baseline_s;   /* of the departing signal */
    double observed_s;   /* median of the confirming steps */
    uint64_t onset_step; /* first departing step */
    uint64_t confirmed_step;
    bool intermittent;    /* departures come and go */
    char evidence[320];   /* readable: what departed, by how much, since when */
    double onset_t_s;     /* the samples' t_s at onset_step */
    double confirmed_t_s; /* ...and at confirmed_step */
} px_heal_finding;

typedef struct px_heal_detector px_heal_detector;

/* env is copied.  Returns owned (px_heal_detector_free).  PX_EINVAL,
 * PX_ENOMEM. */
PX_NODISCARD px_status px_heal_detector_new(const px_heal_envelope *env,
                                            const px_heal_detector_opts *o, px_heal_detector **out,
                                            px_err *err);
void px_heal_detector_free(px_heal_detector *d); /* NULL is a no-op */
/* Feeds one decode step (s borrowed; a sample whose n_stages differs from
 * the envelope's, or a non-finite time, is ignored for that signal).
 * Returns true and fills *f when a finding is confirmed: a signal is
 * confirmed after `confirm` consecutive departing steps, or, when it
 * departs intermittently (two or more onsets within the last
 * max(8, 4 * confirm) steps, at most 64), after 2 * confirm departures
 * within them (then `intermittent` is set).  Each signal (a
 * stage's compute, a hop's transfer) reports at most once until
 * px_heal_detector_rebase; several confirmed in one step are reported on
 * this and the following calls, in signal order (hops first, then
 * compute).  STALE_TOPOLOGY is reported when the baseline completes, for
 * the signal whose baseline exceeds the plan's hi the most.
 * Stages share a host when their device ids ("node.device") name one
 * node: a step in which two or more stages of one host depart is that
 * host's contention (its cores shared), not a device or link fault, so
 * neither its stages nor the hops between them (or to the executor)
 * count it as a departure.  A host with one stage cannot tell the two
 * apart: its departures count.  Hops between stages of one host (and,
 * when every stage is on one host, the hops to and from the executor)
 * are loopback: no link of their own, only the host's cores and memory.
 * Two or more of them departing in one step are the host's contention
 * too; one alone still counts, as a slow link would.
 * A stage's compute (a hop) is judged without the time its (receiving)
 * thread waited runnable for a core (wait_s, xfer_wait_s): that time is
 * the host's other work holding the cores, measured by the kernel, not
 * the device or the link slowing.
 * Rows: a step costs more the more rows it carries, so a signal's
 * expected time is its baseline times the step's rows over the rows of
 * its baseline steps (their median), when that is above 1 and both are
 * known; each observed time is scaled back by it before it is compared,
 * kept, or reported (observed_s, evidence).  This is the bound of any
 * cost that is a fixed time plus a time per row: a step taking
 * proportionally longer for proportionally more rows departs from
 * nothing.  floor_s is a margin on the step as it ran: the observed time
 * must exceed the expected one by that much.
 * Attended positions: a stage's attention grows with the cache positions
 * its rows attend (context), at constant rows.  When the envelope knows
 * the stage's time per attended position (attention_pos_s, from the
 * plan's cost model) and the samples their context, the stage's
 * expected time also grows by that time for every position past those
 * the baseline steps attended (their median, times the rows' factor
 * above); never by more per position than the whole baseline step over
 * its positions, and never below the rows' expectation.  A step whose
 * positions grow as its cost model says departs from nothing; a slowdown
 * at constant positions still does.  Hops are not scaled by it.
 * Deterministic: the same samples give the same findings. */
bool px_heal_detector_observe(px_heal_detector *d, const px_heal_sample *s, px_heal_finding *f);
/* Starts a new baseline (after a plan change) with a new envelope. */
void px_heal_detector_rebase(px_heal_detector *d, const px_heal_envelope *env);
/* The finding as JSON: {"class", "locus", "ratio", "baseline_s",
 * "observed_s", "onset_step", "confirmed_step", "onset_t_s",
 * "confirmed_t_s", "intermittent", "evidence"}.  New reference; NULL on
 * allocation failure. */
json_t *px_heal_finding_to_json(const px_heal_finding *f);

/* ------------------------------------------------------------------ */
/* Hysteresis                                                          */
/* ------------------------------------------------------------------ */

/* Adapt when the signal (a ratio over baseline) stays above `enter`;
 * revert only when it stays below `exit` (< enter) and at least
 * `min_dwell_s` passed since the last change.  A signal that alternates
 * around one threshold therefore causes one change, not a change per
 * swing. */
typedef struct px_heal_hysteresis {
    double enter, exit, min_dwell_s;
    bool adapted;
    double last_change_s;
    uint32_t changes;
} px_heal_hysteresis;

typedef enum px_heal_hyst_verdict {
    PX_HEAL_HYST_STAY = 0,
    PX_HEAL_HYST_ADAPT,
    PX_HEAL_HYST_REVERT,
} px_heal_hyst_verdict;

/* Starts not adapted, no change yet (last_change_s 0).  exit is lowered
 * to enter when given above it. */
void px_heal_hysteresis_init(px_heal_hysteresis *h, double enter, double exit, double min_dwell_s);
/* One observation at run time t_s: ADAPT when not adapted and signal >
 * enter; REVERT when adapted, signal < exit and t_s - last_change_s >=
 * min_dwell_s; else STAY (also for a non-finite signal). */
px_heal_hyst_verdict px_heal_hysteresis_update(px_heal_hysteresis *h, double t_s, double signal);

/* ------------------------------------------------------------------ */
/* Mitigations: candidates and their validation                        */
/* ------------------------------------------------------------------ */

/* From a finding to a chosen mitigation:
 *
 *     px_heal_context ctx = {.graph = graph, .model = model,
 *                            .contract = contract,  // NULL: implied
 *                            .current_plan = plan_doc, .request = req,
 *                            .slo = {.tpot_s = 0.05}, .seed = 1};
 *     px_heal_candidate *c;
 *     size_t n;
 *     int chosen;
 *     px_heal_candidates(&ctx, plan_doc, f.cls, &f.locus, lost, n_lost,
 *                        &c, &n, &err);
 *     px_heal_validate(&ctx, c, n, conditions, &chosen, &err);
 *     // c[chosen].plan (NULL: keep plan_doc, paced to c[chosen].max_batch
 *     // for PACE, or restart the worker for RESTART_WORKER)
 *     px_heal_candidates_free(c, n);
 */

typedef enum px_heal_action {
    PX_HEAL_ACT_NONE = 0,        /* keep the plan (the fault is tolerable) */
    PX_HEAL_ACT_REPARTITION,     /* drop a device, plan again without it */
    PX_HEAL_ACT_REROUTE,         /* avoid a link, plan again without it */
    PX_HEAL_ACT_REBATCH,         /* change the batch or micro-batches */
    PX_HEAL_ACT_RELAYOUT,        /* change the parallel layout */
    PX_HEAL_ACT_LOWER_PRECISION, /* where the contract allows */
    PX_HEAL_ACT_PACE,            /* admit less, for thermal headroom */
    PX_HEAL_ACT_RESTART_WORKER,  /* same plan, a fresh worker process */
    PX_HEAL_ACT_FALLBACK_PLAN,   /* a slower verified plan */
    PX_HEAL_ACTION_COUNT_
} px_heal_action;

/* "none", "repartition", "reroute", "rebatch", "relayout",
 * "lower-precision", "pace", "restart-worker", "fallback-plan". */
const char *px_heal_action_name(px_heal_action a);

typedef struct px_heal_candidate {
    px_heal_action action;
    char label[192];    /* "drop local.emu-a, plan again: cpu + local.emu-b" */
    json_t *plan;       /* owned plexus.plan/1 document; NULL for NONE, PACE,
                           RESTART_WORKER (the current plan stays) */
    uint32_t max_batch; /* PACE: sequences admitted */
    /* Validation (px_heal_validate): */
    bool validated;
    double tpot_p50_s, tpot_p99_s; /* simulated under the observed conditions */
    double throughput;             /* tokens/s */
    bool feasible, contract_ok, slo_ok;
    bool accepted;
    char reject_code[32];    /* "infeasible", "contract", "tail-latency",
                                "slo", "worse", "unstable" */
    char reject_reason[256]; /* readable, with the figures */
    /* Set by px_heal_candidates when it found the candidate infeasible
     * (no placement; pacing below one sequence): px_heal_validate keeps
     * that rejection and its reason instead of judging it again. */
    bool infeasible_at_generation;
} px_heal_candidate;

/* Releases the candidates' plans and the array.  NULL is a no-op. */
void px_heal_candidates_free(px_heal_candidate *c, size_t n);

/* What mitigations are planned and judged with.  All borrowed. */
typedef struct px_heal_context {
    const px_hw_graph *graph;
    const json_t *current_plan; /* the plan running now: NONE, PACE and
                                   RESTART_WORKER are validated on it, and
                                   its load and throughput are the
                                   yardstick (NULL: those candidates are
                                   rejected "infeasible") */
    const px_ir_model *model;
    const px_contract *contract; /* NULL: the implied contract */
    px_plan_request request;     /* the request the current plan came from
                                    (graph, model, contract are set from the
                                    fields above) */
    px_plan_slo slo;             /* what a candidate must meet (0: none) */
    uint64_t seed;               /* of the validation's simulations */
    uint32_t replications;       /* per candidate (3) */
    double duration_s;           /* simulated per replication (30) */
} px_heal_context;

/* The candidates for a finding on the current plan (borrowed), with the
 * devices already lost (names, may be NULL).  Deterministic.  Returns an
 * owned array (px_heal_candidates_free).  PX_ENOMEM; the planner's
 * PX_EINVAL; PX_EINVAL for a lost device, locus device or domain the
 * graph lacks.  Devices the request already excludes stay excluded.
 * Per class (in this order):
 *   device-loss, corruption: REPARTITION without the device(s),
 *     FALLBACK_PLAN (the best single-device plan on the rest);
 *   crash, hang: the same plus RESTART_WORKER (same plan);
 *   domain-loss: REPARTITION without every device of the domain (and of
 *     the domains under it), FALLBACK_PLAN;
 *   link-degrade, interference: REROUTE without the sender's device,
 *     REROUTE without the receiver's, NONE, LOWER_PRECISION;
 *   link-loss: the two REROUTEs;
 *   thermal, memory-pressure: PACE (max_batch halved), REPARTITION
 *     without the device, LOWER_PRECISION;
 *   stale-topology: REPARTITION without the misreported device (both
 *     ends for a link), NONE;
 *   none: NONE.
 * A candidate the planner finds no placement for keeps plan NULL and is
 * rejected "infeasible" with the planner's reason.  LOWER_PRECISION is
 * planned under the built-in "relaxed" contract and offered only when
 * that plan lowers a precision; px_heal_validate judges it against the
 * real one. */
PX_NODISCARD px_status px_heal_candidates(const px_heal_context *ctx, const json_t *current_plan,
                                          const px_heal_fault_class cls, const px_heal_locus *where,
                                          const char *const *lost, size_t n_lost,
                                          px_heal_candidate **out, size_t *n_out, px_err *err);
/* Simulates each candidate under `conditions` (the faults observed, as a
 * faults document; may be NULL), checks it against the contract and the
 * SLO (p99 time per token and throughput), and marks it accepted or
 * rejected with a reason.  Sets *chosen to the index of the safest
 * accepted one (highest simulated p99 margin to the SLO, then lowest p99
 * time per token, then the lowest index), or -1 when none is.
 *
 * Each simulation: ctx->seed, ctx->replications (0: 3) of
 * ctx->duration_s (0: 30 s), no random failures; the conditions' faults
 * whose targets the candidate's plan does not know are left out for it.
 * The load is the same for every candidate: Poisson arrivals of the
 * request's prompt and generation lengths at the rate that keeps 80% of
 * the current plan's sequences in flight (Little's law on its predicted
 * TTFT and TPOT), i.e. the load the current plan was serving (without a
 * current plan, the first candidate's plan sizes it).
 * Reject codes: "infeasible" (no plan, or it completes nothing under the
 * conditions), "contract" (its contract verdict is forbidden, or it was
 * planned under another contract and lowers a precision this one
 * forbids), "tail-latency" (beats the current throughput but its p99 TPOT
 * breaks the SLO), "slo" (p99 TPOT or TTFT over the SLO otherwise).
 * c is borrowed and updated in place.  Errors: PX_EINVAL (bad context),
 * PX_ENOMEM; a candidate's own failure is a rejection, not an error. */
PX_NODISCARD px_status px_heal_validate(const px_heal_context *ctx, px_heal_candidate *c, size_t n,
                                        const px_sim_faults *conditions, int *chosen, px_err *err);
/* A candidate as JSON (for incidents and traces): {"action", "label",
 * "plan" (the plan's id or null), "max_batch", "validated", "tpot_p50_s",
 * "tpot_p99_s", "throughput" (null unless validated), "feasible",
 * "contract_ok", "slo_ok", "accepted", "reject_code", "reject_reason"
 * (null when accepted)}.  New reference; NULL on allocation failure. */
json_t *px_heal_candidate_to_json(const px_heal_candidate *c);

/* ------------------------------------------------------------------ */
/* Canary                                                              */
/* ------------------------------------------------------------------ */

/* The first steps after a change, against the change's prediction: the
 * canary passes when at least `need` steps were seen and the median of
 * the last `need` lies at most hi * tolerance (faster than predicted
 * passes; with no finite hi the p50 stands in, with neither it passes);
 * it fails as soon as that median lies above.  need is clamped to 1..64,
 * a tolerance that is not above 0 reads as 1; non-finite observations
 * are ignored. */
typedef struct px_heal_canary {
    double pred_p50_s, pred_hi_s, tolerance;
    uint32_t need, seen;
    double samples[64];
} px_heal_canary;

typedef enum px_heal_canary_verdict {
    PX_HEAL_CANARY_PENDING = 0,
    PX_HEAL_CANARY_PASS,
    PX_HEAL_CANARY_FAIL,
} px_heal_canary_verdict;

void px_heal_canary_begin(px_heal_canary *c, double pred_p50_s, double pred_hi_s, uint32_t need,
                          double tolerance);
px_heal_canary_verdict px_heal_canary_observe(px_heal_canary *c, double observed_s);
double px_heal_canary_median(const px_heal_canary *c);

/* ------------------------------------------------------------------ */
/* Incidents                                                           */
/* ------------------------------------------------------------------ */

#define PX_HEAL_INCIDENT_SCHEMA "plexus.incident/1"

/* Checks an incident record (borrowed; docs/formats/incident.md): every
 * member present, every candidate with a reason when rejected, the choice
 * among them (index -1 only when no candidate was accepted).  Returns true
 * when complete; otherwise names the first missing or malformed field (a
 * JSON pointer) in *err (PX_EVALIDATE).  Used to measure explanation
 * completeness. */
bool px_heal_incident_complete(const json_t *incident, px_err *err);

/* ------------------------------------------------------------------ */
/* Healing in the simulator                                            */
/* ------------------------------------------------------------------ */

/* A healer for the simulator (heal_sim*.c): a px_sim_hooks table that
 * decides from what an operator could observe (px_sim_obs every tick),
 * never from being told.  A device or a failure domain is lost when its
 * heartbeats stay silent for heartbeat_timeout_s (every member of a
 * domain at once: the domain, replanned without all of it at once); a
 * link degrades when a hop's transfer times depart from the run's
 * baseline (interference when the hop crosses a contention domain that
 * other traffic shares); a stage's compute slows when its step times
 * depart; a device heats toward its limit when the trajectory
 * T(t) = T_ss + (T0 - T_ss) exp(-t / tau), fitted with the device's time
 * constant on its recent temperatures, reaches the limit within
 * thermal_horizon_s.  The finding is localized, its candidates planned
 * (px_heal_candidates on the inventory), validated (px_heal_validate; a
 * candidate that still runs the hot device past its limit is rejected
 * "unstable"), and the chosen one installed through SWITCH_PLAN after
 * switch_s (or PACE).  Its first ticks are canaried (observed step time
 * over the candidate's prediction); a departing canary rolls on to the
 * next accepted candidate or back to the plan left.  Adaptations to a
 * link that heals (intermittent degradation) are reverted through
 * hysteresis on the link's probes.  The on_fault ground truth only scores
 * the incidents (time to detect, the fault matched); there the healer
 * asks the engine to requeue the requests a lost replica held, the front
 * end's retry policy rather than a decision about the fault.
 *
 * Every incident becomes a plexus.incident/1 record (time to detect, to
 * mitigate, RTO, lost work); with a trace writer every decision is
 * recorded as a mitigation ("heal-sim.decision") whose inputs (the
 * observation window, the thresholds, the candidates' validated figures)
 * let px_heal_sim_replay_derivers recompute it.
 *
 *     px_heal_sim_opts ho;
 *     px_heal_sim_opts_default(&ho);
 *     ho.ctx.graph = graph; ho.ctx.model = model; ho.ctx.request = req;
 *     ho.plan = plan_doc;
 *     px_heal_sim *h;
 *     px_heal_sim_new(&ho, &h, &err);
 *     px_sim_result res;
 *     px_heal_sim_run(h, &load, &faults, &sim_opts, &res, &err);
 *     json_t *incidents = px_heal_sim_incidents(h);
 *     px_heal_sim_free(h);
 */
typedef struct px_heal_sim_opts {
    /* Candidates and validation: graph, model, contract, slo, seed,
     * replications, duration (current_plan is set by the healer; the
     * request's policy, objective and workload are read from the plan
     * document, so that a replay plans the same).  Borrowed; graph and
     * model are required. */
    px_heal_context ctx;
    const json_t *plan;         /* borrowed: the plan document to start with */
    const char *model_ref;      /* borrowed: the model as given ("preset:NAME" or a
                                   path), for the trace; may be NULL */
    double tick_s;              /* observation period (0.5 s) */
    double heartbeat_timeout_s; /* silent heartbeats: a loss (1.5 s) */
    double switch_s;            /* from the decision to the new plan serving (2 s) */
    uint32_t baseline_ticks;    /* ticks with samples forming a baseline (4) */
    double ratio;               /* departure: above baseline x ratio (2.0) */
    uint32_t confirm;           /* consecutive departing ticks to confirm (2) */
    /* Hysteresis for adaptations (link slowdowns): revert only when the
     * link's probes stay under exit_ratio x baseline for hold_s and
     * min_dwell_s passed since the change.  false: one threshold, no
     * dwell, no hold (for comparison: it alternates). */
    bool hysteresis;    /* true */
    double exit_ratio;  /* 1.3 */
    double min_dwell_s; /* 20 s */
    double hold_s;      /* 10 s */
    /* Thermal: act on the predicted trajectory (true), or only once a
     * device throttles (false, the reactive policy). */
    bool thermal_predictive;  /* true */
    double thermal_horizon_s; /* act when the limit is predicted this soon (60 s) */
    double thermal_margin_k;  /* ...counting the limit this much lower (1 K) */
    uint32_t canary_ticks;    /* ticks with steps a canary needs (3) */
    double canary_tolerance;  /* over the candidate's predicted hi (1.5) */
    bool heal;                /* false: detect and report only */
    px_trace_writer *trace;   /* borrowed; may be NULL */
} px_heal_sim_opts;

/* The defaults above; ctx with replications 1 and duration 20 s (the
 * validation runs inside the simulated run). */
void px_heal_sim_opts_default(px_heal_sim_opts *o);

typedef struct px_heal_sim px_heal_sim;

/* Checks the options and builds the simulator's view of the plan on the
 * graph.  o and what it points to are borrowed and must outlive h.
 * Returns owned (px_heal_sim_free).  PX_EINVAL naming the missing or bad
 * option; the plan reader's errors; PX_ENOMEM. */
PX_NODISCARD px_status px_heal_sim_new(const px_heal_sim_opts *o, px_heal_sim **out, px_err *err);
/* Frees h, the plans it made and its records.  NULL is a no-op. */
void px_heal_sim_free(px_heal_sim *h);
/* The plan to simulate (borrowed from h; its device table is the
 * inventory's, shared by every plan h installs). */
const px_sim_plan *px_heal_sim_plan(const px_heal_sim *h);
/* The hook table to put in px_sim_options.hooks (borrowed from h).  Each
 * replication starts over from the primary plan; incidents accumulate. */
const px_sim_hooks *px_heal_sim_hooks(px_heal_sim *h);
/* Runs px_sim_run on h's plan with h's hooks (opt is copied; its hooks
 * and fallbacks are replaced).  Errors as px_sim_run, and the first error
 * the healer met (a candidate that could not be planned is not one). */
PX_NODISCARD px_status px_heal_sim_run(px_heal_sim *h, const px_sim_load *load,
                                       const px_sim_faults *faults, const px_sim_options *opt,
                                       px_sim_result *out, px_err *err);
/* The incidents so far: a JSON array of plexus.incident/1 records.  New
 * reference; NULL on allocation failure. */
json_t *px_heal_sim_incidents(const px_heal_sim *h);
/* Each incident as a readable paragraph, appended to out.  PX_ENOMEM. */
PX_NODISCARD px_status px_heal_sim_report(const px_heal_sim *h, px_strbuf *out);

typedef struct px_heal_sim_summary {
    uint32_t replications, incidents, findings, switches, rollbacks, canaries_passed,
        canaries_failed, reverts;
    uint32_t faults_seen;     /* ground truth: faults that started (on_fault) */
    uint32_t faults_detected; /* ...matched by an incident */
    uint32_t false_alarms;    /* incidents matched to no fault */
    uint32_t complete;        /* incidents passing px_heal_incident_complete */
    double detect_s_sum;      /* time to detect, over the matched incidents */
    double mitigate_s_sum;    /* onset to the new plan serving, over the mitigated */
    uint32_t mitigated, recovered;
    double requests_failed, requests_requeued, tokens_lost;
} px_heal_sim_summary;

void px_heal_sim_get_summary(const px_heal_sim *h, px_heal_sim_summary *out);

/* Records a healed run's inputs in w (borrowed): the plan, the inventory
 * (inventory_doc, borrowed, required), the model reference, the load, the
 * faults (may be NULL), the simulator's and the healer's options.  Call
 * before px_heal_sim_run with the same w in opts.trace, then
 * px_heal_sim_trace_end.  The writer's errors; PX_ENOMEM. */
PX_NODISCARD px_status px_heal_sim_trace_begin(px_heal_sim *h, px_trace_writer *w,
                                               const json_t *inventory_doc, const px_sim_load *load,
                                               const px_sim_faults *faults,
                                               const px_sim_options *opt, px_err *err);
/* Records the "simulate-heal" decision (the result and the incidents, as
 * px_heal_sim_result_to_json) and the outcome. */
PX_NODISCARD px_status px_heal_sim_trace_end(px_heal_sim *h, px_trace_writer *w,
                                             const px_sim_result *res, px_err *err);
/* {"result": plexus.sim/1, "incidents": [...]}.  New reference. */
json_t *px_heal_sim_result_to_json(const px_heal_sim *h, const px_sim_result *res);

/* The derivers for what `plexus simulate --heal --trace` records:
 * "heal-sim.decision" (each mitigation: the finding's class and locus
 * from the recorded observation window, and the choice among the
 * candidates from their recorded validation) and "simulate-heal" (the
 * whole healed run from the recorded plan, inventory, model, load, faults
 * and options: the result and the incidents).  Returns a static table of
 * *n entries. */
const px_trace_deriver *px_heal_sim_replay_derivers(size_t *n);

/* ------------------------------------------------------------------ */
/* Healing real runs                                                   */
/* ------------------------------------------------------------------ */

/* A supervisor of one generation through the executor (heal_run*.c):
 * it injects the faults asked for (`plexus run --inject`), watches every
 * decode step (per-stage compute and per-hop transfer times against the
 * run's own baseline and the plan's calibrated predictions), audits a
 * step now and then against a shadow computation on the cpu backend in
 * this process (silent corruption), and on a finding or a failed step
 * localizes the fault, plans the candidates, validates them in the
 * simulator, starts the chosen plan's executor and hands it to the
 * generation, which rebuilds the KV caches by replaying its steps.  The
 * first steps on the new executor are canaried against the candidate's
 * prediction; a departing canary rolls back (to the next accepted
 * candidate, or to the plan left when that one still runs).  Every fault
 * handled becomes a `plexus.incident/1` record; with a trace writer every
 * input, observation and decision is recorded so that `plexus replay`
 * re-derives the decisions (px_heal_replay_derivers).
 *
 *     px_heal_run_opts ho;
 *     px_heal_run_opts_default(&ho);
 *     ho.graph = graph; ho.model = ir; ho.model_path = "stories260K.gguf";
 *     ho.plan = plan_json; ho.executor = executor_opts;
 *     ho.injects = injects; ho.n_injects = n;
 *     px_heal_run *h;
 *     px_heal_run_new(&ho, &h, &err);            // starts the plan's workers
 *     gen_opts.supervisor = px_heal_run_supervisor(h);
 *     px_rt_executor_generate(px_heal_run_executor(h), tok, &gen_opts, &stats, &err);
 *     json_t *incidents = px_heal_run_incidents(h);
 *     px_heal_run_free(h);                        // stops every executor
 *
 * Calibration.  Predictions for a tiny model on emulated devices may be
 * far from what this machine measures (fixed costs dominate).  The run
 * therefore scales the plan's predictions by one factor measured on its
 * first decode steps: the smallest observed-over-predicted ratio of any
 * stage (the device the inventory describes best), so that a device slower
 * than its figures stands out by its own ratio.  Canaries use the
 * candidate's prediction times the old plan's observed-over-predicted
 * step time. */

/* Called when tokens of a prompt are taken back (a rollback after
 * corruption): the consumer drops what it kept past `kept` tokens. */
typedef void (*px_heal_retract_fn)(uint32_t prompt, uint32_t kept, void *ud);

typedef struct px_heal_run_opts {
    const px_hw_graph *graph;      /* borrowed; the inventory.  NULL: faults are
                                      injected, detected and reported, but no
                                      alternative plan can be made (restarting a
                                      worker is still possible) */
    const json_t *inventory_doc;   /* borrowed; the inventory as read (trace) */
    const px_ir_model *model;      /* borrowed; required */
    const char *model_path;        /* borrowed; required (workers, trace, shadow) */
    const px_contract *contract;   /* borrowed; NULL: the implied contract */
    const char *contract_spec;     /* borrowed; as given on the command line, or NULL */
    px_plan_request request;       /* the request the plan came from (graph,
                                      model and contract are set from above) */
    const json_t *plan;            /* borrowed; the plan to start with (required) */
    uint32_t replica;              /* the plan's replica to start (0: the first) */
    bool planned;                  /* the plan was made by the planner for this
                                      run (the trace records the "plan" decision) */
    px_rt_executor_opts executor;  /* copied (its pointers borrowed) */
    const px_heal_inject *injects; /* borrowed; n_injects entries */
    size_t n_injects;
    px_trace_writer *trace; /* borrowed; may be NULL */
    const char *command;    /* borrowed; the command line, for reproducers */
    const char *trace_path; /* borrowed; the trace's file name, for reproducers */
    bool heal;              /* false: inject, detect and report only */
    uint32_t audit_every;   /* audit every N decode steps; 0: never */
    double audit_tolerance; /* an audited row departs above this relative
                               error, max|a-b| / rms(b) (1e-3) */
    uint64_t seed;          /* of validation's simulations (1) */
    px_heal_detector_opts detector;
    double step_deadline_floor_s; /* deadline of a step: max(10 x baseline, this) (0.25) */
    uint32_t canary_steps;        /* steps a canary needs (4) */
    double canary_tolerance;      /* over the calibrated prediction's hi (3.0) */
    const char *const *prompts;   /* borrowed; the request, for the trace */
    uint32_t n_prompts;
    uint32_t max_new_tokens;
    px_heal_retract_fn on_retract; /* may be NULL */
    void *ud;
} px_heal_run_opts;

/* Defaults: heal on, no audit, tolerance 1e-3, seed 1, the detector's
 * defaults but 4 confirming steps, a 0.25 s deadline floor, a canary of 4
 * steps at 3.0.  The detector's floor is raised, per plan, to the median
 * wall time of its baseline steps: worker processes share the machine's
 * cores, and a departure smaller than one step is noise there. */
void px_heal_run_opts_default(px_heal_run_opts *o);

typedef struct px_heal_run px_heal_run;

/* Checks the options, records the run's inputs and plan in the trace,
 * and starts the plan's executor.  o and what it points to are borrowed
 * and must outlive the run.  Returns owned (px_heal_run_free).  Errors:
 * PX_EINVAL (a missing option, an inject whose target is not in the plan,
 * naming it), the executor's, the trace writer's. */
PX_NODISCARD px_status px_heal_run_new(const px_heal_run_opts *o, px_heal_run **out, px_err *err);
/* Stops every executor the run started.  NULL is a no-op. */
void px_heal_run_free(px_heal_run *h);
/* The supervisor to put in px_rt_generate_opts.supervisor (borrowed from
 * the run). */
const px_rt_supervisor *px_heal_run_supervisor(px_heal_run *h);
/* The executor the generation runs on now (borrowed from the run). */
px_rt_executor *px_heal_run_executor(px_heal_run *h);
/* The plan that runs now (borrowed from the run). */
const json_t *px_heal_run_plan(const px_heal_run *h);
/* The incident records so far, a JSON array of plexus.incident/1
 * objects.  New reference. */
json_t *px_heal_run_incidents(const px_heal_run *h);
/* Each incident as a readable paragraph, appended to out.  PX_ENOMEM. */
PX_NODISCARD px_status px_heal_run_report(const px_heal_run *h, px_strbuf *out);
/* Records the outcome (the text of every prompt, the incidents) in the
 * trace; texts[i] borrowed.  A no-op without a trace.  The writer's
 * errors. */
PX_NODISCARD px_status px_heal_run_finish(px_heal_run *h, const char *const *texts, size_t n_texts,
                                          px_err *err);

/* The generation has nothing to run (a server between requests): the
 * incident of a change that runs and whose canary has not judged it yet
 * is closed and recorded ("mitigated; ... before the canary could
 * judge") instead of staying open, and out of px_heal_run_incidents,
 * until steps come.  A change handed to the generation and not switched
 * to yet keeps its incident open.  Call it on the generation's thread. */
void px_heal_run_idle(px_heal_run *h);

/* Counters of the run, for tests and benchmarks. */
typedef struct px_heal_run_summary {
    uint32_t injected, findings, incidents, switches, rollbacks, audits, audit_departures;
    uint32_t canaries_passed, canaries_failed;
    uint32_t recorded;     /* incidents closed, their records in px_heal_run_incidents */
    double last_detect_s;  /* injection to detection of the last incident; -1 */
    double last_recover_s; /* detection to the first token on the new executor; -1 */
} px_heal_run_summary;

void px_heal_run_get_summary(const px_heal_run *h, px_heal_run_summary *out);

/* The derivers of the decisions a healing run records: "heal.detect"
 * (the detector over the recorded samples), "heal.mitigation" (the
 * localization, the candidates, their validation and the choice) and
 * "heal.canary" (the canary's verdict over the recorded samples).  Model
 * files are re-opened by their recorded path and refused when their
 * SHA-256 differs.  Returns a static table of *n entries. */
const px_trace_deriver *px_heal_replay_derivers(size_t *n);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_HEAL_H */
