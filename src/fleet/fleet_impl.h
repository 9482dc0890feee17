/*
 * Private declarations of the fleet module's server side: the server's
 * shared state and the calls between its files (the scheduler's data
 * structures are in sched_impl.h, the store's interface in store_impl.h).
 * The agent and client side keep theirs in agent_impl.h.
 */
#ifndef PX_FLEET_IMPL_H
#define PX_FLEET_IMPL_H

#include "base/common.h"
#include "fleet/sched_impl.h"
#include "fleet/store_impl.h"
#include "plexus/fleet.h"
#include "plexus/rt.h"

#include <pthread.h>
#include <stdatomic.h>

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

/* Names of users and nodes: [A-Za-z0-9_.@-], 1 to 64 characters. */
#define PX__NAME_MAX 64

/* Who made a request, as authentication found it. */
typedef enum px__who_kind {
    PX__WHO_NONE = 0,
    PX__WHO_JOIN, /* the join token: may only join a new node */
    PX__WHO_USER, /* a user (role user or admin) */
    PX__WHO_NODE, /* a node, by the credential it made at join */
} px__who_kind;

typedef struct px__who {
    px__who_kind kind;
    bool admin; /* users: the admin role */
    bool fresh; /* nodes: a rotated credential used for the first time */
    px_digest hash;
    char name[PX__NAME_MAX + 1]; /* user or node name */
} px__who;

/* One accepted secret, known by its SHA-256. */
typedef struct px__principal {
    px_digest hash;
    px__who_kind kind;
    bool admin;
    bool pending; /* a node's rotated credential, not yet used */
    char name[PX__NAME_MAX + 1];
} px__principal;

typedef struct px__member {
    int node; /* scheduler node index, -1 none */
    json_t *devices;
    px__member_state state;
    int exit_code;
    int64_t started, finished;
    /* The number of the agent's running list from which it lists this
     * member (its start report's "listed"); 0 when unknown (an agent that
     * does not number its lists, or a server restarted since). */
    int64_t listed;
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
    double time_limit_s;    /* effective limit of one attempt; 0 none */
    int64_t log_bytes;      /* output stored, against the log quota */
    int64_t artifact_bytes; /* artifacts stored, against the artifact quota */
    bool log_truncated;     /* the quota was reached and the log says so */
    bool store_failed;      /* the last write of this job failed: retried on the tick */
    /* Placed by a pass whose commit is in flight with the server lock
     * released (server_pass.c): shown queued, with no member placed, until
     * the commit lands; a transition that meets it waits for that
     * (px__srv_find_job_settled). */
    bool committing;
    /* A cancel met it committing: the pass ends it as soon as the commit
     * landed, before any agent can be sent it. */
    bool cancel_on_commit;
    json_t *explain;      /* latest explanation, full JSON; NULL before the first */
    struct px__job *next; /* in the active list, oldest first */
    /* Monotonic: when this attempt entered this replica's queue (accepted,
     * claimed, loaded or requeued), and when its assignment was written;
     * for the submit-to-start figures of /metrics. */
    uint64_t queued_ns, assigned_ns;
} px__job;

