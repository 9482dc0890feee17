/*
 * plexus/contract.h: numerical contracts and their obligations.
 *
 * A contract (`plexus.contract/1`, JSON, docs/formats/contract.md) says, per
 * region of a model, what a run must preserve relative to a named reference
 * execution: the same bits (`bitwise`), the same bits on every run
 * (`deterministic`), elementwise error bounds (`tolerance`), a bound on the
 * KL divergence of the output distribution (`divergence`), a top-1
 * agreement floor (`agreement`), or exact logits on listed token paths
 * (`exact_logits`).  A `default` clause covers every region not listed.
 *
 * The planner, the self-healing loop and the runtime ask the contract one
 * question: may this transformation (lower a precision, quantize, swap a
 * kernel, reorder a reduction, cut a pipeline, split a tensor, recompute,
 * move the KV cache, fuse) be applied to this region on these devices?  The
 * answer is ALLOWED with the name of the proof rule that keeps the
 * requirement, ALLOWED_AFTER_VALIDATION with the obligation to discharge
 * empirically, or FORBIDDEN with a machine-readable reason.  Nothing that
 * could change bits is ever ALLOWED under a bitwise clause.
 *
 *     px_contract *c;
 *     px_diags diags;
 *     px_diags_init(&diags);
 *     if (px_contract_load_file("mixed.json", &diags, &c, &err) != PX_OK) {
 *         char *report = px_diags_format(&diags, "mixed.json");
 *         ...
 *     }
 *     px_contract_device gpu = {.id = "n1.gpu0", .backend = "cuda",
 *                               .vendor = "nvidia", .arch = "sm_90",
 *                               .deterministic = true};
 *     px_transform t = {.kind = PX_TRANSFORM_QUANTIZE,
 *                       .tensors = PX_TENSORS_WEIGHTS, .to_dtype = "q4_0",
 *                       .devices = &gpu, .n_devices = 1};
 *     px_contract_decision d;
 *     px_contract_evaluate(c, "layer.3.ffn", &t, NULL, 0, &d, &err);
 *     // d.verdict, d.message, d.obligations[...]
 *     px_contract_decision_release(&d);
 *     px_contract_free(c);
 *
 * A px_contract is immutable once built: any number of threads may read one
 * contract at the same time.
 */
#ifndef PLEXUS_CONTRACT_H
#define PLEXUS_CONTRACT_H

#include "plexus/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PX_CONTRACT_SCHEMA "plexus.contract/1"

/* Bounds on untrusted contracts.  Larger inputs are refused with a
 * diagnostic that names the limit. */
#define PX_CONTRACT_MAX_BYTES       ((size_t)1 << 20) /* whole document */
#define PX_CONTRACT_MAX_REGIONS     1024              /* entries under "regions" */
#define PX_CONTRACT_MAX_PATTERN     128               /* bytes in a region pattern */
#define PX_CONTRACT_MAX_SEGMENTS    16                /* dot-separated parts of a pattern */
#define PX_CONTRACT_MAX_RANGE       1000000           /* largest bound of a range segment */
#define PX_CONTRACT_MAX_ID          128               /* name, reference, prompt set, ... */
#define PX_CONTRACT_MAX_TEXT        4096              /* description */
#define PX_CONTRACT_MAX_PATHS       256               /* exact_logits paths per clause */
#define PX_CONTRACT_MAX_PATH_TOKENS 4096              /* token ids per path */

/* ------------------------------------------------------------------ */
/* Clauses                                                             */
/* ------------------------------------------------------------------ */

/* Requirement kinds; a clause holds a set of them (flags). */
typedef enum px_contract_req {
    PX_CONTRACT_BITWISE = 1 << 0,       /* bit-identical to the reference */
    PX_CONTRACT_DETERMINISTIC = 1 << 1, /* same inputs + seed -> same bits */
    PX_CONTRACT_TOLERANCE = 1 << 2,     /* |x - r| <= atol + rtol * |r| */
    PX_CONTRACT_DIVERGENCE = 1 << 3,    /* KL(reference || candidate) <= kl_max */
    PX_CONTRACT_AGREEMENT = 1 << 4,     /* top-1 agreement >= top1_min */
    PX_CONTRACT_EXACT_LOGITS = 1 << 5,  /* exact logits on listed paths */
} px_contract_req;

