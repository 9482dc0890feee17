/* The completeness check of plexus.incident/1 records
 * (docs/formats/incident.md). */
#include "base/common.h"

#include "heal/heal_impl.h"

enum {
    T_STR = 1 << 0,
    T_NUM = 1 << 1, /* integer or real */
    T_INT = 1 << 2,
    T_BOOL = 1 << 3,
    T_OBJ = 1 << 4,
    T_ARR = 1 << 5,
    T_NULL = 1 << 6,
};

static bool type_ok(const json_t *v, unsigned types)
{
    return ((types & T_STR) && json_is_string(v)) || ((types & T_NUM) && json_is_number(v)) ||
           ((types & T_INT) && json_is_integer(v)) || ((types & T_BOOL) && json_is_boolean(v)) ||
           ((types & T_OBJ) && json_is_object(v)) || ((types & T_ARR) && json_is_array(v)) ||
           ((types & T_NULL) && json_is_null(v));
}

static const char *types_text(unsigned t)
{
    switch (t) {
    case T_STR:
        return "a string";
    case T_NUM:
        return "a number";
    case T_NUM | T_NULL:
        return "a number or null";
    case T_INT:
        return "an integer";
    case T_INT | T_NULL:
        return "an integer or null";
    case T_BOOL:
        return "true or false";
    case T_OBJ:
        return "an object";
    case T_OBJ | T_NULL:
        return "an object or null";
    case T_ARR:
        return "an array";
    case T_STR | T_NULL:
        return "a string or null";
    default:
        return "another type";
    }
}

/* The member, or NULL with err naming "/path/key". */
static const json_t *member(const json_t *o, const char *path, const char *key, unsigned types,
                            px_err *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v) {
        px_err_set(err, PX_EVALIDATE, "incident: %s/%s: missing; see docs/formats/incident.md",
                   path, key);
        return NULL;
    }
    if (!type_ok(v, types)) {
        px_err_set(err, PX_EVALIDATE, "incident: %s/%s: expected %s, got %s", path, key,
                   types_text(types), px_json_type_name(v));
        return NULL;
    }
    if ((types & T_STR) && json_is_string(v) && !json_string_length(v) && !(types & T_NULL)) {
        px_err_set(err, PX_EVALIDATE, "incident: %s/%s: empty; say what it is", path, key);
        return NULL;
    }
    return v;
}

typedef struct field {
    const char *key;
    unsigned types;
} field;

static bool members(const json_t *o, const char *path, const field *f, size_t n, px_err *err)
{
    for (size_t i = 0; i < n; i++)
        if (!member(o, path, f[i].key, f[i].types, err))
            return false;
    return true;
}

static bool one_of(const json_t *v, const char *path, const char *const *names, size_t n,
                   const char *accepted, px_err *err)
{
    const char *s = json_string_value(v);
    for (size_t i = 0; s && i < n; i++)
        if (!strcmp(s, names[i]))
            return true;
    px_err_set(err, PX_EVALIDATE, "incident: %s: \"%.40s\" is not one of %s", path, s ? s : "",
               accepted);
    return false;
}

static bool class_ok(const json_t *v, const char *path, px_err *err)
{
    const char *s = json_string_value(v);
    for (int c = 0; s && c < PX_HEAL_FAULT_CLASS_COUNT_; c++)
        if (!strcmp(s, px_heal_fault_class_name((px_heal_fault_class)c)))
            return true;
    px_err_set(err, PX_EVALIDATE,
               "incident: %s: \"%.40s\" is no fault class; use a name of px_heal_fault_class "
               "(\"device-loss\", \"link-degrade\", ...)",
               path, s ? s : "");
    return false;
}

static bool candidates_ok(const json_t *arr, size_t *n_accepted, px_err *err)
{
    static const field cand[] = {{"action", T_STR}, {"label", T_STR}, {"accepted", T_BOOL}};
    size_t i;
    const json_t *c;
    *n_accepted = 0;
    json_array_foreach(arr, i, c)
    {
        char path[48];
        snprintf(path, sizeof path, "/candidates/%zu", i);
        if (!json_is_object(c)) {
            px_err_set(err, PX_EVALIDATE, "incident: %s: expected an object", path);
            return false;
        }
        if (!members(c, path, cand, PX_ARRAY_LEN(cand), err))
            return false;
        if (json_is_true(json_object_get(c, "accepted"))) {
            (*n_accepted)++;
            continue;
        }
        if (!member(c, path, "reject_code", T_STR, err) ||
            !member(c, path, "reject_reason", T_STR, err))
            return false;
    }
    return true;
}

