/*
 * Healing real runs, end to end: stories260K through real worker processes
 * on the emu-small inventory (this machine's cpu and two emulated
 * accelerators), under `plexus run --inject`.  run_scenario checks what
 * every scenario must hold: the fault-free run's text, complete incident
 * records, and `plexus replay` recomputing every decision identically.
 * Included by tests/scenario/test_heal_run_scenarios.c (faults found from
 * events: a process gone, an audit, a memory failure) and
 * tests/slow/test_heal_run_timing.c (faults found from wall-clock timings,
 * which a loaded machine can blur).  Skipped without the shared model.
 */
#ifndef PX_HEAL_RUN_HARNESS_H
#define PX_HEAL_RUN_HARNESS_H

#include "px_test.h"

#include <string.h>

#include "plexus/heal.h"

#define N_TOKENS "40"
#define RUN_S    240

static char *model, *inventory, *plan, *reference;
static char *lying_inventory, *stale_inventory, *stale_plan;

static json_t *parse(const char *text, const char *what)
{
    json_t *v = NULL;
    px_err err;
    if (!text || px_json_parse(text, strlen(text), what, NULL, &v, &err) != PX_OK)
        fail_msg("%s is not JSON: %s\n%s", what, err.msg, text ? text : "(null)");
    return v;
}

