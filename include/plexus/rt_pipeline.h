/*
 * plexus/rt_pipeline.h: pipelined execution: the framed transport, stage
 * workers, the executor (its threads and what it does to the process are
 * stated below, under "Threads" and "Process side effects"), fault
 * injection, health and supervision, and the launcher.  Part of
 * plexus/rt.h, which includes it.
 */
#ifndef PLEXUS_RT_PIPELINE_H
#define PLEXUS_RT_PIPELINE_H

#include "plexus/rt_session.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================== */
/* Pipelined execution: the framed transport, stage workers and the   */
/* executor (the emu backend is in plexus/rt_backend.h)                */
/* ================================================================== */
/*
 * A plan runs as one stage worker process per stage (`plexus worker`),
 * each holding its layer range, its KV cache and its backend.  The
 * executor starts them (fork and exec of the plexus binary) and joins
 * them in a ring of framed connections over Unix sockets (default) or TCP
 * on 127.0.0.1:
 *
 *     executor -> stage 0 -> stage 1 -> ... -> stage n-1 -> executor
 *
 * Every message travels the whole ring: a step's tokens go to stage 0,
 * hidden states from stage to stage, the logits from the last stage back
 * to the executor; control messages (sequences joining or leaving, the
 * telemetry request, shutdown) are applied by each stage and passed on,
 * so that their return to the executor is the acknowledgement.  A stage
 * that fails sends an error frame on (naming itself) and exits; a stage
 * that dies or stops answering is found by the executor's timeout and
 * named by its stage index, device and pid.
 *
 *     px_rt_pipeline_spec spec;
 *     px_rt_pipeline_spec_from_plan(plan_json, graph, "plan.json", &spec, &err);
 *     px_rt_executor_opts xo = {.model_path = "stories260K.gguf"};
 *     px_rt_executor *ex;
 *     px_rt_executor_new(&spec, &xo, &ex, &err);
 *     px_rt_pipeline_stats stats;
 *     px_rt_executor_generate(ex, tokenizer, &gen_opts, &stats, &err);
 *     px_rt_executor_free(ex);   // shuts the workers down
 *
 * Threads.  One executor is driven by one thread at a time: its calls
 * (generate, the step and sequence calls, free) must not overlap; distinct
 * executors are independent.  Each executor runs one receive thread of its
 * own, started by px_rt_executor_new and joined by px_rt_executor_free.
 *
 * Process side effects.  px_rt_executor_new forks and execs one child per
 * stage (the plexus binary, or worker_bin) with an empty signal mask and
 * PR_SET_PDEATHSIG = SIGKILL: a worker dies when the *thread* that created
 * it exits, so create an executor from a thread that outlives it.  The
 * children are reaped by px_rt_executor_free (SIGKILL after a 2 s grace);
 * nothing else in the process should wait for them (no waitpid(-1) and no
 * SIGCHLD = SIG_IGN while an executor lives).  Over Unix sockets the
 * executor makes a private folder $TMPDIR/plexus-run-XXXXXX (/tmp when
 * TMPDIR is unset; mode 0700; TMPDIR must leave room for a socket path,
 * about 45 characters) holding one socket per stage, and removes it on
 * free; over TCP it listens on ephemeral ports of 127.0.0.1.  Every
 * descriptor is close-on-exec; writes use MSG_NOSIGNAL, so no SIGPIPE.
 * stdout and stderr are flushed before each fork, and the workers inherit
 * them.
 */

/* The hardware graph (plexus/hw.h) the executor reads emu profiles from. */
typedef struct px_hw_graph px_hw_graph;

/* ------------------------------------------------------------------ */
/* The framed transport                                                */
/* ------------------------------------------------------------------ */

/* A frame: a 24-byte header, then `length` bytes of payload.  The header
 * is little-endian: magic "PXFR" (u32), version (u16), type (u8), flags
 * (u8), sequence number (u64), payload length (u32), CRC-32 (IEEE) of the
 * payload (u32). */
#define PX_RT_FRAME_MAGIC        0x52465850u /* "PXFR" read as little-endian */
#define PX_RT_FRAME_VERSION      2u          /* 2: stage records carry the waits for a core */
#define PX_RT_FRAME_HEADER_BYTES 24u
/* Largest payload any connection accepts; the hello agrees on a lower
 * bound per connection. */
#define PX_RT_FRAME_MAX_PAYLOAD (256u << 20)

typedef enum px_rt_frame_type {
    PX_RT_FRAME_HELLO = 1,     /* connection set-up (JSON) */
    PX_RT_FRAME_HELLO_ACK = 2, /* its answer (JSON) */
    PX_RT_FRAME_STEP = 3,      /* a step: tokens or hidden states */
    PX_RT_FRAME_RESULT = 4,    /* the logits of a step */
    PX_RT_FRAME_SEQ = 5,       /* a sequence joins or leaves */
    PX_RT_FRAME_INFO = 6,      /* each stage appends what it holds */
    PX_RT_FRAME_STATS = 7,     /* each stage appends its op telemetry */
    PX_RT_FRAME_SHUTDOWN = 8,  /* each stage passes it on and exits */
    PX_RT_FRAME_ERROR = 9,     /* a stage failed: the message (text) */
    PX_RT_FRAME_FAULT = 10,    /* a fault to inject (px_rt_fault); the
                                  stage it names applies it */
    PX_RT_FRAME_AUTH = 11,     /* the hello's third message: the connecting
                                  side's proof of the secret (32 bytes) */
} px_rt_frame_type;

/* Flags of a STEP frame: with AUDIT every stage appends its output's
 * first row (see px_rt_step_obs.audit). */
