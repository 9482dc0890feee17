/* Evaluation of one pipeline: roofline time per stage, transfers,
 * all-reduce, memory itemized per device, energy, money, reliability.
 * Allocates nothing: the planner calls it in its inner loop. */
#include "base/common.h"

#include "cost/cost_impl.h"

#define MAX_DOMAINS_SEEN 256

static px_hw_dtype hw_of(px_dtype dt)
{
    switch (dt) {
    case PX_DTYPE_F16:
        return PX_HW_DTYPE_F16;
    case PX_DTYPE_BF16:
        return PX_HW_DTYPE_BF16;
    case PX_DTYPE_FP8_E4M3:
    case PX_DTYPE_FP8_E5M2:
        return PX_HW_DTYPE_FP8;
    case PX_DTYPE_I8:
        return PX_HW_DTYPE_INT8;
    default:
        return PX_HW_DTYPE_F32;
    }
}

bool px_cost_compute_dtype(const px_cost_device *d, px_dtype weights, px_dtype acts,
                           px_hw_dtype *out, bool *fallback)
{
    px_hw_dtype want = hw_of(acts);
    /* fp8 weights with fp8 activations run fp8 products where the device
     * has them; block-quantized weights are dequantized to the activation
     * dtype inside the kernel. */
    if ((weights == PX_DTYPE_FP8_E4M3 || weights == PX_DTYPE_FP8_E5M2) && want == PX_HW_DTYPE_FP8)
        want = PX_HW_DTYPE_FP8;
    *fallback = false;
    /* Q4_0, Q5_0 and the k-quants multiply as 8-bit integers against
     * activations quantized to 8 bits (ADR 0009): int8 products where
     * the device has them, else as above. */
    bool int8_blocks = weights == PX_DTYPE_Q4_0 || weights == PX_DTYPE_Q5_0 ||
                       (weights >= PX_DTYPE_Q2_K && weights <= PX_DTYPE_Q6_K);
    if (int8_blocks && d->peak[PX_HW_DTYPE_INT8] > 0) {
        *out = PX_HW_DTYPE_INT8;
        return true;
    }
    if (d->peak[want] > 0) {
        *out = want;
        return true;
    }
    /* The nearest supported dtype: the same width first, then wider. */
    static const px_hw_dtype order_f16[] = {PX_HW_DTYPE_BF16, PX_HW_DTYPE_F16, PX_HW_DTYPE_F32,
                                            PX_HW_DTYPE_TF32, PX_HW_DTYPE_F64};
    static const px_hw_dtype order_f32[] = {PX_HW_DTYPE_F32, PX_HW_DTYPE_TF32, PX_HW_DTYPE_BF16,
                                            PX_HW_DTYPE_F16, PX_HW_DTYPE_F64};
    const px_hw_dtype *order = want == PX_HW_DTYPE_F32 ? order_f32 : order_f16;
    for (size_t i = 0; i < 5; i++) {
        if (d->peak[order[i]] > 0) {
            *out = order[i];
            *fallback = true;
            return true;
        }
    }
    return false;
}

static bool has_op(const px_hw_device *d, const char *op)
{
    if (d->all_ops)
        return true;
    for (size_t i = 0; i < d->n_ops; i++)
        if (!strcmp(d->ops[i], op))
            return true;
    return false;
}

static double sample_of(const double *arr, uint32_t i)
{
    return arr ? arr[i] : 1.0;
}

static double path_bw(const px_cost_path *pa, const px_cost_sample *s)
{
    double k = (s && s->link_bw && pa->bottleneck >= 0) ? s->link_bw[pa->bottleneck] : 1.0;
    return pa->bw * k;
}

/* Ring all-reduce inside a tensor-parallel group: bandwidth of the slowest
 * ring link (shared when ring links are in one contention group) and the
 * largest latency. */
static bool ring_of(px_cost_fleet *f, const px_cost_stage *st, const px_cost_sample *s, double *bw,
                    double *lat)
{
    *bw = INFINITY;
    *lat = 0;
    uint32_t groups[PX_COST_MAX_TP];
    uint32_t counts[PX_COST_MAX_TP];
    double bws[PX_COST_MAX_TP];
    uint32_t n = st->tp;
    for (uint32_t i = 0; i < n; i++) {
        px_cost_path pa = px_cost_fleet_path(f, st->devices[i], st->devices[(i + 1) % n]);
        if (!pa.reachable)
            return false;
        groups[i] = pa.contention;
        bws[i] = path_bw(&pa, s);
        if (pa.latency > *lat)
            *lat = pa.latency;
    }
    for (uint32_t i = 0; i < n; i++) {
        counts[i] = 1;
        if (groups[i] == PX_HW_NONE)
            continue;
        for (uint32_t j = 0; j < n; j++)
            if (j != i && groups[j] == groups[i])
                counts[i]++;
    }
    for (uint32_t i = 0; i < n; i++) {
        double b = bws[i] / counts[i];
        if (b < *bw)
            *bw = b;
    }
    return true;
}