#define PX_CONTRACT_REQ_COUNT 6

/* Returns the format's name of one requirement flag ("bitwise", ...), or
 * "unknown". */
const char *px_contract_req_name(px_contract_req req);

/* A path whose logits must equal the reference's: either a named prompt
 * (prompt != NULL) or an inline prefix of token ids. */
typedef struct px_contract_path {
    const char *prompt;
    const int32_t *tokens;
    size_t n_tokens;
} px_contract_path;

/* The requirements that hold for a region.  Every pointer is borrowed from
 * the contract and lives as long as it does. */
typedef struct px_contract_clause {
    const char *pattern; /* the entry that applies: "layer.*.ffn", or "default" */
    unsigned reqs;       /* px_contract_req flags; never 0 */
    /* bitwise: the reference to match (the contract's unless the clause
     * names another). */
    const char *reference;
    /* deterministic: an optional fixed seed. */
    bool has_seed;
    uint64_t seed;
    /* tolerance */
    double atol, rtol;
    /* divergence, in nats */
    double kl_max;
    /* agreement: the floor, and what it is measured over: a named prompt
     * set (NULL: the contract's validation set) or a number of positions
     * (0: the contract's validation budget). */
    double top1_min;
    const char *prompt_set;
    uint64_t positions;
    /* exact_logits */
    const px_contract_path *paths;
    size_t n_paths;
} px_contract_clause;

/* ------------------------------------------------------------------ */
/* Contracts                                                           */
/* ------------------------------------------------------------------ */

typedef struct px_contract px_contract;

/* Builds a contract from JSON text.  name is used in messages (a file name;
 * NULL means "contract").  Every problem is added to diags (which may be
 * NULL) with a JSON pointer and a fix; the first one is also put in err.
 * On success *out is owned by the caller (px_contract_free).
 * Returns PX_OK, PX_EPARSE (not JSON), PX_ELIMIT (too large),
 * PX_EVALIDATE (any error diagnostic; *out is then NULL) or PX_ENOMEM.
 * Warnings alone do not fail. */
PX_NODISCARD px_status px_contract_parse(const char *text, size_t len, const char *name,
                                         px_diags *diags, px_contract **out, px_err *err);
/* Like px_contract_parse, for a document already parsed (borrowed; for
 * contracts embedded in plans or requests).  The document should have been
 * parsed with limits. */
PX_NODISCARD px_status px_contract_from_json(const json_t *doc, const char *name, px_diags *diags,
                                             px_contract **out, px_err *err);
/* Reads a file of at most PX_CONTRACT_MAX_BYTES and parses it.  Also
 * PX_ENOTFOUND and PX_EIO. */
PX_NODISCARD px_status px_contract_load_file(const char *path, px_diags *diags, px_contract **out,
                                             px_err *err);
/* Loads a built-in contract by name: "strict" (bitwise everywhere),
 * "deterministic" (repeatable runs) or "relaxed" (lower precision and
 * quantization once validated).  The built-ins are compiled in; the files
 * data/contracts/<name>.json hold the same text.  Returns PX_ENOTFOUND
 * for other names. */
PX_NODISCARD px_status px_contract_builtin(const char *name, px_contract **out, px_err *err);
/* The built-in names, NULL-terminated (static). */
const char *const *px_contract_builtin_names(void);
/* Loads `spec` as a file when one exists at that path, else as a built-in
 * name.  The error for neither says both were tried. */
PX_NODISCARD px_status px_contract_load(const char *spec, px_diags *diags, px_contract **out,
                                        px_err *err);
/* Frees the contract.  NULL is a no-op.  Clauses and strings borrowed
 * from it become invalid. */
void px_contract_free(px_contract *c);

/* Accessors; the strings are borrowed from the contract.  name and
 * description are NULL when absent. */
const char *px_contract_name(const px_contract *c);
const char *px_contract_description(const px_contract *c);
const char *px_contract_reference(const px_contract *c);

/* The validation budget: what an empirical validation may use. */
typedef struct px_contract_budget {
    const char *prompt_set; /* borrowed */
    uint64_t prompts;       /* prompts to run */
    uint64_t tokens;        /* token positions to compare, in all */
} px_contract_budget;
px_contract_budget px_contract_get_budget(const px_contract *c);

