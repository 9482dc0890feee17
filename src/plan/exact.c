/* Exact yardsticks for the heuristic search: exhaustive enumeration of
 * ordered sequences of disjoint device groups (single devices and
 * tensor-parallel groups of any devices, each sequence with its optimal
 * cut by DP) on small fleets,
 * and a mixed-integer program (GLPK) for the bottleneck split on medium
 * ones.  They measure the heuristic's optimality gap; they never plan. */
#include "base/common.h"

#include <glpk.h>

#include "plan/plan_impl.h"

static px_cost_workload yard_workload(const px_plan_request *req)
{
    px_cost_workload wl = req->workload;
    if (wl.batch == 0)
        wl.batch = 1;
    wl.micro_batches = 1;
    return wl;
}

typedef struct enum_state {
    px__plan_ctx *ctx;
    px__plan_dp_session *session;
    const uint32_t *devs;
    size_t n, max_len;
    px__plan_unit units[8];
    uint32_t used; /* bitmask over devs */
    px_cost_workload wl;
    double best;
    size_t n_layouts;
    px_status st;
    px_err *err;
} enum_state;

static bool tp_ok(const px_cost_model *m, uint32_t p)
{
    return p <= PX_COST_MAX_TP && m->n_heads % p == 0 &&
           (m->n_kv_heads == 0 || m->n_kv_heads % p == 0);
}

/* Every ordered sequence of disjoint groups of the devices (any group whose
 * size divides the heads, of any devices, over whatever links join them),
 * each with its best cut of the layers: the search's shapes and every
 * other. */
static void visit(enum_state *s, size_t n_units, size_t n_devs)
{
    if (s->st != PX_OK)
        return;
    if (n_units > 0) {
        px_cost_pipeline pipe;
        double v;
        s->n_layouts++;
        px_status st = px__plan_dp_units(s->session, s->units, n_units, false, &pipe, &v, s->err);
        if (st == PX_OK) {
            px_cost_estimate *e = s->ctx->scratch;
            if (px_cost_eval_pipeline(s->ctx->fleet, s->ctx->model, s->ctx->cp, &s->wl, &pipe, NULL,
                                      e, NULL) == PX_OK &&
                e->why == PX_COST_OK && e->tpot_s < s->best)
                s->best = e->tpot_s;
        } else if (st != PX_EINFEASIBLE) {
            s->st = st;
            return;
        }
    }
    if (n_devs == s->max_len || n_units == PX_ARRAY_LEN(s->units))
        return;
    uint32_t all = (1u << s->n) - 1;
    uint32_t free_mask = all & ~s->used;
    /* Every non-empty subset of the unused devices as the next group. */
    for (uint32_t g = free_mask; g; g = (g - 1) & free_mask) {
        uint32_t size = (uint32_t)__builtin_popcount(g);
        if (n_devs + size > s->max_len || !tp_ok(s->ctx->model, size))
            continue;
        if (size > 1 && s->ctx->fleet->devices[s->devs[__builtin_ctz(g)]].cls == PX_HW_CLASS_CPU)
            continue;
        px__plan_unit *u = &s->units[n_units];
        memset(u, 0, sizeof *u);
        u->tp = 0;
        for (uint32_t i = 0; i < s->n; i++)
            if (g & (1u << i))
                u->devices[u->tp++] = s->devs[i];
        px__plan_fill_unit(s->ctx, u);
        if (u->tp > 1)
            u->island = (uint32_t)(s->ctx->fleet->n_islands + s->ctx->fleet->n_devices) + g;
        s->used |= g;
        visit(s, n_units + 1, n_devs + size);
        s->used &= ~g;
    }
}

px_status px_plan_exact(const px_plan_request *req, uint32_t max_devices, double *best, px_err *err)
{
    px_cost_fleet *f;
    px_cost_model *m;
    px__plan_ctx ctx;
    px_status st = px__plan_open(req, &f, &m, &ctx, err);
    if (st != PX_OK)
        return st;
    uint32_t devs[8];
    size_t n = 0;
    for (uint32_t i = 0; i < f->n_devices; i++) {
        if (!ctx.usable[i])
            continue;
        if (n == 8) {
            px__plan_close(f, m, &ctx);
            return px_err_set(err, PX_ELIMIT,
                              "exhaustive yardstick: more than 8 usable devices (use the MILP)");
        }
        devs[n++] = i;
    }
    enum_state s = {.ctx = &ctx,
                    .devs = devs,
                    .n = n,
                    .max_len = PX_MIN((size_t)max_devices, n),
                    .wl = yard_workload(ctx.req),
                    .best = INFINITY,
                    .st = PX_OK,
                    .err = err};
    st = px__plan_dp_session_new(&ctx, &s.wl, &s.session, err);
    if (st == PX_OK) {
        visit(&s, 0, 0);
        st = s.st;
        px__plan_dp_session_free(s.session);
    }
    px__plan_close(f, m, &ctx);
    if (st == PX_OK && !isfinite(s.best))
        st = px_err_set(err, PX_EINFEASIBLE, "exhaustive yardstick: nothing fits");
    *best = s.best;
    return st;
}

