/*
 * plexus/rt.h: the runtime.  Runs the models the IR describes: tensors,
 * the backend interface (device, buffer, stream), the cpu backend, the
 * transformer forward pass over a batch of sequences and a range of
 * layers, a plain scalar reference pass, tokenizers and sampling.
 *
 * Usage (greedy generation with the cpu backend):
 *
 *     px_err err;
 *     px_rt_model *model;
 *     px_rt_session *s;
 *     px_rt_model_open("stories260K.gguf", &model, &err);
 *     px_rt_session_opts so = {.n_threads = 2, .max_seqs = 1};
 *     px_rt_session_new(model, &so, &s, &err);
 *     int32_t seq;
 *     px_rt_seq_add(s, &seq, &err);
 *     int32_t prompt[] = {1, 403, 407, 261, 378};
 *     px_rt_seq_step step = {.seq = seq, .pos = 0, .n_tokens = 5, .tokens = prompt};
 *     px_rt_batch batch = {.n_seqs = 1, .seqs = &step};
 *     px_rt_output out;
 *     px_rt_forward(s, &batch, NULL, &out, &err);   // logits of the last token
 *     int32_t next = px_rt_argmax(out.data, out.row_len);
 *     ...
 *     px_rt_session_free(s);
 *     px_rt_model_free(model);
 *
 * px_rt_generate does the whole loop (tokenize, prefill, decode, sample,
 * detokenize) for one or several prompts.
 *
 * Layers.  A session holds a contiguous range of layers [layer_begin,
 * layer_end) of a model and the KV cache of those layers only, so that a
 * pipeline stage can run its part: the first stage takes token ids and
 * embeds them; every other stage takes the hidden states (the residual
 * stream) the previous stage produced; the last stage applies the final
 * norm and the classifier.  A stage may also hold no layer at all: only
 * the embedding (it passes the embedded rows on) or only the head (see
 * px_rt_session_opts.explicit_parts).
 *
 * Batches.  A step carries several sequences, each with its own position
 * and KV-cache slot, and any number of new tokens each (a prefill
 * micro-batch or one decode token).  Sequences join (px_rt_seq_add) and
 * leave (px_rt_seq_remove) between steps.
 *
 * Backends.  Three layers of function tables, as in ggml: a device says
 * what it is and what it supports, a buffer owns memory on a device, a
 * stream runs ops.  Every table starts with abi_version and size; a slot
 * exists only if it lies within size, new slots are only ever added at the
 * end, and optional slots are marked "(optional) ... defaults to ...":
 * the public wrappers supply the default.  Nothing outside a backend
 * touches tensor memory except through the buffer interface, unless the
 * buffer says it is host-visible (px_rt_buffer_base is not NULL).
 *
 * Determinism.  The cpu backend splits work by output rows (matrix rows,
 * attention heads, activation rows), never along a reduction, and every
 * output element is computed by the same code in the same order whatever
 * thread computes it: results are bit-identical from run to run, for
 * any thread count, and for any rows beside a row in a step (a prompt
 * alone, batched with others, or in chunks gives the same bits; no
 * environment variable changes them).  f32, f16 and bf16 results are the
 * same on AVX2 and AVX-512 machines but not on the portable path; q8_0
 * results (activations quantized to q8_0, integer dot products) are the
 * same on every path.  They differ from the scalar reference by float
 * rounding only (the tests bound logits to 1e-4; q8_0 models to 1e-2,
 * where an activation may round to the other quantization step).
 *
 * Thread safety: a model is immutable and may be shared by any number of
 * sessions and threads.  A session, a stream, a sampler are used by one
 * thread at a time.  The backend registry is thread-safe.
 */
#ifndef PLEXUS_RT_H
#define PLEXUS_RT_H

/* The runtime's API in four parts, each of which compiles on its own. */
#include "plexus/rt_backend.h"  /* tensors, ops, backend tables, cuda, emu */
#include "plexus/rt_session.h"  /* models, sessions, tokenizer, sampling */
#include "plexus/rt_pipeline.h" /* transport, workers, executor, faults */
#include "plexus/rt_engine.h"   /* the generation engine */

#endif /* PLEXUS_RT_H */