bool px_heal_incident_complete(const json_t *incident, px_err *err)
{
    if (!json_is_object(incident)) {
        px_err_set(err, PX_EVALIDATE, "incident: expected an object");
        return false;
    }
    static const field top[] = {
        {"schema", T_STR},
        {"id", T_STR},
        {"kind", T_STR},
        {"cause", T_OBJ},
        {"signature", T_OBJ},
        {"detection", T_OBJ},
        {"localization", T_OBJ},
        {"candidates", T_ARR},
        {"choice", T_OBJ},
        {"canary", T_OBJ},
        {"rollback", T_OBJ | T_NULL},
        {"predicted", T_OBJ},
        {"realized", T_OBJ},
        {"timeline", T_ARR},
        {"rto_s", T_NUM | T_NULL},
        {"rpo_tokens", T_INT | T_NULL},
        {"lost_work", T_OBJ},
        {"reproducer", T_OBJ},
    };
    if (!members(incident, "", top, PX_ARRAY_LEN(top), err))
        return false;
    if (strcmp(json_string_value(json_object_get(incident, "schema")), PX_HEAL_INCIDENT_SCHEMA)) {
        px_err_set(err, PX_EVALIDATE, "incident: /schema: expected \"%s\"",
                   PX_HEAL_INCIDENT_SCHEMA);
        return false;
    }
    static const char *const kinds[] = {"recovery", "adaptation"};
    if (!one_of(json_object_get(incident, "kind"), "/kind", kinds, 2, "recovery, adaptation", err))
        return false;

    const json_t *cause = json_object_get(incident, "cause");
    static const field cause_f[] = {{"class", T_STR}, {"inject", T_OBJ | T_NULL}};
    if (!members(cause, "/cause", cause_f, PX_ARRAY_LEN(cause_f), err) ||
        !class_ok(json_object_get(cause, "class"), "/cause/class", err))
        return false;

    const json_t *sig = json_object_get(incident, "signature");
    static const field sig_f[] = {
        {"class", T_STR}, {"locus", T_OBJ}, {"evidence", T_STR}, {"onset", T_OBJ}};
    static const field onset_f[] = {{"t_s", T_NUM}, {"step", T_INT | T_NULL}};
    if (!members(sig, "/signature", sig_f, PX_ARRAY_LEN(sig_f), err) ||
        !class_ok(json_object_get(sig, "class"), "/signature/class", err) ||
        !member(json_object_get(sig, "locus"), "/signature/locus", "kind", T_STR, err) ||
        !members(json_object_get(sig, "onset"), "/signature/onset", onset_f, PX_ARRAY_LEN(onset_f),
                 err))
        return false;

    static const field det_f[] = {
        {"detector", T_STR}, {"detected_at_s", T_NUM}, {"time_to_detect_s", T_NUM}};
    if (!members(json_object_get(incident, "detection"), "/detection", det_f, PX_ARRAY_LEN(det_f),
                 err))
        return false;

    const json_t *loc = json_object_get(incident, "localization");
    static const field loc_f[] = {{"kind", T_STR},
                                  {"stage", T_INT | T_NULL},
                                  {"to", T_INT | T_NULL},
                                  {"device", T_STR | T_NULL},
                                  {"evidence", T_STR}};
    static const char *const loci[] = {"nothing", "device", "compute", "link", "domain"};
    if (!members(loc, "/localization", loc_f, PX_ARRAY_LEN(loc_f), err) ||
        !one_of(json_object_get(loc, "kind"), "/localization/kind", loci, PX_ARRAY_LEN(loci),
                "nothing, device, compute, link, domain", err))
        return false;

    const json_t *cands = json_object_get(incident, "candidates");
    size_t n_accepted;
    if (!candidates_ok(cands, &n_accepted, err))
        return false;

    const json_t *choice = json_object_get(incident, "choice");
    static const field choice_f[] = {
        {"index", T_INT}, {"action", T_STR}, {"label", T_STR}, {"why", T_STR}};
    if (!members(choice, "/choice", choice_f, PX_ARRAY_LEN(choice_f), err))
        return false;
    json_int_t idx = json_integer_value(json_object_get(choice, "index"));
    size_t n = json_array_size(cands);
    if (idx == -1) {
        if (n_accepted) {
            px_err_set(err, PX_EVALIDATE,
                       "incident: /choice/index: -1 (none chosen) although %zu candidates were "
                       "accepted",
                       n_accepted);
            return false;
        }
    } else {
        if (idx < 0 || (size_t)idx >= n) {
            px_err_set(err, PX_EVALIDATE,
                       "incident: /choice/index: %lld is not among the %zu candidates (-1: none)",
                       (long long)idx, n);
            return false;
        }
        const json_t *c = json_array_get(cands, (size_t)idx);
        if (!json_is_true(json_object_get(c, "accepted"))) {
            px_err_set(err, PX_EVALIDATE,
                       "incident: /choice/index: candidate %lld was rejected; choose an accepted "
                       "one",
                       (long long)idx);
            return false;
        }
        if (strcmp(json_string_value(json_object_get(c, "action")),
                   json_string_value(json_object_get(choice, "action")))) {
            px_err_set(err, PX_EVALIDATE,
                       "incident: /choice/action: differs from /candidates/%lld/action",
                       (long long)idx);
            return false;
        }
    }

    const json_t *canary = json_object_get(incident, "canary");
    static const field canary_f[] = {{"steps", T_INT},
                                     {"predicted_p50_s", T_NUM | T_NULL},
                                     {"observed_p50_s", T_NUM | T_NULL},
                                     {"verdict", T_STR}};
    static const char *const verdicts[] = {"pass", "fail", "pending", "none"};
    if (!members(canary, "/canary", canary_f, PX_ARRAY_LEN(canary_f), err) ||
        !one_of(json_object_get(canary, "verdict"), "/canary/verdict", verdicts, 4,
                "pass, fail, pending, none", err))
        return false;

    const json_t *rb = json_object_get(incident, "rollback");
    static const field rb_f[] = {{"why", T_STR}, {"to", T_STR}};
    if (json_is_object(rb) && !members(rb, "/rollback", rb_f, PX_ARRAY_LEN(rb_f), err))
        return false;

    if (!member(json_object_get(incident, "predicted"), "/predicted", "tpot_s", T_NUM | T_NULL,
                err) ||
        !member(json_object_get(incident, "realized"), "/realized", "tpot_s", T_NUM | T_NULL, err))
        return false;

    const json_t *tl = json_object_get(incident, "timeline");
    if (!json_array_size(tl)) {
        px_err_set(err, PX_EVALIDATE, "incident: /timeline: empty; list what happened when");
        return false;
    }
    size_t i;
    const json_t *ev;
    static const field ev_f[] = {{"t_s", T_NUM}, {"event", T_STR}};
    json_array_foreach(tl, i, ev)
    {
        char path[40];
        snprintf(path, sizeof path, "/timeline/%zu", i);
        if (!json_is_object(ev)) {
            px_err_set(err, PX_EVALIDATE, "incident: %s: expected an object", path);
            return false;
        }
        if (!members(ev, path, ev_f, PX_ARRAY_LEN(ev_f), err))
            return false;
    }

    static const field lw_f[] = {{"tokens", T_INT}, {"steps", T_INT}, {"seconds", T_NUM}};
    static const field rep_f[] = {{"trace", T_STR | T_NULL},
                                  {"first_seq", T_INT | T_NULL},
                                  {"last_seq", T_INT | T_NULL},
                                  {"command", T_STR}};
    if (!members(json_object_get(incident, "lost_work"), "/lost_work", lw_f, PX_ARRAY_LEN(lw_f),
                 err) ||
        !members(json_object_get(incident, "reproducer"), "/reproducer", rep_f, PX_ARRAY_LEN(rep_f),
                 err))
        return false;
    px_err_clear(err);
    return true;
}