typedef struct px__metrics {
    uint64_t submitted, decisions, placements, requeues;
    uint64_t notifications, claimed; /* jobs other replicas accepted */
    uint64_t agent_calls_stored;     /* agents' calls a replica that does not schedule stored */
    uint64_t poll_reads;       /* a standby's reads of waiting polls' assignments (one per tick) */
    uint64_t commit_waits;     /* transitions that waited for a pass's commit in flight */
    uint64_t http_by_class[6]; /* 1xx..5xx by first digit */
    uint64_t http_hist[16];    /* cumulative buckets, see api_metrics.c */
    double http_sum;
    uint64_t http_count;
    uint64_t pass_hist[16];
    double pass_sum;
    uint64_t pass_count;
    /* Submit-to-start in two parts: in the queue until the assignment is
     * written (the server's), then until every member reported its start
     * (the agents': the long poll's answer, the process's start, the
     * report). */
    uint64_t queue_hist[16];
    double queue_sum;
    uint64_t queue_count;
    uint64_t dispatch_hist[16];
    double dispatch_sum;
    uint64_t dispatch_count;
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
    /* Accepted secrets; read by every request before its body, so under
     * their own lock (taken after `lock` when both are held). */
    px__principal *principals;
    size_t n_principals, cap_principals;
    pthread_rwlock_t auth_lock;
    json_t *revoked; /* object used as a set: node names an admin revoked */
    json_t *rotate;  /* object used as a set: nodes asked to rotate their credential */
    char *tmp_dir;   /* DATA/tmp: uploads in flight */
    bool tls;
    void *conns; /* the connection table of api_http.c */
    pthread_mutex_t lock;
    pthread_cond_t changed; /* any job or log change: wakes long polls */
    pthread_cond_t kick;    /* wakes the scheduler thread */
    pthread_t sched_thread;
    bool sched_thread_started;
    bool stopping;
    bool dirty; /* something may now be placeable */
    /* Replicas on a shared store: whether this one holds the scheduler
     * lease and serves (read without the lock by the HTTP front), and why
     * it stopped serving for good (lost the lease: it must be restarted). */
    atomic_bool active;
    char failed[640];
    uint64_t lease_checked_ns;
    /* Jobs other replicas accepted: the listener thread (store slot
     * wait_jobs) sets claim_due on their notification; `listening` while it
     * is connected, so that the tick need not ask the database each time. */
    pthread_t listen_thread;
    bool listen_thread_started;
    bool claim_due;
    bool listening;
    uint64_t claimed_ns;
    /* Agents through other replicas (server_node_calls.c): whether this
     * replica follows their calls, the highest node change applied, when
     * changes were last read, and a standby's copy of the scheduler's
     * URL. */
    bool node_calls_on;
    int64_t node_mark;
    uint64_t node_read_ns;
    char holder_url[256];
    uint64_t holder_read_ns;
    /* A scheduling pass on a store that writes many at once: its
     * assignments and explanations, written together at its end
     * (server_pass.c). */
    struct px__deferred *deferred;
    size_t n_deferred, cap_deferred;
    bool defer;
    uint64_t log_epoch;
    px__metrics metrics;
    void *daemon;          /* struct MHD_Daemon */
    json_t *incidents;     /* ui_incidents.c: node-loss incidents, oldest first */
    json_t *deploy_models; /* server_deploy.c: node -> models of its deployments; NULL: stale */
    /* server_deploy_records.c: deployment -> {"observations": seq,
     * "incidents": seq}, the latest stored since the server started. */
    json_t *deploy_reported;
    int incident_seq;
    /* server_stages.c: stage workers of deployments ordered from agents,
     * and each node's assignments polls (a node without one is lost). */
    struct px__stage_order *stage_orders;
    struct px__stage_poll *stage_polls;
    uint64_t stage_seq;
    /* The server's address as the agents reach it (the local end of their
     * polls), where the last stage of a front end connects back. */
    char stage_host[48];
    /* server_serving.c: the serving front end of each deployment. */
    struct px__serving *serving;
    /* server_deploy.c: each node's recent cache evictions (node -> array). */
    json_t *evictions;
    pthread_t serving_thread;
    bool serving_thread_started;
    /* server_collect.c: artifacts' bytes and files no row names (the
     * bytes by the scheduling replica, store slot collect_artifact_data). */
    pthread_t collect_thread;
    bool collect_thread_started;
    /* api_agent_standby.c: the waiting assignments polls of a standby,
     * served by one read per tick for all of them. */
    struct px__poll_board {
        json_t *waiting;  /* node -> number of its polls waiting */
        json_t *found;    /* node -> its assignments at the last read */
        char error[256];  /* why the last read failed ("" when it did not) */
        uint64_t read_ns; /* when the last read began */
        uint64_t epoch;   /* reads done */
        bool reading;     /* a poll is reading (without the server lock) */
    } polls;
};

/* ---- server_stages.c: stage workers on agents (server lock held unless
 * said otherwise) ---- */

typedef struct px__stage_order px__stage_order;
typedef struct px__fleet_launcher px__fleet_launcher;
/* A launcher (px_rt_launcher) whose workers run on the agents of the
 * nodes holding their devices (inventory: the fleet's plexus.inventory/1
 * document, borrowed).  Its calls take the server lock themselves. */
px_status px__fleet_launcher_new(px_fleet_server *srv, const char *deployment, const char *digest,
                                 const json_t *inventory, px__fleet_launcher **out, px_err *err);
