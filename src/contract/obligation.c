/*
 * The obligation API: what a contract says about a transformation.
 *
 * Judging happens in two steps.  First the transformation's effect is
 * worked out independently of any contract: either a proof rule shows that
 * it keeps every bit, or it is recorded what may change (a dtype, a kernel,
 * a reduction order) and whether the devices involved are deterministic.
 * Then each requirement of the region's clause judges that effect, and the
 * most restrictive verdict wins.  Keeping the two apart is what guarantees
 * the central rule: a bitwise clause only ever sees ALLOWED together with a
 * proof, because "may change bits" is decided once, before any clause is
 * consulted.
 */
#include "contract/contract_impl.h"

typedef struct effect {
    px_contract_proof proof;   /* != NONE: proven to keep every bit */
    bool lossy;                /* a dtype changes */
    bool kernel_change;        /* other kernels compute the region */
    bool reorder;              /* a reduction order changes */
    bool dynamic_order;        /* the order is chosen at run time */
    const char *nondet_device; /* a device whose kernels are nondeterministic */
    char what[192];            /* the transformation in words */
    char proof_text[256];      /* why it keeps bits (proof != NONE) */
} effect;

/* ---- Devices ------------------------------------------------------- */

/* The kernel family a backend runs: emu runs the cpu kernels and stretches
 * their time (ADR 0004), so its bits are the cpu's. */
static const char *kernel_family(const px_contract_device *d)
{
    if (d->backend && !strcmp(d->backend, "emu"))
        return "cpu";
    return d->backend;
}

static bool identical_kernels(const px_contract_device *a, const px_contract_device *b)
{
    const char *fa = kernel_family(a), *fb = kernel_family(b);
    return fa && fb && a->arch && b->arch && !strcmp(fa, fb) && !strcmp(a->arch, b->arch);
}

static bool all_identical(const px_transform *t)
{
    for (size_t i = 1; i < t->n_devices; i++)
        if (!identical_kernels(&t->devices[0], &t->devices[i]))
            return false;
    return true;
}

static const char *dev_id(const px_contract_device *d)
{
    return d->id && d->id[0] ? d->id : "(unnamed device)";
}

/* Emulated devices are marked wherever they are named (ADR 0004). */
static const char *emu(const px_contract_device *d)
{
    return d->emulated ? " (emulated)" : "";
}

/* ---- Effects ------------------------------------------------------- */

static void tensors_text(unsigned tensors, char *out, size_t n)
{
    px__fmt(out, n, "%s%s%s%s%s", (tensors & PX_TENSORS_WEIGHTS) ? "weights" : "",
            (tensors & PX_TENSORS_WEIGHTS) && (tensors & ~1u) ? "+" : "",
            (tensors & PX_TENSORS_ACTIVATIONS) ? "activations" : "",
            (tensors & PX_TENSORS_ACTIVATIONS) && (tensors & PX_TENSORS_KV) ? "+" : "",
            (tensors & PX_TENSORS_KV) ? "kv" : "");
}

/* Whether a dtype change from `from` to `to` keeps the values: only when
 * both are known and equal.  A widening conversion keeps the values but not
 * the kernels' arithmetic, so it is not treated as exact. */
static bool same_dtype(const char *from, const char *to)
{
    const char *f = px__dtype_canonical(from), *t = px__dtype_canonical(to);
    return f && t && !strcmp(f, t);
}

