/* Symbolic expressions of B, S and T: building, checked evaluation, text. */
#include "ir/ir_impl.h"

static px_ir_expr *node(px_arena *a, px__expr_op op)
{
    px_ir_expr *e = px_arena_calloc(a, 1, sizeof *e);
    if (e)
        e->op = op;
    return e;
}

const px_ir_expr *px__e_const(px_arena *a, uint64_t k)
{
    px_ir_expr *e = node(a, PX__E_CONST);
    if (e)
        e->k = k;
    return e;
}

const px_ir_expr *px__e_var(px_arena *a, px__expr_op var)
{
    PX_ASSERT(var == PX__E_B || var == PX__E_S || var == PX__E_T);
    return node(a, var);
}

static bool apply(px__expr_op op, uint64_t x, uint64_t y, uint64_t *out)
{
    switch (op) {
    case PX__E_ADD:
        return !__builtin_add_overflow(x, y, out);
    case PX__E_SUB:
        return !__builtin_sub_overflow(x, y, out);
    case PX__E_MUL:
        return !__builtin_mul_overflow(x, y, out);
    case PX__E_DIV:
        if (y == 0)
            return false;
        *out = x / y;
        return true;
    case PX__E_CDIV:
        if (y == 0)
            return false;
        *out = x / y + (x % y != 0);
        return true;
    case PX__E_MIN:
        *out = x < y ? x : y;
        return true;
    case PX__E_MAX:
        *out = x > y ? x : y;
        return true;
    default:
        return false;
    }
}

const px_ir_expr *px__e_bin(px_arena *a, px__expr_op op, const px_ir_expr *x, const px_ir_expr *y)
{
    if (!x || !y)
        return NULL;
    if (x->op == PX__E_CONST && y->op == PX__E_CONST) {
        uint64_t r;
        if (apply(op, x->k, y->k, &r))
            return px__e_const(a, r);
    }
    /* Identities keep printed expressions short. */
    if (op == PX__E_MUL) {
        if (x->op == PX__E_CONST && x->k == 1)
            return y;
        if (y->op == PX__E_CONST && y->k == 1)
            return x;
        if ((x->op == PX__E_CONST && x->k == 0) || (y->op == PX__E_CONST && y->k == 0))
            return px__e_const(a, 0);
        /* Keep the constant factor first: k * (rest). */
        if (y->op == PX__E_CONST && x->op != PX__E_CONST) {
            const px_ir_expr *t = x;
            x = y;
            y = t;
        }
    }
    if (op == PX__E_ADD) {
        if (x->op == PX__E_CONST && x->k == 0)
            return y;
        if (y->op == PX__E_CONST && y->k == 0)
            return x;
    }
    px_ir_expr *e = node(a, op);
    if (e) {
        e->a = x;
        e->b = y;
    }
    return e;
}

const px_ir_expr *px__e_pairs(px_arena *a, uint32_t window, bool causal)
{
    px_ir_expr *e = node(a, PX__E_PAIRS);
    if (e) {
        e->k = window;
        e->k2 = causal;
    }
    return e;
}

const px_ir_expr *px__e_moe(px_arena *a, uint32_t n_experts, uint32_t n_used,
                            const px_ir_expr *tokens)
{
    if (!tokens)
        return NULL;
    px_ir_expr *e = node(a, PX__E_MOE);
    if (e) {
        e->k = n_experts;
        e->k2 = n_used;
        e->a = tokens;
    }
    return e;
}

const px_ir_expr *px__e_cost(px_arena *a, uint64_t k_tok, uint64_t k_seq, uint64_t k_const,
                             uint64_t k_pair, const px_ir_expr *pairs)
{
    const px_ir_expr *B = px__e_var(a, PX__E_B);
    const px_ir_expr *S = px__e_var(a, PX__E_S);
    const px_ir_expr *sum = px__e_const(a, 0);
    if (k_tok)
        sum = px__e_bin(
            a, PX__E_ADD, sum,
            px__e_bin(a, PX__E_MUL, px__e_const(a, k_tok), px__e_bin(a, PX__E_MUL, B, S)));
    if (k_pair && pairs)
        sum = px__e_bin(
            a, PX__E_ADD, sum,
            px__e_bin(a, PX__E_MUL, px__e_const(a, k_pair), px__e_bin(a, PX__E_MUL, B, pairs)));
    if (k_seq)
        sum = px__e_bin(a, PX__E_ADD, sum, px__e_bin(a, PX__E_MUL, px__e_const(a, k_seq), B));
    if (k_const)
        sum = px__e_bin(a, PX__E_ADD, sum, px__e_const(a, k_const));
    return sum;
}

