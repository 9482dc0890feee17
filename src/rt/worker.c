/*
 * The stage worker: one process per pipeline stage.  It holds a session
 * over its layers (its weights, its KV cache, its backend), sits between
 * the previous hop (the executor or the previous stage) and the next (the
 * next stage or the executor), and serves frames until shutdown: steps
 * are run and passed on, control frames are applied and passed on (a
 * FAULT frame naming this stage is applied first: worker_fault.c), and
 * its own failure is passed on as an error frame that names it.
 */
#include "base/common.h"

#include <unistd.h>

#include "rt/pipeline_impl.h"
#include "rt/worker_fault.h"

/* How long a worker waits for the next frame from upstream: between
 * steps the executor may be idle (a caller between generations), and a
 * dead upstream is seen at once as a closed connection. */
#define IDLE_TIMEOUT_MS (10 * 60 * 1000)

typedef struct worker {
    const px_rt_worker_opts *o;
    px_rt_model *model;
    px_rt_session *s;
    px_rt_session_info info;
    px_rt_listener *listener;
    px_rt_conn *up, *down;
    char label[160]; /* "stage 1 (local.emu-a, pid 4242)" */
    px_rt_seq_step *steps;
    px__rt_stats_entry *tel; /* per (layer slot, op kind) */
    size_t n_tel;
    uint8_t *scratch; /* INFO and STATS replies */
    size_t scratch_cap;
    bool relayed; /* the failure is another stage's, passed on */
    px__rt_wfault fault;
    int schedstat; /* the stepping thread's /proc/thread-self/schedstat;
                      -1: none, -2: not opened yet */
} worker;

/* The stepping thread's wait for a core so far (px__rt_thread_wait_ns):
 * a step's share of it is time the host's other work held the cores, not
 * time the device or the stage took. */
static uint64_t thread_wait_ns(worker *w)
{
    return px__rt_thread_wait_ns(&w->schedstat);
}

/* Telemetry slots: layer -1 (embedding and head) then the stage's layers. */
static void on_op(const px_rt_op_record *rec, void *ud)
{
    worker *w = ud;
    /* A slowed device takes longer for every op; telemetry sees it. */
    uint64_t extra = px__rt_wfault_after_op(&w->fault, rec->ns);
    int64_t slot = rec->layer < 0 ? 0 : (int64_t)rec->layer - w->o->layer_begin + 1;
    if (slot < 0 || (uint32_t)rec->kind >= PX_IR_OP_COUNT_)
        return;
    size_t i = (size_t)slot * PX_IR_OP_COUNT_ + rec->kind;
    if (i >= w->n_tel)
        return;
    px__rt_stats_entry *e = &w->tel[i];
    e->layer = rec->layer;
    e->kind = rec->kind;
    e->count++;
    e->ns += rec->ns + extra;
    e->flops += rec->flops;
    e->bytes += rec->bytes;
}

static px_status model_digest(const char *path, char out[80], px_err *err)
{
    px_digest d;
    char hex[65];
    px_status st = px_sha256_file(path, &d, err);
    if (st)
        return st;
    px_digest_hex(&d, hex);
    snprintf(out, 80, "sha256:%s", hex);
    return PX_OK;
}

