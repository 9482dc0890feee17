/*
 * plexus/cost.h: the analytical cost model.
 *
 * Given a hardware graph (hw), a model (ir), a candidate placement and a
 * workload, the cost model predicts what the placement does: time per
 * output token and to the first token, throughput, memory per device
 * (itemized), energy, money and the chance of a failure, each with the
 * uncertainty its inputs carry.  The planner (plan) calls it thousands of
 * times per search, so the hot path works on flat views built once:
 *
 *   px_cost_fleet  a flat view of the hardware graph: one record per device
 *                  (memory, bandwidth, compute per dtype, power, price,
 *                  MTBF, fast-link island, class of identical devices) and
 *                  a cache of device-to-device paths;
 *   px_cost_model  a flat view of the model: per block weight bytes of the
 *                  attention and FFN regions, FLOPs per token and per
 *                  attended pair, KV bytes per token, activation bytes per
 *                  boundary; the embedding and the head.
 *
 * A candidate is a px_cost_pipeline (ordered stages; a stage is a
 * tensor-parallel device group with a contiguous layer range, embedding and
 * head flags, precision per region and a KV placement); a layout is one or
 * more pipelines (replicas) serving the same workload.
 *
 *     px_cost_params params;
 *     px_cost_params_default(&params);
 *     px_cost_fleet *fleet;
 *     px_cost_model *model;
 *     px_cost_fleet_new(graph, &params, &fleet, &err);   // graph: px_hw_graph
 *     px_cost_model_new(ir, &model, &err);               // ir: px_ir_model
 *     px_cost_workload wl = px_cost_workload_default();
 *     px_cost_pipeline p = {.n_stages = 1};
 *     p.stages[0] = px_cost_stage_make(0, model);   // every layer on device 0
 *     px_cost_estimate est;
 *     px_cost_eval_pipeline(fleet, model, &params, &wl, &p, NULL, &est);
 *     printf("%g s per token\n", est.tpot_s);
 *     px_cost_model_free(model);
 *     px_cost_fleet_free(fleet);
 *
 * Figures are sourced: they come from the inventory (with its provenance)
 * or from the defaults in px_cost_params, each of which is listed by
 * px_cost_assumptions_json so that a plan states what it rests on.  A
 * calibration overlay (`plexus.calibration/1`: measured corrections per
 * device, op class and regime that never overwrite sourced values) plugs in
 * through px_cost_params.calibration with mode PX_COST_CALIBRATED (section
 * "Calibration" below).  Either mode reproduces its figures exactly.
 *
 * Thread safety: fleets and models are read-only after construction except
 * for the fleet's path cache, so one fleet must not be shared between
 * threads that evaluate at the same time.
 */
#ifndef PLEXUS_COST_H
#define PLEXUS_COST_H

#include "plexus/base.h"
#include "plexus/hw.h"
#include "plexus/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PX_COST_MAX_TP     16 /* devices in one tensor-parallel group */
#define PX_COST_MAX_STAGES 64 /* stages in one pipeline */

/* ------------------------------------------------------------------ */
/* Parameters and assumptions                                          */
/* ------------------------------------------------------------------ */

typedef enum px_cost_mode {
    PX_COST_SOURCED = 0,    /* datasheet, discovered and assumed figures only */
    PX_COST_CALIBRATED = 1, /* plus the calibration overlay (params.calibration) */
} px_cost_mode;

/* Measured corrections: the calibration overlay (section "Calibration"). */
typedef struct px_cost_calibration px_cost_calibration;

/* Every default the model uses when the inventory is silent, with the
 * range used for uncertainty.  px_cost_params_default fills sourced values;
 * each is listed by px_cost_assumptions_json. */
typedef struct px_cost_params {
    px_cost_mode mode;
    const px_cost_calibration *calibration; /* borrowed; required in (and only in)
                                               the calibrated mode */
    double headroom;                        /* fraction of memory kept free (0.10) */
    /* Fraction of the datasheet memory bandwidth reached by memory-bound
     * decode kernels: 0.80, range 0.70..0.85 (well-tuned engines). */
    double eff_mem, eff_mem_lo, eff_mem_hi;
    /* Fraction of peak compute reached by large matrix products (prefill,
     * big batches): 0.60, range 0.45..0.75. */
    double eff_compute, eff_compute_lo, eff_compute_hi;
    /* Fraction of a link's bandwidth reached by one transfer: 0.85. */
    double eff_link;
    /* Per-device runtime footprint by backend, bytes (CUDA context ~500 MiB). */
    double runtime_cuda, runtime_emu, runtime_cpu;
    /* Workspace for kernels (scratch, cuBLAS workspace), bytes per device. */
    double workspace_gpu, workspace_cpu;
    /* Relative uncertainty assumed for a figure that states none (0.10). */
    double default_rel_unc;
    /* Figures assumed when the inventory gives none. */
    double default_power_gpu, default_power_cpu; /* W, active */
    double idle_fraction;                        /* idle power as a fraction of active (0.25) */
    double default_mtbf_s;                       /* per device */
    double host_link_bw;         /* device <-> host when no link is declared (PCIe 4 x16) */
    double host_link_latency;    /* s */
    double reliability_window_s; /* window of the failure probability (24 h) */
    uint32_t mc_samples;         /* Monte Carlo samples for finalists (256) */
    uint64_t seed;               /* Monte Carlo seed (1) */
    /* Host seconds per sequence (row) per decode step outside the stages'
     * kernels: sampling over the vocabulary, token handling, the
     * per-sequence work of the stage workers and the front end.  10 us,
     * range 3..40 us (assumed; `plexus calibrate` measures it as the step
     * class: a fixed time plus a time per row).  It is host-core work
     * beside the first stage (see host_cores_s). */
    double host_row_s, host_row_s_lo, host_row_s_hi;
} px_cost_params;

void px_cost_params_default(px_cost_params *p);
/* Checks a parameter set; PX_EINVAL names the bad field and its range, a
 * calibrated mode without an overlay or an overlay in the sourced mode. */
PX_NODISCARD px_status px_cost_params_check(const px_cost_params *p, px_err *err);

