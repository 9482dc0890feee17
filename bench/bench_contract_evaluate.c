/*
 * How fast contracts answer: parsing a large contract, resolving a region,
 * and judging a transformation (the planner asks the last two for every
 * candidate it considers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/contract.h"

/* A benchmark whose set-up fails measures nothing: stop there. */
static void must(px_status st, const char *what)
{
    if (st != PX_OK) {
        fprintf(stderr, "%s: %s: %s\n", __FILE__, what, px_status_str(st));
        exit(1);
    }
}

static double per_call_ns(uint64_t t0, uint64_t t1, size_t n)
{
    return (double)(t1 - t0) / (double)n;
}

int main(void)
{
    /* 1000 region entries: exact names, ranges and globs. */
    px_strbuf sb = PX_STRBUF_INIT;
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.contract/1\", \"default\": {\"deterministic\": "
                        "true, \"tolerance\": {\"atol\": 1e-5, \"rtol\": 1e-4}}, \"regions\": {");
    for (int i = 0; i < 998; i++)
        px_strbuf_addf(&sb, "\"layer.%d.ffn\": {\"divergence\": {\"kl_max\": 0.01}}, ", i);
    px_strbuf_adds(&sb, "\"layer.*.attention\": {\"bitwise\": true}, "
                        "\"layer.0-99.attention\": {\"agreement\": {\"top1_min\": 0.99}}}}");
    px_err err;
    px_contract *c = NULL;
    const int n_parse = 20;
    uint64_t t0 = px_now_ns();
    for (int i = 0; i < n_parse; i++) {
        px_contract_free(c);
        if (px_contract_parse(sb.buf, sb.len, "bench.json", NULL, &c, &err) != PX_OK) {
            fprintf(stderr, "bench: %s\n", err.msg);
            return 1;
        }
    }
    uint64_t t1 = px_now_ns();
    printf("contract parse+validate, 1000 entries (%zu bytes): %.2f ms\n", sb.len,
           per_call_ns(t0, t1, n_parse) / 1e6);

    const char *names[] = {"layer.500.ffn", "layer.50.attention", "layer.500.attention", "head"};
    const size_t n_lookup = 20000;
    const px_contract_clause *cl;
    t0 = px_now_ns();
    for (size_t i = 0; i < n_lookup; i++)
        must(px_contract_lookup(c, names[i % 4], &cl, NULL), "lookup");
    t1 = px_now_ns();
    printf("lookup in 1000 entries: %.0f ns per region\n", per_call_ns(t0, t1, n_lookup));

    px_contract_device devs[2] = {
        {.id = "gpu0", .backend = "cuda", .arch = "sm_90", .deterministic = true},
        {.id = "gpu1", .backend = "cuda", .arch = "sm_90", .deterministic = true},
    };
    px_transform ts[2] = {
        {.kind = PX_TRANSFORM_QUANTIZE,
         .tensors = PX_TENSORS_WEIGHTS,
         .to_dtype = "q4_0",
         .devices = devs,
         .n_devices = 1},
        {.kind = PX_TRANSFORM_PIPELINE_CUT, .devices = devs, .n_devices = 2},
    };
    const size_t n_eval = 20000;
    t0 = px_now_ns();
    for (size_t i = 0; i < n_eval; i++) {
        px_contract_decision d;
        must(px_contract_evaluate(c, names[i % 4], &ts[i % 2], NULL, 0, &d, NULL), "evaluate");
        px_contract_decision_release(&d);
    }
    t1 = px_now_ns();
    printf("evaluate in 1000 entries: %.0f ns per transformation\n", per_call_ns(t0, t1, n_eval));

    px_contract *small;
    must(px_contract_builtin("relaxed", &small, NULL), "builtin relaxed");
    t0 = px_now_ns();
    for (size_t i = 0; i < n_eval; i++) {
        px_contract_decision d;
        must(px_contract_evaluate(small, names[i % 4], &ts[i % 2], NULL, 0, &d, NULL), "evaluate");
        px_contract_decision_release(&d);
    }
    t1 = px_now_ns();
    printf("evaluate under the built-in relaxed contract: %.0f ns per transformation\n",
           per_call_ns(t0, t1, n_eval));
    px_contract_free(small);
    px_contract_free(c);
    px_strbuf_release(&sb);
    return 0;
}
