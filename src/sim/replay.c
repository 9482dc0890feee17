/* Re-deriving a simulation from its trace: the "simulate" decision is a
 * pure function of the recorded plan, inventory, load, faults and
 * options, so replay runs it again and compares. */
#include "base/common.h"

#include "sim/sim_impl.h"

static px_status derive_simulate(void *ctx, const px_trace_event *recorded, const json_t *history,
                                 json_t **out, px_err *err)
{
    (void)ctx;
    (void)recorded;
    *out = NULL;
    const json_t *plan_doc = json_object_get(history, "plan");
    const json_t *load_doc = json_object_get(history, "load");
    const json_t *faults_doc = json_object_get(history, "faults");
    const json_t *opt_doc = json_object_get(history, "options");
    const json_t *inv_doc = json_object_get(history, "inventory");
    if (!plan_doc || !load_doc || !opt_doc)
        return px_err_set(err, PX_EPARSE,
                          "simulate: the trace lacks the plan, load or options "
                          "input");
    px_hw_graph *graph = NULL;
    px_sim_plan plan = {0};
    px_sim_load load = {0};
    px_sim_faults faults = {0};
    px_sim_options opt;
    px_sim_result res = {0};
    px_status st;
    if (inv_doc && !json_is_null(inv_doc) &&
        (st = px_hw_graph_from_value(inv_doc, "inventory", NULL, &graph, NULL, err)) != PX_OK)
        goto done;
    if ((st = px_sim_plan_from_json(plan_doc, graph, &plan, err)) != PX_OK ||
        (st = px_sim_load_from_json(load_doc, &load, err)) != PX_OK ||
        (st = px_sim_options_from_json(opt_doc, &opt, err)) != PX_OK)
        goto done;
    if (faults_doc && !json_is_null(faults_doc)) {
        char *text = px_json_dump_line(faults_doc);
        if (!text) {
            st = px_err_set(err, PX_ENOMEM, "simulate: out of memory");
            goto done;
        }
        st = px_sim_faults_parse(text, strlen(text), "recorded faults", &faults, err);
        free(text);
        if (st != PX_OK)
            goto done;
    }
    if ((st = px_sim_run(&plan, &load, faults.n ? &faults : NULL, &opt, &res, err)) != PX_OK)
        goto done;
    *out = px_sim_result_to_json(&res, &plan);
    if (!*out)
        st = px_err_set(err, PX_ENOMEM, "simulate: out of memory");
done:
    px_sim_result_release(&res);
    px_sim_faults_release(&faults);
    px_sim_load_release(&load);
    px_sim_plan_release(&plan);
    px_hw_graph_free(graph);
    return st;
}

static const px_trace_deriver derivers[] = {
    {"simulate", derive_simulate},
};

const px_trace_deriver *px_sim_replay_derivers(size_t *n)
{
    if (n)
        *n = PX_ARRAY_LEN(derivers);
    return derivers;
}