/* ------------------------------------------------------------------ */
/* The fleet view                                                      */
/* ------------------------------------------------------------------ */

/* One schedulable device.  Strings are borrowed from the hardware graph. */
typedef struct px_cost_device {
    const char *id;      /* global id, "n1.gpu0" */
    const char *model;   /* device model or catalogue id; never NULL */
    const char *backend; /* "cpu", "emu", "cuda"; never NULL */
    const char *node_id;
    px_hw_class cls;
    uint32_t hw_index; /* index in the graph's view */
    uint32_t node;     /* node index in the graph's view */
    bool emulated;
    bool all_ops;                   /* runs every standard op */
    double mem_capacity;            /* bytes of its primary memory (a CPU: its node's DDR) */
    double mem_free;                /* live free memory when reported, else capacity */
    double mem_bw;                  /* B/s, datasheet sustained */
    double mem_bw_rel;              /* relative uncertainty (half-width) */
    double peak[PX_HW_DTYPE_COUNT]; /* FLOP/s; 0: not supported */
    double peak_rel;
    double power_active, power_idle; /* W */
    double cost_rate;                /* $/h, 0 when free or unknown */
    double mtbf_s;
    double host_bw; /* B/s to its node's host memory (KV offload) */
    double host_latency;
    double host_mem;         /* bytes of its node's host memory (DDR tiers) */
    int32_t host_link;       /* hw link index of its host link, -1 when assumed */
    uint32_t island;         /* fast-link island (devices joined by NVLink-class
                                links share one); unique otherwise */
    uint32_t klass;          /* class of interchangeable devices */
    const uint32_t *domains; /* failure/power domains (hw indices), borrowed */
    size_t n_domains;
    unsigned assumed; /* PX_COST_ASSUMED_* flags: figures taken from params */
    /* Host cores its node offers to work run on them (0: the inventory
     * does not say), and the fraction of its busy time that occupies one
     * of them for memory-bound and compute-bound work: 1 for a cpu device
     * (one thread per stage worker), 1/slowdown for an emulated device
     * (the cpu kernels run, then the stretch is slept), 0 for an
     * accelerator. */
    double host_cores;
    double host_busy_mem, host_busy_compute;
} px_cost_device;

enum {
    PX_COST_ASSUMED_POWER = 1 << 0,
    PX_COST_ASSUMED_MTBF = 1 << 1,
    PX_COST_ASSUMED_BW_UNC = 1 << 2,
    PX_COST_ASSUMED_HOST_LINK = 1 << 3,
    PX_COST_ASSUMED_MEM_BW = 1 << 4,
};

/* A route between two devices, as the cost model uses it. */
typedef struct px_cost_path {
    double bw;      /* B/s, bottleneck bandwidth (INFINITY for a device to itself) */
    double bw_rel;  /* relative uncertainty of the bottleneck */
    double latency; /* s, latencies and setups along the route */
    uint32_t n_hops;
    uint32_t contention;  /* contention group of the bottleneck link, or PX_HW_NONE */
    int32_t bottleneck;   /* hw link index of the bottleneck, -1 if none */
    px_hw_link_kind kind; /* kind of the bottleneck link */
    bool assumed;         /* part of the route is an assumed host link */
    bool reachable;
} px_cost_path;

typedef struct px_cost_fleet {
    const px_hw_graph *graph; /* borrowed; must outlive the fleet */
    px_cost_device *devices;  /* one per device of the graph, in its order */
    size_t n_devices;
    size_t n_classes;
    size_t n_islands;
    bool emulated;                     /* any device is emulated */
    char digest[65];                   /* the inventory's content id */
    struct px__cost_path_cache *paths; /* private */
} px_cost_fleet;

/* Builds the view of a graph (borrowed; must outlive the fleet).  params
 * may be NULL (defaults).  Returns owned memory (px_cost_fleet_free).
 * PX_EINFEASIBLE when the graph has no device; PX_ENOMEM. */
PX_NODISCARD px_status px_cost_fleet_new(const px_hw_graph *g, const px_cost_params *params,
                                         px_cost_fleet **out, px_err *err);
void px_cost_fleet_free(px_cost_fleet *f); /* NULL is a no-op */
/* The route from device a to device b (indices into f->devices): the
 * widest path in the graph; when none is declared, the route through both
 * nodes' hosts with an assumed host link where a device has none.
 * Cached.  Unreachable pairs give reachable = false. */
px_cost_path px_cost_fleet_path(px_cost_fleet *f, uint32_t a, uint32_t b);

/* ------------------------------------------------------------------ */
/* The model view                                                      */
/* ------------------------------------------------------------------ */

typedef struct px_cost_layer {
    double attn_params, ffn_params; /* matrix values of each region */
    double attn_bytes, ffn_bytes;   /* stored bytes of each region */
    double flops_token, flops_pair, flops_seq;
    double kv_bytes_token;  /* at the model's KV dtype */
    double act_bytes_token; /* crossing the block's output */
    double expert_bytes;    /* MoE: one expert; 0 for dense */
    uint32_t n_experts, n_experts_used;
} px_cost_layer;

typedef struct px_cost_model {
    const px_ir_model *ir; /* borrowed; may be NULL for hand-built views */
    const char *name;      /* preset name, general.name or the file name */
    char id[80];           /* "preset:llama-3-8b" or "sha256:<digest of the file>" */
    px_ir_arch arch;
    bool dit;
    bool tied_head; /* the head's classifier is the embedding table */
    uint32_t n_layers;
    px_cost_layer *layers;         /* n_layers */
    px_cost_layer embedding, head; /* only params/bytes/flops/act fields used */
    px_dtype weight_dtype;         /* dtype of most matrix values as stored */
    px_dtype kv_dtype, act_dtype;
    uint32_t dim, hidden_dim, n_heads, n_kv_heads, head_dim, vocab;
    uint32_t dit_steps, dit_tokens;
    double total_params, total_bytes;
} px_cost_model;

/* Builds the view of an IR model (borrowed; must outlive the view).
 * Returns owned memory (px_cost_model_free).  PX_EINVAL for a model
 * without layers; PX_EIO when the file cannot be hashed; PX_ENOMEM. */
