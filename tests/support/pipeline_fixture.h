/*
 * The synthetic model of the pipeline tests: 4 blocks of dim 64, 8 heads
 * (4 KV heads), a vocabulary of 512 and a context of 128, written once per
 * test program by the group set-up into the test's folder.  Small enough
 * for worker processes to start in milliseconds, with every part a stage
 * can hold.  Included by tests/integration/test_rt_pipeline.c,
 * test_rt_pipeline_empty.c and test_rt_launcher.c.
 */
#ifndef PX_PIPELINE_FIXTURE_H
#define PX_PIPELINE_FIXTURE_H

#include "px_test.h"

#include "plexus/ir.h"
#include "px_slowdown.h"

static char *synth_path;

/* Writes the model with the given weights seed (each program its own, so
 * that no two agree by accident). */
static inline int pipeline_fixture_setup(uint64_t seed)
{
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 64;
    o.hidden_dim = 128;
    o.n_layers = 4;
    o.n_heads = 8;
    o.n_kv_heads = 4;
    o.vocab_size = 512;
    o.context_length = 128;
    o.seed = seed;
    synth_path = px_asprintf("%s/pipeline-synth.gguf", px_test_tmpdir());
    px_err err;
    px_assert_ok(px_ir_synth_write(&o, synth_path, &err), &err);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(synth_path);
    synth_path = NULL;
    return 0;
}

#endif
