/*
 * libFuzzer target for the GGUF reader: any byte string is either a model
 * or a clean refusal, never a crash, an over-read or a leak.  Accepted
 * models are also described and costed, so the graph builder and the cost
 * expressions see hostile hyper-parameters too.
 *
 * The seeds in fuzz/corpus/gguf were written by the synthetic-model writer:
 *   plexus model synth --out llama-f32.seed --dim 8 --hidden 16 --layers 1 --heads 2
 *       --kv-heads 1 --vocab 259 --context 16 --tied --seed 1
 *   plexus model synth --out llama-q8_0.seed --dim 32 --hidden 32 --layers 1 --heads 2
 *       --kv-heads 1 --vocab 16 --no-tokenizer --context 16 --dtype q8_0 --seed 2
 *   plexus model synth --out qwen2-f16.seed --arch qwen2 --dim 8 --hidden 12 --layers 2
 *       --heads 2 --kv-heads 2 --vocab 259 --context 16 --dtype f16 --tied --seed 3
 *   plexus model synth --out mixtral-f16.seed --arch mixtral --experts 2 --experts-used 1
 *       --dim 8 --hidden 8 --layers 1 --heads 2 --kv-heads 1 --vocab 259 --context 16
 *       --dtype f16 --tied --seed 4
 * (named .seed because the repository ignores *.gguf).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exactly-sized copy, so AddressSanitizer catches any read past it. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    px_ir_model *m = NULL;
    px_err err;
    if (px_ir_gguf_open_memory(copy, size, "fuzz.gguf", NULL, &m, &err) == PX_OK) {
        px_ir_describe_opts o = {.context = 7, .batch = 3, .with_ops = true, .with_tensors = true};
        json_t *j = px_ir_model_describe(m, &o);
        char *s = j ? px_json_dump_canonical(j) : NULL;
        free(s);
        json_decref(j);
        px_ir_cost c;
        /* A refusal is a fine outcome: only a crash or a leak is a finding. */
        (void)px_ir_graph_cost(m, (px_ir_dims){2, 3, 5}, &c, NULL);
        px_ir_model_free(m);
    } else if (!err.msg[0]) {
        abort(); /* every refusal explains itself */
    }
    free(copy);
    return 0;
}
