/*
 * plexus/fleet.h: the fleet: a control plane (server) that keeps jobs and
 * nodes, a scheduler that places work and explains why, and the agents and
 * clients that talk to it over the HTTP API of docs/formats/fleet-api.md.
 *
 * Server side.  px_fleet_server_start serves the API on an address with
 * its state in a data folder (SQLite, WAL, synchronous=FULL: an
 * acknowledged submission survives a crash).  `plexus server` and
 * `plexus up` are thin over it:
 *
 *     px_fleet_server_options opt = {.listen = "127.0.0.1:0",
 *                                    .data_dir = "/var/lib/plexus",
 *                                    .token_file = "/etc/plexus/tokens",
 *                                    .tls_cert = "server.pem",
 *                                    .tls_key = "server-key.pem"};
 *     px_fleet_server *srv;
 *     if (px_fleet_server_start(&opt, &srv, &err) != PX_OK)
 *         fprintf(stderr, "plexus: %s\n", err.msg);
 *     printf("listening on %s\n", px_fleet_server_url(srv));
 *     ...
 *     px_fleet_server_stop(srv);
 *
 * Scheduler.  The matcher the server uses is also usable alone (the
 * benchmark and the simulator do): nodes are described by the JSON body of
 * an agent's registration, jobs by a job specification; each placement
 * returns an explanation with every node's reason for not fitting, the
 * score terms of the best nodes and the decision:
 *
 *     px_fleet_sched *s;
 *     px_fleet_sched_new(&s, &err);
 *     px_fleet_sched_add_node(s, registration_json, &err);
 *     px_fleet_request *r;
 *     px_fleet_request_compile(spec_json, &r, &err);
 *     px_fleet_explanation *e;
 *     px_fleet_sched_place(s, r, "j-1", &e, &err);
 *     json_t *why = px_fleet_explanation_to_json(e, s);
 *
 * Trust (docs/security.md): users (each with a role), a join token that
 * lets an agent join once, and a credential per node that the agent made
 * itself and the server knows only by hash.  Every agent call is bound to
 * its node and to the work assigned there; users see their own jobs (the
 * admin role sees all, never another user's environment values).
 *
 * Thread safety: a px_fleet_server is safe to use from any thread (it
 * serializes internally); a px_fleet_sched, px_fleet_request and
 * px_fleet_explanation are not.
 */
#ifndef PLEXUS_FLEET_H
#define PLEXUS_FLEET_H

#include "plexus/base.h"

#include <stdatomic.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Version specifiers (PEP 440 subset)                                 */
/* ------------------------------------------------------------------ */

/* Whether `version` ("2.3.1", "12.1", "2.1.0rc1") satisfies `spec`, a
 * comma-joined list of clauses with ==, !=, <, <=, >, >=, ~= (and ==X.*
 * prefix matching); an empty spec matches everything.  Returns PX_OK and
 * sets *out, or PX_EPARSE with a message naming the bad clause.  A version
 * without numbers (a gfx target such as "gfx90a") only matches == and !=
 * clauses by text. */
PX_NODISCARD px_status px_fleet_version_match(const char *version, const char *spec, bool *out,
                                              px_err *err);

/* ------------------------------------------------------------------ */
/* Scheduler                                                           */
/* ------------------------------------------------------------------ */

typedef struct px_fleet_sched px_fleet_sched;
typedef struct px_fleet_request px_fleet_request;
typedef struct px_fleet_explanation px_fleet_explanation;

/* Node states as the scheduler sees them. */
typedef enum px_fleet_node_state {
    PX_FLEET_NODE_ONLINE = 0,
    PX_FLEET_NODE_OFFLINE = 1,
    PX_FLEET_NODE_DRAINING = 2,
} px_fleet_node_state;

/* Creates an empty scheduler.  Returns owned memory (px_fleet_sched_free).
 * PX_ENOMEM on allocation failure. */
PX_NODISCARD px_status px_fleet_sched_new(px_fleet_sched **out, px_err *err);
/* Frees the scheduler, its nodes and allocations.  NULL is a no-op.
 * Explanations made by it must not be turned into JSON afterwards. */
void px_fleet_sched_free(px_fleet_sched *s);

