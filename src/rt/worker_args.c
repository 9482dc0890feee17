/*
 * The stage worker's command line, in one place: the executor (and any
 * launcher that starts stages elsewhere) builds it from px_rt_worker_opts,
 * `plexus worker` parses it back.  A launcher that receives a command line
 * from someone else parses it here before it runs anything, so that only
 * the options below ever reach a worker.  The deployment's secret travels
 * on the worker's standard input, never in its arguments or environment.
 */
#include "base/common.h"

#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "rt/pipeline_impl.h"

static px_status push(px_rt_worker_argv *a, const char *s, px_err *err)
{
    if (a->argc >= PX_RT_WORKER_MAX_ARGS)
        return px_err_set(err, PX_ELIMIT, "worker command line: more than %d arguments",
                          PX_RT_WORKER_MAX_ARGS);
    char *d = px_strdup(s);
    if (!d)
        return px_err_set(err, PX_ENOMEM, "worker command line: out of memory");
    a->argv[a->argc++] = d;
    a->argv[a->argc] = NULL;
    return PX_OK;
}

static px_status push_opt(px_rt_worker_argv *a, const char *opt, const char *v, px_err *err)
{
    px_status st = push(a, opt, err);
    return st ? st : push(a, v, err);
}

static px_status push_u32(px_rt_worker_argv *a, const char *opt, uint32_t v, px_err *err)
{
    char buf[16];
    snprintf(buf, sizeof buf, "%u", v);
    return push_opt(a, opt, buf, err);
}

px_status px_rt_worker_args_build(const px_rt_worker_opts *o, const char *bin,
                                  px_rt_worker_argv *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (!o->model_path || !o->backend || !o->listen || !o->next)
        return px_err_set(err, PX_EINVAL,
                          "worker command line: the model, backend, listen and next addresses "
                          "are required");
    char layers[48];
    if (o->layer_begin == o->layer_end)
        snprintf(layers, sizeof layers, "none@%u", o->layer_begin);
    else
        snprintf(layers, sizeof layers, "%u-%u", o->layer_begin, o->layer_end - 1);
    px_status st = push(out, bin ? bin : "plexus", err);
    if (!st)
        st = push(out, "worker", err);
    if (!st)
        st = push_u32(out, "--stage", o->stage, err);
    if (!st)
        st = push_opt(out, "--model", o->model_path, err);
    if (!st)
        st = push_opt(out, "--layers", layers, err);
    if (!st && o->embedding)
        st = push(out, "--embedding", err);
    if (!st && o->head)
        st = push(out, "--head", err);
    if (!st)
        st = push_opt(out, "--backend", o->backend, err);
    if (!st && o->emu_profile && o->emu_profile[0])
        st = push_opt(out, "--emu-profile", o->emu_profile, err);
    if (!st && o->device_name && o->device_name[0])
        st = push_opt(out, "--device", o->device_name, err);
    if (!st)
        st = push_u32(out, "--threads", o->n_threads ? o->n_threads : 1, err);
    if (!st)
        st = push_opt(out, "--listen", o->listen, err);
    if (!st)
        st = push_opt(out, "--next", o->next, err);
    if (!st && o->timeout_ms > 0)
        st = push_u32(out, "--timeout-ms", (uint32_t)o->timeout_ms, err);
    if (!st && o->max_seqs)
        st = push_u32(out, "--max-seqs", o->max_seqs, err);
    if (!st && o->context)
        st = push_u32(out, "--context", o->context, err);
    if (!st && o->max_batch_tokens)
        st = push_u32(out, "--batch-tokens", o->max_batch_tokens, err);
    if (!st && o->kv_blocks)
        st = push_u32(out, "--kv-blocks", o->kv_blocks, err);
    if (!st && o->kv_block_size)
        st = push_u32(out, "--kv-block-size", o->kv_block_size, err);
    if (!st && o->secret_len)
        st = push(out, "--secret-stdin", err);
    if (!st && o->announce)
        st = push(out, "--announce", err);
    if (st)
        px_rt_worker_args_release(out);
    return st;
}

void px_rt_worker_args_release(px_rt_worker_argv *a)
{
    if (!a)
        return;
    for (int i = 0; i < a->argc; i++)
        free(a->argv[i]);
    memset(a, 0, sizeof *a);
}

static px_status parse_u32(const char *arg, const char *opt, uint32_t max, uint32_t *out,
                           px_err *err)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] < '0' || arg[0] > '9' || v > max)
        return px_err_set(err, PX_EINVAL, "%s takes a whole number from 0 to %u, not \"%.80s\"",
                          opt, max, arg);
    *out = (uint32_t)v;
    return PX_OK;
}