static px_status setup(worker *w, px_err *err)
{
    const px_rt_worker_opts *o = w->o;
    snprintf(w->label, sizeof w->label, "stage %u (%s, pid %d)", o->stage,
             o->device_name && o->device_name[0] ? o->device_name : o->backend, (int)getpid());
    px_status st = px_rt_model_open(o->model_path, &w->model, err);
    if (st)
        return st;
    const px_ir_hparams *hp = px_rt_model_hparams(w->model);
    bool empty = o->layer_begin == o->layer_end;
    if (o->layer_end > hp->n_layers || o->layer_begin > o->layer_end ||
        (empty && !o->embedding && !o->head))
        return px_err_set(err, PX_EINVAL,
                          "layers [%u, %u): %s has %u layers (0-%u); a stage without "
                          "layers must hold the embedding or the head",
                          o->layer_begin, o->layer_end, o->model_path, hp->n_layers,
                          hp->n_layers ? hp->n_layers - 1 : 0);
    /* A stage that starts at layer 0 without the embedding follows an
     * embedding-only stage; one that ends at the last layer without the
     * head precedes a head-only stage. */
    if ((o->embedding && o->layer_begin != 0) || (o->head && o->layer_end != hp->n_layers))
        return px_err_set(err, PX_EINVAL,
                          "layers [%u, %u): --embedding goes with a stage that "
                          "starts at layer 0 and --head with one that ends after layer %u",
                          o->layer_begin, o->layer_end, hp->n_layers ? hp->n_layers - 1 : 0);
    if (!strcmp(o->backend, "emu") && (st = px_rt_emu_register(err)) != PX_OK)
        return st;
    px_rt_device *dev = NULL;
    px_rt_device_opts dopts = {.n_threads = o->n_threads ? o->n_threads : 1,
                               .profile = o->emu_profile};
    if (!strcmp(o->backend, "cuda")) {
        /* Discovery numbers GPUs as nvidia-smi does (PCI bus order); the
         * CUDA runtime then numbers them the same. */
        setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
        dopts.ordinal = px__rt_cuda_ordinal(o->device_name);
    }
    if ((st = px_rt_device_open(o->backend, &dopts, &dev, err)) != PX_OK)
        return st;
    px_rt_session_opts so = {.device = dev,
                             .max_seqs = o->max_seqs ? o->max_seqs : 8,
                             .context = o->context,
                             .max_batch_tokens = o->max_batch_tokens,
                             .kv_blocks = o->kv_blocks,
                             .kv_block_size = o->kv_block_size,
                             .layer_begin = o->layer_begin,
                             .layer_end = o->layer_end,
                             .explicit_parts = true,
                             .embedding = o->embedding,
                             .head = o->head};
    st = px_rt_session_new(w->model, &so, &w->s, err);
    if (st) {
        px_rt_device_free(dev);
        return st;
    }
    /* The session borrows the device: hand it over so that it is freed
     * with the session. */
    w->s->own_device = true;
    px_rt_session_info_get(w->s, &w->info);
    w->steps = calloc(w->info.max_seqs, sizeof *w->steps);
    w->n_tel = (size_t)(o->layer_end - o->layer_begin + 1) * PX_IR_OP_COUNT_;
    w->tel = calloc(w->n_tel, sizeof *w->tel);
    if (!w->steps || !w->tel)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_rt_stream_set_telemetry(px_rt_session_stream(w->s), on_op, w);
    w->fault.session = w->s;
    w->fault.device = o->device_name && o->device_name[0] ? o->device_name : o->backend;
    return PX_OK;
}

static px_status connect_ring(worker *w, px_err *err)
{
    const px_rt_worker_opts *o = w->o;
    int tmo = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    px_rt_hello mine = {.stage = o->stage,
                        .layer_begin = o->layer_begin,
                        .layer_end = o->layer_end,
                        .dim = px_rt_model_hparams(w->model)->dim,
                        .max_payload = PX_RT_FRAME_MAX_PAYLOAD};
    px_status st = model_digest(o->model_path, mine.model, err);
    if (st)
        return st;
    char peer[64];
    snprintf(peer, sizeof peer, "the next hop after stage %u", o->stage);
    px_rt_hello theirs;
    if ((st = px_rt_conn_connect(o->next, tmo, peer, &w->down, err)) != PX_OK)
        return st;
    px_rt_conn_set_timeout(w->down, tmo);
    if ((st = px_rt_conn_set_secret(w->down, o->secret, o->secret_len, err)) != PX_OK)
        return st;
    if ((st = px_rt_hello_client(w->down, &mine, &theirs, err)) != PX_OK)
        return st;
    if (theirs.stage != UINT32_MAX && theirs.layer_begin != o->layer_end)
        return px_err_set(err, PX_EVALIDATE,
                          "stage %u starts at layer %u, but this stage ends "
                          "before layer %u: the stages must cover the layers in order",
                          theirs.stage, theirs.layer_begin, o->layer_end);
    snprintf(peer, sizeof peer, "%s", o->stage == 0 ? "the executor" : "the previous stage");
    if ((st = px_rt_listener_accept(w->listener, tmo, peer, &w->up, err)) != PX_OK)
        return st;
    px_rt_conn_set_timeout(w->up, tmo);
    if ((st = px_rt_conn_set_secret(w->up, o->secret, o->secret_len, err)) != PX_OK)
        return st;
    if ((st = px_rt_hello_server(w->up, &mine, &theirs, err)) != PX_OK)
        return st;
    if (theirs.stage != UINT32_MAX && theirs.layer_end != o->layer_begin)
        return px_err_set(err, PX_EVALIDATE,
                          "stage %u ends before layer %u, but this stage "
                          "starts at layer %u: the stages must cover the layers in order",
                          theirs.stage, theirs.layer_end, o->layer_begin);
    if (theirs.stage != UINT32_MAX)
        snprintf(peer, sizeof peer, "stage %u", theirs.stage);
    px_rt_conn_set_peer(w->up, peer);
    px_rt_conn_set_timeout(w->up, IDLE_TIMEOUT_MS);
    w->fault.down = w->down;
    return PX_OK;
}

