/* Cost model parameters: sourced defaults, checks and names. */
#include "base/common.h"

#include "cost/cost_impl.h"

#define MIB (1024.0 * 1024.0)

void px_cost_params_default(px_cost_params *p)
{
    memset(p, 0, sizeof *p);
    p->mode = PX_COST_SOURCED;
    p->calibration = NULL;
    p->headroom = 0.10;
    /* Well-tuned engines reach 70 to 85% of attainable bandwidth in decode. */
    p->eff_mem = 0.80;
    p->eff_mem_lo = 0.70;
    p->eff_mem_hi = 0.85;
    /* Large matrix products typically reach half to three quarters of the
     * datasheet peak (model FLOPs utilisation of prefill). */
    p->eff_compute = 0.60;
    p->eff_compute_lo = 0.45;
    p->eff_compute_hi = 0.75;
    p->eff_link = 0.85;
    p->runtime_cuda = 500.0 * MIB;
    p->runtime_emu = 64.0 * MIB;
    p->runtime_cpu = 32.0 * MIB;
    p->workspace_gpu = 256.0 * MIB;
    p->workspace_cpu = 64.0 * MIB;
    p->default_rel_unc = 0.10;
    p->default_power_gpu = 300.0;
    p->default_power_cpu = 150.0;
    p->idle_fraction = 0.25;
    p->default_mtbf_s = 50000.0 * 3600.0;
    p->host_link_bw = 32e9; /* PCIe 4.0 x16, per direction */
    p->host_link_latency = 5e-6;
    p->reliability_window_s = 24.0 * 3600.0;
    p->mc_samples = 256;
    p->seed = 1;
    /* Sampling over the vocabulary, token handling and per-sequence
     * bookkeeping on a host core: tens of microseconds per sequence and
     * step on the engines measured here (`plexus calibrate` replaces it). */
    p->host_row_s = 10e-6;
    p->host_row_s_lo = 3e-6;
    p->host_row_s_hi = 40e-6;
}

static bool in_range(double v, double lo, double hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

px_status px_cost_params_check(const px_cost_params *p, px_err *err)
{
    if (p->mode != PX_COST_SOURCED && p->mode != PX_COST_CALIBRATED)
        return px_err_set(err, PX_EINVAL, "cost model: unknown mode %d; use sourced or calibrated",
                          (int)p->mode);
    if (p->mode == PX_COST_CALIBRATED && !p->calibration)
        return px_err_set(err, PX_EINVAL,
                          "cost model: the calibrated mode needs a calibration overlay "
                          "(--calibration FILE)");
    if (p->mode == PX_COST_SOURCED && p->calibration)
        return px_err_set(err, PX_EINVAL,
                          "cost model: a calibration overlay is given in the sourced mode; "
                          "use the calibrated mode or drop the overlay");
    if (!in_range(p->headroom, 0.0, 0.9))
        return px_err_set(err, PX_EINVAL, "cost model: headroom %g is outside [0, 0.9]",
                          p->headroom);
    if (!in_range(p->eff_mem, 0.01, 1.0) || !in_range(p->eff_mem_lo, 0.01, p->eff_mem) ||
        !in_range(p->eff_mem_hi, p->eff_mem, 1.0))
        return px_err_set(err, PX_EINVAL,
                          "cost model: memory efficiency %g (range %g..%g) must lie in "
                          "(0, 1] with lo <= value <= hi",
                          p->eff_mem, p->eff_mem_lo, p->eff_mem_hi);
    if (!in_range(p->eff_compute, 0.01, 1.0) ||
        !in_range(p->eff_compute_lo, 0.01, p->eff_compute) ||
        !in_range(p->eff_compute_hi, p->eff_compute, 1.0))
        return px_err_set(err, PX_EINVAL,
                          "cost model: compute efficiency %g (range %g..%g) must lie in "
                          "(0, 1] with lo <= value <= hi",
                          p->eff_compute, p->eff_compute_lo, p->eff_compute_hi);
    if (!in_range(p->eff_link, 0.01, 1.0))
        return px_err_set(err, PX_EINVAL, "cost model: link efficiency %g is outside (0, 1]",
                          p->eff_link);
    if (!in_range(p->default_rel_unc, 0.0, 0.9))
        return px_err_set(err, PX_EINVAL, "cost model: default uncertainty %g is outside [0, 0.9]",
                          p->default_rel_unc);
    if (p->mc_samples < 8 || p->mc_samples > 100000)
        return px_err_set(err, PX_EINVAL, "cost model: %u Monte Carlo samples; use 8 to 100000",
                          p->mc_samples);
    if (!in_range(p->host_row_s, 0.0, 1.0) || !in_range(p->host_row_s_lo, 0.0, p->host_row_s) ||
        !in_range(p->host_row_s_hi, p->host_row_s, 1.0))
        return px_err_set(err, PX_EINVAL,
                          "cost model: host time per row %g s (range %g..%g) must lie in "
                          "[0, 1] s with lo <= value <= hi",
                          p->host_row_s, p->host_row_s_lo, p->host_row_s_hi);
    if (!(p->host_link_bw > 0) || !(p->reliability_window_s > 0) || !(p->default_mtbf_s > 0))
        return px_err_set(err, PX_EINVAL,
                          "cost model: host link bandwidth, reliability window and "
                          "default MTBF must be positive");
    return PX_OK;
}

const char *px_cost_kv_place_name(px_cost_kv_place k)
{
    return k == PX_COST_KV_HOST ? "host" : "device";
}

const char *px_cost_bind_name(px_cost_bind b)
{
    switch (b) {
    case PX_COST_BIND_MEMORY_BW:
        return "memory-bandwidth";
    case PX_COST_BIND_COMPUTE:
        return "compute";
    case PX_COST_BIND_ALLREDUCE:
        return "allreduce";
    case PX_COST_BIND_KV_HOST:
        return "kv-host-link";
    case PX_COST_BIND_TRANSFER:
        return "transfer";
    default:
        return "unknown";
    }
}

const char *px_cost_infeasible_name(px_cost_infeasible r)
{
    switch (r) {
    case PX_COST_OK:
        return "ok";
    case PX_COST_NO_MEMORY:
        return "memory";
    case PX_COST_NO_PATH:
        return "no-path";
    case PX_COST_NO_CAPABILITY:
        return "capability";
    case PX_COST_BAD_LAYOUT:
        return "layout";
    default:
        return "unknown";
    }
}

px_cost_workload px_cost_workload_default(void)
{
    px_cost_workload wl = {
        .batch = 1, .micro_batches = 1, .context = 4096, .prompt_tokens = 512, .gen_tokens = 256};
    return wl;
}

double px_cost_attended(const px_cost_workload *wl)
{
    double mean = (double)wl->prompt_tokens + ((double)wl->gen_tokens + 1.0) / 2.0;
    return PX_MAX(1.0, PX_MIN((double)wl->context, mean));
}

px_cost_stage px_cost_stage_make(uint32_t device, const px_cost_model *m)
{
    px_cost_stage s;
    memset(&s, 0, sizeof s);
    s.devices[0] = device;
    s.tp = 1;
    s.first = 0;
    s.last = (int32_t)m->n_layers - 1;
    s.embedding = true;
    s.head = true;
    s.prec.weights = PX_DTYPE_COUNT_;
    s.prec.ffn_weights = PX_DTYPE_COUNT_;
    s.prec.activations = m->act_dtype;
    s.prec.kv = m->kv_dtype;
    s.kv = PX_COST_KV_DEVICE;
    return s;
}