/* Number of entries under "regions", and the i-th entry's pattern and
 * clause in canonical (sorted) order; the default is separate. */
size_t px_contract_region_count(const px_contract *c);
const px_contract_clause *px_contract_region_at(const px_contract *c, size_t i);
const px_contract_clause *px_contract_default(const px_contract *c);

/* Returns the canonical JSON form (a new reference): keys sorted, every
 * default written out, numbers normalised, so that equal contracts give
 * equal documents.  NULL on allocation failure. */
json_t *px_contract_to_json(const px_contract *c);
/* The canonical text of px_contract_to_json (owned, free()).  Byte-identical
 * for equal contracts; parsing it gives an equal contract.  NULL on
 * allocation failure. */
char *px_contract_export(const px_contract *c);
/* SHA-256 of the canonical form, the contract's content id.  Returns
 * PX_ENOMEM when the canonical form cannot be built. */
PX_NODISCARD px_status px_contract_digest(const px_contract *c, char out[65]);

/* The clause in one line of words ("tolerance atol 1e-05 rtol 0.0001;
 * deterministic").  Returns owned memory (free()), NULL on allocation
 * failure. */
char *px_contract_clause_text(const px_contract_clause *clause);

/* Resolves a region name to its effective clause: the most specific entry
 * that matches (an exact name beats a range, a range beats a `*`), or the
 * default.  *out is borrowed from the contract.  Returns PX_EINVAL for a
 * name that is not a valid region name (empty, too long, bad characters). */
PX_NODISCARD px_status px_contract_lookup(const px_contract *c, const char *region,
                                          const px_contract_clause **out, px_err *err);

/* Checks the contract against the regions a model actually has (from the
 * IR; borrowed): an exact entry naming no region is an error, a pattern
 * matching none is a warning, every region must resolve to one clause.
 * Diagnostics point into the contract ("/regions/layer.9.ffn").
 * Returns PX_OK, PX_EVALIDATE (an error was found) or PX_ENOMEM. */
PX_NODISCARD px_status px_contract_check_regions(const px_contract *c, const char *const *names,
                                                 size_t n_names, px_diags *diags, px_err *err);

/* ------------------------------------------------------------------ */
/* Transformations and devices                                         */
/* ------------------------------------------------------------------ */

/* What a device contributes to a verdict.  The planner fills these from the
 * hardware graph.  Strings are borrowed. */
typedef struct px_contract_device {
    const char *id;      /* "n1.gpu0" */
    const char *backend; /* "cpu", "emu", "cuda", ...; emu runs the cpu kernels */
    const char *vendor;  /* "nvidia", "amd", "intel", ... (informational) */
    /* Kernel-relevant architecture ("sm_90", "x86_64-avx2").  Two devices
     * run identical kernels only when backends (emu counting as cpu) and
     * arch are both known and equal. */
    const char *arch;
    /* Its kernels give the same bits for the same inputs on every run: no
     * atomics-based reductions, no split chosen at run time.  False (the
     * zero value) is the safe assumption. */
    bool deterministic;
    bool emulated; /* an emu device (reported, never hidden) */
} px_contract_device;

typedef enum px_transform_kind {
    PX_TRANSFORM_PRECISION = 0, /* change the dtype of weights/activations/KV */
    PX_TRANSFORM_QUANTIZE,      /* quantize to a block or integer format */
    PX_TRANSFORM_ALT_KERNEL,    /* another implementation of the same op */
    PX_TRANSFORM_REORDER,       /* another reduction order (threads, tiling) */
    PX_TRANSFORM_PLACEMENT,     /* move the region from devices[0] to devices[1] */
    PX_TRANSFORM_PIPELINE_CUT,  /* cut before the region: activations cross a link */
    PX_TRANSFORM_TENSOR_SPLIT,  /* tensor-parallel split inside the region */
    PX_TRANSFORM_RECOMPUTE,     /* recompute instead of keeping a result */
    PX_TRANSFORM_KV_OFFLOAD,    /* move or page the KV cache to another tier */
    PX_TRANSFORM_FUSION,        /* fuse ops into one kernel */
    PX_TRANSFORM_COUNT_
} px_transform_kind;