/* Adds a node, or replaces the description of the node of the same name
 * (keeping its allocations), from a registration body (the JSON of
 * POST /v1/agent/register; borrowed).  The node starts online.  Writes the
 * node's index to *index (may be NULL).  PX_EINVAL with the JSON pointer
 * of the bad member; PX_ELIMIT past 1,000,000 nodes or 64 devices. */
PX_NODISCARD px_status px_fleet_sched_add_node(px_fleet_sched *s, const json_t *reg, size_t *index,
                                               px_err *err);
/* Looks up a node by name (borrowed) and writes its index to *index.
 * PX_ENOTFOUND, naming the node in err (may be NULL), if it is not
 * registered.  Reads only: safe beside other readers. */
PX_NODISCARD px_status px_fleet_sched_find_node(const px_fleet_sched *s, const char *name,
                                                size_t *index, px_err *err);
size_t px_fleet_sched_n_nodes(const px_fleet_sched *s);
/* Name of node i (borrowed; valid while the scheduler lives). */
const char *px_fleet_sched_node_name(const px_fleet_sched *s, size_t i);
void px_fleet_sched_set_state(px_fleet_sched *s, size_t i, px_fleet_node_state state);
px_fleet_node_state px_fleet_sched_state(const px_fleet_sched *s, size_t i);
/* Applies the live part of a heartbeat body (borrowed): "live" (memory
 * free, load, per-device free memory) and "resident" digests.  Bad members
 * are ignored (live data never feeds capacity, only headroom). */
void px_fleet_sched_update_live(px_fleet_sched *s, size_t i, const json_t *heartbeat);

/* Fleets of up to `limit` nodes have every feasible node scored; larger
 * ones score a rotating window of max(limit / 2, nodes / 20) feasible
 * nodes plus every node holding the job's model (every node is still
 * filtered and keeps its reason).  0 restores the default of 1,000. */
void px_fleet_sched_set_score_limit(px_fleet_sched *s, uint32_t limit);

/* Compiles and validates a job specification (borrowed).  Returns owned
 * memory (px_fleet_request_free).  PX_EINVAL with a message naming the
 * JSON pointer and the fix ("/resources/gpus: expected an integer 0..64"). */
PX_NODISCARD px_status px_fleet_request_compile(const json_t *spec, px_fleet_request **out,
                                                px_err *err);
void px_fleet_request_free(px_fleet_request *r); /* NULL is a no-op */
/* Members of the job (spec "nodes"). */
int px_fleet_request_members(const px_fleet_request *r);

/* Filters and scores every node for the request and, when enough nodes fit
 * (one per member), allocates CPUs, memory and devices on them under
 * `owner` (a job id, copied).  Always returns the explanation of the
 * decision in *out (owned; px_fleet_explanation_free), placed or not.
 * Returns PX_OK either way; PX_ENOMEM on allocation failure. */
PX_NODISCARD px_status px_fleet_sched_place(px_fleet_sched *s, const px_fleet_request *r,
                                            const char *owner, px_fleet_explanation **out,
                                            px_err *err);
/* Releases everything allocated under owner on every node.  Returns how
 * many members were released. */
size_t px_fleet_sched_release(px_fleet_sched *s, const char *owner);
/* Re-creates an allocation (after a server restart) of member `rank` of
 * owner on node i with the given device ids (borrowed JSON array of
 * strings, may be NULL).  PX_ESTATE when the devices are taken. */
PX_NODISCARD px_status px_fleet_sched_restore(px_fleet_sched *s, const px_fleet_request *r,
                                              const char *owner, size_t node, const json_t *devices,
                                              px_err *err);

/* Whether the explanation's decision placed the job. */
bool px_fleet_explanation_placed(const px_fleet_explanation *e);
/* Members placed (0 when not placed). */
size_t px_fleet_explanation_n_members(const px_fleet_explanation *e);
/* Node index of member `rank`, and its devices as a new JSON array of
 * device ids (new reference). */
size_t px_fleet_explanation_node(const px_fleet_explanation *e, size_t rank);
json_t *px_fleet_explanation_devices(const px_fleet_explanation *e, const px_fleet_sched *s,
                                     size_t rank);
