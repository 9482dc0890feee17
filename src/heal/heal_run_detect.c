/* Healing real runs: the detector over recorded steps, its calibration,
 * and the canary's verdict, as functions of recorded data only (the run
 * and its replay both call them), with their JSON forms for the trace. */
#include "heal/heal_run_impl.h"

/* The end of a refused step record: plexus writes none of these. */
#define STEP_FIX                                                                                \
    "; plexus writes no such step: replay the trace as plexus run --trace wrote it, or record " \
    "the run again"
#define INPUT_FIX                                                                          \
    "; plexus records no such input: replay the trace as plexus run --trace wrote it, or " \
    "record the run again"

/* Stage i's median compute over the n samples, over its predicted p50;
 * NAN when either is not known.  v has room for n values. */
static double stage_ratio(const px_heal_envelope *raw, const px_heal_sample *s, size_t n,
                          uint32_t i, double *v)
{
    double pred = raw->compute_p50[i];
    if (!(pred > 0) || !isfinite(pred))
        return NAN;
    size_t k = 0;
    for (size_t j = 0; j < n; j++)
        if (i < s[j].n_stages && isfinite(s[j].compute_s[i]))
            v[k++] = s[j].compute_s[i];
    return k ? px__heal_median(v, k) / pred : NAN;
}

double px__hr_calibrate(const px_heal_envelope *raw, const px_heal_sample *s, size_t n)
{
    double best = NAN;
    double *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return 1.0;
    for (uint32_t i = 0; i < raw->n_stages; i++) {
        double r = stage_ratio(raw, s, n, i, v);
        /* The stage the inventory describes best sets the scale: a stage
         * slower than its figures then keeps its own, larger ratio. */
        if (r > 0 && isfinite(r) && !(r >= best))
            best = r;
    }
    free(v);
    return best > 0 && isfinite(best) ? best : 1.0;
}

void px__hr_envelope_scale(const px_heal_envelope *raw, double c, const px_heal_sample *s, size_t n,
                           px_heal_envelope *out)
{
    *out = *raw;
    for (uint32_t i = 0; i < PX_RT_MAX_STAGES; i++) {
        out->compute_p50[i] = raw->compute_p50[i] * c;
        out->compute_hi[i] = raw->compute_hi[i] * c;
    }
    /* The plan's time per attended position, on the scale its stage runs
     * at here: a stage slower than its figures (its baseline above its
     * predicted step) attends slower too.  Never scaled down: a baseline
     * taken early in a generation attends fewer positions than the
     * plan's step, so a ratio below 1 speaks of the positions, not the
     * device.  Not by c either: c is the best-described stage's. */
    double *v = malloc((n ? n : 1) * sizeof *v);
    for (uint32_t i = 0; v && i < raw->n_stages && i < PX_RT_MAX_STAGES; i++) {
        double r = stage_ratio(raw, s, n, i, v);
        if (r > 1 && isfinite(r))
            out->attention_pos_s[i] = raw->attention_pos_s[i] * r;
    }
    free(v);
}

static json_t *reals(const double *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, px__heal_num(v[i]));
    return a;
}

/* What a value is, for refusals: "a string", "an object", ...; a
 * fraction where a whole number belongs is "a real". */
static const char *json_kind(const json_t *v)
{
    return json_is_real(v) ? "a real" : px_json_type_name(v);
}

/* Reads n reals (null: NAN, not known) of `what` in record `rec`.  A
 * step's times (step: true) are seconds, never negative. */
static px_status read_reals(const json_t *a, const char *rec, const char *what, bool step,
                            double *out, size_t n, px_err *err)
{
    const char *fix = step ? STEP_FIX : INPUT_FIX;
    if (!json_is_array(a) || json_array_size(a) != n) {
        char got[48];
        if (json_is_array(a))
            px_textf(got, sizeof got, "an array of %zu", json_array_size(a));
        else
            px_strlcpy(got, json_kind(a), sizeof got);
        return px_err_set(err, PX_EPARSE,
                          "%s: \"%s\" is %s; it must be an array of %zu numbers (null: not "
                          "known)%s",
                          rec, what, got, n, fix);
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (json_is_null(v))
            out[i] = NAN;
        else if (json_is_number(v) && isfinite(json_number_value(v)))
            out[i] = json_number_value(v);
        else
            return px_err_set(err, PX_EPARSE,
                              "%s: \"%s\"[%zu] is %s; it must be a number or null%s", rec, what, i,
                              json_kind(v), fix);
        if (step && out[i] < 0)
            return px_err_set(err, PX_EPARSE, "%s: \"%s\"[%zu] is %g s; a time is never negative%s",
                              rec, what, i, out[i], fix);
    }
    return PX_OK;
}

