/*
 * Private declarations of healing in the simulator (heal_sim*.c): the
 * healer's state, the classification of a trigger (shared by the live
 * decision and its replay), the choice among validated candidates, and
 * the incident records.
 */
#ifndef PX_HEAL_SIM_IMPL_H
#define PX_HEAL_SIM_IMPL_H

#include "base/common.h"

#include "heal/heal_impl.h"

#define PX__HS_MAX_STAGES 64 /* stages of one plan, every replica together */
#define PX__HS_WINDOW     16 /* ticks of a signal kept for the trace */
#define PX__HS_TEMPS      8  /* temperature samples per device for the fit */
#define PX__HS_TRUTH      256
#define PX__HS_PLANS      60  /* plans one healer installs at most */
#define PX__HS_PROBES     128 /* probes of an abandoned link kept for hysteresis */

/* A plan the healer runs or may run: the document and the simulator's
 * view of it on the inventory. */
typedef struct px__hs_plan {
    json_t *doc; /* owned */
    px_sim_plan sim;
} px__hs_plan;

/* Per plan and replication: the run's own baseline of each stage's step
 * ratio and each hop's transfer ratio. */
typedef struct px__hs_base {
    uint32_t n_step[PX__HS_MAX_STAGES], n_xfer[PX__HS_MAX_STAGES];
    double step[PX__HS_MAX_STAGES][8], xfer[PX__HS_MAX_STAGES][8];
} px__hs_base;

/* A fault as the engine reports it (ground truth, for scoring). */
typedef struct px__hs_truth {
    double t;
    px_sim_fault_kind kind;
    uint32_t device, domain;
    bool injected, matched;
    double failed, requeued, tokens_lost; /* counters at the tick before */
} px__hs_truth;

/* A finding's candidates, validated, kept for findings with the same key
 * (class, locus, lost devices, conditions, plan): planning and
 * validation are deterministic, so the second time costs nothing. */
typedef struct px__hs_cached {
    char *key;
    px_heal_candidate *c;
    size_t n;
    int chosen;
} px__hs_cached;

enum { PX__HS_NORMAL = 0, PX__HS_SWITCHING, PX__HS_CANARY };

typedef struct px__hs_ring {
    double t[PX__HS_WINDOW], v[PX__HS_WINDOW];
    uint32_t n;
} px__hs_ring;

struct px_heal_sim {
    px_heal_sim_opts o;
    px_sim_hooks hooks;
    px__hs_plan *plans[PX__HS_PLANS]; /* [0] the primary */
    size_t n_plans;
    px__hs_cached *cache;
    size_t n_cache, cap_cache;
    json_t *incidents;
    px_heal_sim_summary sum;
    px_err first_err;
    bool failed;
    /* The content hashes of the inputs px_heal_sim_trace_begin recorded:
     * plan, inventory, model, load, faults, options, heal. */
    char input_ids[7][PX_TRACE_ID_LEN];
    size_t n_devices;
    /* ---- one replication ---- */
    uint32_t replication;
    double now;
    size_t active; /* the plan serving (or being switched to) */
    size_t left;   /* the plan the last switch left */
    size_t target; /* SWITCHING: the plan installed */
    int phase;
    double switch_at;
    bool rollback_pending; /* the switch under way is a rollback */
    px_heal_canary canary;
    px__hs_base *base; /* per plan (n_plans entries, grown with them) */
    px__hs_ring step_win[PX__HS_MAX_STAGES], xfer_win[PX__HS_MAX_STAGES];
    uint32_t step_dep[PX__HS_MAX_STAGES], xfer_dep[PX__HS_MAX_STAGES];
    bool *lost;       /* heartbeats silent and reported */
    double *temp_t;   /* n_devices x PX__HS_TEMPS */
    double *temp_k;   /* n_devices x PX__HS_TEMPS */
    double *power_w;  /* n_devices x PX__HS_TEMPS */
    uint32_t *n_temp; /* per device */
    bool *hot;        /* reported hot (one finding per device) */
    /* The adaptation to a slow link of the primary plan, reverted
     * through hysteresis on the link's probes. */
    bool adapted;
    uint32_t adapt_link;
    double probe_base;
    struct {
        double t[PX__HS_PROBES], v[PX__HS_PROBES];
        uint32_t n;
    } probe_win;
    px_heal_hysteresis hyst;
    /* Conditions observed in earlier incidents of this replication (a
     * slow link, heat), still in force: later validations include them. */
    px_sim_fault known[16];
    uint32_t n_known;
    /* ground truth */
    px__hs_truth truth[PX__HS_TRUTH];
    uint32_t n_truth;
    /* counters at the last tick */
    double c_failed, c_requeued, c_tokens_lost, c_tokens;
    /* the incident open now */
    json_t *inc;
    int inc_truth; /* index into truth, or -1 */
    double inc_detect_t, inc_onset_t;
    double inc_failed, inc_requeued, inc_tokens_lost;
    px_heal_candidate *inc_c; /* borrowed from the cache */
    size_t inc_n;
    bool *inc_tried; /* per candidate of inc_c: installed already */
    size_t inc_cap_tried;
    int inc_current; /* the candidate being canaried */
    bool inc_recovery;
};