static px_status check_shape(const px_transform *t, px_err *err)
{
    const char *name = px_transform_kind_name(t->kind);
    if ((unsigned)t->kind >= PX_TRANSFORM_COUNT_)
        return px_err_set(err, PX_EINVAL, "unknown transformation kind %d", (int)t->kind);
    if (t->n_devices && !t->devices)
        return px_err_set(err, PX_EINVAL, "%s: n_devices is %zu but devices is NULL", name,
                          t->n_devices);
    if (t->to_dtype && !px__dtype_canonical(t->to_dtype))
        return px_err_set(err, PX_EINVAL, "%s: unknown dtype \"%.32s\"", name, t->to_dtype);
    if (t->from_dtype && !px__dtype_canonical(t->from_dtype))
        return px_err_set(err, PX_EINVAL, "%s: unknown dtype \"%.32s\"", name, t->from_dtype);
    /* A dtype on a transformation that has none would otherwise be
     * ignored, and a conversion the caller meant would go unjudged. */
    if (t->to_dtype && (t->kind == PX_TRANSFORM_ALT_KERNEL || t->kind == PX_TRANSFORM_REORDER ||
                        t->kind == PX_TRANSFORM_PLACEMENT || t->kind == PX_TRANSFORM_RECOMPUTE ||
                        t->kind == PX_TRANSFORM_FUSION))
        return px_err_set(err, PX_EINVAL,
                          "%s: to_dtype has no meaning here; describe the dtype change as a "
                          "precision or quantize transformation",
                          name);
    switch (t->kind) {
    case PX_TRANSFORM_PRECISION:
    case PX_TRANSFORM_QUANTIZE:
        if (!t->to_dtype)
            return px_err_set(err, PX_EINVAL, "%s: to_dtype is required", name);
        if (!t->tensors || (t->tensors & ~7u))
            return px_err_set(err, PX_EINVAL,
                              "%s: say which tensors change (weights, activations, kv)", name);
        break;
    case PX_TRANSFORM_PLACEMENT:
    case PX_TRANSFORM_PIPELINE_CUT:
        if (t->n_devices != 2)
            return px_err_set(err, PX_EINVAL, "%s: give exactly two devices, from and to (got %zu)",
                              name, t->n_devices);
        break;
    case PX_TRANSFORM_TENSOR_SPLIT:
        if (t->n_devices < 2)
            return px_err_set(err, PX_EINVAL, "%s: give the participating devices (at least 2)",
                              name);
        break;
    case PX_TRANSFORM_KV_OFFLOAD:
        break;
    default:
        if (t->n_devices < 1)
            return px_err_set(err, PX_EINVAL, "%s: give the device that runs it", name);
        break;
    }
    return PX_OK;
}

static void find_nondeterminism(const px_transform *t, effect *e)
{
    e->dynamic_order = t->dynamic_order;
    for (size_t i = 0; i < t->n_devices && !e->nondet_device; i++)
        if (!t->devices[i].deterministic)
            e->nondet_device = dev_id(&t->devices[i]);
}

static bool deterministic(const effect *e)
{
    return !e->nondet_device && !e->dynamic_order;
}

