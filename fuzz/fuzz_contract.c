/*
 * libFuzzer target: plexus.contract/1 from arbitrary bytes.  Parses and
 * validates; for an accepted contract, exports the canonical form, checks
 * that it parses back to the same bytes, and resolves and judges a few
 * regions.  Any crash, leak, sanitizer report or broken round trip is a
 * finding.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/contract.h"

static const char *const regions[] = {"embedding", "layer.0.attention", "layer.3.ffn",
                                      "layer.12.ffn", "head"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_contract *c = NULL;
    px_diags diags;
    px_diags_init(&diags);
    px_err err;
    if (px_contract_parse((const char *)data, size, "fuzz.json", &diags, &c, &err) != PX_OK) {
        if (c)
            abort(); /* a failed parse must not hand out a contract */
        px_diags_release(&diags);
        return 0;
    }
    char *text = px_contract_export(c);
    if (!text)
        abort();
    px_contract *back = NULL;
    if (px_contract_parse(text, strlen(text), "export.json", NULL, &back, &err) != PX_OK)
        abort(); /* the canonical form must always be a valid contract */
    char *again = px_contract_export(back);
    if (!again || strcmp(text, again) != 0)
        abort(); /* and exporting it again must give the same bytes */
    /* A refusal is a fine outcome: only a crash or a leak is a finding. */
    (void)px_contract_check_regions(c, regions, sizeof regions / sizeof regions[0], &diags, NULL);
    px_contract_device devs[2] = {
        {.id = "a", .backend = "cpu", .arch = "x86_64", .deterministic = true},
        {.id = "b", .backend = "emu", .arch = "x86_64", .deterministic = true},
    };
    px_transform ts[2] = {
        {.kind = PX_TRANSFORM_QUANTIZE,
         .tensors = PX_TENSORS_WEIGHTS,
         .to_dtype = "q4_0",
         .devices = devs,
         .n_devices = 1},
        {.kind = PX_TRANSFORM_PIPELINE_CUT, .devices = devs, .n_devices = 2},
    };
    px_contract_decision d;
    if (px_contract_evaluate_all(c, regions, sizeof regions / sizeof regions[0], ts, 2, NULL, 0, &d,
                                 &err) == PX_OK) {
        /* A bitwise clause never lets the quantization through. */
        const px_contract_clause *cl;
        for (size_t i = 0; i < sizeof regions / sizeof regions[0]; i++) {
            if (px_contract_lookup(c, regions[i], &cl, NULL) == PX_OK &&
                (cl->reqs & PX_CONTRACT_BITWISE) && d.verdict != PX_VERDICT_FORBIDDEN)
                abort();
        }
        json_t *j = px_contract_decision_to_json(&d);
        json_decref(j);
        px_contract_decision_release(&d);
    }
    free(again);
    free(text);
    px_contract_free(back);
    px_contract_free(c);
    px_diags_release(&diags);
    return 0;
}
