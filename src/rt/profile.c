/* Microbenchmarks for calibration: a stage's steps timed in this process
 * with the stage worker's settings, split by op class, and copies through
 * a Unix socket. */
#include "base/common.h"

#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "rt/rt_impl.h"

#define MAX_COPY_BYTES (64u * 1024u * 1024u)

typedef struct op_split {
    uint64_t attention, matmul, other;
} op_split;

static void on_op(const px_rt_op_record *rec, void *ud)
{
    op_split *s = ud;
    if (rec->kind == PX_IR_OP_ATTENTION)
        s->attention += rec->ns;
    else if (rec->kind == PX_IR_OP_MATMUL || rec->kind == PX_IR_OP_CLASSIFIER)
        s->matmul += rec->ns;
    else
        s->other += rec->ns;
}

/* One step of one sequence: tokens when the session embeds, else hidden
 * states (any values: the timing does not depend on them). */
static px_status step(px_rt_session *s, int32_t seq, uint32_t pos, uint32_t rows, bool embeds,
                      const int32_t *tokens, const float *hidden, op_split *split,
                      px_rt_profile_step *out, px_err *err)
{
    px_rt_seq_step ss = {
        .seq = seq, .pos = pos, .n_tokens = rows, .tokens = embeds ? tokens : NULL};
    px_rt_batch b = {.n_seqs = 1, .seqs = &ss, .hidden = embeds ? NULL : hidden};
    px_rt_output o;
    memset(split, 0, sizeof *split);
    uint64_t t0 = px_now_ns();
    px_status st = px_rt_forward(s, &b, NULL, &o, err);
    uint64_t t1 = px_now_ns();
    if (st != PX_OK)
        return st;
    if (out)
        *out = (px_rt_profile_step){.rows = rows,
                                    .context = pos + rows,
                                    .ns = t1 - t0,
                                    .attention_ns = split->attention,
                                    .matmul_ns = split->matmul,
                                    .other_ns = split->other};
    return PX_OK;
}