PX_NODISCARD px_status px_cost_model_new(const px_ir_model *ir, px_cost_model **out, px_err *err);
void px_cost_model_free(px_cost_model *m); /* NULL is a no-op */
/* Bytes of a block's attention or FFN weights if stored at dt (dt =
 * PX_DTYPE_COUNT_ keeps the stored dtype). */
double px_cost_region_bytes(const px_cost_model *m, uint32_t layer, bool ffn, px_dtype dt);
/* Bytes of the embedding or head weights at dt (PX_DTYPE_COUNT_: stored). */
double px_cost_edge_bytes(const px_cost_model *m, bool head, px_dtype dt);

/* ------------------------------------------------------------------ */
/* Candidates                                                          */
/* ------------------------------------------------------------------ */

typedef enum px_cost_kv_place {
    PX_COST_KV_DEVICE = 0, /* in the stage's device memory */
    PX_COST_KV_HOST = 1,   /* in its node's host memory, read over the host link */
} px_cost_kv_place;

const char *px_cost_kv_place_name(px_cost_kv_place k); /* "device", "host" */

/* Precision per region kind.  PX_DTYPE_COUNT_ in weights/ffn_weights
 * means "as stored". */
typedef struct px_cost_precision {
    px_dtype weights;     /* attention, embedding and head matrices */
    px_dtype ffn_weights; /* FFN (and expert) matrices */
    px_dtype activations;
    px_dtype kv;
} px_cost_precision;

typedef struct px_cost_stage {
    uint32_t devices[PX_COST_MAX_TP]; /* fleet indices; tp of them */
    uint32_t tp;                      /* tensor-parallel degree >= 1 */
    int32_t first, last;              /* blocks, inclusive; last = first - 1: none */
    bool embedding, head;
    px_cost_precision prec;
    px_cost_kv_place kv;
} px_cost_stage;

typedef struct px_cost_pipeline {
    uint32_t n_stages;
    px_cost_stage stages[PX_COST_MAX_STAGES];
} px_cost_pipeline;

/* What a run serves: per replica, `batch` sequences in flight, split into
 * micro_batches; context is the KV length planned for, prompt_tokens the
 * prefill, gen_tokens the decode steps. */
typedef struct px_cost_workload {
    uint32_t batch, micro_batches;
    uint32_t context, prompt_tokens, gen_tokens;
} px_cost_workload;

/* batch 1, one micro-batch, context 4096, prompt 512, 256 new tokens. */
px_cost_workload px_cost_workload_default(void);
/* The positions a decode step attends on average over a sequence's life:
 * its prompt and half its new tokens (prompt + (gen + 1) / 2), at most the
 * context.  Decode time is priced at it; memory at the context. */
double px_cost_attended(const px_cost_workload *wl);
/* A stage holding every block, the embedding and the head on one device,
 * at the stored precision. */
px_cost_stage px_cost_stage_make(uint32_t device, const px_cost_model *m);

/* ------------------------------------------------------------------ */
/* Estimates                                                           */
/* ------------------------------------------------------------------ */

typedef enum px_cost_bind {
    PX_COST_BIND_MEMORY_BW = 0, /* weights and KV streamed from memory */
    PX_COST_BIND_COMPUTE,
    PX_COST_BIND_ALLREDUCE, /* tensor-parallel all-reduce over links */
    PX_COST_BIND_KV_HOST,   /* KV read from host memory over its link */
    PX_COST_BIND_TRANSFER,  /* activations between stages */
    PX_COST_BIND_COUNT_
} px_cost_bind;

const char *px_cost_bind_name(px_cost_bind b);

/* Why a candidate cannot run. */
typedef enum px_cost_infeasible {
    PX_COST_OK = 0,
    PX_COST_NO_MEMORY,     /* a device lacks memory (stage, bytes over) */
    PX_COST_NO_PATH,       /* two consecutive stages are not connected */
    PX_COST_NO_CAPABILITY, /* a device lacks an op or any compute dtype */
    PX_COST_BAD_LAYOUT,    /* layers missing, overlapping or out of order */
} px_cost_infeasible;

const char *px_cost_infeasible_name(px_cost_infeasible r); /* "memory", ... */

/* Memory per device of a stage, bytes. */
typedef struct px_cost_mem {
    double weights, kv, activations, workspace, runtime;
    double total;
    double limit; /* free memory x (1 - headroom) */
} px_cost_mem;

typedef struct px_cost_stage_est {
    double decode_s; /* one decode step of the stage's micro-batch */
    /* The same step under continuous batching: the prompts of new requests
     * are prefilled in chunks mixed into decode steps, so in the steady
     * state each step also carries the prefill of batch / gen_tokens
     * sequences (serve_s: the replica's throughput) or of the other
     * batch - 1 sequences' share (serve_tpot_s: what one sequence sees).
     * Equal to decode_s for DiT. */
    double serve_s, serve_tpot_s;
    double host_core_s; /* host-core seconds one served step of the stage occupies */
    double mem_s, compute_s, allreduce_s, kv_host_s; /* its terms */
    double prefill_s;                                /* the prompt of the stage's micro-batch */
    double xfer_s;                                   /* decode activations to the next stage */
    double xfer_prefill_s;
    px_cost_bind bind;
    px_hw_dtype compute_dtype;
    bool dtype_fallback; /* the wanted compute dtype is missing; a wider one is used */
    px_cost_mem mem;     /* per device of the group (host bytes excluded) */
    double host_bytes;   /* KV kept in host memory */
    /* What one more attended position (a cache position one row of a
     * decode step attends to) adds to decode_s, by the term that binds
     * it: its KV bytes read, or its score and weighted-value FLOPs, and
     * its KV over the host link when the cache lives there.  A step's
     * attention grows with the positions its rows attend, at constant
     * rows; the healing loop expects it to (0 for DiT). */
    double attention_pos_s;
} px_cost_stage_est;