static double allreduce_s(uint32_t p, double bytes, double bw, double lat, double n_ops)
{
    if (p <= 1 || n_ops <= 0)
        return 0;
    double frac = 2.0 * (p - 1) / p;
    return n_ops * (frac * bytes / bw + 2.0 * (p - 1) * lat);
}

static const char *required_ops[] = {"matmul", "attention"};

static px_cost_infeasible check_capability(px_cost_fleet *f, const px_cost_stage *st)
{
    const px_hw_view *v = px_hw_graph_view(f->graph);
    for (uint32_t k = 0; k < st->tp; k++) {
        const px_cost_device *d = &f->devices[st->devices[k]];
        const px_hw_device *hd = &v->devices[d->hw_index];
        if (st->last >= st->first)
            for (size_t i = 0; i < PX_ARRAY_LEN(required_ops); i++)
                if (!has_op(hd, required_ops[i]))
                    return PX_COST_NO_CAPABILITY;
        if (st->embedding && !has_op(hd, "embedding"))
            return PX_COST_NO_CAPABILITY;
    }
    return PX_COST_OK;
}

static bool calibrated(const px_cost_params *p)
{
    return p->mode == PX_COST_CALIBRATED && p->calibration;
}

static px_dtype weights_dtype(const px_cost_model *m, const px_cost_stage *st)
{
    return st->prec.ffn_weights == PX_DTYPE_COUNT_ ? m->weight_dtype : st->prec.ffn_weights;
}

/* A sourced time t corrected by the correction that applies (t itself
 * when none does), drawn under a sample. */
static double calib_apply(const px_cost_params *p, const px_cost_sample *s, const char *device,
                          px_cost_op_class cls, px_dtype dt, double size, double t, bool *applied)
{
    size_t idx = 0;
    *applied = false;
    if (px_cost_calibration_lookup(p->calibration, device, cls, dt, size, &idx) !=
        PX_COST_CALIB_APPLIED)
        return t;
    *applied = true;
    const px_cost_correction *c = px_cost_calibration_at(p->calibration, idx);
    double v = c->offset_s + c->factor * t;
    return PX_MAX(v, 0.0) * (s && s->calib ? s->calib[idx] : 1.0);
}

/* The decode memory term and the prefill of one device in the calibrated
 * mode.  A corrected term rests on its measurement: it scales the sourced
 * point prediction (datasheet bandwidth at the point efficiency), and its
 * uncertainty is the correction's, not the sourced bandwidth's. */
static void calibrate_device(const px_cost_params *p, const px_cost_sample *s,
                             const px_cost_device *d, const px_cost_model *m,
                             const px_cost_stage *st, const px__cost_stage_load *ld, double tp,
                             double bw, double dev_kv, double act_traffic, double T, double rows,
                             double pf_point, double *mem_s, double *pf, double *kv_pos_s)
{
    px_dtype dt = weights_dtype(m, st);
    double size = ld->w_decode / PX_MAX(ld->n_blocks, 1u);
    double bw_pt = d->mem_bw * p->eff_mem;
    bool a_mv, a_att, a_mm;
    double w_s =
        calib_apply(p, s, d->id, PX_COST_CLASS_MATVEC, dt, size, ld->w_decode / tp / bw_pt, &a_mv);
    double kv_s =
        calib_apply(p, s, d->id, PX_COST_CLASS_ATTENTION, dt, T, dev_kv / tp / bw_pt, &a_att);
    if (!a_mv)
        w_s = ld->w_decode / tp / bw;
    if (!a_att)
        kv_s = dev_kv / tp / bw;
    /* The correction's time per position: its slope over the sourced
     * time (twice the positions less once; the offset cancels). */
    double positions = dev_kv > 0 && ld->kv_token > 0 ? dev_kv / ld->kv_token : 0;
    if (a_att && positions > 0) {
        bool again;
        double twice = calib_apply(p, s, d->id, PX_COST_CLASS_ATTENTION, dt, T,
                                   2.0 * dev_kv / tp / bw_pt, &again);
        *kv_pos_s = PX_MAX(twice - kv_s, 0.0) / positions;
    }
    *mem_s = w_s + kv_s + act_traffic / tp / bw;
    double pf_cal = calib_apply(p, s, d->id, PX_COST_CLASS_MATMUL, dt, rows, pf_point, &a_mm);
    if (a_mm)
        *pf = pf_cal;
}

