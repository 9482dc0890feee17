/*
 * The pipeline's report: each stage's observed decode time per token and
 * prefill time against the plan's predicted intervals, end to end, and
 * throughput; text for people, JSON for tools.  Emulated devices say so
 * on every line that names them.  The statistics it reads are released
 * here too (px_rt_pipeline_stats_release).
 */
#include "base/common.h"

#include "rt/pipeline_impl.h"

static const char *verdict(const px_rt_interval *iv, double observed)
{
    if (!isfinite(iv->lo) || !isfinite(iv->hi) || !isfinite(observed))
        return "no prediction";
    if (observed < iv->lo)
        return "outside (faster)";
    if (observed > iv->hi)
        return "outside (slower)";
    return "inside";
}

static px_rt_interval scaled(px_rt_interval iv, double k)
{
    iv.p50 *= k;
    iv.lo *= k;
    iv.hi *= k;
    return iv;
}

/* Predicted prefill figures are for the plan's prompt length (per
 * sequence); they scale linearly to this run's mean prompt. */
static double prefill_scale(const px_rt_pipeline_spec *sp, const px_rt_pipeline_stats *st)
{
    if (!sp->plan_prompt_tokens || !st->gen.prompt_tokens || !st->n_prompts)
        return 1;
    return (double)st->gen.prompt_tokens / st->n_prompts / sp->plan_prompt_tokens;
}

static double per(uint64_t ns, uint64_t n)
{
    return n ? (double)ns / 1e9 / (double)n : NAN;
}

static void device_label(const px_rt_pipeline_spec *sp, const px_rt_executor *ex, uint32_t i,
                         char *buf, size_t n)
{
    const px_rt_stage_spec *s = &sp->stages[i];
    const px_rt_device_props *p = ex ? px_rt_executor_stage_device(ex, i) : NULL;
    bool emu = s->emulated || (p && p->emulated);
    snprintf(buf, n, "%.40s (%s%s)", s->device[0] ? s->device : s->backend, s->backend,
             emu ? ", emulated" : "");
}

