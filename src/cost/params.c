/* Cost model parameters: sourced defaults, checks, names, assumptions. */
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

static px_status add_assumption(json_t *arr, const char *name, const char *value,
                                const char *source)
{
    json_t *o = json_object();
    if (!o)
        return PX_ENOMEM;
    if (px_json_set(o, "name", json_string(name)) || px_json_set(o, "value", json_string(value)) ||
        px_json_set(o, "source", json_string(source))) {
        json_decref(o);
        return PX_ENOMEM;
    }
    return px_json_push(arr, o);
}

static void fmt_qty(double v, px_dim dim, char *buf, size_t n)
{
    px_qty_format(v, dim, buf, n);
}

json_t *px_cost_assumptions_json(const px_cost_fleet *f, const px_cost_model *m,
                                 const px_cost_params *p)
{
    json_t *arr = json_array();
    char v[96];
    if (!arr)
        return NULL;
    snprintf(v, sizeof v, "%.2f (range %.2f..%.2f)", p->eff_mem, p->eff_mem_lo, p->eff_mem_hi);
    if (add_assumption(arr, "decode memory-bandwidth efficiency", v,
                       "well-tuned engines reach 70-85% of attainable bandwidth in decode"))
        goto fail;
    snprintf(v, sizeof v, "%.2f (range %.2f..%.2f)", p->eff_compute, p->eff_compute_lo,
             p->eff_compute_hi);
    if (add_assumption(arr, "matrix-product compute efficiency", v,
                       "assumed: typical utilisation of large matrix products"))
        goto fail;
    snprintf(v, sizeof v, "%.2f", p->eff_link);
    if (add_assumption(arr, "link efficiency", v, "assumed: protocol overhead of one transfer"))
        goto fail;
    snprintf(v, sizeof v, "%.3g us (range %.3g..%.3g us)", p->host_row_s * 1e6,
             p->host_row_s_lo * 1e6, p->host_row_s_hi * 1e6);
    if (m && !m->dit &&
        add_assumption(arr, "host time per sequence per decode step", v,
                       "assumed: sampling, token handling and per-sequence work outside the "
                       "stages' kernels, on a host core; `plexus calibrate` measures it (step "
                       "class: a fixed time plus a time per row)"))
        goto fail;
    snprintf(v, sizeof v, "%.2f", p->headroom);
    if (add_assumption(arr, "memory headroom", v, "planner parameter"))
        goto fail;
    fmt_qty(p->runtime_cuda, PX_DIM_BYTES, v, sizeof v);
    if (add_assumption(arr, "runtime footprint (cuda)", v, "assumed: CUDA context and libraries"))
        goto fail;
    fmt_qty(p->workspace_gpu, PX_DIM_BYTES, v, sizeof v);
    if (add_assumption(arr, "kernel workspace per accelerator", v, "assumed"))
        goto fail;
    snprintf(v, sizeof v, "%.2f", p->default_rel_unc);
    if (add_assumption(arr, "relative uncertainty of figures stating none", v, "assumed"))
        goto fail;
    snprintf(v, sizeof v, "%u samples, seed %" PRIu64, p->mc_samples, p->seed);
    if (add_assumption(arr, "uncertainty propagation", v,
                       "seeded Monte Carlo; a relative uncertainty is a 2-sigma half-width "
                       "of a normal truncated at 2 sigma, an interval is uniform"))
        goto fail;
    if (f) {
        unsigned any = 0;
        for (size_t i = 0; i < f->n_devices; i++)
            any |= f->devices[i].assumed;
        if (any & PX_COST_ASSUMED_POWER) {
            snprintf(v, sizeof v, "%.0f W accelerator, %.0f W CPU, idle %.0f%%",
                     p->default_power_gpu, p->default_power_cpu, p->idle_fraction * 100);
            if (add_assumption(arr, "device power where the inventory gives none", v, "assumed"))
                goto fail;
        }
        if (any & PX_COST_ASSUMED_MTBF) {
            fmt_qty(p->default_mtbf_s, PX_DIM_TIME, v, sizeof v);
            if (add_assumption(arr, "device MTBF where the inventory gives none", v, "assumed"))
                goto fail;
        }
        if (any & PX_COST_ASSUMED_HOST_LINK) {
            fmt_qty(p->host_link_bw, PX_DIM_BANDWIDTH, v, sizeof v);
            if (add_assumption(arr, "device-to-host link where none is declared", v,
                               "assumed: PCIe 4.0 x16"))
                goto fail;
        }
        bool cores = false;
        for (size_t i = 0; i < f->n_devices; i++)
            cores |= f->devices[i].host_cores > 0 &&
                     (f->devices[i].host_busy_mem > 0 || f->devices[i].host_busy_compute > 0);
        if (cores &&
            add_assumption(arr, "host cores shared by the stages run on them",
                           "one thread per stage worker; an emulated device keeps a core busy "
                           "for 1/slowdown of its time; the executor's round trip is host work",
                           "the inventory's node cpu cores; a step lasts at least the core-seconds "
                           "it asks of a node over its cores"))
            goto fail;
        if (any & PX_COST_ASSUMED_MEM_BW) {
            if (add_assumption(arr, "memory bandwidth of devices stating none", "20 GB/s",
                               "assumed"))
                goto fail;
        }
    }
    if (p->mode == PX_COST_CALIBRATED && p->calibration &&
        px__cost_calib_assumptions(arr, f, m, p) != PX_OK)
        goto fail;
    if (m && m->ir && !m->dit) {
        /* The cache's dtype decides its size: say where it comes from. */
        bool preset = px_ir_model_source(m->ir) == PX_IR_SOURCE_PRESET;
        if (add_assumption(arr, "KV-cache dtype", px_dtype_name(m->kv_dtype),
                           preset ? "model preset: the cache is kept in the weights' dtype when "
                                    "they are 16-bit, as the deployments of the preset's source "
                                    "keep it (--kv-dtype chooses another)"
                                  : "the model file as opened: the dtype the plexus runtime keeps "
                                    "the cache in (--kv-dtype chooses another)"))
            goto fail;
    }
    if (m && m->ir && m->n_layers > 0 && m->layers[0].n_experts > 0) {
        if (add_assumption(arr, "MoE expert traffic", "uniform routing",
                           "model IR: E*(1-(1-k/E)^n) distinct experts per step"))
            goto fail;
    }
    return arr;
fail:
    json_decref(arr);
    return NULL;
}