static void eval_stage(px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                       const px_cost_workload *wl, const px_cost_stage *st, const px_cost_sample *s,
                       uint32_t b, const px__cost_stage_load *ldp, px_cost_stage_est *e,
                       px_cost_estimate *est, uint32_t si)
{
    double eff_mem = s ? s->eff_mem : p->eff_mem;
    double eff_c = s ? s->eff_compute : p->eff_compute;
    double T = m->dit ? m->dit_tokens : px_cost_attended(wl);
    double P = m->dit ? m->dit_tokens : PX_MAX(wl->prompt_tokens, 1u);
    double S = m->dit ? m->dit_tokens : 1.0; /* new tokens per sequence per step */
    uint32_t tp = st->tp;
    double act_bpe = px__cost_bpe(st->prec.activations, 4.0);
    const px__cost_stage_load ld = *ldp;

    memset(e, 0, sizeof *e);
    /* Decode step (a denoising step for DiT). */
    double pairs = m->dit ? S * T : T;
    double flops = b * (S * ld.flops_tok + pairs * ld.flops_pair + ld.flops_seq);
    double kv_read = m->dit ? 0 : b * T * ld.kv_token;
    double act_traffic = m->dit ? b * S * ld.act_out * 8.0 * ld.n_blocks : 0;
    /* Prefill of the prompt from an empty cache. */
    double pf_flops =
        m->dit ? 0 : b * (P * ld.flops_tok + P * (P + 1) / 2 * ld.flops_pair + ld.flops_seq);
    double pf_bytes = ld.w_prefill + b * P * ld.kv_token + b * P * ld.act_out * 8.0 * ld.n_blocks;

    double ring_bw = INFINITY, ring_lat = 0;
    if (tp > 1 && !ring_of(f, st, s, &ring_bw, &ring_lat)) {
        est->why = PX_COST_NO_PATH;
        est->why_stage = si;
        return;
    }
    ring_bw *= p->eff_link;
    double ar_bytes = b * S * (double)m->dim * act_bpe;
    double ar = allreduce_s(tp, ar_bytes, ring_bw, ring_lat, 2.0 * ld.n_blocks);
    double ar_pf =
        allreduce_s(tp, b * P * (double)m->dim * act_bpe, ring_bw, ring_lat, 2.0 * ld.n_blocks);
    /* Continuous batching: sequences come and go, and each new one's
     * prompt is prefilled in chunks inside decode steps.  In the steady
     * state every step carries the prefill of n_thr sequences (this
     * micro-batch's share of batch / gen_tokens) and a sequence sees the
     * prefill of the others' share, n_tpot.  Their rows add compute, KV
     * writes and activation traffic; the weights are streamed once for
     * the whole step. */
    double G = PX_MAX(wl->gen_tokens, 1u);
    uint32_t n_mb = PX_MAX(wl->micro_batches, 1u);
    double batch_all = PX_MAX(wl->batch, 1u);
    double n_thr = m->dit ? 0 : batch_all / n_mb / G;
    double n_tpot = m->dit ? 0 : (batch_all - 1) / n_mb / G;
    double seq_flops = m->dit ? 0 : pf_flops / b;
    double seq_bytes = m->dit ? 0 : P * ld.kv_token + P * ld.act_out * 8.0 * ld.n_blocks;
    double ar_thr = allreduce_s(tp, (b * S + n_thr * P) * (double)m->dim * act_bpe, ring_bw,
                                ring_lat, 2.0 * ld.n_blocks);
    double ar_tpot = allreduce_s(tp, (b * S + n_tpot * P) * (double)m->dim * act_bpe, ring_bw,
                                 ring_lat, 2.0 * ld.n_blocks);
    double worst_serve = -1;

    double worst = -1;
    for (uint32_t k = 0; k < tp; k++) {
        uint32_t di = st->devices[k];
        const px_cost_device *d = &f->devices[di];
        px_hw_dtype cd;
        bool fb;
        /* The weights as stored when the stage keeps them (a q4_K_M file
         * multiplies in int8 as much as a stage re-stored to Q4_K). */
        if (!px_cost_compute_dtype(d, weights_dtype(m, st), st->prec.activations, &cd, &fb)) {
            est->why = PX_COST_NO_CAPABILITY;
            est->why_stage = si;
            return;
        }
        double bw = d->mem_bw * sample_of(s ? s->dev_bw : NULL, di) * eff_mem;
        double peak = d->peak[cd] * sample_of(s ? s->dev_compute : NULL, di) * eff_c;
        double dev_kv = st->kv == PX_COST_KV_DEVICE ? kv_read : 0;
        double mem_s = (ld.w_decode + dev_kv + act_traffic) / tp / bw;
        double comp_s = flops / tp / peak;
        double kvh_s = st->kv == PX_COST_KV_HOST ? kv_read / tp / (d->host_bw * p->eff_link) : 0;
        double dec = PX_MAX(mem_s, comp_s) + kvh_s + ar;
        /* One more attended position: its KV read, or its FLOPs, by the
         * term that binds, and its KV over the host link. */
        double kv_pos = st->kv == PX_COST_KV_DEVICE && !m->dit ? ld.kv_token / tp / bw : 0;
        double comp_pos = m->dit ? 0 : ld.flops_pair / tp / peak;
        double kvh_pos = st->kv == PX_COST_KV_HOST && !m->dit
                             ? ld.kv_token / tp / (d->host_bw * p->eff_link)
                             : 0;
        double pf_kvh =
            st->kv == PX_COST_KV_HOST ? b * P * ld.kv_token / tp / (d->host_bw * p->eff_link) : 0;
        double pf =
            (m->dit ? 0 : PX_MAX(pf_bytes / tp / bw, pf_flops / tp / peak)) + ar_pf + pf_kvh;
        /* The prefill rows a step carries: their bytes (KV written to the
         * device or over the host link) and FLOPs on top of the decode. */
        double src_dec = dec;
        double seq_dev = st->kv == PX_COST_KV_DEVICE ? seq_bytes : seq_bytes - P * ld.kv_token;
        double seq_host =
            st->kv == PX_COST_KV_HOST ? P * ld.kv_token / tp / (d->host_bw * p->eff_link) : 0;
        double inc_thr =
            PX_MAX(mem_s + n_thr * seq_dev / tp / bw, comp_s + n_thr * seq_flops / tp / peak) +
            kvh_s + n_thr * seq_host + ar_thr - src_dec;
        double inc_tpot =
            PX_MAX(mem_s + n_tpot * seq_dev / tp / bw, comp_s + n_tpot * seq_flops / tp / peak) +
            kvh_s + n_tpot * seq_host + ar_tpot - src_dec;
        if (calibrated(p)) {
            double bw_pt = d->mem_bw * p->eff_mem;
            double peak_pt = d->peak[cd] * p->eff_compute;
            double pf_point =
                (m->dit ? 0 : PX_MAX(pf_bytes / tp / bw_pt, pf_flops / tp / peak_pt)) + ar_pf +
                pf_kvh;
            double pf_src = pf;
            calibrate_device(p, s, d, m, st, &ld, tp, bw, dev_kv, act_traffic, T, b * P, pf_point,
                             &mem_s, &pf, &kv_pos);
            dec = PX_MAX(mem_s, comp_s) + kvh_s + ar;
            /* A step of several rows, measured whole: the work that grows
             * with the rows (products past the memory roofline, attention
             * over every row's positions) is the decode correction's. */
            bool a_dec = false;
            double dec_cal =
                b >= 2 && !m->dit
                    ? calib_apply(p, s, d->id, PX_COST_CLASS_DECODE, weights_dtype(m, st), b,
                                  PX_MAX((ld.w_decode + dev_kv + act_traffic) / tp / bw_pt,
                                         flops / tp / peak_pt),
                                  &a_dec)
                    : 0;
            if (a_dec)
                dec = dec_cal + kvh_s + ar;
            /* The prefill rows are prefill work: the prefill's correction
             * applies to them. */
            double kpf = pf_src > 0 ? pf / pf_src : 1.0;
            inc_thr *= kpf;
            inc_tpot *= kpf;
        }
        double serve = dec + PX_MAX(inc_thr, 0.0);
        if (serve > worst_serve) {
            worst_serve = serve;
            e->serve_s = serve;
            e->serve_tpot_s = dec + PX_MAX(inc_tpot, 0.0);
        }
        if (dec > worst) {
            worst = dec;
            e->decode_s = dec;
            e->mem_s = mem_s;
            e->compute_s = comp_s;
            e->kv_host_s = kvh_s;
            e->allreduce_s = ar;
            e->compute_dtype = cd;
            e->dtype_fallback = fb;
            e->attention_pos_s = (mem_s >= comp_s ? kv_pos : comp_pos) + kvh_pos;
            double top = PX_MAX(PX_MAX(mem_s, comp_s), PX_MAX(kvh_s, ar));
            e->bind = top == comp_s  ? PX_COST_BIND_COMPUTE
                      : top == mem_s ? PX_COST_BIND_MEMORY_BW
                      : top == kvh_s ? PX_COST_BIND_KV_HOST
                                     : PX_COST_BIND_ALLREDUCE;
        }
        if (pf > e->prefill_s)
            e->prefill_s = pf;

        /* Memory of this device. */
        px_cost_mem mem = {0};
        mem.weights = ld.w_mem / tp;
        double kv_all = m->dit ? 0 : (double)wl->batch * wl->context * ld.kv_token / tp;
        if (st->kv == PX_COST_KV_DEVICE)
            mem.kv = kv_all;
        else
            e->host_bytes += kv_all;
        double width = 4.0 * m->dim + 3.0 * m->hidden_dim;
        mem.activations = b * P * width * act_bpe / tp;
        if (st->head)
            mem.activations += b * (double)m->vocab * 4.0;
        /* Emulated devices run the cpu kernels and need their workspace. */
        bool cpu_kernels =
            d->cls == PX_HW_CLASS_CPU || !strcmp(d->backend, "cpu") || !strcmp(d->backend, "emu");
        mem.workspace = cpu_kernels ? p->workspace_cpu : p->workspace_gpu;
        mem.runtime = px_cost_device_overhead(p, d) - mem.workspace;
        mem.total = mem.weights + mem.kv + mem.activations + mem.workspace + mem.runtime;
        mem.limit = d->mem_free * (1.0 - p->headroom);
        if (k == 0 || mem.total - mem.limit > e->mem.total - e->mem.limit)
            e->mem = mem;
        if (mem.total > mem.limit && est->why == PX_COST_OK) {
            est->why = PX_COST_NO_MEMORY;
            est->why_stage = si;
            est->why_bytes = mem.total - mem.limit;
        }
    }
}