/* ---- classification (heal_sim_detect.c) ---- */

/* Classifies a trigger (the JSON the decision records as its input):
 * "heartbeat", "transfer", "step", "temperature" or "throttle".  Fills
 * *cls (NONE when the recorded signal does not depart) and *where, and a
 * readable evidence line.  Pure: the live decision and its replay call
 * it on the same JSON. */
void px__hs_classify(const json_t *trigger, px_heal_fault_class *cls, px_heal_locus *where,
                     bool *intermittent, char *evidence, size_t cap);
/* The thermal fit over samples (t, T): the steady state T_ss and the time
 * to reach `limit` (0 when already there, INFINITY when never). */
void px__hs_thermal_fit(const double *t, const double *temp, uint32_t n, double tau, double limit,
                        double *t_ss, double *t_hit);
/* Applies the heat rule (a candidate that keeps `hot` busy while the
 * device heads over its limit is rejected "unstable") and chooses the
 * safest accepted candidate (px_heal_validate's order).  cands is the
 * recorded JSON array (each with "devices"); returns the index or -1 and
 * fills codes[i] with each candidate's reject code ("" when accepted). */
int px__hs_choose(const json_t *cands, const char *hot, double slo_tpot_s, char (*codes)[32],
                  size_t n_codes);

/* Per-tick detection: looks at the observation and returns a trigger
 * (new reference) when one departs, or NULL. */
json_t *px__hs_detect(px_heal_sim *h, const px_sim_obs *obs);
/* Feeds the run's baseline and windows for the running plan. */
void px__hs_observe(px_heal_sim *h, const px_sim_obs *obs);

/* ---- decisions and incidents (heal_sim_act.c, heal_sim_record.c) ---- */

void px__hs_handle(px_heal_sim *h, const px_sim_obs *obs, json_t *trigger, px_sim_action *act);
void px__hs_canary_tick(px_heal_sim *h, const px_sim_obs *obs, px_sim_action *act);
void px__hs_adapt_tick(px_heal_sim *h, const px_sim_obs *obs, px_sim_action *act);

void px__hs_incident_open(px_heal_sim *h, px_heal_fault_class cls, const px_heal_locus *where,
                          bool intermittent, const char *evidence, const json_t *trigger);
void px__hs_incident_event(px_heal_sim *h, const char *fmt, ...) PX_PRINTF(2, 3);
void px__hs_incident_close(px_heal_sim *h, const char *outcome, bool mitigated);

/* ---- the table of plans and the first error (heal_sim_plan.c) ---- */

/* The index of the plan the observation says runs (n_plans: unknown). */
size_t px__hs_plan_index(const px_heal_sim *h, const px_sim_plan *p);
/* Adds a plan document (taken) to h's plans.  PX_ENOMEM, PX_ELIMIT, the
 * plan reader's errors. */
px_status px__hs_add_plan(px_heal_sim *h, json_t *doc, size_t *index, px_err *err);
/* Whether a plan runs anything on the device. */
bool px__hs_plan_uses(const px_sim_plan *p, uint32_t device);
/* Keeps the first error of a run (later ones are consequences). */
void px__hs_note_error(px_heal_sim *h, const px_err *e);

/* The planning request a plan document came from (policy, objective,
 * workload); req->policy borrows from doc. */
void px__hs_request_from_plan(const json_t *doc, px_plan_request *req);
json_t *px__hs_opts_to_json(const px_heal_sim_opts *o);
/* Reads px__hs_opts_to_json's output into o (the thresholds and the
 * context's slo, seed, replications and duration).  PX_EPARSE. */
px_status px__hs_opts_from_json(const json_t *v, px_heal_sim_opts *o, px_err *err);

/* Text of one incident, appended. */
px_status px__hs_incident_text(const json_t *inc, px_strbuf *out);

#endif
