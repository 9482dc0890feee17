/* The healer's table of plans in the simulator: adding a candidate (the
 * same plan id is the same plan), finding a plan and the devices it uses,
 * and the first error of a run.  A leaf of the heal_sim files: the life
 * cycle (heal_sim.c), detection and actions call in here, and nothing here
 * calls back. */
#include "base/common.h"

#include "heal/heal_sim_impl.h"

bool px__hs_plan_uses(const px_sim_plan *p, uint32_t device)
{
    for (size_t r = 0; r < p->n_replicas; r++)
        for (uint32_t i = 0; i < p->replicas[r].n_stages; i++)
            for (uint32_t j = 0; j < p->replicas[r].stages[i].n_devices; j++)
                if (p->replicas[r].stages[i].devices[j] == device)
                    return true;
    return false;
}

size_t px__hs_plan_index(const px_heal_sim *h, const px_sim_plan *p)
{
    for (size_t i = 0; i < h->n_plans; i++)
        if (&h->plans[i]->sim == p)
            return i;
    return h->n_plans;
}

px_status px__hs_add_plan(px_heal_sim *h, json_t *doc, size_t *index, px_err *err)
{
    /* The same plan document (by id) is the same plan: a rollback or a
     * repeated adaptation reuses it, so the engine switches back to it. */
    const char *id = json_string_value(json_object_get(doc, "id"));
    for (size_t i = 0; id && i < h->n_plans; i++) {
        const char *have = json_string_value(json_object_get(h->plans[i]->doc, "id"));
        if (have && !strcmp(have, id)) {
            json_decref(doc);
            *index = i;
            return PX_OK;
        }
    }
    if (h->n_plans == PX__HS_PLANS) {
        json_decref(doc);
        return px_err_set(err, PX_ELIMIT, "heal: more than %d plans in one run", PX__HS_PLANS);
    }
    px__hs_base *nb = realloc(h->base, (h->n_plans + 1) * sizeof *nb);
    px__hs_plan *p = calloc(1, sizeof *p);
    if (nb)
        h->base = nb;
    if (!nb || !p) {
        free(p);
        json_decref(doc);
        return px_err_set(err, PX_ENOMEM, "heal: out of memory adding a plan");
    }
    memset(&h->base[h->n_plans], 0, sizeof *h->base);
    px_status st = px_sim_plan_from_json(doc, h->o.ctx.graph, &p->sim, err);
    if (st != PX_OK) {
        free(p);
        json_decref(doc);
        return st;
    }
    if (h->n_plans && p->sim.n_devices != h->n_devices) {
        px_sim_plan_release(&p->sim);
        free(p);
        json_decref(doc);
        return px_err_set(err, PX_EINVAL, "heal: a candidate plan's device table differs");
    }
    p->doc = doc;
    *index = h->n_plans;
    h->plans[h->n_plans++] = p;
    return PX_OK;
}

void px__hs_note_error(px_heal_sim *h, const px_err *e)
{
    if (h->failed || !e || e->code == PX_OK)
        return;
    h->failed = true;
    h->first_err = *e;
}