static uint8_t *scratch(worker *w, size_t n)
{
    if (n > w->scratch_cap) {
        uint8_t *p = realloc(w->scratch, n);
        if (!p)
            return NULL;
        w->scratch = p;
        w->scratch_cap = n;
    }
    return w->scratch;
}

static px_status bad_frame(worker *w, const char *what, px_err *err)
{
    return px_err_set(err, PX_EPARSE, "malformed %s frame from %s", what, px__rt_conn_peer(w->up));
}

/* Checks the audit blocks of an audited step (one per record, each a head
 * and n values, n at most the widest row a stage outputs) and returns
 * their bytes. */
static px_status audit_bytes(worker *w, const uint8_t *p, uint64_t len, uint32_t n_blocks,
                             uint64_t *out, px_err *err)
{
    const px_ir_hparams *hp = px_rt_model_hparams(w->model);
    uint32_t widest = PX_MAX(hp->dim, hp->vocab_size);
    uint64_t at = 0;
    for (uint32_t i = 0; i < n_blocks; i++) {
        px__rt_audit_head ah;
        if (len - at < sizeof ah)
            return bad_frame(w, "step (audit block)", err);
        memcpy(&ah, p + at, sizeof ah);
        if (ah.n > widest || len - at - sizeof ah < (uint64_t)ah.n * 4)
            return px_err_set(err, PX_EPARSE,
                              "malformed step frame from %s: audit block %u holds %u values "
                              "(at most %u) in %" PRIu64 " bytes left",
                              px__rt_conn_peer(w->up), i, ah.n, widest, len - at - sizeof ah);
        at += sizeof ah + (uint64_t)ah.n * 4;
    }
    *out = at;
    return PX_OK;
}