#define PX_RT_STEP_AUDIT 0x01u

typedef struct px_rt_frame_header {
    uint32_t magic;
    uint16_t version;
    uint8_t type;
    uint8_t flags;
    uint64_t seq;
    uint32_t length;
    uint32_t checksum;
} px_rt_frame_header;

/* CRC-32 (IEEE 802.3, reflected, as zlib's crc32) of n bytes, continuing
 * from crc (0 to start). */
uint32_t px_rt_crc32(uint32_t crc, const void *data, size_t n);
/* Writes the header's 24 bytes. */
void px_rt_frame_header_encode(const px_rt_frame_header *h, uint8_t out[PX_RT_FRAME_HEADER_BYTES]);
/* Reads and checks a header: magic, version, a known type, length at
 * most max_payload.  `peer` names the sender in messages.  Errors:
 * PX_EPARSE (wrong magic, unknown type), PX_EUNSUPPORTED (version),
 * PX_ELIMIT (length). */
PX_NODISCARD px_status px_rt_frame_header_decode(const uint8_t in[PX_RT_FRAME_HEADER_BYTES],
                                                 uint32_t max_payload, const char *peer,
                                                 px_rt_frame_header *out, px_err *err);

/* A transport address: "unix:PATH" or "tcp:A.B.C.D:PORT" (a numeric
 * IPv4 address, "localhost" for 127.0.0.1; port 0 when listening picks a
 * free one; 0.0.0.0 listens on every interface).  A connection that leaves
 * the machine must be authenticated: see px_rt_conn_set_secret. */
typedef struct px_rt_listener px_rt_listener;
typedef struct px_rt_conn px_rt_conn;

/* Listens on addr.  Returns owned (px_rt_listener_free, which also
 * removes a Unix socket file).  Errors: PX_EINVAL (a malformed address,
 * naming the accepted forms), PX_EIO (the system's refusal). */
PX_NODISCARD px_status px_rt_listener_new(const char *addr, px_rt_listener **out, px_err *err);
void px_rt_listener_free(px_rt_listener *l); /* NULL is a no-op */
/* The address the listener bound ("tcp:10.0.0.2:41234": the chosen port
 * for "tcp:...:0"); borrowed. */
const char *px_rt_listener_address(const px_rt_listener *l);
/* Waits at most timeout_ms for a peer.  peer names it in messages
 * (copied).  Returns owned (px_rt_conn_free).  PX_ETIMEOUT, PX_EIO. */
PX_NODISCARD px_status px_rt_listener_accept(px_rt_listener *l, int timeout_ms, const char *peer,
                                             px_rt_conn **out, px_err *err);
/* Connects to addr, retrying while nobody listens yet, for at most
 * timeout_ms.  Returns owned.  PX_EINVAL, PX_ETIMEOUT, PX_EIO. */
PX_NODISCARD px_status px_rt_conn_connect(const char *addr, int timeout_ms, const char *peer,
                                          px_rt_conn **out, px_err *err);
void px_rt_conn_free(px_rt_conn *c); /* NULL is a no-op */
/* Checks an address's form.  PX_EINVAL naming it and the accepted forms. */
PX_NODISCARD px_status px_rt_addr_check(const char *addr, px_err *err);
/* Whether addr is well formed and stays on this machine: a Unix socket,
 * or TCP in 127.0.0.0/8. */
bool px_rt_addr_is_local(const char *addr);

/* The secret of a deployment, shared by its executor and stage workers:
 * with one set, the hello is a challenge and response (HMAC-SHA256 over
 * both sides' random nonces and hellos), and a peer without the same
 * secret is refused with PX_EAUTH.  Both ends must have one, or neither.
 * Copied (and wiped when the connection is freed); len 0 clears it.
 * PX_EINVAL for a length outside [PX_RT_SECRET_MIN, PX_RT_SECRET_MAX]. */
#define PX_RT_SECRET_MIN 16
#define PX_RT_SECRET_MAX 64
PX_NODISCARD px_status px_rt_conn_set_secret(px_rt_conn *c, const uint8_t *secret, size_t len,
                                             px_err *err);

/* Every read and write waits at most this long (default 10 s). */
void px_rt_conn_set_timeout(px_rt_conn *c, int timeout_ms);
/* The largest payload this side accepts (default and ceiling
 * PX_RT_FRAME_MAX_PAYLOAD). */
void px_rt_conn_set_max_payload(px_rt_conn *c, uint32_t max_payload);
uint32_t px_rt_conn_max_payload(const px_rt_conn *c);
/* Renames the peer in messages ("stage 2 (local.emu-b, pid 4242)"). */
void px_rt_conn_set_peer(px_rt_conn *c, const char *peer);

/* Faults a connection applies to what it sends, for fault injection:
 * added latency per frame, a bandwidth cap, and a cut (every later send
 * fails and the socket is shut down, as when a link goes away). */
typedef struct px_rt_link_faults {
    uint64_t latency_ns;  /* waited before each frame */
    double bandwidth_bps; /* bytes per second; 0: unlimited */
    bool cut;             /* drop the connection */
    uint64_t cut_after;   /* cut once this many frames were sent (0: off) */
    bool cut_mid_frame;   /* send half of the next frame, then cut */
    /* Intermittent degradation: latency and bandwidth apply only during
     * the first duty * period_s of every period (wall clock, counted from
     * when the faults were set); period_s 0: always. */
    double period_s, duty;
    /* A lost frame is sent again after resend_ns (0: 200 ms), as a
     * retransmission would: loss is the probability per frame. */
    double loss;
    uint64_t resend_ns;
    /* Probability per frame that one payload byte is flipped after the
     * checksum was computed: the receiver must refuse the frame. */
    double flip;
    uint64_t seed; /* of loss and flip */
} px_rt_link_faults;

