/* Names of the heal module's enums, and the JSON forms of loci, findings
 * and candidates. */
#include "base/common.h"

#include "heal/heal_impl.h"

static const char *const class_names[PX_HEAL_FAULT_CLASS_COUNT_] = {
    "none",    "device-loss",     "domain-loss", "link-degrade", "link-loss", "interference",
    "thermal", "memory-pressure", "corruption",  "crash",        "hang",      "stale-topology",
};

const char *px_heal_fault_class_name(px_heal_fault_class c)
{
    return (unsigned)c < PX_HEAL_FAULT_CLASS_COUNT_ ? class_names[c] : "unknown";
}

static const char *const action_names[PX_HEAL_ACTION_COUNT_] = {
    "none", "repartition",    "reroute",       "rebatch", "relayout", "lower-precision",
    "pace", "restart-worker", "fallback-plan",
};

const char *px_heal_action_name(px_heal_action a)
{
    return (unsigned)a < PX_HEAL_ACTION_COUNT_ ? action_names[a] : "unknown";
}

const char *px_heal_locus_kind_name(px_heal_locus_kind k)
{
    switch (k) {
    case PX_HEAL_AT_NOTHING:
        return "nothing";
    case PX_HEAL_AT_DEVICE:
        return "device";
    case PX_HEAL_AT_COMPUTE:
        return "compute";
    case PX_HEAL_AT_LINK:
        return "link";
    case PX_HEAL_AT_DOMAIN:
        return "domain";
    }
    return "unknown";
}

double px__heal_median(const double *v, size_t n)
{
    if (n == 0)
        return NAN;
    double tmp[256];
    double *w = n <= PX_ARRAY_LEN(tmp) ? tmp : malloc(n * sizeof *w);
    if (!w)
        return NAN;
    memcpy(w, v, n * sizeof *w);
    /* Insertion sort: the windows here are small. */
    for (size_t i = 1; i < n; i++) {
        double x = w[i];
        size_t j = i;
        while (j > 0 && w[j - 1] > x) {
            w[j] = w[j - 1];
            j--;
        }
        w[j] = x;
    }
    double m = n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
    if (w != tmp)
        free(w);
    return m;
}

json_t *px__heal_num(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

px_status px__heal_set_num(json_t *o, const char *key, double x)
{
    return px_json_set(o, key, px__heal_num(x));
}

void px__heal_textf(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    px_textfv(buf, cap, fmt, ap);
    va_end(ap);
}

void px__heal_fmt_s(double s, char *buf, size_t cap)
{
    if (!isfinite(s))
        snprintf(buf, cap, "unknown");
    else if (s >= 1)
        snprintf(buf, cap, "%.3g s", s);
    else if (s >= 1e-3)
        snprintf(buf, cap, "%.3g ms", s * 1e3);
    else
        snprintf(buf, cap, "%.3g us", s * 1e6);
}

json_t *px_heal_locus_to_json(const px_heal_locus *l)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    bool staged =
        l->kind == PX_HEAL_AT_DEVICE || l->kind == PX_HEAL_AT_COMPUTE || l->kind == PX_HEAL_AT_LINK;
    if (px_json_set(o, "kind", json_string(px_heal_locus_kind_name(l->kind))) ||
        (staged && px_json_set(o, "stage", json_integer(l->stage))) ||
        (l->kind == PX_HEAL_AT_LINK && px_json_set(o, "to", json_integer(l->to))) ||
        px_json_set(o, "device", json_string(l->device))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *px_heal_finding_to_json(const px_heal_finding *f)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (px_json_set(o, "class", json_string(px_heal_fault_class_name(f->cls))) ||
        px_json_set(o, "locus", px_heal_locus_to_json(&f->locus)) ||
        px__heal_set_num(o, "ratio", f->ratio) ||
        px__heal_set_num(o, "baseline_s", f->baseline_s) ||
        px__heal_set_num(o, "observed_s", f->observed_s) ||
        px_json_set(o, "onset_step", json_integer((json_int_t)f->onset_step)) ||
        px_json_set(o, "confirmed_step", json_integer((json_int_t)f->confirmed_step)) ||
        px__heal_set_num(o, "onset_t_s", f->onset_t_s) ||
        px__heal_set_num(o, "confirmed_t_s", f->confirmed_t_s) ||
        px_json_set(o, "intermittent", json_boolean(f->intermittent)) ||
        px_json_set(o, "evidence", json_string(f->evidence))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

void px_heal_candidates_free(px_heal_candidate *c, size_t n)
{
    if (!c)
        return;
    for (size_t i = 0; i < n; i++)
        json_decref(c[i].plan);
    free(c);
}

json_t *px_heal_candidate_to_json(const px_heal_candidate *c)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    const json_t *id = c->plan ? json_object_get(c->plan, "id") : NULL;
    json_t *reason = c->accepted ? json_null() : json_string(c->reject_reason);
    json_t *code = c->accepted ? json_null() : json_string(c->reject_code);
    if (px_json_set(o, "action", json_string(px_heal_action_name(c->action))) ||
        px_json_set(o, "label", json_string(c->label)) ||
        px_json_set(o, "plan", json_is_string(id) ? json_copy((json_t *)id) : json_null()) ||
        px_json_set(o, "max_batch", json_integer(c->max_batch)) ||
        px_json_set(o, "validated", json_boolean(c->validated)) ||
        px__heal_set_num(o, "tpot_p50_s", c->validated ? c->tpot_p50_s : NAN) ||
        px__heal_set_num(o, "tpot_p99_s", c->validated ? c->tpot_p99_s : NAN) ||
        px__heal_set_num(o, "throughput", c->validated ? c->throughput : NAN) ||
        px_json_set(o, "feasible", json_boolean(c->feasible)) ||
        px_json_set(o, "contract_ok", json_boolean(c->contract_ok)) ||
        px_json_set(o, "slo_ok", json_boolean(c->slo_ok)) ||
        px_json_set(o, "accepted", json_boolean(c->accepted)) ||
        px_json_set(o, "reject_code", code) || px_json_set(o, "reject_reason", reason)) {
        json_decref(o);
        return NULL;
    }
    return o;
}