json_t *px__hr_envelope_json(const px_heal_envelope *e)
{
    json_t *dev = json_array(), *host = json_array();
    for (uint32_t i = 0; dev && i < e->n_stages; i++)
        json_array_append_new(dev, json_string(e->device[i]));
    for (uint32_t i = 0; host && i < e->n_stages; i++)
        json_array_append_new(host, json_boolean(e->host_cores[i]));
    return json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "n_stages", (int)e->n_stages,
                     "compute_p50", reals(e->compute_p50, e->n_stages), "compute_hi",
                     reals(e->compute_hi, e->n_stages), "xfer_p50",
                     reals(e->xfer_p50, e->n_stages + 1), "xfer_hi",
                     reals(e->xfer_hi, e->n_stages + 1), "attention_s_per_position",
                     reals(e->attention_pos_s, e->n_stages), "devices", dev ? dev : json_array(),
                     "host_cores", host ? host : json_array());
}

px_status px__hr_envelope_from_json(const json_t *j, px_heal_envelope *e, px_err *err)
{
    memset(e, 0, sizeof *e);
    for (uint32_t i = 0; i <= PX_RT_MAX_STAGES; i++) {
        if (i < PX_RT_MAX_STAGES)
            e->compute_p50[i] = e->compute_hi[i] = e->attention_pos_s[i] = NAN;
        e->xfer_p50[i] = e->xfer_hi[i] = NAN;
    }
    if (!json_is_object(j))
        return px_err_set(err, PX_EPARSE,
                          "heal: the recorded envelope is %s; it must be an object%s", json_kind(j),
                          INPUT_FIX);
    const json_t *nj = json_object_get(j, "n_stages");
    json_int_t n = json_integer_value(nj);
    if (!json_is_integer(nj) || n < 1 || n > PX_RT_MAX_STAGES) {
        char got[48];
        if (json_is_integer(nj))
            px_textf(got, sizeof got, "%" JSON_INTEGER_FORMAT, n);
        else
            px_strlcpy(got, json_kind(nj), sizeof got);
        return px_err_set(err, PX_EPARSE,
                          "heal: the recorded envelope's \"n_stages\" is %s; it must be an integer "
                          "from 1 to %d%s",
                          got, PX_RT_MAX_STAGES, INPUT_FIX);
    }
    e->n_stages = (uint32_t)n;
    px_status st;
    const char *rec = "heal: the recorded envelope";
    if ((st = read_reals(json_object_get(j, "compute_p50"), rec, "compute_p50", false,
                         e->compute_p50, (size_t)n, err)) ||
        (st = read_reals(json_object_get(j, "compute_hi"), rec, "compute_hi", false, e->compute_hi,
                         (size_t)n, err)) ||
        (st = read_reals(json_object_get(j, "xfer_p50"), rec, "xfer_p50", false, e->xfer_p50,
                         (size_t)n + 1, err)) ||
        (st = read_reals(json_object_get(j, "xfer_hi"), rec, "xfer_hi", false, e->xfer_hi,
                         (size_t)n + 1, err)))
        return st;
    /* Traces written before envelopes carried it have none: no time per
     * position, as the detector then ran. */
    const json_t *att = json_object_get(j, "attention_s_per_position");
    if (att && (st = read_reals(att, rec, "attention_s_per_position", false, e->attention_pos_s,
                                (size_t)n, err)) != PX_OK)
        return st;
    for (uint32_t i = 0; i < e->n_stages; i++)
        if (e->attention_pos_s[i] < 0 || e->attention_pos_s[i] >= 1)
            return px_err_set(err, PX_EPARSE,
                              "%s: \"attention_s_per_position\"[%u] is %g; it is a time from 0 "
                              "to 1 s (or null)%s",
                              rec, i, e->attention_pos_s[i], INPUT_FIX);
    const json_t *dev = json_object_get(j, "devices");
    for (uint32_t i = 0; i < e->n_stages; i++) {
        const char *d = json_string_value(json_array_get(dev, i));
        px_strlcpy(e->device[i], d ? d : "", sizeof e->device[i]);
    }
    /* Traces written before envelopes said it: no stage on the host's
     * cores, as the detector then ran. */
    const json_t *host = json_object_get(j, "host_cores");
    if (host && (!json_is_array(host) || json_array_size(host) != (size_t)n))
        return px_err_set(err, PX_EPARSE,
                          "%s: \"host_cores\" must be an array of %u booleans, one per stage%s",
                          rec, e->n_stages, INPUT_FIX);
    for (uint32_t i = 0; host && i < e->n_stages; i++) {
        const json_t *b = json_array_get(host, i);
        if (!json_is_boolean(b))
            return px_err_set(err, PX_EPARSE,
                              "%s: \"host_cores\"[%u] is %s; it must be a boolean%s", rec, i,
                              json_kind(b), INPUT_FIX);
        e->host_cores[i] = json_is_true(b);
    }
    return PX_OK;
}

