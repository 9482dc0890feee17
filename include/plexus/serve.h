/*
 * plexus/serve.h: serving a model behind an OpenAI-compatible HTTP API.
 *
 * `plexus serve` answers GET /v1/models, POST /v1/completions and POST
 * /v1/chat/completions (docs/formats/openai-api.md).  This header holds the
 * pieces of the front end that need no model running:
 *
 *   - chat templates: a conversation (system, user and assistant messages)
 *     rendered into the prompt text the model was trained on, with the
 *     template recognized from the GGUF's tokenizer.chat_template or chosen
 *     by name;
 *   - the OpenAI API: request bodies parsed into a plain struct (bounded,
 *     with every refusal in OpenAI's error shape), and the response bodies
 *     and server-sent event chunks built from a stream of token events.
 *
 *     px_serve_request req;
 *     px_serve_error e;
 *     if (px_serve_request_parse(PX_SERVE_API_CHAT, body, len, NULL, &req, &e) != PX_OK)
 *         return reply(e.http_status, px_serve_error_json(&e));
 *     char *prompt;
 *     size_t prompt_len;
 *     px_serve_chat_render_opts ro = {.add_generation_prompt = true};
 *     px_serve_chat_template_render(tmpl, req.messages, req.n_messages, &ro, &prompt,
 *                                   &prompt_len, &err);
 *     // encode with PX_RT_ENCODE_SPECIAL (and PX_RT_ENCODE_BOS when
 *     // px_serve_chat_template_info(tmpl)->add_bos), generate, and for
 *     // each token: px_serve_response_token(resp, &event, &sse, &stopped, &err)
 *
 * Thread safety: templates are immutable once made and may be shared by
 * threads; a request or a response belongs to one thread at a time.
 */
#ifndef PLEXUS_SERVE_H
#define PLEXUS_SERVE_H

#include "plexus/base.h"
#include "plexus/heal.h"
#include "plexus/ir.h"
#include "plexus/plan.h"
#include "plexus/rt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================== */
/* Chat templates                                                      */
/* ================================================================== */
/*
 * Built-in renderers, written in C, for the chat templates found in
 * common GGUF files (there is no Jinja engine).  Each reproduces its
 * template's Jinja byte for byte for conversations of system, user and
 * assistant messages: chatml, llama-2, llama-3, llama-3.1, mistral and its
 * versions (mistral-v1, -v3, -v3-tekken, -v7, -v7-tekken), gemma, phi-3,
 * phi-4, zephyr, vicuna, vicuna-orca, deepseek, deepseek3, command-r,
 * openchat.  px_serve_chat_template_names lists them; docs/formats/
 * openai-api.md says what each renders and how it is recognized.
 *
 * BOS: a renderer never writes the BOS text at the start of the prompt.
 * Where the template's Jinja starts with bos_token, or the model asks for
 * a BOS (tokenizer.ggml.add_bos_token, llama.cpp's rule), info->add_bos
 * is true and the caller encodes with PX_RT_ENCODE_BOS, so the BOS is the
 * tokenizer's id and never doubled.  BOS and EOS texts inside the
 * conversation (llama-2's "</s><s>[INST]") are written as text and become
 * their ids when encoded with PX_RT_ENCODE_SPECIAL.
 */

/* Bounds on a conversation; requests beyond them are refused. */
#define PX_SERVE_CHAT_MAX_MESSAGES 1024
#define PX_SERVE_CHAT_MAX_BYTES    ((size_t)8 << 20) /* content of all messages */

typedef enum px_serve_role {
    PX_SERVE_ROLE_SYSTEM = 0, /* also OpenAI's "developer" */
    PX_SERVE_ROLE_USER,
    PX_SERVE_ROLE_ASSISTANT,
    PX_SERVE_ROLE_COUNT_
} px_serve_role;

/* "system", "user", "assistant"; "?" out of range. */
const char *px_serve_role_name(px_serve_role role);