typedef struct px_cost_estimate {
    px_cost_infeasible why; /* PX_COST_OK when feasible */
    uint32_t why_stage;
    double why_bytes; /* memory: bytes over the limit */
    bool why_host;    /* memory: the node's host memory (KV of its stages), not a device's */
    /* Time per output token of one sequence while the other sequences of
     * its batch come and go (their prefill interferes). */
    double tpot_s;
    double ttft_s;        /* prefill of the prompt through the pipeline */
    double step_s;        /* one step of the whole batch, prefill interference included */
    double decode_step_s; /* the same step without the prefill of new requests */
    double throughput;    /* output tokens per second (per replica): batch / step_s */
    double power_w;       /* average power of the devices used */
    double joules_per_token;
    double usd_per_hour, usd_per_token, tokens_per_usd;
    double p_fail;     /* failure within the reliability window */
    double transfer_s; /* total inter-stage transfer per token, return_s included */
    /* The logits of a micro-batch back from the last stage to the
     * executor beside the first: the path's latency plus rows x vocab x 4
     * bytes over its bandwidth.  0 with one stage, and the latency alone
     * for DiT. */
    double return_s;
    /* The host's work per step of one micro-batch outside the stages'
     * kernels: rows x host_row_s (sourced), or the step correction's
     * fixed time plus its time per row (calibrated); in step_s, not in
     * transfer_s.  0 for DiT in the sourced mode. */
    double executor_s;
    /* Host cores shared by the stages that run on them: the most
     * host-core seconds one step asks of a node over the cores it has
     * (0 when no node declares its cores or none is asked).  A floor of
     * step_s when the stages overlap (micro-batches in flight). */
    double host_cores_s;
    uint32_t host_node; /* the node that sets host_cores_s */
    px_cost_bind bind;  /* the term that binds the decode step */
    uint32_t bind_stage;
    uint32_t n_stages;
    px_cost_stage_est stages[PX_COST_MAX_STAGES];
} px_cost_estimate;

/* Multiplicative perturbations of the inputs for one Monte Carlo sample:
 * per device memory bandwidth and compute, per hw link bandwidth, and the
 * efficiency factors.  NULL arrays mean 1.0. */
typedef struct px_cost_sample {
    const double *dev_bw, *dev_compute; /* n_devices */
    const double *link_bw;              /* per hw link (view->n_links) */
    double eff_mem, eff_compute;        /* absolute values */
    /* Calibrated mode: per correction of the overlay (in its order), a
     * multiplicative draw of its factor; NULL means 1.0. */
    const double *calib;
    double host_row_s; /* absolute; 0: params' host_row_s */
} px_cost_sample;

/* Evaluates one pipeline (borrowed) at point estimates (sample NULL) or
 * under a sample.  Never allocates.  Infeasible candidates fill est->why
 * and the terms computed so far; PX_OK is returned either way, PX_EINVAL
 * only for a malformed pipeline (no stages, tp out of range, a device
 * index out of range). */
PX_NODISCARD px_status px_cost_eval_pipeline(px_cost_fleet *f, const px_cost_model *m,
                                             const px_cost_params *p, const px_cost_workload *wl,
                                             const px_cost_pipeline *pipe, const px_cost_sample *s,
                                             px_cost_estimate *est, px_err *err);

/* Replicas on one host share its cores.  Each replica's own floor
 * (host_cores_s) counts its stages only; replica i uses use[i] =
 * host_cores_s / step_s of the cores of node[i] (PX_HW_NONE: none
 * declared).  Where the uses on one node add up past 1, every replica on
 * it slows by their sum: k[i] gets the factor (>= 1) that divides its
 * throughput and multiplies its step. */
void px_cost_host_shares(const uint32_t *node, const double *use, size_t n, double *k);

/* ------------------------------------------------------------------ */
/* Fast stage estimates for search                                     */
/* ------------------------------------------------------------------ */

/* Prefix sums over the blocks of one precision and workload, so that a
 * stage's load is O(1) to build.  Arrays have n_layers + 1 entries; entry
 * i sums blocks [0, i).  Value struct: px_cost_prefix_init /
 * px_cost_prefix_release. */
typedef struct px_cost_prefix {
    px_cost_precision prec;
    px_cost_workload wl;
    uint32_t n_layers;
    double *w_mem, *w_decode, *w_prefill, *kv_token;
    double *flops_tok, *flops_pair, *flops_seq;
    const px_cost_model *model; /* borrowed */
} px_cost_prefix;

/* Builds the sums for precision prec (borrowed) under workload wl.
 * PX_ENOMEM. */
PX_NODISCARD px_status px_cost_prefix_init(px_cost_prefix *pre, const px_cost_model *m,
                                           const px_cost_precision *prec,
                                           const px_cost_workload *wl, px_err *err);
void px_cost_prefix_release(px_cost_prefix *pre); /* NULL is a no-op */

/* The backend a device without one is planned for: "cpu" for CPUs, else
 * its vendor's stack ("cuda" for nvidia, "rocm" for amd, "metal" for apple,
 * "oneapi" for intel, "xla" for google, ...), "unknown" when the vendor is
 * unknown.  Never "cuda" for a device that is not NVIDIA's.  Static string. */
const char *px_cost_default_backend(px_hw_class cls, const char *vendor);

/* Bytes a device gives up before any weight: kernel workspace and the
 * runtime's footprint for its backend (CUDA-like context for every GPU
 * stack, the cpu's for CPUs, the emulator's for emu). */
double px_cost_device_overhead(const px_cost_params *p, const px_cost_device *d);

/* Estimates one stage alone (st borrowed; its precision must be pre's):
 * decode and prefill time, the worst device's memory, KV placement kept
 * as given.  Same formulas as px_cost_eval_pipeline, without transfers
 * between stages.  Returns the infeasibility (PX_COST_OK when it fits). */
px_cost_infeasible px_cost_stage_quick(px_cost_fleet *f, const px_cost_prefix *pre,
                                       const px_cost_params *p, const px_cost_stage *st,
                                       px_cost_stage_est *out);
/* Time of the decode activations of a stage ending at block `last` from
 * device a to device b (latency + bytes / bandwidth); INFINITY when they
 * are not connected. */
double px_cost_hop_s(px_cost_fleet *f, const px_cost_prefix *pre, const px_cost_params *p,
                     uint32_t a, uint32_t b, int32_t last);