static void analyze(const px_transform *t, effect *e)
{
    memset(e, 0, sizeof *e);
    const px_contract_device *d = t->devices;
    char tensors[40];
    tensors_text(t->tensors, tensors, sizeof tensors);
    switch (t->kind) {
    case PX_TRANSFORM_PRECISION:
    case PX_TRANSFORM_QUANTIZE:
        px__fmt(e->what, sizeof e->what, "%s of %s %s%s%s %s",
                t->kind == PX_TRANSFORM_QUANTIZE ? "quantization" : "precision change", tensors,
                t->from_dtype ? "from " : "", t->from_dtype ? t->from_dtype : "",
                t->from_dtype ? " to" : "to", t->to_dtype);
        if (same_dtype(t->from_dtype, t->to_dtype)) {
            e->proof = PX_PROOF_NO_CHANGE;
            px__fmt(e->proof_text, sizeof e->proof_text,
                    "the dtype stays %s, so nothing is computed differently", t->to_dtype);
            return;
        }
        e->lossy = true;
        find_nondeterminism(t, e);
        return;
    case PX_TRANSFORM_ALT_KERNEL:
    case PX_TRANSFORM_FUSION:
        if (t->kind == PX_TRANSFORM_ALT_KERNEL)
            px__fmt(e->what, sizeof e->what, "alternative kernel %s%s%s", t->kernel ? "\"" : "",
                    t->kernel ? t->kernel : "(unnamed)", t->kernel ? "\"" : "");
        else
            px__fmt(e->what, sizeof e->what, "fusion%s%s%s", t->kernel ? " into \"" : "",
                    t->kernel ? t->kernel : "", t->kernel ? "\"" : "");
        e->kernel_change = true;
        find_nondeterminism(t, e);
        return;
    case PX_TRANSFORM_REORDER:
        px__fmt(e->what, sizeof e->what, "reordered reduction%s",
                t->dynamic_order ? " (order chosen at run time)" : "");
        e->reorder = true;
        find_nondeterminism(t, e);
        return;
    case PX_TRANSFORM_PLACEMENT:
        px__fmt(e->what, sizeof e->what, "move from %s%s to %s%s", dev_id(&d[0]), emu(&d[0]),
                dev_id(&d[1]), emu(&d[1]));
        find_nondeterminism(t, e);
        if (!identical_kernels(&d[0], &d[1])) {
            e->kernel_change = true;
            return;
        }
        if (deterministic(e)) {
            e->proof = PX_PROOF_IDENTICAL_KERNELS;
            px__fmt(e->proof_text, sizeof e->proof_text,
                    "identical kernels and reduction order on both sides (%s, %s), and both "
                    "are deterministic",
                    kernel_family(&d[0]), d[0].arch);
        }
        return;
    case PX_TRANSFORM_PIPELINE_CUT:
    case PX_TRANSFORM_TENSOR_SPLIT: {
        bool cut = t->kind == PX_TRANSFORM_PIPELINE_CUT;
        if (cut)
            px__fmt(e->what, sizeof e->what, "pipeline cut from %s%s to %s%s%s%s%s", dev_id(&d[0]),
                    emu(&d[0]), dev_id(&d[1]), emu(&d[1]),
                    t->to_dtype ? " (activations sent as " : "", t->to_dtype ? t->to_dtype : "",
                    t->to_dtype ? ")" : "");
        else
            px__fmt(e->what, sizeof e->what, "tensor-parallel split of the %s across %zu devices",
                    t->split == PX_SPLIT_OUTPUT ? "outputs" : "reduction", t->n_devices);
        find_nondeterminism(t, e);
        /* On the wire the activations keep their dtype unless to_dtype
         * names another one. */
        if (t->to_dtype && !same_dtype(t->from_dtype, t->to_dtype))
            e->lossy = true;
        if (!all_identical(t))
            e->kernel_change = true;
        if (!cut && t->split != PX_SPLIT_OUTPUT)
            e->reorder = true;
        if (e->lossy || e->kernel_change || e->reorder || !deterministic(e))
            return;
        e->proof = cut ? PX_PROOF_EXACT_TRANSFER : PX_PROOF_OUTPUT_SPLIT;
        if (cut)
            px__fmt(e->proof_text, sizeof e->proof_text,
                    "the cut moves activations bit-exactly (%s copy) and both sides run "
                    "identical deterministic kernels (%s, %s)",
                    t->to_dtype ? t->to_dtype : "same-dtype", kernel_family(&d[0]), d[0].arch);
        else
            px__fmt(e->proof_text, sizeof e->proof_text,
                    "each output is a whole dot product computed by identical deterministic "
                    "kernels (%s, %s); gathering the parts moves bits without arithmetic",
                    kernel_family(&d[0]), d[0].arch);
        return;
    }
    case PX_TRANSFORM_RECOMPUTE:
        px__fmt(e->what, sizeof e->what, "recomputation on %s%s", dev_id(&d[0]), emu(&d[0]));
        find_nondeterminism(t, e);
        if (!all_identical(t) && t->n_devices > 1) {
            e->kernel_change = true;
            return;
        }
        if (deterministic(e)) {
            e->proof = PX_PROOF_SAME_KERNEL_RECOMPUTE;
            px__fmt(e->proof_text, sizeof e->proof_text,
                    "recomputation with the same deterministic kernel on the same inputs is "
                    "bitwise identical");
        }
        return;
    case PX_TRANSFORM_KV_OFFLOAD:
        px__fmt(e->what, sizeof e->what, "KV-cache offload%s%s", t->to_dtype ? " to " : "",
                t->to_dtype ? t->to_dtype : "");
        /* A copy runs no arithmetic, so the devices' kernels do not enter. */
        if (!t->to_dtype || same_dtype(t->from_dtype, t->to_dtype)) {
            e->proof = PX_PROOF_EXACT_COPY;
            px__fmt(e->proof_text, sizeof e->proof_text,
                    "the KV cache moves without changing its dtype: a bit-exact copy");
            return;
        }
        e->lossy = true;
        return;
    default:
        return;
    }
}