/* The format's name ("precision", "alt-kernel", "pipeline-cut", ...), or
 * "unknown". */
const char *px_transform_kind_name(px_transform_kind kind);
/* Parses a name back; returns PX_ENOTFOUND for unknown names. */
PX_NODISCARD px_status px_transform_kind_parse(const char *name, px_transform_kind *out);

/* Which tensors a precision change or quantization touches (flags). */
enum {
    PX_TENSORS_WEIGHTS = 1 << 0,
    PX_TENSORS_ACTIVATIONS = 1 << 1,
    PX_TENSORS_KV = 1 << 2,
};

/* Which dimension a tensor-parallel split cuts.  Unspecified is treated as
 * a split of the reduction, the case that changes bits. */
typedef enum px_split_dim {
    PX_SPLIT_UNSPECIFIED = 0,
    PX_SPLIT_OUTPUT,    /* each device computes whole dot products for some outputs */
    PX_SPLIT_REDUCTION, /* each device sums part of every dot product; all-reduce */
} px_split_dim;

/* One transformation and the devices involved.  Strings and the device
 * array are borrowed.  Zero values are the conservative choice. */
typedef struct px_transform {
    px_transform_kind kind;
    unsigned tensors; /* precision, quantize: PX_TENSORS_* (required) */
    /* dtype before ("f32"; NULL: unknown, so a change is assumed) and after
     * ("f16", "bf16", "fp8_e4m3", "q8_0", "q4_0", "q4_k", "int8", ...).
     * For a pipeline cut or tensor split, to_dtype is the dtype on the wire
     * (NULL: unchanged); for a KV offload the dtype at the destination
     * (NULL: unchanged). */
    const char *from_dtype;
    const char *to_dtype;
    const char *kernel; /* alt-kernel, fusion: the implementation's name */
    px_split_dim split; /* tensor-split */
    bool dynamic_order; /* the order is chosen at run time (work stealing,
                           runtime split-K, a thread count that varies) */
    /* placement, pipeline-cut: {from, to}; tensor-split: the participants
     * (at least 2); kv-offload: any number; others: where it runs (>= 1). */
    const px_contract_device *devices;
    size_t n_devices;
} px_transform;

/* Whether dtype is one the module knows ("f32", "f16", "bf16", "fp8_e4m3",
 * "fp8_e5m2", "fp8" (= fp8_e4m3), "int8", "int4", "q8_0", "q4_0", "q4_1",
 * "q5_0", "q5_1", "q2_k".."q8_k", "f64"). */
bool px_contract_dtype_known(const char *dtype);

/* A previously validated equivalence: the transformation (kind, dtypes,
 * kernel, split and the ids of its devices) was shown bit-identical to the
 * reference on the region pattern `region` (NULL: any region), with the
 * evidence `evidence` (a trace id or report digest; required).  All
 * borrowed.  It lets a transformation through a bitwise clause, but only on
 * devices whose kernels are deterministic. */
typedef struct px_equivalence {
    px_transform transform;
    const char *region;
    const char *evidence;
} px_equivalence;

/* Parses a command-line transformation spec
 * "KIND[:ARG][,targets=weights+activations+kv][,from=DTYPE][,order=dynamic]"
 * (ARG: the dtype for precision, quantize, kv-offload and the wire dtype
 * of pipeline-cut; the kernel for alt-kernel and fusion; output|reduction
 * for tensor-split).  spec is modified in place and out borrows from it;
 * devices are left empty.  Returns PX_EINVAL with a message naming the bad
 * part. */
PX_NODISCARD px_status px_transform_parse(char *spec, px_transform *out, px_err *err);
/* Parses "ID[,backend=B][,vendor=V][,arch=A][,deterministic][,emulated]"
 * in place (out borrows from spec).  Returns PX_EINVAL on bad input. */
PX_NODISCARD px_status px_contract_device_parse(char *spec, px_contract_device *out, px_err *err);

/* ------------------------------------------------------------------ */
/* Verdicts                                                            */
/* ------------------------------------------------------------------ */

