/* The cuda backend's host side, which runs without a GPU: the registry
 * entry and the refusal to open a GPU that is not there (no silent cpu
 * fallback), the messages with given figures, which ops and dtypes it
 * runs, the checks made before anything is queued, the scratch of the
 * cuBLAS path, the memory accounting, the cross-check of discovery against
 * the runtime, and the key under which a decode step's graph is kept. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/rt.h"
#include "rt/cuda_impl.h"
#include "rt/rt_impl.h"

static bool gpu_present(void)
{
    px_rt_cuda_info info;
    return px_rt_cuda_query(0, &info, NULL) == PX_OK;
}

static void test_cuda_is_registered_and_refuses_without_a_gpu(void **state)
{
    (void)state;
    bool found = false;
    for (size_t i = 0; i < px_rt_backend_count(); i++)
        found |= !strcmp(px_rt_backend_at(i)->name, "cuda");
    assert_true(found);
    if (gpu_present()) {
        print_message("a GPU is present: the refusal is checked with figures only\n");
        return;
    }
    px_err err;
    px_rt_device *d = NULL;
    px_status st = px_rt_device_open("cuda", NULL, &d, &err);
    assert_int_equal(st, PX_EUNSUPPORTED);
    assert_null(d);
    px_assert_contains(err.msg, "cuda:0");
    px_assert_contains(err.msg, "cpu device");
    if (px_rt_cuda_built())
        px_assert_contains(err.msg, "never falls back");
    else
        px_assert_contains(err.msg, "built without the cuda backend");
    /* A second GPU is named as such. */
    px_rt_device_opts o = {.ordinal = 3};
    assert_int_equal(px_rt_device_open("cuda", &o, &d, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "cuda:3");
}

static void test_a_session_on_cuda_without_a_gpu_fails_naming_the_device(void **state)
{
    (void)state;
    if (gpu_present())
        return;
    char *path = px_test_shared_model("stories260K.bin");
    if (!path) {
        print_message("stories260K is not in ../shared/models: skipped\n");
        return;
    }
    px_err err;
    px_rt_model *m = NULL;
    px_assert_ok(px_rt_model_open(path, &m, &err), &err);
    px_rt_session *s = NULL;
    px_rt_session_opts so = {.backend = "cuda"};
    assert_int_equal(px_rt_session_new(m, &so, &s, &err), PX_EUNSUPPORTED);
    assert_null(s);
    px_assert_contains(err.msg, "cuda:0");
    px_rt_model_free(m);
    free(path);
}

static void test_refusals_with_figures(void **state)
{
    (void)state;
    px_err err;
    assert_int_equal(px__rt_cuda_refuse(&err, 1, -1, 0, NULL), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "cuda:1: this plexus was built without the cuda backend");
    px_assert_contains(err.msg, "install the CUDA toolkit");
    assert_true(strlen(err.msg) < 200);
    assert_int_equal(px__rt_cuda_refuse(&err, 0, 0, 35, "CUDA driver version is insufficient"),
                     PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "CUDA error 35: CUDA driver version is insufficient");
    px_assert_contains(err.msg, "nvidia-smi");
    px_assert_contains(err.msg, "never falls back");
    assert_true(strlen(err.msg) < 220);
    assert_int_equal(px__rt_cuda_refuse(&err, 0, 0, 0, NULL), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "no NVIDIA GPU on this machine");
    assert_int_equal(px__rt_cuda_refuse(&err, 2, 2, 0, NULL), PX_ENOTFOUND);
    px_assert_contains(err.msg, "this machine has 2 GPUs (cuda:0 to cuda:1)");
    assert_int_equal(px__rt_cuda_refuse(&err, 1, 1, 0, NULL), PX_ENOTFOUND);
    px_assert_contains(err.msg, "1 GPU (cuda:0 to cuda:0)");
}

static void test_gpu_ordinals_from_device_ids(void **state)
{
    (void)state;
    assert_int_equal(px__rt_cuda_ordinal("gpu0"), 0);
    assert_int_equal(px__rt_cuda_ordinal("n1.gpu3"), 3);
    assert_int_equal(px__rt_cuda_ordinal("gpu-box.gpu12"), 12);
    assert_int_equal(px__rt_cuda_ordinal("n2.cpu0"), 0);
    assert_int_equal(px__rt_cuda_ordinal("gpu3x"), 0);
    assert_int_equal(px__rt_cuda_ordinal(NULL), 0);
    assert_int_equal(px__rt_cuda_ordinal("gpu99999999999"), 0);
}