json_t *px__hr_detector_opts_json(const px_heal_detector_opts *o)
{
    return json_pack("{s:i, s:f, s:f, s:i, s:f, s:f}", "baseline_steps", (int)o->baseline_steps,
                     "ratio", o->ratio, "floor_s", o->floor_s, "confirm", (int)o->confirm,
                     "stale_ratio", o->stale_ratio, "host_stretch", o->host_stretch);
}

/* One recorded detector option: a number of the given kind within its
 * bounds (lo <= v <= hi, or lo < v < hi where `open`). */
static px_status read_opt(const json_t *j, const char *what, bool whole, bool open, double lo,
                          double hi, double *out, px_err *err)
{
    const char *rec = "heal: the recorded detector options";
    const json_t *v = json_object_get(j, what);
    if (!(whole ? json_is_integer(v) : json_is_number(v)))
        return px_err_set(err, PX_EPARSE, "%s: \"%s\" is %s; it must be %s%s", rec, what,
                          json_kind(v), whole ? "an integer" : "a number", INPUT_FIX);
    double x = json_number_value(v);
    if (!(open ? x > lo && x < hi : x >= lo && x <= hi))
        return px_err_set(err, PX_EPARSE, "%s: \"%s\" is %g; it must be %s %g and %s %g%s", rec,
                          what, x, open ? "over" : "at least", lo, open ? "under" : "at most", hi,
                          INPUT_FIX);
    *out = x;
    return PX_OK;
}

px_status px__hr_detector_opts_from_json(const json_t *j, px_heal_detector_opts *o, px_err *err)
{
    if (!json_is_object(j))
        return px_err_set(err, PX_EPARSE,
                          "heal: the recorded detector options are %s; they must be an object%s",
                          json_kind(j), INPUT_FIX);
    double b = 0, c = 0, r = 0, f = 0, s = 0, h = 1;
    px_status st;
    if ((st = read_opt(j, "baseline_steps", true, false, 1, 4096, &b, err)) ||
        (st = read_opt(j, "confirm", true, false, 1, 64, &c, err)) ||
        (st = read_opt(j, "ratio", false, true, 1, 1e6, &r, err)) ||
        (st = read_opt(j, "floor_s", false, false, 0, 1e3, &f, err)) ||
        (st = read_opt(j, "stale_ratio", false, true, 1, 1e6, &s, err)))
        return st;
    /* Traces written before it: no stretch, as the detector then ran. */
    if (json_object_get(j, "host_stretch") &&
        (st = read_opt(j, "host_stretch", false, false, 1, 64, &h, err)) != PX_OK)
        return st;
    *o = (px_heal_detector_opts){.baseline_steps = (uint32_t)b,
                                 .ratio = r,
                                 .floor_s = f,
                                 .confirm = (uint32_t)c,
                                 .stale_ratio = s,
                                 .host_stretch = h};
    return PX_OK;
}