/* Sleeps like a worker blocked on its socket. */
static void idle(uint32_t us)
{
    struct timespec ts = {.tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

px_status px_rt_profile_run(const px_rt_model *model, const px_rt_profile_opts *o,
                            px_rt_profile_result *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    const px_ir_hparams *hp = px_rt_model_hparams(model);
    const char *backend = o->backend ? o->backend : "cpu";
    uint32_t begin = o->layer_begin, end = o->layer_end ? o->layer_end : hp->n_layers;
    uint32_t P = o->prompt_tokens ? o->prompt_tokens : 8;
    uint32_t D = o->decode_steps ? o->decode_steps : 32;
    uint32_t W = o->warmup_steps ? o->warmup_steps : 4;
    uint32_t ctx = hp->context_length ? hp->context_length : 512;
    if (begin >= end || end > hp->n_layers)
        return px_err_set(err, PX_EINVAL, "profile: layers [%u, %u) outside the model's 0-%u",
                          begin, end, hp->n_layers ? hp->n_layers - 1 : 0);
    if (P + D > ctx || P + W > ctx || D > 1u << 20)
        return px_err_set(err, PX_EINVAL,
                          "profile: %u prompt rows and %u decode steps exceed the context %u", P, D,
                          ctx);
    px_status st;
    char *profile_json = NULL;
    if (!strcmp(backend, "emu")) {
        if ((st = px_rt_emu_register(err)) != PX_OK)
            return st;
        if (o->emu) {
            px_strbuf sb = PX_STRBUF_INIT;
            if ((st = px_rt_emu_profile_format(o->emu, &sb, err)) != PX_OK) {
                px_strbuf_release(&sb);
                return st;
            }
            profile_json = px_strbuf_detach(&sb, NULL);
        }
    } else if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0) {
        return px_err_set(err, PX_EINVAL,
                          "profile: backend \"%s\" cannot run here; use cpu, emu or cuda", backend);
    }
    px_rt_device *dev = NULL;
    px_rt_session *s = NULL;
    int32_t *tokens = NULL;
    float *hidden = NULL;
    px_rt_device_opts dopts = {.n_threads = o->n_threads ? o->n_threads : 1,
                               .profile = profile_json};
    if ((st = px_rt_device_open(backend, &dopts, &dev, err)) != PX_OK)
        goto done;
    bool embeds = begin == 0;
    px_rt_session_opts so = {.device = dev,
                             .max_seqs = 8,
                             .layer_begin = begin,
                             .layer_end = end,
                             .explicit_parts = true,
                             .embedding = embeds,
                             .head = end == hp->n_layers};
    if ((st = px_rt_session_new(model, &so, &s, err)) != PX_OK)
        goto done;
    uint32_t rows = PX_MAX(P, W);
    tokens = malloc(rows * sizeof *tokens);
    hidden = calloc((size_t)rows * hp->dim, sizeof *hidden);
    out->decode = calloc(D, sizeof *out->decode);
    if (!tokens || !hidden || !out->decode) {
        st = px_err_set(err, PX_ENOMEM, "profile: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < rows; i++) {
        tokens[i] = (int32_t)((i * 7u + 1u) % hp->vocab_size);
        for (uint32_t k = 0; k < hp->dim; k++)
            hidden[(size_t)i * hp->dim + k] = 0.01f * (float)((i + k) % 13) - 0.06f;
    }
    op_split split;
    px_rt_stream_set_telemetry(px_rt_session_stream(s), on_op, &split);
    /* Warm-up: a throwaway sequence touches the weights, the caches and the
     * kernels' code, as the stage worker's first steps do. */
    int32_t seq;
    if ((st = px_rt_seq_add(s, &seq, err)) != PX_OK)
        goto done;
    for (uint32_t i = 0; i < W && st == PX_OK; i++)
        st = step(s, seq, i, 1, embeds, tokens + i, hidden, &split, NULL, err);
    if (st == PX_OK)
        st = px_rt_seq_remove(s, seq, err);
    if (st == PX_OK)
        st = px_rt_seq_add(s, &seq, err);
    if (st == PX_OK)
        st = step(s, seq, 0, P, embeds, tokens, hidden, &split, &out->prefill, err);
    for (uint32_t i = 0; i < D && st == PX_OK; i++) {
        if (o->idle_us)
            idle(o->idle_us);
        st = step(s, seq, P + i, 1, embeds, tokens + (i % rows), hidden, &split, &out->decode[i],
                  err);
    }
    if (st != PX_OK)
        goto done;
    out->n_decode = D;
    px_rt_session_info info;
    px_rt_session_info_get(s, &info);
    out->device = info.device;
    out->layer_begin = begin;
    out->layer_end = end;
    out->embedding = embeds;
    out->head = end == hp->n_layers;
done:
    if (st != PX_OK) {
        free(out->decode);
        out->decode = NULL;
    }
    px_rt_session_free(s);
    px_rt_device_free(dev);
    free(tokens);
    free(hidden);
    free(profile_json);
    return st;
}

void px_rt_profile_result_release(px_rt_profile_result *r)
{
    if (!r)
        return;
    free(r->decode);
    memset(r, 0, sizeof *r);
}

/* ---- copies ---- */

typedef struct echo {
    int fd;
    size_t bytes;
    uint32_t n_reps;
    uint8_t *buf;
    bool failed;
} echo;

static bool io_all(int fd, uint8_t *p, size_t n, bool writing)
{
    while (n > 0) {
        ssize_t k = writing ? write(fd, p, n) : read(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

static void *echo_main(void *arg)
{
    echo *e = arg;
    for (uint32_t i = 0; i < e->n_reps; i++) {
        if (!io_all(e->fd, e->buf, e->bytes, false) || !io_all(e->fd, e->buf, e->bytes, true)) {
            e->failed = true;
            break;
        }
    }
    return NULL;
}

px_status px_rt_profile_copy(size_t bytes, uint32_t n_reps, uint64_t *ns, px_err *err)
{
    if (bytes == 0 || bytes > MAX_COPY_BYTES || n_reps == 0 || n_reps > 1000000)
        return px_err_set(err, PX_EINVAL,
                          "profile copy: %zu bytes x %u; use 1 B to 64 MiB and 1 to 10^6 "
                          "repetitions",
                          bytes, n_reps);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return px_err_set(err, PX_EIO, "profile copy: socketpair: %s", strerror(errno));
    px_status st = PX_OK;
    uint8_t *mine = calloc(1, bytes);
    echo e = {.fd = sv[1], .bytes = bytes, .n_reps = n_reps, .buf = calloc(1, bytes)};
    pthread_t th;
    bool started = false;
    if (!mine || !e.buf) {
        st = px_err_set(err, PX_ENOMEM, "profile copy: out of memory");
        goto done;
    }
    if (pthread_create(&th, NULL, echo_main, &e) != 0) {
        st = px_err_set(err, PX_EIO, "profile copy: cannot start the peer thread");
        goto done;
    }
    started = true;
    for (uint32_t i = 0; i < n_reps; i++) {
        uint64_t t0 = px_now_ns();
        if (!io_all(sv[0], mine, bytes, true) || !io_all(sv[0], mine, bytes, false)) {
            st = px_err_set(err, PX_EIO, "profile copy: the socket failed: %s", strerror(errno));
            break;
        }
        ns[i] = (px_now_ns() - t0) / 2;
    }
done:
    if (st != PX_OK)
        shutdown(sv[0], SHUT_RDWR);
    if (started)
        pthread_join(th, NULL);
    close(sv[0]);
    close(sv[1]);
    free(mine);
    free(e.buf);
    return st;
}
