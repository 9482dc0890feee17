/*
 * Private declarations of the agent and client side of the fleet module:
 * the process runner, the Python function runner and the agent's pieces.
 * The server side keeps its own in fleet_impl.h.
 */
#ifndef PX_FLEET_AGENT_IMPL_H
#define PX_FLEET_AGENT_IMPL_H

#include "base/common.h"

#include <stdatomic.h>
#include <sys/types.h>

/* ------------------------------------------------------------------ */
/* Process runner                                                      */
/* ------------------------------------------------------------------ */

/* What to start.  Every pointer is borrowed for the duration of
 * px__proc_spawn only. */
typedef struct px__proc_spec {
    /* The program and its arguments (argv[0] is looked up in PATH), or
     * NULL when `shell` is set. */
    char *const *argv;
    /* A command line run by /bin/sh -c, only when the job asked for it. */
    const char *shell;
    /* The job's own variables, "KEY=VALUE" each; n_env entries. */
    char *const *env;
    size_t n_env;
    /* Device indices the job may see ("0,2"); "" hides every accelerator;
     * NULL leaves the visibility variables unset. */
    const char *visible_devices;
    /* Per-vendor overrides of visible_devices (NULL: visible_devices):
     * NVIDIA (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES), AMD
     * (HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, GPU_DEVICE_ORDINAL) and
     * Intel (ZE_AFFINITY_MASK).  Indices are ordinals among the node's
     * devices of that vendor, so a node with GPUs of two vendors exposes
     * only the assigned ones of each. */
    const char *visible_nvidia, *visible_amd, *visible_intel;
    /* Working folder; NULL keeps the agent's. */
    const char *cwd;
    /* Opens a pipe on the child's fd 3 for a structured result. */
    bool result_fd;
    /* Run as this user (the agent must be root): uid, gid and the
     * supplementary groups (n_groups of them; may be 0). */
    bool set_user;
    uid_t uid;
    gid_t gid;
    const gid_t *groups;
    int n_groups;
    /* A cgroup v2 folder made for this job alone: the job joins it before
     * exec, it is killed through it, and removed when empty.  NULL: none. */
    const char *cgroup;
} px__proc_spec;

typedef struct px__proc px__proc;

/* Which pipe a chunk of output came from. */
typedef enum px__proc_stream {
    PX__PROC_STDOUT = 1,
    PX__PROC_STDERR = 2,
    PX__PROC_RESULT = 3,
} px__proc_stream;

typedef void (*px__proc_sink)(px__proc_stream stream, const char *data, size_t len, void *ud);

/* How a process ended. */
typedef struct px__proc_exit {
    int code;   /* exit status, or -1 when killed by a signal */
    int signal; /* the signal that killed it, 0 when it exited */
} px__proc_exit;

/* Starts the process under a supervisor of its own (see agent_exec.c), in
 * its own process group with a scrubbed environment: only PATH, HOME,
 * LANG and TMPDIR of the agent, then the job's variables, then the device
 * visibility variables (which the job cannot override).  stdin is
 * /dev/null.  A program that cannot be executed fails here (PX_ENOTFOUND,
 * PX_EAUTH or PX_EIO, with errno's text) instead of exiting 127.  Returns
 * owned memory (px__proc_free). */
px_status px__proc_spawn(const px__proc_spec *spec, px__proc **out, px_err *err);
/* Waits up to timeout_ms for output and hands every chunk read to sink.
 * Returns true while any pipe is still open. */
bool px__proc_pump(px__proc *p, int timeout_ms, px__proc_sink sink, void *ud);
/* Non-blocking: whether the main process has ended (reaped into *ex). */
bool px__proc_done(px__proc *p, px__proc_exit *ex);
/* Sends SIGTERM, SIGINT or SIGHUP to every process of the job, or
 * (SIGKILL) kills them all at once. */
void px__proc_signal(px__proc *p, int sig);
/* Ends the job: SIGTERM to every process, then after grace_ms (or as soon
 * as the leader is gone) SIGKILL to whatever is left, descendants that
 * left the process group included; returns when none is left. */
void px__proc_stop(px__proc *p, int grace_ms);
/* The job's first process. */
pid_t px__proc_pid(const px__proc *p);
/* Kills what is left of the job, closes the pipes, removes its cgroup,
 * frees.  NULL is a no-op. */
void px__proc_free(px__proc *p);
/* Ends processes that became the agent's children without being its own
 * supervisors (they escaped a supervisor killed from outside, and came to
 * the agent as their subreaper).  Returns how many. */
