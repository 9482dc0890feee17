/* Run reports (`plexus.run/1`) as calibration data: their pipeline and
 * workload, samples for fitting, and predicted against observed. */
#include "base/common.h"

#include "cost/cost_impl.h"

static px_status bad(px_err *err, const char *name, const char *ptr, const char *fix)
{
    return px_err_set(err, PX_EVALIDATE, "%s: %s: %s", name, ptr, fix);
}

/* The "observed" member of a measure, or NAN when there is none. */
static px_status observed(const json_t *stage, const char *key, const char *name, const char *ptr,
                          double *out, px_err *err)
{
    *out = NAN;
    const json_t *m = json_object_get(stage, key);
    if (!m || json_is_null(m))
        return PX_OK;
    if (!json_is_object(m))
        return px_err_set(err, PX_EVALIDATE, "%s: %s/%s: give an object with \"observed\"", name,
                          ptr, key);
    const json_t *o = json_object_get(m, "observed");
    if (!o || json_is_null(o))
        return PX_OK;
    if (!json_is_number(o) || !isfinite(json_number_value(o)) || json_number_value(o) < 0 ||
        json_number_value(o) > 1e6)
        return px_err_set(err, PX_EVALIDATE,
                          "%s: %s/%s/observed: give a time in seconds (a finite number >= 0)", name,
                          ptr, key);
    *out = json_number_value(o);
    return PX_OK;
}

static px_status tokens_of(const json_t *doc, const char *key, const char *name, double *out,
                           px_err *err)
{
    const json_t *o = json_object_get(doc, key);
    const json_t *t = json_is_object(o) ? json_object_get(o, "tokens") : NULL;
    if (!t || !json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > (1 << 30))
        return px_err_set(err, PX_EVALIDATE,
                          "%s: /%s/tokens: missing or not a whole number; give the report of "
                          "`plexus run -o json`",
                          name, key);
    *out = (double)json_integer_value(t);
    return PX_OK;
}

px_status px_cost_run_parse(const json_t *doc, const char *name, px_cost_run *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (!name)
        name = "run report";
    if (!json_is_object(doc))
        return bad(err, name, "(root)", "a run report is a JSON object (`plexus run -o json`)");
    const json_t *schema = json_object_get(doc, "schema");
    if (schema && (!json_is_string(schema) || strcmp(json_string_value(schema), "plexus.run/1")))
        return bad(err, name, "/schema", "give \"plexus.run/1\"");
    const json_t *stages = json_object_get(doc, "stages");
    if (!json_is_array(stages) || json_array_size(stages) == 0)
        return bad(err, name, "/stages", "give the stages of the run (a non-empty array)");
    if (json_array_size(stages) > PX_COST_MAX_STAGES)
        return px_err_set(err, PX_ELIMIT, "%s: /stages: %zu stages; at most %d", name,
                          json_array_size(stages), PX_COST_MAX_STAGES);
    px_status st;
    size_t i;
    const json_t *s;
    json_array_foreach(stages, i, s)
    {
        char ptr[48];
        snprintf(ptr, sizeof ptr, "/stages/%zu", i);
        px_cost_run_stage *rs = &out->stages[i];
        if (!json_is_object(s))
            return bad(err, name, ptr, "a stage is an object");
        const json_t *dev = json_object_get(s, "device");
        if (!json_is_string(dev) || json_string_length(dev) == 0 ||
            json_string_length(dev) >= sizeof rs->device)
            return px_err_set(err, PX_EVALIDATE,
                              "%s: %s/device: give the device's inventory id (under 64 bytes)",
                              name, ptr);
        px_strlcpy(rs->device, json_string_value(dev), sizeof rs->device);
        const json_t *layers = json_object_get(s, "layers");
        const json_t *first = json_is_object(layers) ? json_object_get(layers, "first") : NULL;
        const json_t *last = json_is_object(layers) ? json_object_get(layers, "last") : NULL;
        if (!json_is_integer(first) || !json_is_integer(last) || json_integer_value(first) < 0 ||
            json_integer_value(first) > 1000000 ||
            json_integer_value(last) < json_integer_value(first) - 1 ||
            json_integer_value(last) > 1000000)
            return px_err_set(err, PX_EVALIDATE,
                              "%s: %s/layers: give {\"first\", \"last\"} (inclusive blocks; last "
                              "= first - 1 for none)",
                              name, ptr);
        rs->first = (int32_t)json_integer_value(first);
        rs->last = (int32_t)json_integer_value(last);
        if ((st = observed(s, "decode_s_per_token", name, ptr, &rs->decode_s, err)) ||
            (st = observed(s, "prefill_s", name, ptr, &rs->prefill_s, err)))
            return st;
        const json_t *x = json_object_get(s, "transfer_in_s_per_decode_step");
        rs->xfer_in_s =
            json_is_number(x) && isfinite(json_number_value(x)) && json_number_value(x) >= 0
                ? json_number_value(x)
                : NAN;
    }
    out->n_stages = (uint32_t)json_array_size(stages);
    if ((st = tokens_of(doc, "prefill", name, &out->prompt_tokens, err)) ||
        (st = tokens_of(doc, "decode", name, &out->decode_tokens, err)))
        return st;
    out->tpot_s = NAN;
    const json_t *tpot = json_object_get(doc, "tpot_s");
    const json_t *tobs = json_is_object(tpot) ? json_object_get(tpot, "observed") : NULL;
    if (json_is_number(tobs) && isfinite(json_number_value(tobs)) && json_number_value(tobs) > 0 &&
        json_number_value(tobs) < 1e6)
        out->tpot_s = json_number_value(tobs);
    const json_t *results = json_object_get(doc, "results");
    out->n_prompts = json_is_array(results) && json_array_size(results) > 0
                         ? (uint32_t)PX_MIN(json_array_size(results), 65536u)
                         : 1;
    /* A serving run's steps: their mean rows and positions attended. */
    const json_t *rows = json_object_get(doc, "rows_per_step");
    if (rows) {
        if (!json_is_number(rows) || !(json_number_value(rows) >= 1) ||
            !(json_number_value(rows) <= 65536))
            return bad(err, name, "/rows_per_step", "give the mean rows of a step (1 to 65536)");
        out->n_prompts = (uint32_t)lround(json_number_value(rows));
    }
    const json_t *ctx = json_object_get(doc, "context");
    if (ctx) {
        if (!json_is_number(ctx) || !(json_number_value(ctx) >= 1) ||
            !(json_number_value(ctx) <= (double)(1 << 24)))
            return bad(err, name, "/context",
                       "give the mean positions a decode row attends (1 to 16777216)");
        out->context = json_number_value(ctx);
    }
    return PX_OK;
}