/* Ordered from least to most restrictive: combining takes the maximum. */
typedef enum px_verdict {
    PX_VERDICT_ALLOWED = 0,
    PX_VERDICT_ALLOWED_AFTER_VALIDATION = 1,
    PX_VERDICT_FORBIDDEN = 2,
} px_verdict;

/* "allowed", "allowed-after-validation", "forbidden". */
const char *px_verdict_name(px_verdict v);

/* The rule that proves a transformation keeps the requirement. */
typedef enum px_contract_proof {
    PX_PROOF_NONE = 0,
    PX_PROOF_NO_CHANGE,             /* the dtype before and after are the same */
    PX_PROOF_IDENTICAL_KERNELS,     /* identical deterministic kernels on both sides */
    PX_PROOF_EXACT_TRANSFER,        /* pipeline cut: same-dtype copy, identical kernels */
    PX_PROOF_OUTPUT_SPLIT,          /* split of independent outputs, identical kernels */
    PX_PROOF_SAME_KERNEL_RECOMPUTE, /* the same deterministic kernel recomputes */
    PX_PROOF_EXACT_COPY,            /* KV cache moved without changing its dtype */
    PX_PROOF_RECORDED_EQUIVALENCE,  /* a validated equivalence record */
    PX_PROOF_DETERMINISTIC_KERNELS, /* deterministic kernels, fixed order (not bitwise) */
    PX_PROOF_COUNT_
} px_contract_proof;

/* "no-change", "identical-kernels", ... */
const char *px_contract_proof_name(px_contract_proof p);

/* Why a transformation is forbidden (machine-readable). */
typedef enum px_contract_reason {
    PX_REASON_NONE = 0,
    PX_REASON_BITWISE_PRECISION,        /* "bitwise-precision" */
    PX_REASON_BITWISE_KERNEL,           /* "bitwise-kernel" */
    PX_REASON_BITWISE_REORDER,          /* "bitwise-reorder" */
    PX_REASON_BITWISE_NONDETERMINISTIC, /* "bitwise-nondeterministic" */
    PX_REASON_NONDETERMINISTIC_KERNEL,  /* "nondeterministic-kernel" */
    PX_REASON_NONDETERMINISTIC_ORDER,   /* "nondeterministic-order" */
    /* "precision-unbounded": a dtype changes under a clause with no
     * requirement that bounds the error (deterministic alone). */
    PX_REASON_PRECISION_UNBOUNDED,
    PX_REASON_COUNT_
} px_contract_reason;

const char *px_contract_reason_name(px_contract_reason r);

/* What an empirical validation must show before a transformation may be
 * used.  Strings are borrowed from the contract, except region. */
typedef struct px_obligation {
    char region[PX_CONTRACT_MAX_PATTERN + 1]; /* the region name asked about */
    const char *pattern;                      /* the clause's entry */
    px_contract_req req;                      /* TOLERANCE, DIVERGENCE, AGREEMENT or EXACT_LOGITS */
    double atol, rtol;                        /* tolerance */
    double threshold;                         /* kl_max (nats) or top1_min */
    const char *reference;                    /* run this as the reference */
    const char *prompt_set;                   /* on this prompt set */
    uint64_t prompts, tokens;                 /* using this many prompts / token positions */
    const px_contract_path *paths;            /* exact_logits: on these paths */
    size_t n_paths;
    char text[384]; /* the obligation in words */
} px_obligation;

/* The answer for one transformation, or for a list combined.  Value struct:
 * fill with px_contract_evaluate*, free with px_contract_decision_release. */
typedef struct px_contract_decision {
    px_verdict verdict;
    px_contract_proof proof;    /* ALLOWED: the rule (or the first, combined) */
    px_contract_reason reason;  /* FORBIDDEN: why */
    px_contract_req req;        /* the requirement that decided (0 when ALLOWED) */
    char message[512];          /* the proof, the reason or a summary, in words */
    px_obligation *obligations; /* owned; ALLOWED_AFTER_VALIDATION only */
    size_t n_obligations;
} px_contract_decision;

/* Frees d's obligations and zeroes it.  NULL is a no-op. */
void px_contract_decision_release(px_contract_decision *d);