static px_status on_step(worker *w, uint8_t flags, const uint8_t *p, uint32_t len, uint64_t t_ready,
                         uint64_t t_recv, uint64_t recv_wait, px_err *err)
{
    px__rt_wfault_before_step(&w->fault);
    px__rt_step_head h;
    if (len < sizeof h)
        return bad_frame(w, "step", err);
    memcpy(&h, p, sizeof h);
    uint32_t dim = px_rt_model_hparams(w->model)->dim;
    bool tokens = h.row_len == 0;
    bool audit = flags & PX_RT_STEP_AUDIT;
    if (h.n_seqs == 0 || h.n_seqs > w->info.max_seqs || h.n_rows == 0 ||
        h.n_rows > w->info.max_batch_tokens || (!tokens && h.row_len != dim) ||
        tokens != w->o->embedding || h.n_records >= PX_RT_MAX_STAGES)
        return px_err_set(err, PX_EPARSE,
                          "step from %s: %u sequences, %u rows of %u values, "
                          "%u records do not fit this stage (at most %u sequences, %u rows, "
                          "%s)",
                          px__rt_conn_peer(w->up), h.n_seqs, h.n_rows, h.row_len, h.n_records,
                          w->info.max_seqs, w->info.max_batch_tokens,
                          w->o->embedding ? "token ids" : "hidden states");
    uint64_t data = (uint64_t)h.n_rows * (tokens ? 1 : dim) * 4;
    uint64_t want = sizeof h + (uint64_t)h.n_seqs * sizeof(px__rt_step_seq) + data +
                    (uint64_t)h.n_records * sizeof(px__rt_stage_record);
    uint64_t audit_in = 0;
    if (want > len || (!audit && want != len))
        return bad_frame(w, "step", err);
    px_status st;
    if (audit && (st = audit_bytes(w, p + want, len - want, h.n_records, &audit_in, err)) != PX_OK)
        return st;
    if (want + audit_in != len)
        return bad_frame(w, "step", err);
    const uint8_t *q = p + sizeof h;
    const uint8_t *rows = q + (size_t)h.n_seqs * sizeof(px__rt_step_seq);
    uint64_t n_rows = 0;
    for (uint32_t i = 0; i < h.n_seqs; i++) {
        px__rt_step_seq ss;
        memcpy(&ss, q + (size_t)i * sizeof ss, sizeof ss);
        if (ss.n_tokens == 0 || ss.n_tokens > h.n_rows)
            return bad_frame(w, "step", err);
        w->steps[i] = (px_rt_seq_step){.seq = ss.seq,
                                       .pos = ss.pos,
                                       .n_tokens = ss.n_tokens,
                                       .tokens = tokens ? (const int32_t *)rows + n_rows : NULL};
        n_rows += ss.n_tokens;
    }
    if (n_rows != h.n_rows)
        return bad_frame(w, "step", err);
    px__rt_stage_record recs[PX_RT_MAX_STAGES];
    memcpy(recs, rows + data, (size_t)h.n_records * sizeof *recs);
    px_rt_batch b = {
        .n_seqs = h.n_seqs, .seqs = w->steps, .hidden = tokens ? NULL : (const float *)rows};
    px_rt_output out;
    uint64_t t0 = px_now_ns(), wait0 = thread_wait_ns(w);
    st = px_rt_forward(w->s, &b, NULL, &out, err);
    if (st)
        return st;
    uint64_t wait = thread_wait_ns(w) - wait0;
    px__rt_wfault_after_step(&w->fault, px_now_ns() - t0);
    px__rt_stage_record *mine = &recs[h.n_records];
    *mine = (px__rt_stage_record){.stage = w->o->stage,
                                  .rows = h.n_rows,
                                  .recv_done_ns = t_recv,
                                  .compute_ns = px_now_ns() - t0,
                                  .ready_ns = t_ready,
                                  .wait_ns = wait,
                                  .recv_wait_ns = recv_wait};
    px__rt_step_head oh = h;
    oh.n_rows = out.n_rows;
    oh.row_len = out.row_len;
    oh.n_records = h.n_records + 1;
    bool result = w->o->head;
    /* Audited: the blocks so far, then this stage's output's first row. */
    px__rt_audit_head ah = {.stage = w->o->stage, .n = audit && out.n_rows ? out.row_len : 0};
    const void *parts[7] = {
        &oh, q, out.data, recs, rows + data + (size_t)h.n_records * sizeof *recs, &ah, out.data};
    uint32_t lens[7] = {sizeof oh,
                        result ? 0 : h.n_seqs * (uint32_t)sizeof(px__rt_step_seq),
                        out.n_rows * out.row_len * 4,
                        oh.n_records * (uint32_t)sizeof(px__rt_stage_record),
                        (uint32_t)audit_in,
                        sizeof ah,
                        ah.n * 4};
    mine->send_start_ns = px_now_ns();
    return px_rt_conn_sendv(w->down, result ? PX_RT_FRAME_RESULT : PX_RT_FRAME_STEP,
                            audit ? PX_RT_STEP_AUDIT : 0, parts, lens, audit ? 7 : 4, err);
}