/* The explanation as JSON (the format of GET /v1/jobs/<id>/explain, less
 * "job", "attempt" and "at"), a new reference; NULL on allocation failure.
 * s must be the scheduler that made it. */
json_t *px_fleet_explanation_to_json(const px_fleet_explanation *e, const px_fleet_sched *s);
void px_fleet_explanation_free(px_fleet_explanation *e); /* NULL is a no-op */

/* ------------------------------------------------------------------ */
/* Server                                                              */
/* ------------------------------------------------------------------ */

typedef struct px_fleet_server px_fleet_server;

/* Settings of a server.  Strings are borrowed for the duration of
 * px_fleet_server_start.  Zero fields take the defaults. */
typedef struct px_fleet_server_options {
    const char *listen;   /* "HOST:PORT"; port 0 picks a free one; default "127.0.0.1:7070" */
    const char *data_dir; /* state folder (made 0700), created if absent; default "./plexus-data" */
    /* Lines "agent TOKEN" (the join token agents join with) and "user TOKEN
     * [NAME [ROLE]]" (ROLE user, the default, or admin); the file must not
     * be readable by group or others.  May be NULL. */
    const char *token_file;
    const char *cluster_token; /* a join token to accept besides the file's; may be NULL */
    const char *api_token;     /* a token of the user "admin" (role admin); may be NULL */
    double lease_s;            /* heartbeat lease; default 10 */
    double heartbeat_s;        /* interval agents are told to use; default lease_s / 4 */
    double restart_backoff_s;  /* first service restart delay; default 1 */
    size_t max_body;           /* JSON and log chunk bodies; default 1 MiB */
    size_t max_upload;         /* one artifact or blob, streamed to disk; default 1 TiB */
    unsigned max_connections;  /* default 1024 */
    unsigned max_connections_per_address; /* default 64 */
    double header_timeout_s; /* a request's headers (and a TLS handshake) must arrive within
                                this, and a body must not stall longer; default 10 */
    /* TLS: a PEM certificate (chain) and its private key (a file only its
     * owner can read); both or neither.  With them the server speaks only
     * HTTPS (GnuTLS through libmicrohttpd). */
    const char *tls_cert;
    const char *tls_key;
    uint64_t disk_reserve;   /* bytes kept free in DATA: below, submissions and uploads get
                                507; default 512 MiB */
    uint64_t log_quota;      /* output kept per job; the rest is dropped and the log says so;
                                default 256 MiB */
    uint64_t artifact_quota; /* bytes of artifacts per job; default 16 GiB */
    double max_job_time_s;   /* the longest time_limit_s a job may ask for, and the limit of
                                jobs that give none; 0: no limit */
    /* Where the state lives: NULL for DATA/fleet.db (SQLite, one server),
     * or a PostgreSQL URI "postgres://USER@HOST:PORT/DATABASE" without a
     * password (libpq reads it from ~/.pgpass or PGPASSFILE) that several
     * server replicas share; one of them schedules at a time (the holder of
     * the scheduler lease), the others stand by until it goes. */
    const char *store;
} px_fleet_server_options;

/* Opens (or creates and migrates) DATA/fleet.db, loads tokens, node
 * credentials, nodes and jobs, and starts serving.  When neither a token
 * file nor tokens are given and DATA/tokens does not exist, generates a
 * join token and an admin token and writes them there (mode 0600); they
 * are never logged.  Returns owned memory (px_fleet_server_stop).
 * Status: PX_EIO (the data folder or database), PX_EINVAL (options, token
 * file, TLS files), PX_EAUTH (a token or key file others can read),
 * PX_EPEER (the address could not be bound). */
PX_NODISCARD px_status px_fleet_server_start(const px_fleet_server_options *opt,
                                             px_fleet_server **out, px_err *err);
/* The port the server listens on (useful with port 0). */
uint16_t px_fleet_server_port(const px_fleet_server *srv);
/* Whether the server serves its API: at once on its own store; on a
 * shared (PostgreSQL) store, once it holds the scheduler lease (until
 * then it answers 503 "standing by").  Thread-safe. */
bool px_fleet_server_serving(const px_fleet_server *srv);
/* NULL while all is well; else why the server stopped serving for good
 * (a replica that lost the scheduler lease: another may be scheduling, so
 * it must be stopped and started again, as a standby).  Borrowed.
 * Thread-safe. */
