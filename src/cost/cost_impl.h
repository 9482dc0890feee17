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

#endif
