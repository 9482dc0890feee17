/* Detection and localization: per-signal robust baselines (a stage's
 * compute, a hop's transfer), departures confirmed over consecutive steps
 * or over a window (intermittent), and a stale-topology check of the
 * baseline against the plan's predictions. */
#include "base/common.h"

#include "heal/heal_impl.h"

#define MAX_SIGNALS  (2 * PX_RT_MAX_STAGES + 1)
#define WINDOW_MAX   64
#define BASELINE_MAX 4096

/* Signal s: s <= n is the hop into stage s (n: to the executor); s > n is
 * stage s - n - 1's compute.  Hops come first so that a slow link is not
 * mistaken for the stage behind it when both depart in one step. */
typedef struct signal {
    double *base;      /* baseline_steps samples */
    double *base_rows; /* ...and the rows of each (0: not known) */
    double *base_ctx;  /* ...and the positions they attended (0: not known) */
    uint32_t n_base;
    double baseline;
    double rows;    /* median rows of the baseline's steps; 0: not known */
    double context; /* median positions they attended; 0: not known */
    bool known;
    uint32_t run; /* consecutive departing steps */
    /* The last `window` samples, oldest first at (head - n_recent). */
    double value[WINDOW_MAX];
    bool departs[WINDOW_MAX];
    uint64_t step[WINDOW_MAX];
    double t[WINDOW_MAX];
    uint32_t head, n_recent;
    bool reported, pending;
    px_heal_finding found;
} signal;

struct px_heal_detector {
    px_heal_envelope env;
    px_heal_detector_opts o;
    uint32_t window;
    uint32_t n_signals;
    uint64_t accepted; /* samples fed since the last rebase */
    uint64_t first_step;
    double first_t;
    bool stale_checked, stale_pending;
    px_heal_finding stale;
    signal sig[MAX_SIGNALS];
};

void px_heal_detector_opts_default(px_heal_detector_opts *o)
{
    *o = (px_heal_detector_opts){.baseline_steps = 8,
                                 .ratio = 2.0,
                                 .floor_s = 0.0005,
                                 .confirm = 3,
                                 .stale_ratio = 3.0,
                                 .host_stretch = 1.0};
}

void px_heal_envelope_from_spec(const px_rt_pipeline_spec *spec, px_heal_envelope *out)
{
    memset(out, 0, sizeof *out);
    out->n_stages = PX_MIN(spec->n_stages, (uint32_t)PX_RT_MAX_STAGES);
    for (uint32_t i = 0; i < PX_RT_MAX_STAGES; i++) {
        bool in = i < out->n_stages;
        out->compute_p50[i] = in ? spec->stages[i].pred_decode_s.p50 : NAN;
        out->compute_hi[i] = in ? spec->stages[i].pred_decode_s.hi : NAN;
        out->attention_pos_s[i] = in ? spec->stages[i].pred_attention_pos_s : NAN;
        if (in) {
            px_strlcpy(out->device[i], spec->stages[i].device, sizeof out->device[i]);
            out->host_cores[i] = px_rt_stage_on_host_cores(&spec->stages[i]);
        }
    }
    for (uint32_t i = 0; i <= PX_RT_MAX_STAGES; i++)
        out->xfer_p50[i] = out->xfer_hi[i] = NAN;
}

void px_heal_sample_from_obs(const px_rt_step_obs *obs, double t_s, px_heal_sample *out)
{
    memset(out, 0, sizeof *out);
    out->step = obs->index;
    out->t_s = t_s;
    out->n_stages = PX_MIN(obs->n_stages, (uint32_t)PX_RT_MAX_STAGES);
    for (uint32_t i = 0; i < out->n_stages; i++) {
        out->compute_s[i] = (double)obs->compute_ns[i] / 1e9;
        out->wait_s[i] = (double)obs->wait_ns[i] / 1e9;
        out->xfer_wait_s[i] = (double)obs->xfer_wait_ns[i] / 1e9;
        out->xfer_s[i] = (double)obs->xfer_in_ns[i] / 1e9;
    }
    out->xfer_s[out->n_stages] = (double)obs->xfer_out_ns / 1e9;
    out->xfer_wait_s[out->n_stages] = (double)obs->xfer_out_wait_ns / 1e9;
    out->rows = obs->n_rows;
    out->context = 0;
    for (uint32_t i = 0; obs->pos && obs->n_tokens && i < obs->n_seqs; i++)
        out->context += (uint64_t)obs->pos[i] + obs->n_tokens[i];
}