const px_rt_launcher *px__fleet_launcher_iface(px__fleet_launcher *l);
void px__fleet_launcher_free(px__fleet_launcher *l);
/* Queues an order to start stage `stage` of deployment on node (argv:
 * the worker's command line, borrowed; the secret as hex).  NULL when out
 * of memory. */
px__stage_order *px__srv_stages_queue(px_fleet_server *srv, const char *node,
                                      const char *deployment, const char *digest, uint32_t stage,
                                      json_t *argv, const char *secret_hex);
/* Orders for node's agent (start and stop), marked sent; new reference. */
json_t *px__srv_stages_for(px_fleet_server *srv, const char *node);
/* Whether node has orders not yet sent. */
bool px__srv_stages_pending(px_fleet_server *srv, const char *node);
/* Whether node runs stage workers (its polls are then watched, every
 * PX__WATCH_SLICE_NS, for the agent's connection closing). */
bool px__srv_stages_watch(px_fleet_server *srv, const char *node);
#define PX__WATCH_SLICE_NS 25000000ull
/* An assignments poll of node opened or ended. */
void px__srv_stages_poll(px_fleet_server *srv, const char *node, bool open);
/* Whether the peer closed the connection fd (no lock needed). */
bool px__srv_stages_conn_closed(int fd);
/* Every worker of node is taken as killed (its agent is gone). */
void px__srv_stages_node_lost(px_fleet_server *srv, const char *node, const char *why);
/* The agent's reports on its stage workers (borrowed array). */
void px__srv_stages_report(px_fleet_server *srv, const char *node, const json_t *reports);
/* [{"stage", "node", "state", "address", "detail"}] of a deployment. */
json_t *px__srv_stages_json(px_fleet_server *srv, const char *deployment);
void px__srv_stages_free(px_fleet_server *srv);

/* server_jobs.c: state transitions.  All take the server lock held.
 * Each one writes the new state to the store before it changes anything
 * in memory or answers: a write that fails leaves the job as it was and
 * returns the store's error (the caller answers 503 and the agent or the
 * tick retries), so nothing is acknowledged that is not on disk. */
px__job *px__srv_find_job(px_fleet_server *srv, const char *id);
/* px__srv_find_job for a transition: while the job is held by a pass's
 * commit in flight (committing), waits for it to land or be undone (the
 * server lock released meanwhile), then looks the job up again by its id.
 * NULL when it is not active.  Never called by the scheduler thread, which
 * commits. */
px__job *px__srv_find_job_settled(px_fleet_server *srv, const char *id);
/* Submits spec for `owner` (a user name; NULL for none) with an optional
 * idempotency key.  *replay is set when the key named an earlier job with
 * the same spec (*out_row then holds that job's row, owned). */
px_status px__srv_submit(px_fleet_server *srv, json_t *spec, const char *owner,
                         const char *idem_key, px__job_row *out_row, bool *replay, px_err *err);
void px__srv_schedule_pass(px_fleet_server *srv);
/* Lost nodes, their work requeued; writes that failed before, retried;
 * jobs past their time limit, failed. */
void px__srv_check_leases(px_fleet_server *srv);
/* Requeues work a re-registering agent no longer runs (running: its list;
 * seq < 0: every running member of the node counts).  With seq >= 0, a
 * heartbeat's list numbered seq: only members the agent lists from a
 * number at most seq (px__member.listed) count, so that a list taken
 * before a member started never loses it. */
px_status px__srv_reconcile_node(px_fleet_server *srv, size_t node, const json_t *running,
                                 int64_t seq, px_err *err);
/* Requeues (or fails) every active job with a member on node, at once. */
px_status px__srv_evict_node(px_fleet_server *srv, size_t node, const char *reason, px_err *err);
px_status px__srv_cancel(px_fleet_server *srv, const char *id, px_err *err);
/* The pieces the transitions share (server_jobs.c, server_pass.c,
 * server_leases.c). */
px__job *px__srv_job_new(px_fleet_server *srv, px__job_row *row, px_fleet_request *req);
void px__srv_append_job(px_fleet_server *srv, px__job *job);
void px__srv_reset_members(px__job *job);
void px__srv_free_job(px__job *job);
/* The job's members as they are, as stored (a new JSON array). */
json_t *px__srv_members_json(px_fleet_server *srv, const px__job *job);
/* What each member waiting to start is to run (null for the others), as
 * JSON text, where the store serves agents through every replica; else
 * NULL.  Owned. */
