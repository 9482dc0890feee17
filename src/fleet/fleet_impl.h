/*
 * Private declarations of the fleet module's server side: the scheduler's
 * data structures, the store interface and the server's shared state.
 * The agent and client side keep theirs in agent_impl.h.
 */
#ifndef PX_FLEET_IMPL_H
#define PX_FLEET_IMPL_H

#include "base/common.h"
#include "plexus/fleet.h"

#include <pthread.h>

/* ------------------------------------------------------------------ */
/* Versions                                                            */
/* ------------------------------------------------------------------ */

/* A parsed version: up to 8 release numbers, then an ordering key for
 * pre-releases (a < b < rc < final < post). */
typedef struct px__version {
    int64_t rel[8];
    int n_rel;
    int pre_kind; /* -3 dev, -2 a, -1 b/rc... 0 final, 1 post */
    int64_t pre_num;
    bool numeric; /* false: not a PEP 440 version (compared as text) */
} px__version;

bool px__version_parse(const char *text, px__version *out);
int px__version_cmp(const px__version *a, const px__version *b);

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
    int refs; /* the owner's plus one per explanation */
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

px_status px__sched_alloc_add(px_fleet_sched *s, size_t node, const char *owner, int rank,
                              double cpus, double memory, uint64_t devices);

/* ------------------------------------------------------------------ */
/* Store                                                               */
/* ------------------------------------------------------------------ */

/* A job row.  Strings are owned by the row (px__job_row_release). */
typedef struct px__job_row {
    char *id;
    int64_t seq;
    char *name;
    char *state;
    int attempt;
    int restarts;
    char *spec;    /* JSON text */
    char *members; /* JSON array text */
    char *result;  /* JSON text or NULL */
    char *error;
    char *plan;               /* JSON text or NULL */
    int exit_code;            /* INT_MIN when none */
    int64_t created, updated; /* Unix seconds */
    double not_before;        /* Unix seconds (fractions), 0 none */
} px__job_row;

void px__job_row_release(px__job_row *r);

typedef struct px__log_chunk {
    int64_t seq;
    char *stream;
    int rank, attempt;
    char *data;
    size_t len;
} px__log_chunk;

typedef struct px__artifact_row {
    char *job, *name, *sha256;
    int64_t size;
    int rank, attempt;
    int64_t created;
} px__artifact_row;

typedef void (*px__job_cb)(const px__job_row *row, void *ud);
typedef void (*px__node_cb)(const char *name, const char *reg_json, const char *state,
                            int64_t last_seen, void *ud);
typedef void (*px__token_cb)(const char *kind, const char *name, const char *sha256_hex, void *ud);
typedef void (*px__log_cb)(const px__log_chunk *c, void *ud);
typedef void (*px__artifact_cb)(const px__artifact_row *a, void *ud);

/* The store behind the server: a table of operations so that another
 * database (PostgreSQL for several servers) can follow.  Version 1; slots
 * are only ever added at the end.  Every write is durable when it returns
 * PX_OK. */
typedef struct px__store_ops {
    int version;
    void (*close)(void *self);
    px_status (*clear_tokens)(void *self, px_err *err);
    px_status (*put_token)(void *self, const char *kind, const char *name, const char *sha256_hex,
                           px_err *err);
    px_status (*list_tokens)(void *self, px__token_cb cb, void *ud, px_err *err);
    px_status (*put_node)(void *self, const char *name, const char *reg_json, const char *state,
                          int64_t last_seen, px_err *err);
    px_status (*list_nodes)(void *self, px__node_cb cb, void *ud, px_err *err);
    /* Inserts a job with the next sequence number; fills row->seq and
     * row->id ("j-000001") when id is NULL. */
    px_status (*insert_job)(void *self, px__job_row *row, px_err *err);
    /* Writes the job's row, its members rows and (when attempt_reason is
     * not NULL) an attempts row, in one transaction. */
    px_status (*update_job)(void *self, const px__job_row *row, const char *attempt_reason,
                            px_err *err);
    px_status (*get_job)(void *self, const char *id, px__job_row *out, px_err *err);
    /* Jobs in a state ("" any, "active" queued/assigned/running), newest
     * first, at most limit. */
    px_status (*list_jobs)(void *self, const char *state, int limit, px__job_cb cb, void *ud,
                           px_err *err);
    px_status (*append_log)(void *self, const char *job, int attempt, int rank, const char *stream,
                            const void *data, size_t len, int64_t *seq, px_err *err);
    /* Chunks with seq > after, at most max_bytes of data (at least one). */
    px_status (*read_logs)(void *self, const char *job, int64_t after, const char *stream,
                           size_t max_bytes, px__log_cb cb, void *ud, px_err *err);
    px_status (*put_artifact)(void *self, const px__artifact_row *a, px_err *err);
    px_status (*list_artifacts)(void *self, const char *job, px__artifact_cb cb, void *ud,
                                px_err *err);
    px_status (*put_explanation)(void *self, const char *job, int attempt, const char *json,
                                 px_err *err);
    /* *out is owned (free()); PX_ENOTFOUND when none. */
    px_status (*get_explanation)(void *self, const char *job, char **out, px_err *err);
    /* Records a node's last live report (the server writes one every
     * 30 s per node at most). */
    px_status (*put_heartbeat)(void *self, const char *node, int64_t at, const char *live_json,
                               px_err *err);
} px__store_ops;