px_status px_cost_runs_parse(const json_t *doc, const char *name, px_cost_run **out, size_t *n,
                             px_err *err)
{
    *out = NULL;
    *n = 0;
    if (!name)
        name = "run report";
    const json_t *schema = json_is_object(doc) ? json_object_get(doc, "schema") : NULL;
    if (!json_is_string(schema) || strcmp(json_string_value(schema), "plexus.serve-run/1")) {
        px_cost_run *r = malloc(sizeof *r);
        if (!r)
            return px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
        px_status st = px_cost_run_parse(doc, name, r, err);
        if (st != PX_OK) {
            free(r);
            return st;
        }
        *out = r;
        *n = 1;
        return PX_OK;
    }
    const json_t *runs = json_object_get(doc, "runs");
    if (!json_is_array(runs))
        return bad(err, name, "/runs",
                   "give the runs of the serving run (an array; `plexus serve --run-report`)");
    size_t k = json_array_size(runs);
    if (k > PX_COST_MAX_RUNS)
        return px_err_set(err, PX_ELIMIT, "%s: /runs: %zu runs; at most %d", name, k,
                          PX_COST_MAX_RUNS);
    if (k == 0)
        return PX_OK;
    px_cost_run *r = calloc(k, sizeof *r);
    if (!r)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", name);
    for (size_t i = 0; i < k; i++) {
        char sub[300];
        snprintf(sub, sizeof sub, "%.250s: /runs/%zu", name, i);
        px_status st = px_cost_run_parse(json_array_get(runs, i), sub, &r[i], err);
        if (st != PX_OK) {
            free(r);
            return st;
        }
    }
    *out = r;
    *n = k;
    return PX_OK;
}

