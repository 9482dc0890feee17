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
 *                                    .cluster_token = ctok,
 *                                    .api_token = utok};
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
px_status px_fleet_version_match(const char *version, const char *spec, bool *out, px_err *err);

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
px_status px_fleet_sched_new(px_fleet_sched **out, px_err *err);
/* Frees the scheduler, its nodes and allocations.  NULL is a no-op.
 * Explanations made by it must not be turned into JSON afterwards. */
void px_fleet_sched_free(px_fleet_sched *s);

/* Adds a node, or replaces the description of the node of the same name
 * (keeping its allocations), from a registration body (the JSON of
 * POST /v1/agent/register; borrowed).  The node starts online.  Writes the
 * node's index to *index (may be NULL).  PX_EINVAL with the JSON pointer
 * of the bad member; PX_ELIMIT past 1,000,000 nodes or 64 devices. */
px_status px_fleet_sched_add_node(px_fleet_sched *s, const json_t *reg, size_t *index, px_err *err);
/* Looks up a node by name; PX_ENOTFOUND if absent. */
px_status px_fleet_sched_find_node(const px_fleet_sched *s, const char *name, size_t *index);
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
px_status px_fleet_request_compile(const json_t *spec, px_fleet_request **out, px_err *err);
void px_fleet_request_free(px_fleet_request *r);
/* Members of the job (spec "nodes"). */
int px_fleet_request_members(const px_fleet_request *r);

/* Filters and scores every node for the request and, when enough nodes fit
 * (one per member), allocates CPUs, memory and devices on them under
 * `owner` (a job id, copied).  Always returns the explanation of the
 * decision in *out (owned; px_fleet_explanation_free), placed or not.
 * Returns PX_OK either way; PX_ENOMEM on allocation failure. */
px_status px_fleet_sched_place(px_fleet_sched *s, const px_fleet_request *r, const char *owner,
                               px_fleet_explanation **out, px_err *err);
/* Releases everything allocated under owner on every node.  Returns how
 * many members were released. */
size_t px_fleet_sched_release(px_fleet_sched *s, const char *owner);
/* Re-creates an allocation (after a server restart) of member `rank` of
 * owner on node i with the given device ids (borrowed JSON array of
 * strings, may be NULL).  PX_ESTATE when the devices are taken. */
px_status px_fleet_sched_restore(px_fleet_sched *s, const px_fleet_request *r, const char *owner,
                                 size_t node, const json_t *devices, px_err *err);

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
void px_fleet_explanation_free(px_fleet_explanation *e);

/* ------------------------------------------------------------------ */
/* Server                                                              */
/* ------------------------------------------------------------------ */

typedef struct px_fleet_server px_fleet_server;

/* Settings of a server.  Strings are borrowed for the duration of
 * px_fleet_server_start.  Zero fields take the defaults. */
typedef struct px_fleet_server_options {
    const char *listen;        /* "HOST:PORT"; port 0 picks a free one; default "127.0.0.1:7070" */
    const char *data_dir;      /* state folder, created if absent; default "./plexus-data" */
    const char *token_file;    /* "agent TOKEN" / "user TOKEN [name]" lines; may be NULL */
    const char *cluster_token; /* an agent token to accept besides the file's; may be NULL */
    const char *api_token;     /* a user token to accept besides the file's; may be NULL */
    double lease_s;            /* heartbeat lease; default 10 */
    double heartbeat_s;        /* interval agents are told to use; default lease_s / 4 */
    double restart_backoff_s;  /* first service restart delay; default 1 */
    size_t max_body;           /* JSON and log chunk bodies; default 1 MiB */
    size_t max_upload;         /* artifacts and blobs; default 64 MiB */
    unsigned max_connections;  /* default 512 */
} px_fleet_server_options;

/* Opens (or creates and migrates) DATA/fleet.db, loads tokens, nodes and
 * jobs, and starts serving.  When neither a token file nor tokens are
 * given and DATA/tokens does not exist, generates one agent and one user
 * token and writes them there (mode 0600); they are never logged.
 * Returns owned memory (px_fleet_server_stop).  Status: PX_EIO (the data
 * folder or database), PX_EINVAL (options, token file), PX_EPEER (the
 * address could not be bound). */
px_status px_fleet_server_start(const px_fleet_server_options *opt, px_fleet_server **out,
                                px_err *err);