const char *px_fleet_server_failed(px_fleet_server *srv);
/* "http://HOST:PORT" or "https://HOST:PORT" (borrowed; valid until stop). */
const char *px_fleet_server_url(const px_fleet_server *srv);
/* Stops serving (waiting for requests in flight), closes the store and
 * frees the server.  NULL is a no-op. */
void px_fleet_server_stop(px_fleet_server *srv);

/* ================================================================== */
/* Agent and client                                                    */
/* ================================================================== */

/* The HTTP client of the API, the agent's content-addressed cache and the
 * agent itself.  `plexus agent`, `plexus up` and the client commands
 * (`plexus nodes`, `submit`, `jobs`, `logs`, `explain`, `cancel`,
 * `artifacts`) are thin over these:
 *
 *     px_fleet_client *c;
 *     px_fleet_client_new("http://127.0.0.1:7070", token, &c, &err);
 *     json_t *reply;
 *     if (px_fleet_client_call(c, "GET", "/v1/nodes", NULL, NULL, &reply,
 *                              &err) == PX_OK)
 *         ... json_decref(reply);
 *     px_fleet_client_free(c);
 *
 *     px_fleet_agent_config cfg = {.server = url, .token = join_token,
 *                                  .ca_file = "ca.pem", .job_user = "nobody",
 *                                  .inventory = "gpu-node.json"};
 *     px_fleet_agent_run(&cfg, &err);   // until *cfg.stop becomes nonzero
 */

/* ---- HTTP client ---- */

typedef struct px_fleet_client px_fleet_client;

/* Creates a client of the server at server_url ("http://HOST:PORT"; NULL
 * or "" means http://127.0.0.1:7070) sending `token` (borrowed, copied;
 * may be NULL) as a bearer token.  Returns owned memory
 * (px_fleet_client_free).  PX_EINVAL for a URL that is not http(s) or a
 * token with spaces or control characters; PX_EIO when libcurl cannot
 * start.  One client must not be used by two threads at once. */
PX_NODISCARD px_status px_fleet_client_new(const char *server_url, const char *token,
                                           px_fleet_client **out, px_err *err);
/* Frees the client and wipes its copy of the token.  NULL is a no-op. */
void px_fleet_client_free(px_fleet_client *c);
/* Trusts only the CA certificates in ca_file (PEM) for https:// servers:
 * the system's store is not consulted, so the server's certificate must
 * chain to that CA (and name the host).  NULL restores the system store.
 * PX_ENOTFOUND when the file cannot be read. */
PX_NODISCARD px_status px_fleet_client_set_ca(px_fleet_client *c, const char *ca_file, px_err *err);
/* Replaces the bearer token (copied; NULL sends none).  PX_EINVAL for a
 * token with spaces or control characters. */
PX_NODISCARD px_status px_fleet_client_set_token(px_fleet_client *c, const char *token,
                                                 px_err *err);
/* Sends "Idempotency-Key: key" with the following requests (copied; NULL
 * stops).  A retried submission with the same key returns the job the
 * first one made.  PX_EINVAL for a key that is not 1 to 128 printable
 * characters without spaces. */
PX_NODISCARD px_status px_fleet_client_set_idempotency_key(px_fleet_client *c, const char *key,
                                                           px_err *err);
/* Limit on each whole request in milliseconds (default 30,000). */
void px_fleet_client_set_timeout(px_fleet_client *c, int timeout_ms);
/* Makes requests end early (PX_ETIMEOUT) once *flag becomes nonzero, so a
 * long poll does not delay a shutdown.  flag is borrowed (read from the
 * calling thread while a request runs; another thread or a signal handler
 * may set it); NULL clears. */
void px_fleet_client_set_abort(px_fleet_client *c, const atomic_int *flag);
/* (optional) Calls fn(ud, done, total) on the calling thread as a request's
 * body is sent or its reply received (bytes so far and in all, total 0
 * when unknown), for a progress display; fn NULL: none. */
void px_fleet_client_set_progress(px_fleet_client *c,
                                  void (*fn)(void *ud, uint64_t done, uint64_t total), void *ud);