px_status px_cost_run_pipeline(const px_cost_run *run, px_cost_fleet *f, const px_cost_model *m,
                               px_cost_pipeline *pipe, px_cost_workload *wl, px_err *err)
{
    memset(pipe, 0, sizeof *pipe);
    pipe->n_stages = run->n_stages;
    for (uint32_t i = 0; i < run->n_stages; i++) {
        const px_cost_run_stage *rs = &run->stages[i];
        uint32_t d = UINT32_MAX;
        for (size_t k = 0; k < f->n_devices; k++)
            if (!strcmp(f->devices[k].id, rs->device))
                d = (uint32_t)k;
        if (d == UINT32_MAX)
            return px_err_set(err, PX_ENOTFOUND,
                              "run stage %u: device \"%s\" is not in the inventory; give the "
                              "inventory the run was made on",
                              i, rs->device);
        if (rs->last >= (int32_t)m->n_layers)
            return px_err_set(err, PX_EVALIDATE,
                              "run stage %u: block %d is past the model's %u blocks; give the "
                              "model the run used",
                              i, rs->last, m->n_layers);
        px_cost_stage s = px_cost_stage_make(d, m);
        s.first = rs->first;
        s.last = rs->last;
        s.embedding = i == 0;
        s.head = i + 1 == run->n_stages;
        pipe->stages[i] = s;
    }
    double n = PX_MAX(run->n_prompts, 1u);
    double P = PX_MAX(1.0, round(run->prompt_tokens / n));
    double G = run->decode_tokens / n;
    *wl = px_cost_workload_default();
    wl->batch = (uint32_t)n;
    wl->micro_batches = 1;
    wl->prompt_tokens = (uint32_t)P;
    wl->gen_tokens = (uint32_t)PX_MAX(1.0, G);
    /* Decode step j attends P + j + 1 positions: the mean over the run. */
    wl->context =
        (uint32_t)PX_MAX(1.0, round(run->context > 0 ? run->context : P + (G + 1.0) / 2.0));
    return PX_OK;
}

static bool has_decode(const px_cost_run_stage *rs)
{
    return rs->last >= rs->first && isfinite(rs->decode_s) && rs->decode_s > 0;
}

/* The sourced terms of each stage of a run that observed its decode
 * step (has[i]), under the run's own workload. */
static px_status run_terms(const px_cost_run *run, px_cost_fleet *f, const px_cost_model *m,
                           const px_cost_params *p, px_cost_stage_terms *t, bool *has, px_err *err)
{
    px_cost_pipeline *pipe = malloc(sizeof *pipe);
    if (!pipe)
        return px_err_set(err, PX_ENOMEM, "out of memory reading a run");
    px_cost_workload wl;
    px_status st = px_cost_run_pipeline(run, f, m, pipe, &wl, err);
    for (uint32_t i = 0; st == PX_OK && i < run->n_stages; i++) {
        has[i] = has_decode(&run->stages[i]);
        if (has[i])
            st = px_cost_stage_terms_of(f, m, p, &wl, &pipe->stages[i], &t[i], err);
    }
    free(pipe);
    return st;
}

px_status px_cost_run_samples(const px_cost_run *run, px_cost_fleet *f, const px_cost_model *m,
                              const px_cost_params *p, px_cost_calib_sample *samples, size_t *n,
                              px_err *err)
{
    *n = 0;
    /* A batch's step holds work that grows with its rows: the decode
     * class's (px_cost_run_decode_samples), not weight streaming. */
    if (run->n_prompts > 1)
        return PX_OK;
    px_cost_stage_terms t[PX_COST_MAX_STAGES];
    bool has[PX_COST_MAX_STAGES];
    px_status st = run_terms(run, f, m, p, t, has, err);
    for (uint32_t i = 0; st == PX_OK && i < run->n_stages; i++) {
        const px_cost_run_stage *rs = &run->stages[i];
        if (!has[i] || !(t[i].matvec_s > 0))
            continue;
        /* Attention's share, as the overlay (if any) predicts it. */
        double att = t[i].attention_s;
        size_t idx;
        if (p->mode == PX_COST_CALIBRATED &&
            px_cost_calibration_lookup(p->calibration, rs->device, PX_COST_CLASS_ATTENTION,
                                       t[i].dtype, t[i].attention_size,
                                       &idx) == PX_COST_CALIB_APPLIED) {
            const px_cost_correction *c = px_cost_calibration_at(p->calibration, idx);
            att = c->offset_s + c->factor * att;
        }
        double rest = rs->decode_s - att;
        if (!(rest > 0))
            continue;
        samples[(*n)++] = (px_cost_calib_sample){.device = rs->device,
                                                 .cls = PX_COST_CLASS_MATVEC,
                                                 .dtype = t[i].dtype,
                                                 .size = t[i].matvec_size,
                                                 .predicted_s = t[i].matvec_s,
                                                 .observed_s = rest};
    }
    return st;
}

px_status px_cost_run_decode_samples(const px_cost_run *run, px_cost_fleet *f,
                                     const px_cost_model *m, const px_cost_params *p,
                                     px_cost_calib_sample *samples, size_t *n, px_err *err)
{
    *n = 0;
    if (run->n_prompts < 2)
        return PX_OK;
    px_cost_stage_terms t[PX_COST_MAX_STAGES];
    bool has[PX_COST_MAX_STAGES];
    px_status st = run_terms(run, f, m, p, t, has, err);
    for (uint32_t i = 0; st == PX_OK && i < run->n_stages; i++) {
        if (!has[i] || !(t[i].decode_s > 0))
            continue;
        samples[(*n)++] = (px_cost_calib_sample){.device = run->stages[i].device,
                                                 .cls = PX_COST_CLASS_DECODE,
                                                 .dtype = t[i].dtype,
                                                 .size = t[i].decode_size,
                                                 .predicted_s = t[i].decode_s,
                                                 .observed_s = run->stages[i].decode_s};
    }
    return st;
}