char *px__srv_assignments_text(px_fleet_server *srv, px__job *job);
/* Queues the job again with the next attempt (after delay_s). */
px_status px__srv_requeue(px_fleet_server *srv, px__job *job, double delay_s, const char *reason,
                          px_err *err);
/* Ends the job in a terminal state and drops it from the active list (the
 * job must not be touched after PX_OK). */
px_status px__srv_finish(px_fleet_server *srv, px__job *job, px__job_state state, int exit_code,
                         const char *error, px_err *err);
/* Whether (attempt, rank) of the job is current and assigned to node:
 * PX_ESTATE (stale), PX_EINVAL (no such rank), PX_EAUTH (another node's). */
px_status px__srv_check_member(px__job *job, int attempt, int rank, int node, px_err *err);
/* Reports from agents; PX_ESTATE for a stale attempt. */
px_status px__srv_member_start(px_fleet_server *srv, px__job *job, int attempt, int rank, int node,
                               px_err *err);
px_status px__srv_member_finish(px_fleet_server *srv, px__job *job, int attempt, int rank, int node,
                                int exit_code, int sig, const json_t *result, const char *error,
                                px_err *err);
px_status px__srv_load(px_fleet_server *srv, px_err *err);
/* server_plan.c: the plan for a plan "auto" job, or why there is none
 * ({"status": "planned", "plan": ...} or {"status": "planner unavailable",
 * "detail": ...}); new reference.  Called with the server lock held, it
 * releases the lock while the model is fetched and the planner runs, and
 * takes it again before it returns: the caller must look up again
 * whatever it holds of the server's memory (job may be gone by then). */
json_t *px__srv_plan(px_fleet_server *srv, const px__job *job);
/* The same for a model blob (SHA-256 hex) with a request's "objective"
 * (a name) and "contract" (a built-in name or a document) from spec (may
 * be NULL: the defaults).  With spec, a plan also carries "report" (the
 * text `plexus plan` prints) and "assignment" (per replica and stage: the
 * node, its devices and layers) and "residency" (warm nodes preferred);
 * the server lock is released as for px__srv_plan.  New reference. */
json_t *px__srv_plan_model(px_fleet_server *srv, const char *digest, const json_t *spec);
/* For tests: called (when not NULL) by the thread that plans, with the
 * server lock released, as each plan begins.  Set it before the server
 * starts and clear it after it stops. */
extern void (*px__srv_plan_hook)(px_fleet_server *srv);
/* For tests: called (when not NULL) by the scheduler thread with the
 * server lock released, once a pass's assignments are marked committing
 * and before their fenced commit is sent.  Set it before the server starts
 * and clear it after it stops. */
extern void (*px__srv_commit_hook)(px_fleet_server *srv);
void px__srv_free_jobs(px_fleet_server *srv);
/* The job's JSON; with detail, the spec too, its "env" values replaced
 * by "(hidden)" unless `viewer` is the job's owner. */
json_t *px__srv_job_json(px_fleet_server *srv, const px__job_row *row, const px__job *live,
                         bool detail, const px__who *viewer);
json_t *px__srv_node_json(px_fleet_server *srv, size_t i);
json_t *px__srv_assignment_json(px_fleet_server *srv, px__job *job, int rank);
void px__srv_touch_node(px_fleet_server *srv, size_t node);

/* server_deploy.c: deployments.  All take the server lock held. */
/* Whether a deployment name is valid: a user name's characters, and not
 * a job id ("j-" and digits). */
bool px__deploy_name_valid(const char *name);
/* Checks a deployment request (borrowed; untrusted) and returns its
 * normalized spec (new reference: name, model {digest[, name]}, replicas,
 * and objective, contract, policy when given), or NULL with err saying
 * which member is wrong and the fix (PX_EINVAL; PX_ENOMEM).  A normalized
 * spec checks to itself. */
json_t *px__deploy_request_check(const json_t *body, px_err *err);
/* Checks the request body (borrowed), plans the model over the online
 * nodes and stores the deployment for owner; *out gets the stored row
 * (owned).  PX_EINVAL (a bad request, err says which member and the fix),
 * PX_EEXIST (the name is taken), PX_ESTATE (the planner cannot place it:
 * err gives its reason), the store's errors. */