static void test_ops_and_dtypes(void **state)
{
    (void)state;
    static const px_dtype weights[] = {PX_DTYPE_F32,  PX_DTYPE_F16,  PX_DTYPE_BF16, PX_DTYPE_Q8_0,
                                       PX_DTYPE_Q4_0, PX_DTYPE_Q5_0, PX_DTYPE_Q2_K, PX_DTYPE_Q3_K,
                                       PX_DTYPE_Q4_K, PX_DTYPE_Q5_K, PX_DTYPE_Q6_K};
    for (size_t i = 0; i < PX_ARRAY_LEN(weights); i++) {
        assert_true(px__rt_cuda_supports(PX_IR_OP_MATMUL, weights[i]));
        assert_true(px__rt_cuda_supports(PX_IR_OP_EMBEDDING, weights[i]));
        assert_true(px__rt_cuda_supports(PX_IR_OP_CLASSIFIER, weights[i]));
        /* The cuda and cpu backends run the same weight formats. */
        assert_true(px__rt_cpu_supports(PX_IR_OP_MATMUL, weights[i]));
    }
    assert_false(px__rt_cuda_supports(PX_IR_OP_MATMUL, PX_DTYPE_IQ2_XXS));
    assert_false(px__rt_cuda_supports(PX_IR_OP_MATMUL, PX_DTYPE_Q4_1));
    assert_false(px__rt_cuda_supports(PX_IR_OP_RMSNORM, PX_DTYPE_F16));
    assert_true(px__rt_cuda_supports(PX_IR_OP_ATTENTION, PX_DTYPE_F32));
    px__cuda_dtype c;
    assert_true(px__rt_cuda_dtype(PX_DTYPE_Q6_K, &c));
    assert_int_equal(c, PX__CUDA_Q6_K);
    assert_false(px__rt_cuda_dtype(PX_DTYPE_I32, &c));
}

/* Tensors for op checks: shapes on a cpu buffer (the checks look at
 * shapes and host-side row layouts only). */
typedef struct fixture {
    px_rt_device *cpu;
    px_rt_buffer *buf;
} fixture;

static void tensor(fixture *f, px_rt_tensor *t, px_dtype dt, int64_t ne0, int64_t ne1, int64_t ne2)
{
    int64_t ne[3] = {ne0, ne1, ne2};
    px_assert_ok(px_rt_tensor_init(t, dt, 3, ne, NULL), NULL);
    t->buffer = f->buf;
    t->name = "t";
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    px_assert_ok(px_rt_device_open("cpu", NULL, &f->cpu, NULL), NULL);
    px_assert_ok(px_rt_buffer_alloc(f->cpu, 64, &f->buf, NULL), NULL);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    px_rt_buffer_free(f->buf);
    px_rt_device_free(f->cpu);
    free(f);
    return 0;
}

static void test_matmul_path_and_scratch(void **state)
{
    fixture *f = *state;
    px_rt_tensor x, w, y, w32;
    tensor(f, &w, PX_DTYPE_Q4_K, 4096, 32000, 1);
    tensor(f, &w32, PX_DTYPE_F32, 4096, 32000, 1);
    tensor(f, &x, PX_DTYPE_F32, 4096, 8, 1);
    tensor(f, &y, PX_DTYPE_F32, 32000, 8, 1);
    px_rt_op op = {.kind = PX_IR_OP_MATMUL, .src = {&x, &w}, .dst = &y};
    /* Eight rows: the matrix-vector kernel, no scratch. */
    assert_false(px__rt_cuda_use_gemm(&op));
    assert_int_equal(px__rt_cuda_work_size(&op), 0);
    /* Nine: cuBLAS over f32 tiles of at most 64 MiB (4096 rows of 16 KiB). */
    x.ne[1] = y.ne[1] = 9;
    assert_true(px__rt_cuda_use_gemm(&op));
    assert_int_equal(px__rt_cuda_tile_rows(&op), 4096);
    assert_int_equal(px__rt_cuda_work_size(&op), (size_t)4096 * 4096 * 4);
    /* f32 weights are multiplied where they lie. */
    op.src[1] = &w32;
    assert_int_equal(px__rt_cuda_work_size(&op), 0);
    /* A selection gathers its rows first (aligned to 256 bytes). */
    uint32_t sel[9] = {0};
    op.select = sel;
    op.n_select = 9;
    assert_int_equal(px__rt_cuda_work_size(&op), (size_t)9 * 4096 * 4);
    op.src[1] = &w;
    assert_int_equal(px__rt_cuda_work_size(&op), (size_t)9 * 4096 * 4 + (size_t)4096 * 4096 * 4);
    /* A weight smaller than a tile is one tile. */
    px_rt_tensor small;
    tensor(f, &small, PX_DTYPE_Q8_0, 64, 10, 1);
    px_rt_op op2 = {.kind = PX_IR_OP_MATMUL, .src = {&x, &small}, .dst = &y};
    x.ne[0] = 64;
    assert_int_equal(px__rt_cuda_tile_rows(&op2), 10);
    /* A tall, narrow weight: tiles stop at a grid's 65535 rows. */
    px_rt_tensor tall;
    tensor(f, &tall, PX_DTYPE_F16, 64, 128256, 1);
    op2.src[1] = &tall;
    assert_int_equal(px__rt_cuda_tile_rows(&op2), 65535);
}

