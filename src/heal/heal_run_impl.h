/*
 * Private declarations of healing real runs (heal_run*.c): the state of
 * one supervised generation and the pieces its files share.  The
 * functions marked "deterministic" are the ones replay calls again: a run
 * and its replay must compute their decisions through the same code.
 */
#ifndef PX_HEAL_RUN_IMPL_H
#define PX_HEAL_RUN_IMPL_H

#include "heal/heal_impl.h"

#define HR_MAX_PROMPTS    64
#define HR_MAX_LOST       16
#define HR_MAX_CONDS      32
#define HR_NAME_LEN       40
#define HR_MAX_HYST       8
#define HR_BASELINE_STEPS 8
#define HR_MAX_RECOVERIES 8

/* A fault that lasts where it was put (a slow device, a degraded link,
 * a corrupting backend): it is put again on every executor whose plan
 * uses that device (or that hop), as the hardware would carry it. */
typedef struct hr_cond {
    px_rt_fault fault;
    char device[96];  /* the stage's device when injected */
    char link_to[96]; /* LINK: the receiving device, "executor" after the last */
} hr_cond;

/* One decode step as recorded: the sample the detector reads, the wall
 * time the canary reads, and its observation's name in the trace. */
typedef struct hr_step {
    px_heal_sample s;
    double wall_s;
    char name[HR_NAME_LEN];
} hr_step;

/* The shadow computation that audits steps (heal_run_audit.c). */
typedef struct hr_shadow hr_shadow;

typedef struct hr_hyst {
    char key[128];
    px_heal_hysteresis h;
} hr_hyst;

struct px_heal_run {
    px_heal_run_opts o;
    px_rt_supervisor sup;
    px_heal_context ctx;
    uint64_t t0_ns;

    /* What runs now, and the plan left last (for a rollback). */
    px_rt_executor *ex;
    px_rt_pipeline_spec spec;
    json_t *plan;
    json_t *prev_plan;
    bool prev_viable;        /* the plan left still runs where it ran (an adaptation) */
    px_rt_executor *pending; /* handed to the generation, not switched to yet */
    json_t *pending_plan;

    char lost[HR_MAX_LOST][96];
    size_t n_lost;
    char excluded[HR_MAX_LOST][96]; /* kept out of plans: corrupting devices */
    size_t n_excluded;

    bool *applied; /* n_injects */
    hr_cond conds[HR_MAX_CONDS];
    size_t n_conds;
    uint64_t tokens_out;
    int deadline_ms;

    /* Decode steps on the current executor since it started. */
    hr_step *win;
    size_t n_win, cap_win;
    /* The rows per step the window's steps ran with (its first's), and
     * how many steps in a row since ran with a batch twice as large or
     * half as large: those are kept out of the window. */
    uint32_t win_rows, off_rows_steps;
    uint64_t n_steps_recorded; /* all decode observations, for names */
    px_heal_envelope raw_env;
    px_heal_detector *det;
    px_heal_detector_opts det_opts; /* the options, with the floor this plan's baseline sets */
    bool calibrated;
    double calib;           /* observed over predicted, applied to the envelope */
    double baseline_wall_s; /* median wall time of the baseline steps */
    hr_hyst hyst[HR_MAX_HYST];
    size_t n_hyst;

    /* Canary of the change that runs now. */
    bool canary_on;
    px_heal_canary canary;
    double canary_ratio;
    json_t *canary_samples; /* names of the observations it read */
    px_heal_candidate *cands;
    size_t n_cands;
    int chosen;
    bool tried[32];

    /* The incident in progress (after a change, until its canary ends). */
    json_t *incident;
    json_t *timeline;
    double t_inject_s, t_detect_s;
    bool awaiting_first;
    uint64_t trace_seq_first;
    json_t *incidents;

    /* Audits. */
    hr_shadow *shadow;
    uint64_t decode_steps;   /* decode steps produced, all executors */
    uint64_t last_good_keep; /* steps to keep after a departure */
    bool audit_pending;
    uint64_t steps_seen; /* steps of the generation (obs.index + 1) */