/* A fault: applied first when it names this stage, then passed on (its
 * return to the executor is the acknowledgement). */
static px_status on_fault(worker *w, const uint8_t *p, uint32_t len, px_err *err)
{
    px_rt_fault f;
    px_status st = px__rt_wfault_parse(p, len, px__rt_conn_peer(w->up), &f, err);
    if (st)
        return st;
    if (f.stage == w->o->stage && (st = px__rt_wfault_apply(&w->fault, &f, err)) != PX_OK)
        return st;
    return px_rt_conn_send(w->down, PX_RT_FRAME_FAULT, 0, p, len, err);
}

static px_status on_seq(worker *w, const uint8_t *p, uint32_t len, px_err *err)
{
    px__rt_seq_msg m;
    if (len != sizeof m)
        return bad_frame(w, "sequence", err);
    memcpy(&m, p, sizeof m);
    px_status st;
    if (m.op == 1) {
        int32_t id;
        if ((st = px_rt_seq_add(w->s, &id, err)) != PX_OK)
            return st;
        if (id != m.seq)
            return px_err_set(err, PX_ESTATE,
                              "sequence %d was asked for, slot %d was free: the "
                              "stages disagree on their sequences",
                              m.seq, id);
    } else if (m.op == 2) {
        if ((st = px_rt_seq_remove(w->s, m.seq, err)) != PX_OK)
            return st;
    } else {
        return bad_frame(w, "sequence", err);
    }
    return px_rt_conn_send(w->down, PX_RT_FRAME_SEQ, 0, p, len, err);
}

static px_status on_info(worker *w, const uint8_t *p, uint32_t len, px_err *err)
{
    if (len % sizeof(px__rt_stage_info) || len / sizeof(px__rt_stage_info) >= PX_RT_MAX_STAGES)
        return bad_frame(w, "info", err);
    uint8_t *buf = scratch(w, len + sizeof(px__rt_stage_info));
    if (!buf)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    memcpy(buf, p, len);
    px__rt_stage_info in = {.stage = w->o->stage,
                            .pid = (int32_t)getpid(),
                            .layer_begin = w->o->layer_begin,
                            .layer_end = w->o->layer_end,
                            .weight_bytes = w->info.weight_bytes,
                            .kv_bytes = w->info.kv_bytes,
                            .device = w->info.device};
    /* Free memory changes (memory faults): report it as it is now. */
    px_rt_device_props_get(w->s->device, &in.device);
    memcpy(buf + len, &in, sizeof in);
    return px_rt_conn_send(w->down, PX_RT_FRAME_INFO, 0, buf,
                           len + (uint32_t)sizeof(px__rt_stage_info), err);
}

static px_status on_stats(worker *w, const uint8_t *p, uint32_t len, px_err *err)
{
    size_t n = 0;
    for (size_t i = 0; i < w->n_tel; i++)
        n += w->tel[i].count > 0;
    size_t extra = sizeof(px__rt_stats_head) + n * sizeof(px__rt_stats_entry);
    if (len > (1u << 24))
        return bad_frame(w, "stats", err);
    uint8_t *buf = scratch(w, len + extra);
    if (!buf)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    memcpy(buf, p, len);
    px__rt_stats_head h = {.stage = w->o->stage, .n_entries = (uint32_t)n};
    memcpy(buf + len, &h, sizeof h);
    uint8_t *at = buf + len + sizeof h;
    for (size_t i = 0; i < w->n_tel; i++)
        if (w->tel[i].count) {
            memcpy(at, &w->tel[i], sizeof w->tel[i]);
            at += sizeof w->tel[i];
        }
    memset(w->tel, 0, w->n_tel * sizeof *w->tel);
    return px_rt_conn_send(w->down, PX_RT_FRAME_STATS, 0, buf, (uint32_t)(len + extra), err);
}