/* Per-block decode time and bytes of one device, for the linear model both
 * the MILP and the heuristic's answer are measured in. */
typedef struct linear_dev {
    double t_block; /* seconds per block per decode step */
    double t_head;  /* seconds of the head (classifier) per step */
    double cap;     /* bytes available for blocks, embedding and head */
} linear_dev;

static px_status linear_model(px__plan_ctx *ctx, const px_cost_workload *wl, linear_dev *ld,
                              double *block_bytes, double *head_bytes, double *emb_bytes,
                              px_err *err)
{
    const px_cost_model *m = ctx->model;
    double bytes = 0, kv = 0, flops = 0, T = px_cost_attended(wl);
    for (uint32_t i = 0; i < m->n_layers; i++) {
        bytes += m->layers[i].attn_bytes + m->layers[i].ffn_bytes;
        kv += m->layers[i].kv_bytes_token;
        flops += m->layers[i].flops_token + T * m->layers[i].flops_pair + m->layers[i].flops_seq;
    }
    double L = PX_MAX(m->n_layers, 1u);
    double b = PX_MAX(wl->batch, 1u);
    double per_read = (bytes + b * T * kv) / L;
    double per_flops = b * flops / L;
    *block_bytes = bytes / L + b * wl->context * kv / L;
    *head_bytes = m->tied_head ? 0 : m->head.attn_bytes;
    *emb_bytes = m->embedding.attn_bytes;
    double head_flops = b * (m->head.flops_token + m->head.flops_seq);
    for (uint32_t i = 0; i < ctx->fleet->n_devices; i++) {
        const px_cost_device *d = &ctx->fleet->devices[i];
        px_hw_dtype cd;
        bool fb;
        double peak =
            px_cost_compute_dtype(d, m->weight_dtype, m->act_dtype, &cd, &fb) ? d->peak[cd] : 0;
        if (!ctx->usable[i] || peak <= 0) {
            ld[i].t_block = INFINITY;
            ld[i].cap = 0;
            continue;
        }
        ld[i].t_block = PX_MAX(per_read / (d->mem_bw * ctx->cp->eff_mem),
                               per_flops / (peak * ctx->cp->eff_compute));
        ld[i].t_head = PX_MAX(m->head.attn_bytes / (d->mem_bw * ctx->cp->eff_mem),
                              head_flops / (peak * ctx->cp->eff_compute));
        double over = px_cost_device_overhead(ctx->cp, d);
        ld[i].cap = d->mem_free * (1.0 - ctx->cp->headroom) - over;
    }
    (void)err;
    return PX_OK;
}