static px_status check_layout(const px_cost_fleet *f, const px_cost_model *m,
                              const px_cost_pipeline *pipe, px_err *err)
{
    if (pipe->n_stages == 0 || pipe->n_stages > PX_COST_MAX_STAGES)
        return px_err_set(err, PX_EINVAL, "pipeline has %u stages; use 1 to %d", pipe->n_stages,
                          PX_COST_MAX_STAGES);
    for (uint32_t i = 0; i < pipe->n_stages; i++) {
        const px_cost_stage *st = &pipe->stages[i];
        if (st->tp == 0 || st->tp > PX_COST_MAX_TP)
            return px_err_set(err, PX_EINVAL, "stage %u: tensor-parallel degree %u; use 1 to %d", i,
                              st->tp, PX_COST_MAX_TP);
        for (uint32_t k = 0; k < st->tp; k++)
            if (st->devices[k] >= f->n_devices)
                return px_err_set(err, PX_EINVAL, "stage %u: device index %u out of range", i,
                                  st->devices[k]);
        (void)m;
    }
    return PX_OK;
}

static bool layout_ok(const px_cost_model *m, const px_cost_pipeline *pipe)
{
    int32_t next = 0;
    for (uint32_t i = 0; i < pipe->n_stages; i++) {
        const px_cost_stage *st = &pipe->stages[i];
        if (st->first != next || st->last < st->first - 1 || st->last >= (int32_t)m->n_layers)
            return false;
        if (st->embedding != (i == 0) || st->head != (i + 1 == pipe->n_stages))
            return false;
        next = st->last + 1;
    }
    return next == (int32_t)m->n_layers;
}

