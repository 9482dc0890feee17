/* The host's work per step outside the stages' kernels: a time per row
 * (sequence) of a step, sourced (params.host_row_s) or calibrated (the
 * step class: a fixed time plus a time per row), and the samples that fit
 * it from pipelines run at several batch sizes. */
#include "base/common.h"

#include "cost/cost_impl.h"

static double rows_of(const px_cost_workload *wl)
{
    uint32_t mb = PX_MAX(wl->micro_batches, 1u);
    uint32_t batch = PX_MAX(wl->batch, 1u);
    return (double)((batch + mb - 1) / mb);
}

double px_cost_step_sourced(const px_cost_model *m, const px_cost_workload *wl,
                            const px_cost_params *p)
{
    /* A denoising step samples nothing per row. */
    return m->dit ? 0.0 : rows_of(wl) * p->host_row_s;
}

double px__cost_step_host_s(const px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                            const px_cost_sample *s, const px_cost_pipeline *pipe,
                            const px_cost_workload *wl, px_dtype dtype)
{
    if (p->mode == PX_COST_CALIBRATED && p->calibration) {
        size_t idx;
        const char *dev = f->devices[pipe->stages[0].devices[0]].id;
        if (px_cost_calibration_lookup(p->calibration, dev, PX_COST_CLASS_STEP, dtype,
                                       px_cost_step_size(m, wl), &idx) == PX_COST_CALIB_APPLIED) {
            /* The measurement scales the sourced point prediction; its
             * uncertainty is the correction's (as for every class). */
            const px_cost_correction *c = px_cost_calibration_at(p->calibration, idx);
            double v = c->offset_s + c->factor * px_cost_step_sourced(m, wl, p);
            return PX_MAX(v, 0.0) * (s && s->calib ? s->calib[idx] : 1.0);
        }
    }
    if (m->dit)
        return 0.0;
    double row = s && s->host_row_s > 0 ? s->host_row_s : p->host_row_s;
    return rows_of(wl) * row;
}

px_status px_cost_run_host_sample(const px_cost_run *run, px_cost_fleet *f, const px_cost_model *m,
                                  const px_cost_params *p, px_cost_calib_sample *sample, bool *has,
                                  px_err *err)
{
    *has = false;
    memset(sample, 0, sizeof *sample);
    if (run->n_stages == 0 || !isfinite(run->tpot_s) || !(run->tpot_s > 0))
        return PX_OK;
    for (uint32_t i = 1; i < run->n_stages; i++)
        if (!isfinite(run->stages[i].xfer_in_s))
            return PX_OK;
    px_cost_pipeline *pipe = malloc(sizeof *pipe);
    px_cost_estimate *est = malloc(sizeof *est);
    px_status st = PX_OK;
    if (!pipe || !est) {
        st = px_err_set(err, PX_ENOMEM, "out of memory reading a run");
        goto done;
    }
    px_cost_workload wl;
    if ((st = px_cost_run_pipeline(run, f, m, pipe, &wl, err)) != PX_OK ||
        (st = px_cost_eval_pipeline(f, m, p, &wl, pipe, NULL, est, err)) != PX_OK)
        goto done;
    /* What the stages (as predicted: a batch's step by the decode class
     * when calibrated), the observed hops and the logits' way back (as
     * predicted) account for; the rest of a step is the host's. */
    double rest = run->tpot_s - est->return_s;
    for (uint32_t i = 0; i < run->n_stages; i++)
        rest -= est->stages[i].decode_s + (i > 0 ? run->stages[i].xfer_in_s : 0);
    double pred = px_cost_step_sourced(m, &wl, p);
    if (!(rest > 0) || !(pred > 0))
        goto done;
    *sample = (px_cost_calib_sample){.device = run->stages[0].device,
                                     .cls = PX_COST_CLASS_STEP,
                                     .dtype = PX_DTYPE_COUNT_,
                                     .size = px_cost_step_size(m, &wl),
                                     .predicted_s = pred,
                                     .observed_s = rest};
    *has = true;
done:
    free(pipe);
    free(est);
    return st;
}
