/* The IR: dtypes, expressions, attention pairs, the graph of each family,
 * costs against the layer summary, presets, annotations. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "ir/ir_impl.h"

static px_ir_model *preset(const char *name, px_dtype dt, const px_ir_open_opts *o)
{
    px_ir_model *m = NULL;
    px_err err;
    px_assert_ok(px_ir_preset_new(name, dt, o, &m, &err), &err);
    return m;
}

static void test_dtype_table_and_half_conversions(void **state)
{
    (void)state;
    assert_int_equal(px_dtype_block_elems(PX_DTYPE_Q8_0), 32);
    assert_int_equal(px_dtype_block_bytes(PX_DTYPE_Q8_0), 34);
    assert_int_equal(px_dtype_block_bytes(PX_DTYPE_Q4_0), 18);
    assert_int_equal(px_dtype_block_elems(PX_DTYPE_Q4_K), 256);
    assert_int_equal(px_dtype_block_bytes(PX_DTYPE_Q4_K), 144);
    assert_int_equal(px_dtype_block_bytes(PX_DTYPE_Q6_K), 210);
    assert_int_equal(px_dtype_block_bytes(PX_DTYPE_FP8_E4M3), 1);
    assert_int_equal(px_dtype_to_ggml(PX_DTYPE_FP8_E4M3), -1);
    for (int t = 0; t < PX_DTYPE_COUNT_; t++) {
        px_dtype back;
        px_err err;
        px_assert_ok(px_dtype_parse(px_dtype_name((px_dtype)t), &back, &err), &err);
        assert_int_equal(back, t);
        int g = px_dtype_to_ggml((px_dtype)t);
        if (g >= 0) {
            assert_true(px_dtype_from_ggml((uint32_t)g, &back));
            assert_int_equal(back, t);
        }
    }
    px_dtype d;
    px_err err;
    assert_int_equal(px_dtype_parse("q9_9", &d, &err), PX_EINVAL);
    px_assert_contains(err.msg, "q8_0");
    assert_false(px_dtype_from_ggml(4, &d)); /* removed Q4_2 */
    uint64_t n;
    assert_true(px_dtype_nbytes(PX_DTYPE_Q8_0, 64, &n));
    assert_int_equal(n, 68);
    assert_false(px_dtype_nbytes(PX_DTYPE_Q8_0, 63, &n));

    assert_int_equal(px_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(px_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(px_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(px_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(px_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(px_f32_to_f16(0x1p-26f), 0x0000);
    assert_int_equal(px_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
    assert_int_equal(px_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    assert_true(isnan(px_f16_to_f32(px_f32_to_f16(NAN))));
    for (uint32_t h = 0; h < 0x7c00; h++)
        assert_int_equal(px_f32_to_f16(px_f16_to_f32((uint16_t)h)), h);
    assert_int_equal(px_f32_to_bf16(1.0f), 0x3f80);
    assert_true(px_bf16_to_f32(0x3f80) == 1.0f);
    assert_int_equal(px_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
}

static void test_expressions_evaluate_checked(void **state)
{
    (void)state;
    px_arena *a;
    px_assert_ok(px_arena_new(0, &a, NULL), (px_err *)NULL);
    const px_ir_expr *e = px__e_cost(a, 128, 3, 7, 0, NULL);
    char text[128];
    px_ir_expr_format(e, text, sizeof text);
    assert_string_equal(text, "128*B*S+3*B+7");
    uint64_t v;
    px_err err;
    px_assert_ok(px_ir_expr_eval(e, (px_ir_dims){2, 3, 5}, &v, &err), &err);
    assert_int_equal(v, 128 * 6 + 6 + 7);
    assert_false(px_ir_expr_is_const(e));
    assert_true(px_ir_expr_is_const(px__e_bin(a, PX__E_MUL, px__e_const(a, 3), px__e_const(a, 4))));
    /* S > T and B = 0 are not valid bindings. */
    assert_int_equal(px_ir_expr_eval(e, (px_ir_dims){1, 6, 5}, &v, &err), PX_EINVAL);
    assert_int_equal(px_ir_expr_eval(e, (px_ir_dims){0, 1, 5}, &v, &err), PX_EINVAL);
    const px_ir_expr *big =
        px__e_bin(a, PX__E_MUL, px__e_const(a, UINT64_C(1) << 63), px__e_var(a, PX__E_B));
    assert_int_equal(px_ir_expr_eval(big, (px_ir_dims){2, 1, 1}, &v, &err), PX_ERANGE);
    px_assert_contains(err.msg, "9223372036854775808*B overflows");
    const px_ir_expr *sub = px__e_bin(a, PX__E_SUB, px__e_var(a, PX__E_S), px__e_var(a, PX__E_T));
    assert_int_equal(px_ir_expr_eval(sub, (px_ir_dims){1, 1, 2}, &v, &err), PX_ERANGE);
    const px_ir_expr *cd = px__e_bin(a, PX__E_CDIV, px__e_var(a, PX__E_T), px__e_const(a, 4));
    px_assert_ok(px_ir_expr_eval(cd, (px_ir_dims){1, 1, 9}, &v, &err), &err);
    assert_int_equal(v, 3);
    px_ir_expr_format(
        px__e_bin(a, PX__E_MUL, px__e_const(a, 2),
                  px__e_bin(a, PX__E_ADD, px__e_var(a, PX__E_S), px__e_var(a, PX__E_T))),
        text, sizeof text);
    assert_string_equal(text, "2*(S+T)");
    const px_ir_expr *moe =
        px__e_moe(a, 8, 2, px__e_bin(a, PX__E_MUL, px__e_var(a, PX__E_B), px__e_var(a, PX__E_S)));
    px_assert_ok(px_ir_expr_eval(moe, (px_ir_dims){1, 2, 2}, &v, &err), &err);
    assert_int_equal(v, 4); /* 8 * (1 - 0.75^2) = 3.5, rounded up */
    px_arena_free(a);
}

static void test_attention_pairs_match_brute_force(void **state)
{
    (void)state;
    const uint32_t windows[] = {0, 1, 3, 7, 50};
    for (size_t w = 0; w < PX_ARRAY_LEN(windows); w++)
        for (uint64_t T = 1; T <= 40; T++)
            for (uint64_t S = 1; S <= T; S++) {
                uint64_t causal = 0, bidir = 0;
                for (uint64_t i = 0; i < S; i++) {
                    uint64_t keys = T - S + i + 1;
                    if (windows[w] && keys > windows[w])
                        keys = windows[w];
                    causal += keys;
                    bidir += windows[w] && T > windows[w] ? windows[w] : T;
                }
                assert_int_equal(px_ir_attention_pairs(S, T, windows[w], true), causal);
                assert_int_equal(px_ir_attention_pairs(S, T, windows[w], false), bidir);
            }
    assert_int_equal(px_ir_attention_pairs(1u << 31, 1u << 31, 0, true),
                     (UINT64_C(1) << 62) - ((UINT64_C(1) << 31) * ((UINT64_C(1) << 31) - 1)) / 2);
    assert_true(px_ir_attention_pairs(UINT64_MAX / 2, UINT64_MAX / 2, 0, true) == UINT64_MAX);
}

/* The graph's op costs, summed per row, equal the summary's closed form
 * B*S*flops_token + B*P*flops_pair + B*flops_seq at every binding. */
static void check_graph_matches_summary(const char *name)
{
    px_ir_model *m = preset(name, PX_DTYPE_COUNT_, NULL);
    const px_ir_dims dims[] = {{1, 1, 1}, {1, 1, 4096}, {3, 7, 100}, {2, 300, 300}, {8, 1, 9000}};
    const px_ir_layer_cost *rows = px_ir_model_layer_costs(m);
    for (size_t k = 0; k < PX_ARRAY_LEN(dims); k++) {
        px_ir_dims d = dims[k];
        uint32_t n_rows = px_ir_model_n_rows(m);
        uint64_t *per_row = calloc(n_rows, sizeof *per_row);
        for (size_t i = 0; i < px_ir_model_n_ops(m); i++) {
            const px_ir_op *op = px_ir_model_op(m, i);
            const px_ir_region *r = px_ir_model_region(m, op->region);
            uint32_t row = r->kind == PX_IR_REGION_EMBEDDING ? PX_IR_ROW_EMBEDDING
                           : r->kind == PX_IR_REGION_HEAD
                               ? PX_IR_ROW_HEAD(px_ir_model_hparams(m)->n_layers)
                               : PX_IR_ROW_LAYER(r->layer);
            px_ir_cost c;
            px_err err;
            px_assert_ok(px_ir_op_cost(m, i, d, &c, &err), &err);
            per_row[row] += c.flops;
        }
        for (uint32_t r = 0; r < n_rows; r++) {
            const px_ir_layer_cost *c = &rows[r];
            uint64_t P = px_ir_attention_pairs(d.S, d.T, c->window, c->causal);
            uint64_t want =
                d.B * d.S * c->flops_token + d.B * P * c->flops_pair + d.B * c->flops_seq;
            if (per_row[r] != want)
                fail_msg("%s row %u at B=%" PRIu64 " S=%" PRIu64 " T=%" PRIu64 ": graph %" PRIu64
                         " summary %" PRIu64,
                         name, r, d.B, d.S, d.T, per_row[r], want);
        }
        free(per_row);
    }
    /* Graph total = sum of regions. */
    px_ir_cost total, sum = {0};
    px_err err;
    px_ir_dims d = {2, 5, 50};
    px_assert_ok(px_ir_graph_cost(m, d, &total, &err), &err);
    for (size_t r = 0; r < px_ir_model_n_regions(m); r++) {
        px_ir_cost c;
        px_assert_ok(px_ir_region_cost(m, r, d, &c, &err), &err);
        sum.flops += c.flops;
        sum.bytes_read += c.bytes_read;
        sum.bytes_written += c.bytes_written;
    }
    assert_int_equal(total.flops, sum.flops);
    assert_int_equal(total.bytes_read, sum.bytes_read);
    assert_int_equal(total.bytes_written, sum.bytes_written);
    px_ir_model_free(m);
}

static void test_graph_costs_agree_with_layer_summary(void **state)
{
    (void)state;
    for (size_t i = 0; i < px_ir_preset_count(); i++)
        check_graph_matches_summary(px_ir_preset_at(i)->name);
}

static void test_regions_are_named_contiguous_and_cover_all_ops(void **state)
{
    (void)state;
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_, NULL);
    size_t nr = px_ir_model_n_regions(m);
    assert_int_equal(nr, 2 + 2 * 32);
    assert_string_equal(px_ir_model_region(m, 0)->name, "embedding");
    assert_string_equal(px_ir_model_region(m, 1)->name, "layer.0.attention");
    assert_string_equal(px_ir_model_region(m, 2)->name, "layer.0.ffn");
    assert_string_equal(px_ir_model_region(m, 64)->name, "layer.31.ffn");
    assert_string_equal(px_ir_model_region(m, 65)->name, "head");
    assert_non_null(px_ir_model_find_region(m, "layer.17.attention"));
    assert_null(px_ir_model_find_region(m, "layer.32.attention"));
    size_t next = 0;
    uint64_t region_bytes = 0;
    for (size_t r = 0; r < nr; r++) {
        const px_ir_region *reg = px_ir_model_region(m, r);
        assert_int_equal(reg->first_op, next);
        assert_true(reg->n_ops > 0);
        next += reg->n_ops;
        region_bytes += reg->weight_bytes;
        for (uint32_t i = 0; i < reg->n_ops; i++) {
            const px_ir_op *op = px_ir_model_op(m, reg->first_op + i);
            assert_int_equal(op->region, r);
            assert_true(px_str_starts_with(op->name, reg->name));
            for (uint32_t k = 0; k < op->n_inputs; k++)
                assert_true(op->inputs[k] < px_ir_model_n_values(m));
            for (uint32_t k = 0; k < op->n_outputs; k++)
                assert_true(op->outputs[k] < px_ir_model_n_values(m));
        }
    }
    assert_int_equal(next, px_ir_model_n_ops(m));
    px_ir_totals t;
    px_ir_model_totals(m, &t);
    assert_int_equal(region_bytes, t.weight_bytes);
    px_ir_phase ph[3];
    assert_int_equal(px_ir_model_phases(m, ph), 2);
    assert_int_equal(ph[0], PX_IR_PHASE_PREFILL);
    assert_int_equal(ph[1], PX_IR_PHASE_DECODE);
    px_ir_dims d = px_ir_model_phase_dims(m, PX_IR_PHASE_PREFILL, 4, 512);
    assert_true(d.B == 4 && d.S == 512 && d.T == 512);
    d = px_ir_model_phase_dims(m, PX_IR_PHASE_DECODE, 4, 512);
    assert_true(d.S == 1 && d.T == 512);
    px_ir_model_free(m);
}

static void test_attention_bytes_read_the_whole_cache(void **state)
{
    (void)state;
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_, NULL);
    const px_ir_op *att = NULL;
    size_t id = 0;
    for (size_t i = 0; i < px_ir_model_n_ops(m) && !att; i++)
        if (px_ir_model_op(m, i)->kind == PX_IR_OP_ATTENTION)
            att = px_ir_model_op(m, id = i);
    assert_non_null(att);
    assert_string_equal(att->name, "layer.0.attention.attention");
    px_ir_cost c;
    px_err err;
    px_ir_dims d = {2, 1, 1000};
    px_assert_ok(px_ir_op_cost(m, id, d, &c, &err), &err);
    uint64_t qd = 4096, kvd = 1024;
    /* q, new k and v in f32 activations; the cache of all T positions of K
     * and V (bf16, the preset's weights' dtype); written: the output and
     * the appended K, V. */
    assert_int_equal(c.bytes_read, 2 * 1 * (qd + 2 * kvd) * 4 + 2 * 1000 * 2 * kvd * 2);
    assert_int_equal(c.bytes_written, 2 * 1 * (qd * 4 + 2 * kvd * 2));
    assert_int_equal(c.flops, 2 * 1000 * 32 * (4 * 128 + 5));
    assert_true(att->rewrites & PX_IR_RW_PAGE);
    assert_true(att->rewrites & PX_IR_RW_QUANTIZE_KV);
    assert_int_equal(att->determinism, PX_IR_DET_ORDER);
    /* A matmul reads its weight once per step whatever the batch. */
    const px_ir_op *wq = px_ir_model_op(m, 2);
    assert_string_equal(wq->name, "layer.0.attention.wq");
    px_ir_cost c1, c8;
    px_assert_ok(px_ir_op_cost(m, 2, (px_ir_dims){1, 1, 10}, &c1, &err), &err);
    px_assert_ok(px_ir_op_cost(m, 2, (px_ir_dims){8, 1, 10}, &c8, &err), &err);
    assert_int_equal(c1.bytes_read, 4096ull * 4096 * 2 + 4096 * 4);
    assert_int_equal(c8.bytes_read - c1.bytes_read, 7 * 4096 * 4);
    assert_int_equal(c8.flops, 8 * c1.flops);
    px_ir_model_free(m);
}

static void test_presets_have_published_sizes_and_no_data(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        uint64_t params;
    } want[] = {
        {"llama-3-8b", 8030261248ull},    {"llama-3-70b", 70553706496ull},
        {"mixtral-8x7b", 46702792704ull}, {"qwen2.5-7b", 7615616512ull},
        {"mistral-7b", 7241732096ull},    {"dit-xl-2", 674834720ull},
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(want); i++) {
        px_ir_model *m = preset(want[i].name, PX_DTYPE_COUNT_, NULL);
        px_ir_totals t;
        px_ir_model_totals(m, &t);
        if (t.n_params != want[i].params)
            fail_msg("%s: %" PRIu64 " parameters, want %" PRIu64, want[i].name, t.n_params,
                     want[i].params);
        assert_false(px_ir_model_has_weights(m));
        for (size_t k = 0; k < px_ir_model_n_tensors(m); k++)
            assert_null(px_ir_model_tensor(m, k)->data);
        px_ir_model_free(m);
    }
    /* Llama 3 8B by hand: embeddings and classifier, final norm, and per
     * layer two norms, q/o (d x d), k/v (d x 1024), three FFN matrices. */
    uint64_t d = 4096, h = 14336, kv = 1024, V = 128256, L = 32;
    assert_int_equal(2 * V * d + d + L * (2 * d + 2 * d * d + 2 * d * kv + 3 * d * h),
                     8030261248ull);
    px_ir_model *m;
    px_err err;
    assert_int_equal(px_ir_preset_new("llama-4-1t", PX_DTYPE_COUNT_, NULL, &m, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "llama-3-8b");
    /* Q4_K matrices: 144 bytes per 256 values; norms stay f32. */
    m = preset("llama-3-8b", PX_DTYPE_Q4_K, NULL);
    px_ir_totals t;
    px_ir_model_totals(m, &t);
    assert_int_equal(t.bytes_by_dtype[PX_DTYPE_Q4_K], t.params_by_dtype[PX_DTYPE_Q4_K] / 256 * 144);
    assert_int_equal(t.params_by_dtype[PX_DTYPE_F32], d + L * 2 * d);
    px_ir_model_free(m);
    /* DiT's patch projection has rows of 4*2*2 = 16 values: no Q4_K block
     * of 256 fits them, and the preset says so. */
    assert_int_equal(px_ir_preset_new("dit-xl-2", PX_DTYPE_Q4_K, NULL, &m, &err), PX_EINVAL);
    px_assert_contains(err.msg, "not a multiple of q4_k's block of 256");
}

static void test_moe_weight_traffic_under_uniform_routing(void **state)
{
    (void)state;
    px_ir_model *m = preset("mixtral-8x7b", PX_DTYPE_COUNT_, NULL);
    px_ir_layer_cost c;
    px_assert_ok(px_ir_model_layer_cost(m, PX_IR_ROW_LAYER(0), &c), (px_err *)NULL);
    assert_int_equal(c.n_experts, 8);
    assert_int_equal(c.n_experts_used, 2);
    uint64_t expert = 3ull * 4096 * 14336 * 2; /* three bf16 matrices */
    assert_int_equal(c.expert_bytes, expert);
    uint64_t fixed = c.weight_bytes - 8 * expert;
    assert_int_equal(px_ir_step_weight_bytes(&c, 1), fixed + 2 * expert);
    assert_int_equal(px_ir_step_weight_bytes(&c, 2), fixed + 4 * expert);
    assert_int_equal(px_ir_step_weight_bytes(&c, 64), fixed + 8 * expert);
    assert_int_equal(px_ir_moe_experts_touched(8, 2, 0), 0);
    assert_int_equal(px_ir_moe_experts_touched(8, 2, 3), 5); /* 8*(1-0.75^3) = 4.625 */
    /* FLOPs scale with the experts used, not the experts held. */
    assert_true(c.flops_token < 3 * 2 * 4096ull * 14336 * 3);
    bool found = false;
    for (size_t i = 0; i < px_ir_model_n_ops(m); i++) {
        const px_ir_op *op = px_ir_model_op(m, i);
        if (op->kind == PX_IR_OP_MOE_EXPERTS) {
            assert_true(op->assumption);
            found = true;
        }
        if (op->kind == PX_IR_OP_MOE_ROUTER)
            assert_true(op->sensitivity & PX_IR_SENS_DISCONTINUOUS);
    }
    assert_true(found);
    px_ir_model_free(m);
}

static void test_dit_is_bidirectional_without_kv_cache(void **state)
{
    (void)state;
    px_ir_model *m = preset("dit-xl-2", PX_DTYPE_COUNT_, NULL);
    assert_int_equal(px_ir_model_n_kv(m), 0);
    assert_int_equal(px_ir_model_kv_bytes_per_token(m, PX_DTYPE_F16), 0);
    px_ir_phase ph[3];
    assert_int_equal(px_ir_model_phases(m, ph), 1);
    assert_int_equal(ph[0], PX_IR_PHASE_DENOISE);
    px_ir_dims d = px_ir_model_phase_dims(m, PX_IR_PHASE_DENOISE, 2, 0);
    assert_true(d.B == 2 && d.S == 256 && d.T == 256);
    px_ir_layer_cost c;
    assert_int_equal(px_ir_model_layer_cost(m, PX_IR_ROW_LAYER(3), &c), PX_OK);
    assert_false(c.causal);
    assert_int_equal(c.kv_bytes_token, 0);
    /* One step: the paper's 118.6 GFLOPs count multiply-adds once; this IR
     * counts them twice. */
    px_ir_cost total;
    px_err err;
    px_assert_ok(
        px_ir_graph_cost(m, px_ir_model_phase_dims(m, PX_IR_PHASE_DENOISE, 1, 0), &total, &err),
        &err);
    assert_true(total.flops > 2 * 115e9 && total.flops < 2 * 122e9);
    assert_non_null(px_ir_model_find_region(m, "layer.27.ffn"));
    bool adaln = false, patch = false;
    for (size_t i = 0; i < px_ir_model_n_ops(m); i++) {
        adaln |= px_ir_model_op(m, i)->kind == PX_IR_OP_ADALN;
        patch |= px_ir_model_op(m, i)->kind == PX_IR_OP_PATCH_EMBED;
        assert_true(px_ir_model_op(m, i)->kind != PX_IR_OP_ROPE);
    }
    assert_true(adaln && patch);
    px_ir_model_free(m);
}

static void test_annotations_mark_sensitive_and_observable_ops(void **state)
{
    (void)state;
    px_ir_model *m = preset("qwen2.5-7b", PX_DTYPE_COUNT_, NULL);
    assert_int_equal(px_ir_model_hparams(m)->rope_style, PX_IR_ROPE_HALVES);
    assert_non_null(px_ir_model_weight(m, 5, PX_IR_ROLE_BQ));
    int sampling = 0, norms = 0;
    for (size_t i = 0; i < px_ir_model_n_ops(m); i++) {
        const px_ir_op *op = px_ir_model_op(m, i);
        switch (op->kind) {
        case PX_IR_OP_SAMPLING:
            assert_true(op->observable_order);
            assert_int_equal(op->determinism, PX_IR_DET_SEEDED);
            sampling++;
            break;
        case PX_IR_OP_RMSNORM:
            assert_true(op->sensitivity & PX_IR_SENS_PRECISION);
            norms++;
            break;
        case PX_IR_OP_MATMUL:
            assert_true(op->rewrites & PX_IR_RW_QUANTIZE);
            assert_int_equal(op->determinism, PX_IR_DET_ORDER);
            break;
        case PX_IR_OP_ADD:
            assert_int_equal(op->determinism, PX_IR_DET_EXACT);
            break;
        default:
            break;
        }
    }
    assert_int_equal(sampling, 1);
    assert_int_equal(norms, 2 * 28 + 1);
    const px_ir_region *head = px_ir_model_find_region(m, "head");
    assert_true(head->sensitivity & PX_IR_SENS_DISCONTINUOUS);
    px_ir_model_free(m);
}

/* A preset keeps its KV cache in its 16-bit weights' dtype, as the
 * deployments of its source do; f32 weights keep an f32 cache. */
static void test_preset_kv_cache_takes_the_weights_dtype(void **state)
{
    (void)state;
    static const char *const names[] = {"llama-3-8b", "llama-3-70b", "mistral-7b", "mixtral-8x7b",
                                        "qwen2.5-7b"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        px_ir_model *m = preset(names[i], PX_DTYPE_COUNT_, NULL);
        assert_int_equal(px_ir_model_kv(m, 0)->dtype, PX_DTYPE_BF16);
        px_ir_totals t;
        px_ir_model_totals(m, &t);
        assert_int_equal(t.kv_bytes_token, px_ir_model_kv_bytes_per_token(m, PX_DTYPE_BF16));
        px_ir_model_free(m);
    }
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_, NULL);
    px_ir_totals t;
    px_ir_model_totals(m, &t);
    /* 2 * 32 layers * 8 kv heads * 128 * 2 bytes. */
    assert_int_equal(t.kv_bytes_token, 131072);
    px_ir_model_free(m);
    m = preset("llama-3-8b", PX_DTYPE_F16, NULL);
    assert_int_equal(px_ir_model_kv(m, 0)->dtype, PX_DTYPE_F16);
    px_ir_model_free(m);
    m = preset("llama-3-8b", PX_DTYPE_F32, NULL);
    assert_int_equal(px_ir_model_kv(m, 0)->dtype, PX_DTYPE_F32);
    px_ir_model_totals(m, &t);
    assert_int_equal(t.kv_bytes_token, 2 * 131072);
    px_ir_model_free(m);
}

/* f32 is also the zero of an unset field: given explicitly, it must still
 * override a preset's bf16 cache, and left unset it must not. */
static void test_kv_dtype_f32_given_overrides_preset_bf16(void **state)
{
    (void)state;
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_, NULL);
    assert_int_equal(px_ir_model_kv(m, 0)->dtype, PX_DTYPE_BF16);
    px_ir_model_free(m);
    px_ir_open_opts o = {.kv_dtype = PX_DTYPE_F32};
    m = preset("llama-3-8b", PX_DTYPE_COUNT_, &o);
    assert_int_equal(px_ir_model_kv(m, 0)->dtype, PX_DTYPE_BF16);
    px_ir_model_free(m);
    o.kv_dtype_given = true;
    m = preset("llama-3-8b", PX_DTYPE_COUNT_, &o);
    assert_int_equal(px_ir_model_kv(m, 0)->dtype, PX_DTYPE_F32);
    /* 2 * 32 layers * 8 kv heads * 128 * 4 bytes = 256 KiB per token. */
    px_ir_totals t;
    px_ir_model_totals(m, &t);
    assert_int_equal(t.kv_bytes_token, 262144);
    px_ir_model_free(m);
    o.kv_dtype = (px_dtype)PX_DTYPE_COUNT_;
    px_err err;
    assert_int_equal(px_ir_preset_new("llama-3-8b", PX_DTYPE_COUNT_, &o, &m, &err), PX_EINVAL);
    px_assert_contains(err.msg, "not a known dtype");
}

static void test_kv_dtype_and_sliding_window(void **state)
{
    (void)state;
    px_ir_open_opts o = {.kv_dtype = PX_DTYPE_F16};
    px_ir_model *m = preset("llama-3-8b", PX_DTYPE_COUNT_, &o);
    /* 2 * 32 layers * 8 kv heads * 128 * 2 bytes = 128 KiB per token. */
    px_ir_totals t;
    px_ir_model_totals(m, &t);
    assert_int_equal(t.kv_bytes_token, 131072);
    assert_int_equal(px_ir_model_kv(m, 0)->dtype, PX_DTYPE_F16);
    assert_int_equal(px_ir_model_kv_bytes_per_token(m, PX_DTYPE_Q8_0), 2 * 32 * 8 * 4 * 34);
    assert_true(px_ir_model_kv_bytes_per_token(m, PX_DTYPE_Q4_K) == UINT64_MAX);
    px_ir_model_free(m);
    o.kv_dtype = PX_DTYPE_Q4_K;
    px_err err;
    assert_int_equal(px_ir_preset_new("llama-3-8b", PX_DTYPE_COUNT_, &o, &m, &err), PX_EINVAL);
    px_assert_contains(err.msg, "KV cache in q4_k");

    m = preset("mistral-7b", PX_DTYPE_COUNT_, NULL);
    px_ir_layer_cost c;
    assert_int_equal(px_ir_model_layer_cost(m, PX_IR_ROW_LAYER(0), &c), PX_OK);
    assert_int_equal(c.window, 4096);
    /* Past the window a decode step attends to 4096 positions, not T. */
    assert_int_equal(px_ir_decode_flops(&c, 20000) - px_ir_decode_flops(&c, 4096), 0);
    assert_int_equal(px_ir_model_kv(m, 0)->window, 4096);
    px_ir_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table_and_half_conversions),
        cmocka_unit_test(test_expressions_evaluate_checked),
        cmocka_unit_test(test_attention_pairs_match_brute_force),
        cmocka_unit_test(test_graph_costs_agree_with_layer_summary),
        cmocka_unit_test(test_regions_are_named_contiguous_and_cover_all_ops),
        cmocka_unit_test(test_attention_bytes_read_the_whole_cache),
        cmocka_unit_test(test_presets_have_published_sizes_and_no_data),
        cmocka_unit_test(test_moe_weight_traffic_under_uniform_routing),
        cmocka_unit_test(test_dit_is_bidirectional_without_kv_cache),
        cmocka_unit_test(test_annotations_mark_sensitive_and_observable_ops),
        cmocka_unit_test(test_kv_dtype_f32_given_overrides_preset_bf16),
        cmocka_unit_test(test_kv_dtype_and_sliding_window),
        cmocka_unit_test(test_preset_kv_cache_takes_the_weights_dtype),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