void px_rt_conn_set_faults(px_rt_conn *c, const px_rt_link_faults *f);

/* Sends one frame (header and payload; payload may be NULL when len is
 * 0).  Errors: PX_ETIMEOUT (the peer stopped reading), PX_EPEER (the
 * connection is closed or cut), PX_ELIMIT (len above the agreed maximum),
 * each naming the peer. */
PX_NODISCARD px_status px_rt_conn_send(px_rt_conn *c, px_rt_frame_type type, uint8_t flags,
                                       const void *payload, uint32_t len, px_err *err);
/* Sends a frame whose payload is the concatenation of n parts. */
PX_NODISCARD px_status px_rt_conn_sendv(px_rt_conn *c, px_rt_frame_type type, uint8_t flags,
                                        const void *const *parts, const uint32_t *lens, uint32_t n,
                                        px_err *err);
/* Receives one frame.  *payload points into the connection's buffer,
 * valid until its next receive.  Errors: PX_ETIMEOUT (nothing within the
 * timeout), PX_EPEER (the peer closed, possibly mid-frame: "truncated
 * frame"), PX_EPARSE (bad magic or checksum), PX_EUNSUPPORTED (version),
 * PX_ELIMIT (length), each naming the peer. */
PX_NODISCARD px_status px_rt_conn_recv(px_rt_conn *c, px_rt_frame_header *h,
                                       const uint8_t **payload, px_err *err);
/* Frames and bytes sent and received so far. */
void px_rt_conn_counters(const px_rt_conn *c, uint64_t *frames_out, uint64_t *bytes_out,
                         uint64_t *frames_in, uint64_t *bytes_in);

/* What one side of a connection says in its hello. */
typedef struct px_rt_hello {
    uint32_t stage;                  /* the sender's stage; UINT32_MAX: the executor */
    uint32_t layer_begin, layer_end; /* the sender's layers */
    uint32_t dim;                    /* hidden size of the model */
    uint32_t max_payload;            /* largest payload the sender accepts */
    char model[80];                  /* "sha256:<hex>" of the model file */
} px_rt_hello;

/* The connecting side: sends its hello, reads the answer, checks the
 * protocol and model, and sets the connection's maximum payload to the
 * lower of both.  With a secret on the connection the hello takes three
 * messages: HELLO (with the client's nonce), HELLO_ACK (the server's
 * nonce and its proof), AUTH (the client's proof); each proof is an
 * HMAC-SHA256 of the other side's hello under the secret, compared in
 * constant time.  Errors: PX_EVALIDATE (another model), PX_EAUTH (a
 * wrong secret, or one side has a secret and the other none), the
 * transport's. */
PX_NODISCARD px_status px_rt_hello_client(px_rt_conn *c, const px_rt_hello *mine,
                                          px_rt_hello *theirs, px_err *err);
/* The accepting side: reads the peer's hello, checks it, answers, and
 * with a secret checks the peer's proof.  Errors: as the client's. */
PX_NODISCARD px_status px_rt_hello_server(px_rt_conn *c, const px_rt_hello *mine,
                                          px_rt_hello *theirs, px_err *err);

/* ------------------------------------------------------------------ */
/* Stage workers                                                       */
/* ------------------------------------------------------------------ */

typedef struct px_rt_worker_opts {
    uint32_t stage;
    const char *model_path;
    uint32_t layer_begin, layer_end; /* [begin, end); may be empty with
                                        embedding or head */
    bool embedding, head;            /* embedding needs begin 0, head end
                                        n_layers (a stage starting at 0
                                        without it follows an embedding-only
                                        stage) */
    const char *backend;             /* "cpu", "emu" or "cuda" */
    const char *emu_profile;         /* JSON text for emu */
    const char *device_name;         /* for messages; may be NULL */
    uint32_t n_threads;
    const char *listen;                           /* where the previous hop connects */
    const char *next;                             /* the next stage, or the executor */
    int timeout_ms;                               /* set-up and every write, and reads
                                                     within a frame; 0: 10 s.  The wait
                                                     for the next frame from upstream is
                                                     10 minutes (an idle executor); a
                                                     dead upstream is seen at once */
    uint32_t max_seqs, context, max_batch_tokens; /* 0: defaults */
    uint32_t kv_blocks, kv_block_size;            /* the session's; 0: defaults */
    /* The deployment's secret (PX_RT_SECRET_MIN to PX_RT_SECRET_MAX
     * bytes; borrowed): both of the worker's connections authenticate
     * with it.  Required to listen on an address that is not local
     * (px_rt_addr_is_local); len 0: none. */
    const uint8_t *secret;
    size_t secret_len;
    /* Once listening, write "listening ADDRESS\n" (the bound address) to
     * standard output, for a launcher that let the worker pick its port. */
    bool announce;
} px_rt_worker_opts;

/* The worker's command line, built and parsed in one place (the
 * executor, launchers and `plexus worker` share it).  argv[0] is the
 * binary, argv[1] "worker"; a secret is never in it: with one,
 * "--secret-stdin" says the worker reads it (hex, one line) from its
 * standard input. */
#define PX_RT_WORKER_MAX_ARGS 48
typedef struct px_rt_worker_argv {
    int argc;
    char *argv[PX_RT_WORKER_MAX_ARGS + 1]; /* owned; NULL-terminated */
} px_rt_worker_argv;