/* Runs plexus with args (NULL-terminated); returns stdout (owned). */
static char *plexus(const char *const *args, int want_rc)
{
    const char *argv[48];
    size_t n = 0;
    argv[n++] = px_test_plexus_bin();
    for (size_t i = 0; args[i] && n + 1 < PX_ARRAY_LEN(argv); i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char *out = NULL, *errs = NULL;
    int rc = px_test_run((char *const *)argv, RUN_S, &out, &errs);
    if (rc != want_rc)
        fail_msg("plexus %s %s exited %d (wanted %d):\n%s\n%s", args[0], args[1] ? args[1] : "", rc,
                 want_rc, out ? out : "", errs ? errs : "");
    free(errs);
    return out;
}

/* A copy of emu-small where one device's emulation profile is slower
 * than its catalogued figures say (figures replaced when flops is not
 * NULL). */
static char *inventory_with(const char *device, double compute, double memory, const char *flops,
                            const char *bandwidth, const char *name)
{
    json_t *doc = NULL;
    px_err err;
    px_assert_ok(px_json_load_file(inventory, NULL, &doc, &err), &err);
    json_t *devs = json_object_get(json_array_get(json_object_get(doc, "nodes"), 0), "devices");
    size_t i;
    json_t *d;
    json_array_foreach(devs, i, d)
    {
        if (strcmp(json_string_value(json_object_get(d, "id")), device))
            continue;
        json_t *emu = json_object_get(d, "emu");
        if (flops) {
            json_object_set_new(json_object_get(json_object_get(d, "compute"), "f32"), "value",
                                json_string(flops));
            json_object_set_new(
                json_object_get(json_array_get(json_object_get(d, "memory"), 0), "bandwidth"),
                "value", json_string(bandwidth));
        }
        json_object_set_new(emu, "compute_slowdown", json_real(compute));
        json_object_set_new(emu, "memory_slowdown", json_real(memory));
    }
    char *path = px_asprintf("%s/%s", px_test_tmpdir(), name);
    assert_int_equal(json_dump_file(doc, path, JSON_INDENT(1)), 0);
    json_decref(doc);
    return path;
}

static char *plan_for(const char *inv, const char *name)
{
    const char *args[] = {"plan",        "--model",    model, "--inventory", inv,
                          "--objective", "throughput", "-o",  "json",        NULL};
    char *out = plexus(args, 0);
    char *path = px_asprintf("%s/%s", px_test_tmpdir(), name);
    px_err err;
    px_assert_ok(px_write_file(path, out, strlen(out), &err), &err);
    json_t *doc = parse(out, "plan");
    /* The scenarios need a pipeline of two stages or more. */
    assert_true(json_array_size(json_object_get(doc, "stages")) >= 2);
    json_decref(doc);
    free(out);
    return path;
}

static char *text_of(const json_t *run)
{
    const char *t = json_string_value(
        json_object_get(json_array_get(json_object_get(run, "results"), 0), "text"));
    assert_non_null(t);
    return px_strdup(t);
}

static int setup(void **state)
{
    (void)state;
    model = px_test_shared_model("stories260K.gguf");
    if (!model)
        return 0;
    FILE *f = fopen(model, "rb");
    if (!f) {
        free(model);
        model = NULL;
        return 0;
    }
    fclose(f);
    inventory = px_test_source_path("data/scenarios/emu-small.json");
    plan = plan_for(inventory, "plan.json");
    const char *args[] = {
        "run",      "--model",          model, "--inventory", inventory, "--plan", plan,
        "--prompt", "Once upon a time", "-n",  N_TOKENS,      "-o",      "json",   NULL};
    char *out = plexus(args, 0);
    json_t *run = parse(out, "the fault-free run");
    reference = text_of(run);
    json_decref(run);
    free(out);
    /* emu-b said to be half as fast as cpu0, emulated 400x slower than
     * it: slow enough to show through the fixed cost of every step in an
     * optimized build too. */
    lying_inventory = inventory_with("emu-b", 400, 300, "500 GFLOP/s", "50 GB/s", "lying.json");
    /* emu-a 10x slower than its figures from the start. */
    stale_inventory = inventory_with("emu-a", 30, 20, NULL, NULL, "stale.json");
    stale_plan = plan_for(stale_inventory, "stale-plan.json");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(model);
    free(inventory);
    free(plan);
    free(reference);
    free(lying_inventory);
    free(stale_inventory);
    free(stale_plan);
    return 0;
}

typedef struct outcome {
    json_t *run;       /* the -o json document */
    json_t *incidents; /* borrowed from run */
    char *trace;
} outcome;

static void outcome_release(outcome *o)
{
    json_decref(o->run);
    free(o->trace);
}

/* Runs the model with extra arguments and checks what every scenario
 * must hold: the fault-free text, complete incidents, identical replay. */
static void run_scenario(const char *name, const char *inv, const char *plan_path,
                         const char *const *extra, outcome *o)
{
    if (!model)
        skip();
    o->trace = px_asprintf("%s/%s.trace", px_test_tmpdir(), name);
    const char *args[40] = {"run",    "--model", model,      "--inventory",      inv,
                            "--plan", plan_path, "--prompt", "Once upon a time", "-n",
                            N_TOKENS, "-o",      "json",     "--trace",          o->trace};
    size_t n = 15;
    for (size_t i = 0; extra[i] && n + 1 < PX_ARRAY_LEN(args); i++)
        args[n++] = extra[i];
    args[n] = NULL;
    char *out = plexus(args, 0);
    o->run = parse(out, name);
    free(out);
    char *text = text_of(o->run);
    if (strcmp(text, reference) != 0)
        fail_msg("%s: the output departs from the fault-free run:\n%s\n---\n%s", name, text,
                 reference);
    free(text);
    o->incidents = json_object_get(o->run, "incidents");
    assert_true(json_is_array(o->incidents));
    size_t i;
    json_t *inc;
    json_array_foreach(o->incidents, i, inc)
    {
        px_err err;
        if (!px_heal_incident_complete(inc, &err))
            fail_msg("%s: incident %zu is incomplete: %s", name, i, err.msg);
    }
    const char *rargs[] = {"replay", o->trace, NULL};
    char *rep = plexus(rargs, 0);
    px_assert_contains(rep, "identical");
    free(rep);
}

/* The first incident of class cls, or a failure listing them. */
static const json_t *incident_of(const outcome *o, const char *cls)
{
    size_t i;
    json_t *inc;
    json_array_foreach(o->incidents, i, inc)
    {
        const char *c = json_string_value(json_object_get(json_object_get(inc, "cause"), "class"));
        if (c && !strcmp(c, cls))
            return inc;
    }
    char *all = json_dumps(o->incidents, JSON_INDENT(1));
    fail_msg("no %s incident among:\n%s", cls, all ? all : "");
    return NULL;
}

static inline double num(const json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

#endif