/* One message.  content is len bytes of UTF-8 (not necessarily
 * NUL-terminated), borrowed. */
typedef struct px_serve_chat_msg {
    px_serve_role role;
    const char *content;
    size_t len;
} px_serve_chat_msg;

/* A template chosen for a model: a built-in renderer and what it takes
 * from the model (BOS and EOS texts, a default system message). */
typedef struct px_serve_chat_template px_serve_chat_template;

/* Recognizes which built-in a GGUF's tokenizer.chat_template (the Jinja
 * source, len bytes) is, from markers ("<|im_start|>", "[INST]",
 * "<start_of_turn>", ...; docs/formats/openai-api.md has the table).  A
 * default system message the Jinja writes when the conversation has none
 * (Qwen's, DeepSeek Coder's) is taken from it.  detail may be NULL;
 * on PX_ENOTFOUND it receives the whole explanation (err's message is cut
 * at 255 bytes).  Returns an owned template (px_serve_chat_template_free)
 * with the built-in's usual BOS and EOS texts.
 * Errors: PX_ENOTFOUND when no built-in matches: the message names the
 * markers found and the built-in names, the fix being --chat-template
 * NAME; PX_ELIMIT for a template over 1 MiB; PX_ENOMEM. */
PX_NODISCARD px_status px_serve_chat_template_detect(const char *jinja, size_t len,
                                                     px_serve_chat_template **out,
                                                     px_strbuf *detail, px_err *err);
/* The built-in called name (as listed, or llama.cpp's spelling: "llama2",
 * "llama3", "phi3", "phi4").  Returns owned.  Errors: PX_ENOTFOUND
 * listing the names. */
PX_NODISCARD px_status px_serve_chat_template_by_name(const char *name,
                                                      px_serve_chat_template **out, px_err *err);
/* The template for a model: the built-in called name when name is not
 * NULL, else the one recognized from the model's tokenizer.chat_template.
 * BOS and EOS texts come from the model's vocabulary, and add_bos from the
 * template and tokenizer.ggml.add_bos_token.  m is borrowed.  Errors:
 * PX_ENOTFOUND (no tokenizer.chat_template: pass --chat-template NAME; or
 * as detect and by_name), PX_ENOMEM. */
PX_NODISCARD px_status px_serve_chat_template_for_model(const px_ir_model *m, const char *name,
                                                        px_serve_chat_template **out, px_err *err);
void px_serve_chat_template_free(px_serve_chat_template *t); /* NULL is a no-op */

/* The built-in names, space-separated (static). */
const char *px_serve_chat_template_names(void);

typedef struct px_serve_chat_template_info {
    const char *name;        /* "chatml" */
    const char *description; /* "ChatML (Qwen 2 and 2.5, Hermes, SmolLM, ...)" */
    /* Encode the prompt with PX_RT_ENCODE_BOS. */
    bool add_bos;
    /* Texts that end the assistant's turn ("<|im_end|>"; the EOS text for
     * templates that end turns with it): stop tokens where the vocabulary
     * has them (px_rt_tokenizer_find), stop strings otherwise. */
    const char *const *stops;
    size_t n_stops;
    /* What the alternation rule and the system rule require, in words
     * ("user and assistant alternate, user first, after an optional
     * system message"); NULL when the template takes any order. */
    const char *order_rule;
    const char *bos_text, *eos_text;
    const char *default_system; /* NULL: none */
} px_serve_chat_template_info;

/* Owned by the template. */
const px_serve_chat_template_info *px_serve_chat_template_info_get(const px_serve_chat_template *t);