px_status px__srv_deploy(px_fleet_server *srv, const json_t *body, const char *owner,
                         px__deploy_row *out, px_err *err);
/* A deployment as the API shows it; with detail its spec, plan record and
 * incidents too.  New reference. */
json_t *px__srv_deploy_json(px_fleet_server *srv, const px__deploy_row *row, bool detail);
/* The models a node holds for the deployments whose plan uses it:
 * [{"digest", "name"}] (new reference; empty when none or the store
 * cannot be read now). */
json_t *px__srv_deploy_models(px_fleet_server *srv, const char *node);
/* Whether a deployment's plan puts the model (digest) on the node. */
bool px__srv_deploy_wants(px_fleet_server *srv, const char *node, const char *digest);
/* Forgets what px__srv_deploy_models read: a deployment came or went. */
void px__srv_deploy_changed(px_fleet_server *srv);
/* Records the cache evictions a node's heartbeat reports (borrowed). */
void px__srv_deploy_evictions(px_fleet_server *srv, const char *node, const json_t *evictions);
/* The online nodes as a plexus.inventory/1 document, joined by the
 * assumed links of the planner's inventory (server lock held; new
 * reference, NULL when out of memory). */
json_t *px__srv_fleet_inventory(px_fleet_server *srv);
/* A deployment's "contract" (a built-in's name, a plexus.contract/1
 * document, or NULL: *out NULL, the planner's implied one). */
struct px_contract;
px_status px__srv_open_contract(const json_t *spec, struct px_contract **out, px_err *err);

/* server_serving.c: the deployments' front ends.  start and stop run
 * without the server lock; px__serving_json with it. */
typedef struct px__serving px__serving;
void px__serving_start(px_fleet_server *srv);
void px__serving_stop(px_fleet_server *srv);
/* {"state", "detail", "replicas", "stage_workers"} of a deployment's
 * front end, or NULL when it has none. */
json_t *px__serving_json(px_fleet_server *srv, const char *name);
/* Whether method and url are the OpenAI API the server routes. */
bool px__serving_is_route(const char *method, const char *url);
/* Answers it (without the server lock) for an authenticated user: GET
 * /v1/models lists the caller's deployments; POST /v1/chat/completions
 * and /v1/completions go to the front end of the deployment the body's
 * "model" names, if it is the caller's (or the caller is an admin).
 * Returns the MHD result (int: enum MHD_Result). */
int px__serving_route(px_fleet_server *srv, void *conn, const char *method, const char *url,
                      const char *body, size_t len, const px__who *who);

/* server_deploy_records.c: what a deployment's front end reports. */
#define PX__DEPLOY_OBSERVATIONS_KEPT 720 /* an hour at one report each 5 s */
#define PX__DEPLOY_INCIDENTS_KEPT    100
#define PX__DEPLOY_OBSERVATION_MAX   (16u << 10)  /* body bytes */
#define PX__DEPLOY_INCIDENT_MAX      (256u << 10) /* body bytes */
#define PX__DEPLOY_STAGES_MAX        256
#define PX__DEPLOY_CANDIDATES_MAX    64
#define PX__DEPLOY_TIMELINE_MAX      256
typedef enum px__deploy_record_kind {
    PX__RECORD_OBSERVATION,
    PX__RECORD_INCIDENT,
} px__deploy_record_kind;
/* Checks an observation (borrowed; untrusted: {"tokens_per_s", "ttft_s":
 * {"p50", "p99"}, "tpot_s", "running", "queued", "requests", "replica",
 * "window_s", "stages": [{"stage", "replica", "step_s"}]}, figures in
 * seconds) and returns its normalized form (new reference), or NULL with
 * err naming the member and the fix. */
json_t *px__deploy_observation_check(const json_t *body, px_err *err);
/* Checks an incident: a complete plexus.incident/1 record within the
 * bounds above; returns a copy, or NULL with err. */
json_t *px__deploy_incident_check(const json_t *body, px_err *err);
/* Stores a checked record for the deployment with who reported it; *seq
 * gets its number.  Wakes the dashboard's streams.  Server lock held. */
px_status px__srv_deploy_record(px_fleet_server *srv, const char *deployment,
                                px__deploy_record_kind kind, const json_t *record,
                                const px__who *reporter, int64_t *seq, px_err *err);