typedef struct px__store {
    const px__store_ops *ops;
    void *self;
} px__store;

/* Opens DATA/fleet.db (created and migrated as needed). */
px_status px__store_sqlite_open(const char *path, px__store *out, px_err *err);
/* The schema version a freshly migrated database has. */
int px__store_sqlite_schema_version(void);

/* ------------------------------------------------------------------ */
/* Server state                                                        */
/* ------------------------------------------------------------------ */

typedef enum px__job_state {
    PX__JOB_QUEUED = 0,
    PX__JOB_ASSIGNED,
    PX__JOB_RUNNING,
    PX__JOB_SUCCEEDED,
    PX__JOB_FAILED,
    PX__JOB_CANCELLED,
} px__job_state;

const char *px__job_state_name(px__job_state s);
bool px__job_state_parse(const char *text, px__job_state *out);

typedef enum px__member_state {
    PX__MEM_PENDING = 0, /* assigned, not yet fetched or started */
    PX__MEM_RUNNING,
    PX__MEM_EXITED,
} px__member_state;

typedef struct px__member {
    int node; /* scheduler node index, -1 none */
    json_t *devices;
    px__member_state state;
    int exit_code;
    int64_t started, finished;
} px__member;

/* A job that has not ended, kept in memory; ended jobs live in the store. */
typedef struct px__job {
    px__job_row row; /* as stored */
    px__job_state state;
    px_fleet_request *req;
    px__member *members;
    int n_members;
    int master_port;
    double not_before_ns; /* monotonic; 0 none */
    bool explained_this_attempt;
    json_t *explain;      /* latest explanation, full JSON; NULL before the first */
    struct px__job *next; /* in the active list, oldest first */
} px__job;

typedef struct px__token {
    px_digest hash;
    bool agent;
} px__token;

typedef struct px__metrics {
    uint64_t submitted, decisions, placements, requeues;
    uint64_t http_by_class[6]; /* 1xx..5xx by first digit */
    uint64_t http_hist[16];    /* cumulative buckets, see api_metrics.c */
    double http_sum;
    uint64_t http_count;
    uint64_t pass_hist[16];
    double pass_sum;
    uint64_t pass_count;
} px__metrics;

struct px_fleet_server {
    px_fleet_server_options opt;
    char *data_dir;
    char url[96];
    uint16_t port;
    px__store store;
    px_fleet_sched *sched;
    double *last_seen_ns;  /* per scheduler node; monotonic */
    double *hb_written_ns; /* per node: when its heartbeat was last stored */
    size_t cap_last_seen;
    px__job *jobs; /* active jobs, oldest first */
    px__token *tokens;
    size_t n_tokens;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* any job or log change: wakes long polls */
    pthread_cond_t kick;    /* wakes the scheduler thread */
    pthread_t sched_thread;
    bool sched_thread_started;
    bool stopping;
    bool dirty; /* something may now be placeable */
    uint64_t log_epoch;
    px__metrics metrics;
    void *daemon; /* struct MHD_Daemon */
};