/* ------------------------------------------------------------------ */
/* Uncertainty                                                         */
/* ------------------------------------------------------------------ */

/* A distribution summary over Monte Carlo samples: median, the pessimistic
 * 99th percentile (high for times, low for rates) and the sampled range. */
typedef struct px_cost_interval {
    double p50, p99, lo, hi;
} px_cost_interval;

typedef struct px_cost_uncertain {
    uint32_t n_samples;
    px_cost_interval tpot_s, ttft_s, throughput, joules_per_token, usd_per_token;
    uint32_t n_stages;
    px_cost_interval decode_s[PX_COST_MAX_STAGES];
    px_cost_interval prefill_s[PX_COST_MAX_STAGES];
    double p_meet_slo; /* fraction of samples meeting both limits */
} px_cost_uncertain;

/* Propagates the inputs' uncertainties through px_cost_eval_pipeline by
 * seeded Monte Carlo (params->mc_samples samples, params->seed): the same
 * inputs give identical numbers.  slo_tpot_s / slo_ttft_s (0: none) set
 * p_meet_slo.  Returns PX_EINFEASIBLE when the point estimate is
 * infeasible, PX_ENOMEM. */
PX_NODISCARD px_status px_cost_uncertainty(px_cost_fleet *f, const px_cost_model *m,
                                           const px_cost_params *p, const px_cost_workload *wl,
                                           const px_cost_pipeline *pipe, double slo_tpot_s,
                                           double slo_ttft_s, px_cost_uncertain *out, px_err *err);
/* The same over a layout of n_pipes replicas (pipes[i] serving wls[i],
 * both borrowed), every replica evaluated under each sample: per sample
 * the time per token and to the first token are the slowest replica's,
 * the throughput the sum of the replicas' and energy and money per token
 * the layout's; decode_s and prefill_s are replica 0's stages.  So the
 * intervals of time per token and throughput describe the same draws.
 * PX_EINVAL without replicas, PX_EINFEASIBLE, PX_ENOMEM. */
PX_NODISCARD px_status px_cost_uncertainty_layout(px_cost_fleet *f, const px_cost_model *m,
                                                  const px_cost_params *p,
                                                  const px_cost_workload *wls,
                                                  const px_cost_pipeline *pipes, size_t n_pipes,
                                                  double slo_tpot_s, double slo_ttft_s,
                                                  px_cost_uncertain *out, px_err *err);

/* ------------------------------------------------------------------ */
/* Lower bounds                                                        */
/* ------------------------------------------------------------------ */

typedef struct px_cost_bound {
    double tpot_s;         /* no placement on these devices decodes faster */
    double tpot_mem_s;     /* (weights + KV read) / aggregate attainable bandwidth */
    double tpot_compute_s; /* 2 x active params x batch / aggregate peak */
    double throughput;     /* no layout exceeds this many tokens/s */
    double ttft_s;         /* prefill FLOPs / aggregate peak */
} px_cost_bound;

/* The bound over the devices listed (fleet indices, borrowed; NULL: all
 * devices that can hold any part of the model).  Attainable bandwidth is
 * the datasheet figure times eff_mem_hi.  Capacity-aware: the bytes a step
 * reads are spread over the memories that can hold them, device memory
 * first and host memory over the host links past it; the throughput bound
 * is taken at the largest batch the fleet's memory (devices and hosts)
 * holds, with each request's prefill FLOPs spread over its gen_tokens. */
void px_cost_lower_bound(const px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                         const px_cost_workload *wl, const uint32_t *devices, size_t n_devices,
                         px_cost_bound *out);
/* The same, with compute at the rate of the fastest precision a plan may
 * use (NULL: every device's best dtype but int4). */
void px_cost_lower_bound_at(const px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                            const px_cost_workload *wl, const px_cost_precision *fastest,
                            const uint32_t *devices, size_t n_devices, px_cost_bound *out);
/* The bound of one pipeline as placed: each stage's bytes over its
 * attainable bandwidth (or FLOPs over peak, whichever is larger) plus each
 * hop's bytes / bandwidth + latency. */
double px_cost_pipeline_bound(px_cost_fleet *f, const px_cost_model *m, const px_cost_params *p,
                              const px_cost_workload *wl, const px_cost_pipeline *pipe);

/* ------------------------------------------------------------------ */
/* Reporting                                                           */
/* ------------------------------------------------------------------ */

/* The assumptions behind estimates on this fleet and model: every default
 * of params that was used, every inventory figure that was missing and
 * assumed, as [{"name", "value", "source"}] (new reference; NULL on
 * allocation failure). */
json_t *px_cost_assumptions_json(const px_cost_fleet *f, const px_cost_model *m,
                                 const px_cost_params *p);

/* The compute dtype a matrix product with these weights and activations
 * runs in on device d, and whether it had to fall back to a wider one
 * (the nearest supported). Q4_0, Q5_0 and k-quant weights run int8 products
 * where the device has them (quantized activations).  Returns false when the device computes in no
 * floating dtype at all. */
bool px_cost_compute_dtype(const px_cost_device *d, px_dtype weights, px_dtype acts,
                           px_hw_dtype *out, bool *fallback);