static px_status serve(worker *w, px_err *err)
{
    for (;;) {
        px_rt_frame_header h;
        const uint8_t *p;
        uint64_t t_ready = px_now_ns(), wait0 = thread_wait_ns(w);
        px_status st = px_rt_conn_recv(w->up, &h, &p, err);
        if (st)
            return st;
        uint64_t t_recv = px_now_ns(), recv_wait = thread_wait_ns(w) - wait0;
        switch (h.type) {
        case PX_RT_FRAME_STEP:
            st = on_step(w, h.flags, p, h.length, t_ready, t_recv, recv_wait, err);
            break;
        case PX_RT_FRAME_SEQ:
            st = on_seq(w, p, h.length, err);
            break;
        case PX_RT_FRAME_INFO:
            st = on_info(w, p, h.length, err);
            break;
        case PX_RT_FRAME_STATS:
            st = on_stats(w, p, h.length, err);
            break;
        case PX_RT_FRAME_FAULT:
            st = on_fault(w, p, h.length, err);
            break;
        case PX_RT_FRAME_SHUTDOWN:
            return px_rt_conn_send(w->down, PX_RT_FRAME_SHUTDOWN, 0, NULL, 0, err);
        case PX_RT_FRAME_ERROR:
            /* Pass it on: the executor reports the first failure. */
            (void)px_rt_conn_send(w->down, PX_RT_FRAME_ERROR, 0, p, h.length, NULL);
            w->relayed = true;
            return px_err_set(err, PX_EPEER, "%.*s", (int)PX_MIN(h.length, 200u), (const char *)p);
        default:
            st = px_err_set(err, PX_EPARSE, "unexpected frame of type %u from %s", h.type,
                            px__rt_conn_peer(w->up));
        }
        if (st)
            return st;
    }
}

px_status px_rt_worker_run(const px_rt_worker_opts *o, px_err *err)
{
    px_err local;
    if (!err)
        err = &local;
    px_err_clear(err);
    if (!o || !o->model_path || !o->backend || !o->listen || !o->next)
        return px_err_set(err, PX_EINVAL,
                          "worker: --model, --backend, --listen and --next are "
                          "required");
    if (o->stage >= PX_RT_MAX_STAGES)
        return px_err_set(err, PX_EINVAL, "worker: stage %u (at most %d stages)", o->stage,
                          PX_RT_MAX_STAGES);
    /* Whoever reaches a worker can drive it: one that others can reach
     * must only answer its deployment's peers. */
    if (!px_rt_addr_is_local(o->listen) && o->secret_len == 0)
        return px_err_set(err, PX_EAUTH,
                          "worker: refusing to listen on %s without a secret: an address "
                          "other machines reach needs the deployment's secret "
                          "(--secret-stdin)",
                          o->listen);
    worker w = {.o = o, .schedstat = -2};
    /* Listen first: a launcher learns the address at once, and the
     * previous hop may connect while the model loads. */
    snprintf(w.label, sizeof w.label, "stage %u (pid %d)", o->stage, (int)getpid());
    px_status st = px_rt_listener_new(o->listen, &w.listener, err);
    if (st == PX_OK && o->announce) {
        /* Standard output stays the launcher's: `plexus worker` says
         * there why it failed ("error MESSAGE"), for the launcher. */
        printf("listening %s\n", px_rt_listener_address(w.listener));
        fflush(stdout);
    }
    if (st == PX_OK)
        st = setup(&w, err);
    if (st == PX_OK)
        st = connect_ring(&w, err);
    if (st == PX_OK)
        st = serve(&w, err);
    if (st && !w.relayed)
        px_err_prefix(err, st, "%s: ", w.label);
    /* Tell the rest of the ring why, unless the failure came from it. */
    if (st && !w.relayed && w.down)
        (void)px_rt_conn_send(w.down, PX_RT_FRAME_ERROR, 0, err->msg, (uint32_t)strlen(err->msg),
                              NULL);
    px__rt_wfault_release(&w.fault);
    px__rt_thread_wait_close(&w.schedstat);
    px_rt_conn_free(w.up);
    px_rt_conn_free(w.down);
    px_rt_listener_free(w.listener);
    px_rt_session_free(w.s);
    px_rt_model_free(w.model);
    free(w.steps);
    free(w.tel);
    free(w.scratch);
    return st;
}