/* The port the server listens on (useful with port 0). */
uint16_t px_fleet_server_port(const px_fleet_server *srv);
/* "http://HOST:PORT" (borrowed; valid until stop). */
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
 *     px_fleet_agent_config cfg = {.server = url, .token = cluster_token,
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
px_status px_fleet_client_new(const char *server_url, const char *token, px_fleet_client **out,
                              px_err *err);
/* Frees the client and wipes its copy of the token.  NULL is a no-op. */
void px_fleet_client_free(px_fleet_client *c);
/* Limit on each whole request in milliseconds (default 30,000). */
void px_fleet_client_set_timeout(px_fleet_client *c, int timeout_ms);
/* Makes requests end early (PX_ETIMEOUT) once *flag becomes nonzero, so a
 * long poll does not delay a shutdown.  flag is borrowed (read from the
 * calling thread while a request runs; another thread or a signal handler
 * may set it); NULL clears. */
void px_fleet_client_set_abort(px_fleet_client *c, const atomic_int *flag);
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
px_status px_fleet_client_call(px_fleet_client *c, const char *method, const char *path,
                               const json_t *body, long *http_status, json_t **reply, px_err *err);
/* Like px_fleet_client_call with raw bytes as the body (borrowed). */
px_status px_fleet_client_send(px_fleet_client *c, const char *method, const char *path,
                               const void *data, size_t len, long *http_status, json_t **reply,
                               px_err *err);
/* Like px_fleet_client_send with the content of a regular file, streamed. */
px_status px_fleet_client_send_file(px_fleet_client *c, const char *method, const char *path,
                                    const char *file, long *http_status, json_t **reply,
                                    px_err *err);
/* GETs path into the file dest (written to dest.part.PID, renamed when
 * complete; never follows a link).  Statuses as px_fleet_client_call. */
px_status px_fleet_client_download(px_fleet_client *c, const char *path, const char *dest,
                                   long *http_status, px_err *err);
/* Percent-encodes s for one path segment.  Returns owned memory (free()),
 * NULL on allocation failure. */
char *px_fleet_url_escape(const char *s);

/* Validates a Python function target "FILE.py:FUNCTION" (what `plexus
 * submit --python` takes): a non-empty path ending in .py and a Python
 * identifier.  On success *file and *function are owned by the caller
 * (free()); on failure both are NULL and err says what is wrong.
 * Returns PX_OK, PX_EINVAL or PX_ENOMEM. */
px_status px_fleet_python_target_parse(const char *target, char **file, char **function,
                                       px_err *err);

/* ---- Content-addressed cache ---- */

/* Models and artifacts by SHA-256 under DIR/objects/<digest>, an index of
 * sizes and last use in DIR/index.json, a size budget kept by evicting the
 * least recently used objects that no job holds.  Thread-safe. */
typedef struct px_fleet_cache px_fleet_cache;

/* Opens (creating) the cache in dir with a budget in bytes.  Rebuilds the
 * index from the objects when it is missing or damaged and evicts down to
 * the budget.  Returns owned memory (px_fleet_cache_free).  PX_EINVAL for
 * an empty dir or a zero budget, PX_EIO when the folder cannot be made. */
px_status px_fleet_cache_open(const char *dir, uint64_t budget_bytes, px_fleet_cache **out,
                              px_err *err);
void px_fleet_cache_free(px_fleet_cache *c);
/* Copies the file at src_path into the cache under its SHA-256 (written to
 * digest_out, may be NULL), recording `name` (borrowed; may be NULL).
 * With expect_digest (may be NULL) the content must have that digest
 * (PX_EVALIDATE otherwise, nothing is kept).  An object already present
 * only counts as used.  PX_ELIMIT when it cannot fit the budget even after
 * evicting every unheld object. */
px_status px_fleet_cache_put_file(px_fleet_cache *c, const char *src_path, const char *name,
                                  const char *expect_digest, char digest_out[65], px_err *err);
/* Holds the object (it will not be evicted until released), marks it
 * used and returns its path (owned: free()).  PX_ENOTFOUND if absent. */
px_status px_fleet_cache_acquire(px_fleet_cache *c, const char *digest, char **path, px_err *err);
/* Ends one hold of px_fleet_cache_acquire. */
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
    const char *server;       /* URL; default http://127.0.0.1:7070 */
    const char *token;        /* the cluster token (required) */
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
    /* Set to nonzero (from another thread, or from a signal handler: an
     * atomic_int is lock-free) to stop: running work is killed and the
     * call returns PX_OK.  May be NULL. */
    const atomic_int *stop;
} px_fleet_agent_config;

/* Describes the node, registers with the server, and then heartbeats,
 * takes assignments and runs them until *cfg->stop is set.
 *
 * What a job gets.  Its own process group in a fresh folder
 * (WORK/jobs/JOB-aATTEMPT-rRANK, removed afterwards), stdin from
 * /dev/null, no descriptor of the agent, and an environment of only PATH,
 * HOME, LANG and TMPDIR, the job's "env", the assignment's RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, and PLEXUS_JOB_ID,
 * PLEXUS_ATTEMPT, PLEXUS_RANK, PLEXUS_JOB_DIR; PLEXUS_MODEL (a path in the
 * cache) and PLEXUS_MODEL_DIGEST with a model; PORT for a service;
 * PLEXUS_MPI_HOSTFILE with the mpi launcher.  The device visibility
 * variables (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES,
 * HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, GPU_DEVICE_ORDINAL,
 * ZE_AFFINITY_MASK) list only the assigned devices of each vendor, empty
 * for none; the job cannot override them.  torchrun jobs run as
 * `torchrun ARGS --no-python COMMAND`.  Python functions run in the node's
 * python3 through a small runner that imports the file by path and sends
 * the JSON result (or the exception and traceback) back on fd 3.  The job
 * is killed with its group when cancelled, when its attempt goes stale or
 * when the agent stops or dies.  Unreachable
 * servers are retried (with backoff) rather than fatal, so an agent
 * outlives a server restart.  Returns PX_OK when stopped; PX_EINVAL for
 * bad settings or an inventory that cannot be read (the message names
 * it); PX_EAUTH when the server refuses the token. */
px_status px_fleet_agent_run(const px_fleet_agent_config *cfg, px_err *err);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_FLEET_H */