px_status px_rt_pipeline_report(const px_rt_pipeline_spec *sp, const px_rt_executor *ex,
                                const px_rt_pipeline_stats *st, px_strbuf *out)
{
    char a[32], b[32], c[32], d[32], dev[96];
    /* Each append that fails leaves the text short: one failure fails it. */
    px_status rc = PX_OK;
    rc |=
        px_strbuf_addf(out, "plan %.12s: %u stage%s%s\n", sp->plan_id[0] ? sp->plan_id : "(no id)",
                       sp->n_stages, sp->n_stages == 1 ? "" : "s",
                       sp->emulated ? "; EMULATED devices: their times come from emulation "
                                      "profiles on this machine, no claim about real hardware"
                                    : "");
    double k = prefill_scale(sp, st);
    if (k != 1)
        rc |= px_strbuf_addf(out,
                             "(prefill predictions scaled from the plan's %u prompt tokens per "
                             "sequence to this run's %.3g)\n",
                             sp->plan_prompt_tokens, k * sp->plan_prompt_tokens);
    rc |= px_strbuf_addf(out, "%-5s %-34s %-7s %-34s %-10s %-17s | %-30s %-10s %s\n", "stage",
                         "device", "layers", "decode/token predicted p50 [lo, hi]", "observed", "",
                         "prefill predicted p50 [lo, hi]", "observed", "");
    for (uint32_t i = 0; i < sp->n_stages; i++) {
        const px_rt_stage_spec *s = &sp->stages[i];
        const px_rt_stage_stats *ss = &st->stages[i];
        device_label(sp, ex, i, dev, sizeof dev);
        double dec = per(ss->decode_ns, ss->decode_steps);
        double pf = ss->prefill_steps ? (double)ss->prefill_ns / 1e9 : NAN;
        px_rt_interval ppf = scaled(s->pred_prefill_s, k);
        char layers[24], pd[112], pp[112];
        if (s->layer_begin < s->layer_end)
            snprintf(layers, sizeof layers, "%u-%u", s->layer_begin, s->layer_end - 1);
        else
            snprintf(layers, sizeof layers, "%s", s->embedding ? "embd" : "head");
        px_format_seconds(s->pred_decode_s.p50, a, sizeof a);
        px_format_seconds(s->pred_decode_s.lo, b, sizeof b);
        px_format_seconds(s->pred_decode_s.hi, c, sizeof c);
        snprintf(pd, sizeof pd, "%s [%s, %s]", a, b, c);
        px_format_seconds(dec, d, sizeof d);
        rc |= px_strbuf_addf(out, "%-5u %-34s %-7s %-34s %-10s %-17s | ", i, dev, layers, pd, d,
                             verdict(&s->pred_decode_s, dec));
        px_format_seconds(ppf.p50, a, sizeof a);
        px_format_seconds(ppf.lo, b, sizeof b);
        px_format_seconds(ppf.hi, c, sizeof c);
        snprintf(pp, sizeof pp, "%s [%s, %s]", a, b, c);
        px_format_seconds(pf, d, sizeof d);
        rc |= px_strbuf_addf(out, "%-30s %-10s %s\n", pp, d, verdict(&ppf, pf));
    }
    /* Transfers: into each stage, and back to the executor. */
    rc |= px_strbuf_adds(out, "transfers per decode step:");
    for (uint32_t i = 0; i < sp->n_stages; i++) {
        px_format_seconds(per(st->stages[i].xfer_in_decode_ns, st->stages[i].decode_steps), a,
                          sizeof a);
        if (i == 0)
            rc |= px_strbuf_addf(out, " executor->0 %s;", a);
        else
            rc |= px_strbuf_addf(out, " %u->%u %s;", i - 1, i, a);
    }
    px_format_seconds(per(st->xfer_out_decode_ns, st->decode_steps), a, sizeof a);
    rc |= px_strbuf_addf(out, " %u->executor %s\n", sp->n_stages - 1, a);
    double tpot = per(st->gen.decode_ns, st->decode_steps);
    double ttft = (double)st->ttft_ns / 1e9;
    px_format_seconds(sp->pred_tpot_s.p50, a, sizeof a);
    px_format_seconds(sp->pred_tpot_s.lo, b, sizeof b);
    px_format_seconds(sp->pred_tpot_s.hi, c, sizeof c);
    px_format_seconds(tpot, d, sizeof d);
    rc |= px_strbuf_addf(out, "end to end: time per token predicted %s [%s, %s], observed %s: %s\n",
                         a, b, c, d, verdict(&sp->pred_tpot_s, tpot));
    px_rt_interval pt = scaled(sp->pred_ttft_s, k);
    px_format_seconds(pt.p50, a, sizeof a);
    px_format_seconds(pt.lo, b, sizeof b);
    px_format_seconds(pt.hi, c, sizeof c);
    px_format_seconds(ttft, d, sizeof d);
    rc |= px_strbuf_addf(out,
                         "            time to first token predicted %s [%s, %s], observed %s: "
                         "%s\n",
                         a, b, c, d, verdict(&pt, ttft));
    double pf_tps =
        st->gen.prefill_ns ? (double)st->gen.prompt_tokens / ((double)st->gen.prefill_ns / 1e9) : 0;
    double dc_tps =
        st->gen.decode_ns ? (double)st->gen.decode_tokens / ((double)st->gen.decode_ns / 1e9) : 0;
    rc |= px_strbuf_addf(out,
                         "prefill: %" PRIu64 " tokens in %.1f ms (%.1f tokens/s); decode: %" PRIu64
                         " tokens in %.1f ms (%.1f tokens/s)%s\n",
                         st->gen.prompt_tokens, (double)st->gen.prefill_ns / 1e6, pf_tps,
                         st->gen.decode_tokens, (double)st->gen.decode_ns / 1e6, dc_tps,
                         sp->emulated ? " [emulated devices]" : "");
    return rc == PX_OK ? PX_OK : PX_ENOMEM;
}

/* The builders below stop at the first member that cannot be added and
 * return NULL: a report missing part of the run must never print as if it
 * were whole. */
