/*
 * Decode and prefill speed of the cuda backend, per weight format.
 *
 *     bench_rt_cuda [MODEL.gguf ...]
 *
 * For each model (scripts/gpu-check writes the 136 M-parameter synthetic
 * llama in f32, f16, bf16, q8_0 and the block formats): prefill of a
 * 128-token prompt in one step (tokens/s, best of 3 after a warm-up),
 * then greedy decode of 128 tokens, one step each (tokens/s, best of 3),
 * the bytes a decode step reads (every weight but the embedding table,
 * one row of it, and the KV cache so far) and the bandwidth that reaches,
 * as a fraction of the H200's 4.8 TB/s.  Without models it reports the
 * device only.  Without a GPU it says so and exits 0 (`make bench` runs
 * it everywhere).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/ir.h"
#include "plexus/rt.h"
#include "plexus/rt_backend.h"
#include "plexus/rt_session.h"

#define H200_BW 4.8e12

enum { PROMPT = 128, DECODE = 128, RUNS = 3, TIMED = 16 };

/* GPU time of decode steps' ops by kind, each op timed alone (so without
 * the CUDA graph): where a step's time goes, not what a replay takes. */
typedef struct op_split {
    double ns[PX_IR_OP_COUNT_];
    unsigned n[PX_IR_OP_COUNT_];
} op_split;

static void on_op(const px_rt_op_record *rec, void *ud)
{
    op_split *sp = ud;
    if ((unsigned)rec->kind < PX_IR_OP_COUNT_) {
        sp->ns[rec->kind] += (double)rec->ns;
        sp->n[rec->kind]++;
    }
}

/* TIMED decode steps after a prompt, every op timed; prints the split per
 * token and the steps' wall time. */
static px_status split_decode(px_rt_session *s, int32_t *tokens, uint32_t vocab, px_err *err)
{
    op_split sp = {0};
    int32_t seq;
    px_status st = px_rt_seq_add(s, &seq, err);
    if (st)
        return st;
    px_rt_seq_step pre = {.seq = seq, .pos = 0, .n_tokens = PROMPT, .tokens = tokens};
    px_rt_batch pb = {.n_seqs = 1, .seqs = &pre};
    px_rt_output o;
    if ((st = px_rt_forward(s, &pb, NULL, &o, err)) != PX_OK)
        return st;
    tokens[PROMPT] = px_rt_argmax(o.data, vocab);
    px_rt_stream_set_telemetry(px_rt_session_stream(s), on_op, &sp);
    uint64_t t0 = px_now_ns();
    for (uint32_t i = 0; i < TIMED && st == PX_OK; i++) {
        px_rt_seq_step d = {
            .seq = seq, .pos = PROMPT + i, .n_tokens = 1, .tokens = &tokens[PROMPT + i]};
        px_rt_batch db = {.n_seqs = 1, .seqs = &d};
        if ((st = px_rt_forward(s, &db, NULL, &o, err)) == PX_OK)
            tokens[PROMPT + i + 1] = px_rt_argmax(o.data, vocab);
    }
    double wall = (double)(px_now_ns() - t0) / TIMED;
    px_rt_stream_set_telemetry(px_rt_session_stream(s), NULL, NULL);
    if (st == PX_OK)
        st = px_rt_seq_remove(s, seq, err);
    if (st)
        return st;
    double gpu = 0;
    for (int k = 0; k < PX_IR_OP_COUNT_; k++)
        gpu += sp.ns[k];
    printf("    ops timed one by one: %.1f us/token on the GPU, %.1f us/token wall:",
           gpu / TIMED / 1e3, wall / 1e3);
    for (int k = 0; k < PX_IR_OP_COUNT_; k++)
        if (sp.n[k])
            printf(" %s %.1f us (%u ops)", px_ir_op_kind_name((px_ir_op_kind)k),
                   sp.ns[k] / TIMED / 1e3, sp.n[k] / TIMED);
    printf("\n");
    return PX_OK;
}

static double weight_bytes_per_token(const px_rt_model *m)
{
    const px_ir_model *ir = px_rt_model_ir(m);
    const px_ir_hparams *hp = px_rt_model_hparams(m);
    const px_ir_tensor *embd = px_ir_model_weight(ir, 0, PX_IR_ROLE_TOKEN_EMBD);
    double bytes = 0;
    for (size_t i = 0; i < px_ir_model_n_tensors(ir); i++) {
        const px_ir_tensor *t = px_ir_model_tensor(ir, i);
        bytes += t == embd && !hp->tied_classifier ? (double)t->nb[1] : (double)t->n_bytes;
    }
    return bytes;
}