/* ---- Equivalences -------------------------------------------------- */

static bool str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

static bool dtype_eq(const char *a, const char *b)
{
    return (!a && !b) || same_dtype(a, b);
}

static bool same_device_ids(const px_transform *a, const px_transform *b)
{
    if (a->n_devices != b->n_devices)
        return false;
    for (size_t i = 0; i < a->n_devices; i++) {
        bool found = false;
        for (size_t j = 0; j < b->n_devices && !found; j++)
            found = str_eq(a->devices[i].id, b->devices[j].id);
        if (!found)
            return false;
    }
    return true;
}

/* Finds a record for t on region; returns its evidence id or NULL. */
static px_status find_equivalence(const px_transform *t, const px__pattern *region,
                                  const px_equivalence *eqs, size_t n_eqs, const char **evidence,
                                  px_err *err)
{
    *evidence = NULL;
    for (size_t i = 0; i < n_eqs; i++) {
        const px_equivalence *q = &eqs[i];
        if (!q->evidence || !q->evidence[0])
            return px_err_set(err, PX_EINVAL,
                              "equivalence #%zu has no evidence id; a record without evidence "
                              "proves nothing",
                              i);
        if (q->transform.n_devices && !q->transform.devices)
            return px_err_set(err, PX_EINVAL, "equivalence #%zu: devices is NULL", i);
        if (q->region) {
            px__pattern p;
            char why[192];
            if (px__pattern_parse(q->region, true, &p, why, sizeof why) != PX_OK)
                return px_err_set(err, PX_EINVAL, "equivalence #%zu: region \"%.64s\" %s", i,
                                  q->region, why);
            if (!px__pattern_matches(&p, region))
                continue;
        }
        const px_transform *r = &q->transform;
        if (r->kind != t->kind || r->tensors != t->tensors || r->split != t->split ||
            !dtype_eq(r->from_dtype, t->from_dtype) || !dtype_eq(r->to_dtype, t->to_dtype) ||
            !str_eq(r->kernel, t->kernel) || !same_device_ids(r, t))
            continue;
        if (!*evidence)
            *evidence = q->evidence;
    }
    return PX_OK;
}

/* ---- Judging ------------------------------------------------------- */

typedef struct judgement {
    px_verdict verdict;
    px_contract_proof proof;
    px_contract_reason reason;
    char text[384];
} judgement;

static void forbid(judgement *j, px_contract_reason reason, const char *fmt, ...) PX_PRINTF(3, 4);
static void forbid(judgement *j, px_contract_reason reason, const char *fmt, ...)
{
    j->verdict = PX_VERDICT_FORBIDDEN;
    j->reason = reason;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->text, sizeof j->text, fmt, ap);
    va_end(ap);
}

static void judge_bitwise(const effect *e, judgement *j)
{
    if (e->lossy)
        forbid(j, PX_REASON_BITWISE_PRECISION, "%s changes bits", e->what);
    else if (e->nondet_device)
        forbid(j, PX_REASON_BITWISE_NONDETERMINISTIC,
               "%s runs on %s, whose kernels are not deterministic", e->what, e->nondet_device);
    else if (e->dynamic_order)
        forbid(j, PX_REASON_BITWISE_NONDETERMINISTIC, "%s chooses its reduction order at run time",
               e->what);
    else if (e->reorder)
        forbid(j, PX_REASON_BITWISE_REORDER,
               "%s changes the order of floating-point sums, which changes bits", e->what);
    else
        forbid(j, PX_REASON_BITWISE_KERNEL,
               "%s runs other kernels, which are not proven bit-identical", e->what);
}