/* The deployment's records after seq `after`, oldest first, at most limit,
 * each with its "seq" and "at" (Unix seconds); NULL with err. */
json_t *px__srv_deploy_records(px_fleet_server *srv, const char *deployment,
                               px__deploy_record_kind kind, int64_t after, int limit, px_err *err);
/* {"observations": seq, "incidents": seq}: the latest reported since the
 * server started (0: none yet), so that a page knows when to fetch. */
json_t *px__srv_deploy_reported(px_fleet_server *srv, const char *deployment);
/* Forgets the deployment's latest numbers (it was undeployed). */
void px__srv_deploy_forget(px_fleet_server *srv, const char *deployment);
/* The plan record's predictions the observations answer to: tokens_per_s,
 * ttft_s, tpot_s and per stage (and replica) the step time. */
json_t *px__deploy_predicted(const json_t *plan_record);

/* server_auth.c: principals.  px__auth_identify takes auth_lock itself;
 * the others run under the server lock. */
/* Loads the token file and options (users, join tokens), node
 * credentials and revoked names from the store; generates DATA/tokens
 * when nothing else gives a token. */
px_status px__auth_load(px_fleet_server *srv, px_err *err);
/* Node credentials and revoked names from the store (px__auth_load does
 * it, except on a store shared by replicas: they do it on taking the
 * scheduler lease). */
px_status px__auth_load_store(px_fleet_server *srv, px_err *err);
/* Who the "Authorization: Bearer ..." value names; false when nobody
 * (constant time over every principal). */
bool px__auth_identify(px_fleet_server *srv, const char *authorization, px__who *who);
/* Adds the principals of a token file's text (modified in place); path
 * names it in messages.  PX_EINVAL with the line and the fix. */
px_status px__auth_parse_text(px_fleet_server *srv, char *text, const char *path, px_err *err);
/* A node joins with the credential it made: refused when the name was
 * revoked (PX_EAUTH) or already has another credential (PX_EEXIST);
 * joining again with the same credential is accepted. */
px_status px__auth_join(px_fleet_server *srv, const char *node, const char *credential,
                        px_err *err);
/* A node's next credential: accepted beside the current one until first
 * used, which drops the others (px__auth_settle). */
px_status px__auth_add_pending(px_fleet_server *srv, const char *node, const char *credential,
                               px_err *err);
px_status px__auth_settle(px_fleet_server *srv, const px__who *who, px_err *err);
/* Drops every credential of a node and keeps it from joining again. */
px_status px__auth_revoke(px_fleet_server *srv, const char *node, px_err *err);
/* Lets a revoked node join again. */
px_status px__auth_admit(px_fleet_server *srv, const char *node, px_err *err);
bool px__auth_is_revoked(px_fleet_server *srv, const char *node);
/* Whether the node has any credential. */
bool px__auth_has_node(px_fleet_server *srv, const char *node);
void px__auth_free(px_fleet_server *srv);
/* Whether a user or node name is 1 to 64 of [A-Za-z0-9_.@-]. */
bool px__name_valid(const char *name);