/* ------------------------------------------------------------------ */
/* Calibration                                                         */
/* ------------------------------------------------------------------ */
/*
 * A calibration overlay holds corrections learned from what was observed
 * (microbenchmarks, per-stage timings of real runs).  A correction is an
 * affine map of the sourced model's time for one op class on one device
 * (or one link kind) in one regime: observed time = offset_s + factor x
 * sourced prediction (offset_s: fixed costs per step that no datasheet
 * figure covers, such as dispatch and small elementwise ops).  Sourced figures stay as they are;
 * the calibrated mode multiplies the predicted terms by the factors that apply, and a plan lists
 * every correction with whether it was applied or refused and why (px_cost_assumptions_json).
 * Format: docs/formats/calibration.md.
 *
 *     px_cost_calibration *cal;
 *     px_cost_calibration_load("calibration.json", &cal, &err);
 *     params.mode = PX_COST_CALIBRATED;
 *     params.calibration = cal;            // borrowed by the params
 *     px_cost_eval_pipeline(fleet, model, &params, &wl, &pipe, NULL, &est, &err);
 *     px_cost_calibration_free(cal);
 *
 * Op classes and the size each one's regime is measured in:
 *   matvec     decode weight streaming (matrix-vector products and the
 *              elementwise ops of the block around them): weight bytes
 *              read per block per decode step;
 *   attention  decode attention over the KV cache: positions attended;
 *   matmul     prefill (matrix-matrix products): rows per step;
 *   copy       transfers between stages, per link kind: bytes per
 *              transfer;
 *   step       the host's work per step outside the stages' kernels (the
 *              executor's round trip, sampling and token handling per
 *              sequence), keyed by the first stage's device: logits bytes
 *              per step (px_cost_step_size, rows x vocab x 4).  Its
 *              sourced prediction is rows x host_row_s, so a correction
 *              fitted over several batch sizes is a fixed time (offset_s)
 *              plus a time per row (factor x host_row_s).  A correction
 *              fitted from samples without a sourced prediction (0, older
 *              overlays) is a fixed time: offset_s, factor 1.
 *   decode     a stage's decode step of 2 or more rows, whole (the
 *              products at that many rows, attention over their
 *              positions, the elementwise ops): rows per step.  Its
 *              sourced prediction is the stage's decode term at the point
 *              efficiencies; where a correction applies it replaces the
 *              terms composed from matvec and attention, which are fitted
 *              at one row and leave out the work that grows with the rows.
 *
 * Epistemic uncertainty: a correction is fitted by least squares (an
 * offset only where its samples span different sizes, else the mean
 * ratio), and [lo, hi] is the Student-t prediction interval of a new
 * observation at `confidence` from the spread of the samples' relative
 * residuals, factor x (1 +- t(n-k) x s x sqrt(1 + 1/n)), so few samples
 * give wide intervals (fewer than min_samples keep at least the sourced
 * uncertainty, see px_cost_calibration_fit); the Monte Carlo of
 * px_cost_uncertainty draws each applied correction from its interval in
 * place of the sourced bandwidth and efficiency of the term it corrects.
 */

#define PX_COST_CALIBRATION_SCHEMA "plexus.calibration/1"
#define PX_COST_CALIB_MAX          4096 /* corrections in one overlay */

typedef enum px_cost_op_class {
    PX_COST_CLASS_MATVEC = 0,
    PX_COST_CLASS_ATTENTION,
    PX_COST_CLASS_MATMUL,
    PX_COST_CLASS_COPY,
    PX_COST_CLASS_STEP,   /* the host's work per step (sourced: rows x host_row_s) */
    PX_COST_CLASS_DECODE, /* a stage's decode step of several rows, whole */
    PX_COST_CLASS_COUNT_
} px_cost_op_class;

/* "matvec", "attention", "matmul", "copy", "step", "decode"; "?"
 * otherwise. */
const char *px_cost_op_class_name(px_cost_op_class c);
/* PX_EINVAL listing the names for anything else. */
PX_NODISCARD px_status px_cost_op_class_parse(const char *name, px_cost_op_class *out, px_err *err);

typedef struct px_cost_correction {
    /* Inventory global id of the device ("local.emu-a"); for the copy
     * class the link kind ("loopback", "pcie4", ...); for the step class
     * the device of a pipeline's first stage. */
    char device[64];
    px_cost_op_class cls;
    px_dtype dtype;            /* weights' dtype of the regime; PX_DTYPE_COUNT_: any */
    double valid_lo, valid_hi; /* validity range of the regime's size (class unit) */
    double factor;             /* observed / sourced prediction, > 0 */
    double offset_s;           /* seconds added per step (per transfer for copy):
                                  observed = offset_s + factor x sourced */
    double lo, hi;             /* interval of the factor, lo <= factor <= hi; it
                                  scales the whole corrected term */
    double confidence;         /* level of [lo, hi], in (0, 1) */
    uint32_t n_samples;        /* >= 1 */
    char dataset[160];         /* what was observed ("microbench:emu-small x3") */
    char timestamp[32];        /* RFC 3339 UTC */
} px_cost_correction;

/* An empty overlay.  Returns owned memory (px_cost_calibration_free).
 * PX_ENOMEM. */
PX_NODISCARD px_status px_cost_calibration_new(px_cost_calibration **out, px_err *err);
void px_cost_calibration_free(px_cost_calibration *c); /* NULL is a no-op */
/* Adds a copy of c (checked as the reader checks it).  Regimes of one
 * key (device, class, dtype) are disjoint size ranges: a correction of
 * c's key keeps only what c's validity range leaves of its own (one that
 * c cuts in the middle becomes two), and one that c covers whole is
 * replaced.  PX_EINVAL naming the bad field, PX_ELIMIT past
 * PX_COST_CALIB_MAX, PX_ENOMEM. */
PX_NODISCARD px_status px_cost_calibration_add(px_cost_calibration *cal,
                                               const px_cost_correction *c, px_err *err);
size_t px_cost_calibration_count(const px_cost_calibration *cal);
/* Correction i (borrowed), NULL out of range. */
const px_cost_correction *px_cost_calibration_at(const px_cost_calibration *cal, size_t i);
/* The overlay's content id: SHA-256 of its canonical document. */
const char *px_cost_calibration_digest(const px_cost_calibration *cal);

/* Reads a `plexus.calibration/1` document (untrusted: bounded, strict:
 * unknown members, wrong types, non-finite or out-of-range numbers,
 * lo > factor > hi, an inverted validity range and duplicates are
 * refused).  name labels messages, which give the JSON pointer of the
 * problem and the fix.  Returns owned memory.  PX_EPARSE (not JSON),
 * PX_EVALIDATE, PX_ELIMIT, PX_ENOMEM. */
PX_NODISCARD px_status px_cost_calibration_parse(const char *text, size_t len, const char *name,
                                                 px_cost_calibration **out, px_err *err);
/* px_cost_calibration_parse of a file (at most 16 MiB); PX_EIO. */
PX_NODISCARD px_status px_cost_calibration_load(const char *path, px_cost_calibration **out,
                                                px_err *err);