size_t px__proc_sweep(void);
/* Children the agent starts itself (stage workers): sweeps stop while one
 * starts (pause true, then false), and a kept pid is never swept. */
void px__proc_sweep_pause(bool pause);
void px__proc_keep(pid_t pid, bool keep);
/* Runs to completion with a time limit (ms, 0: none), collecting stdout
 * (bounded by max_out bytes, the rest dropped) and the exit status.
 * Returns PX_ETIMEOUT after killing the group when the limit passes. */
px_status px__proc_run_capture(const px__proc_spec *spec, int limit_ms, size_t max_out, char **out,
                               px__proc_exit *ex, px_err *err);

/* ---- agent_shim.c: the supervisor of one job (fork side, AS-safe) ---- */

/* What the supervisor needs, prepared by px__proc_spawn before the fork. */
typedef struct px__shim_args {
    pid_t agent;
    pid_t shim; /* set by the shim for its job */
    const char *const *candidates;
    size_t n_candidates;
    char *const *argv;
    char *const *env;
    const char *cwd;
    int out_w, err_w, res_w, exec_w, status_w;
    int cgroup_procs_fd, cgroup_kill_fd;
    bool set_user;
    uid_t uid;
    gid_t gid;
    const gid_t *groups;
    int n_groups;
} px__shim_args;

/* The supervisor: forks the job and runs until the job's tree is gone. */
_Noreturn void px__shim_main(const px__shim_args *a);
/* The parent of pid from /proc/PID/stat, or -1 (async-signal-safe). */
pid_t px__shim_parent_of(pid_t pid);
/* Decimal digits at s (end gets the first other character). */
long px__shim_parse_long(const char *s, const char **end);

/* ------------------------------------------------------------------ */
/* Python function runner                                              */
/* ------------------------------------------------------------------ */

/* Fills argv (8 slots) to run FUNCTION of the Python file at script_path
 * with the JSON arguments in args_path, using the interpreter `python`.
 * The runner writes {"ok": true, "result": ...} or {"ok": false,
 * "error": "...", "traceback": "..."} on fd 3 (set result_fd).  An object
 * of arguments is passed as keywords, anything else as one positional
 * argument; args_path "-" calls the function without arguments.  Borrows
 * every string. */
void px__python_argv(const char *python, const char *script_path, const char *function,
                     const char *args_path, const char *argv[8]);

/* ------------------------------------------------------------------ */
/* The agent                                                           */
/* ------------------------------------------------------------------ */

#include "plexus/fleet.h"

#include <pthread.h>

typedef struct px__agent px__agent;

/* One member of a job this agent runs (one assignment). */
typedef struct px__agent_job {
    struct px__agent_job *next;
    px__agent *agent;
    char job[128];
    int attempt;
    int rank;
    json_t *assignment; /* owned */
    pthread_t thread;
    bool thread_started;
    atomic_int stop_requested; /* the server said stop: cancelled or stale */
    atomic_int done;           /* the thread has finished; join and drop */
    bool started;              /* the server accepted the start report */
    int64_t listed;            /* the running list's number when it joined it */
} px__agent_job;

/* How many (job, attempt, rank) keys of finished work are remembered, so
 * a repeated assignment of work already done is not run twice. */
#define PX__AGENT_RECENT 1024

/* A job stops once this share of the lease has passed since the last
 * renewal was sent: the server gives the work away only after the whole
 * lease, so the job is gone first (fencing). */
#define PX__AGENT_FENCE_SHARE 0.75

#define PX__AGENT_IDLE_CLIENTS 8 /* jobs' clients kept between jobs */