/* Builds the command line of o (bin NULL: "plexus").  Release with
 * px_rt_worker_args_release.  PX_EINVAL (a required field missing),
 * PX_ELIMIT, PX_ENOMEM. */
PX_NODISCARD px_status px_rt_worker_args_build(const px_rt_worker_opts *o, const char *bin,
                                               px_rt_worker_argv *out, px_err *err);
void px_rt_worker_args_release(px_rt_worker_argv *a); /* NULL is a no-op */
/* Parses the options after "worker" (argc, argv: the options only) into
 * o, whose strings borrow argv; *secret_stdin says whether the secret is
 * to be read from standard input.  PX_EINVAL naming the option and the
 * fix (an unknown option, a missing value, a number out of range, a
 * malformed address, a backend other than cpu, emu or cuda). */
PX_NODISCARD px_status px_rt_worker_args_parse(int argc, char *const *argv, px_rt_worker_opts *o,
                                               bool *secret_stdin, px_err *err);

/* A deployment's secret: PX_RT_SECRET_BYTES random bytes (OpenSSL's
 * RAND_bytes).  PX_EINTERNAL. */
#define PX_RT_SECRET_BYTES 32
PX_NODISCARD px_status px_rt_secret_new(uint8_t out[PX_RT_SECRET_BYTES], px_err *err);
/* Writes len bytes as 2*len hex digits and a NUL. */
void px_rt_secret_hex(const uint8_t *secret, size_t len, char *out);
/* Reads a secret from fd: hex digits on one line (up to the newline or
 * the end), PX_RT_SECRET_MIN to PX_RT_SECRET_MAX bytes.  PX_EINVAL
 * (length, a character that is not a hex digit: the secret itself is
 * never quoted), PX_EIO. */
PX_NODISCARD px_status px_rt_secret_read_fd(int fd, uint8_t out[PX_RT_SECRET_MAX], size_t *len,
                                            px_err *err);

/* Runs a stage worker until shutdown: opens the model and a session of
 * its layers, listens, connects to the next hop, accepts the previous
 * one, then serves frames.  A failure is also sent on as an error frame
 * naming the stage.  Errors: the model's, the session's, the
 * transport's. */
PX_NODISCARD px_status px_rt_worker_run(const px_rt_worker_opts *o, px_err *err);

/* ------------------------------------------------------------------ */
/* The executor                                                        */
/* ------------------------------------------------------------------ */

#define PX_RT_MAX_STAGES 16

/* A prediction interval of the plan (seconds); NAN when absent. */
typedef struct px_rt_interval {
    double p50, lo, hi;
} px_rt_interval;

typedef struct px_rt_stage_spec {
    uint32_t layer_begin, layer_end; /* [begin, end); empty for a stage that
                                        holds only the embedding or the head */
    bool embedding, head;            /* the first stage, the last stage */
    char device[64];                 /* inventory global id ("local.emu-a"), or "" */
    char backend[16];                /* "cpu", "emu" or "cuda" */
    bool emulated;
    px_rt_emu_profile emu;        /* for backend "emu" */
    px_rt_interval pred_decode_s; /* per token */
    px_rt_interval pred_prefill_s;
    /* What one more attended cache position (summed over a step's rows)
     * adds to the stage's decode step, by the plan's cost model (its
     * "attention_s_per_position"); 0 or NAN when the plan does not say. */
    double pred_attention_pos_s;
} px_rt_stage_spec;

/* Whether a stage's kernels run on its host's cores (the cpu and emulated
 * backends): stages that share a host's cores slow each other. */
bool px_rt_stage_on_host_cores(const px_rt_stage_spec *s);

typedef struct px_rt_pipeline_spec {
    uint32_t n_stages;
    px_rt_stage_spec stages[PX_RT_MAX_STAGES];
    char plan_id[72];            /* may be "" */
    char model_id[80];           /* the plan's "sha256:<hex>", or "" */
    uint32_t model_blocks;       /* the plan's count, 0 when absent */
    bool emulated;               /* some stage runs on an emulated device */
    uint32_t plan_prompt_tokens; /* the workload the plan predicted for */
    px_rt_interval pred_tpot_s, pred_ttft_s;
    /* The micro-batches the plan priced in flight at once through these
     * stages (its replica's "micro_batches"), 1 to PX_RT_MAX_STAGES; 0
     * when the plan does not say.  The engine keeps that many steps in
     * flight, each with its share of the sequences. */
    uint32_t micro_batches;
} px_rt_pipeline_spec;

/* Reads the stages of a `plexus.plan/1` document (borrowed): layers
 * {first, last} (inclusive blocks; last = first - 1 for a stage with no
 * block, allowed only for the first stage, which holds the embedding, or
 * the last, which holds the head), embedding, head, devices, backend,
 * emulated, predicted; replica 0 only (its "micro_batches", else the
 * plan's "batching"."micro_batches").  With an inventory (borrowed; may
 * be NULL) each device's backend and emu profile come from it; without,
 * an emu stage must carry its profile as "emu".  name labels messages.
 * Errors: PX_EVALIDATE naming the member (JSON pointer) and the fix:
 * gaps or overlaps between stages, an empty stage in the middle, the
 * embedding on a stage other than the first or the head on one other than
 * the last, a device missing from the inventory,
 * an emu device without a profile, more than PX_RT_MAX_STAGES stages. */
PX_NODISCARD px_status px_rt_pipeline_spec_from_plan(const json_t *plan,
                                                     const px_hw_graph *inventory, const char *name,
                                                     px_rt_pipeline_spec *out, px_err *err);