/* The server URL (borrowed). */
const char *px_fleet_client_server(const px_fleet_client *c);
/* Sends `method` on `path` ("/v1/jobs") with a JSON body (borrowed; may
 * be NULL) and parses the JSON reply into *reply (returns owned:
 * json_decref; may be NULL to ignore it; an empty reply is {}).
 * *http_status (may be NULL) gets the HTTP status, 0 when none came.
 * Statuses: PX_OK for 2xx; for other replies a status from the HTTP code
 * (400 PX_EINVAL, 401/403 PX_EAUTH, 404 PX_ENOTFOUND, 409 PX_ESTATE, 413
 * PX_ELIMIT, 5xx PX_EPEER) with the server's own message; PX_EIO when the
 * server cannot be reached, PX_ETIMEOUT past the time limit, PX_ELIMIT
 * for a reply over 64 MiB. */
PX_NODISCARD px_status px_fleet_client_call(px_fleet_client *c, const char *method,
                                            const char *path, const json_t *body, long *http_status,
                                            json_t **reply, px_err *err);
/* Like px_fleet_client_call with raw bytes as the body (borrowed). */
PX_NODISCARD px_status px_fleet_client_send(px_fleet_client *c, const char *method,
                                            const char *path, const void *data, size_t len,
                                            long *http_status, json_t **reply, px_err *err);
/* Like px_fleet_client_send with the content of a regular file, streamed. */
PX_NODISCARD px_status px_fleet_client_send_file(px_fleet_client *c, const char *method,
                                                 const char *path, const char *file,
                                                 long *http_status, json_t **reply, px_err *err);
/* GETs path into the file dest (written to dest.part.PID, renamed when
 * complete; never follows a link).  Statuses as px_fleet_client_call. */
PX_NODISCARD px_status px_fleet_client_download(px_fleet_client *c, const char *path,
                                                const char *dest, long *http_status, px_err *err);
/* ---- Reports of a deployment's front end ---- */

/* What serves a deployment (its front end, wherever it runs) reports to
 * the server, so that `GET /v1/deployments/NAME/observations` and the
 * dashboard show the deployment as it runs.  The client authenticates as
 * the deployment's owner (a user token) or as a node its plan uses (that
 * node's agent credential); anyone else gets PX_ENOTFOUND.
 *
 * px_fleet_report_observation sends serving figures measured over a
 * recent window (borrowed JSON; every member optional, at least one
 * figure; times in seconds):
 *
 *     {"tokens_per_s": 412.5, "ttft_s": {"p50": 0.081, "p99": 0.190},
 *      "tpot_s": {"p50": 0.0121, "p99": 0.0188}, "running": 6, "queued": 2,
 *      "requests": 37, "window_s": 5, "replica": 0,
 *      "stages": [{"stage": 0, "replica": 0, "step_s": {"p50": 0.0051,
 *                                                       "p99": 0.0066}}]}
 *
 * px_fleet_report_incident sends a complete plexus.incident/1 record
 * (docs/formats/incident.md; px_heal_run_incidents gives them).
 *
 * The server keeps the latest 720 observations and 100 incidents of each
 * deployment.  *seq (may be NULL) gets the stored record's number.
 * PX_EINVAL with the server's reason (the member and the fix) for a
 * record it refuses; other statuses as px_fleet_client_call.  Sending one
 * observation every few seconds is what the server expects. */
PX_NODISCARD px_status px_fleet_report_observation(px_fleet_client *c, const char *deployment,
                                                   const json_t *observation, int64_t *seq,
                                                   px_err *err);
PX_NODISCARD px_status px_fleet_report_incident(px_fleet_client *c, const char *deployment,
                                                const json_t *incident, int64_t *seq, px_err *err);

/* Percent-encodes s for one path segment.  Returns owned memory (free()),
 * NULL on allocation failure. */
char *px_fleet_url_escape(const char *s);

/* Reads a token from a file that only its owner can read: the first word
 * of the first line that is not a comment.  `what` names the file in
 * messages ("--token-file").  Returns owned memory in *out (free() after
 * wiping).  PX_EAUTH for a file group or others can read (the message
 * gives the chmod that fixes it), PX_ENOTFOUND, PX_EINVAL for no token or
 * a malformed one. */