static void reset(px_heal_detector *d, const px_heal_envelope *env)
{
    d->env = *env;
    d->n_signals = 2 * env->n_stages + 1;
    d->accepted = 0;
    d->first_step = 0;
    d->stale_checked = d->stale_pending = false;
    for (uint32_t s = 0; s < MAX_SIGNALS; s++) {
        signal *g = &d->sig[s];
        double *base = g->base, *base_rows = g->base_rows, *base_ctx = g->base_ctx;
        memset(g, 0, sizeof *g);
        g->base = base;
        g->base_rows = base_rows;
        g->base_ctx = base_ctx;
        g->baseline = NAN;
    }
}

px_status px_heal_detector_new(const px_heal_envelope *env, const px_heal_detector_opts *o,
                               px_heal_detector **out, px_err *err)
{
    *out = NULL;
    px_heal_detector_opts dflt;
    px_heal_detector_opts_default(&dflt);
    if (!o)
        o = &dflt;
    if (!env || env->n_stages < 1 || env->n_stages > PX_RT_MAX_STAGES)
        return px_err_set(err, PX_EINVAL, "detector: the envelope has %u stages; use 1 to %d",
                          env ? env->n_stages : 0, PX_RT_MAX_STAGES);
    if (o->baseline_steps < 1 || o->baseline_steps > BASELINE_MAX)
        return px_err_set(err, PX_EINVAL, "detector: baseline_steps %u; use 1 to %d",
                          o->baseline_steps, BASELINE_MAX);
    if (!(o->ratio > 1 && o->ratio < 1e6))
        return px_err_set(err, PX_EINVAL, "detector: ratio %g; use a value above 1", o->ratio);
    if (!(o->floor_s >= 0 && o->floor_s < 3600))
        return px_err_set(err, PX_EINVAL, "detector: floor_s %g; use 0 to 3600 s", o->floor_s);
    if (o->confirm < 1 || o->confirm > WINDOW_MAX / 2)
        return px_err_set(err, PX_EINVAL, "detector: confirm %u; use 1 to %d", o->confirm,
                          WINDOW_MAX / 2);
    if (!(o->stale_ratio > 1 && o->stale_ratio < 1e6))
        return px_err_set(err, PX_EINVAL, "detector: stale_ratio %g; use a value above 1",
                          o->stale_ratio);
    if (!(o->host_stretch >= 1 && o->host_stretch <= 64))
        return px_err_set(err, PX_EINVAL, "detector: host_stretch %g; use 1 to 64",
                          o->host_stretch);
    px_heal_detector *d = calloc(1, sizeof *d);
    if (!d)
        return px_err_set(err, PX_ENOMEM, "out of memory for a detector");
    for (uint32_t s = 0; s < MAX_SIGNALS; s++) {
        d->sig[s].base = malloc(o->baseline_steps * sizeof(double));
        d->sig[s].base_rows = malloc(o->baseline_steps * sizeof(double));
        d->sig[s].base_ctx = malloc(o->baseline_steps * sizeof(double));
        if (!d->sig[s].base || !d->sig[s].base_rows || !d->sig[s].base_ctx) {
            px_heal_detector_free(d);
            return px_err_set(err, PX_ENOMEM, "out of memory for a detector");
        }
    }
    d->o = *o;
    d->window = PX_MIN((uint32_t)WINDOW_MAX, PX_MAX(8u, 4 * o->confirm));
    reset(d, env);
    *out = d;
    return PX_OK;
}

void px_heal_detector_free(px_heal_detector *d)
{
    if (!d)
        return;
    for (uint32_t s = 0; s < MAX_SIGNALS; s++) {
        free(d->sig[s].base);
        free(d->sig[s].base_rows);
        free(d->sig[s].base_ctx);
    }
    free(d);
}

void px_heal_detector_rebase(px_heal_detector *d, const px_heal_envelope *env)
{
    if (env && env->n_stages >= 1 && env->n_stages <= PX_RT_MAX_STAGES)
        reset(d, env);
    else
        reset(d, &d->env);
}