struct px__agent {
    const px_fleet_agent_config *cfg;
    char *node_id;
    char *work_dir;
    char *state_dir;      /* the node credential */
    char *python;         /* interpreter for Python jobs */
    json_t *registration; /* body of POST /v1/agent/register (owned) */
    bool emulated;
    px_fleet_cache *cache;
    double heartbeat_s, lease_s;
    atomic_int stopping; /* read by every thread, set by any */
    atomic_int revoked;  /* the server refused the node's credential */
    /* Fencing: jobs stop past this monotonic time (ns), 3/4 of a lease
     * after the last renewal was sent; `fenced` is set when that stopped a
     * job, so that the agent registers again once it reaches the server. */
    _Atomic uint64_t fence_ns;
    atomic_int fenced;
    pthread_mutex_t mu; /* guards jobs, recent, running_seq and registration */
    px__agent_job *jobs;
    /* The running list's number, raised each time a job joins it; starts
     * from the wall clock in ms so that it keeps growing across restarts. */
    int64_t running_seq;
    char recent[PX__AGENT_RECENT][160];
    size_t n_recent;
    /* The node credential (agent_cred.c): every client takes the current
     * one before a request (px__agent_sync), so a rotation reaches them. */
    pthread_mutex_t cred_mu;
    char cred[320];
    atomic_uint cred_gen;
    /* The server that last answered the assignments poll (under cred_mu):
     * a job's client starts there rather than at the first URL, which
     * may be a standby that would only send it on. */
    char server_hint[256];
    /* Jobs' clients between jobs (under cred_mu), so that the next job's
     * reports go over the connection (and TLS session) the last one
     * left open rather than a new handshake; each with its credential
     * generation. */
    px_fleet_client *idle[PX__AGENT_IDLE_CLIENTS];
    unsigned idle_gen[PX__AGENT_IDLE_CLIENTS];
    int n_idle;
    /* The job user (agent_contain.c). */
    bool set_user;
    uid_t uid;
    gid_t gid;
    gid_t *groups;
    int n_groups;
    /* Folder of this agent's job cgroups (cgroup v2), or NULL. */
    char *cgroup_root;
    /* agent_models.c: the models deployments planned here need (the last
     * heartbeat reply's "models", under mu) and a count of its changes. */
    json_t *models_wanted;
    atomic_uint models_gen;
    /* Set to have the heartbeat thread report at once (a model came). */
    atomic_int heartbeat_now;
    /* agent_stages.c: stage orders not yet taken, and the ends of workers
     * not yet reported (under mu). */
    json_t *stage_orders;
    json_t *stage_ended;
};

/* ---- agent_stages.c: stage workers of deployments ---- */

/* Queues the "stages" orders of an assignments reply (borrowed). */
void px__agent_stages_order(px__agent *a, const json_t *orders);
/* The thread that starts, stops and watches them (arg: the agent). */
void *px__agent_stages_main(void *arg);
/* The ends not yet reported (new reference), and those the server took. */
json_t *px__agent_stages_ended(px__agent *a);
void px__agent_stages_acked(px__agent *a, const json_t *sent);

/* ---- agent_models.c: the models of deployments planned on this node ---- */

/* Records the "models" of a heartbeat reply (borrowed). */
void px__agent_models_want(px__agent *a, const json_t *models);
/* Fetches a model into the cache unless it is there (its digest
 * verified) and holds it once more (px_fleet_cache_release). */
px_status px__agent_fetch_and_hold(px__agent *a, px_fleet_client *c, const char *digest,
                                   const char *name, px_err *err);
/* The thread that fetches, verifies and holds them (arg: the agent). */
void *px__agent_models_main(void *arg);

/* ---- agent_cred.c: joining, the node credential and its rotation ---- */

/* Makes STATE (0700) and reads STATE/credential when there is one.  A
 * credential made for another node name is refused with the fix. */
px_status px__agent_cred_setup(px__agent *a, px_err *err);
/* A client of the server with the node's current credential (or the join
 * token before there is one) and the CA.  Owned: px_fleet_client_free. */
px_status px__agent_client(px__agent *a, px_fleet_client **out, unsigned *gen, px_err *err);
/* A client for one job's reports: one a finished job gave back (its
 * credential brought up to date, started at the server hint) or else a new
 * one (px__agent_client).  Give it back with px__agent_job_client_done,
 * which keeps it for the next job (at most PX__AGENT_IDLE_CLIENTS, the
 * rest freed); px__agent_idle_clients_free frees those kept.  A client is
 * used by one thread at a time: taken, used, given back. */
px_status px__agent_job_client(px__agent *a, px_fleet_client **out, unsigned *gen, px_err *err);
void px__agent_job_client_done(px__agent *a, px_fleet_client *c, unsigned gen);
void px__agent_idle_clients_free(px__agent *a);
/* Gives c the current credential when it changed since *gen. */
void px__agent_sync(px__agent *a, px_fleet_client *c, unsigned *gen);
/* Joins (first time, or after the server forgot the node) or registers
 * again, listing the work that still runs; sets the lease and the
 * fencing deadline.  Returns the stop list of the reply (new reference,
 * may be NULL).  PX_EAUTH when the credential is refused for good
 * (revoked), PX_EEXIST when the name belongs to another credential. */
px_status px__agent_register(px__agent *a, px_fleet_client *c, json_t **stop, px_err *err);
/* Makes the node's next credential and has the server accept it; from
 * then on every client uses it. */