static double domain_rate(const px_hw_view *v, const uint32_t *seen, size_t n_seen)
{
    double r = 0;
    for (size_t i = 0; i < n_seen; i++) {
        const px_hw_domain *d = &v->domains[seen[i]];
        if (px_hw_has(d->mtbf) && d->mtbf.value > 0)
            r += 1.0 / d->mtbf.value;
    }
    return r;
}

static void add_domain(const px_hw_view *v, uint32_t dom, uint32_t *seen, size_t *n_seen)
{
    /* Walk up the parents: a rack failure takes its zone's members too. */
    for (int guard = 0; dom != PX_HW_NONE && dom < v->n_domains && guard < 64; guard++) {
        bool dup = false;
        for (size_t i = 0; i < *n_seen; i++)
            if (seen[i] == dom)
                dup = true;
        if (!dup && *n_seen < MAX_DOMAINS_SEEN)
            seen[(*n_seen)++] = dom;
        dom = v->domains[dom].parent;
    }
}

/* A size of the workload, not of calibration: evaluation keys the step
 * class by it, and calibration runs (calib_run.c) use it too. */
double px_cost_step_size(const px_cost_model *m, const px_cost_workload *wl)
{
    uint32_t mb = PX_MAX(wl->micro_batches, 1u);
    uint32_t rows = (PX_MAX(wl->batch, 1u) + mb - 1) / mb;
    return (double)rows * (double)m->vocab * 4.0;
}