PX_NODISCARD px_status px_fleet_secret_read(const char *path, const char *what, char **out,
                                            px_err *err);

/* Makes a local certificate authority and a server certificate signed by
 * it in dir (created 0700): ca.pem, ca-key.pem, server.pem and
 * server-key.pem (keys 0600; ECDSA P-256, SHA-256), the server's valid
 * for 127.0.0.1, ::1, localhost and `host` (may be NULL).  Files already
 * there are kept, so clients keep trusting the same CA.  PX_EIO. */
PX_NODISCARD px_status px_fleet_tls_make_local(const char *dir, const char *host, px_err *err);

/* Validates a Python function target "FILE.py:FUNCTION" (what `plexus
 * submit --python` takes): a non-empty path ending in .py and a Python
 * identifier.  On success *file and *function are owned by the caller
 * (free()); on failure both are NULL and err says what is wrong.
 * Returns PX_OK, PX_EINVAL or PX_ENOMEM. */
PX_NODISCARD px_status px_fleet_python_target_parse(const char *target, char **file,
                                                    char **function, px_err *err);

/* ---- Content-addressed cache ---- */

/* Models and artifacts by SHA-256 under DIR/objects/<digest>, an index of
 * sizes and last use in DIR/index.json, a size budget kept by evicting the
 * least recently used objects that no job holds.  Thread-safe. */
typedef struct px_fleet_cache px_fleet_cache;

/* Opens (creating) the cache in dir with a budget in bytes.  Rebuilds the
 * index from the objects when it is missing or damaged and evicts down to
 * the budget.  Returns owned memory (px_fleet_cache_free).  PX_EINVAL for
 * an empty dir or a zero budget, PX_EIO when the folder cannot be made. */
PX_NODISCARD px_status px_fleet_cache_open(const char *dir, uint64_t budget_bytes,
                                           px_fleet_cache **out, px_err *err);
void px_fleet_cache_free(px_fleet_cache *c); /* NULL is a no-op */
/* Copies the file at src_path into the cache under its SHA-256 (written to
 * digest_out, may be NULL), recording `name` (borrowed; may be NULL).
 * With expect_digest (may be NULL) the content must have that digest
 * (PX_EVALIDATE otherwise, nothing is kept).  An object already present
 * only counts as used.  PX_ELIMIT when it cannot fit the budget even after
 * evicting every unheld object. */
PX_NODISCARD px_status px_fleet_cache_put_file(px_fleet_cache *c, const char *src_path,
                                               const char *name, const char *expect_digest,
                                               char digest_out[65], px_err *err);
/* The evictions since the last call, oldest first (at most 64 kept):
 * [{"digest", "name", "size", "for" (the digest whose arrival made room,
 * or absent when the budget shrank), "incoming_size", "budget", "at"
 * (Unix seconds)}].  New reference; the cache forgets them. */
json_t *px_fleet_cache_evictions_take(px_fleet_cache *c);
/* Holds the object (it will not be evicted until released), marks it
 * used and returns its path (owned: free()).  PX_ENOTFOUND if absent. */
PX_NODISCARD px_status px_fleet_cache_acquire(px_fleet_cache *c, const char *digest, char **path,
                                              px_err *err);
/* Ends one hold of px_fleet_cache_acquire.  A NULL digest, one not held
 * or not resident is a no-op; c must not be NULL. */
void px_fleet_cache_release(px_fleet_cache *c, const char *digest);
bool px_fleet_cache_contains(px_fleet_cache *c, const char *digest);
/* [{"digest","name","size"}] of every resident object (new reference). */
json_t *px_fleet_cache_list(px_fleet_cache *c);
/* Bytes held. */
uint64_t px_fleet_cache_used(px_fleet_cache *c);
/* The cache folder (borrowed). */
const char *px_fleet_cache_dir(const px_fleet_cache *c);

/* ---- Agent ---- */

/* Settings of an agent.  Strings are borrowed for the duration of
 * px_fleet_agent_run.  Zero fields take the defaults. */
