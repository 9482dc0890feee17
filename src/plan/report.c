/* The human-facing text report of a plan, drawn from its document (the
 * picture is plan_svg.c). */
#include "base/common.h"

#include "plan/plan_impl.h"

static double getnum(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return v ? json_number_value(v) : 0;
}

static const char *getstr(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static void add_interval(px_strbuf *sb, const char *name, const json_t *iv, bool time)
{
    char a[32], b[32], c[32], d[32];
    if (time) {
        px_format_seconds(getnum(iv, "p50"), a, sizeof a);
        px_format_seconds(getnum(iv, "p99"), b, sizeof b);
        px_format_seconds(getnum(iv, "lo"), c, sizeof c);
        px_format_seconds(getnum(iv, "hi"), d, sizeof d);
    } else {
        snprintf(a, sizeof a, "%.4g", getnum(iv, "p50"));
        snprintf(b, sizeof b, "%.4g", getnum(iv, "p99"));
        snprintf(c, sizeof c, "%.4g", getnum(iv, "lo"));
        snprintf(d, sizeof d, "%.4g", getnum(iv, "hi"));
    }
    px_strbuf_addf(sb, "  %-22s p50 %-10s p99 %-10s range [%s, %s]\n", name, a, b, c, d);
}

/* A plan costed with a calibration overlay says so, and how many of its
 * corrections this plan could not use (the assumptions list each). */
static void report_costs(const json_t *doc, px_strbuf *sb)
{
    const json_t *as = json_object_get(doc, "assumptions"), *x, *overlay = NULL;
    size_t i, n = 0, refused = 0;
    json_array_foreach(as, i, x)
    {
        const char *name = getstr(x, "name");
        if (px_str_starts_with(name, "calibration overlay")) {
            overlay = x;
        } else if (px_str_starts_with(name, "calibration: ")) {
            n++;
            refused += strstr(getstr(x, "source"), "not applied") != NULL;
        }
    }
    if (overlay)
        px_strbuf_addf(sb,
                       "costs: calibrated (overlay %s); %zu of its corrections listed in the "
                       "assumptions, %zu not applied to this plan\n",
                       getstr(overlay, "value"), n, refused);
}

px_status px_plan_report(const px_plan *p, px_strbuf *sb)
{
    const json_t *doc = p->doc;
    const json_t *model = json_object_get(doc, "model");
    const json_t *inv = json_object_get(doc, "inventory");
    const json_t *obj = json_object_get(doc, "objective");
    const json_t *wl = json_object_get(doc, "workload");
    char a[32], b[32];
    px_strbuf_addf(sb, "plan %.12s  policy %s  objective %s\n", p->id, getstr(doc, "policy"),
                   getstr(obj, "name"));
    px__plan_fmt_bytes(getnum(model, "weight_bytes"), a, sizeof a);
    px_strbuf_addf(
        sb, "model %s (%s, %d blocks, %s %s) on %s (%d devices)\n", getstr(model, "name"),
        getstr(model, "id"), (int)getnum(model, "blocks"), a, getstr(model, "weight_dtype"),
        getstr(inv, "name")[0] ? getstr(inv, "name") : "inventory", (int)getnum(inv, "devices"));
    if (json_is_true(json_object_get(doc, "emulated")))
        px_strbuf_adds(sb, "EMULATED: these devices are emulated or simulated; the figures "
                           "describe the emulated hardware, not real hardware\n");
    report_costs(doc, sb);
    px_strbuf_addf(sb,
                   "workload: batch %d x %d replica(s), %d micro-batch(es), context %d, "
                   "prompt %d, %d new tokens; contract %s (%s)\n\n",
                   (int)getnum(wl, "batch"),
                   (int)getnum(json_object_get(doc, "batching"), "replicas"),
                   (int)getnum(wl, "micro_batches"), (int)getnum(wl, "context"),
                   (int)getnum(wl, "prompt_tokens"), (int)getnum(wl, "gen_tokens"),
                   getstr(json_object_get(doc, "contract"), "name"),
                   getstr(json_object_get(doc, "contract"), "verdict"));
    px_strbuf_addf(sb, "%-5s %-28s %-7s %-9s %-3s %-4s %-2s %-24s %-6s %-12s %s\n", "stage",
                   "devices", "backend", "layers", "emb", "head", "tp", "weights/ffn/act/kv", "kv",
                   "decode p50", "prefill p50");
    const json_t *stages = json_object_get(doc, "stages");
    size_t i;
    const json_t *st;
    json_array_foreach(stages, i, st)
    {
        char devs[160] = "";
        size_t len = 0;
        size_t k;
        const json_t *d;
        json_array_foreach(json_object_get(st, "devices"), k, d)
        {
            int w =
                snprintf(devs + len, sizeof devs - len, "%s%s", k ? "+" : "", json_string_value(d));
            if (w < 0 || (size_t)w >= sizeof devs - len)
                break;
            len += (size_t)w;
        }
        const json_t *ly = json_object_get(st, "layers");
        char layers[24];
        int first = (int)getnum(ly, "first"), last = (int)getnum(ly, "last");
        if (last < first)
            snprintf(layers, sizeof layers, "-");
        else
            snprintf(layers, sizeof layers, "%d-%d", first, last);
        const json_t *pr = json_object_get(st, "precision");
        char prec[64];
        snprintf(prec, sizeof prec, "%s/%s/%s/%s", getstr(pr, "weights"), getstr(pr, "ffn_weights"),
                 getstr(pr, "activations"), getstr(pr, "kv"));
        const json_t *pred = json_object_get(st, "predicted");
        px_format_seconds(getnum(json_object_get(pred, "decode_s_per_token"), "p50"), a, sizeof a);
        px_format_seconds(getnum(json_object_get(pred, "prefill_s"), "p50"), b, sizeof b);
        px_strbuf_addf(sb, "%-5d %-28s %-7s %-9s %-3s %-4s %-2d %-24s %-6s %-12s %s%s%s\n", (int)i,
                       devs, getstr(st, "backend"), layers,
                       json_is_true(json_object_get(st, "embedding")) ? "y" : "-",
                       json_is_true(json_object_get(st, "head")) ? "y" : "-",
                       (int)getnum(st, "tensor_parallel"), prec, getstr(st, "kv_placement"), a, b,
                       json_is_true(json_object_get(st, "emulated")) ? "  (emulated)" : "",
                       json_is_true(json_object_get(st, "offload")) ? "  (CPU offload)" : "");
    }
    const json_t *pred = json_object_get(doc, "predictions");
    px_strbuf_adds(sb, "\npredictions (Monte Carlo over the inputs' uncertainty):\n");
    add_interval(sb, "time per token", json_object_get(pred, "tpot_s"), true);
    add_interval(sb, "time to first token", json_object_get(pred, "ttft_s"), true);
    add_interval(sb, "throughput (tokens/s)", json_object_get(pred, "throughput_tokens_per_s"),
                 false);
    px_strbuf_addf(sb, "  energy %.3g J/token, power %.4g W, cost %.4g $/h",
                   getnum(pred, "joules_per_token"), getnum(pred, "power_w"),
                   getnum(pred, "usd_per_hour"));
    if (getnum(pred, "tokens_per_dollar") > 0)
        px_strbuf_addf(sb, " (%.4g tokens/$)", getnum(pred, "tokens_per_dollar"));
    px_strbuf_addf(sb, ", failure within %.3g h: %.3g%%\n",
                   getnum(pred, "failure_window_s") / 3600.0,
                   100.0 * getnum(pred, "failure_probability"));
    if (getnum(obj, "slo_tpot_s") > 0 || getnum(obj, "slo_ttft_s") > 0)
        px_strbuf_addf(sb, "  probability of meeting the SLO: %.3g\n", getnum(pred, "p_meet_slo"));
    const json_t *lb = json_object_get(doc, "lower_bound");
    px_format_seconds(getnum(lb, "tpot_s"), a, sizeof a);
    px_format_seconds(getnum(lb, "placed_tpot_s"), b, sizeof b);
    px_strbuf_addf(sb,
                   "lower bound: %s per token on the whole fleet (plan reaches %.0f%% of it); "
                   "%s on these stages (%.0f%%)\n",
                   a, 100.0 * getnum(lb, "fraction"), b, 100.0 * getnum(lb, "placed_fraction"));
    if (strcmp(getstr(obj, "name"), "latency") && strcmp(getstr(obj, "name"), "ttft"))
        px_strbuf_addf(sb,
                       "throughput bound: %.4g tokens/s at the largest batch the fleet's memory "
                       "holds (plan reaches %.0f%% of it)\n",
                       getnum(lb, "throughput_tokens_per_s"),
                       100.0 * getnum(lb, "throughput_fraction"));
    px_strbuf_adds(sb, "\nwhy:\n");
    const json_t *e;
    json_array_foreach(json_object_get(doc, "explanation"), i, e)
        px_strbuf_addf(sb, "  - %s\n", json_string_value(e));
    const json_t *bind;
    px_strbuf_adds(sb, "binding:");
    json_array_foreach(json_object_get(doc, "binding"), i, bind)
    {
        const char *kind = getstr(bind, "kind");
        if (!strcmp(kind, "memory")) {
            px__plan_fmt_bytes(getnum(bind, "used"), a, sizeof a);
            px__plan_fmt_bytes(getnum(bind, "limit"), b, sizeof b);
            px_strbuf_addf(sb, " memory of %s (%s of %s);", getstr(bind, "device"), a, b);
        } else if (!strcmp(kind, "decode-term")) {
            px_strbuf_addf(sb, " %s on %s;", getstr(bind, "term"), getstr(bind, "device"));
        } else if (!strcmp(kind, "host-cores")) {
            px_strbuf_addf(sb, " the %g host cores of %s (a step asks %.3g ms of them);",
                           getnum(bind, "cores"), getstr(bind, "node"),
                           getnum(bind, "floor_s") * 1e3);
        } else {
            px_strbuf_addf(sb, " %s;", kind);
        }
    }
    px_strbuf_adds(sb, "\n");
    const json_t *rej = json_object_get(doc, "rejected");
    if (json_array_size(rej)) {
        px_strbuf_adds(sb, "\nrejected alternatives:\n");
        const json_t *x;
        json_array_foreach(rej, i, x)
        {
            if (i >= 6)
                break;
            px_strbuf_addf(sb, "  %-10s %s: %s%s%s\n", getstr(x, "reason"),
                           getstr(x, "devices")[0] ? getstr(x, "devices") : "-",
                           getstr(x, "message"), getstr(x, "cause")[0] ? "; " : "",
                           getstr(x, "cause"));
        }
    }
    const json_t *bl = json_object_get(doc, "baselines");
    if (json_array_size(bl)) {
        px_strbuf_adds(sb, "\nbaselines (same cost model, same workload):\n");
        const json_t *x;
        json_array_foreach(bl, i, x)
        {
            if (!json_is_true(json_object_get(x, "feasible"))) {
                px_strbuf_addf(sb, "  %-12s infeasible: %s\n", getstr(x, "policy"),
                               getstr(x, "note"));
                continue;
            }
            px_format_seconds(getnum(x, "tpot_s"), a, sizeof a);
            px_strbuf_addf(sb,
                           "  %-12s tpot %-10s %8.4g tokens/s  plexus: %.2fx per token, "
                           "%.2fx throughput%s%s\n",
                           getstr(x, "policy"), a, getnum(x, "throughput"),
                           getnum(x, "plexus_speedup_tpot"), getnum(x, "plexus_speedup_throughput"),
                           json_is_true(json_object_get(x, "contract_ok")) ? ""
                                                                           : "  (violates the "
                                                                             "contract)",
                           "");
        }
    }
    const json_t *fb = json_object_get(doc, "fallbacks");
    if (json_array_size(fb)) {
        px_strbuf_adds(sb, "\nfallbacks if one device is lost:\n");
        const json_t *x;
        json_array_foreach(fb, i, x)
        {
            if (i >= 8) {
                px_strbuf_addf(sb, "  ... %zu more in the JSON\n", json_array_size(fb) - i);
                break;
            }
            if (json_is_true(json_object_get(x, "feasible"))) {
                px_format_seconds(getnum(x, "tpot_s"), a, sizeof a);
                px_strbuf_addf(sb, "  lose %-14s -> %s per token, %.4g tokens/s (%s)\n",
                               getstr(x, "lost"), a, getnum(x, "throughput"), getstr(x, "note"));
            } else {
                px_strbuf_addf(sb, "  lose %-14s -> %s\n", getstr(x, "lost"), getstr(x, "note"));
            }
        }
    }
    const json_t *lfb = json_object_get(doc, "link_fallbacks");
    if (json_array_size(lfb)) {
        px_strbuf_adds(sb, "\nfallbacks if a link degrades:\n");
        const json_t *x;
        json_array_foreach(lfb, i, x)
        {
            if (i >= 8) {
                px_strbuf_addf(sb, "  ... %zu more in the JSON\n", json_array_size(lfb) - i);
                break;
            }
            /* The note opens with the action in words. */
            px_strbuf_addf(sb, "  %-10s %-24s -> %s\n",
                           !strcmp(getstr(x, "kind"), "allreduce") ? "all-reduce" : "hop",
                           getstr(x, "link"), getstr(x, "note"));
        }
    }
    return sb->len ? PX_OK : PX_ENOMEM;
}