/* A stage's name in evidence: "stage1 (local.emu-a)". */
static void stage_name(const px_heal_detector *d, uint32_t i, char *buf, size_t cap)
{
    if (d->env.device[i][0])
        px__heal_textf(buf, cap, "stage%u (%s)", i, d->env.device[i]);
    else
        px__heal_textf(buf, cap, "stage%u", i);
}

static const char *end_id(const px_heal_detector *d, uint32_t i, char *buf, size_t cap)
{
    if (i >= d->env.n_stages)
        return "executor";
    if (d->env.device[i][0])
        return d->env.device[i];
    px__heal_textf(buf, cap, "stage%u", i);
    return buf;
}

static void signal_locus(const px_heal_detector *d, uint32_t s, px_heal_locus *l)
{
    uint32_t n = d->env.n_stages;
    memset(l, 0, sizeof *l);
    char a[16], b[16];
    if (s <= n) {
        l->kind = PX_HEAL_AT_LINK;
        l->stage = s == 0 ? n : s - 1;
        l->to = s;
        px__heal_textf(l->device, sizeof l->device, "%.47s>%.47s",
                       s == 0 ? "executor" : end_id(d, s - 1, a, sizeof a),
                       end_id(d, s, b, sizeof b));
    } else {
        l->kind = PX_HEAL_AT_COMPUTE;
        l->stage = s - n - 1;
        px_strlcpy(l->device, end_id(d, l->stage, a, sizeof a), sizeof l->device);
    }
}

/* "hop stage0>stage1" or "compute of stage1 (local.emu-a)". */
static void signal_name(const px_heal_detector *d, uint32_t s, char *buf, size_t cap)
{
    uint32_t n = d->env.n_stages;
    if (s <= n) {
        char a[16] = "executor", b[16] = "executor";
        if (s > 0)
            px__heal_textf(a, sizeof a, "stage%u", s - 1);
        if (s < n)
            px__heal_textf(b, sizeof b, "stage%u", s);
        px__heal_textf(buf, cap, "hop %s>%s", a, b);
    } else {
        char st[96];
        stage_name(d, s - n - 1, st, sizeof st);
        px__heal_textf(buf, cap, "compute of %s", st);
    }
}

static uint32_t ring_at(const signal *g, uint32_t window, uint32_t k)
{
    /* k-th oldest of the n_recent kept. */
    return (g->head + window - g->n_recent + k) % window;
}

/* What the other kind of signal does now, for the evidence. */
static void others_text(const px_heal_detector *d, uint32_t s, char *buf, size_t cap)
{
    uint32_t n = d->env.n_stages;
    bool hop = s <= n;
    uint32_t lo = hop ? n + 1 : 0, hi = hop ? d->n_signals : n + 1;
    for (uint32_t o = lo; o < hi; o++) {
        const signal *g = &d->sig[o];
        if (!g->known || !g->n_recent)
            continue;
        uint32_t last = ring_at(g, d->window, g->n_recent - 1);
        if (g->departs[last]) {
            char name[120];
            signal_name(d, o, name, sizeof name);
            px__heal_textf(buf, cap, "%s also departs (%.3gx)", name,
                           g->baseline > 0 ? g->value[last] / g->baseline : 0.0);
            return;
        }
    }
    px__heal_textf(buf, cap, hop ? "compute of every stage unchanged" : "every hop unchanged");
}