/* Checks a conversation against the bounds and the template's rules: at
 * least one message, at most PX_SERVE_CHAT_MAX_MESSAGES and
 * PX_SERVE_CHAT_MAX_BYTES of content, known roles, a system message only
 * first where the template places it so (most do), and user/assistant
 * alternation, user first, where the template's Jinja raises an exception
 * otherwise (llama-2, mistral*, gemma, command-r).  *bad (may be NULL)
 * receives the index of the offending message, or SIZE_MAX when the
 * problem is the whole list.  Errors: PX_EINVAL, PX_ELIMIT, with messages
 * starting "messages[i]: ". */
PX_NODISCARD px_status px_serve_chat_template_check(const px_serve_chat_template *t,
                                                    const px_serve_chat_msg *msgs, size_t n,
                                                    size_t *bad, px_err *err);

typedef struct px_serve_chat_render_opts {
    /* Append the start of an assistant turn ("<|im_start|>assistant\n"). */
    bool add_generation_prompt;
    /* "26 Jul 2024": the date for templates that print today's date
     * (Llama 3.2); NULL takes today's UTC date.  Llama 3.1 prints its
     * fixed "26 Jul 2024" whatever this says, as its Jinja does. */
    const char *date;
} px_serve_chat_render_opts;

/* Renders the conversation (checked first, as px_serve_chat_template_check)
 * into *text (owned: free(); NUL-terminated, *len bytes).  opts may be
 * NULL (no generation prompt).  Errors: those of check, PX_ENOMEM. */
PX_NODISCARD px_status px_serve_chat_template_render(const px_serve_chat_template *t,
                                                     const px_serve_chat_msg *msgs, size_t n,
                                                     const px_serve_chat_render_opts *opts,
                                                     char **text, size_t *len, px_err *err);

/* ================================================================== */
/* OpenAI API                                                          */
/* ================================================================== */

typedef enum px_serve_api {
    PX_SERVE_API_COMPLETIONS = 0, /* POST /v1/completions */
    PX_SERVE_API_CHAT,            /* POST /v1/chat/completions */
} px_serve_api;

/* ---- errors ---- */

/* Each kind has its HTTP status, OpenAI "type" and "code". */
typedef enum px_serve_error_kind {
    PX_SERVE_ERR_INVALID_REQUEST = 0, /* 400 invalid_request_error */
    PX_SERVE_ERR_CONTEXT_LENGTH,      /* 400 invalid_request_error, context_length_exceeded */
    PX_SERVE_ERR_UNAUTHORIZED,        /* 401 invalid_request_error, invalid_api_key */
    PX_SERVE_ERR_NOT_FOUND,           /* 404 invalid_request_error (no such route) */
    PX_SERVE_ERR_MODEL_NOT_FOUND,     /* 404 invalid_request_error, model_not_found */
    PX_SERVE_ERR_METHOD,              /* 405 invalid_request_error, method_not_allowed */
    PX_SERVE_ERR_TOO_LARGE,           /* 413 invalid_request_error, request_too_large */
    PX_SERVE_ERR_RATE_LIMIT,          /* 429 requests, rate_limit_exceeded */
    PX_SERVE_ERR_INTERNAL,            /* 500 server_error */
    PX_SERVE_ERR_UNAVAILABLE,         /* 503 server_error, service_unavailable */
    PX_SERVE_ERR_KIND_COUNT_
} px_serve_error_kind;

/* An error in OpenAI's shape: {"error": {"message", "type", "param",
 * "code"}} with the HTTP status to answer with.  Value struct. */
typedef struct px_serve_error {
    px_serve_error_kind kind;
    int http_status;
    char param[96];    /* the request member at fault ("messages[2].role"); "" for null */
    char message[512]; /* names the member, the value and the fix */
} px_serve_error;

/* Fills e (which may be NULL) and returns the px_status matching kind
 * (PX_EINVAL for 400, PX_ELIMIT for 400 context_length_exceeded, 413 and
 * 429, PX_EAUTH for 401, PX_ENOTFOUND for 404, PX_EUNSUPPORTED for 405,
 * PX_EINTERNAL for 500, PX_ESTATE for 503).  param may be NULL.
 * Thread-safe. */