    /* The injections that started the incident in progress. */
    json_t *recent_faults;
    /* A fault a stage failed to apply (a memory fault its device cannot
     * hold): the failure that follows is blamed on it. */
    char inject_error[256];
    int inject_error_stage;
    double last_fault_t_s;
    uint64_t last_fault_seq;

    px_heal_run_summary sum;
    uint32_t n_incident_ids;
};

/* ---- heal_run_plan.c ---- */

/* Seconds since the run started. */
double px__hr_now(const px_heal_run *h);

/* Starts an executor for plan (the run's inventory and executor
 * options), puts the lasting faults back on it and sets its deadline. */
px_status px__hr_start_plan(px_heal_run *h, const json_t *plan, px_rt_executor **out, px_err *err);

/* The plan's predicted decode time of one step (its stages' p50, or hi,
 * one after the other); NAN when a stage has none. */
double px__hr_pred_step(const px_rt_pipeline_spec *spec, bool hi);
/* Plans, validates, chooses and starts a mitigation for (cls, where);
 * cause names the trace event it derives from.  Returns the executor to
 * switch to, or NULL: err says why (its code PX_OK when the plan was
 * kept on purpose). */
px_rt_executor *px__hr_mitigate(px_heal_run *h, const char *kind, px_heal_fault_class cls,
                                const px_heal_locus *where, const px_heal_finding *finding,
                                const char *cause, const char *evidence, px_err *err);
/* Starts h->cands[h->chosen] (or the next accepted one that starts). */
px_rt_executor *px__hr_start_choice(px_heal_run *h, px_err *err);
/* Adds a device id to a list of at most HR_MAX_LOST. */
void px__hr_add_name(char list[][96], size_t *n, const char *dev);

/* ---- heal_run_check.c ---- */

void px__hr_canary_begin(px_heal_run *h);
px_status px__hr_canary_step(px_heal_run *h, const hr_step *s, px_rt_step_verdict *v, px_err *err);
px_status px__hr_on_audit(px_heal_run *h, const px_rt_step_obs *obs, px_rt_step_verdict *v,
                          px_err *err);

/* ---- heal_run_act.c ---- */

/* Deterministic: the fault class and place of a failed step, from its
 * recorded observation (px__hr_failure_json). */
void px__hr_classify_failure(const json_t *failure, px_heal_fault_class *cls, px_heal_locus *where);
/* The failure observation of a failed executor: the status, the message,
 * the culprit and every stage's health and device. */
json_t *px__hr_failure_json(px_rt_executor *failed, px_status st, const px_err *why);
/* Deterministic: candidates for (cls, where) on plan, validated, and the
 * choice, as the "heal.mitigation" output; the candidates are returned
 * in *cands (owned, px_heal_candidates_free) when cands is not NULL. */
px_status px__hr_decide(const px_heal_context *ctx, const json_t *plan, px_heal_fault_class cls,
                        const px_heal_locus *where, const json_t *lost,
                        const px_heal_finding *finding, json_t **decision,
                        px_heal_candidate **cands, size_t *n_cands, int *chosen, px_err *err);
/* Reads px_heal_locus_to_json's output back (what is missing stays 0). */
void px__hr_locus_from_json(const json_t *j, px_heal_locus *l);
px_heal_fault_class px__hr_class_from_name(const char *name);

/* ---- heal_run_detect.c ---- */

/* Deterministic: the calibration factor of an envelope from the first
 * baseline samples (the smallest observed-over-predicted ratio of any
 * stage's compute; 1 when nothing is known), and the envelope scaled:
 * the stages' predictions by c, each stage's time per attended position
 * by its own ratio over the same n samples s (may be NULL when n is 0)
 * when that is above 1. */