bool px__attention_pairs(uint64_t S, uint64_t T, uint32_t window, bool causal, uint64_t *out)
{
    if (S > T)
        return false;
    if (!causal) {
        uint64_t keys = window && window < T ? window : T;
        return !__builtin_mul_overflow(S, keys, out);
    }
    if (S == 0) {
        *out = 0;
        return true;
    }
    /* New tokens attend to c = T-S+1 .. T keys each, capped at the window:
     * sum of min(c, W) over that range. */
    uint64_t lo = T - S + 1, hi = T;
    uint64_t W = window ? window : hi;
    uint64_t total = 0;
    if (lo <= W) {
        uint64_t top = hi < W ? hi : W; /* uncapped part lo..top */
        /* (lo + top) * (top - lo + 1) / 2, with one factor even first. */
        uint64_t n = top - lo + 1, s = lo + top, p;
        if (n % 2 == 0)
            n /= 2;
        else
            s /= 2;
        if (__builtin_mul_overflow(n, s, &p))
            return false;
        total = p;
    }
    if (hi > W) {
        uint64_t first_capped = lo > W ? lo : W + 1;
        uint64_t n = hi - first_capped + 1, p;
        if (__builtin_mul_overflow(n, W, &p) || __builtin_add_overflow(total, p, &total))
            return false;
    }
    *out = total;
    return true;
}

uint64_t px_ir_attention_pairs(uint64_t S, uint64_t T, uint32_t window, bool causal)
{
    uint64_t r;
    return px__attention_pairs(S, T, window, causal, &r) ? r : UINT64_MAX;
}

uint64_t px_ir_moe_experts_touched(uint32_t n_experts, uint32_t n_used, uint64_t n_tokens)
{
    if (n_experts == 0 || n_tokens == 0)
        return 0;
    if (n_used >= n_experts)
        return n_experts;
    double miss = 1.0 - (double)n_used / (double)n_experts;
    double touched = (double)n_experts * (1.0 - pow(miss, (double)n_tokens));
    /* Rounded up, with a little slack for pow's last bit, and never fewer
     * than the experts one token uses. */
    uint64_t r = (uint64_t)ceil(touched - 1e-9);
    if (r < n_used)
        r = n_used;
    if (r > n_experts)
        r = n_experts;
    return r;
}

static px_status eval(const px_ir_expr *e, px_ir_dims d, uint64_t *out, int depth)
{
    if (!e || depth > 64)
        return PX_EINVAL;
    uint64_t x, y;
    px_status st;
    switch (e->op) {
    case PX__E_CONST:
        *out = e->k;
        return PX_OK;
    case PX__E_B:
        *out = d.B;
        return PX_OK;
    case PX__E_S:
        *out = d.S;
        return PX_OK;
    case PX__E_T:
        *out = d.T;
        return PX_OK;
    case PX__E_PAIRS:
        return px__attention_pairs(d.S, d.T, (uint32_t)e->k, e->k2 != 0, out) ? PX_OK : PX_ERANGE;
    case PX__E_MOE:
        if ((st = eval(e->a, d, &x, depth + 1)) != PX_OK)
            return st;
        *out = px_ir_moe_experts_touched((uint32_t)e->k, (uint32_t)e->k2, x);
        return PX_OK;
    default:
        if ((st = eval(e->a, d, &x, depth + 1)) != PX_OK ||
            (st = eval(e->b, d, &y, depth + 1)) != PX_OK)
            return st;
        return apply(e->op, x, y, out) ? PX_OK : PX_ERANGE;
    }
}