/* The replicas a plan serves (its "replicas" array; 1 without one). */
uint32_t px_rt_plan_replicas(const json_t *plan);
/* The batch replica `replica` of a plan runs at: its own "batch", else the
 * plan's "batching"."batch_per_replica"; 0 when the plan says neither or
 * gives a value outside 1..65536. */
uint32_t px_rt_plan_replica_batch(const json_t *plan, uint32_t replica);
/* The stages of one replica, read as px_rt_pipeline_spec_from_plan reads
 * the first's (replica 0 is exactly that); other replicas carry no
 * per-stage predictions.  Errors: as px_rt_pipeline_spec_from_plan's,
 * and PX_EVALIDATE for a replica the plan does not have. */
PX_NODISCARD px_status px_rt_pipeline_spec_from_plan_replica(const json_t *plan,
                                                             const px_hw_graph *inventory,
                                                             const char *name, uint32_t replica,
                                                             px_rt_pipeline_spec *out, px_err *err);

typedef enum px_rt_transport {
    PX_RT_TRANSPORT_UNIX = 0,
    PX_RT_TRANSPORT_TCP = 1,
} px_rt_transport;

typedef enum px_rt_stage_state {
    PX_RT_STAGE_RUNNING = 0,
    PX_RT_STAGE_STOPPED, /* stopped by a signal (it answers nothing) */
    PX_RT_STAGE_EXITED,  /* exited with a status */
    PX_RT_STAGE_KILLED,  /* killed by a signal */
} px_rt_stage_state;

/* Who starts the stage workers.  By default the executor forks and execs
 * them itself; a launcher lets someone else start them (on other
 * machines: a fleet's agents) while the executor reaches them over TCP
 * and watches them through `health`, which feeds the same fault detection
 * as the process table does for its own workers. */
typedef struct px_rt_launcher {
    void *ctx;
    /* Starts the worker of `stage`.  argv is its command line
     * (px_rt_worker_args_build's, with "--announce"; its "--listen" value
     * is for the launcher to set to an address of the machine it starts
     * the worker on); secret (hex on one line) goes to the worker's
     * standard input.  Returns once the worker listens, with the address
     * it bound ("tcp:A.B.C.D:PORT") in addr and, in *handle, what names
     * this worker to the other calls (one launcher may serve several
     * executors at once: a heal loop's next executor starts before the
     * last one ends).  The executor starts the last stage first: each
     * worker's next hop already listens.  On failure *handle is NULL. */
    px_status (*start)(void *ctx, uint32_t stage, const px_rt_worker_argv *argv,
                       const uint8_t *secret, size_t secret_len, char *addr, size_t addr_cap,
                       void **handle, px_err *err);
    /* The worker's state, without waiting; for EXITED its status and for
     * KILLED its signal in *code, and what happened in detail. */
    px_rt_stage_state (*health)(void *ctx, void *handle, int *code, char *detail, size_t cap);
    /* Sends SIGKILL or SIGSTOP to the worker (fault injection).  May be
     * NULL: such faults are then PX_EUNSUPPORTED. */
    px_status (*signal)(void *ctx, void *handle, int sig, px_err *err);
    /* Ends the worker if it still runs and releases the handle. */
    void (*stop)(void *ctx, void *handle);
    /* How much longer (ns from now) health may take to show that the
     * worker ended, if it ended before now: 0 when health is current, as
     * a process table is; a fleet learns of a lost node only when its
     * agent's watch connection closes or, with no poll open, a poll gap
     * later.  Before it blames a link for a closed connection, the
     * executor waits that long (at most PX_RT_HEALTH_LAG_MAX_NS) for a
     * dead worker to show.  May be NULL: always current. */
    uint64_t (*lag_ns)(void *ctx, void *handle);
} px_rt_launcher;

/* The longest the executor waits on a launcher's lag_ns. */
#define PX_RT_HEALTH_LAG_MAX_NS 10000000000ull

/* A launcher that starts workers on this machine (thread-safe: the
 * executors of several replicas may share one; fork and exec with
 * --announce, the secret on a pipe to their standard input) listening on
 * tcp:HOST:0: what an agent runs for the stages placed on its node.  bin
 * NULL: this process's binary; timeout_ms: the wait for a worker to
 * announce (0: 30 s). */
typedef struct px_rt_local_launcher px_rt_local_launcher;
PX_NODISCARD px_status px_rt_local_launcher_new(const char *bin, const char *host, int timeout_ms,
                                                px_rt_local_launcher **out, px_err *err);
/* Stops every worker it started and frees it.  NULL is a no-op. */
void px_rt_local_launcher_free(px_rt_local_launcher *l);
/* Its interface (borrowed; valid while l lives). */
const px_rt_launcher *px_rt_local_launcher_iface(px_rt_local_launcher *l);
/* The process id of the worker a handle names, or -1. */
int px_rt_local_launcher_pid(px_rt_local_launcher *l, const void *handle);

typedef struct px_rt_executor_opts {
    const char *model_path; /* borrowed; required */
    const char *worker_bin; /* the plexus binary; NULL: /proc/self/exe */
    px_rt_transport transport;
    uint32_t n_threads;        /* per worker; 0: 1 */
    int timeout_ms;            /* per read or write; 0: 10 s */
    uint32_t max_seqs;         /* sequences at once; 0: 8 */
    uint32_t context;          /* 0: the model's */
    uint32_t max_batch_tokens; /* prefill micro-batch rows; 0: the session default */
    uint32_t kv_blocks;        /* each stage's KV cache, as px_rt_session_opts; 0: default */
    uint32_t kv_block_size;    /* 0: default */
    /* Stages started by a launcher (borrowed; NULL: the executor's own
     * processes).  The transport is then TCP, and authenticated. */
    const px_rt_launcher *launcher;
    /* With a launcher: where the last stage connects back, "tcp:A.B.C.D:0"
     * on an interface it reaches (NULL: tcp:127.0.0.1:0). */
    const char *listen;
    /* The deployment's secret (borrowed, copied); NULL: over TCP the
     * executor draws one of its own. */
    const uint8_t *secret;
    size_t secret_len;
} px_rt_executor_opts;