static void judge_deterministic(const effect *e, bool bounded, judgement *j)
{
    if (e->nondet_device) {
        forbid(j, PX_REASON_NONDETERMINISTIC_KERNEL,
               "%s runs on %s, whose kernels are not deterministic (atomics or a split chosen at "
               "run time)",
               e->what, e->nondet_device);
        return;
    }
    if (e->dynamic_order) {
        forbid(j, PX_REASON_NONDETERMINISTIC_ORDER,
               "%s chooses its reduction order at run time, so runs differ", e->what);
        return;
    }
    /* Repeatable is not the same as agreed: a lower precision changes what
     * the model computes, and only a requirement that bounds the error
     * (tolerance, divergence, agreement, exact_logits) can admit it.  This
     * is what keeps the implied contract ("stored dtypes, deterministic")
     * from ever lowering a precision. */
    if (e->lossy && !bounded) {
        forbid(j, PX_REASON_PRECISION_UNBOUNDED,
               "%s changes what the model computes, and no requirement of the clause bounds the "
               "error",
               e->what);
        return;
    }
    j->verdict = PX_VERDICT_ALLOWED;
    j->proof = PX_PROOF_DETERMINISTIC_KERNELS;
    px__fmt(j->text, sizeof j->text,
            "%s keeps runs repeatable: every device involved runs deterministic kernels in a "
            "fixed order",
            e->what);
}

static void fill_obligation(const px_contract *c, const char *region, const px_contract_clause *cl,
                            px_contract_req req, px_obligation *o)
{
    memset(o, 0, sizeof *o);
    px_strlcpy(o->region, region, sizeof o->region);
    o->pattern = cl->pattern;
    o->req = req;
    o->reference = c->reference;
    o->prompt_set = c->prompt_set;
    o->prompts = c->prompts;
    o->tokens = c->tokens;
    char on[160];
    char check[224];
    switch (req) {
    case PX_CONTRACT_TOLERANCE:
        o->atol = cl->atol;
        o->rtol = cl->rtol;
        px__fmt(check, sizeof check,
                "every output element of the region must satisfy |x - r| <= %g + %g |r|", cl->atol,
                cl->rtol);
        break;
    case PX_CONTRACT_DIVERGENCE:
        o->threshold = cl->kl_max;
        px__fmt(check, sizeof check,
                "the KL divergence of the output distribution from the reference's must be at "
                "most %g nats at every position",
                cl->kl_max);
        break;
    case PX_CONTRACT_AGREEMENT:
        o->threshold = cl->top1_min;
        if (cl->prompt_set)
            o->prompt_set = cl->prompt_set;
        if (cl->positions)
            o->tokens = cl->positions;
        px__fmt(check, sizeof check,
                "the top-1 token must equal the reference's at no less than %g of the positions",
                cl->top1_min);
        break;
    case PX_CONTRACT_EXACT_LOGITS:
    default: {
        o->paths = cl->paths;
        o->n_paths = cl->n_paths;
        o->prompt_set = NULL;
        o->prompts = cl->n_paths;
        uint64_t tokens = 0;
        for (size_t i = 0; i < cl->n_paths; i++)
            tokens += cl->paths[i].n_tokens;
        o->tokens = tokens;
        px__fmt(check, sizeof check,
                "the final logits must equal the reference's bit for bit on each path");
        break;
    }
    }
    if (o->paths)
        px__fmt(on, sizeof on, "on the %zu listed path%s", o->n_paths, o->n_paths == 1 ? "" : "s");
    else
        px__fmt(on, sizeof on,
                "on %" PRIu64 " prompts (%" PRIu64 " token positions) of the set \"%s\"",
                o->prompts, o->tokens, o->prompt_set);
    px__fmt(o->text, sizeof o->text, "%s: run the reference \"%s\" and the candidate %s; %s",
            region, o->reference, on, check);
}

static px_status add_obligation(px_contract_decision *d, const px_obligation *o)
{
    for (size_t i = 0; i < d->n_obligations; i++)
        if (d->obligations[i].req == o->req && !strcmp(d->obligations[i].region, o->region))
            return PX_OK;
    px_obligation *grown = realloc(d->obligations, (d->n_obligations + 1) * sizeof *grown);
    if (!grown)
        return PX_ENOMEM;
    d->obligations = grown;
    d->obligations[d->n_obligations++] = *o;
    return PX_OK;
}