px_status px_ir_expr_eval(const px_ir_expr *e, px_ir_dims d, uint64_t *out, px_err *err)
{
    if (!e)
        return px_err_set(err, PX_EINVAL, "no expression to evaluate");
    if (d.B < 1 || d.S < 1 || d.S > d.T)
        return px_err_set(err, PX_EINVAL,
                          "dims B=%" PRIu64 " S=%" PRIu64 " T=%" PRIu64
                          " are invalid; need B >= 1 and 1 <= S <= T",
                          d.B, d.S, d.T);
    px_status st = eval(e, d, out, 0);
    if (st != PX_OK) {
        char text[200];
        px_ir_expr_format(e, text, sizeof text);
        return px_err_set(err, st,
                          "%s overflows 64 bits at B=%" PRIu64 " S=%" PRIu64 " T=%" PRIu64
                          "; use smaller dims",
                          text, d.B, d.S, d.T);
    }
    return PX_OK;
}

static void fmt(const px_ir_expr *e, px_strbuf *sb, int parent_prec)
{
    static const char *const ops[] = {
        [PX__E_ADD] = "+",
        [PX__E_SUB] = "-",
        [PX__E_MUL] = "*",
        [PX__E_DIV] = "/",
    };
    switch (e->op) {
    case PX__E_CONST:
        px_strbuf_addf(sb, "%" PRIu64, e->k);
        return;
    case PX__E_B:
        px_strbuf_adds(sb, "B");
        return;
    case PX__E_S:
        px_strbuf_adds(sb, "S");
        return;
    case PX__E_T:
        px_strbuf_adds(sb, "T");
        return;
    case PX__E_PAIRS:
        if (!e->k2 && !e->k) {
            px_strbuf_adds(sb, parent_prec > 2 ? "(S*T)" : "S*T");
            return;
        }
        px_strbuf_addf(sb, "%s(S,T", e->k2 ? "causal_pairs" : "pairs");
        if (e->k)
            px_strbuf_addf(sb, ",window=%" PRIu64, e->k);
        px_strbuf_adds(sb, ")");
        return;
    case PX__E_MOE:
        px_strbuf_addf(sb, "experts_touched(E=%" PRIu64 ",k=%" PRIu64 ",n=", e->k, e->k2);
        fmt(e->a, sb, 0);
        px_strbuf_adds(sb, ")");
        return;
    case PX__E_CDIV:
    case PX__E_MIN:
    case PX__E_MAX:
        px_strbuf_adds(sb, e->op == PX__E_CDIV  ? "ceil_div("
                           : e->op == PX__E_MIN ? "min("
                                                : "max(");
        fmt(e->a, sb, 0);
        px_strbuf_adds(sb, ",");
        fmt(e->b, sb, 0);
        px_strbuf_adds(sb, ")");
        return;
    default: {
        int prec = (e->op == PX__E_ADD || e->op == PX__E_SUB) ? 1 : 2;
        bool paren = prec < parent_prec;
        if (paren)
            px_strbuf_adds(sb, "(");
        fmt(e->a, sb, prec);
        px_strbuf_adds(sb, ops[e->op]);
        /* The right operand of - and / binds tighter. */
        fmt(e->b, sb, (e->op == PX__E_SUB || e->op == PX__E_DIV) ? prec + 1 : prec);
        if (paren)
            px_strbuf_adds(sb, ")");
        return;
    }
    }
}

size_t px_ir_expr_format(const px_ir_expr *e, char *buf, size_t n)
{
    px_strbuf sb = PX_STRBUF_INIT;
    if (e)
        fmt(e, &sb, 0);
    else
        px_strbuf_adds(&sb, "?");
    size_t len = sb.len;
    if (n)
        px_strlcpy(buf, sb.buf, n);
    px_strbuf_release(&sb);
    return len;
}

bool px_ir_expr_is_const(const px_ir_expr *e)
{
    if (!e)
        return true;
    switch (e->op) {
    case PX__E_CONST:
        return true;
    case PX__E_B:
    case PX__E_S:
    case PX__E_T:
    case PX__E_PAIRS:
    case PX__E_MOE:
        return false;
    default:
        return px_ir_expr_is_const(e->a) && px_ir_expr_is_const(e->b);
    }
}