static json_t *interval_json(px_rt_interval iv)
{
    json_t *o = json_object();
    px_status st = o ? PX_OK : PX_ENOMEM;
    if (st == PX_OK && isfinite(iv.p50))
        st = px_json_set(o, "p50", json_real(iv.p50));
    if (st == PX_OK && isfinite(iv.lo))
        st = px_json_set(o, "lo", json_real(iv.lo));
    if (st == PX_OK && isfinite(iv.hi))
        st = px_json_set(o, "hi", json_real(iv.hi));
    if (st != PX_OK) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *measure(px_rt_interval pred, double observed)
{
    json_t *o = json_object();
    px_status st = o ? px_json_set(o, "predicted", interval_json(pred)) : PX_ENOMEM;
    if (st == PX_OK && isfinite(observed))
        st = px_json_set(o, "observed", json_real(observed));
    if (st == PX_OK)
        st = px_json_set(o, "verdict", json_string(verdict(&pred, observed)));
    if (st != PX_OK) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Stage i's object; NULL when out of memory. */
static json_t *stage_json(const px_rt_pipeline_spec *sp, const px_rt_executor *ex,
                          const px_rt_pipeline_stats *st, uint32_t i, double k)
{
    const px_rt_stage_spec *s = &sp->stages[i];
    const px_rt_stage_stats *ss = &st->stages[i];
    const px_rt_device_props *p = ex ? px_rt_executor_stage_device(ex, i) : NULL;
    json_t *o = json_object(), *ops = json_array();
    px_status rc = o && ops ? PX_OK : PX_ENOMEM;
    for (size_t e = 0; rc == PX_OK && e < ss->n_ops; e++)
        rc = px_json_push(
            ops, json_pack("{s:i, s:s, s:I, s:I, s:I, s:I}", "layer", (int)ss->ops[e].layer, "op",
                           px_ir_op_kind_name(ss->ops[e].kind), "count",
                           (json_int_t)ss->ops[e].count, "ns", (json_int_t)ss->ops[e].ns, "flops",
                           (json_int_t)ss->ops[e].flops, "bytes", (json_int_t)ss->ops[e].bytes));
    if (rc == PX_OK)
        rc = px_json_set(o, "index", json_integer(i));
    if (rc == PX_OK)
        rc = px_json_set(o, "device", json_string(s->device[0] ? s->device : s->backend));
    if (rc == PX_OK)
        rc = px_json_set(o, "backend", json_string(s->backend));
    if (rc == PX_OK)
        rc = px_json_set(o, "emulated", json_boolean(s->emulated || (p && p->emulated)));
    if (rc == PX_OK && p)
        rc = px_json_set(o, "description", json_string(p->description));
    if (rc == PX_OK)
        rc = px_json_set(o, "pid", json_integer(px_rt_executor_stage_pid(ex, i)));
    if (rc == PX_OK)
        rc = px_json_set(
            o, "layers",
            json_pack("{s:i, s:i}", "first", (int)s->layer_begin, "last", (int)s->layer_end - 1));
    if (rc == PX_OK)
        rc = px_json_set(o, "decode_s_per_token",
                         measure(s->pred_decode_s, per(ss->decode_ns, ss->decode_steps)));
    if (rc == PX_OK)
        rc = px_json_set(o, "prefill_s",
                         measure(scaled(s->pred_prefill_s, k),
                                 ss->prefill_steps ? (double)ss->prefill_ns / 1e9 : NAN));
    if (rc == PX_OK)
        rc = px_json_set(
            o, "transfer_in_s_per_decode_step",
            json_real(ss->decode_steps ? per(ss->xfer_in_decode_ns, ss->decode_steps) : 0));
    if (rc == PX_OK) {
        rc = px_json_set(o, "ops", ops);
        ops = NULL; /* taken, also on failure */
    }
    json_decref(ops);
    if (rc != PX_OK) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *px_rt_pipeline_report_json(const px_rt_pipeline_spec *sp, const px_rt_executor *ex,
                                   const px_rt_pipeline_stats *st)
{
    json_t *doc = json_object(), *stages = json_array();
    px_status rc = doc && stages ? PX_OK : PX_ENOMEM;
    double k = prefill_scale(sp, st);
    for (uint32_t i = 0; rc == PX_OK && i < sp->n_stages; i++)
        rc = px_json_push(stages, stage_json(sp, ex, st, i, k));
    if (rc == PX_OK) {
        rc = px_json_set(doc, "stages", stages);
        stages = NULL; /* taken, also on failure */
    }
    json_decref(stages);
    if (rc == PX_OK)
        rc = px_json_set(doc, "plan", json_string(sp->plan_id));
    if (rc == PX_OK)
        rc = px_json_set(doc, "emulated", json_boolean(sp->emulated));
    if (rc == PX_OK && sp->emulated)
        rc = px_json_set(doc, "notice",
                         json_string("emulated devices: times come from emulation "
                                     "profiles on this machine, no claim about real "
                                     "hardware"));
    if (rc == PX_OK)
        rc = px_json_set(doc, "tpot_s",
                         measure(sp->pred_tpot_s, per(st->gen.decode_ns, st->decode_steps)));
    if (rc == PX_OK)
        rc = px_json_set(doc, "ttft_s",
                         measure(scaled(sp->pred_ttft_s, k), (double)st->ttft_ns / 1e9));
    if (rc == PX_OK)
        rc = px_json_set(doc, "prefill",
                         json_pack("{s:I, s:f}", "tokens", (json_int_t)st->gen.prompt_tokens,
                                   "seconds", (double)st->gen.prefill_ns / 1e9));
    if (rc == PX_OK)
        rc = px_json_set(doc, "decode",
                         json_pack("{s:I, s:f}", "tokens", (json_int_t)st->gen.decode_tokens,
                                   "seconds", (double)st->gen.decode_ns / 1e9));
    if (rc != PX_OK) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

void px_rt_pipeline_stats_release(px_rt_pipeline_stats *st)
{
    if (!st)
        return;
    for (uint32_t i = 0; i < PX_RT_MAX_STAGES; i++) {
        free(st->stages[i].ops);
        st->stages[i].ops = NULL;
        st->stages[i].n_ops = 0;
    }
}