px_status px_plan_milp(const px_plan_request *req, double *best_stage_s, px_err *err)
{
    px_cost_fleet *f;
    px_cost_model *m;
    px__plan_ctx ctx;
    px_status st = px__plan_open(req, &f, &m, &ctx, err);
    if (st != PX_OK)
        return st;
    size_t n = f->n_devices;
    if (n > 64) {
        px__plan_close(f, m, &ctx);
        return px_err_set(err, PX_ELIMIT, "MILP yardstick: more than 64 devices");
    }
    px_cost_workload wl = yard_workload(ctx.req);
    linear_dev ld[64];
    double blk, hb, eb;
    linear_model(&ctx, &wl, ld, &blk, &hb, &eb, err);
    /* Per usable device d: n_d blocks (integer), h_d and e_d (binary: it
     * holds the head, the embedding); z the bottleneck.
     *   min z
     *   n_d t_d + h_d th_d - z <= 0          (stage time)
     *   n_d blk + h_d hb + e_d eb <= cap_d   (memory)
     *   h_d - n_d <= 0,  e_d - n_d <= 0      (only on devices with blocks)
     *   sum n_d = L,  sum h_d = 1,  sum e_d = 1
     * Times in milliseconds, bytes in GiB, to keep the LP well scaled. */
    int idx[64];
    int u = 0;
    for (size_t i = 0; i < n; i++)
        idx[i] = isfinite(ld[i].t_block) && ld[i].cap >= blk ? u++ : -1;
    if (u == 0) {
        px__plan_close(f, m, &ctx);
        return px_err_set(err, PX_EINFEASIBLE, "MILP yardstick: no device holds a block");
    }
    const double GB = 1073741824.0;
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    int ncols = 3 * u + 1, z = ncols;
    glp_add_cols(lp, ncols);
    for (int k = 0; k < u; k++) {
        glp_set_col_kind(lp, 1 + k, GLP_IV);
        glp_set_col_bnds(lp, 1 + k, GLP_LO, 0.0, 0.0);
        glp_set_col_kind(lp, 1 + u + k, GLP_BV);
        glp_set_col_kind(lp, 1 + 2 * u + k, GLP_BV);
    }
    glp_set_col_bnds(lp, z, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(lp, z, 1.0);
    int nrows = 4 * u + 3;
    glp_add_rows(lp, nrows);
    size_t cap = (size_t)(14 * u + 8);
    int *ia = malloc(cap * sizeof *ia), *ja = malloc(cap * sizeof *ja);
    double *ar = malloc(cap * sizeof *ar);
    if (!ia || !ja || !ar) {
        free(ia);
        free(ja);
        free(ar);
        glp_delete_prob(lp);
        px__plan_close(f, m, &ctx);
        return px_err_set(err, PX_ENOMEM, "out of memory building the MILP");
    }
    int k = 0, r = 0;
#define ENTRY(row, col, val) (++k, ia[k] = (row), ja[k] = (col), ar[k] = (val))
    for (size_t i = 0; i < n; i++) {
        if (idx[i] < 0)
            continue;
        int c = idx[i];
        glp_set_row_bnds(lp, ++r, GLP_UP, 0.0, 0.0);
        ENTRY(r, 1 + c, ld[i].t_block * 1e3);
        ENTRY(r, 1 + u + c, ld[i].t_head * 1e3);
        ENTRY(r, z, -1.0);
        glp_set_row_bnds(lp, ++r, GLP_UP, 0.0, ld[i].cap / GB);
        ENTRY(r, 1 + c, blk / GB);
        ENTRY(r, 1 + u + c, hb / GB);
        ENTRY(r, 1 + 2 * u + c, eb / GB);
        glp_set_row_bnds(lp, ++r, GLP_UP, 0.0, 0.0);
        ENTRY(r, 1 + u + c, 1.0);
        ENTRY(r, 1 + c, -1.0);
        glp_set_row_bnds(lp, ++r, GLP_UP, 0.0, 0.0);
        ENTRY(r, 1 + 2 * u + c, 1.0);
        ENTRY(r, 1 + c, -1.0);
    }
    glp_set_row_bnds(lp, ++r, GLP_FX, (double)m->n_layers, (double)m->n_layers);
    for (int c = 0; c < u; c++)
        ENTRY(r, 1 + c, 1.0);
    glp_set_row_bnds(lp, ++r, GLP_FX, 1.0, 1.0);
    for (int c = 0; c < u; c++)
        ENTRY(r, 1 + u + c, 1.0);
    glp_set_row_bnds(lp, ++r, GLP_FX, 1.0, 1.0);
    for (int c = 0; c < u; c++)
        ENTRY(r, 1 + 2 * u + c, 1.0);
#undef ENTRY
    glp_load_matrix(lp, k, ia, ja, ar);
    free(ia);
    free(ja);
    free(ar);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = 20000;
    int ret = glp_intopt(lp, &parm);
    int status = glp_mip_status(lp);
    if (ret != 0 || (status != GLP_OPT && status != GLP_FEAS)) {
        st = px_err_set(err, PX_EINFEASIBLE,
                        "MILP yardstick: no split of the blocks fits (GLPK status %d)", status);
    } else {
        *best_stage_s = glp_mip_obj_val(lp) / 1e3;
    }
    glp_delete_prob(lp);
    px__plan_close(f, m, &ctx);
    return st;
}

px_status px_plan_heuristic_bottleneck(const px_plan_request *req, double *best_stage_s,
                                       px_err *err)
{
    px_cost_fleet *f;
    px_cost_model *m;
    px__plan_ctx ctx;
    px_status st = px__plan_open(req, &f, &m, &ctx, err);
    if (st != PX_OK)
        return st;
    if (f->n_devices > 64) {
        px__plan_close(f, m, &ctx);
        return px_err_set(err, PX_ELIMIT, "yardstick: more than 64 devices");
    }
    px_cost_workload wl = yard_workload(ctx.req);
    px_cost_pipeline pipe;
    st = px__plan_heuristic_pipe(&ctx, &wl, true, &pipe, err);
    if (st == PX_OK) {
        linear_dev ld[64];
        double blk, hb, eb;
        linear_model(&ctx, &wl, ld, &blk, &hb, &eb, err);
        double worst = 0;
        for (uint32_t i = 0; i < pipe.n_stages; i++) {
            const px_cost_stage *s = &pipe.stages[i];
            double blocks = (double)(s->last - s->first + 1);
            double t = blocks * ld[s->devices[0]].t_block;
            if (s->head)
                t += ld[s->devices[0]].t_head;
            worst = PX_MAX(worst, t);
        }
        *best_stage_s = worst;
    }
    px__plan_close(f, m, &ctx);
    return st;
}
