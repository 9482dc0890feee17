/* Uncertainty propagation by seeded Monte Carlo, and lower bounds. */
#include "base/common.h"

#include "cost/cost_impl.h"

/* A factor around 1 for a relative uncertainty read as a 2-sigma
 * half-width, truncated at 2 sigma so no sample turns negative. */
static double draw_factor(px_rng *r, double rel)
{
    if (rel <= 0)
        return 1.0;
    double z = px_rng_normal(r);
    z = PX_MAX(-2.0, PX_MIN(2.0, z));
    double x = 1.0 + z * rel / 2.0;
    return x > 0.05 ? x : 0.05;
}

/* An efficiency around its point value, spread over its range (a quarter
 * of the range as one sigma) and kept inside it. */
static double draw_eff(px_rng *r, double point, double lo, double hi)
{
    double x = point + px_rng_normal(r) * (hi - lo) / 4.0;
    return PX_MAX(lo, PX_MIN(hi, x));
}

/* A correction's factor around 1: its interval [lo, hi] read like every
 * other uncertainty of the model, as the 2-sigma half-widths (one on each
 * side, since a ratio's interval need not be symmetric) of a normal
 * truncated at 2 sigma. */
static double draw_correction(px_rng *r, const px_cost_correction *c)
{
    double z = px_rng_normal(r);
    z = PX_MAX(-2.0, PX_MIN(2.0, z));
    double side = z < 0 ? c->factor - c->lo : c->hi - c->factor;
    double x = 1.0 + z * side / c->factor / 2.0;
    return x > 0.05 ? x : 0.05;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v and summarizes it; high_is_bad picks which tail p99 is. */
static px_cost_interval summarize(double *v, size_t n, bool high_is_bad)
{
    px_cost_interval r;
    qsort(v, n, sizeof *v, cmp_double);
    size_t mid = n / 2;
    size_t i99 = (size_t)ceil(0.99 * (double)n) - 1;
    size_t i01 = n - 1 - i99;
    r.p50 = n % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
    r.p99 = high_is_bad ? v[i99] : v[i01];
    r.lo = v[0];
    r.hi = v[n - 1];
    return r;
}

px_status px_cost_uncertainty(px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                              const px_cost_workload *wl, const px_cost_pipeline *pipe,
                              double slo_tpot_s, double slo_ttft_s, px_cost_uncertain *out,
                              px_err *err)
{
    return px_cost_uncertainty_layout(f, m, p, wl, pipe, 1, slo_tpot_s, slo_ttft_s, out, err);
}

/* Marks the devices and hw links pipeline pipe draws from. */
static void mark_used(px_cost_fleet *f, const px_cost_pipeline *pipe, bool *dev, bool *link)
{
    for (uint32_t s = 0; s < pipe->n_stages; s++) {
        const px_cost_stage *stg = &pipe->stages[s];
        for (uint32_t j = 0; j < stg->tp; j++) {
            dev[stg->devices[j]] = true;
            px_cost_path pa =
                px_cost_fleet_path(f, stg->devices[j], stg->devices[(j + 1) % stg->tp]);
            if (pa.bottleneck >= 0 && stg->tp > 1)
                link[pa.bottleneck] = true;
        }
        if (s + 1 < pipe->n_stages) {
            px_cost_path pa =
                px_cost_fleet_path(f, stg->devices[0], pipe->stages[s + 1].devices[0]);
            if (pa.bottleneck >= 0)
                link[pa.bottleneck] = true;
        }
    }
}

px_status px_cost_uncertainty_layout(px_cost_fleet *f, const px_cost_model *m,
                                     const px_cost_params *p, const px_cost_workload *wls,
                                     const px_cost_pipeline *pipes, size_t n_pipes,
                                     double slo_tpot_s, double slo_ttft_s, px_cost_uncertain *out,
                                     px_err *err)
{
    memset(out, 0, sizeof *out);
    if (n_pipes == 0)
        return px_err_set(err, PX_EINVAL, "uncertainty of a layout without replicas");
    px_cost_estimate *est = malloc(sizeof *est);
    if (!est)
        return px_err_set(err, PX_ENOMEM, "out of memory propagating uncertainty");
    px_status st = PX_OK;
    for (size_t r = 0; r < n_pipes && st == PX_OK; r++) {
        st = px_cost_eval_pipeline(f, m, p, &wls[r], &pipes[r], NULL, est, err);
        if (st == PX_OK && est->why != PX_COST_OK) {
            px_cost_infeasible why = est->why;
            st = px_err_set(err, PX_EINFEASIBLE, "uncertainty of an infeasible candidate (%s)",
                            px_cost_infeasible_name(why));
        }
    }
    if (st != PX_OK) {
        free(est);
        return st;
    }
    const px_hw_view *v = px_hw_graph_view(f->graph);
    size_t n = p->mc_samples, nd = f->n_devices, nl = v->n_links, ns = pipes[0].n_stages;
    double *dev_bw = malloc(nd * sizeof *dev_bw);
    double *dev_c = malloc(nd * sizeof *dev_c);
    double *link = malloc((nl ? nl : 1) * sizeof *link);
    double *link_rel = malloc((nl ? nl : 1) * sizeof *link_rel);
    double *acc = malloc(n * (5 + 2 * ns) * sizeof *acc);
    bool *dev_used = calloc(nd ? nd : 1, sizeof *dev_used);
    bool *link_used = calloc(nl ? nl : 1, sizeof *link_used);
    const px_cost_calibration *cal = p->mode == PX_COST_CALIBRATED ? p->calibration : NULL;
    size_t n_cal = px_cost_calibration_count(cal);
    double *corr = n_cal ? malloc(n_cal * sizeof *corr) : NULL;
    /* Per replica of one sample: its figures and its use of a host's cores. */
    double *rep = malloc(n_pipes * 6 * sizeof *rep);
    uint32_t *rep_node = malloc(n_pipes * sizeof *rep_node);
    if (!dev_bw || !dev_c || !link || !link_rel || !acc || !dev_used || !link_used ||
        (n_cal && !corr) || !rep || !rep_node) {
        st = px_err_set(err, PX_ENOMEM, "out of memory propagating uncertainty");
        goto done;
    }
    for (size_t i = 0; i < nd; i++)
        dev_bw[i] = dev_c[i] = 1.0;
    for (size_t i = 0; i < nl; i++) {
        link[i] = 1.0;
        link_rel[i] = 0;
    }
    /* Only the devices and links the replicas use are drawn, each from its
     * own stream (seed, sample, index): two candidates sharing a device see
     * the same draws for it (common random numbers), so comparing them
     * carries no sampling noise, and unused parts of a big fleet cost
     * nothing.  Every replica is evaluated under the same sample: the
     * layout's time per token is the slowest replica's, its throughput the
     * sum, sample by sample. */
    for (size_t r = 0; r < n_pipes; r++)
        mark_used(f, &pipes[r], dev_used, link_used);
    for (size_t l = 0; l < nl; l++)
        if (link_used[l])
            link_rel[l] = px__cost_qty_rel(&v->links[l].bandwidth, p->default_rel_unc);
    double *tp = acc, *tt = acc + n, *thr = acc + 2 * n, *jpt = acc + 3 * n, *usd = acc + 4 * n,
           *stage = acc + 5 * n;
    size_t meet = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t base = p->seed * 0x9E3779B97F4A7C15ull + k;
        for (uint32_t d = 0; d < nd; d++) {
            if (!dev_used[d])
                continue;
            px_rng r = px_rng_derive(base, d);
            dev_bw[d] = draw_factor(&r, f->devices[d].mem_bw_rel);
            dev_c[d] = draw_factor(&r, f->devices[d].peak_rel);
        }
        for (uint32_t l = 0; l < nl; l++) {
            if (!link_used[l])
                continue;
            px_rng r = px_rng_derive(base, nd + l);
            link[l] = draw_factor(&r, link_rel[l]);
        }
        /* Corrections draw from streams of their own, after every device
         * and link index, so that the sourced draws are those of the
         * sourced mode. */
        for (size_t i = 0; i < n_cal; i++) {
            px_rng rc = px_rng_derive(base ^ 0xCA11B4A7E0000000ull, i);
            corr[i] = draw_correction(&rc, px_cost_calibration_at(cal, i));
        }
        px_rng r = px_rng_derive(base, UINT64_MAX);
        px_cost_sample smp = {
            .calib = corr,
            .dev_bw = dev_bw,
            .dev_compute = dev_c,
            .link_bw = link,
            .eff_mem = draw_eff(&r, p->eff_mem, p->eff_mem_lo, p->eff_mem_hi),
            .eff_compute = draw_eff(&r, p->eff_compute, p->eff_compute_lo, p->eff_compute_hi)};
        smp.host_row_s = draw_eff(&r, p->host_row_s, p->host_row_s_lo, p->host_row_s_hi);
        double t_tp = 0, t_tt = 0, t_thr = 0, t_watts = 0, t_usd_h = 0;
        double *use = rep, *k_host = rep + n_pipes, *r_tpot = rep + 2 * n_pipes,
               *r_thr = rep + 3 * n_pipes, *r_jpt = rep + 4 * n_pipes, *r_upt = rep + 5 * n_pipes;
        for (size_t q = n_pipes; q-- > 0;) {
            st = px_cost_eval_pipeline(f, m, p, &wls[q], &pipes[q], &smp, est, err);
            if (st != PX_OK)
                goto done;
            rep_node[q] = est->host_node;
            use[q] = est->step_s > 0 ? est->host_cores_s / est->step_s : 0;
            r_tpot[q] = est->tpot_s;
            r_thr[q] = est->throughput;
            r_jpt[q] = est->joules_per_token;
            r_upt[q] = est->usd_per_token;
            t_tt = PX_MAX(t_tt, est->ttft_s);
        }
        /* Replicas sharing a host's cores slow each other down. */
        px_cost_host_shares(rep_node, use, n_pipes, k_host);
        for (size_t q = 0; q < n_pipes; q++) {
            double thr_q = r_thr[q] / k_host[q];
            t_tp = PX_MAX(t_tp, r_tpot[q] * k_host[q]);
            t_thr += thr_q;
            t_watts += r_jpt[q] * thr_q;
            t_usd_h += r_upt[q] * k_host[q] * thr_q * 3600.0;
        }
        /* est holds replica 0 now: its stages. */
        tp[k] = t_tp;
        tt[k] = t_tt;
        thr[k] = t_thr;
        jpt[k] = t_thr > 0 ? t_watts / t_thr : 0;
        usd[k] = t_thr > 0 ? t_usd_h / 3600.0 / t_thr : 0;
        for (size_t s = 0; s < ns; s++) {
            stage[(2 * s) * n + k] = est->stages[s].decode_s;
            stage[(2 * s + 1) * n + k] = est->stages[s].prefill_s;
        }
        if ((slo_tpot_s <= 0 || t_tp <= slo_tpot_s) && (slo_ttft_s <= 0 || t_tt <= slo_ttft_s))
            meet++;
    }
    out->n_samples = (uint32_t)n;
    out->tpot_s = summarize(tp, n, true);
    out->ttft_s = summarize(tt, n, true);
    out->throughput = summarize(thr, n, false);
    out->joules_per_token = summarize(jpt, n, true);
    out->usd_per_token = summarize(usd, n, true);
    out->n_stages = (uint32_t)ns;
    for (size_t s = 0; s < ns; s++) {
        out->decode_s[s] = summarize(stage + (2 * s) * n, n, true);
        out->prefill_s[s] = summarize(stage + (2 * s + 1) * n, n, true);
    }
    out->p_meet_slo = (double)meet / (double)n;
done:
    free(rep);
    free(rep_node);
    free(corr);
    free(dev_bw);
    free(dev_c);
    free(link);
    free(link_rel);
    free(acc);
    free(dev_used);
    free(link_used);
    free(est);
    return st;
}

