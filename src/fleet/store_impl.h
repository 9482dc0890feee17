/*
 * Private declarations of the fleet's store: the rows it keeps (jobs,
 * logs, artifacts, deployments, explanations, node changes), the
 * operations every store implements (SQLite, PostgreSQL, and the fault
 * seam tests wrap around them), and how each is opened.
 */
#ifndef PX_FLEET_STORE_IMPL_H
#define PX_FLEET_STORE_IMPL_H

#include "base/common.h"
#include "plexus/fleet.h"

#include <stdatomic.h>

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
    char *owner;              /* the submitting user's name; NULL for jobs older than users */
    char *idem_key;           /* the submission's Idempotency-Key, or NULL */
    char *idem_hash;          /* SHA-256 (hex) of the submitted spec, with idem_key */
    /* A JSON array text, one element per member: the assignment its agent
     * is sent while it waits to start (px__srv_assignment_json), else
     * null.  Written with the members by a store that serves agents
     * through every replica (px__store_serves_agents); never read back. */
    char *assignments;
} px__job_row;

void px__job_row_release(px__job_row *r);
/* Deep copy (every string duplicated).  PX_ENOMEM leaves out empty. */
px_status px__job_row_copy(const px__job_row *in, px__job_row *out, px_err *err);

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

/* A deployment row: a model served across the fleet under a name that is
 * unique over the fleet.  Strings are owned by the row
 * (px__deploy_row_release). */
typedef struct px__deploy_row {
    char *name;
    char *owner;              /* the deploying user's name */
    char *model;              /* SHA-256 (hex) of the model blob */
    char *spec;               /* JSON text: the request as accepted */
    char *state;              /* "planned", "serving", "degraded", ... */
    char *plan;               /* JSON text: the planner's record (px__srv_plan_model), or NULL */
    char *incidents;          /* JSON array text, or NULL for none */
    int64_t created, updated; /* Unix seconds */
} px__deploy_row;

void px__deploy_row_release(px__deploy_row *r);
/* An explanation to store (put_explanations); borrowed strings. */
typedef struct px__explanation_row {
    const char *job;
    int attempt;
    const char *json;
} px__explanation_row;

typedef void (*px__job_cb)(const px__job_row *row, void *ud);
typedef void (*px__deploy_cb)(const px__deploy_row *row, void *ud);
/* One record of a deployment (list_deploy_records): its sequence number
 * within (deployment, kind), when it was stored (Unix milliseconds) and
 * its JSON text. */
typedef void (*px__deploy_record_cb)(int64_t seq, int64_t at, const char *body, void *ud);
typedef void (*px__node_cb)(const char *name, const char *reg_json, const char *state,
                            int64_t last_seen, void *ud);
typedef void (*px__credential_cb)(const char *node, const char *sha256_hex, void *ud);
typedef void (*px__name_cb)(const char *name, void *ud);
typedef void (*px__log_cb)(const px__log_chunk *c, void *ud);
typedef void (*px__artifact_cb)(const px__artifact_row *a, void *ud);
/* A node whose record changed (changed_nodes): its change number, its
 * registration (JSON text, NULL when it never registered), whether it
 * registered since the caller's mark, and its last call taken by a
 * replica that does not schedule: kind ("register", "heartbeat" or
 * "poll") and body (JSON text as the agent sent it, NULL for a poll). */
typedef struct px__node_change {
    int64_t change;
    const char *name;
    const char *registration;
    bool registered;
    const char *kind;
    const char *body;
} px__node_change;
typedef void (*px__node_change_cb)(const px__node_change *c, void *ud);
/* A member's report (take_member_reports): the node that sent it, its
 * job, "start" or "finish", and the body (JSON text) as the agent sent
 * it. */
typedef void (*px__member_report_cb)(const char *node, const char *job, const char *kind,
                                     const char *body, void *ud);