static void confirm_signal(px_heal_detector *d, uint32_t s, uint64_t step, double t_s,
                           bool intermittent)
{
    signal *g = &d->sig[s];
    uint32_t n = d->env.n_stages;
    double dep[WINDOW_MAX];
    uint32_t n_dep = 0;
    uint64_t onset = step;
    double onset_t = t_s;
    double first = NAN;
    /* Steady: the current run; intermittent: every departure in the window. */
    uint32_t from = intermittent ? 0 : g->n_recent - g->run;
    for (uint32_t k = from; k < g->n_recent; k++) {
        uint32_t r = ring_at(g, d->window, k);
        if (!g->departs[r])
            continue;
        if (n_dep == 0) {
            onset = g->step[r];
            onset_t = g->t[r];
            first = g->value[r];
        }
        dep[n_dep++] = g->value[r];
    }
    px_heal_finding *f = &g->found;
    memset(f, 0, sizeof *f);
    f->cls = s <= n ? PX_HEAL_LINK_DEGRADE : PX_HEAL_THERMAL;
    signal_locus(d, s, &f->locus);
    f->baseline_s = g->baseline;
    f->observed_s = px__heal_median(dep, n_dep);
    f->ratio = g->baseline > 0 ? f->observed_s / g->baseline : 0;
    f->onset_step = onset;
    f->confirmed_step = step;
    f->onset_t_s = onset_t;
    f->confirmed_t_s = t_s;
    f->intermittent = intermittent;
    char name[120], obs[32], base[32], others[160], extra[120] = "";
    signal_name(d, s, name, sizeof name);
    px__heal_fmt_s(f->observed_s, obs, sizeof obs);
    px__heal_fmt_s(g->baseline, base, sizeof base);
    others_text(d, s, others, sizeof others);
    if (intermittent) {
        px__heal_textf(extra, sizeof extra, ", intermittent: %u departing of the last %u steps",
                       n_dep, g->n_recent);
    } else if (f->cls == PX_HEAL_THERMAL) {
        char a[32], b[32];
        uint32_t last = ring_at(g, d->window, g->n_recent - 1);
        px__heal_fmt_s(first, a, sizeof a);
        px__heal_fmt_s(g->value[last], b, sizeof b);
        px__heal_textf(extra, sizeof extra, ", growing from %s to %s", a, b);
    }
    char ratio[24], at_rows[64] = "";
    if (g->baseline > 0)
        px__heal_textf(ratio, sizeof ratio, " (%.3gx)", f->ratio);
    else
        ratio[0] = 0;
    bool by_pos = s > n && g->context > 0 && d->env.attention_pos_s[s - n - 1] > 0;
    if (g->rows > 0 && by_pos)
        px__heal_textf(at_rows, sizeof at_rows, " at %.0f rows and %.0f positions", g->rows,
                       g->context);
    else if (g->rows > 0)
        px__heal_textf(at_rows, sizeof at_rows, " at %.0f rows", g->rows);
    px__heal_textf(f->evidence, sizeof f->evidence,
                   "%s: %s per step%s since step %" PRIu64 ", baseline %s%s%s; %s", name, obs,
                   at_rows, onset, base, ratio, extra, others);
    g->pending = true;
}

static void check_stale(px_heal_detector *d, uint64_t step, double t_s)
{
    d->stale_checked = true;
    uint32_t n = d->env.n_stages;
    uint32_t best = UINT32_MAX, count = 0;
    double best_r = 0;
    for (uint32_t s = 0; s < d->n_signals; s++) {
        const signal *g = &d->sig[s];
        double hi = s <= n ? d->env.xfer_hi[s] : d->env.compute_hi[s - n - 1];
        if (!g->known || !(hi > 0) || !isfinite(hi))
            continue;
        double r = g->baseline / hi;
        if (r > d->o.stale_ratio) {
            count++;
            if (r > best_r) {
                best_r = r;
                best = s;
            }
        }
    }
    if (best == UINT32_MAX)
        return;
    const signal *g = &d->sig[best];
    double hi = best <= n ? d->env.xfer_hi[best] : d->env.compute_hi[best - n - 1];
    px_heal_finding *f = &d->stale;
    memset(f, 0, sizeof *f);
    f->cls = PX_HEAL_STALE_TOPOLOGY;
    signal_locus(d, best, &f->locus);
    f->ratio = best_r;
    f->baseline_s = g->baseline;
    f->observed_s = g->baseline;
    f->onset_step = d->first_step;
    f->confirmed_step = step;
    f->onset_t_s = d->first_t;
    f->confirmed_t_s = t_s;
    char name[120], base[32], pred[32], more[48] = "";
    signal_name(d, best, name, sizeof name);
    px__heal_fmt_s(g->baseline, base, sizeof base);
    px__heal_fmt_s(hi, pred, sizeof pred);
    if (count > 1)
        px__heal_textf(more, sizeof more, "; %u signals in all", count);
    px__heal_textf(f->evidence, sizeof f->evidence,
                   "%s: %s per step from the first steps, the plan predicted at most %s (%.3gx)%s; "
                   "the inventory's figures do not match this hardware",
                   name, base, pred, best_r, more);
    d->stale_pending = true;
}

