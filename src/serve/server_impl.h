/*
 * Private declarations of the server: the replicas and their engine
 * threads (server.c), the HTTP side (server_http.c), one completion call
 * from request to response (server_call.c) and the metrics
 * (server_metrics.c).
 */
#ifndef PX_SERVE_SERVER_IMPL_H
#define PX_SERVE_SERVER_IMPL_H

#include "base/common.h"

#include <pthread.h>
#include <stdatomic.h>

#include "plexus/heal.h"
#include "plexus/rt.h"
#include "plexus/serve.h"

struct MHD_Daemon;
struct MHD_Connection;

/* A latency histogram with Prometheus's cumulative buckets (seconds). */
#define PX__SRV_N_BUCKETS 14
typedef struct px__srv_hist {
    uint64_t counts[PX__SRV_N_BUCKETS + 1]; /* the last: +Inf */
    double sum;
    uint64_t n;
} px__srv_hist;

extern const double px__srv_buckets[PX__SRV_N_BUCKETS];

void px__srv_hist_add(px__srv_hist *h, double v);

/* Counters the HTTP threads and the engine threads update (under the
 * server's lock). */
typedef struct px__srv_metrics {
    uint64_t requests[2][6]; /* [api][status class: 2xx, 400, 401, 404, 429, 5xx] */
    uint64_t rejected_queue_full;
    uint64_t disconnects;
    uint64_t prompt_tokens, completion_tokens;
    px__srv_hist ttft, tpot, e2e;
} px__srv_metrics;

#define PX__SRV_WINDOWS   16
#define PX__SRV_WINDOW_NS 1000000000ull

/* One replica of the plan: an engine over a session (one process) or over
 * a healing run's executors (stage workers), on a thread of its own. */
typedef struct px__srv_replica {
    uint32_t index;
    /* How much slower than alone its stages on the host's cores may run
     * before the healing loop calls it a fault (host_stretch). */
    double host_stretch;
    uint32_t max_seqs; /* sequences it runs at once: its batch in the plan, or --max-seqs */
    px_serve *srv;
    px_rt_session *session;
    px_heal_run *heal;
    px_rt_engine *engine;
    pthread_t thread;
    bool started;
    atomic_bool failed;
    atomic_uint active; /* requests given to it and not yet finished */
    /* Under the server's lock, refreshed by the engine thread. */
    char failure[256];
    px_heal_run_summary heal_sum;
    json_t *stages;    /* the stages that run now: device, backend, emulated, pid */
    json_t *incidents; /* plexus.incident/1 records so far (the heal run's copy) */
    px_rt_engine_metrics em;
    /* Its decode steps by rows (px_rt_engine_decode_timing_get) in windows of
     * PX__SRV_WINDOW_NS, so that a run report gives a sample per window
     * and the fit sees their spread: the sums when the open window began
     * (at t_window) and the last windows closed, a ring of n_windows so
     * far.  Under the server's lock; they start again where the stages
     * change. */
    px_rt_engine_decode_timing win_base[PX_RT_ENGINE_ROW_CLASSES];
    px_rt_engine_decode_timing windows[PX__SRV_WINDOWS][PX_RT_ENGINE_ROW_CLASSES];
    uint32_t n_windows;
    uint64_t t_window;
} px__srv_replica;

struct px_serve {
    px_serve_opts o;
    char *model_path;
    char model_name[128];
    char *api_key;
    size_t api_key_len;
    px_rt_model *model;
    px_rt_tokenizer *tok;
    px_serve_chat_template *tmpl; /* NULL: chat is refused, naming the fix */
    char tmpl_error[256];
    int32_t stop_ids[16]; /* the template's end-of-turn tokens */
    uint32_t n_stop_ids;
    uint32_t context;
    px__srv_replica *reps;
    uint32_t n_reps;
    bool emulated; /* some stage runs on an emulated device */
    struct MHD_Daemon *daemon;
    uint16_t port;
    char address[80];
    pthread_mutex_t mu;
    px__srv_metrics m;
    atomic_bool closing;  /* requests end: the HTTP side is shutting down */
    atomic_bool stopping; /* the engine threads end */
    atomic_uint_fast64_t next_seq;
    /* Times the engine woke a waiting HTTP thread: per token of a streamed
     * request, once at the end of any request. */
    atomic_uint_fast64_t http_wakeups;
    uint64_t salt;
    int64_t created;
    uint64_t t_start;
};

/* ---- server.c ---- */
/* The replica to send a request to: the least loaded that has not
 * failed, or NULL; its count of active requests is raised (lower it with
 * px__srv_release when the request ends or is refused). */
px__srv_replica *px__srv_pick(px_serve *s);
void px__srv_release(px__srv_replica *r);
/* The server's state as JSON (for GET /health). */
json_t *px__srv_status_json(px_serve *s);
/* {"object": "list", "data": [records with "replica" added]}. */
json_t *px__srv_incidents_json(px_serve *s);

/* ---- server_http.c ---- */
px_status px__srv_http_start(px_serve *s, px_err *err);
void px__srv_http_stop(px_serve *s);

/* ---- server_call.c ---- */
/* Answers POST /v1/completions or /v1/chat/completions with the body
 * read; queues the response on the connection.  Returns MHD's result. */
int px__srv_call(px_serve *s, struct MHD_Connection *conn, px_serve_api api, const char *body,
                 size_t len);
/* Queues an error in OpenAI's shape. */
int px__srv_reply_error(px_serve *s, struct MHD_Connection *conn, px_serve_api api,
                        const px_serve_error *e);
/* Counts a request by its API and status. */
void px__srv_count(px_serve *s, px_serve_api api, int status);

/* ---- server_metrics.c ---- */
/* Prometheus text exposition of the server's metrics.  Returns owned. */
char *px__srv_metrics_text(px_serve *s);
/* out[c] = now[c] - base[c] for every class of rows: a window's steps. */
void px__srv_window_since(px_rt_engine_decode_timing *out, const px_rt_engine_decode_timing *now,
                          const px_rt_engine_decode_timing *base);

#endif