/* The store behind the server: a table of operations so that another
 * database (PostgreSQL for several servers) can follow.  Version 2 (1 held
 * the tokens of the token file, which are configuration, not state);
 * slots are only ever added at the end.  Every write is durable when it
 * returns PX_OK, and a failed write changes nothing and says why in err
 * (err must not be NULL for writes: a failure nobody can read is how a
 * store lies). */
typedef struct px__store_ops {
    int version;
    void (*close)(void *self);
    px_status (*put_node)(void *self, const char *name, const char *reg_json, const char *state,
                          int64_t last_seen, px_err *err);
    px_status (*list_nodes)(void *self, px__node_cb cb, void *ud, px_err *err);
    /* Inserts a job with the next sequence number; fills row->seq and
     * row->id ("j-000001") when id is NULL.  PX_EEXIST when (owner,
     * idem_key) is taken. */
    px_status (*insert_job)(void *self, px__job_row *row, px_err *err);
    /* Writes the job's row, its members rows and (when attempt_reason is
     * not NULL) an attempts row, in one transaction. */
    px_status (*update_job)(void *self, const px__job_row *row, const char *attempt_reason,
                            px_err *err);
    px_status (*get_job)(void *self, const char *id, px__job_row *out, px_err *err);
    /* Jobs in a state ("" any, "active" queued/assigned/running) of an
     * owner (NULL: every owner), newest first, at most limit. */
    px_status (*list_jobs)(void *self, const char *state, const char *owner, int limit,
                           px__job_cb cb, void *ud, px_err *err);
    /* The job an owner submitted with an idempotency key; PX_ENOTFOUND. */
    px_status (*find_idempotent)(void *self, const char *owner, const char *key, px__job_row *out,
                                 px_err *err);
    px_status (*append_log)(void *self, const char *job, int attempt, int rank, const char *stream,
                            const void *data, size_t len, int64_t *seq, px_err *err);
    /* Chunks with seq > after, at most max_bytes of data (at least one). */
    px_status (*read_logs)(void *self, const char *job, int64_t after, const char *stream,
                           size_t max_bytes, px__log_cb cb, void *ud, px_err *err);
    /* Bytes of log data and of artifacts a job holds (for its quotas). */
    px_status (*job_usage)(void *self, const char *job, int64_t *log_bytes, int64_t *artifact_bytes,
                           px_err *err);
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
    /* Node credentials, by the SHA-256 (hex) of the secret. */
    px_status (*put_credential)(void *self, const char *node, const char *sha256_hex, px_err *err);
    /* Drops a node's credentials except keep (NULL: all of them). */
    px_status (*drop_credentials)(void *self, const char *node, const char *keep_sha256_hex,
                                  px_err *err);
    px_status (*list_credentials)(void *self, px__credential_cb cb, void *ud, px_err *err);
    /* Node names an admin revoked: they cannot join again until admitted. */
    px_status (*set_revoked)(void *self, const char *node, bool revoked, px_err *err);
    px_status (*list_revoked)(void *self, px__name_cb cb, void *ud, px_err *err);
    /* Version 3.  (optional: NULL means a store only one server opens, so
     * always held) The scheduler lease among replicas on one database:
     * takes it when free, or checks that it is still held; *held says
     * which.  PX_EIO when the store was lost (and with it the lease). */
    px_status (*lease)(void *self, bool *held, px_err *err);
    /* (optional: NULL when every job is inserted by the scheduler) Jobs
     * that other replicas accepted and no scheduler has taken in yet, at
     * most max, oldest first; each is marked taken as it is handed over. */
    px_status (*claim_jobs)(void *self, int max, px__job_cb cb, void *ud, px_err *err);
    /* (optional: NULL, every write commits alone) A batch: the writes
     * until batch_end commit together, each still all or nothing on its own
     * (one that fails changes nothing, and the batch goes on).  The caller
     * holds the server lock from begin to end, so nothing written is seen
     * before the commit.  A batch_end that fails loses every write of the
     * batch: the caller must drop what it holds in memory. */
    px_status (*batch_begin)(void *self, px_err *err);
    px_status (*batch_end)(void *self, px_err *err);
    /* Version 4.  (optional: NULL, the scheduler looks for jobs other
     * replicas accepted on every tick) Waits up to timeout_ms for another
     * replica to accept a job; *woken says whether one did (or may have:
     * the first call, which starts listening, always wakes).  It waits on
     * a connection of its own, never under the store's lock, and is called
     * by one thread at a time; PX_EIO when that connection failed (the
     * next call connects again). */
    px_status (*wait_jobs)(void *self, int timeout_ms, bool *woken, px_err *err);
    /* Version 5.  Deployments, by name.  put_deployment inserts the row
     * (PX_EEXIST when the name is taken) or, with replace, overwrites the
     * row of that name (PX_ENOTFOUND when there is none). */
    px_status (*put_deployment)(void *self, const px__deploy_row *row, bool replace, px_err *err);
    /* The row of a name (owned by out; PX_ENOTFOUND). */
    px_status (*get_deployment)(void *self, const char *name, px__deploy_row *out, px_err *err);
    /* Deployments of an owner (NULL: every owner), by name. */
    px_status (*list_deployments)(void *self, const char *owner, px__deploy_cb cb, void *ud,
                                  px_err *err);
    /* Drops the row of a name; PX_ENOTFOUND when there is none. */
    px_status (*delete_deployment)(void *self, const char *name, px_err *err);
    /* Version 6.  (optional: NULL, the server writes each on its own)
     * Several jobs' rows and members (no attempt rows) and several
     * explanations, each call all or nothing, in as few round trips as the
     * store can: a scheduling pass writes its decisions with them. */
    px_status (*update_jobs)(void *self, const px__job_row *rows, int n, px_err *err);
    px_status (*put_explanations)(void *self, const px__explanation_row *rows, int n, px_err *err);
    /* Version 7.  Records a deployment's front end reports, of a kind
     * ("observation": serving figures; "incident": a recovery), kept as a
     * ring per deployment and kind.  append_deploy_record stores body (JSON
     * text) with the next sequence number of (deployment, kind) into *seq
     * and drops the records older than the latest `keep`, all or nothing;
     * PX_ENOTFOUND when there is no such deployment.  The records go with
     * their deployment (delete_deployment). */
    px_status (*append_deploy_record)(void *self, const char *deployment, const char *kind,
                                      int64_t at, const char *body, int keep, int64_t *seq,
                                      px_err *err);
    /* Records of (deployment, kind) with seq > after, oldest first, at most
     * limit. */
    px_status (*list_deploy_records)(void *self, const char *deployment, const char *kind,
                                     int64_t after, int limit, px__deploy_record_cb cb, void *ud,
                                     px_err *err);
    /* Version 9.  (optional: NULL, blobs live in DATA/blobs alone) Blobs
     * in the store, so that replicas share them without a shared folder;
     * each call streams (constant memory) on a connection of its own,
     * never under the store's lock.  put_blob stores the size bytes of fd
     * from offset 0, whose SHA-256 must be hex (64 lowercase hex digits),
     * committed before it returns; a blob already stored is kept.
     * get_blob writes the blob to fd (from its current offset) and checks
     * its size and SHA-256 against what was stored: PX_ENOTFOUND when there
     * is none, PX_EIO when it differs (then fd holds garbage to drop). */
    px_status (*put_blob)(void *self, const char *hex, int fd, int64_t size, px_err *err);
    px_status (*get_blob)(void *self, const char *hex, int fd, int64_t *size, px_err *err);
    /* (optional: NULL, only the scheduling replica cancels) A cancellation
     * a replica that does not schedule accepted: recorded (once however
     * often asked) and the scheduler woken as for a job (wait_jobs);
     * take_cancels hands over, and forgets, up to max of them. */
    px_status (*request_cancel)(void *self, const char *job, px_err *err);
    px_status (*take_cancels)(void *self, int max, px__name_cb cb, void *ud, px_err *err);
    /* Version 10.  (optional: NULL, artifacts live in DATA/artifacts alone)
     * The bytes of jobs' artifacts in the store, by their SHA-256, so that
     * every replica serves them without a shared folder; the contract of
     * put_blob and get_blob, in a space of their own (an artifact is never
     * served as a blob).  put_artifact_data is committed before the
     * artifact's row (put_artifact) is written. */
    px_status (*put_artifact_data)(void *self, const char *hex, int fd, int64_t size, px_err *err);
    px_status (*get_artifact_data)(void *self, const char *hex, int fd, int64_t *size, px_err *err);
    /* Version 11.  (optional: NULL, agents speak to the scheduling replica
     * alone; all ten come together) Nodes through every replica: the
     * database keeps what agents said to a replica that does not schedule,
     * and what each waiting member is to run, so that such a replica
     * serves agents and the scheduler reads their calls from it.
     *
     * The node a credential (SHA-256 hex) belongs to, into name (at least
     * 65 bytes); PX_ENOTFOUND when none, or when the node is revoked. */
    px_status (*node_of_credential)(void *self, const char *sha256_hex, char *name, px_err *err);
    /* Records a node's call: kind "register" (body: the registration with
     * its "running" list; stored as the node's registration, the node
     * online, the scheduler woken as for a job), "heartbeat" (body as
     * sent) or "poll" (body NULL).  The node's last_seen becomes now and
     * its change number the next one.  PX_ENOTFOUND for a heartbeat or a
     * poll of a node that never registered. */
    px_status (*note_node)(void *self, const char *name, const char *kind, const char *body,
                           px_err *err);
    /* The highest change number yet: where a scheduler that has just read
     * every node starts following changes. */
    px_status (*node_mark)(void *self, int64_t *mark, px_err *err);
    /* Nodes whose change number is above after, in that order, at most
     * max. */
    px_status (*changed_nodes)(void *self, int64_t after, int max, px__node_change_cb cb, void *ud,
                               px_err *err);
    /* The assignments (px__job_row.assignments' elements, JSON texts) of
     * the node's members waiting to start in active jobs' current
     * attempts. */
    px_status (*node_assignments)(void *self, const char *node, px__name_cb cb, void *ud,
                                  px_err *err);
    /* Of running (a JSON array text of {"job", "attempt", "rank"} with
     * integer attempt and rank), the entries the node must stop (an ended
     * or unknown job, another attempt, a member not on this node, a job
     * back in the queue): a JSON array text into *out (owned). */
    px_status (*node_stops)(void *self, const char *node, const char *running, char **out,
                            px_err *err);
    /* A member's report (kind "start" or "finish") a replica that does not
     * schedule accepted, the scheduler woken as for a job;
     * take_member_reports hands over, and forgets, up to max of them,
     * oldest first. */
    px_status (*put_member_report)(void *self, const char *node, const char *job, const char *kind,
                                   const char *body, px_err *err);
    px_status (*take_member_reports)(void *self, int max, px__member_report_cb cb, void *ud,
                                     px_err *err);
    /* The scheduling replica's URL as it announced itself (set_holder, on
     * taking the lease; "" when it gave none), for replies that send a
     * caller on; get_holder: "" when unknown.  url holds 256 bytes. */
    px_status (*set_holder)(void *self, const char *url, px_err *err);
    px_status (*get_holder)(void *self, char *url, px_err *err);
    /* Version 12.  (optional, both or neither: NULL where one connection
     * fences every write, as with SQLite) The lease's epoch, and writes
     * fenced by it on a connection other than the lease's own.
     * lease_epoch: the epoch this replica took with the lease it holds
     * (each new holder increments it when it takes the lease, waiting for
     * every fenced transaction in flight), 0 while it holds none.
     * fenced_update_jobs: update_jobs on a connection of the store's own
     * (not under the lock that serializes the other slots), in one
     * transaction that first checks, and keeps locked until its commit,
     * that the lease's epoch is still `epoch`: PX_ESTATE, with nothing
     * written, when another replica has taken the lease since. */
    px_status (*lease_epoch)(void *self, int64_t *epoch, px_err *err);
    px_status (*fenced_update_jobs)(void *self, int64_t epoch, const px__job_row *rows, int n,
                                    px_err *err);
    /* Version 13.  (optional: NULL where artifacts' bytes are never stored
     * apart from their rows) Removes the artifacts' bytes (put_artifact_data)
     * that no artifact row names and that were stored, or stored again,
     * before `before` (wall seconds): an upload refused or cut off between
     * the bytes and the row.  At most max of them, the oldest first; how
     * many into *removed and their size into *bytes.  Bytes stored after
     * `before` are kept whatever names them, so the caller keeps uploads in
     * flight by a grace period (before = now - grace).  On a connection of
     * its own, never under the store's lock. */
    px_status (*collect_artifact_data)(void *self, int64_t before, int max, int64_t *removed,
                                       int64_t *bytes, px_err *err);
    /* (optional: NULL, the caller counts a job's log quota itself, which
     * several replicas cannot do exactly) append_log within the job's log
     * quota as the store counts it, atomically among every writer: stores
     * the first min(len, quota - used) bytes of data (used: the bytes of
     * the job's log, notes included) and, when that leaves some out of a
     * log not yet past its quota, `note` (to "stderr") after them (so the
     * note is written once), all or nothing.  *taken: the bytes of data stored; *cut: whether some
     * were left out; *seq: the last number written (0: none). */
    px_status (*append_log_quota)(void *self, const char *job, int attempt, int rank,
                                  const char *stream, const void *data, size_t len, int64_t quota,
                                  const char *note, size_t *taken, bool *cut, int64_t *seq,
                                  px_err *err);
    /* (optional: NULL, a standby reads node_assignments per poll) The
     * assignments of node_assignments for several nodes in one statement
     * (nodes: a JSON array text of names): cb(node, assignment, ud) for
     * each, by node. */
    px_status (*nodes_assignments)(void *self, const char *nodes,
                                   void (*cb)(const char *node, const char *text, void *ud),
                                   void *ud, px_err *err);
} px__store_ops;

