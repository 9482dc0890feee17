/* What a plan says about its calibration: the overlay it used and, for
 * each correction, whether it applies to the fleet and model or why not. */
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

static px_status add_entry(json_t *arr, const char *name, const char *value, const char *source)
{
    return px_json_push(
        arr, json_pack("{s:s, s:s, s:s}", "name", name, "value", value, "source", source));
}

px_status px__cost_calib_assumptions(json_t *arr, const px_cost_fleet *f, const px_cost_model *m,
                                     const px_cost_params *p)
{
    const px_cost_calibration *cal = p->calibration;
    char name[160], value[160], source[800];
    size_t n = px_cost_calibration_count(cal);
    snprintf(value, sizeof value, "sha256:%s, %zu correction%s", px_cost_calibration_digest(cal), n,
             n == 1 ? "" : "s");
    if (add_entry(arr, "calibration overlay (mode calibrated)", value,
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
                                                         : "bytes per transfer");
        }
        snprintf(source, sizeof source, "%s, %s; %s", c->dataset[0] ? c->dataset : "unnamed data",
                 c->timestamp, why);
        if (add_entry(arr, name, value, source))
            return PX_ENOMEM;
    }
    return PX_OK;
}