static bool emit(px_heal_detector *d, px_heal_finding *f)
{
    if (d->stale_pending) {
        d->stale_pending = false;
        if (f)
            *f = d->stale;
        return true;
    }
    for (uint32_t s = 0; s < d->n_signals; s++) {
        signal *g = &d->sig[s];
        if (g->pending) {
            g->pending = false;
            g->reported = true;
            if (f)
                *f = g->found;
            return true;
        }
    }
    return false;
}

/* Whether stages a and b run on one host: their device ids ("node.device",
 * the inventory's global ids) share the node.  A stage without a device
 * id, or whose id names no node, shares a host with none. */
static bool same_host(const px_heal_detector *d, uint32_t a, uint32_t b)
{
    const char *x = d->env.device[a], *y = d->env.device[b];
    const char *dx = strchr(x, '.'), *dy = strchr(y, '.');
    return dx && dy && dx > x && dx - x == dy - y && !memcmp(x, y, (size_t)(dx - x));
}

/* The stage whose host a loopback hop s lies on, or UINT32_MAX when s
 * may cross a link: a hop between two stages of one host, or a hop to or
 * from the executor when every stage is on one host (the executor then
 * runs there too: `plexus serve`). */
static uint32_t loopback_host(const px_heal_detector *d, uint32_t s)
{
    uint32_t n = d->env.n_stages;
    if (s > 0 && s < n)
        return same_host(d, s - 1, s) ? s - 1 : UINT32_MAX;
    for (uint32_t i = 1; i < n; i++)
        if (!same_host(d, 0, i))
            return UINT32_MAX;
    return n > 1 ? 0 : UINT32_MAX;
}

/* Hosts whose cores are contended in this step: two or more of their
 * stages depart at once, or two or more of their loopback hops.  A device
 * fault slows its own stage, a link fault its own hop; what slows several
 * stages or hops of one host together is the host (its cores shared by
 * stage workers, emulated devices, the executor and the server), not a
 * device or a link, so those departures confirm nothing.  departs is per
 * signal; busy[i] says whether stage i's host is contended. */
static void contended_hosts(const px_heal_detector *d, const bool *departs, bool *busy)
{
    uint32_t n = d->env.n_stages;
    const bool *stage_departs = departs + n + 1;
    for (uint32_t i = 0; i < n; i++) {
        busy[i] = false;
        for (uint32_t j = 0; j < n && !busy[i]; j++)
            busy[i] = j != i && stage_departs[i] && stage_departs[j] && same_host(d, i, j);
        uint32_t hops = 0;
        for (uint32_t s = 0; s <= n && !busy[i]; s++) {
            uint32_t h = departs[s] ? loopback_host(d, s) : UINT32_MAX;
            hops += h != UINT32_MAX && (h == i || same_host(d, h, i));
            busy[i] = hops >= 2;
        }
    }
    /* Every stage of a contended host, departing now or not. */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n && !busy[i]; j++)
            busy[i] = busy[j] && same_host(d, i, j);
}

/* Whether signal s lies on a contended host: a stage on it, or a hop whose
 * ends are on it (the executor's end counts as the stage's host). */
static bool on_busy_host(const px_heal_detector *d, uint32_t s, const bool *busy)
{
    uint32_t n = d->env.n_stages;
    if (s > n)
        return busy[s - n - 1];
    if (s == 0)
        return busy[0];
    if (s == n)
        return busy[n - 1];
    return busy[s - 1] && busy[s];
}

/* The expected time of signal s in this step over its baseline: the
 * rows' factor (never below 1), and for a stage whose time per attended
 * position the envelope knows, that time for every position past the
 * baseline's (scaled by the rows' factor).  The time per position is
 * capped at the baseline step over its positions: attention cannot cost
 * more than the whole step did. */
static double expected_scale(const px_heal_detector *d, uint32_t s, const signal *g,
                             const px_heal_sample *smp)
{
    double rows = g->rows > 0 && smp->rows > g->rows ? smp->rows / g->rows : 1;
    uint32_t n = d->env.n_stages;
    if (s <= n || !(g->baseline > 0) || !(g->context > 0) || smp->context == 0)
        return rows;
    double a = d->env.attention_pos_s[s - n - 1];
    if (!(a > 0) || !isfinite(a))
        return rows;
    a = PX_MIN(a, g->baseline / g->context);
    double more = (double)smp->context - g->context * rows;
    return more > 0 ? rows + a * more / g->baseline : rows;
}

/* A time without the part of it spent waiting for a core. */
static double less_wait(double v, double w)
{
    return isfinite(w) && w > 0 && w <= v ? v - w : v;
}