static void test_checks_name_the_op_and_what_disagrees(void **state)
{
    fixture *f = *state;
    px_err err;
    px_rt_tensor x, w, y, work;
    tensor(f, &x, PX_DTYPE_F32, 64, 16, 1);
    tensor(f, &w, PX_DTYPE_Q8_0, 64, 32, 1);
    tensor(f, &y, PX_DTYPE_F32, 32, 16, 1);
    px_rt_op op = {.kind = PX_IR_OP_MATMUL, .layer = 3, .src = {&x, &w}, .dst = &y};
    /* Sixteen rows need the tile scratch. */
    assert_int_equal(px__rt_cuda_check_op("cuda:0", &op, &err), PX_EINVAL);
    px_assert_contains(err.msg, "cuda:0: matmul op (layer 3): needs a work buffer");
    tensor(f, &work, PX_DTYPE_I8, (int64_t)px__rt_cuda_work_size(&op), 1, 1);
    op.work = &work;
    px_assert_ok(px__rt_cuda_check_op("cuda:0", &op, &err), &err);
    w.ne[1] = 33;
    assert_int_equal(px__rt_cuda_check_op("cuda:0", &op, &err), PX_EINVAL);
    px_assert_contains(err.msg, "shapes of activations, weight and output disagree");
    w.ne[1] = 32;
    px_rt_tensor iq;
    tensor(f, &iq, PX_DTYPE_F16, 64, 32, 1);
    iq.dtype = PX_DTYPE_IQ2_XXS;
    op.src[1] = &iq;
    assert_int_equal(px__rt_cuda_check_op("cuda:0", &op, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "cannot multiply by");
    op.src[1] = &w;
    uint32_t sel[2] = {0, 16};
    op.select = sel;
    op.n_select = 2;
    assert_int_equal(px__rt_cuda_check_op("cuda:0", &op, &err), PX_EINVAL);
    px_assert_contains(err.msg, "a selected row lies outside the input");

    /* Attention over the paged cache: every block read must be held, and
     * heads are at most PX__CUDA_MAX_HEAD_DIM values. */
    px_rt_tensor q, k, v, kc, vc, out;
    tensor(f, &q, PX_DTYPE_F32, 8 * 64, 2, 1);
    tensor(f, &k, PX_DTYPE_F32, 2 * 64, 2, 1);
    tensor(f, &v, PX_DTYPE_F32, 2 * 64, 2, 1);
    tensor(f, &kc, PX_DTYPE_F32, 2 * 64, 16, 4);
    tensor(f, &vc, PX_DTYPE_F32, 2 * 64, 16, 4);
    tensor(f, &out, PX_DTYPE_F32, 8 * 64, 2, 1);
    int32_t slot[2] = {0, 1}, pos[2] = {17, 3}, table[4] = {2, 0, 1, -1};
    px_rt_rows rows = {
        .n_rows = 2, .slot = slot, .pos = pos, .block_table = table, .blocks_per_slot = 2};
    px_rt_op att = {.kind = PX_IR_OP_ATTENTION,
                    .layer = 1,
                    .src = {&q, &k, &v, &kc, &vc},
                    .dst = &out,
                    .rows = &rows,
                    .n_heads = 8,
                    .n_kv_heads = 2,
                    .head_dim = 64};
    px_assert_ok(px__rt_cuda_check_op("cuda:0", &att, &err), &err);
    table[2] = -1; /* slot 1's first block */
    assert_int_equal(px__rt_cuda_check_op("cuda:0", &att, &err), PX_EINVAL);
    px_assert_contains(err.msg,
                       "attention op (layer 1): a row reads a KV-cache block that is not held");
    table[2] = 1;
    pos[0] = 32; /* past slot 0's two blocks */
    assert_int_equal(px__rt_cuda_check_op("cuda:0", &att, &err), PX_EINVAL);
    px_assert_contains(err.msg, "outside the cache");
    pos[0] = 17;
    att.n_kv_heads = 3;
    assert_int_equal(px__rt_cuda_check_op("cuda:0", &att, &err), PX_EINVAL);
    px_assert_contains(err.msg, "heads and tensor shapes disagree");

    /* RoPE: positions must lie in the table. */
    px_rt_tensor tab;
    tensor(f, &tab, PX_DTYPE_F32, 64, 16, 1);
    px_rt_op rope = {.kind = PX_IR_OP_ROPE,
                     .src = {&q, &tab},
                     .dst = &q,
                     .rows = &rows,
                     .n_heads = 8,
                     .head_dim = 64,
                     .rope_dim = 64};
    assert_int_equal(px__rt_cuda_check_op("cuda:0", &rope, &err), PX_EINVAL);
    px_assert_contains(err.msg, "a position lies outside the rotation table");
    pos[0] = 15;
    px_assert_ok(px__rt_cuda_check_op("cuda:0", &rope, &err), &err);
    rope.rope_dim = 63;
    assert_int_equal(px__rt_cuda_check_op("cuda:0", &rope, &err), PX_EINVAL);
}

static void test_large_heads_are_refused(void **state)
{
    fixture *f = *state;
    px_err err;
    px_rt_tensor q, k, v, kc, vc, out;
    tensor(f, &q, PX_DTYPE_F32, 1024, 1, 1);
    tensor(f, &k, PX_DTYPE_F32, 1024, 1, 1);
    tensor(f, &v, PX_DTYPE_F32, 1024, 1, 1);
    tensor(f, &kc, PX_DTYPE_F32, 1024, 16, 1);
    tensor(f, &vc, PX_DTYPE_F32, 1024, 16, 1);
    tensor(f, &out, PX_DTYPE_F32, 1024, 1, 1);
    int32_t slot[1] = {0}, pos[1] = {0};
    px_rt_rows rows = {.n_rows = 1, .slot = slot, .pos = pos};
    px_rt_op att = {.kind = PX_IR_OP_ATTENTION,
                    .src = {&q, &k, &v, &kc, &vc},
                    .dst = &out,
                    .rows = &rows,
                    .n_heads = 1,
                    .n_kv_heads = 1,
                    .head_dim = 1024};
    assert_int_equal(px__rt_cuda_check_op("cuda:1", &att, &err), PX_EUNSUPPORTED);
    px_assert_contains(
        err.msg, "cuda:1: attention (layer 0): heads of 1024 values; the kernel takes 1 to 512");
}

static void test_memory_accounting(void **state)
{
    (void)state;
    px_err err;
    assert_int_equal(px__rt_cuda_mem_round(0), 0);
    assert_int_equal(px__rt_cuda_mem_round(1), 256);
    assert_int_equal(px__rt_cuda_mem_round(256), 256);
    assert_int_equal(px__rt_cuda_mem_round(257), 512);
    assert_int_equal(px__rt_cuda_mem_round(UINT64_MAX - 3), UINT64_MAX);
    px__rt_cuda_mem m = {.total = 4096};
    px_assert_ok(px__rt_cuda_mem_reserve(&m, "cuda:0", 1000, &err), &err);
    px_assert_ok(px__rt_cuda_mem_reserve(&m, "cuda:0", 2000, &err), &err);
    assert_int_equal(m.used, 1024 + 2048);
    assert_int_equal(m.n_buffers, 2);
    assert_int_equal(px__rt_cuda_mem_reserve(&m, "cuda:0", 1025, &err), PX_ENOMEM);
    px_assert_contains(
        err.msg, "cuda:0: cannot allocate 1280 bytes: 3072 bytes in use of 4096 bytes (2 buffers)");
    px_assert_contains(err.msg, "fewer layers");
    assert_int_equal(m.used, 3072);
    px__rt_cuda_mem_release(&m, 1000);
    assert_int_equal(m.used, 2048);
    assert_int_equal(m.peak, 3072);
    /* A limit below the GPU's memory (a plan's share of it) is enforced. */
    px__rt_cuda_mem lim = {.total = 80ull << 30, .limit = 1ull << 30};
    px_assert_ok(px__rt_cuda_mem_reserve(&lim, "cuda:2", 1ull << 29, &err), &err);
    assert_int_equal(px__rt_cuda_mem_reserve(&lim, "cuda:2", 1ull << 30, &err), PX_ENOMEM);
    px_assert_contains(err.msg, "cuda:2: cannot allocate 1.00 GiB: 512.0 MiB in use of 1.00 GiB");
    /* Releasing more than is held never wraps. */
    px__rt_cuda_mem_release(&lim, 4ull << 30);
    assert_int_equal(lim.used, 0);
}

static void test_discovery_crosscheck(void **state)
{
    (void)state;
    px_rt_cuda_info smi = {.name = "NVIDIA H200",
                           .capability = "9.0",
                           .memory_total = 143771.0 * 1048576,
                           .clock_max_sm = 1980e6,
                           .multiprocessors = 0};
    px_rt_cuda_info rt = {.name = "NVIDIA H200",
                          .capability = "9.0",
                          .memory_total = 150754820096.0,
                          .clock_max_sm = 1980e6,
                          .multiprocessors = 132};
    px_diags w;
    px_diags_init(&w);
    assert_int_equal(px_rt_cuda_crosscheck(&smi, &rt, 0, &w), 0);
    /* Another GPU behind the same index: every differing figure, both
     * sides named. */
    px_rt_cuda_info h100 = {.name = "NVIDIA H100 80GB HBM3",
                            .capability = "9.0",
                            .memory_total = 81559.0 * 1048576,
                            .clock_max_sm = 1980e6,
                            .multiprocessors = 132};
    assert_int_equal(px_rt_cuda_crosscheck(&smi, &h100, 1, &w), 2);
    char *text = px_diags_format(&w, "discovery");
    px_assert_contains(text, "/gpu1/model");
    px_assert_contains(
        text, "nvidia-smi names it \"NVIDIA H200\", the CUDA runtime \"NVIDIA H100 80GB HBM3\"");
    px_assert_contains(text, "143771 MiB of memory by nvidia-smi, 81559 MiB by the CUDA runtime");
    px_assert_contains(text, "CUDA_VISIBLE_DEVICES");
    free(text);
    /* Unknown figures are not compared; a clock 10 % off is. */
    px_rt_cuda_info partial = {.memory_total = NAN, .clock_max_sm = 1782e6};
    assert_int_equal(px_rt_cuda_crosscheck(&partial, &rt, 0, &w), 1);
    assert_int_equal(w.n_warnings, 3);
    px_diags_release(&w);
}

static uint64_t fake_addr(const px_rt_tensor *t, void *ud)
{
    (void)ud;
    return (uint64_t)(uintptr_t)t->buffer + t->offset;
}

static void test_graph_keys(void **state)
{
    fixture *f = *state;
    px_rt_tensor x, w, y;
    tensor(f, &x, PX_DTYPE_F32, 64, 1, 1);
    tensor(f, &w, PX_DTYPE_Q4_0, 64, 32, 1);
    tensor(f, &y, PX_DTYPE_F32, 32, 1, 1);
    int32_t slot[1] = {0}, pos[1] = {5};
    px_rt_rows rows = {.n_rows = 1, .slot = slot, .pos = pos};
    px_rt_op ops[2] = {{.kind = PX_IR_OP_MATMUL, .src = {&x, &w}, .dst = &y, .rows = &rows},
                       {.kind = PX_IR_OP_ADD, .src = {&y, &y}, .dst = &y, .rows = &rows}};
    uint64_t k0 = px__rt_cuda_ops_key(ops, 2, fake_addr, NULL);
    /* Positions are read on the device: a later step replays the graph. */
    pos[0] = 6;
    assert_true(px__rt_cuda_ops_key(ops, 2, fake_addr, NULL) == k0);
    /* Another row count, address or op list is another graph. */
    rows.n_rows = 2;
    assert_true(px__rt_cuda_ops_key(ops, 2, fake_addr, NULL) != k0);
    rows.n_rows = 1;
    y.offset = 128;
    assert_true(px__rt_cuda_ops_key(ops, 2, fake_addr, NULL) != k0);
    y.offset = 0;
    assert_true(px__rt_cuda_ops_key(ops, 1, fake_addr, NULL) != k0);
    assert_true(px__rt_cuda_ops_key(ops, 2, fake_addr, NULL) == k0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_is_registered_and_refuses_without_a_gpu),
        cmocka_unit_test(test_a_session_on_cuda_without_a_gpu_fails_naming_the_device),
        cmocka_unit_test(test_refusals_with_figures),
        cmocka_unit_test(test_gpu_ordinals_from_device_ids),
        cmocka_unit_test(test_ops_and_dtypes),
        cmocka_unit_test_setup_teardown(test_matmul_path_and_scratch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checks_name_the_op_and_what_disagrees, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_large_heads_are_refused, setup, teardown),
        cmocka_unit_test(test_memory_accounting),
        cmocka_unit_test(test_discovery_crosscheck),
        cmocka_unit_test_setup_teardown(test_graph_keys, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