px_status px__agent_rotate(px__agent *a, px_fleet_client *c, px_err *err);
/* Moves the fencing deadline after a renewal sent at sent_ns. */
void px__agent_renewed(px__agent *a, uint64_t sent_ns);
/* Whether the lease may have lapsed on the server: work must stop. */
bool px__agent_fence_passed(px__agent *a);

/* ---- agent_contain.c: what keeps jobs apart from the agent ---- */

/* The job user, the cgroup folder (leftovers of an earlier run killed),
 * the agent not dumpable and the subreaper of what its jobs leave. */
px_status px__agent_contain_setup(px__agent *a, px_err *err);
/* Whether the job user can run program: it must search every folder on
 * the way, as given and as resolved, and execute the file.  A bare name
 * is looked up on the agent's PATH as the job user's own lookup would,
 * past the entries it cannot run (pyenv's shims under /root first, then
 * /usr/bin/python3); *resolved (may be NULL) then gets the path found
 * (owned, free it), NULL otherwise.  PX_OK when jobs run as the agent's
 * own user, or when program is not found at all (starting it says so);
 * else PX_EINVAL naming what (e.g. "the Python interpreter"), the path,
 * the folder or file in the way and the fix. */
px_status px__agent_job_user_may_run(const px__agent *a, const char *program, const char *what,
                                     char **resolved, px_err *err);
/* Makes the cgroup of one job ("JOB-aA-rR"); *path is owned (NULL when
 * the agent has no cgroups). */
px_status px__agent_job_cgroup(px__agent *a, const char *key, char **path, px_err *err);
/* Makes a job's folder, owned by the job user. */
px_status px__agent_job_dir(px__agent *a, const char *path, px_err *err);
/* Fills the identity fields of a process spec with the job user's. */
void px__agent_as_job_user(const px__agent *a, px__proc_spec *spec);
void px__agent_contain_release(px__agent *a);

/* Describes the node (inventory or discovery) into a->registration,
 * a->node_id, a->python and a->emulated.  Messages name the inventory. */
px_status px__agent_describe(px__agent *a, px_err *err);
/* The "live" member of a heartbeat: free memory, load, GPU figures from
 * nvidia-smi when the node is real and has it.  New reference. */
json_t *px__agent_live(px__agent *a);
/* The digests the cache holds, for register and heartbeat (new reference). */
json_t *px__agent_resident(px__agent *a);
/* The "running" array for register and heartbeat (new reference): every
 * job taken and not stopped whose thread has not finished, which lists it
 * until the server has acknowledged its end.  seq (may be NULL) gets the
 * list's number: each job's start report names the number from which it
 * is listed, so the server can tell a list taken before it. */
json_t *px__agent_running(px__agent *a, int64_t *seq);
/* Marks work named in a stop list for stopping. */
void px__agent_apply_stop(px__agent *a, const json_t *stop);
/* Runs one assignment in the calling thread: prepares the folder, starts
 * the process, streams output, checks a service's health, uploads
 * artifacts and reports.  Entry point of a job thread. */
void *px__agent_job_main(void *job);
/* The key of an assignment, "job/attempt/rank", as px__agent_seen knows it. */
void px__agent_job_key(const char *job, long long attempt, long long rank, char *buf, size_t n);
/* Whether the key was taken before; marks it.  Caller holds a->mu. */
bool px__agent_seen(px__agent *a, const char *key);
/* Unmarks a key: work that never started (its start report was refused
 * or never sent) is taken again when the server repeats the assignment.
 * Caller holds a->mu. */
void px__agent_forget(px__agent *a, const char *key);

/* Service health: one check.  HTTP GET on 127.0.0.1:port/path (2xx is
 * healthy) or a command (exit 0 is healthy, run as `as` says: the job's
 * user and folder), each bounded in time.  Writes a short reason for an
 * unhealthy result. */
bool px__agent_health_check(const json_t *service, const px__proc_spec *as, char *why, size_t n);

/* ---- client_http.c, for the agent ---- */

/* Makes url (one of the servers the client was given) the one it uses
 * first; any other url changes nothing. */
void px__client_start_at(px_fleet_client *c, const char *url);
/* Sends the open file fd (len bytes from its start) as the body. */
px_status px__client_send_fd(px_fleet_client *c, const char *method, const char *path, int fd,
                             uint64_t len, long *http_status, json_t **reply, px_err *err);

/* Validates an artifact name (relative, no "..", no NUL, no backslash)
 * and opens it under the folder dir_fd without following any link.
 * Returns the fd, or -1 with a reason in err. */
int px__agent_open_artifact(int dir_fd, const char *name, size_t name_len, px_err *err);

#endif