/* One HTTP request as the handlers see it (api_http.c fills it). */
typedef struct px__api_req {
    px_fleet_server *srv;
    void *conn; /* struct MHD_Connection */
    const char *method;
    const char *url;
    const char *body;
    size_t body_len;
    px__who who; /* the authenticated caller */
    /* A streamed upload that has been written to a file (api_upload.c). */
    struct px__upload *upload;
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
/* GET /v1/blobs/<digest>, before the server lock is taken for the route:
 * a node's right to the blob is checked (under the lock, briefly), then
 * the blob is fetched from the store into DATA/blobs where it is not
 * there yet, without the lock.  0 when the route goes on, else the status
 * of the reply set in rs. */
int px__api_blob_prepare(px__api_req *rq, px__api_resp *rs);
/* GET /v1/jobs/<id>/artifacts/<name> on a store that keeps artifacts'
 * bytes, before the server lock is taken for the route: the caller's right
 * to the job and the artifact's digest are read under the lock (briefly),
 * then the bytes are copied out of the store without it into a file of
 * this replica's, which rs then sends.  Non-zero when rs holds the reply;
 * 0 when the route answers (another request, no such artifact, or one
 * stored before the store kept artifacts, read from DATA/artifacts). */
int px__api_artifact_prepare(px__api_req *rq, px__api_resp *rs);
bool px__api_agent_route(px__api_req *rq, px__api_resp *rs);
/* api_deploy.c: /v1/deployments, server lock held. */
bool px__api_deploy_route(px__api_req *rq, px__api_resp *rs);
/* Whether a node's credential may call method on url: a deployment's
 * reports (NAME/observations, NAME/incidents). */
bool px__api_deploy_node_may(const char *method, const char *url);

/* Appends text as valid UTF-8 (px_utf8_add_sanitized), NUL bytes as
 * U+FFFD too. */
void px__api_add_utf8(px_strbuf *sb, const unsigned char *p, size_t n);

/* Whether the caller may see the job (its owner, or an admin). */
bool px__api_may_see(const px__api_req *rq, const px__job_row *row);

/* api_upload.c: artifact and blob bodies streamed to disk, hashed on the
 * way, outside the server lock; only the bookkeeping takes it. */
typedef struct px__upload px__upload;
/* Whether method+url is an upload; its checks before any byte is read
 * (server lock held): 0 to go on, else the HTTP status of the reply set
 * in rs.  *out gets the upload state (owned: px__upload_free). */
bool px__upload_is(const char *method, const char *url);
int px__upload_begin(px__api_req *rq, uint64_t content_length, px__upload **out, px__api_resp *rs);
/* Writes one chunk (no lock); false once the upload failed (its reply is
 * then set at the end). */
bool px__upload_data(px__upload *u, const char *data, size_t len);
/* Finishes (fsync and rename outside the lock, bookkeeping inside) and
 * sets the reply. */
void px__upload_end(px__api_req *rq, px__upload *u, px__api_resp *rs);
void px__upload_free(px__upload *u);

/* Free bytes in the data folder beyond the reserve (negative: short);
 * uploads and submissions check it. */
int64_t px__srv_disk_headroom(px_fleet_server *srv);

/* api_files.c */
px_status px__artifact_name_check(const char *name, size_t len, px_err *err);
px_status px__artifact_open(const char *data_dir, const char *job, const char *name, bool create,
                            int *out_fd, px_err *err);
/* Opens (creating with create) the folder DATA/artifacts/<job>/<dirs of
 * name> without following links; *base points into name at its last
 * component. */
px_status px__artifact_dir(const char *data_dir, const char *job, const char *name, bool create,
                           int *out_dir, const char **base, px_err *err);
px_status px__write_all(int fd, const void *data, size_t len, px_err *err);
px_status px__blob_path(const char *data_dir, const char *hex, char *out, size_t n, px_err *err);
px_status px__open_read(const char *path, int *fd, size_t *size, px_err *err);
/* Makes DATA/blobs/<hex> hold the blob: there already, or fetched from a
 * store that keeps blobs (ops put_blob/get_blob), checked against its
 * digest, made durable and renamed into place.  PX_ENOTFOUND when neither
 * has it.  Without the server lock (it may take long). */
px_status px__blob_fetch(px_fleet_server *srv, const char *hex, px_err *err);
/* Whether the store keeps blobs (so that replicas share them). */
bool px__store_has_blobs(const px__store *store);
/* Whether the store keeps artifacts' bytes (so that replicas share them). */
bool px__store_has_artifacts(const px__store *store);
/* server_node_calls.c: agents through every replica. */
/* Whether the store serves agents through every replica (version 11's
 * node slots). */
bool px__store_serves_agents(const px__store *store);
/* On taking the lease, before the nodes are read: where the changes to
 * follow start, and this replica's URL announced.  Server lock held. */
px_status px__srv_node_calls_begin(px_fleet_server *srv, px_err *err);
/* Applies what agents told other replicas (their nodes' calls, then
 * their members' reports): when due (a notification) or every 250 ms.
 * Server lock held, never inside a pass. */
void px__srv_node_calls_tick(px_fleet_server *srv, bool due);
/* The scheduling replica's URL as the store knows it (read at most once
 * a second), "" when unknown.  Server lock held. */
const char *px__srv_holder_url(px_fleet_server *srv);
/* api_agent.c: appends a chunk of a job's output within its log quota
 * (opt.log_quota): counted by the store where it can (append_log_quota,
 * exact among replicas), else from `used` (the job's log bytes as the
 * caller knows them); the part past the quota is dropped with a line that
 * says so, once.  *taken, *cut, *seq as append_log_quota's. */
px_status px__api_append_output(px_fleet_server *srv, const char *job, int attempt, int rank,
                                const char *stream, const void *data, size_t len, int64_t used,
                                size_t *taken, bool *cut, int64_t *seq, px_err *err);

/* api_agent_standby.c: an agent's call to a replica that does not
 * schedule, answered from the store; false when the route is not one. */
bool px__api_agent_standby_route(px__api_req *rq, px__api_resp *rs);
/* The well-formed entries of an agent's "running" list (any JSON; at most
 * PX__RUNNING_MAX looked at), each {"job": id of 1 to 63 bytes,
 * "attempt", "rank": 0..1000000}, as the store's node_stops takes them:
 * owned JSON text, NULL when out of memory. */
#define PX__RUNNING_MAX 4096
char *px__standby_running_text(const json_t *running);
/* The assignments poll's "wait" query (seconds, 0..30, default 10);
 * false with a 400 in rs when it is not one. */
bool px__api_agent_wait(px__api_req *rq, px__api_resp *rs, double *wait);
/* Whether a replica that does not schedule serves this agent route. */
bool px__api_agent_standby_serves(const char *method, const char *url);
/* Identifies a node by a credential the store knows (a replica that does
 * not schedule holds no node credentials in memory). */
bool px__auth_identify_stored(px_fleet_server *srv, const char *authorization, px__who *who);
/* Waits on srv->changed until the deadline (monotonic ns); false when it
 * passed or the server is stopping. */
bool px__srv_wait(px_fleet_server *srv, uint64_t deadline_ns);

/* api_http.c */
px_status px__api_start(px_fleet_server *srv, const char *host, uint16_t port, px_err *err);
void px__api_stop(px_fleet_server *srv);
/* api_metrics.c */
char *px__metrics_render(px_fleet_server *srv);
void px__metrics_observe(uint64_t *hist, double *sum, uint64_t *count, double seconds);

/* server_collect.c: what uploads leave that nothing names.  Artifacts'
 * bytes that no artifact row names (an upload refused or cut off after its
 * bytes were stored), removed by the replica that schedules: when it takes
 * the lease, then every PX__COLLECT_EVERY_S, those stored more than
 * PX__COLLECT_GRACE_S before (nothing where the store has no
 * collect_artifact_data).  And files in DATA/artifacts that no artifact row
 * names and no upload holds (a crash's ".upload-*" files), removed by every
 * server at start and then every PX__COLLECT_EVERY_S, those last written
 * more than PX__COLLECT_GRACE_S before. */
#define PX__COLLECT_EVERY_S 600
#define PX__COLLECT_GRACE_S 3600
/* Starts the collector's thread (server lock not held). */
px_status px__srv_collect_start(px_fleet_server *srv, px_err *err);
/* Joins it, after `stopping` was set and `changed` broadcast. */
void px__srv_collect_stop(px_fleet_server *srv);
/* One collection as of `now` (wall seconds): the bytes stored before
 * now - grace that no row names, in rounds until none is left; totals into
 * *removed and *bytes.  Server lock not held.  For the thread and tests. */
px_status px__srv_collect_artifacts(px_fleet_server *srv, int64_t now, int64_t grace,
                                    int64_t *removed, int64_t *bytes, px_err *err);
/* One sweep of DATA/artifacts as of `now` (wall seconds): in the folder of
 * each job the store knows, the files last written before now - grace
 * that no artifact row of the job names and that no upload holds locked
 * are removed; totals into *removed and *bytes.  A failure (the store's, a
 * lock that cannot be tested) keeps what it concerns, the sweep goes on,
 * and the first is returned.  Server lock not held (taken briefly for
 * each job and each removal).  For the thread and tests. */
px_status px__srv_collect_files(px_fleet_server *srv, int64_t now, int64_t grace, int64_t *removed,
                                int64_t *bytes, px_err *err);

/* server_core.c */
/* Stops serving for good (a lost scheduler lease, a lost batch): memory
 * may no longer match the store.  Server lock held. */
void px__srv_fence(px_fleet_server *srv, const char *why);
px_status px__srv_write_job(px_fleet_server *srv, px__job *job, const char *attempt_reason,
                            px_err *err);

#endif
