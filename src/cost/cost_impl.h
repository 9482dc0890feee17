/* Private declarations shared by the cost model's files. */
#ifndef PX_COST_IMPL_H
#define PX_COST_IMPL_H

#include "plexus/cost.h"

/* Relative uncertainty of a quantity as a half-width, or fallback when it
 * states none. */
double px__cost_qty_rel(const px_qty *q, double fallback);
/* Bytes per value of a dtype; PX_DTYPE_COUNT_ or an invalid value gives
 * the fallback. */
double px__cost_bpe(px_dtype dt, double fallback);

/* The host's work per step of one micro-batch outside the stages'
 * kernels (px_cost_estimate.executor_s): rows x host_row_s (the sample's
 * draw when s gives one), or in the calibrated mode the step correction
 * for the first stage's device and dtype at the workload's step size,
 * applied to the sourced point prediction.  Allocates nothing. */
double px__cost_step_host_s(const px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                            const px_cost_sample *s, const px_cost_pipeline *pipe,
                            const px_cost_workload *wl, px_dtype dtype);

/* What a stage's blocks weigh, read and compute for one step. */
typedef struct px__cost_stage_load {
    double w_mem;                            /* weight bytes held */
    double w_decode;                         /* weight bytes read by a decode step */
    double w_prefill;                        /* weight bytes read by a prefill */
    double kv_token;                         /* KV bytes per token of context (all its blocks) */
    double flops_tok, flops_pair, flops_seq; /* sums over its blocks (+ head) */
    double act_out;                          /* activation bytes per token crossing its output */
    uint32_t n_blocks;
} px__cost_stage_load;

/* load.c: a stage's load from the model's layers, at dec_tokens tokens a
 * decode step and pf_tokens a prefill (the experts they touch). */
void px__cost_stage_load_of(const px_cost_model *m, const px_cost_stage *st, uint64_t dec_tokens,
                            uint64_t pf_tokens, px__cost_stage_load *ld);
/* The same from prefix sums over the layers. */
void px__cost_load_from_prefix(const px_cost_prefix *pre, const px_cost_stage *st,
                               px__cost_stage_load *ld);
/* The sequences of one micro-batch. */
uint32_t px__cost_micro_batch(const px_cost_workload *wl);
/* Bytes per activation element at act over the model's own. */
double px__cost_act_scale(const px_cost_model *m, px_dtype act);

/* host.c: true when the host KV of the stages on some node passes that
 * node's memory; *stage gets the last stage on it and *over the excess. */
bool px__cost_host_over(const px_cost_fleet *f, const px_cost_params *p,
                        const px_cost_stage *stages, const px_cost_stage_est *ests,
                        uint32_t n_stages, uint32_t *stage, double *over);
/* The floor the host cores put under a step (est->host_cores_s and
 * host_node; see host.c). */
void px__cost_host_cores_floor(const px_cost_fleet *f, const px_cost_pipeline *pipe, uint32_t mb,
                               double exec, px_cost_estimate *est);

#endif