px_status px_serve_error_set(px_serve_error *e, px_serve_error_kind kind, const char *param,
                             const char *fmt, ...) PX_PRINTF(4, 5);
const char *px_serve_error_type(px_serve_error_kind kind); /* "invalid_request_error" */
const char *px_serve_error_code(px_serve_error_kind kind); /* "model_not_found"; NULL: null */
int px_serve_error_status(px_serve_error_kind kind);       /* 400 */
/* The response body, compact JSON.  Returns owned (free()), NULL when
 * memory runs out. */
char *px_serve_error_json(const px_serve_error *e);
/* The error as one server-sent event ("data: {\"error\": ...}\n\n"), for a
 * stream that fails after its headers went out.  Appends to out. */
px_status px_serve_error_sse(const px_serve_error *e, px_strbuf *out);

/* ---- requests ---- */

#define PX_SERVE_MAX_STOP         4  /* stop strings, as OpenAI */
#define PX_SERVE_MAX_TOP_LOGPROBS 20 /* chat; completions take at most 5 */

/* Bounds applied to request bodies.  Zero fields take the defaults. */
typedef struct px_serve_limits {
    size_t max_body_bytes;    /* default 8 MiB; more is 413 */
    size_t max_string_bytes;  /* one string (prompt, content): default 4 MiB */
    size_t max_messages;      /* default PX_SERVE_CHAT_MAX_MESSAGES */
    size_t max_prompt_tokens; /* a prompt given as token ids: default 131072 */
    uint32_t max_new_tokens;  /* largest max_tokens accepted: default 1 << 20 */
    size_t max_stop_bytes;    /* one stop string: default 256 */
    uint32_t n_vocab;         /* token ids must be below it; 0: unchecked */
} px_serve_limits;

/* A parsed request.  Everything it points to belongs to it (released by
 * px_serve_request_release).  Fields absent from the body keep the
 * defaults written beside them. */
typedef struct px_serve_request {
    px_serve_api api;
    const char *model; /* NULL when absent */
    /* Completions: the prompt as text (prompt != NULL) or as token ids
     * (prompt_tokens != NULL); exactly one of them. */
    const char *prompt;
    size_t prompt_len;
    const int32_t *prompt_tokens;
    size_t n_prompt_tokens;
    /* Chat: the conversation, "developer" mapped to system, text content
     * parts joined with "\n". */
    const px_serve_chat_msg *messages;
    size_t n_messages;
    uint32_t max_tokens; /* max_completion_tokens or max_tokens; 0: not given */
    double temperature;  /* 1; 0 is greedy */
    double top_p;        /* 1 */
    int32_t top_k;       /* 0: off */
    double min_p;        /* 0: off */
    bool has_seed;
    uint64_t seed;   /* an int64 seed's bits */
    bool ignore_eos; /* generate past EOS (llama.cpp's and vLLM's extension) */
    const char *stop[PX_SERVE_MAX_STOP];
    size_t stop_len[PX_SERVE_MAX_STOP];
    size_t n_stop;
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    /* Log-probabilities: chat's logprobs=true (top_logprobs alternatives,
     * 0..20), completions' logprobs=N (N alternatives, 0..5). */
    bool logprobs;
    uint32_t top_logprobs;
    px_arena *arena; /* private: owns the strings and arrays above */
} px_serve_request;

/* Parses the body of POST /v1/completions or /v1/chat/completions.
 * Unknown members are ignored (as OpenAI does); a member of the wrong type
 * or value is refused naming it.  Accepted but refused when set: n other
 * than 1, best_of other than 1, echo, suffix, non-zero presence and
 * frequency penalties, logit_bias, tools and tool calls, response formats
 * other than text, non-text content parts; several prompts in one request.
 * lim may be NULL.  On success out owns its memory; on failure out is
 * empty (release is still safe) and e (may be NULL) says why, with 400 or
 * 413.  Errors: PX_EINVAL (400), PX_ELIMIT (413, or 400 for a bound on a
 * value), PX_ENOMEM (500). */
