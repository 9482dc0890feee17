/* What a plan states it assumed: the sourced figures and parameters it
 * used, and its calibration overlay with, for each correction, whether it
 * applies to the fleet and model or why not. */
#include "base/common.h"

#include "cost/cost_impl.h"

static bool device_in_fleet(const px_cost_fleet *f, const char *id)
{
    for (size_t i = 0; f && i < f->n_devices; i++)
        if (!strcmp(f->devices[i].id, id))
            return true;
    return false;
}

static bool link_kind_in_fleet(const px_cost_fleet *f, const char *kind)
{
    if (!f)
        return false;
    const px_hw_view *v = px_hw_graph_view(f->graph);
    for (size_t i = 0; i < v->n_links; i++)
        if (!strcmp(px_hw_link_kind_name(v->links[i].kind), kind))
            return true;
    return false;
}

/* Weight bytes one block of the model reads per decode step at the stored
 * precision (the largest block: a correction must cover every block). */
static void block_bytes(const px_cost_model *m, double *lo, double *hi)
{
    *lo = INFINITY;
    *hi = 0;
    for (uint32_t i = 0; m && i < m->n_layers; i++) {
        double b = m->layers[i].attn_bytes + m->layers[i].ffn_bytes;
        *lo = PX_MIN(*lo, b);
        *hi = PX_MAX(*hi, b);
    }
}

/* The step class's size at one row per step (the plan's workload may
 * batch more; the evaluation checks the range at its own size). */
static double step_size(const px_cost_model *m)
{
    px_cost_workload wl = px_cost_workload_default();
    return px_cost_step_size(m, &wl);
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

/* Appends to arr (a plan's assumptions) the calibration overlay and, for
 * each correction, whether it applies to this fleet and model (at the
 * stored precision) or why it is refused.  PX_ENOMEM. */
static px_status calib_assumptions(json_t *arr, const px_cost_fleet *f, const px_cost_model *m,
                                   const px_cost_params *p)
{
    const px_cost_calibration *cal = p->calibration;
    char name[160], value[160], source[800];
    size_t n = px_cost_calibration_count(cal);
    snprintf(value, sizeof value, "sha256:%s, %zu correction%s", px_cost_calibration_digest(cal), n,
             n == 1 ? "" : "s");
    if (add_assumption(arr, "calibration overlay (mode calibrated)", value,
                       "plexus.calibration/1: measured corrections on top of the sourced figures, "
                       "which are unchanged; a correction applies only inside its validity range "
                       "and for its dtype"))
        return PX_ENOMEM;
    double blo, bhi;
    block_bytes(m, &blo, &bhi);
    for (size_t i = 0; i < n; i++) {
        const px_cost_correction *c = px_cost_calibration_at(cal, i);
        const char *dt = c->dtype == PX_DTYPE_COUNT_ ? "any dtype" : px_dtype_name(c->dtype);
        snprintf(name, sizeof name, "calibration: %s %s (%s)", c->device,
                 px_cost_op_class_name(c->cls), dt);
        snprintf(value, sizeof value, "%.4g s + x%.4g [%.4g, %.4g] (%.0f%%, %u sample%s)",
                 c->offset_s, c->factor, c->lo, c->hi, 100 * c->confidence, c->n_samples,
                 c->n_samples == 1 ? "" : "s");
        char why[400];
        bool known = c->cls == PX_COST_CLASS_COPY ? link_kind_in_fleet(f, c->device)
                                                  : device_in_fleet(f, c->device);
        if (!known) {
            snprintf(why, sizeof why, "not applied: no %s \"%s\" in this inventory",
                     c->cls == PX_COST_CLASS_COPY ? "link of kind" : "device", c->device);
        } else if (c->dtype != PX_DTYPE_COUNT_ && m && c->dtype != m->weight_dtype) {
            snprintf(why, sizeof why,
                     "not applied: measured with %s weights, the model stores %s (a plan at "
                     "another precision may use it)",
                     px_dtype_name(c->dtype), px_dtype_name(m->weight_dtype));
        } else if (c->cls == PX_COST_CLASS_MATVEC && m &&
                   (bhi > c->valid_hi || blo < c->valid_lo)) {
            char a[32], b[32], x[32], y[32];
            px_qty_format(c->valid_lo, PX_DIM_BYTES, a, sizeof a);
            px_qty_format(c->valid_hi, PX_DIM_BYTES, b, sizeof b);
            px_qty_format(blo, PX_DIM_BYTES, x, sizeof x);
            px_qty_format(bhi, PX_DIM_BYTES, y, sizeof y);
            snprintf(why, sizeof why,
                     "not applied: outside its validity range (valid for %s to %s of weights "
                     "per block; this model's blocks read %s to %s): the sourced figures are "
                     "used",
                     a, b, x, y);
        } else if (c->cls == PX_COST_CLASS_STEP && m &&
                   (step_size(m) > c->valid_hi || step_size(m) < c->valid_lo)) {
            snprintf(why, sizeof why,
                     "not applied: outside its validity range (valid for %.4g to %.4g bytes of "
                     "logits per step; this model's are %.4g): the sourced host time per "
                     "row is used",
                     c->valid_lo, c->valid_hi, step_size(m));
        } else if (c->cls == PX_COST_CLASS_STEP) {
            snprintf(why, sizeof why,
                     "applied: the host's work per step (the executor's round trip, sampling "
                     "and token handling), %.4g s plus %.4g s per row, is added to the time per "
                     "token of pipelines whose first stage runs on %s, where the logits per step "
                     "lie in [%.4g, %.4g] bytes",
                     c->offset_s, c->factor * p->host_row_s, c->device, c->valid_lo, c->valid_hi);
        } else {
            snprintf(why, sizeof why,
                     "applies where a stage's size lies in its validity range [%.4g, %.4g] %s",
                     c->valid_lo, c->valid_hi,
                     c->cls == PX_COST_CLASS_MATVEC      ? "bytes of weights per block"
                     : c->cls == PX_COST_CLASS_ATTENTION ? "positions of context"
                     : c->cls == PX_COST_CLASS_MATMUL    ? "rows per prefill step"
                     : c->cls == PX_COST_CLASS_DECODE
                         ? "rows per decode step (from 2: a step of one row is the matvec and "
                           "attention classes')"
                         : "bytes per transfer");
        }
        snprintf(source, sizeof source, "%s, %s; %s", c->dataset[0] ? c->dataset : "unnamed data",
                 c->timestamp, why);
        if (add_assumption(arr, name, value, source))
            return PX_ENOMEM;
    }
    return PX_OK;
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
    if (p->mode == PX_COST_CALIBRATED && p->calibration && calib_assumptions(arr, f, m, p) != PX_OK)
        goto fail;
    if (m && m->ir && !m->dit) {
        /* The cache's dtype decides its size: say where it comes from. */
        bool preset = px_ir_model_source(m->ir) == PX_IR_SOURCE_PRESET;
        if (add_assumption(arr, "KV-cache dtype", px_dtype_name(m->kv_dtype),
                           px_ir_model_kv_dtype_given(m->ir)
                               ? "--kv-dtype, as given: the cache is costed in that dtype"
                           : preset
                               ? "model preset: the cache is kept in the weights' dtype when "
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