/* An executor runs a pipeline of stage workers and is driven by one thread
 * at a time (the engine's, px_rt_engine, or the caller's); separate
 * executors may run on separate threads at once.  What it does to the
 * process, from px_rt_executor_new to px_rt_executor_free:
 *
 *   - Children: without a launcher it forks and execs one worker per
 *     stage (worker_bin, else this process's binary resolved once from
 *     /proc/self/exe), each with PR_SET_PDEATHSIG = SIGKILL (a worker
 *     dies with the thread that forked it), an empty signal mask, and the
 *     secret on a pipe to its standard input, never in its argv or
 *     environment.  It waits for and reaps only the process ids it
 *     started (never waitpid(-1)); free ends the workers, SIGKILL after
 *     the timeout, and reaps them.  stdio is flushed before each fork.
 *   - Files: the unix transport makes a private folder (mode 0700, by
 *     mkdtemp) under $TMPDIR, or /tmp when TMPDIR is unset or empty, for
 *     the workers' sockets; free removes the sockets and the folder.  The
 *     tcp transport listens on 127.0.0.1 (or opts.listen) instead.
 *   - Threads: one receiver thread per executor reads the last stage's
 *     frames; free joins it.
 *   - Signals: none installed or changed; writes never raise SIGPIPE
 *     (MSG_NOSIGNAL).
 *
 * A process that forks the executor's thread away, or exits without
 * px_rt_executor_free, leaves the workers to PR_SET_PDEATHSIG and the
 * socket folder behind. */
typedef struct px_rt_executor px_rt_executor;

/* Checks the model against the plan (digest and block count), starts one
 * worker per stage and joins them.  spec and opts are copied.  Returns
 * owned (px_rt_executor_free).  Errors: PX_EVALIDATE (the model does not
 * match the plan), PX_EIO (a worker cannot start), the workers' (their
 * error frames), PX_ETIMEOUT / PX_EPEER naming the stage. */
PX_NODISCARD px_status px_rt_executor_new(const px_rt_pipeline_spec *spec,
                                          const px_rt_executor_opts *opts, px_rt_executor **out,
                                          px_err *err);
/* Shuts the workers down (killing any that do not exit within the
 * timeout) and reaps them.  NULL is a no-op. */
void px_rt_executor_free(px_rt_executor *ex);
/* Sets (or clears, f NULL) the faults of the executor's connection to
 * stage 0, for fault injection. */
void px_rt_executor_set_faults(px_rt_executor *ex, const px_rt_link_faults *f);
/* Process id of stage i's worker, or -1 (also for a stage a launcher
 * started: its process is not this machine's to signal). */
int px_rt_executor_stage_pid(const px_rt_executor *ex, uint32_t i);
/* The launcher's handle of stage i's worker, NULL when the executor
 * started it itself. */
void *px_rt_executor_stage_handle(const px_rt_executor *ex, uint32_t i);
/* What stage i reported when the ring was set up: its device's
 * properties (borrowed; NULL for i out of range). */
const px_rt_device_props *px_rt_executor_stage_device(const px_rt_executor *ex, uint32_t i);

/* ------------------------------------------------------------------ */
/* Fault injection, health and supervision                             */
/* ------------------------------------------------------------------ */

/* Faults a running pipeline can be given, for fault injection.  Each
 * names one stage.  KILL and STOP are signals the executor sends to the
 * stage's worker; the rest travel the ring as a FAULT frame (its return
 * is the acknowledgement) and the named stage's worker applies them. */
typedef enum px_rt_fault_kind {
    PX_RT_FAULT_CLEAR = 0, /* the stage clears every fault it applies */
    PX_RT_FAULT_LINK,      /* the stage's outgoing link (to the next stage,
                              or the last stage's to the executor): `link` */
    PX_RT_FAULT_SLOW,      /* every op of the stage slows down towards
                              `factor` with time constant tau_s, as a
                              device throttling when it heats up */
    PX_RT_FAULT_CORRUPT,   /* silent corruption: after each op of `layer`
                              (-1: every op) one output element is moved by
                              `magnitude` times the row's RMS */
    PX_RT_FAULT_CRASH,     /* the worker aborts at its next step */
    PX_RT_FAULT_MEMORY,    /* the worker takes `bytes` more of its device's
                              memory (memory pressure) */
    PX_RT_FAULT_KILL,      /* SIGKILL: the device is lost */
    PX_RT_FAULT_STOP,      /* SIGSTOP: the device hangs */
    PX_RT_FAULT_KIND_COUNT_
} px_rt_fault_kind;

/* "clear", "link", "slow", "corrupt", "crash", "memory", "kill", "stop". */
const char *px_rt_fault_kind_name(px_rt_fault_kind k);

typedef struct px_rt_fault {
    px_rt_fault_kind kind;
    uint32_t stage;
    px_rt_link_faults link; /* LINK */
    double factor;          /* SLOW: final slowdown, >= 1 */
    double tau_s;           /* SLOW: time constant; 0: at once */
    int32_t layer;          /* CORRUPT: the layer, -1: every op */
    double magnitude;       /* CORRUPT: > 0 */
    uint64_t bytes;         /* MEMORY */
    uint64_t seed;          /* CORRUPT: which element */
} px_rt_fault;