/* Judges one effect against one clause into d (zeroed by the caller). */
static px_status judge_clause(const px_contract *c, const char *region,
                              const px_contract_clause *cl, const effect *e, const char *evidence,
                              px_contract_decision *d, px_err *err)
{
    char clause_name[PX_CONTRACT_MAX_PATTERN + 16];
    px__fmt(clause_name, sizeof clause_name, "clause \"%s\"", cl->pattern);
    /* A recorded equivalence counts only where the devices repeat
     * themselves: one bit-identical run on a nondeterministic device says
     * nothing about the next. */
    bool exact = e->proof != PX_PROOF_NONE || (evidence && deterministic(e));
    if (exact) {
        d->verdict = PX_VERDICT_ALLOWED;
        if (e->proof != PX_PROOF_NONE) {
            d->proof = e->proof;
            px__fmt(d->message, sizeof d->message, "%s: %s keeps every bit: %s [%s]", region,
                    e->what, e->proof_text, px_contract_proof_name(e->proof));
        } else {
            d->proof = PX_PROOF_RECORDED_EQUIVALENCE;
            px__fmt(d->message, sizeof d->message,
                    "%s: %s keeps every bit: validated equivalence on record (evidence %.64s) "
                    "on deterministic devices [recorded-equivalence]",
                    region, e->what, evidence);
        }
        return PX_OK;
    }
    judgement best = {.verdict = PX_VERDICT_ALLOWED};
    bool bounded = cl->reqs & (PX_CONTRACT_TOLERANCE | PX_CONTRACT_DIVERGENCE |
                               PX_CONTRACT_AGREEMENT | PX_CONTRACT_EXACT_LOGITS);
    px_contract_req best_req = 0;
    for (int i = 0; i < PX_CONTRACT_REQ_COUNT; i++) {
        px_contract_req req = (px_contract_req)(1u << i);
        if (!(cl->reqs & req))
            continue;
        judgement j = {.verdict = PX_VERDICT_ALLOWED};
        switch (req) {
        case PX_CONTRACT_BITWISE:
            judge_bitwise(e, &j);
            break;
        case PX_CONTRACT_DETERMINISTIC:
            judge_deterministic(e, bounded, &j);
            break;
        case PX_CONTRACT_EXACT_LOGITS:
            /* Validation on the listed paths is complete evidence for
             * them, but only if the candidate repeats itself. */
            if (!deterministic(e)) {
                judge_deterministic(e, bounded, &j);
                break;
            }
            /* fall through */
        default: {
            j.verdict = PX_VERDICT_ALLOWED_AFTER_VALIDATION;
            px_obligation o;
            fill_obligation(c, region, cl, req, &o);
            if (add_obligation(d, &o) != PX_OK)
                return px_err_set(err, PX_ENOMEM, "out of memory recording obligations");
            break;
        }
        }
        if (j.verdict > best.verdict || (best_req == 0 && j.verdict == PX_VERDICT_ALLOWED)) {
            best = j;
            best_req = req;
        }
    }
    d->verdict = best.verdict;
    d->req = best.verdict == PX_VERDICT_ALLOWED ? 0 : best_req;
    switch (best.verdict) {
    case PX_VERDICT_FORBIDDEN:
        d->reason = best.reason;
        px__fmt(d->message, sizeof d->message, "%s: %s; the contract requires %s (%s) [%s]", region,
                best.text, px_contract_req_name(best_req), clause_name,
                px_contract_reason_name(best.reason));
        free(d->obligations);
        d->obligations = NULL;
        d->n_obligations = 0;
        break;
    case PX_VERDICT_ALLOWED_AFTER_VALIDATION:
        px__fmt(d->message, sizeof d->message,
                "%s: %s is allowed after validation (%s): %zu obligation%s to discharge on the "
                "composed plan",
                region, e->what, clause_name, d->n_obligations, d->n_obligations == 1 ? "" : "s");
        break;
    case PX_VERDICT_ALLOWED:
        d->proof = best.proof;
        px__fmt(d->message, sizeof d->message, "%s: %s (%s) [%s]", region, best.text, clause_name,
                px_contract_proof_name(best.proof));
        break;
    }
    return PX_OK;
}