/* The document (new reference; NULL on allocation failure). */
json_t *px_cost_calibration_to_json(const px_cost_calibration *cal);
/* Canonical text of the document, byte-identical for equal overlays; the
 * reader reads it back to an equal overlay.  Owned (free()); NULL on
 * allocation failure. */
char *px_cost_calibration_dump(const px_cost_calibration *cal);

/* Why a correction applies or not. */
typedef enum px_cost_calib_verdict {
    PX_COST_CALIB_APPLIED = 0,
    PX_COST_CALIB_NONE,         /* no correction for this device and class */
    PX_COST_CALIB_OUT_OF_RANGE, /* the size lies outside its validity range */
    PX_COST_CALIB_DTYPE,        /* it was measured for another dtype */
} px_cost_calib_verdict;

/* The correction for (device, class) at size and dtype: *index gets its
 * position in the overlay (for px_cost_sample.calib) when one applies.
 * A correction outside its validity range or for another dtype is never
 * applied.  cal may be NULL (PX_COST_CALIB_NONE).  Allocates nothing. */
px_cost_calib_verdict px_cost_calibration_lookup(const px_cost_calibration *cal, const char *device,
                                                 px_cost_op_class cls, px_dtype dtype, double size,
                                                 size_t *index);

/* The regime size of the step class for a model under a workload: the
 * logits the last stage sends the executor per decode step (rows of a
 * micro-batch x vocab x 4 bytes). */
double px_cost_step_size(const px_cost_model *m, const px_cost_workload *wl);

/* One observation for fitting: the same work timed and predicted by the
 * sourced model (px_cost_stage_terms gives the predictions; for the step
 * class px_cost_step_sourced, or 0 for a sample fitted as a fixed time). */
typedef struct px_cost_calib_sample {
    const char *device; /* borrowed; device id or link kind */
    px_cost_op_class cls;
    px_dtype dtype;     /* PX_DTYPE_COUNT_: any */
    double size;        /* the regime's size (class unit) */
    double predicted_s; /* sourced prediction, > 0 (step class: may be 0) */
    double observed_s;  /* > 0 */
} px_cost_calib_sample;

typedef struct px_cost_fit_opts {
    double confidence;  /* of the intervals; 0: 0.95 */
    double range_slack; /* validity = [min size / slack, max size x slack]; 0: 2 */
    /* With fewer samples than this (>= 1) a correction's interval is
     * widened to at least the sourced relative uncertainty below; 0: 3. */
    uint32_t min_samples;
    double sourced_rel;    /* 0: 0.5 */
    const char *dataset;   /* borrowed; copied into each correction */
    const char *timestamp; /* borrowed; NULL: now */
} px_cost_fit_opts;

/* Groups samples (borrowed) by device, class and dtype, splits each group
 * (a step group whose samples have no sourced prediction (0) is fitted
 * as a fixed time: offset_s the mean observed, factor 1 and [lo, hi] the
 * relative prediction interval around 1; step samples with and without
 * one are grouped apart)
 * into regimes where consecutive sizes differ by more than range_slack,
 * and adds one correction per regime to cal (replacing overlapping ones);
 * neighbouring regimes' validity ranges meet half way (geometrically)
 * instead of overlapping.  Samples
 * with a non-positive or non-finite time are refused (PX_EINVAL naming the
 * sample).  opts may be NULL.  PX_ENOMEM, PX_ELIMIT. */
PX_NODISCARD px_status px_cost_calibration_fit(px_cost_calibration *cal,
                                               const px_cost_calib_sample *samples, size_t n,
                                               const px_cost_fit_opts *opts, px_err *err);

/* The sourced model's terms for one stage, per op class, for fitting
 * samples and reports: decode weight streaming and KV reading (memory
 * terms at the point efficiency), decode compute, prefill, the decode
 * transfer to the next device, and each class's regime size.  Uses
 * params' sourced figures whatever its mode. */
typedef struct px_cost_stage_terms {
    double matvec_s, attention_s, compute_s, prefill_s;
    double decode_s;       /* the decode step, whole, at the point efficiencies */
    double matvec_size;    /* weight bytes read per block per decode step */
    double attention_size; /* positions attended (the workload's context) */
    double matmul_size;    /* rows of a prefill step */
    double decode_size;    /* rows of a decode step (the micro-batch) */
    px_dtype dtype;        /* weights' dtype */
} px_cost_stage_terms;

/* Terms of stage st (borrowed) on its first device under wl.  PX_EINVAL
 * for a device index out of range or a malformed stage. */
PX_NODISCARD px_status px_cost_stage_terms_of(px_cost_fleet *f, const px_cost_model *m,
                                              const px_cost_params *p, const px_cost_workload *wl,
                                              const px_cost_stage *st, px_cost_stage_terms *out,
                                              px_err *err);

/* Predicted against observed, for one quantity. */
typedef struct px_cost_calib_obs {
    char label[96];       /* "run.json stage 1 local.emu-a decode" */
    px_cost_op_class cls; /* the class it falls in (matvec for a decode step) */
    double observed_s;
    px_cost_interval before; /* sourced prediction: p50 and [lo, hi] */
    px_cost_interval after;  /* calibrated prediction */
} px_cost_calib_obs;

typedef struct px_cost_calib_summary {
    size_t n;
    double mae_before, mae_after;           /* median |predicted p50 - observed| / observed */
    double coverage_before, coverage_after; /* fraction of observations in [lo, hi] */
} px_cost_calib_summary;

/* A `plexus.run/1` report (`plexus run -o json`, or
 * px_rt_pipeline_report_json) as calibration reads it: per stage its
 * device, blocks and observed times, and the workload the run served. */
typedef struct px_cost_run_stage {
    char device[64];
    int32_t first, last; /* blocks, inclusive; last = first - 1: none */
    double decode_s;     /* observed compute per decode step */
    double prefill_s;    /* observed compute of the prefill */
    double xfer_in_s;    /* observed transfer into the stage per decode step; NAN */
} px_cost_run_stage;