px_status px_cost_eval_pipeline(px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                                const px_cost_workload *wl, const px_cost_pipeline *pipe,
                                const px_cost_sample *s, px_cost_estimate *est, px_err *err)
{
    px_status st = check_layout(f, m, pipe, err);
    if (st != PX_OK)
        return st;
    memset(est, 0, offsetof(px_cost_estimate, stages));
    est->n_stages = pipe->n_stages;
    if (!layout_ok(m, pipe)) {
        est->why = PX_COST_BAD_LAYOUT;
        return PX_OK;
    }
    uint32_t mb = PX_MAX(wl->micro_batches, 1u);
    uint32_t batch = PX_MAX(wl->batch, 1u);
    uint32_t b = px__cost_micro_batch(wl);
    for (uint32_t i = 0; i < pipe->n_stages; i++) {
        px_cost_infeasible c = check_capability(f, &pipe->stages[i]);
        if (c != PX_COST_OK) {
            est->why = c;
            est->why_stage = i;
            return PX_OK;
        }
    }
    double S = m->dit ? m->dit_tokens : 1.0;
    double P = m->dit ? 0 : PX_MAX(wl->prompt_tokens, 1u);
    double sum = 0, cycle = 0, pf_sum = 0, pf_max = 0, xfer_sum = 0;
    uint32_t hop_groups[PX_COST_MAX_STAGES];
    double served_xfer[PX_COST_MAX_STAGES] = {0}; /* per prefilled sequence in a step */
    for (uint32_t i = 0; i < pipe->n_stages; i++) {
        px_cost_stage_est *e = &est->stages[i];
        px__cost_stage_load ld;
        px__cost_stage_load_of(m, &pipe->stages[i], (uint64_t)b * (uint64_t)S,
                               (uint64_t)b * (uint64_t)PX_MAX(P, 1.0), &ld);
        eval_stage(f, m, p, wl, &pipe->stages[i], s, b, &ld, e, est, i);
        if (est->why == PX_COST_NO_PATH || est->why == PX_COST_NO_CAPABILITY)
            return PX_OK;
        hop_groups[i] = PX_HW_NONE;
        if (i + 1 < pipe->n_stages) {
            px_cost_path pa =
                px_cost_fleet_path(f, pipe->stages[i].devices[0], pipe->stages[i + 1].devices[0]);
            if (!pa.reachable) {
                est->why = PX_COST_NO_PATH;
                est->why_stage = i;
                return PX_OK;
            }
            double bw = path_bw(&pa, s) * p->eff_link;
            e->xfer_s = pa.latency + b * S * ld.act_out / bw;
            /* The prefill rows of a served step cross too (served_xfer). */
            served_xfer[i] = P * ld.act_out / bw;
            e->xfer_prefill_s = pa.latency + b * P * ld.act_out / bw;
            if (calibrated(p) && pa.bottleneck >= 0) {
                bool a;
                const char *kind = px_hw_link_kind_name(pa.kind);
                double bytes = b * S * ld.act_out, pf_bytes = b * P * ld.act_out;
                double t = calib_apply(p, s, kind, PX_COST_CLASS_COPY, PX_DTYPE_COUNT_, bytes,
                                       pa.latency + bytes / (pa.bw * p->eff_link), &a);
                if (a)
                    e->xfer_s = t;
                t = calib_apply(p, s, kind, PX_COST_CLASS_COPY, PX_DTYPE_COUNT_, pf_bytes,
                                pa.latency + pf_bytes / (pa.bw * p->eff_link), &a);
                if (a)
                    e->xfer_prefill_s = t;
            }
            hop_groups[i] = pa.contention;
        }
    }
    uint32_t host_stage;
    double host_excess;
    if (est->why == PX_COST_OK && px__cost_host_over(f, p, pipe->stages, est->stages,
                                                     pipe->n_stages, &host_stage, &host_excess)) {
        est->why = PX_COST_NO_MEMORY;
        est->why_stage = host_stage;
        est->why_bytes = host_excess;
        est->why_host = true;
    }
    /* Hops in one contention group share it when micro-batches overlap. */
    for (uint32_t i = 0; i + 1 < pipe->n_stages; i++) {
        uint32_t share = 1;
        if (mb > 1 && hop_groups[i] != PX_HW_NONE)
            for (uint32_t j = 0; j + 1 < pipe->n_stages; j++)
                if (j != i && hop_groups[j] == hop_groups[i])
                    share++;
        est->stages[i].xfer_s *= share;
        served_xfer[i] *= share;
    }
    /* The logits back to the executor, beside the first stage's device: a
     * resource each micro-batch crosses once a step, like a hop between
     * stages.  With one stage the executor is beside its device already:
     * the way from a device to its host is the step class's, as the
     * device's way in is. */
    double loop = 0, logits = m->dit ? 0 : b * S * (double)m->vocab * 4.0;
    if (pipe->n_stages > 1) {
        px_cost_path back = px_cost_fleet_path(f, pipe->stages[pipe->n_stages - 1].devices[0],
                                               pipe->stages[0].devices[0]);
        if (back.reachable)
            loop = back.latency + logits / (path_bw(&back, s) * p->eff_link);
    }
    est->return_s = loop;
    uint32_t slow = 0;
    /* Served steps: decode plus the prefill rows mixed in (see eval_stage),
     * for the replica's throughput (thr) and for one sequence (tpot). */
    double G = PX_MAX(wl->gen_tokens, 1u);
    double n_thr = m->dit ? 0 : (double)batch / mb / G;
    double n_tpot = m->dit ? 0 : (double)(batch - 1) / mb / G;
    double sum_thr = 0, cycle_thr = 0, sum_tpot = 0, cycle_tpot = 0;
    for (uint32_t i = 0; i < pipe->n_stages; i++) {
        const px_cost_stage_est *e = &est->stages[i];
        double x_thr = e->xfer_s + n_thr * served_xfer[i];
        double x_tpot = e->xfer_s + n_tpot * served_xfer[i];
        sum_thr += e->serve_s + x_thr;
        sum_tpot += e->serve_tpot_s + x_tpot;
        cycle_thr = PX_MAX(cycle_thr, PX_MAX(e->serve_s, x_thr));
        cycle_tpot = PX_MAX(cycle_tpot, PX_MAX(e->serve_tpot_s, x_tpot));
        sum += e->decode_s + e->xfer_s;
        xfer_sum += e->xfer_s;
        cycle = PX_MAX(cycle, PX_MAX(e->decode_s, e->xfer_s));
        pf_sum += e->prefill_s + e->xfer_prefill_s;
        pf_max = PX_MAX(pf_max, e->prefill_s);
        if (e->decode_s > est->stages[slow].decode_s)
            slow = i;
    }
    sum += loop;
    cycle = PX_MAX(cycle, loop);
    cycle_thr = PX_MAX(cycle_thr, loop);
    cycle_tpot = PX_MAX(cycle_tpot, loop);
    est->transfer_s = xfer_sum + loop;
    /* The host's work per step outside the stages' kernels (the
     * executor's round trip, sampling and token handling per row).  It is
     * not a transfer between stages, so it stays out of transfer_s and
     * bind; the executor handles every micro-batch in turn, so it is a
     * stage of the cycle too. */
    double exec = px__cost_step_host_s(f, m, p, s, pipe, wl, weights_dtype(m, &pipe->stages[0]));
    sum += exec;
    est->executor_s = exec;
    cycle = PX_MAX(cycle, exec);
    cycle_thr = PX_MAX(cycle_thr, exec);
    cycle_tpot = PX_MAX(cycle_tpot, exec);
    est->decode_step_s = PX_MAX(sum, mb * cycle);
    double step_tpot = PX_MAX(sum_tpot + loop + exec, mb * cycle_tpot);
    est->step_s = PX_MAX(sum_thr + loop + exec, mb * cycle_thr);
    /* Stages that run on one host's cores share them: a step cannot be
     * shorter than the core-seconds it asks of a node over its cores. */
    px__cost_host_cores_floor(f, pipe, mb, mb * exec, est);
    est->decode_step_s = PX_MAX(est->decode_step_s, est->host_cores_s);
    step_tpot = PX_MAX(step_tpot, est->host_cores_s);
    est->step_s = PX_MAX(est->step_s, est->host_cores_s);
    est->bind_stage = slow;
    est->bind = est->transfer_s > est->stages[slow].decode_s ? PX_COST_BIND_TRANSFER
                                                             : est->stages[slow].bind;
    if (m->dit) {
        double steps = PX_MAX(m->dit_steps, 1u);
        est->tpot_s = est->step_s;
        est->ttft_s = steps * est->step_s;
        est->throughput = batch / est->ttft_s;
    } else {
        est->tpot_s = step_tpot;
        est->ttft_s = pf_sum + (mb - 1) * pf_max + loop + exec;
        est->throughput = batch / est->step_s;
    }

    /* Energy, money and reliability of the devices used. */
    const px_hw_view *v = px_hw_graph_view(f->graph);
    uint32_t seen[MAX_DOMAINS_SEEN];
    size_t n_seen = 0;
    double rate = 0;
    for (uint32_t i = 0; i < pipe->n_stages; i++) {
        const px_cost_stage *stg = &pipe->stages[i];
        double util = PX_MIN(1.0, mb * est->stages[i].serve_s / est->step_s);
        for (uint32_t k = 0; k < stg->tp; k++) {
            const px_cost_device *d = &f->devices[stg->devices[k]];
            est->power_w += d->power_active * util + d->power_idle * (1.0 - util);
            est->usd_per_hour += d->cost_rate;
            rate += 1.0 / d->mtbf_s;
            for (size_t j = 0; j < d->n_domains; j++)
                add_domain(v, d->domains[j], seen, &n_seen);
        }
    }
    rate += domain_rate(v, seen, n_seen);
    double tokens_per_step = m->dit ? batch / PX_MAX(m->dit_steps, 1u) : batch;
    est->joules_per_token = est->power_w * est->step_s / tokens_per_step;
    est->usd_per_token = est->usd_per_hour / 3600.0 * est->step_s / tokens_per_step;
    est->tokens_per_usd = est->usd_per_hour > 0 ? 3600.0 * est->throughput / est->usd_per_hour : 0;
    est->p_fail = 1.0 - exp(-rate * p->reliability_window_s);
    return PX_OK;
}

