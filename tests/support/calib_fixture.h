/*
 * The fixture of the calibration tests: emu-small (this machine's cpu
 * beside two emulated devices) and a synthetic model of 5 blocks of dim
 * 64 (8 heads over 4 KV heads, a vocabulary of 512, a context of 128),
 * written by the group set-up into the test's folder, with its fleet, cost
 * model and default parameters.  Included by tests/unit/test_cost_calib.c,
 * test_cost_calib_step.c and test_cost_calib_decode.c.
 */
#ifndef PX_CALIB_FIXTURE_H
#define PX_CALIB_FIXTURE_H

#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/cost.h"
#include "plexus/hw.h"
#include "plexus/ir.h"

typedef struct calib_fixture {
    px_hw_graph *graph;
    px_ir_model *ir;
    px_cost_fleet *fleet;
    px_cost_model *model;
    px_cost_params params;
    char *model_path;
} calib_fixture;

static calib_fixture fx;

/* |a - b| <= eps, naming both on failure. */
#define assert_double_equal(a, b, eps)                        \
    do {                                                      \
        double a_ = (a), b_ = (b);                            \
        if (!(fabs(a_ - b_) <= (eps)))                        \
            fail_msg("%s = %.9g, expected %.9g", #a, a_, b_); \
    } while (0)

/* Loads emu-small and writes the model as `file` in the test's folder. */
static inline int calib_fixture_setup(const char *file)
{
    px_err err;
    memset(&fx, 0, sizeof fx);
    char *inv = px_test_source_path("data/scenarios/emu-small.json");
    px_diags d;
    px_diags_init(&d);
    px_assert_ok(px_hw_graph_load(inv, NULL, &fx.graph, &d, &err), &err);
    px_diags_release(&d);
    free(inv);
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 64;
    o.hidden_dim = 172;
    o.n_layers = 5;
    o.n_heads = 8;
    o.n_kv_heads = 4;
    o.vocab_size = 512;
    o.context_length = 128;
    fx.model_path = px_asprintf("%s/%s", px_test_tmpdir(), file);
    px_assert_ok(px_ir_synth_write(&o, fx.model_path, &err), &err);
    px_assert_ok(px_ir_model_open(fx.model_path, NULL, &fx.ir, &err), &err);
    px_cost_params_default(&fx.params);
    px_assert_ok(px_cost_fleet_new(fx.graph, &fx.params, &fx.fleet, &err), &err);
    px_assert_ok(px_cost_model_new(fx.ir, &fx.model, &err), &err);
    return 0;
}

static inline int calib_fixture_teardown(void **state)
{
    (void)state;
    px_cost_model_free(fx.model);
    px_cost_fleet_free(fx.fleet);
    px_ir_model_free(fx.ir);
    px_hw_graph_free(fx.graph);
    free(fx.model_path);
    return 0;
}

/* The fleet index of device id (the test fails when there is none). */
static inline uint32_t dev(const char *id)
{
    for (uint32_t i = 0; i < fx.fleet->n_devices; i++)
        if (!strcmp(fx.fleet->devices[i].id, id))
            return i;
    fail_msg("no device %s", id);
    return 0;
}

#endif