px_status px_cost_run_step_sample(const px_cost_run *run, px_cost_fleet *f, const px_cost_model *m,
                                  px_cost_calib_sample *sample, bool *has, px_err *err)
{
    *has = false;
    memset(sample, 0, sizeof *sample);
    if (run->n_stages == 0 || !isfinite(run->tpot_s) || !(run->tpot_s > 0))
        return PX_OK;
    px_cost_pipeline *pipe = malloc(sizeof *pipe);
    if (!pipe)
        return px_err_set(err, PX_ENOMEM, "out of memory reading a run");
    px_cost_workload wl;
    px_status st = px_cost_run_pipeline(run, f, m, pipe, &wl, err);
    free(pipe);
    if (st != PX_OK)
        return st;
    /* What the stages and the hops between them account for; the rest of
     * a step is the executor's round trip. */
    double rest = run->tpot_s;
    for (uint32_t i = 0; i < run->n_stages; i++) {
        const px_cost_run_stage *rs = &run->stages[i];
        if (!isfinite(rs->decode_s) || (i > 0 && !isfinite(rs->xfer_in_s)))
            return PX_OK;
        rest -= rs->decode_s + (i > 0 ? rs->xfer_in_s : 0);
    }
    if (!(rest > 0))
        return PX_OK;
    *sample = (px_cost_calib_sample){.device = run->stages[0].device,
                                     .cls = PX_COST_CLASS_STEP,
                                     .dtype = PX_DTYPE_COUNT_,
                                     .size = px_cost_step_size(m, &wl),
                                     .predicted_s = 0,
                                     .observed_s = rest};
    *has = true;
    return PX_OK;
}

px_status px_cost_run_check(const px_cost_run *run, const char *name, px_cost_fleet *f,
                            const px_cost_model *m, const px_cost_params *p,
                            const px_cost_calibration *cal, px_cost_calib_obs *obs, size_t *n,
                            px_cost_calib_obs *end_to_end, bool *has_e2e, px_err *err)
{
    if (has_e2e)
        *has_e2e = false;
    *n = 0;
    px_cost_pipeline *pipe = malloc(sizeof *pipe);
    px_cost_uncertain *ub = malloc(sizeof *ub);
    px_cost_uncertain *ua = malloc(sizeof *ua);
    px_status st = PX_OK;
    if (!pipe || !ub || !ua) {
        st = px_err_set(err, PX_ENOMEM, "out of memory checking a run");
        goto done;
    }
    px_cost_workload wl;
    if ((st = px_cost_run_pipeline(run, f, m, pipe, &wl, err)) != PX_OK)
        goto done;
    px_cost_params ps = *p, pc = *p;
    ps.mode = PX_COST_SOURCED;
    ps.calibration = NULL;
    pc.mode = PX_COST_CALIBRATED;
    pc.calibration = cal;
    if ((st = px_cost_uncertainty(f, m, &ps, &wl, pipe, 0, 0, ub, err)) != PX_OK ||
        (st = px_cost_uncertainty(f, m, cal ? &pc : &ps, &wl, pipe, 0, 0, ua, err)) != PX_OK)
        goto done;
    for (uint32_t i = 0; i < run->n_stages; i++) {
        const px_cost_run_stage *rs = &run->stages[i];
        if (!has_decode(rs))
            continue;
        px_cost_calib_obs *o = &obs[(*n)++];
        memset(o, 0, sizeof *o);
        snprintf(o->label, sizeof o->label, "%.40s stage %u %.30s decode", name ? name : "run", i,
                 rs->device);
        o->cls = PX_COST_CLASS_MATVEC;
        o->observed_s = rs->decode_s;
        o->before = ub->decode_s[i];
        o->after = ua->decode_s[i];
    }
    if (end_to_end && isfinite(run->tpot_s) && run->tpot_s > 0) {
        memset(end_to_end, 0, sizeof *end_to_end);
        snprintf(end_to_end->label, sizeof end_to_end->label, "%.40s end to end per token",
                 name ? name : "run");
        end_to_end->cls = PX_COST_CLASS_COPY;
        end_to_end->observed_s = run->tpot_s;
        end_to_end->before = ub->tpot_s;
        end_to_end->after = ua->tpot_s;
        if (has_e2e)
            *has_e2e = true;
    }
done:
    free(pipe);
    free(ub);
    free(ua);
    return st;
}