bool px_heal_detector_observe(px_heal_detector *d, const px_heal_sample *smp, px_heal_finding *f)
{
    if (!d || !smp || smp->n_stages != d->env.n_stages)
        return d ? emit(d, f) : false;
    uint32_t n = d->env.n_stages;
    if (d->accepted++ == 0) {
        d->first_step = smp->step;
        d->first_t = smp->t_s;
    }
    /* First every signal's departure in this step, then the hosts they
     * show contended, then what confirms. */
    bool seen[MAX_SIGNALS] = {false}, departs_now[MAX_SIGNALS] = {false};
    double scaled[MAX_SIGNALS];
    for (uint32_t s = 0; s < d->n_signals; s++) {
        signal *g = &d->sig[s];
        double v = s <= n ? less_wait(smp->xfer_s[s], smp->xfer_wait_s[s])
                          : less_wait(smp->compute_s[s - n - 1], smp->wait_s[s - n - 1]);
        if (!isfinite(v) || v < 0)
            continue;
        if (!g->known) {
            g->base_rows[g->n_base] = smp->rows;
            g->base_ctx[g->n_base] = (double)smp->context;
            g->base[g->n_base++] = v;
            if (g->n_base == d->o.baseline_steps) {
                g->baseline = px__heal_median(g->base, g->n_base);
                /* Rows (positions) are known only if every baseline step
                 * knew them. */
                bool rows = true, ctx = true;
                for (uint32_t k = 0; k < g->n_base; k++) {
                    rows = rows && g->base_rows[k] > 0;
                    ctx = ctx && g->base_ctx[k] > 0;
                }
                g->rows = rows ? px__heal_median(g->base_rows, g->n_base) : 0;
                g->context = ctx ? px__heal_median(g->base_ctx, g->n_base) : 0;
                g->known = true;
            }
            continue;
        }
        seen[s] = true;
        /* Scaled back to the baseline's rows and positions (see the
         * header). */
        double scale = expected_scale(d, s, g, smp);
        scaled[s] = v / scale;
        /* The floor is a margin on the step as it ran: by how much it
         * exceeded its expected time, not its scaled-back one. */
        /* A stage on the host's cores may run as much slower as sharing
         * them stretches it. */
        double ratio =
            s > n && d->env.host_cores[s - n - 1] ? d->o.ratio * d->o.host_stretch : d->o.ratio;
        departs_now[s] =
            scaled[s] > ratio * g->baseline && (scaled[s] - g->baseline) * scale > d->o.floor_s;
    }
    bool busy[PX_RT_MAX_STAGES];
    contended_hosts(d, departs_now, busy);
    for (uint32_t s = 0; s < d->n_signals; s++) {
        if (!seen[s])
            continue;
        signal *g = &d->sig[s];
        double v = scaled[s];
        /* A contended host's step is kept as a normal one: it must not
         * add up to a confirmation later either. */
        bool departs = departs_now[s] && !on_busy_host(d, s, busy);
        g->value[g->head] = v;
        g->departs[g->head] = departs;
        g->step[g->head] = smp->step;
        g->t[g->head] = smp->t_s;
        g->head = (g->head + 1) % d->window;
        if (g->n_recent < d->window)
            g->n_recent++;
        g->run = departs ? g->run + 1 : 0;
        if (g->reported || g->pending || !departs)
            continue;
        /* Departures and onsets (a departure after a normal step) in the
         * window: a link that degrades for part of each period departs
         * often without ever departing `confirm` times in a row. */
        uint32_t n_dep = 0, onsets = 0;
        bool prev = false;
        for (uint32_t k = 0; k < g->n_recent; k++) {
            bool x = g->departs[ring_at(g, d->window, k)];
            n_dep += x;
            onsets += x && !prev;
            prev = x;
        }
        bool intermittent = onsets >= 2;
        if (g->run >= d->o.confirm)
            confirm_signal(d, s, smp->step, smp->t_s, intermittent && n_dep > g->run);
        else if (intermittent && n_dep >= 2 * d->o.confirm)
            confirm_signal(d, s, smp->step, smp->t_s, true);
    }
    if (!d->stale_checked && d->accepted >= d->o.baseline_steps)
        check_stale(d, smp->step, smp->t_s);
    return emit(d, f);
}