PX_NODISCARD px_status px_serve_request_parse(px_serve_api api, const char *body, size_t len,
                                              const px_serve_limits *lim, px_serve_request *out,
                                              px_serve_error *e);
/* Frees what the request owns and empties it.  Safe on an empty request. */
void px_serve_request_release(px_serve_request *r); /* NULL is a no-op */

/* ---- responses ---- */

typedef enum px_serve_finish {
    PX_SERVE_FINISH_STOP = 0, /* end of turn, EOS or a stop string: "stop" */
    PX_SERVE_FINISH_LENGTH,   /* max_tokens or the context: "length" */
} px_serve_finish;

/* An alternative at a position, for top_logprobs. */
typedef struct px_serve_token_alt {
    int32_t id;
    const char *text; /* its text as shown (px_rt_tokenizer_token_text); borrowed */
    size_t len;
    float logprob; /* natural log; -inf is written as -9999, as OpenAI does */
} px_serve_token_alt;

/* One generated token, as the engine hands it to the front end. */
typedef struct px_serve_token_event {
    int32_t id;
    /* The bytes it adds to the output (px_rt_tokenizer_decode); may end or
     * start in the middle of a UTF-8 character.  Borrowed for the call. */
    const char *text;
    size_t len;
    float logprob;                 /* when logprobs were asked */
    const px_serve_token_alt *top; /* n_top alternatives, best first; borrowed */
    size_t n_top;
} px_serve_token_event;

typedef struct px_serve_usage {
    uint64_t prompt_tokens;
    uint64_t completion_tokens;
} px_serve_usage;

typedef struct px_serve_response_opts {
    px_serve_api api;
    const char *id;    /* "chatcmpl-..." (px_serve_response_id); copied */
    const char *model; /* copied */
    int64_t created;   /* Unix seconds */
    bool stream;
    bool include_usage;
    bool logprobs;
    uint32_t top_logprobs; /* alternatives written per token (at most those given) */
    /* Stop strings (copied): the text is cut before the first one and the
     * response ends with "stop". */
    const char *const *stop;
    const size_t *stop_len; /* may be NULL: NUL-terminated */
    size_t n_stop;
} px_serve_response_opts;

/* Builds one response (one choice) from token events.  Text is held back
 * while it ends in an incomplete UTF-8 character or in what may be the
 * start of a stop string, so that no chunk carries invalid UTF-8 or part
 * of a stop string; tokens are emitted whole with their text, so logprobs
 * stay aligned with it. */
typedef struct px_serve_response px_serve_response;

/* Returns owned (px_serve_response_free).  Errors: PX_EINVAL (no id or
 * model, more than PX_SERVE_MAX_STOP stop strings, an empty one),
 * PX_ENOMEM. */
PX_NODISCARD px_status px_serve_response_new(const px_serve_response_opts *o,
                                             px_serve_response **out, px_err *err);
void px_serve_response_free(px_serve_response *r); /* NULL is a no-op */

/* Streaming chat: appends the first chunk (delta.role "assistant"), if not
 * sent yet, to out; token and finish call it themselves.  Other kinds of
 * response append nothing. */
PX_NODISCARD px_status px_serve_response_begin(px_serve_response *r, px_strbuf *out, px_err *err);
/* Feeds one token (not the EOS or end-of-turn token that ends the turn:
 * finish with PX_SERVE_FINISH_STOP instead).  Streaming, appends the
 * chunks ready ("data: {...}\n\n") to out; otherwise keeps the text for
 * finish.  *stopped (may be NULL) becomes true when a stop string has just
 * completed: generation should end and finish be called.  Errors:
 * PX_ESTATE after a stop or finish, PX_ENOMEM. */