/* The memories a bound may read from: each device's own (attainable
 * bandwidth, capacity) and, past its capacity, its node's host memory over
 * its host link.  Every bound here is optimistic: full capacity, no
 * headroom, every device reading at once. */
typedef struct bound_mem {
    double *bw, *cap;
    size_t n;
    double host_bw;  /* sum of the devices' host links */
    double host_cap; /* sum of the nodes' host memory */
    double dev_cap;  /* sum of the devices' capacity */
    double peak;     /* sum of the best peaks */
} bound_mem;

/* The least time in which n devices, each reading at most bw[i] per second
 * and holding at most cap[i] of the bytes, plus host links for the rest,
 * read `bytes` bytes: the smallest t with sum min(bw t, cap) + host_bw t >=
 * bytes.  INFINITY when the bytes cannot be held at all. */
static double fill_time(const bound_mem *bm, double bytes)
{
    if (bytes <= 0)
        return 0;
    if (bm->dev_cap + bm->host_cap < bytes || (bm->dev_cap < bytes && bm->host_bw <= 0))
        return INFINITY;
    double lo = 0, hi = 1;
    for (int i = 0; i < 200; i++) {
        double got = bm->host_bw * hi;
        for (size_t k = 0; k < bm->n; k++)
            got += PX_MIN(bm->bw[k] * hi, bm->cap[k]);
        if (got >= bytes)
            break;
        hi *= 2;
    }
    for (int it = 0; it < 100; it++) {
        double t = (lo + hi) / 2, got = bm->host_bw * t;
        for (size_t k = 0; k < bm->n; k++)
            got += PX_MIN(bm->bw[k] * t, bm->cap[k]);
        if (got >= bytes)
            hi = t;
        else
            lo = t;
    }
    return hi;
}