double px__hr_calibrate(const px_heal_envelope *raw, const px_heal_sample *s, size_t n);
void px__hr_envelope_scale(const px_heal_envelope *raw, double c, const px_heal_sample *s, size_t n,
                           px_heal_envelope *out);
json_t *px__hr_envelope_json(const px_heal_envelope *e);
px_status px__hr_envelope_from_json(const json_t *j, px_heal_envelope *e, px_err *err);
json_t *px__hr_detector_opts_json(const px_heal_detector_opts *o);
px_status px__hr_detector_opts_from_json(const json_t *j, px_heal_detector_opts *o, px_err *err);
json_t *px__hr_sample_json(const px_heal_sample *s, double wall_s);
/* Reads a recorded step, `name` ("heal.step.N") naming it in messages.
 * What an older trace lacks is not known: rows and context 0, every wait
 * 0 (nothing left out).  Rows above the plan's batch are taken as
 * recorded.  PX_EPARSE naming the record, the field and the fix for what
 * no run records: a wrong type, a negative time, a wait longer than the
 * time it is part of, more context than rows x 2^24 positions. */
px_status px__hr_sample_from_json(const json_t *j, const char *name, px_heal_sample *s,
                                  double *wall_s, px_err *err);
/* Deterministic: runs the detector over n samples (calibrated on the
 * first baseline_steps) and gives the finding confirmed on the last one
 * (cls NONE when none was), as the "heal.detect" output. */
px_status px__hr_detect(const px_heal_envelope *raw, const px_heal_detector_opts *o,
                        const px_heal_sample *s, size_t n, px_heal_finding *f, json_t **out,
                        px_err *err);
/* Deterministic: the canary's verdict over observed wall times, as the
 * "heal.canary" output. */
json_t *px__hr_canary_json(double pred_p50, double pred_hi, double ratio, uint32_t need,
                           double tolerance, const double *obs, size_t n,
                           px_heal_canary_verdict *verdict);

/* ---- heal_run_audit.c ---- */

px_status px__hr_shadow_new(const char *model_path, uint32_t n_prompts, uint32_t context,
                            hr_shadow **out, px_err *err);
void px__hr_shadow_free(hr_shadow *sh);
/* Records the tokens a step embeds (before it runs). */
void px__hr_shadow_note(hr_shadow *sh, const px_rt_step_obs *obs);
/* Tokens of prompt p past `kept` were taken back. */
void px__hr_shadow_retract(hr_shadow *sh, uint32_t prompt, uint32_t kept);
/* Compares an audited step's rows with the shadow's, stage by stage
 * (spec gives the layer ranges).  *first_bad gets the first departing
 * stage or -1; *out (may be NULL) the observation recorded. */
px_status px__hr_shadow_audit(hr_shadow *sh, const px_rt_pipeline_spec *spec,
                              const px_rt_step_obs *obs, double tolerance, int *first_bad,
                              json_t **out, px_err *err);

/* ---- heal_run_record.c ---- */

/* The context's objective, workload and validation settings as JSON (the
 * "heal.context" input) and back (borrowed doc). */
json_t *px__hr_context_json(const px_heal_context *ctx);
px_status px__hr_context_from_json(const json_t *doc, px_heal_context *ctx, px_err *err);

/* Records the run's inputs and its first plan (px_heal_run_new). */
px_status px__hr_record_inputs(px_heal_run *h, px_err *err);
/* Starts an incident (kind "recovery" or "adaptation"). */
void px__hr_incident_open(px_heal_run *h, const char *kind, px_heal_fault_class cls,
                          const px_heal_locus *where, const json_t *decision, const char *evidence);
void px__hr_incident_event(px_heal_run *h, const char *what);
/* Closes the incident in progress with the canary's outcome. */
void px__hr_incident_close(px_heal_run *h, const char *outcome, double realized_s);
/* The incident as a readable paragraph. */
px_status px__hr_incident_text(const json_t *inc, px_strbuf *out);

/* ---- heal_run_replay.c ---- */

#endif