typedef struct px__store {
    const px__store_ops *ops;
    void *self;
} px__store;

/* Opens DATA/fleet.db (created and migrated as needed), the file and its
 * WAL readable by the owner alone (0600) whatever the umask. */
px_status px__store_sqlite_open(const char *path, px__store *out, px_err *err);
/* The schema version a freshly migrated database has. */
int px__store_sqlite_schema_version(void);
/* Whether --store names a PostgreSQL database (postgres:// or
 * postgresql://). */
bool px__store_is_pg(const char *spec);
/* Connects to the database (a libpq URI without a password: libpq reads
 * it from ~/.pgpass or PGPASSFILE) and migrates it, one replica at a time.
 * PX_EINVAL (a malformed URI), PX_EAUTH (a password in it), PX_EIO. */
px_status px__store_pg_open(const char *spec, px__store *out, px_err *err);
int px__store_pg_schema_version(void);
/* For tests: the value of setting `name` in the session of the store's own
 * connection (self: a PostgreSQL store's), read as any statement is (so
 * a lost connection of a replica that does not schedule is made again
 * first), into out (n bytes). */
px_status px__store_pg_setting(void *self, const char *name, char *out, size_t n, px_err *err);
/* For tests: hook(ud) runs on each fenced transaction (fenced_update_jobs)
 * with its writes sent and its commit not yet; NULL removes it. */
void px__store_pg_set_fence_hook(void (*hook)(void *ud), void *ud);
/* Test seam (store_fault.c): while *px__store_fail_flag is nonzero, the
 * store of a server started after it was set refuses every write as a
 * full disk would.  NULL (always, outside tests) leaves the store alone. */
extern atomic_int *px__store_fail_flag;
px_status px__store_wrap_faults(px__store *store, px_err *err);

#endif