/* server_jobs.c: state transitions.  All take the server lock held. */
px__job *px__srv_find_job(px_fleet_server *srv, const char *id);
px_status px__srv_submit(px_fleet_server *srv, json_t *spec, px__job **out, px_err *err);
void px__srv_schedule_pass(px_fleet_server *srv);
void px__srv_check_leases(px_fleet_server *srv);
/* Requeues work a re-registering agent no longer runs (running: its list). */
void px__srv_reconcile_node(px_fleet_server *srv, size_t node, const json_t *running);
px_status px__srv_cancel(px_fleet_server *srv, const char *id, px_err *err);
/* Reports from agents; PX_ESTATE for a stale attempt. */
px_status px__srv_member_start(px_fleet_server *srv, px__job *job, int attempt, int rank, int node,
                               px_err *err);
px_status px__srv_member_finish(px_fleet_server *srv, px__job *job, int attempt, int rank, int node,
                                int exit_code, int sig, const json_t *result, const char *error,
                                px_err *err);
px_status px__srv_load(px_fleet_server *srv, px_err *err);
/* server_plan.c: the plan for a plan "auto" job, or why there is none
 * ({"status": "planned", "plan": ...} or {"status": "planner unavailable",
 * "detail": ...}); new reference. */
json_t *px__srv_plan(px_fleet_server *srv, const px__job *job);
void px__srv_free_jobs(px_fleet_server *srv);
json_t *px__srv_job_json(px_fleet_server *srv, const px__job_row *row, const px__job *live,
                         bool detail);
json_t *px__srv_node_json(px_fleet_server *srv, size_t i);
json_t *px__srv_assignment_json(px_fleet_server *srv, px__job *job, int rank);
void px__srv_touch_node(px_fleet_server *srv, size_t node);

/* One HTTP request as the handlers see it (api_http.c fills it). */
typedef struct px__api_req {
    px_fleet_server *srv;
    void *conn; /* struct MHD_Connection */
    const char *method;
    const char *url;
    const char *body;
    size_t body_len;
} px__api_req;

/* The reply a handler fills: a memory body (owned) or a file. */
typedef struct px__api_resp {
    int status;
    char *body;
    size_t len;
    const char *ctype;
    int fd; /* >= 0: send len bytes of this file (closed afterwards) */
} px__api_resp;

/* Query argument, or NULL. */
const char *px__api_query(const px__api_req *rq, const char *key);
/* Sets a JSON reply (steals v). */
void px__api_json(px__api_resp *rs, int status, json_t *v);
/* Sets {"error": message}. */
void px__api_error(px__api_resp *rs, int status, const char *fmt, ...) PX_PRINTF(3, 4);
/* Maps a px_status to an HTTP status and sets the error reply. */
void px__api_fail(px__api_resp *rs, const px_err *err);
/* Parses the body as a JSON object under the API's limits; on failure
 * sets a 400 reply and returns NULL. */
json_t *px__api_body_json(const px__api_req *rq, px__api_resp *rs);
/* api_user.c / api_agent.c: route a request, server lock held. */
bool px__api_user_route(px__api_req *rq, px__api_resp *rs);
bool px__api_agent_route(px__api_req *rq, px__api_resp *rs);

/* api_files.c */
px_status px__artifact_name_check(const char *name, size_t len, px_err *err);
px_status px__artifact_open(const char *data_dir, const char *job, const char *name, bool create,
                            int *out_fd, px_err *err);
px_status px__write_all(int fd, const void *data, size_t len, px_err *err);
px_status px__blob_path(const char *data_dir, const char *hex, char *out, size_t n, px_err *err);
px_status px__open_read(const char *path, int *fd, size_t *size, px_err *err);
/* Waits on srv->changed until the deadline (monotonic ns); false when it
 * passed or the server is stopping. */
bool px__srv_wait(px_fleet_server *srv, uint64_t deadline_ns);

/* api_http.c */
px_status px__api_start(px_fleet_server *srv, const char *host, uint16_t port, px_err *err);
void px__api_stop(px_fleet_server *srv);
/* api_metrics.c */
char *px__metrics_render(px_fleet_server *srv);
void px__metrics_observe(uint64_t *hist, double *sum, uint64_t *count, double seconds);

/* server_core.c */
px_status px__srv_write_job(px_fleet_server *srv, px__job *job, const char *attempt_reason,
                            px_err *err);

#endif