typedef struct px_cost_run {
    uint32_t n_stages;
    px_cost_run_stage stages[PX_COST_MAX_STAGES];
    uint32_t n_prompts;   /* "rows_per_step" (rounded), else "results" entries, else 1 */
    double context;       /* "context": positions a decode row attends, mean; 0: derived */
    double prompt_tokens; /* prefilled, all prompts */
    double decode_tokens; /* produced by decode steps, all prompts */
    double tpot_s;        /* observed time per decode step end to end; NAN */
} px_cost_run;

/* Reads a run report (borrowed; untrusted: strict about what it uses,
 * naming the JSON pointer of a problem).  PX_EVALIDATE, PX_ELIMIT. */
PX_NODISCARD px_status px_cost_run_parse(const json_t *doc, const char *name, px_cost_run *out,
                                         px_err *err);
/* Reads a run report or a serving run's (`plexus serve --run-report`:
 * "plexus.serve-run/1", whose "runs" are run reports, at most
 * PX_COST_MAX_RUNS) into *out (owned: free()) and *n.  A serving run
 * with no runs gives *n = 0.  PX_EVALIDATE, PX_ELIMIT, PX_ENOMEM. */
#define PX_COST_MAX_RUNS 1024 /* PX_SERVE_REPORT_MAX_RUNS */
PX_NODISCARD px_status px_cost_runs_parse(const json_t *doc, const char *name, px_cost_run **out,
                                          size_t *n, px_err *err);
/* The pipeline and workload of a run on a fleet and model: each stage on
 * its device (PX_ENOTFOUND naming a device not in the fleet), at the stored
 * precision; batch = prompts (or the rows per step), prompt = prefilled
 * tokens per prompt, context = the run's "context", else the mean context
 * attended by its decode steps. */
PX_NODISCARD px_status px_cost_run_pipeline(const px_cost_run *run, px_cost_fleet *f,
                                            const px_cost_model *m, px_cost_pipeline *pipe,
                                            px_cost_workload *wl, px_err *err);
/* Samples of a run for px_cost_calibration_fit: one per stage holding
 * blocks, class matvec: the observed decode step less its attention (the
 * calibrated prediction of attention when p carries an overlay in the
 * calibrated mode and a correction applies, else the sourced one), against
 * the sourced weight-streaming term.  A run of several prompts gives none
 * (*n = 0): its steps are px_cost_run_decode_samples'.  samples needs
 * run->n_stages entries; their device strings borrow from run.  *n gets
 * the count. */
PX_NODISCARD px_status px_cost_run_samples(const px_cost_run *run, px_cost_fleet *f,
                                           const px_cost_model *m, const px_cost_params *p,
                                           px_cost_calib_sample *samples, size_t *n, px_err *err);
/* Samples of a run of 2 or more prompts for px_cost_calibration_fit: one
 * per stage holding blocks, class decode: the observed decode step whole
 * against the sourced decode term at the point efficiencies, sized by
 * the run's rows per step.  A run of one prompt gives none (*n = 0): its
 * steps are px_cost_run_samples'.  samples needs run->n_stages entries;
 * their device strings borrow from run. */
PX_NODISCARD px_status px_cost_run_decode_samples(const px_cost_run *run, px_cost_fleet *f,
                                                  const px_cost_model *m, const px_cost_params *p,
                                                  px_cost_calib_sample *samples, size_t *n,
                                                  px_err *err);
/* The step-class sample of a run (see px_cost_run_samples): its time per
 * token end to end less every stage's observed decode time and every
 * observed hop between stages, keyed by the first stage's device, with
 * no sourced prediction (0: fitted as a fixed time).  *has
 * is false (no error) when the run did not observe its time per token or
 * a hop between stages, or when what is left is not positive.  The
 * device string borrows from run.  PX_ENOTFOUND for a device not in the
 * fleet. */
PX_NODISCARD px_status px_cost_run_step_sample(const px_cost_run *run, px_cost_fleet *f,
                                               const px_cost_model *m, px_cost_calib_sample *sample,
                                               bool *has, px_err *err);
/* The sourced prediction of the step class for a model under a
 * workload: rows of a micro-batch x p->host_row_s (0 for DiT). */
double px_cost_step_sourced(const px_cost_model *m, const px_cost_workload *wl,
                            const px_cost_params *p);
/* The step-class sample of a run served at any batch: its time per token
 * end to end less every stage's decode time as p predicts it (the
 * overlay's corrections of the other classes applied in the calibrated
 * mode) and every observed hop between stages, against the sourced
 * prediction px_cost_step_sourced, so that runs at several batch sizes fit
 * a fixed time plus a time per row.  *has is false (no error) when the
 * run did not observe its time per token or a hop, or when what is left
 * is not positive.  The device string borrows from run.  PX_ENOTFOUND for
 * a device not in the fleet, PX_ENOMEM. */
PX_NODISCARD px_status px_cost_run_host_sample(const px_cost_run *run, px_cost_fleet *f,
                                               const px_cost_model *m, const px_cost_params *p,
                                               px_cost_calib_sample *sample, bool *has,
                                               px_err *err);
/* Predicted against observed for each stage of a run holding blocks: the
 * decode time per step, sourced (p in the sourced mode) and calibrated
 * (cal), each with its Monte Carlo interval [lo, hi].  obs needs
 * run->n_stages entries; labels start with name.  *n gets the count.
 * end_to_end (may be NULL) gets the time per token of the whole pipeline
 * (transfers included) when the run observed it: *has_e2e (may be NULL)
 * says whether. */
PX_NODISCARD px_status px_cost_run_check(const px_cost_run *run, const char *name, px_cost_fleet *f,
                                         const px_cost_model *m, const px_cost_params *p,
                                         const px_cost_calibration *cal, px_cost_calib_obs *obs,
                                         size_t *n, px_cost_calib_obs *end_to_end, bool *has_e2e,
                                         px_err *err);

/* Summarizes observations (borrowed) and, when out is not NULL, appends a
 * table: one line per observation, before and after, whether it lies
 * inside each interval, then the medians and coverage.  PX_ENOMEM. */
PX_NODISCARD px_status px_cost_calib_report(const px_cost_calib_obs *obs, size_t n,
                                            px_cost_calib_summary *sum, px_strbuf *out);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_COST_H */