json_t *px__hr_sample_json(const px_heal_sample *s, double wall_s)
{
    return json_pack("{s:I, s:f, s:f, s:o, s:o, s:I, s:I, s:o, s:o}", "step", (json_int_t)s->step,
                     "t_s", s->t_s, "wall_s", wall_s, "compute_s", reals(s->compute_s, s->n_stages),
                     "xfer_s", reals(s->xfer_s, s->n_stages + 1), "rows", (json_int_t)s->rows,
                     "context", (json_int_t)s->context, "wait_s", reals(s->wait_s, s->n_stages),
                     "xfer_wait_s", reals(s->xfer_wait_s, s->n_stages + 1));
}

/* Of each time in `times`, the part in `waits` that its thread waited
 * for a core: absent (an older trace: 0, nothing left out), or one entry
 * per time, from 0 to that time. */
static px_status read_waits(const json_t *j, const char *rec, const char *what, const char *of_what,
                            const double *times, double *waits, size_t n, px_err *err)
{
    const json_t *a = json_object_get(j, what);
    if (!a)
        return PX_OK;
    px_status st = read_reals(a, rec, what, true, waits, n, err);
    for (size_t i = 0; st == PX_OK && i < n; i++)
        if (waits[i] > times[i]) /* false where either is not known */
            return px_err_set(err, PX_EPARSE,
                              "%s: \"%s\"[%zu] is %g s, more than the %g s of \"%s\"[%zu] it is "
                              "part of%s",
                              rec, what, i, waits[i], times[i], of_what, i, STEP_FIX);
    return st;
}

px_status px__hr_sample_from_json(const json_t *j, const char *name, px_heal_sample *s,
                                  double *wall_s, px_err *err)
{
    memset(s, 0, sizeof *s);
    char rec[160];
    px_textf(rec, sizeof rec, "heal: step record \"%s\"", name ? name : "(unnamed)");
    if (!json_is_object(j))
        return px_err_set(err, PX_EPARSE, "%s is %s; it must be an object%s", rec, json_kind(j),
                          STEP_FIX);
    const json_t *c = json_object_get(j, "compute_s");
    size_t n = json_array_size(c);
    const json_t *jstep = json_object_get(j, "step");
    const json_t *t = json_object_get(j, "t_s"), *w = json_object_get(j, "wall_s");
    if (!json_is_integer(jstep) || json_integer_value(jstep) < 0)
        return px_err_set(err, PX_EPARSE, "%s: \"step\" is %s%s; it must be an integer from 0%s",
                          rec, json_kind(jstep), json_is_integer(jstep) ? " below 0" : "",
                          STEP_FIX);
    if (!json_is_number(t) || !json_is_number(w) || json_number_value(t) < 0 ||
        json_number_value(w) < 0)
        return px_err_set(err, PX_EPARSE,
                          "%s: \"t_s\" (%s) and \"wall_s\" (%s) must be seconds from 0%s", rec,
                          json_kind(t), json_kind(w), STEP_FIX);
    if (n < 1 || n > PX_RT_MAX_STAGES) {
        char got[48];
        if (json_is_array(c))
            px_textf(got, sizeof got, "an array of %zu", n);
        else
            px_strlcpy(got, json_kind(c), sizeof got);
        return px_err_set(err, PX_EPARSE,
                          "%s: \"compute_s\" is %s; it must be an array of 1 to %d stages' "
                          "seconds%s",
                          rec, got, PX_RT_MAX_STAGES, STEP_FIX);
    }
    s->step = (uint64_t)json_integer_value(jstep);
    s->t_s = json_number_value(t);
    s->n_stages = (uint32_t)n;
    if (wall_s)
        *wall_s = json_number_value(w);
    /* Traces written before steps carried their rows have none: 0, not
     * known, which the detector does not scale by.  More rows than the
     * plan's batch are what the step carried (a run given more prompts
     * than its plan's batch, a serving step): taken as they are. */
    const json_t *rows = json_object_get(j, "rows");
    json_int_t r = json_integer_value(rows);
    if (rows && (!json_is_integer(rows) || r < 0 || r > UINT32_MAX))
        return px_err_set(err, PX_EPARSE,
                          "%s: \"rows\" is %s%s; it must be an integer from 0 (not known) to "
                          "%u%s",
                          rec, json_kind(rows), json_is_integer(rows) ? " out of range" : "",
                          UINT32_MAX, STEP_FIX);
    s->rows = (uint32_t)r;
    /* Each row attends to at most a session's longest context (2^24
     * positions), so more than that per row is no run's; absent: 0, not
     * known. */
    const json_t *ctx = json_object_get(j, "context");
    json_int_t n_ctx = json_integer_value(ctx);
    uint64_t max_ctx = (uint64_t)s->rows << 24;
    if (ctx && (!json_is_integer(ctx) || n_ctx < 0 || (uint64_t)n_ctx > max_ctx))
        return px_err_set(err, PX_EPARSE,
                          "%s: \"context\" is %s%s; it must be an integer from 0 (not known) to "
                          "\"rows\" (%u) times 16777216, the longest context a row attends to%s",
                          rec, json_kind(ctx), json_is_integer(ctx) ? " out of range" : "", s->rows,
                          STEP_FIX);
    s->context = (uint64_t)n_ctx;
    px_status st;
    if ((st = read_reals(c, rec, "compute_s", true, s->compute_s, n, err)) ||
        (st = read_reals(json_object_get(j, "xfer_s"), rec, "xfer_s", true, s->xfer_s, n + 1,
                         err)) ||
        (st = read_waits(j, rec, "wait_s", "compute_s", s->compute_s, s->wait_s, n, err)) ||
        (st = read_waits(j, rec, "xfer_wait_s", "xfer_s", s->xfer_s, s->xfer_wait_s, n + 1, err)))
        return st;
    return PX_OK;
}