PX_NODISCARD px_status px_serve_response_token(px_serve_response *r, const px_serve_token_event *ev,
                                               px_strbuf *out, bool *stopped, px_err *err);
/* Ends the response: appends the held-back text (an incomplete character
 * at the very end becomes U+FFFD), then, streaming, the chunk with
 * finish_reason, the usage chunk (include_usage) and "data: [DONE]\n\n";
 * otherwise the whole body (text_completion or chat.completion, with
 * usage).  A stop string seen forces "stop".  Errors: PX_ESTATE when
 * already finished, PX_ENOMEM. */
PX_NODISCARD px_status px_serve_response_finish(px_serve_response *r, px_serve_finish reason,
                                                const px_serve_usage *usage, px_strbuf *out,
                                                px_err *err);
/* The text emitted so far (without stop strings); owned by r. */
const char *px_serve_response_text(const px_serve_response *r, size_t *len);

/* A response id: "cmpl-" or "chatcmpl-" and 24 hex digits derived from
 * seq and salt (a process-wide random value keeps ids unique across
 * restarts). */
void px_serve_response_id(px_serve_api api, uint64_t seq, uint64_t salt, char out[40]);

/* GET /v1/models: {"object": "list", "data": [{"id", "object": "model",
 * "created", "owned_by"}]} for n model ids (borrowed).  Returns owned
 * (free()), NULL when memory runs out. */
char *px_serve_models_json(const char *const *ids, size_t n, int64_t created, const char *owned_by);

/* ================================================================== */
/* The server                                                          */
/* ================================================================== */
/*
 * `plexus serve`: a model behind the OpenAI API on HTTP.  The model runs
 * in this process on the cpu (one session), or as a plan's stage workers
 * (every replica of the plan, each an executor under a healing
 * supervisor, so that a worker killed or a link degraded mid-stream is
 * handled and the streams go on with the same tokens).  Each replica has
 * a generation engine (continuous batching, plexus/rt.h) on a thread of
 * its own; requests go to the least loaded replica.  HTTP runs on
 * libmicrohttpd, one thread per connection; a request is authenticated
 * (Authorization: Bearer KEY, when a key is set) before its body is read.
 *
 *     GET  /health                 {"status": "ok"}, and with the key the
 *                                  replicas, their stages and incidents
 *     GET  /metrics                Prometheus text
 *     GET  /v1/models
 *     POST /v1/completions         stream or not
 *     POST /v1/chat/completions    stream or not
 *
 *     px_serve_opts so = {.model_path = "model.gguf", .listen = "127.0.0.1:8080"};
 *     px_serve *s;
 *     px_serve_new(&so, &s, &err);     // loads, starts workers, listens
 *     ...                              // until a signal
 *     px_serve_free(s);                // stops listening, ends every request
 *
 * Thread safety: px_serve_address and px_serve_stop may be called from any
 * thread; new and free from one.
 */

typedef struct px_serve px_serve;

typedef struct px_serve_opts {
    const char *model_path;    /* required (borrowed, copied) */
    const char *model_name;    /* the id in /v1/models; NULL: the file's name */
    const char *listen;        /* "HOST:PORT" (IPv4); NULL: "127.0.0.1:8080"; port 0 picks one */
    const char *api_key;       /* NULL: no authentication (copied, never logged) */
    const char *chat_template; /* a built-in's name; NULL: from the model */
    /* In this process (plan NULL): one cpu session. */
    uint32_t n_threads; /* 0: the online CPUs */
    /* Through stage workers: the plan (borrowed), its inventory (borrowed;
     * may be NULL), the executor's options, healing. */
    const json_t *plan;
    const px_hw_graph *graph;
    const json_t *inventory_doc;
    px_rt_executor_opts executor;
    px_plan_request request;       /* what the plan was made for (healing plans alike) */
    bool heal;                     /* false: faults are detected and reported only */
    const px_heal_inject *injects; /* borrowed; replica 0's */
    size_t n_injects;
    /* The engine. */
    uint32_t max_seqs;    /* sequences at once per replica; 0: each replica's batch in
                             the plan, 16 without one */
    uint32_t context;     /* 0: the model's */
    uint32_t step_tokens; /* rows per step; 0: 512 */
    uint32_t kv_blocks;   /* 0: enough for every sequence's whole context */
    uint32_t max_queue;   /* requests waiting per replica; 0: 64.  More: 429 */
    /* HTTP. */
    uint32_t max_connections; /* 0: 256 */
    size_t max_body_bytes;    /* 0: 8 MiB */
} px_serve_opts;