px_cost_infeasible px_cost_stage_quick(px_cost_fleet *f, const px_cost_prefix *pre,
                                       const px_cost_params *p, const px_cost_stage *st,
                                       px_cost_stage_est *out)
{
    px_cost_estimate est; /* only the header fields are touched */
    est.why = PX_COST_OK;
    est.why_bytes = 0;
    px_cost_infeasible c = check_capability(f, st);
    if (c != PX_COST_OK)
        return c;
    px__cost_stage_load ld;
    px__cost_load_from_prefix(pre, st, &ld);
    eval_stage(f, pre->model, p, &pre->wl, st, NULL, px__cost_micro_batch(&pre->wl), &ld, out, &est,
               0);
    uint32_t at;
    double over;
    if (est.why == PX_COST_OK && px__cost_host_over(f, p, st, out, 1, &at, &over))
        return PX_COST_NO_MEMORY;
    return est.why;
}

double px_cost_hop_s(px_cost_fleet *f, const px_cost_prefix *pre, const px_cost_params *p,
                     uint32_t a, uint32_t b, int32_t last)
{
    px_cost_path pa = px_cost_fleet_path(f, a, b);
    if (!pa.reachable)
        return INFINITY;
    const px_cost_model *m = pre->model;
    double act = last >= 0 && (uint32_t)last < m->n_layers ? m->layers[last].act_bytes_token
                                                           : m->embedding.act_bytes_token;
    if (act <= 0)
        act = (double)m->dim * px__cost_bpe(m->act_dtype, 4.0);
    act *= px__cost_act_scale(m, pre->prec.activations);
    double S = m->dit ? m->dit_tokens : 1.0;
    double t = pa.latency + px__cost_micro_batch(&pre->wl) * S * act / (pa.bw * p->eff_link);
    if (calibrated(p) && pa.bottleneck >= 0) {
        bool applied;
        t = calib_apply(p, NULL, px_hw_link_kind_name(pa.kind), PX_COST_CLASS_COPY, PX_DTYPE_COUNT_,
                        px__cost_micro_batch(&pre->wl) * S * act, t, &applied);
    }
    return t;
}