px_status px_rt_worker_args_parse(int argc, char *const *argv, px_rt_worker_opts *o,
                                  bool *secret_stdin, px_err *err)
{
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->n_threads = 1;
    *secret_stdin = false;
    bool have_stage = false, have_layers = false;
    px_status st = PX_OK;
    for (int i = 0; i < argc && st == PX_OK; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--embedding")) {
            o->embedding = true;
            continue;
        }
        if (!strcmp(a, "--head")) {
            o->head = true;
            continue;
        }
        if (!strcmp(a, "--secret-stdin")) {
            *secret_stdin = true;
            continue;
        }
        if (!strcmp(a, "--announce")) {
            o->announce = true;
            continue;
        }
        if (i + 1 >= argc)
            return px_err_set(err, PX_EINVAL, "%.80s needs a value", a);
        const char *v = argv[++i];
        uint32_t tmo = 0;
        if (!strcmp(a, "--stage")) {
            st = parse_u32(v, a, PX_RT_MAX_STAGES - 1, &o->stage, err);
            have_stage = true;
        } else if (!strcmp(a, "--model")) {
            o->model_path = v;
        } else if (!strcmp(a, "--layers")) {
            unsigned a0, b0;
            char tail;
            if (!strncmp(v, "none@", 5) && v[5] >= '0' && v[5] <= '9' &&
                sscanf(v + 5, "%u%c", &a0, &tail) == 1 && a0 < 1000000) {
                o->layer_begin = o->layer_end = a0;
            } else if (v[0] >= '0' && v[0] <= '9' && sscanf(v, "%u-%u%c", &a0, &b0, &tail) == 2 &&
                       b0 >= a0 && b0 < 1000000) {
                o->layer_begin = a0;
                o->layer_end = b0 + 1;
            } else {
                return px_err_set(err, PX_EINVAL,
                                  "--layers takes A-B with A <= B, or none@A, not \"%.80s\"", v);
            }
            have_layers = true;
        } else if (!strcmp(a, "--backend")) {
            o->backend = v;
        } else if (!strcmp(a, "--emu-profile")) {
            o->emu_profile = v;
        } else if (!strcmp(a, "--device")) {
            o->device_name = v;
        } else if (!strcmp(a, "--threads")) {
            st = parse_u32(v, a, 1024, &o->n_threads, err);
        } else if (!strcmp(a, "--listen")) {
            o->listen = v;
        } else if (!strcmp(a, "--next")) {
            o->next = v;
        } else if (!strcmp(a, "--timeout-ms")) {
            st = parse_u32(v, a, 86400000, &tmo, err);
            o->timeout_ms = (int)tmo;
        } else if (!strcmp(a, "--max-seqs")) {
            st = parse_u32(v, a, 65536, &o->max_seqs, err);
        } else if (!strcmp(a, "--context")) {
            st = parse_u32(v, a, 1u << 24, &o->context, err);
        } else if (!strcmp(a, "--batch-tokens")) {
            st = parse_u32(v, a, 1u << 20, &o->max_batch_tokens, err);
        } else if (!strcmp(a, "--kv-blocks")) {
            st = parse_u32(v, a, INT32_MAX, &o->kv_blocks, err);
        } else if (!strcmp(a, "--kv-block-size")) {
            st = parse_u32(v, a, 1u << 24, &o->kv_block_size, err);
        } else {
            return px_err_set(err, PX_EINVAL, "unexpected argument \"%.80s\"", a);
        }
    }
    if (st)
        return st;
    if (!have_stage || !have_layers || !o->model_path || !o->listen || !o->next)
        return px_err_set(err, PX_EINVAL,
                          "--stage, --model, --layers, --listen and --next are required");
    if (strcmp(o->backend, "cpu") && strcmp(o->backend, "emu") && strcmp(o->backend, "cuda"))
        return px_err_set(err, PX_EINVAL, "--backend takes cpu, emu or cuda, not \"%.40s\"",
                          o->backend);
    if ((st = px_rt_addr_check(o->listen, err)) != PX_OK)
        return px_err_prefix(err, st, "--listen: ");
    if ((st = px_rt_addr_check(o->next, err)) != PX_OK)
        return px_err_prefix(err, st, "--next: ");
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Secrets                                                             */
/* ------------------------------------------------------------------ */

px_status px_rt_secret_new(uint8_t out[PX_RT_SECRET_BYTES], px_err *err)
{
    if (RAND_bytes(out, PX_RT_SECRET_BYTES) != 1)
        return px_err_set(err, PX_EINTERNAL, "OpenSSL could not draw a secret");
    return PX_OK;
}

void px_rt_secret_hex(const uint8_t *secret, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[secret[i] >> 4];
        out[2 * i + 1] = digits[secret[i] & 15];
    }
    out[2 * len] = 0;
}

px_status px_rt_secret_read_fd(int fd, uint8_t out[PX_RT_SECRET_MAX], size_t *len, px_err *err)
{
    char buf[2 * PX_RT_SECRET_MAX + 4];
    size_t n = 0;
    *len = 0;
    while (n < sizeof buf) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            OPENSSL_cleanse(buf, sizeof buf);
            return px_err_set(err, PX_EIO, "secret on standard input: %s", strerror(errno));
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (memchr(buf, '\n', n))
            break;
    }
    char *nl = memchr(buf, '\n', n);
    size_t hex = nl ? (size_t)(nl - buf) : n;
    px_status st = PX_OK;
    if (hex % 2 || hex / 2 < PX_RT_SECRET_MIN || hex / 2 > PX_RT_SECRET_MAX) {
        st = px_err_set(err, PX_EINVAL,
                        "secret on standard input: %zu characters; it must be %d to %d hex "
                        "digits (an even count) on one line",
                        hex, 2 * PX_RT_SECRET_MIN, 2 * PX_RT_SECRET_MAX);
    } else {
        for (size_t i = 0; i < hex && st == PX_OK; i++) {
            char c = buf[i];
            int v = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
            if (v < 0)
                st =
                    px_err_set(err, PX_EINVAL,
                               "secret on standard input: character %zu is not a hex digit", i + 1);
            else if (i % 2 == 0)
                out[i / 2] = (uint8_t)(v << 4);
            else
                out[i / 2] |= (uint8_t)v;
        }
    }
    OPENSSL_cleanse(buf, sizeof buf);
    if (st == PX_OK)
        *len = hex / 2;
    else
        OPENSSL_cleanse(out, PX_RT_SECRET_MAX);
    return st;
}