void px_cost_lower_bound(const px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                         const px_cost_workload *wl, const uint32_t *devices, size_t n_devices,
                         px_cost_bound *out)
{
    px_cost_lower_bound_at(f, m, p, wl, NULL, devices, n_devices, out);
}

void px_cost_lower_bound_at(const px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                            const px_cost_workload *wl, const px_cost_precision *fastest,
                            const uint32_t *devices, size_t n_devices, px_cost_bound *out)
{
    memset(out, 0, sizeof *out);
    size_t n = devices ? n_devices : f->n_devices;
    bound_mem bm = {0};
    bm.bw = calloc(n ? n : 1, sizeof *bm.bw);
    bm.cap = calloc(n ? n : 1, sizeof *bm.cap);
    uint32_t *nodes = calloc(n ? n : 1, sizeof *nodes);
    size_t n_nodes = 0;
    if (!bm.bw || !bm.cap || !nodes)
        goto done;
    double bw = 0;
    for (size_t i = 0; i < n; i++) {
        const px_cost_device *d = &f->devices[devices ? devices[i] : i];
        if (d->mem_free <= 0)
            continue;
        bm.bw[bm.n] = d->mem_bw * p->eff_mem_hi;
        bm.cap[bm.n] = d->mem_free;
        bw += bm.bw[bm.n];
        bm.dev_cap += d->mem_free;
        bm.n++;
        bm.host_bw += d->host_bw;
        bool seen = false;
        for (size_t k = 0; k < n_nodes; k++)
            seen |= nodes[k] == d->node;
        if (!seen) {
            nodes[n_nodes++] = d->node;
            bm.host_cap += d->host_mem;
        }
        double best = 0;
        px_hw_dtype cd;
        bool fb;
        if (fastest) {
            px_dtype w =
                fastest->ffn_weights < PX_DTYPE_COUNT_ ? fastest->ffn_weights : m->weight_dtype;
            if (px_cost_compute_dtype(d, w, fastest->activations, &cd, &fb))
                best = d->peak[cd];
        } else {
            for (int t = 0; t < PX_HW_DTYPE_COUNT; t++)
                if (t != PX_HW_DTYPE_INT4 && d->peak[t] > best)
                    best = d->peak[t];
        }
        bm.peak += best * p->eff_compute_hi;
    }
    if (bw <= 0 || bm.peak <= 0)
        goto done;
    double batch = PX_MAX(wl->batch, 1u);
    double T = m->dit ? m->dit_tokens : px_cost_attended(wl);
    double S = m->dit ? m->dit_tokens : 1.0;
    double P = PX_MAX(wl->prompt_tokens, 1u);
    double weights = 0, held = 0, kv = 0, flops = 0, pf_flops = 0;
    for (uint32_t i = 0; i < m->n_layers; i++) {
        const px_cost_layer *l = &m->layers[i];
        double ffn = l->ffn_bytes;
        if (l->n_experts > 0 && l->expert_bytes > 0) {
            double touched = (double)px_ir_moe_experts_touched(l->n_experts, l->n_experts_used,
                                                               (uint64_t)(batch * S));
            ffn = l->ffn_bytes - l->expert_bytes * l->n_experts + touched * l->expert_bytes;
        }
        weights += l->attn_bytes + ffn;
        held += l->attn_bytes + l->ffn_bytes;
        kv += l->kv_bytes_token;
        flops += S * l->flops_token + (m->dit ? S * T : T) * l->flops_pair + l->flops_seq;
        pf_flops += P * l->flops_token + P * (P + 1) / 2 * l->flops_pair + l->flops_seq;
    }
    weights += m->head.attn_bytes;
    held += m->head.attn_bytes;
    flops += m->head.flops_token + m->head.flops_seq;
    double kv_read = m->dit ? 0 : batch * T * kv;
    /* Capacity: the bytes a step reads live in proportion to what is held;
     * what the devices cannot hold is read over host links. */
    double read = weights + kv_read, hold = held + kv_read;
    double t_mem = fill_time(&bm, hold) < INFINITY && hold > 0
                       ? fill_time(&bm, hold) * (read / hold)
                       : (weights + kv_read) / bw;
    out->tpot_mem_s = PX_MAX(t_mem, (weights + kv_read) / bw);
    out->tpot_compute_s = batch * flops / bm.peak;
    out->tpot_s = PX_MAX(out->tpot_mem_s, out->tpot_compute_s);
    out->ttft_s = m->dit ? out->tpot_s * PX_MAX(m->dit_steps, 1u) : batch * pf_flops / bm.peak;
    /* Throughput: the best batch the fleet's memory (devices and hosts)
     * can hold, each step reading the weights once and every sequence's
     * KV cache, never faster than the aggregate peak allows. */
    double steps = m->dit ? 1.0 / PX_MAX(m->dit_steps, 1u) : 1.0;
    /* Every request's prompt is prefilled too: its FLOPs spread over the
     * tokens it generates count against the peak (the KV it writes is
     * held anyway). */
    double gen = PX_MAX(wl->gen_tokens, 1u);
    flops += m->dit ? 0 : pf_flops / gen;
    double compute_cap = flops > 0 ? bm.peak / flops * steps : 0;
    double best = 0;
    /* A sequence holds its whole context and a step reads what it attends. */
    double kv_seq = m->dit ? 0 : (double)wl->context * kv, kv_att = m->dit ? 0 : T * kv;
    double b_max = kv_seq > 0 ? (bm.dev_cap + bm.host_cap - held) / kv_seq : 1e6;
    if (b_max >= 1) {
        for (double b = 1; b <= b_max * 1.0000001; b = b * 1.25 + 1) {
            double bb = PX_MIN(b, b_max);
            double t = fill_time(&bm, held + bb * kv_seq);
            if (!(t < INFINITY))
                break;
            double tr =
                (held + bb * kv_seq) > 0 ? (weights + bb * kv_att) / (held + bb * kv_seq) : 1.0;
            double step = PX_MAX(t * tr, bb * flops / bm.peak);
            if (step > 0)
                best = PX_MAX(best, bb / step * steps);
            if (bb >= b_max)
                break;
        }
        double t = fill_time(&bm, held + b_max * kv_seq);
        if (t < INFINITY && b_max < 1e6) {
            double tr = (held + b_max * kv_seq) > 0
                            ? (weights + b_max * kv_att) / (held + b_max * kv_seq)
                            : 1.0;
            double step = PX_MAX(t * tr, b_max * flops / bm.peak);
            if (step > 0)
                best = PX_MAX(best, b_max / step * steps);
        }
    }
    out->throughput = best > 0 ? PX_MIN(best, compute_cap) : compute_cap;
done:
    free(bm.bw);
    free(bm.cap);
    free(nodes);
}

double px_cost_pipeline_bound(px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                              const px_cost_workload *wl, const px_cost_pipeline *pipe)
{
    px_cost_estimate *est = malloc(sizeof *est);
    if (!est)
        return 0;
    px_cost_sample s = {.eff_mem = p->eff_mem_hi, .eff_compute = p->eff_compute_hi};
    double r = 0;
    if (px_cost_eval_pipeline(f, m, p, wl, pipe, &s, est, NULL) == PX_OK)
        r = est->tpot_s;
    free(est);
    return r;
}