px_status px_cost_stage_terms_of(px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                                 const px_cost_workload *wl, const px_cost_stage *st,
                                 px_cost_stage_terms *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (st->tp == 0 || st->tp > PX_COST_MAX_TP || st->devices[0] >= f->n_devices || st->first < 0 ||
        st->last >= (int32_t)m->n_layers || st->last < st->first - 1)
        return px_err_set(err, PX_EINVAL, "stage terms: a malformed stage or device index");
    px_cost_params sp = *p;
    sp.mode = PX_COST_SOURCED;
    sp.calibration = NULL;
    uint32_t b = px__cost_micro_batch(wl);
    double S = m->dit ? m->dit_tokens : 1.0;
    double P = m->dit ? 0 : PX_MAX(wl->prompt_tokens, 1u);
    px__cost_stage_load ld;
    px__cost_stage_load_of(m, st, (uint64_t)b * (uint64_t)S, (uint64_t)b * (uint64_t)PX_MAX(P, 1.0),
                           &ld);
    const px_cost_device *d = &f->devices[st->devices[0]];
    double bw = d->mem_bw * p->eff_mem;
    double T = m->dit ? m->dit_tokens : px_cost_attended(wl);
    double kv_read = m->dit ? 0 : b * T * ld.kv_token;
    out->matvec_s = ld.w_decode / st->tp / bw;
    out->attention_s = st->kv == PX_COST_KV_DEVICE ? kv_read / st->tp / bw : 0;
    out->matvec_size = ld.w_decode / PX_MAX(ld.n_blocks, 1u);
    out->attention_size = T;
    out->matmul_size = b * PX_MAX(P, 1.0);
    out->decode_size = b;
    out->dtype = weights_dtype(m, st);
    px_cost_estimate *est = malloc(sizeof *est);
    if (!est)
        return px_err_set(err, PX_ENOMEM, "out of memory estimating a stage");
    est->why = PX_COST_OK;
    eval_stage(f, m, &sp, wl, st, NULL, b, &ld, &est->stages[0], est, 0);
    out->compute_s = est->stages[0].compute_s;
    out->prefill_s = est->stages[0].prefill_s;
    /* The decode term at the point efficiencies (sourced, no sample): the
     * calibrated mode's decode correction scales this. */
    out->decode_s = PX_MAX(est->stages[0].mem_s, est->stages[0].compute_s);
    free(est);
    return PX_OK;
}