/* Injects a fault into the running pipeline.  KILL and STOP return once
 * the process table shows the signal took effect (at most 1 s); the other
 * kinds once the FAULT frame came back around the ring.  A LINK fault
 * replaces the stage's link faults; MEMORY faults add up (at most 8 per
 * stage) until CLEAR, and after MEMORY and CLEAR the stages' descriptions
 * are read again, so px_rt_executor_stage_device shows the new
 * memory_free.  SLOW's extra time shows in the stage's compute and op
 * telemetry.  A stage that cannot hold a MEMORY fault's bytes fails (its
 * error names the device and the bytes) and the pipeline with it.  Call
 * between steps (between generations, or from a supervisor's
 * before_step).  Errors: PX_EINVAL (a stage out of
 * range, a bad parameter, naming it), PX_ESTATE (the pipeline failed
 * before, or the stage already ended), the transport's naming the
 * stage. */
PX_NODISCARD px_status px_rt_executor_inject(px_rt_executor *ex, const px_rt_fault *f, px_err *err);

/* The health of stage i's worker, from the process table (the
 * executor's heartbeat: it never waits).  *detail (may be NULL) gets "killed by
 * signal 9 (Killed)" or "" .  PX_RT_STAGE_RUNNING for i out of range. */
px_rt_stage_state px_rt_executor_stage_health(px_rt_executor *ex, uint32_t i, char *detail,
                                              size_t cap);
/* Kills every stage worker that still runs (its own processes with
 * SIGKILL, launched ones through the launcher), so that freeing a failed
 * executor does not wait for a stopped worker. */
void px_rt_executor_kill_stages(px_rt_executor *ex);
/* The stage a failure of the ring is blamed on (killed or exited first,
 * else stopped), or -1 when none is known. */
int px_rt_executor_culprit(px_rt_executor *ex);
/* Limits each wait for a step's result to ms (0: the executor's timeout),
 * so that a hung stage is found within a deadline the caller derives from
 * the predicted step time. */
void px_rt_executor_set_step_timeout(px_rt_executor *ex, int ms);
/* The spec the executor runs (borrowed). */
const px_rt_pipeline_spec *px_rt_executor_spec(const px_rt_executor *ex);

/* One step of a generation, as the supervisor sees it.  Pointers are
 * valid during the callback only. */
typedef struct px_rt_step_obs {
    uint64_t index; /* steps of this generation so far, from 0 */
    bool prefill;   /* a prefill micro-batch (else one decode token) */
    bool replay;    /* re-run while rebuilding KV caches */
    uint32_t n_seqs, n_rows;
    const uint32_t *prompt;   /* n_seqs: the prompt index of each entry */
    const uint32_t *pos;      /* n_seqs: its first position */
    const uint32_t *n_tokens; /* n_seqs */
    const int32_t *tokens;    /* n_rows: the tokens the step embedded */
    uint64_t tokens_out;      /* tokens produced before this step, all prompts */
    uint64_t t_send_ns;       /* CLOCK_MONOTONIC when the step was sent */
    uint64_t wall_ns;         /* send to result */
    uint32_t n_stages;
    uint64_t compute_ns[PX_RT_MAX_STAGES];
    uint64_t xfer_in_ns[PX_RT_MAX_STAGES]; /* the hop into stage i */
    uint64_t xfer_out_ns;                  /* the last stage to the executor */
    const float *logits;                   /* n_seqs rows of vocab values */
    uint32_t vocab;
    /* Audited steps (PX_RT_STEP_AUDIT): audit[i] is stage i's output row
     * for the step's first row (hidden states, dim values; the last
     * stage's is its logits row, vocab values); NULL otherwise. */
    const float *audit[PX_RT_MAX_STAGES];
    uint32_t audit_len[PX_RT_MAX_STAGES];
    /* Of compute_ns[i], the time stage i's thread waited runnable for a
     * core (the host's other work held them); 0 where not known. */
    uint64_t wait_ns[PX_RT_MAX_STAGES];
    /* Of xfer_in_ns[i], the time stage i's receiving thread waited
     * runnable for a core; 0 where not known. */
    uint64_t xfer_wait_ns[PX_RT_MAX_STAGES];
    /* Of xfer_out_ns, the time the executor's receiving thread waited
     * runnable for a core while the result came in; 0 where not known. */
    uint64_t xfer_out_wait_ns;
} px_rt_step_obs;

/* What a supervisor asks for after a step. */
typedef struct px_rt_step_verdict {
    /* Continue on this executor from now on (the supervisor owns it): the
     * generation rebuilds its state on it (see px_rt_supervisor) and the
     * old one is handed back through `switched`. */
    px_rt_executor *switch_to;
    /* With switch_to: keep only the first `keep_steps` steps (the rest are
     * taken back and generated again: rollback after corruption);
     * UINT64_MAX keeps every step. */
    uint64_t keep_steps;
    /* Audit the next step. */
    bool audit_next;
} px_rt_step_verdict;

/* How a rebuild went. */
typedef struct px_rt_rebuild_info {
    uint64_t steps_replayed;  /* steps re-run to rebuild the KV caches */
    uint64_t tokens_replayed; /* rows those steps carried */
    uint64_t steps_dropped;   /* steps taken back (rollback) */
    uint64_t tokens_dropped;  /* tokens produced by them, taken back */
    uint64_t ns;              /* wall time of the rebuild */
    /* Every replayed step produced the token recorded the first time
     * (the rebuild is bit for bit; when false, the recorded tokens were
     * kept and first_mismatch_step says where they parted). */
    bool identical;
    uint64_t first_mismatch_step;
} px_rt_rebuild_info;