/* Judges one transformation applied to one region (a name from the IR,
 * borrowed) against the region's effective clause.  Every requirement of
 * the clause is judged and the most restrictive verdict wins; obligations
 * accumulate.  eqs (borrowed, may be NULL when n_eqs is 0) are the
 * validated equivalences on record.  *out is filled on PX_OK (release it);
 * a FORBIDDEN verdict is PX_OK too.  Returns PX_EINVAL for a malformed
 * transformation (unknown dtype, missing devices, bad region name, an
 * equivalence without evidence) or PX_ENOMEM. */
PX_NODISCARD px_status px_contract_evaluate(const px_contract *c, const char *region,
                                            const px_transform *t, const px_equivalence *eqs,
                                            size_t n_eqs, px_contract_decision *out, px_err *err);

/* Judges every transformation on every region (both lists borrowed) and
 * combines: the most restrictive verdict wins, the first forbidding pair
 * is reported, and obligations are merged to one per region and
 * requirement, since they are discharged on the whole composed plan.
 * Same status codes as px_contract_evaluate. */
PX_NODISCARD px_status px_contract_evaluate_all(const px_contract *c, const char *const *regions,
                                                size_t n_regions, const px_transform *ts,
                                                size_t n_ts, const px_equivalence *eqs,
                                                size_t n_eqs, px_contract_decision *out,
                                                px_err *err);

/* The decision as JSON (new reference; NULL on allocation failure):
 * {"verdict", "proof"?, "reason"?, "requirement"?, "message",
 *  "obligations": [{"region", "clause", "requirement", "metric", ...}]}. */
json_t *px_contract_decision_to_json(const px_contract_decision *d);

/* ------------------------------------------------------------------ */
/* Evidence                                                            */
/* ------------------------------------------------------------------ */

/* What a validation run measured.  `measured` says which fields hold
 * values (px_contract_req flags: BITWISE -> bitwise_equal, DETERMINISTIC ->
 * replay_equal, TOLERANCE -> max_abs_err and max_rel_err (and tol_ratio
 * when not NAN), DIVERGENCE -> kl, AGREEMENT -> top1, EXACT_LOGITS ->
 * exact_logits_equal).  A requirement whose evidence is missing fails. */
typedef struct px_contract_evidence {
    unsigned measured;
    bool bitwise_equal;      /* outputs equal the reference bit for bit */
    bool replay_equal;       /* two runs with the same seed gave the same bits */
    double max_abs_err;      /* max |x - r| */
    double max_rel_err;      /* max |x - r| / |r| (infinite where r = 0 and x != r) */
    double tol_ratio;        /* max |x - r| / (atol + rtol |r|), or NAN */
    double kl;               /* worst per-position KL, nats */
    double top1;             /* fraction of positions whose top-1 matched */
    bool exact_logits_equal; /* logits equal on every listed path */
    uint64_t positions;      /* positions compared (0: not stated) */
} px_contract_evidence;

/* Fills the TOLERANCE fields of ev from a candidate x and a reference r of
 * n floats each (borrowed) under the bounds atol and rtol.  A NaN anywhere
 * in x where r is not NaN counts as an infinite error. */
void px_contract_measure_tolerance(const float *x, const float *r, size_t n, double atol,
                                   double rtol, px_contract_evidence *ev);

/* One requirement's result. */
typedef struct px_contract_check_item {
    px_contract_req req;
    bool pass;
    bool measured; /* false: the evidence lacked the metric (then pass is false) */
    double value;  /* the measured value */
    double bound;  /* the clause's bound */
    /* How far inside the bound (> 0 passes, < 0 fails), in the metric's
     * unit: kl_max - kl, top1 - top1_min, 1 - ratio for tolerance; 0 for
     * the bit-equality requirements. */
    double margin;
    char text[192];
} px_contract_check_item;

typedef struct px_contract_check {
    bool pass; /* every item passed */
    size_t n_items;
    px_contract_check_item items[PX_CONTRACT_REQ_COUNT];
} px_contract_check;

/* Checks measured evidence (borrowed) against a clause (borrowed): one item
 * per requirement of the clause, with pass/fail and the margin.  NaN
 * measurements fail.  Never fails itself. */
void px_contract_check_evidence(const px_contract_clause *clause, const px_contract_evidence *ev,
                                px_contract_check *out);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_CONTRACT_H */