px_status px__hr_detect(const px_heal_envelope *raw, const px_heal_detector_opts *o,
                        const px_heal_sample *s, size_t n, px_heal_finding *f, json_t **out,
                        px_err *err)
{
    *out = NULL;
    memset(f, 0, sizeof *f);
    f->cls = PX_HEAL_NONE;
    size_t nb = PX_MIN(n, (size_t)o->baseline_steps);
    double c = px__hr_calibrate(raw, s, nb);
    px_heal_envelope env;
    px__hr_envelope_scale(raw, c, s, nb, &env);
    px_heal_detector *d = NULL;
    px_status st = px_heal_detector_new(&env, o, &d, err);
    if (st != PX_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        px_heal_finding tmp;
        bool hit = px_heal_detector_observe(d, &s[i], &tmp);
        if (i + 1 == n && hit)
            *f = tmp;
    }
    px_heal_detector_free(d);
    json_t *fj = f->cls != PX_HEAL_NONE ? px_heal_finding_to_json(f) : json_null();
    *out = json_pack("{s:s, s:o, s:o, s:f, s:I}", "class", px_heal_fault_class_name(f->cls),
                     "locus", px_heal_locus_to_json(&f->locus), "finding", fj, "calibration", c,
                     "samples", (json_int_t)n);
    return *out ? PX_OK : px_err_set(err, PX_ENOMEM, "heal: out of memory");
}

json_t *px__hr_canary_json(double pred_p50, double pred_hi, double ratio, uint32_t need,
                           double tolerance, const double *obs, size_t n,
                           px_heal_canary_verdict *verdict)
{
    px_heal_canary c;
    px_heal_canary_begin(&c, pred_p50 * ratio, pred_hi * ratio, need, tolerance);
    px_heal_canary_verdict v = PX_HEAL_CANARY_PENDING;
    for (size_t i = 0; i < n && v == PX_HEAL_CANARY_PENDING; i++)
        v = px_heal_canary_observe(&c, obs[i]);
    *verdict = v;
    const char *name = v == PX_HEAL_CANARY_PASS   ? "pass"
                       : v == PX_HEAL_CANARY_FAIL ? "fail"
                                                  : "pending";
    json_t *o = json_pack("{s:s, s:i}", "verdict", name, "steps", (int)c.seen);
    if (o && (px__heal_set_num(o, "median_s", px_heal_canary_median(&c)) ||
              px__heal_set_num(o, "calibrated_p50_s", pred_p50 * ratio) ||
              px__heal_set_num(o, "calibrated_hi_s", pred_hi * ratio))) {
        json_decref(o);
        return NULL;
    }
    return o;
}