typedef struct px_fleet_agent_config {
    const char *server; /* URL; default http://127.0.0.1:7070 */
    /* The join token: needed once, to join; afterwards the node uses the
     * credential it made and keeps in state_dir.  May be NULL then. */
    const char *token;
    const char *state_dir; /* the node credential (0700 folder, 0600 file);
                              default WORK/state */
    const char *ca_file;   /* trust only this CA for an https:// server */
    /* Run every job as this user (name or uid; the agent must be root).
     * An agent running as root without it refuses to start, unless it is
     * "root" itself: a root job can read the node credential. */
    const char *job_user;
    const char *inventory;    /* describe the node from this inventory (marked
                                 emulated) instead of discovering it */
    const char *name;         /* node name; default the inventory's node id or
                                 the discovered one */
    const char *cache_dir;    /* default WORK/cache */
    uint64_t cache_budget;    /* bytes; default 10 GiB */
    const char *work_dir;     /* job folders; default $TMPDIR/plexus-agent-NAME */
    const char *address;      /* address other members reach this node at;
                                 default 127.0.0.1 */
    double health_interval_s; /* service health checks; default 1 */
    int health_failures;      /* failed checks in a row that stop a service;
                                 default 3 */
    /* Stop a job that runs this long (seconds; the job's own time_limit_s
     * when shorter); 0: none. */
    double max_job_time_s;
    /* Set to nonzero (from another thread, or from a signal handler: an
     * atomic_int is lock-free) to stop: running work is killed and the
     * call returns PX_OK.  May be NULL. */
    const atomic_int *stop;
} px_fleet_agent_config;

/* Describes the node, joins the server (once, with the join token) or
 * registers with its node credential, and then heartbeats, takes
 * assignments and runs them until *cfg->stop is set.
 *
 * What a job gets.  A fresh folder (WORK/jobs/JOB-aATTEMPT-rRANK, removed
 * afterwards; owned by the job user), stdin from /dev/null, no descriptor
 * of the agent, and an environment of only PATH, HOME, LANG and TMPDIR
 * (HOME and TMPDIR in the job's folder under a job user), the job's
 * "env", the assignment's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
 * MASTER_PORT, and PLEXUS_JOB_ID, PLEXUS_ATTEMPT, PLEXUS_RANK,
 * PLEXUS_JOB_DIR; PLEXUS_MODEL (a path in the cache) and
 * PLEXUS_MODEL_DIGEST with a model; PORT for a service;
 * PLEXUS_MPI_HOSTFILE with the mpi launcher.  The device visibility
 * variables (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES,
 * HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, GPU_DEVICE_ORDINAL,
 * ZE_AFFINITY_MASK) list only the assigned devices of each vendor, empty
 * for none; the job cannot override them.  torchrun jobs run as
 * `torchrun ARGS --no-python COMMAND`.  Python functions run in the node's
 * python3 through a small runner that imports the file by path and sends
 * the JSON result (or the exception and traceback) back on fd 3.
 *
 * What a job cannot reach.  The agent is not dumpable (PR_SET_DUMPABLE
 * 0: no /proc/PID/environ, mem or ptrace for processes of its uid), holds
 * no secret in its argv or environment, and keeps the node credential in
 * a 0600 file of a 0700 folder; with job_user the job runs under another
 * uid and cannot read it at all.
 *
 * Containment.  Each job runs under a small supervisor process of its
 * own that is the subreaper of everything the job starts (setsid and
 * double forks included) and, where the cgroup v2 hierarchy is writable,
 * in a cgroup of its own; cancelling, a stale attempt, the job's time
 * limit, the agent stopping, the agent dying (the supervisor's parent
 * death signal) and a restarted agent (leftover cgroups) all end every
 * process of the job.  An agent that cannot renew its lease within 3/4
 * of it stops every job before the server can give the work to another
 * node (fencing), and registers again once it can.
 *
 * Unreachable servers are retried (with backoff) rather than fatal, so an
 * agent outlives a server restart.  Returns PX_OK when stopped; PX_EINVAL
 * for bad settings or an inventory that cannot be read (the message
 * names it); PX_EAUTH when the server refuses the join token or the
 * node's credential (revoked). */
PX_NODISCARD px_status px_fleet_agent_run(const px_fleet_agent_config *cfg, px_err *err);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_FLEET_H */