/* A supervisor of one generation (px_rt_generate_opts.supervisor).  Every
 * slot is optional.  Recovery: the generation keeps a log of its steps
 * and the tokens each produced; on a new executor it re-adds its
 * sequences and re-runs the logged steps in the same order and shapes (so
 * that with the same kernels every KV cache is rebuilt bit for bit),
 * forcing the recorded tokens and emitting nothing, then goes on.  An
 * executor to continue on must run the same model with at least the
 * generation's sequences, context and rows per step (else PX_EINVAL).
 * Every executor the generation leaves, the caller's included, comes back
 * through `switched` exactly once (one left during a rebuild comes back
 * when the next rebuild begins); when the generation fails, the ones not
 * handed back stay with whoever made them.  A switch asked for (switch_to)
 * and not made when a step fails is dropped before `recover` is called:
 * that executor never comes back through `switched` and stays the
 * supervisor's, which recover may free. */
struct px_rt_supervisor {
    /* Before each step (obs has index, prefill, the entries and tokens;
     * no timings): inject faults, set deadlines.  Not called for replayed
     * steps.  A status other than PX_OK ends the generation with it. */
    px_status (*before_step)(void *ud, px_rt_executor *ex, const px_rt_step_obs *next, px_err *err);
    /* After each step, replayed ones included (obs.replay).  Fill *v to
     * switch executors or audit the next step. */
    px_status (*after_step)(void *ud, px_rt_executor *ex, const px_rt_step_obs *obs,
                            px_rt_step_verdict *v, px_err *err);
    /* A step failed with st (why says how; ex is unusable).  Return PX_OK
     * with *replacement set to go on there, or an error to end the
     * generation (st and why are kept when it returns st). */
    px_status (*recover)(void *ud, px_rt_executor *failed, px_status st, const px_err *why,
                         px_rt_executor **replacement, px_err *err);
    /* The state was rebuilt on `now` (after recover or switch_to);
     * `before` is the executor left (the supervisor may free it). */
    void (*switched)(void *ud, px_rt_executor *before, px_rt_executor *now,
                     const px_rt_rebuild_info *info);
    /* Tokens of prompt i past its first `kept` were taken back (rollback);
     * they will be produced again through on_token. */
    void (*retracted)(void *ud, uint32_t prompt, uint32_t kept);
    void *ud;
};

/* Per-op telemetry of one stage: totals per (layer, op kind). */
typedef struct px_rt_op_total {
    int32_t layer;
    px_ir_op_kind kind;
    uint64_t count, ns, flops, bytes;
} px_rt_op_total;

typedef struct px_rt_stage_stats {
    uint64_t prefill_steps, prefill_rows, prefill_ns; /* compute in prefill */
    uint64_t decode_steps, decode_ns;                 /* compute in decode */
    uint64_t xfer_in_prefill_ns, xfer_in_decode_ns;   /* into this stage */
    px_rt_op_total *ops; /* owned by the stats (px_rt_pipeline_stats_release) */
    size_t n_ops;
} px_rt_stage_stats;

typedef struct px_rt_pipeline_stats {
    uint32_t n_stages;
    px_rt_stage_stats stages[PX_RT_MAX_STAGES];
    uint64_t xfer_out_prefill_ns, xfer_out_decode_ns; /* last stage -> executor */
    px_rt_generate_stats gen;                         /* end to end, as px_rt_generate's */
    uint64_t ttft_ns;                                 /* first prompt's first token */
    uint64_t decode_steps;
    uint32_t n_prompts;
} px_rt_pipeline_stats;

void px_rt_pipeline_stats_release(px_rt_pipeline_stats *st); /* NULL is a no-op */

/* Generates like px_rt_generate, through the pipeline: prefill in
 * micro-batches of max_batch_tokens rows, then one token per unfinished
 * prompt per step; prompts decode together.  stats (may be NULL) gets the
 * telemetry (release it with px_rt_pipeline_stats_release).  With a
 * supervisor (o->supervisor) the generation may move to other executors
 * (recovery, adaptation): the stats then describe the stages of the last
 * one, and gen totals count every token once (replayed steps are not
 * counted).  On failure the pipeline is unusable; free it.  Errors:
 * px_rt_generate's, and the transport's naming the stage (stage index,
 * device, pid) that died, stopped answering or failed. */
PX_NODISCARD px_status px_rt_executor_generate(px_rt_executor *ex, const px_rt_tokenizer *t,
                                               const px_rt_generate_opts *o,
                                               px_rt_pipeline_stats *stats, px_err *err);

/* The predicted-versus-observed report: per stage, decode time per token
 * and prefill time against the plan's intervals (inside or outside), end
 * to end, and tokens/s; every line naming an emulated device says so.
 * Appends to out.  PX_ENOMEM when any line could not be appended (out
 * then holds part of the report: release it, print none of it). */
PX_NODISCARD px_status px_rt_pipeline_report(const px_rt_pipeline_spec *spec,
                                             const px_rt_executor *ex,
                                             const px_rt_pipeline_stats *st, px_strbuf *out);
/* The same as a JSON object (new reference; NULL when any member could
 * not be allocated: never a document missing part of the report). */
json_t *px_rt_pipeline_report_json(const px_rt_pipeline_spec *spec, const px_rt_executor *ex,
                                   const px_rt_pipeline_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_RT_PIPELINE_H */