static int bench_model(const char *path)
{
    px_err err;
    px_rt_model *m = NULL;
    if (px_rt_model_open(path, &m, &err) != PX_OK) {
        fprintf(stderr, "bench_rt_cuda: %s\n", err.msg);
        return 1;
    }
    const px_ir_hparams *hp = px_rt_model_hparams(m);
    px_rt_session *s = NULL;
    px_rt_session_opts so = {
        .backend = "cuda", .context = PROMPT + DECODE + 8, .max_batch_tokens = PROMPT};
    if (px_rt_session_new(m, &so, &s, &err) != PX_OK) {
        fprintf(stderr, "bench_rt_cuda: %s: %s\n", path, err.msg);
        px_rt_model_free(m);
        return 1;
    }
    int32_t tokens[PROMPT + DECODE];
    for (uint32_t i = 0; i < PROMPT; i++)
        tokens[i] = (int32_t)((i * 7919u + 13u) % hp->vocab_size);
    double best_prefill = 0, best_decode = 0;
    for (int run = 0; run <= RUNS; run++) {
        int32_t seq;
        if (px_rt_seq_add(s, &seq, &err) != PX_OK)
            goto fail;
        px_rt_seq_step st = {.seq = seq, .pos = 0, .n_tokens = PROMPT, .tokens = tokens};
        px_rt_batch b = {.n_seqs = 1, .seqs = &st};
        px_rt_output o;
        uint64_t t0 = px_now_ns();
        if (px_rt_forward(s, &b, NULL, &o, &err) != PX_OK)
            goto fail;
        double prefill = (double)(px_now_ns() - t0) / 1e9;
        tokens[PROMPT] = px_rt_argmax(o.data, hp->vocab_size);
        t0 = px_now_ns();
        for (uint32_t i = 0; i + 1 < DECODE; i++) {
            px_rt_seq_step d = {
                .seq = seq, .pos = PROMPT + i, .n_tokens = 1, .tokens = &tokens[PROMPT + i]};
            px_rt_batch db = {.n_seqs = 1, .seqs = &d};
            if (px_rt_forward(s, &db, NULL, &o, &err) != PX_OK)
                goto fail;
            tokens[PROMPT + i + 1] = px_rt_argmax(o.data, hp->vocab_size);
        }
        double decode = (double)(px_now_ns() - t0) / 1e9;
        if (px_rt_seq_remove(s, seq, &err) != PX_OK)
            goto fail;
        if (run == 0)
            continue; /* warm-up: graphs captured, caches filled */
        best_prefill = PX_MAX(best_prefill, PROMPT / prefill);
        best_decode = PX_MAX(best_decode, (DECODE - 1) / decode);
    }
    double kv = 2.0 * hp->n_layers * hp->n_kv_heads * hp->head_dim * 4.0 * (PROMPT + DECODE / 2);
    double bytes = weight_bytes_per_token(m) + kv;
    printf("%-40s prefill %9.0f tok/s   decode %7.1f tok/s   %6.1f MB/token   %7.1f GB/s   "
           "%5.1f %% of 4.8 TB/s\n",
           strrchr(path, '/') ? strrchr(path, '/') + 1 : path, best_prefill, best_decode,
           bytes / 1e6, best_decode * bytes / 1e9, 100.0 * best_decode * bytes / H200_BW);
    if (split_decode(s, tokens, hp->vocab_size, &err) != PX_OK)
        goto fail;
    px_rt_session_free(s);
    px_rt_model_free(m);
    return 0;
fail:
    fprintf(stderr, "bench_rt_cuda: %s: %s\n", path, err.msg);
    px_rt_session_free(s);
    px_rt_model_free(m);
    return 1;
}

int main(int argc, char **argv)
{
    px_err err;
    px_rt_cuda_info info;
    if (px_rt_cuda_query(0, &info, &err) != PX_OK) {
        printf("bench_rt_cuda: skipped: %s\n", err.msg);
        return 0;
    }
    printf("cuda:0: %s, compute capability %s, %d SMs, %.0f MiB, %.0f MHz\n", info.name,
           info.capability, info.multiprocessors, info.memory_total / 1048576,
           info.clock_max_sm / 1e6);
    printf("prefill: %d-token prompt in one step; decode: %d tokens one at a time (best of %d)\n",
           PROMPT, DECODE, RUNS);
    int rc = 0;
    for (int i = 1; i < argc; i++)
        rc |= bench_model(argv[i]);
    return rc;
}
