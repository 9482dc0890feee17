/*
 * The server's metrics in Prometheus's text format: time to first token,
 * time per output token and request latency as histograms; requests by
 * API and status; tokens; and, per replica, the engine's queue, running
 * batch, KV-cache blocks, preemptions and the healing loop's incidents.
 */
#include "serve/server_impl.h"

const double px__srv_buckets[PX__SRV_N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                   0.25,  0.5,    1,     2.5,  5,     10,   30};

void px__srv_hist_add(px__srv_hist *h, double v)
{
    size_t i = 0;
    while (i < PX__SRV_N_BUCKETS && v > px__srv_buckets[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
}

void px_serve_figures_get(px_serve *s, px_serve_figures *out)
{
    _Static_assert(PX_SERVE_BUCKETS == PX__SRV_N_BUCKETS, "the public histogram is /metrics'");
    memset(out, 0, sizeof *out);
    memcpy(out->bounds, px__srv_buckets, sizeof out->bounds);
    pthread_mutex_lock(&s->mu);
    for (size_t api = 0; api < PX_ARRAY_LEN(s->m.requests); api++)
        out->completions += s->m.requests[api][0];
    out->completion_tokens = s->m.completion_tokens;
    memcpy(out->ttft, s->m.ttft.counts, sizeof out->ttft);
    memcpy(out->tpot, s->m.tpot.counts, sizeof out->tpot);
    pthread_mutex_unlock(&s->mu);
}

double px_serve_figures_quantile(const double bounds[PX_SERVE_BUCKETS],
                                 const uint64_t counts[PX_SERVE_BUCKETS + 1], double q)
{
    uint64_t n = 0;
    for (size_t i = 0; i <= PX_SERVE_BUCKETS; i++)
        n += counts[i];
    if (n == 0)
        return NAN;
    double want = q * (double)n, below = 0;
    for (size_t i = 0; i < PX_SERVE_BUCKETS; i++) {
        double c = (double)counts[i];
        if (c > 0 && below + c >= want) {
            double lo = i ? bounds[i - 1] : 0;
            return lo + (bounds[i] - lo) * (want - below) / c;
        }
        below += c;
    }
    return bounds[PX_SERVE_BUCKETS - 1];
}

static void hist(px_strbuf *sb, const char *name, const char *help, const px__srv_hist *h)
{
    px_strbuf_addf(sb, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < PX__SRV_N_BUCKETS; i++) {
        cum += h->counts[i];
        px_strbuf_addf(sb, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, px__srv_buckets[i], cum);
    }
    cum += h->counts[PX__SRV_N_BUCKETS];
    px_strbuf_addf(sb, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
    px_strbuf_addf(sb, "%s_sum %.9g\n%s_count %" PRIu64 "\n", name, h->sum, name, h->n);
}

static void head(px_strbuf *sb, const char *name, const char *type, const char *help)
{
    px_strbuf_addf(sb, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Where each replica's steps spent their time (px_rt_engine_metrics),
 * so that a step can be compared part by part with its plan's
 * prediction.  Called under s->mu. */
static void step_timing(px_strbuf *sb, const px_serve *s)
{
    static const struct {
        const char *name, *help;
    } per_rep[] = {
        {"plexus_serve_timed_steps_total",
         "steps whose time is split below (replayed steps left out)"},
        {"plexus_serve_timed_rows_total", "rows those steps carried"},
        {"plexus_serve_timed_context_total",
         "cache positions their rows attended (each sequence's position plus its tokens)"},
        {"plexus_serve_executor_work_seconds_total",
         "the engine thread's own work between results: building and sending steps, sampling "
         "and handing out tokens, the healing loop's check"},
        {"plexus_serve_executor_work_core_wait_seconds_total",
         "of that work, the time the engine thread waited runnable for a core"},
        {"plexus_serve_executor_result_wait_seconds_total",
         "the engine thread's time waiting for a step's result"},
        {"plexus_serve_executor_result_core_wait_seconds_total",
         "of that wait, the time it waited runnable for a core once the result was there"},
    };
    for (size_t g = 0; g < PX_ARRAY_LEN(per_rep); g++) {
        head(sb, per_rep[g].name, "counter", per_rep[g].help);
        for (uint32_t i = 0; i < s->n_reps; i++) {
            const px_rt_engine_metrics *e = &s->reps[i].em;
            const uint64_t v[] = {e->timed_steps,  e->timed_rows, e->timed_context, e->host_ns,
                                  e->host_wait_ns, e->result_ns,  e->result_wait_ns};
            double x = g < 3 ? (double)v[g] : (double)v[g] / 1e9;
            px_strbuf_addf(sb, "%s{replica=\"%u\"} %.9g\n", per_rep[g].name, i, x);
        }
    }
    static const struct {
        const char *name, *help;
    } per_stage[] = {
        {"plexus_serve_stage_compute_seconds_total", "a stage's compute in those steps"},
        {"plexus_serve_stage_core_wait_seconds_total",
         "of it, the time the stage's thread waited runnable for a core"},
        {"plexus_serve_hop_seconds_total",
         "the hop into a stage (into=\"executor\": the last stage's result back)"},
        {"plexus_serve_hop_core_wait_seconds_total",
         "of it, the time its receiving thread waited runnable for a core"},
    };
    for (size_t g = 0; g < PX_ARRAY_LEN(per_stage); g++) {
        head(sb, per_stage[g].name, "counter", per_stage[g].help);
        for (uint32_t i = 0; i < s->n_reps; i++) {
            const px_rt_engine_metrics *e = &s->reps[i].em;
            uint32_t n = PX_MIN(e->n_stages, (uint32_t)PX_RT_MAX_STAGES);
            for (uint32_t k = 0; k < n + (g >= 2); k++) {
                const uint64_t v[] = {g < 2 ? e->stage_compute_ns[k] : 0,
                                      g < 2 ? e->stage_wait_ns[k] : 0, e->hop_ns[k],
                                      e->hop_wait_ns[k]};
                char where[32];
                if (g < 2)
                    snprintf(where, sizeof where, "stage=\"%u\"", k);
                else if (k < n)
                    snprintf(where, sizeof where, "into=\"%u\"", k);
                else
                    snprintf(where, sizeof where, "into=\"executor\"");
                px_strbuf_addf(sb, "%s{replica=\"%u\",%s} %.9g\n", per_stage[g].name, i, where,
                               (double)v[g] / 1e9);
            }
        }
    }
}

char *px__srv_metrics_text(px_serve *s)
{
    px_strbuf sb = PX_STRBUF_INIT;
    static const char *const classes[6] = {"2xx", "400", "401", "404", "429", "5xx"};
    static const char *const apis[2] = {"completions", "chat"};
    pthread_mutex_lock(&s->mu);
    px__srv_metrics m = s->m;
    head(&sb, "plexus_serve_requests_total", "counter",
         "HTTP requests answered, by API and status");
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 6; k++)
            px_strbuf_addf(&sb,
                           "plexus_serve_requests_total{api=\"%s\",status=\"%s\"} %" PRIu64 "\n",
                           apis[a], classes[k], m.requests[a][k]);
    head(&sb, "plexus_serve_rejected_total", "counter",
         "requests refused with 429 because the queue was full");
    px_strbuf_addf(&sb, "plexus_serve_rejected_total %" PRIu64 "\n", m.rejected_queue_full);
    head(&sb, "plexus_serve_disconnects_total", "counter",
         "requests cancelled because the client went away");
    px_strbuf_addf(&sb, "plexus_serve_disconnects_total %" PRIu64 "\n", m.disconnects);
    head(&sb, "plexus_serve_http_wakeups_total", "counter",
         "times the engine woke a waiting HTTP thread (per token of a stream, once at the end "
         "of a request)");
    px_strbuf_addf(&sb, "plexus_serve_http_wakeups_total %" PRIu64 "\n",
                   (uint64_t)atomic_load(&s->http_wakeups));
    head(&sb, "plexus_serve_prompt_tokens_total", "counter", "prompt tokens of finished requests");
    px_strbuf_addf(&sb, "plexus_serve_prompt_tokens_total %" PRIu64 "\n", m.prompt_tokens);
    head(&sb, "plexus_serve_generation_tokens_total", "counter",
         "tokens generated for finished requests");
    px_strbuf_addf(&sb, "plexus_serve_generation_tokens_total %" PRIu64 "\n", m.completion_tokens);
    hist(&sb, "plexus_serve_time_to_first_token_seconds",
         "from the request's arrival to its first token", &m.ttft);
    hist(&sb, "plexus_serve_time_per_output_token_seconds",
         "mean time between a request's tokens after the first", &m.tpot);
    hist(&sb, "plexus_serve_request_duration_seconds", "from arrival to the last token", &m.e2e);

    static const struct {
        const char *name, *type, *help;
    } gauges[] = {
        {"plexus_serve_queue_depth", "gauge", "requests waiting to be admitted"},
        {"plexus_serve_running", "gauge", "sequences in the running batch"},
        {"plexus_serve_steps_in_flight", "gauge", "steps travelling the pipeline"},
        {"plexus_serve_kv_blocks_used", "gauge", "KV-cache blocks held by sequences"},
        {"plexus_serve_kv_blocks_free", "gauge", "KV-cache blocks free"},
        {"plexus_serve_kv_block_size", "gauge", "positions per KV-cache block"},
        {"plexus_serve_preemptions_total", "counter",
         "sequences preempted when the KV cache ran out (recomputed later)"},
        {"plexus_serve_steps_total", "counter", "engine steps"},
        {"plexus_serve_engine_generated_tokens_total", "counter", "tokens the engine produced"},
        {"plexus_serve_busy_seconds_total", "counter", "time the engine spent in steps"},
        {"plexus_serve_incidents_total", "counter",
         "incidents the healing loop opened (faults detected; each is in /incidents once "
         "closed)"},
        {"plexus_serve_recoveries_total", "counter",
         "times the engine moved to another executor and rebuilt its KV caches"},
        {"plexus_serve_replica_up", "gauge", "1 while the replica serves"},
        {"plexus_serve_step_rows_total", "counter",
         "rows the engine's steps carried (prompt chunks and decode tokens)"},
        {"plexus_serve_decode_steps_total", "counter",
         "engine steps that carried only decode rows"},
        {"plexus_serve_decode_rows_total", "counter", "rows of those decode steps"},
    };
    for (size_t g = 0; g < PX_ARRAY_LEN(gauges); g++) {
        head(&sb, gauges[g].name, gauges[g].type, gauges[g].help);
        for (uint32_t i = 0; i < s->n_reps; i++) {
            const px__srv_replica *r = &s->reps[i];
            const px_rt_engine_metrics *e = &r->em;
            double v = 0;
            switch (g) {
            case 0:
                v = e->waiting;
                break;
            case 1:
                v = e->running;
                break;
            case 2:
                v = e->in_flight;
                break;
            case 3:
                v = e->kv_blocks_used;
                break;
            case 4:
                v = (double)e->kv_blocks - e->kv_blocks_used;
                break;
            case 5:
                v = e->kv_block_size;
                break;
            case 6:
                v = (double)e->preemptions;
                break;
            case 7:
                v = (double)e->steps;
                break;
            case 8:
                v = (double)e->new_tokens;
                break;
            case 9:
                v = (double)e->busy_ns / 1e9;
                break;
            case 10:
                v = r->heal_sum.incidents;
                break;
            case 11:
                v = (double)e->recoveries;
                break;
            case 12:
                v = !atomic_load(&r->failed);
                break;
            case 13:
                v = (double)e->step_rows;
                break;
            case 14:
                v = (double)e->decode_steps;
                break;
            default:
                v = (double)e->decode_rows;
                break;
            }
            px_strbuf_addf(&sb, "%s{replica=\"%u\"} %.9g\n", gauges[g].name, i, v);
        }
    }
    step_timing(&sb, s);
    pthread_mutex_unlock(&s->mu);
    double up = (double)(px_now_ns() - s->t_start) / 1e9;
    head(&sb, "plexus_serve_uptime_seconds", "gauge", "since the server started");
    px_strbuf_addf(&sb, "plexus_serve_uptime_seconds %.3f\n", up);
    head(&sb, "plexus_serve_tokens_per_second", "gauge",
         "generated tokens per second since the server started");
    px_strbuf_addf(&sb, "plexus_serve_tokens_per_second %.3f\n",
                   up > 0 ? (double)m.completion_tokens / up : 0);
    return sb.buf ? sb.buf : px_strdup("");
}

void px__srv_window_since(px_rt_engine_decode_timing *out, const px_rt_engine_decode_timing *now,
                          const px_rt_engine_decode_timing *base)
{
    _Static_assert(sizeof *out % sizeof(uint64_t) == 0, "counters only");
    for (size_t c = 0; c < PX_RT_ENGINE_ROW_CLASSES; c++) {
        const uint64_t *a = (const uint64_t *)&now[c], *b = (const uint64_t *)&base[c];
        uint64_t *d = (uint64_t *)&out[c];
        /* A snapshot older than the base (read before the window moved
         * on): no steps. */
        bool behind = now[c].steps < base[c].steps;
        for (size_t k = 0; k < sizeof *out / sizeof(uint64_t); k++)
            d[k] = behind || a[k] < b[k] ? 0 : a[k] - b[k];
    }
}

/* One class of a replica's decode steps in one window as a plexus.run/1
 * report, its stages as /health lists them (device, [first, end) blocks);
 * NULL when a stage is not described or out of memory. */
static json_t *class_run(const px_rt_engine_decode_timing *d, uint32_t n_stages,
                         const json_t *stages, uint32_t replica, uint32_t window, bool emulated)
{
    double steps = (double)d->steps;
    json_t *a = json_array();
    json_t *doc = json_pack("{s:s, s:s, s:i, s:i, s:b, s:I, s:f, s:f, s:{s:i}, s:{s:I}}", "schema",
                            "plexus.run/1", "source", "plexus serve", "replica", (int)replica,
                            "window", (int)window, "emulated", emulated, "steps",
                            (json_int_t)d->steps, "rows_per_step", (double)d->rows / steps,
                            "context", d->rows ? (double)d->context / (double)d->rows : 0.0,
                            "prefill", "tokens", 0, "decode", "tokens", (json_int_t)d->rows);
    px_status st = a && doc ? PX_OK : PX_ENOMEM;
    for (uint32_t i = 0; st == PX_OK && i < n_stages; i++) {
        const json_t *s = json_array_get(stages, i);
        const json_t *dev = json_object_get(s, "device");
        const json_t *layers = json_object_get(s, "layers");
        if (!json_is_string(dev) || !json_is_array(layers) || json_array_size(layers) != 2) {
            st = PX_EINVAL;
            break;
        }
        double wait = (double)d->wait_ns[i] / 1e9 / steps;
        double compute = (double)d->compute_ns[i] / 1e9 / steps;
        st = px_json_push(
            a,
            json_pack("{s:i, s:O, s:{s:I, s:I}, s:{s:f}, s:f, s:f}", "index", (int)i, "device", dev,
                      "layers", "first", json_integer_value(json_array_get(layers, 0)), "last",
                      json_integer_value(json_array_get(layers, 1)) - 1, "decode_s_per_token",
                      "observed", compute, "core_wait_s_per_decode_step", wait,
                      "transfer_in_s_per_decode_step", (double)d->hop_ns[i] / 1e9 / steps));
    }
    if (st == PX_OK) {
        st = px_json_set(doc, "stages", a);
        a = NULL;
    }
    json_decref(a);
    if (st != PX_OK) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}

json_t *px_serve_run_report(px_serve *s)
{
    json_t *runs = json_array();
    json_t *doc = json_pack("{s:s, s:s, s:b}", "schema", "plexus.serve-run/1", "model",
                            s->model_name, "emulated", s->emulated);
    px_status st = runs && doc ? PX_OK : PX_ENOMEM;
    if (st == PX_OK && s->emulated)
        st = px_json_set(doc, "notice",
                         json_string("emulated devices: times come from emulation profiles on "
                                     "this machine, no claim about real hardware"));
    /* Each replica's steps by rows now, for its open window: read from
     * the engines before the server's lock is taken. */
    px_rt_engine_decode_timing(*now)[PX_RT_ENGINE_ROW_CLASSES] =
        calloc(s->n_reps ? s->n_reps : 1, sizeof *now);
    if (!now)
        st = PX_ENOMEM;
    for (uint32_t r = 0; now && r < s->n_reps; r++)
        if (s->reps[r].engine)
            px_rt_engine_decode_timing_get(s->reps[r].engine, now[r]);
    pthread_mutex_lock(&s->mu);
    for (uint32_t r = 0; st == PX_OK && r < s->n_reps; r++) {
        const px__srv_replica *rep = &s->reps[r];
        const px_rt_engine_metrics *e = &rep->em;
        uint32_t n = PX_MIN(e->n_stages, (uint32_t)PX_RT_MAX_STAGES);
        /* A session in this process has no stage workers to report. */
        if (!rep->heal || n == 0 || json_array_size(rep->stages) != n)
            continue;
        /* The windows closed that the ring still holds, then the open one. */
        uint32_t first = rep->n_windows > PX__SRV_WINDOWS ? rep->n_windows - PX__SRV_WINDOWS : 0;
        for (uint32_t w = first; st == PX_OK && w <= rep->n_windows; w++) {
            px_rt_engine_decode_timing open[PX_RT_ENGINE_ROW_CLASSES];
            const px_rt_engine_decode_timing *win = rep->windows[w % PX__SRV_WINDOWS];
            if (w == rep->n_windows) {
                px__srv_window_since(open, now[r], rep->win_base);
                win = open;
            }
            for (uint32_t c = 0; st == PX_OK && c < PX_RT_ENGINE_ROW_CLASSES; c++) {
                if (win[c].steps < PX_SERVE_REPORT_MIN_STEPS ||
                    json_array_size(runs) >= PX_SERVE_REPORT_MAX_RUNS)
                    continue;
                json_t *run = class_run(&win[c], n, rep->stages, r, w, s->emulated);
                st = run ? px_json_push(runs, run) : PX_ENOMEM;
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(now);
    if (st == PX_OK) {
        st = px_json_set(doc, "runs", runs);
        runs = NULL;
    }
    json_decref(runs);
    if (st != PX_OK) {
        json_decref(doc);
        return NULL;
    }
    return doc;
}