void px_contract_decision_release(px_contract_decision *d)
{
    if (!d)
        return;
    free(d->obligations);
    memset(d, 0, sizeof *d);
}

px_status px_contract_evaluate(const px_contract *c, const char *region, const px_transform *t,
                               const px_equivalence *eqs, size_t n_eqs, px_contract_decision *out,
                               px_err *err)
{
    memset(out, 0, sizeof *out);
    if (n_eqs && !eqs)
        return px_err_set(err, PX_EINVAL, "n_eqs is %zu but eqs is NULL", n_eqs);
    px__pattern name;
    char why[192];
    if (px__pattern_parse(region, false, &name, why, sizeof why) != PX_OK)
        return px_err_set(err, PX_EINVAL, "region name \"%.64s\" %s", region ? region : "", why);
    px_status st = check_shape(t, err);
    if (st != PX_OK)
        return px_err_prefix(err, st, "%s: ", region);
    const px_contract_clause *cl;
    st = px_contract_lookup(c, region, &cl, err);
    if (st != PX_OK)
        return st;
    effect e;
    analyze(t, &e);
    const char *evidence = NULL;
    st = find_equivalence(t, &name, eqs, n_eqs, &evidence, err);
    if (st != PX_OK)
        return st;
    st = judge_clause(c, region, cl, &e, evidence, out, err);
    if (st != PX_OK)
        px_contract_decision_release(out);
    return st;
}

px_status px_contract_evaluate_all(const px_contract *c, const char *const *regions,
                                   size_t n_regions, const px_transform *ts, size_t n_ts,
                                   const px_equivalence *eqs, size_t n_eqs,
                                   px_contract_decision *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    size_t n_proven = 0;
    for (size_t r = 0; r < n_regions; r++) {
        for (size_t i = 0; i < n_ts; i++) {
            px_contract_decision one;
            px_status st = px_contract_evaluate(c, regions[r], &ts[i], eqs, n_eqs, &one, err);
            if (st != PX_OK) {
                px_contract_decision_release(out);
                return st;
            }
            if (one.verdict == PX_VERDICT_ALLOWED && n_proven++ == 0)
                out->proof = one.proof;
            if (one.verdict == PX_VERDICT_FORBIDDEN && out->verdict != PX_VERDICT_FORBIDDEN) {
                out->verdict = PX_VERDICT_FORBIDDEN;
                out->reason = one.reason;
                out->req = one.req;
                px_strlcpy(out->message, one.message, sizeof out->message);
            }
            if (one.verdict == PX_VERDICT_ALLOWED_AFTER_VALIDATION &&
                out->verdict == PX_VERDICT_ALLOWED) {
                out->verdict = PX_VERDICT_ALLOWED_AFTER_VALIDATION;
                out->req = one.req;
            }
            for (size_t k = 0; k < one.n_obligations && st == PX_OK; k++)
                st = add_obligation(out, &one.obligations[k]);
            px_contract_decision_release(&one);
            if (st != PX_OK) {
                px_contract_decision_release(out);
                return px_err_set(err, PX_ENOMEM, "out of memory combining verdicts");
            }
        }
    }
    size_t n_pairs = n_regions * n_ts;
    switch (out->verdict) {
    case PX_VERDICT_FORBIDDEN:
        /* Obligations of a forbidden plan are moot. */
        free(out->obligations);
        out->obligations = NULL;
        out->n_obligations = 0;
        out->proof = PX_PROOF_NONE;
        break;
    case PX_VERDICT_ALLOWED_AFTER_VALIDATION:
        out->proof = PX_PROOF_NONE;
        px__fmt(out->message, sizeof out->message,
                "allowed after validation: %zu of %zu transformation-region pairs proven, %zu "
                "obligation%s to discharge on the composed plan",
                n_proven, n_pairs, out->n_obligations, out->n_obligations == 1 ? "" : "s");
        break;
    case PX_VERDICT_ALLOWED:
        px__fmt(out->message, sizeof out->message,
                "allowed: all %zu transformation-region pairs keep the contract", n_pairs);
        break;
    }
    return PX_OK;
}
