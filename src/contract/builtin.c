/*
 * The built-in contracts.  Their text is compiled in, so the library works
 * without the data folder; data/contracts/<name>.json carry the same
 * contracts for users to read and copy (a test keeps the two equal).
 */
#include "contract/contract_impl.h"

#include <unistd.h>

static const struct {
    const char *name;
    const char *text;
} builtins[] = {
    {"strict",
     "{\"schema\": \"plexus.contract/1\", \"name\": \"strict\",\n"
     " \"description\": \"Bit-identical to the reference in every region: only "
     "transformations with a proof of exactness are allowed.\",\n"
     " \"reference\": \"scalar-reference\",\n"
     " \"validation\": {\"prompt_set\": \"default\", \"prompts\": 16, \"tokens\": 2048},\n"
     " \"default\": {\"bitwise\": true}}\n"},
    {"deterministic",
     "{\"schema\": \"plexus.contract/1\", \"name\": \"deterministic\",\n"
     " \"description\": \"Every run of a plan gives the same bits for the same inputs and "
     "seed; results may differ from the reference.\",\n"
     " \"reference\": \"scalar-reference\",\n"
     " \"validation\": {\"prompt_set\": \"default\", \"prompts\": 16, \"tokens\": 2048},\n"
     " \"default\": {\"deterministic\": true}}\n"},
    {"relaxed",
     "{\"schema\": \"plexus.contract/1\", \"name\": \"relaxed\",\n"
     " \"description\": \"Lower precision (f16, bf16) and 8-bit quantization once validated: "
     "output distributions within 0.02 nats of the reference and the same top-1 token at 95% "
     "of positions.\",\n"
     " \"reference\": \"scalar-reference\",\n"
     " \"validation\": {\"prompt_set\": \"default\", \"prompts\": 16, \"tokens\": 2048},\n"
     " \"default\": {\"divergence\": {\"kl_max\": 0.02}, \"agreement\": {\"top1_min\": "
     "0.95}}}\n"},
};

static const char *const builtin_names[] = {"strict", "deterministic", "relaxed", NULL};

const char *const *px_contract_builtin_names(void)
{
    return builtin_names;
}

px_status px_contract_builtin(const char *name, px_contract **out, px_err *err)
{
    *out = NULL;
    for (size_t i = 0; i < PX_ARRAY_LEN(builtins); i++) {
        if (strcmp(builtins[i].name, name))
            continue;
        char label[64];
        px__fmt(label, sizeof label, "built-in contract %s", builtins[i].name);
        return px_contract_parse(builtins[i].text, strlen(builtins[i].text), label, NULL, out, err);
    }
    return px_err_set(err, PX_ENOTFOUND,
                      "\"%.64s\" is not a built-in contract; use strict, deterministic or relaxed",
                      name);
}

px_status px_contract_load(const char *spec, px_diags *diags, px_contract **out, px_err *err)
{
    *out = NULL;
    if (access(spec, F_OK) == 0)
        return px_contract_load_file(spec, diags, out, err);
    for (size_t i = 0; i < PX_ARRAY_LEN(builtins); i++)
        if (!strcmp(builtins[i].name, spec))
            return px_contract_builtin(spec, out, err);
    px_status st = px_err_set(err, PX_ENOTFOUND,
                              "%.128s: no such file, and not a built-in contract (strict, "
                              "deterministic, relaxed)",
                              spec);
    if (diags)
        px_diags_add(diags, PX_SEV_ERROR, "", "give a contract file or a built-in name", "%s",
                     err ? err->msg : px_status_str(st));
    return st;
}
