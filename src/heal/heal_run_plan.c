/* Starting a plan in a healed run: its executor, with the run's lasting
 * faults put back on it; the plan's predicted step time; the run's clock.
 * A leaf of the heal_run files: the supervisor (heal_run.c), its actions
 * and its checks call in here, and nothing here calls back. */
#include "heal/heal_run_impl.h"

double px__hr_now(const px_heal_run *h)
{
    return (double)(px_now_ns() - h->t0_ns) / 1e9;
}

/* The plan's predicted decode time of one step: its stages' decode
 * times one after the other (p50, or hi). */
double px__hr_pred_step(const px_rt_pipeline_spec *spec, bool hi)
{
    double t = 0;
    for (uint32_t i = 0; i < spec->n_stages; i++) {
        double v = hi ? spec->stages[i].pred_decode_s.hi : spec->stages[i].pred_decode_s.p50;
        if (!(v > 0) || !isfinite(v))
            return NAN;
        t += v;
    }
    return spec->n_stages ? t : NAN;
}

/* Whether the plan that runs now still holds `device`. */
static int stage_of_device(const px_rt_pipeline_spec *spec, const char *device)
{
    for (uint32_t i = 0; i < spec->n_stages; i++)
        if (device[0] && !strcmp(spec->stages[i].device, device))
            return (int)i;
    return -1;
}

/* Puts the lasting faults back on a new executor whose plan uses their
 * device or hop: a slow device stays slow in every plan that keeps it. */
static void reapply_conditions(px_heal_run *h, px_rt_executor *ex)
{
    const px_rt_pipeline_spec *spec = px_rt_executor_spec(ex);
    for (size_t i = 0; i < h->n_conds; i++) {
        const hr_cond *c = &h->conds[i];
        int s = stage_of_device(spec, c->device);
        if (s < 0)
            continue;
        if (c->fault.kind == PX_RT_FAULT_LINK) {
            bool last = (uint32_t)s + 1 == spec->n_stages;
            const char *next = last ? "executor" : spec->stages[s + 1].device;
            if (strcmp(next, c->link_to) != 0)
                continue;
        }
        px_rt_fault f = c->fault;
        f.stage = (uint32_t)s;
        px_err e;
        if (px_rt_executor_inject(ex, &f, &e) != PX_OK)
            px_log_warn("heal: cannot put the %s fault back on %s: %s",
                        px_rt_fault_kind_name(f.kind), c->device, e.msg);
    }
}

px_status px__hr_start_plan(px_heal_run *h, const json_t *plan, px_rt_executor **out, px_err *err)
{
    px_rt_pipeline_spec spec;
    px_status st = px_rt_pipeline_spec_from_plan(plan, h->o.graph, "plan", &spec, err);
    if (st != PX_OK)
        return st;
    if ((st = px_rt_executor_new(&spec, &h->o.executor, out, err)) != PX_OK)
        return st;
    reapply_conditions(h, *out);
    return PX_OK;
}