/* Loads the model and its tokenizer, picks the chat template (an unknown
 * one is an error naming the built-ins, unless chat is never asked for:
 * then POST /v1/chat/completions answers with that error), starts every
 * replica and listens.  o is copied.  Returns owned (px_serve_free).
 * Errors: PX_EINVAL (options, naming them), the model's, the planner's
 * and executor's, PX_EIO (cannot listen, naming the address). */
PX_NODISCARD px_status px_serve_new(const px_serve_opts *o, px_serve **out, px_err *err);
/* "127.0.0.1:PORT" as bound (borrowed). */
const char *px_serve_address(const px_serve *s);
/* Stops taking connections (thread-safe); free finishes the job. */
void px_serve_stop(px_serve *s);

/* What the server has served since it started, as counters that only
 * grow, so that a reporter takes the difference of two readings over its
 * window.  The latency histograms are those of /metrics, per bucket (not
 * cumulative): counts[i] for values up to bounds[i] (seconds) and above
 * bounds[i-1], counts[PX_SERVE_BUCKETS] above the last bound. */
#define PX_SERVE_BUCKETS 14
typedef struct px_serve_figures {
    uint64_t completions;       /* requests answered 2xx */
    uint64_t completion_tokens; /* tokens generated */
    double bounds[PX_SERVE_BUCKETS];
    uint64_t ttft[PX_SERVE_BUCKETS + 1]; /* arrival to first token */
    uint64_t tpot[PX_SERVE_BUCKETS + 1]; /* mean time between a request's later tokens */
} px_serve_figures;
/* Reads them (thread-safe). */
void px_serve_figures_get(px_serve *s, px_serve_figures *out);
/* The q-quantile (0 < q < 1) of a histogram's counts (a difference of two
 * readings may be given), interpolated within its bucket; NAN when it is
 * empty, the last bound when the quantile lies above it. */
double px_serve_figures_quantile(const double bounds[PX_SERVE_BUCKETS],
                                 const uint64_t counts[PX_SERVE_BUCKETS + 1], double q);
/* What each replica's stages took per decode step at the batches it ran,
 * as run reports for `plexus calibrate --from-run` (thread-safe): a
 * "plexus.serve-run/1" document whose "runs" hold one "plexus.run/1"
 * report per replica over stage workers, window of about a second (the
 * last 16 closed and the open one) and class of rows (steps of 2^c to
 * 2^(c+1) - 1 decode rows, no prompt chunk) with PX_SERVE_REPORT_MIN_STEPS
 * steps or more; at most PX_SERVE_REPORT_MAX_RUNS, the first replicas'
 * first.  A window is a sample, so a fit sees how the steps spread.  A
 * stage's observed decode step is its compute as it ran, its thread's
 * waits for a core included (they are given beside it too): what the
 * stage takes on a host its replicas share.  The windows start again
 * where healing moved a replica.  NULL when out of memory. */
#define PX_SERVE_REPORT_MIN_STEPS 8
#define PX_SERVE_REPORT_MAX_RUNS  1024
json_t *px_serve_run_report(px_serve *s);
/* Stops listening, ends every request and every replica (workers shut
 * down).  NULL is a no-op. */
void px_serve_free(px_serve *s);

#ifdef __cplusplus
}
#endif
#endif /* PLEXUS_SERVE_H */
