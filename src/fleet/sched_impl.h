/*
 * Private declarations of the fleet scheduler: nodes, their devices and
 * frameworks, allocations, the requests placed on them, and the scores
 * and rejections that explain a placement.
 */
#ifndef PX_FLEET_SCHED_IMPL_H
#define PX_FLEET_SCHED_IMPL_H

#include "base/common.h"
#include "plexus/fleet.h"

/* ------------------------------------------------------------------ */
/* Scheduler                                                           */
/* ------------------------------------------------------------------ */

#define PX__SCHED_MAX_DEVICES    64
#define PX__SCHED_MAX_FRAMEWORKS 16
#define PX__SCHED_TOP            5
#define PX__SCHED_MAX_REJECTED   100
/* Fleets up to this many nodes have every feasible node scored. */
#define PX__SCHED_SCORE_ALL 1000

/* Why a node does not fit, in the order they are reported. */
typedef enum px__reason {
    PX__R_OFFLINE = 0,
    PX__R_DRAINING,
    PX__R_FRAMEWORK,
    PX__R_FRAMEWORK_VERSION,
    PX__R_VENDOR,
    PX__R_CAPABILITY,
    PX__R_GPU_MEMORY,
    PX__R_GPUS,
    PX__R_CPUS,
    PX__R_MEMORY,
    PX__R_COUNT_
} px__reason;

const char *px__reason_name(px__reason r);

typedef struct px__sched_device {
    char *id;
    char *vendor;
    char *model;
    char *capability;
    bool gpu;         /* class gpu/npu/tpu: an accelerator handed out whole */
    double mem_total; /* bytes; 0 unknown */
    double mem_free;  /* live; < 0 unknown */
    double utilization;
    int vendor_ordinal; /* index among the node's devices of this vendor */
} px__sched_device;

typedef struct px__sched_framework {
    char *name;
    char *version;
} px__sched_framework;

/* Nodes with the same devices and frameworks share a class, so static
 * requirements are checked once per class, not once per node. */
typedef struct px__sched_class {
    uint64_t hash;
    char *signature;
} px__sched_class;

typedef struct px__sched_alloc {
    char *owner; /* job id */
    int rank;
    double cpus;
    double memory;
    uint64_t devices; /* bit i: device i */
} px__sched_alloc;

typedef struct px__sched_node {
    /* Hot: read for every node on every decision; kept in one cache line. */
    px_fleet_node_state state;
    uint32_t class_id;
    double cpus, memory;           /* totals offered */
    double cpus_used, memory_used; /* allocated */
    double mem_free_live;          /* < 0 unknown */
    double load;                   /* 0..1 (or more when overloaded) */
    uint64_t busy;                 /* devices allocated */
    /* Whether any device reported live free memory, and the least such;
     * without live figures the scheduler reads capacities from the
     * class's first node, which stays in cache. */
    bool has_live_dev;
    double min_dev_free;
    px_digest *resident; /* sorted */
    size_t n_resident;
    /* Cold: read for feasible nodes, explanations and bookkeeping. */
    char *name;
    char *address;
    bool emulated;
    px__sched_device *devs;
    int n_devs;
    px__sched_framework *fws;
    int n_fws;
    double *link_bw; /* n_devs x n_devs, 0 when no link; NULL without links */
    px__sched_alloc *allocs;
    size_t n_allocs, cap_allocs;
} px__sched_node;

struct px_fleet_sched {
    px__sched_node *nodes;
    size_t n_nodes, cap_nodes;
    px__sched_class *classes;
    size_t n_classes, cap_classes;
    /* Open-addressing name index: slots hold node index + 1. */
    uint32_t *name_slots;
    size_t n_slots;
    double fastest_link;  /* over the fleet, for the topology term */
    uint32_t score_limit; /* 0: PX__SCHED_SCORE_ALL */
    uint32_t rr;          /* where the next scoring window starts */
    /* Owner index: which nodes hold allocations of a job, so a release
     * does not walk the whole fleet.  Open addressing on the owner's
     * 64-bit hash (0 empty, 1 deleted). */
    struct px__owner_slot *owners;
    size_t n_owner_slots, n_owner_used;
    /* Scratch reused between placements (the hot path allocates only the
     * explanation). */
    void *class_verdict; /* per class: its static verdict (sched_place.c) */
    size_t cap_class_scratch;
    struct px__scored *scratch;
    size_t cap_scratch;
};

/* Requirements of a compiled request, counted in explanations. */
typedef enum px__req_kind {
    PX__Q_STATE = 0, /* online and not draining */
    PX__Q_CPUS,
    PX__Q_MEMORY,
    PX__Q_VENDOR,
    PX__Q_CAPABILITY,
    PX__Q_GPUS,
    PX__Q_FRAMEWORK0, /* then one per framework requirement */
} px__req_kind;

typedef struct px__fw_req {
    char *name;
    char *spec; /* "" when any version */
    char *text; /* as written */
} px__fw_req;

struct px_fleet_request {
    json_t *spec; /* normalized copy */
    double cpus, memory;
    int gpus;
    double gpu_memory;
    char *vendor;     /* NULL: any */
    char *capability; /* NULL: any */
    px__fw_req fws[PX__SCHED_MAX_FRAMEWORKS];
    int n_fws;
    px_digest inputs[8]; /* model and inputs, for locality */
    int n_inputs;
    int members;
    bool service;
    bool plan_auto;
    int max_attempts;
    double time_limit_s; /* 0: none */
    int refs;            /* the owner's plus one per explanation */
};

typedef struct px__scored {
    uint32_t node;
    float score, headroom, locality, load, topology;
    uint64_t devices;
} px__scored;

typedef struct px__rejected {
    uint32_t node;
    uint8_t reason;
    uint8_t fw; /* framework requirement index for framework reasons */
    float have, need;
} px__rejected;

struct px_fleet_explanation {
    px_fleet_request *req; /* a reference (px_fleet_request_free drops it) */
    bool placed;
    uint32_t n_considered;
    uint32_t req_meeting[PX__Q_FRAMEWORK0 + PX__SCHED_MAX_FRAMEWORKS];
    uint32_t reason_count[PX__R_COUNT_];
    px__rejected *rejected;
    uint32_t n_rejected, n_rejected_total;
    px__scored top[PX__SCHED_TOP];
    uint32_t n_top, n_feasible, n_scored;
    px__scored *members; /* one per member when placed */
    uint32_t n_members;
};

typedef struct px__owner_slot {
    uint64_t hash;
    uint32_t *nodes;
    uint32_t n, cap;
} px__owner_slot;

/* Whether the node reports the model d resident in its cache. */
bool px__sched_node_resident(const px__sched_node *n, const px_digest *d);

px_status px__sched_alloc_add(px_fleet_sched *s, size_t node, const char *owner, int rank,
                              double cpus, double memory, uint64_t devices);

#endif
