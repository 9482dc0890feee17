/* plexus serve: a model behind an OpenAI-compatible HTTP endpoint. */
#include "cli/cli.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plexus/contract.h"
#include "plexus/heal.h"
#include "plexus/hw.h"
#include "plexus/plan.h"
#include "plexus/rt.h"
#include "plexus/serve.h"

const char px__cmd_serve_summary[] =
    "serve a model over an OpenAI-compatible HTTP API, batching requests continuously";

#define MAX_INJECTS 16

typedef struct serve_args {
    const char *model, *inventory, *plan, *objective, *contract, *key_file, *run_report;
    px_serve_opts so;
    uint32_t threads, timeout_ms;
    px_rt_transport transport;
    const char *stage_host; /* --transport tcp:A.B.C.D */
    px_heal_inject injects[MAX_INJECTS];
    uint32_t n_injects;
    bool no_heal;
} serve_args;

static serve_args S;
static px_cli_list injects;
static px__cli_transport transport;

static const px_cli_opt opts[] = {
    PX_CLI_OPT("model", 'm', PX_CLI_STR, &S.model, "FILE", "a GGUF model with its tokenizer",
               .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("inventory", 'i', PX_CLI_STR, &S.inventory, "FILE",
               "the devices to plan on (their backends, emulation)"),
    PX_CLI_OPT("plan", 0, PX_CLI_STR, &S.plan, "FILE|auto",
               "a plexus.plan/1 document, or auto (default with\n"
               "--inventory): the planner's choice"),
    PX_CLI_OPT("objective", 0, PX_CLI_STR, &S.objective, "NAME",
               "for auto: throughput (default) or latency"),
    PX_CLI_OPT("contract", 0, PX_CLI_STR, &S.contract, "FILE|NAME",
               "numerical contract for the planner"),
    PX_CLI_OPT("listen", 0, PX_CLI_STR, &S.so.listen, "HOST:PORT",
               "default 127.0.0.1:8080 (port 0: any free port)"),
    PX_CLI_OPT("api-key-file", 0, PX_CLI_STR, &S.key_file, "FILE",
               "clients must send \"Authorization: Bearer KEY\" with the\n"
               "key this file holds (mode 0600: not readable by others)"),
    PX_CLI_OPT("chat-template", 0, PX_CLI_STR, &S.so.chat_template, "NAME",
               "the chat template, when the model's is missing or to\n"
               "override it (chatml, llama-2, llama-3, mistral, gemma,\n"
               "phi-3, zephyr, ...)"),
    PX_CLI_OPT("model-name", 0, PX_CLI_STR, &S.so.model_name, "NAME",
               "the model's id in the API (default: the file's name)"),
    PX_CLI_OPT("threads", 0, PX_CLI_U32, &S.threads, "N",
               "cpu threads in this process (default: every cpu); per\n"
               "worker with a plan (default 1)",
               .hi = 1024),
    PX_CLI_OPT("max-seqs", 0, PX_CLI_U32, &S.so.max_seqs, "N",
               "sequences decoding together per replica (default 16;\n"
               "with a plan, each replica's batch in the plan)",
               .hi = 4096),
    PX_CLI_OPT("context", 0, PX_CLI_U32, &S.so.context, "N",
               "positions per sequence (default: the model's)", .hi = 1u << 24),
    PX_CLI_OPT("step-tokens", 0, PX_CLI_U32, &S.so.step_tokens, "N",
               "rows per step: prefill chunks and decode (default 512)", .hi = 1u << 20),
    PX_CLI_OPT("kv-blocks", 0, PX_CLI_U32, &S.so.kv_blocks, "N",
               "KV-cache blocks of 16 positions (default: every\n"
               "sequence's whole context)",
               .hi = INT32_MAX),
    PX_CLI_OPT("max-connections", 0, PX_CLI_U32, &S.so.max_connections, "N",
               "HTTP connections open at once (default 256)", .lo = 1, .hi = 65536),
    PX_CLI_OPT("queue", 0, PX_CLI_U32, &S.so.max_queue, "N",
               "requests waiting per replica before 429 (default 64)", .hi = 1u << 20),
    PX_CLI_OPT("inject", 0, PX_CLI_LIST, &injects, "SPEC",
               "inject a fault into replica 0, as plexus run --inject"),
    PX_CLI_OPT("no-heal", 0, PX_CLI_FLAG, &S.no_heal, NULL,
               "detect and report faults, change nothing"),
    PX_CLI_OPT("transport", 0, PX_CLI_CALL, &transport, "KIND",
               "with a plan: unix sockets (default), tcp on 127.0.0.1,\n"
               "or tcp:A.B.C.D: workers started by a launcher on that\n"
               "address, every connection authenticated with the\n"
               "pipeline's secret",
               .parse = px__cli_parse_transport),
    PX_CLI_OPT("run-report", 0, PX_CLI_STR, &S.run_report, "FILE",
               "with a plan: on stopping, write what each replica's\n"
               "stages took per decode step at each batch it ran, for\n"
               "plexus calibrate --from-run FILE"),
    PX_CLI_OPT("timeout-ms", 0, PX_CLI_U32, &S.timeout_ms, "T",
               "limit of every wait on a worker (default 10000)", .hi = 86400000),
    {0},
};

static const px_cli_spec spec = {
    .name = "serve",
    .synopsis = "--model FILE [--inventory FILE] [--plan FILE|auto] [options]",
    .about = "Serves GET /v1/models, POST /v1/completions and POST /v1/chat/completions (stream\n"
             "or not), GET /health and GET /metrics (Prometheus) until interrupted.  Requests\n"
             "join the running batch at step boundaries; prompts are prefilled in chunks mixed\n"
             "with decoding; the KV cache is paged, and requests wait (or are preempted) when\n"
             "it is full; a full queue answers 429 with Retry-After.\n"
             "\n"
             "Without --inventory or --plan the model runs in this process on the cpu.  With\n"
             "them it runs as the plan's stage workers, every replica of the plan serving,\n"
             "each under the healing loop: a worker killed or a link degraded while serving\n"
             "is detected, the plan changed, the KV caches rebuilt, and the streams go on.",
    .opts = opts,
    .examples = "plexus serve --model model.gguf --listen 127.0.0.1:8080\n"
                "curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: "
                "application/json' \\\n"
                "     -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'\n"
                "plexus serve --model model.gguf --inventory data/scenarios/emu-small.json\n"
                "plexus serve --model model.gguf --inventory inv.json --run-report served.json\n"
                "plexus calibrate -i inv.json -m model.gguf --no-bench --calibration cal.json \\\n"
                "    --from-run served.json --out cal2.json\n",
};
const px_cli_spec *const px__cmd_serve_specs[] = {&spec, NULL};

static int parse_args(int argc, char **argv, serve_args *a)
{
    memset(&S, 0, sizeof S);
    memset(&injects, 0, sizeof injects);
    transport = (px__cli_transport){0};
    S.timeout_ms = 10000;
    *a = S;
    px_cli_args args;
    int rc;
    if (!px__cli_parse(&spec, argc, argv, &args, &rc))
        return rc == PX_EXIT_OK ? -1 : rc;
    *a = S;
    if (!px__cli_parse_injects("serve", &injects, a->injects, MAX_INJECTS, &a->n_injects))
        return PX_EXIT_USAGE;
    a->transport = transport.kind;
    a->stage_host = transport.host;
    if (a->plan && !strcmp(a->plan, "auto") && !a->inventory)
        return px__cli_usage_error("serve", "--plan auto needs --inventory FILE to plan on");
    if (a->run_report && !a->plan && !a->inventory)
        return px__cli_usage_error("serve", "--run-report describes stage workers: pass "
                                            "--inventory FILE (and --plan)");
    if (a->n_injects && !a->plan && !a->inventory)
        return px__cli_usage_error("serve", "--inject needs stage workers: pass --inventory "
                                            "FILE (and --plan)");
    return PX_EXIT_OK;
}

/* Reads the API key: a file only its owner may read, one line. */
static px_status read_key(const char *path, char **out, px_err *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return px_err_set(err, PX_ENOTFOUND, "--api-key-file %s: %s", path, strerror(errno));
    if (sb.st_mode & (S_IRWXG | S_IRWXO))
        return px_err_set(err, PX_EAUTH,
                          "--api-key-file %s is readable by other users (mode %04o): run "
                          "`chmod 600 %s`",
                          path, (unsigned)(sb.st_mode & 07777), path);
    size_t len;
    px_status st = px_read_file(path, 4096, out, &len, err);
    if (st)
        return st;
    while (len && ((*out)[len - 1] == '\n' || (*out)[len - 1] == '\r' || (*out)[len - 1] == ' '))
        (*out)[--len] = 0;
    if (len == 0 || strchr(*out, '\n')) {
        explicit_bzero(*out, len);
        free(*out);
        *out = NULL;
        return px_err_set(err, PX_EINVAL, "--api-key-file %s: expected the key on one line", path);
    }
    return PX_OK;
}

/* Writes the run report (px_serve_run_report) to path. */
static px_status write_report(px_serve *s, const char *path, px_err *err)
{
    json_t *doc = px_serve_run_report(s);
    char *text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    size_t runs = json_array_size(json_object_get(doc, "runs"));
    json_decref(doc);
    if (!text)
        return px_err_set(err, PX_ENOMEM, "--run-report %s: out of memory", path);
    px_status st = px_write_file(path, text, strlen(text), err);
    free(text);
    if (st != PX_OK)
        return px_err_prefix(err, st, "--run-report %s: ", path);
    if (runs == 0)
        fprintf(stderr,
                "plexus serve: --run-report %s: no batch ran %d decode steps or more: the report "
                "holds no runs\n",
                path, PX_SERVE_REPORT_MIN_STEPS);
    px__cli_wrote("serve", path, "the run report");
    return PX_OK;
}

/* The plan to serve: the file, or the planner's for the inventory. */
static px_status get_plan(const serve_args *a, const px_hw_graph *g, const px_ir_model *ir,
                          px_plan_request *req, px_contract **contract, json_t **out, px_err *err)
{
    px_plan_request_default(req);
    req->objective = PX_PLAN_OBJ_THROUGHPUT;
    /* The stage workers run one device per stage. */
    req->max_tp = 1;
    px_status st = PX_OK;
    if (a->objective && (st = px_plan_objective_parse(a->objective, &req->objective, err)))
        return st;
    if (a->contract && (st = px_contract_load(a->contract, NULL, contract, err)))
        return px_err_prefix(err, st, "contract %s: ", a->contract);
    const px_ir_hparams *hp = px_ir_model_hparams(ir);
    req->graph = g;
    req->model = ir;
    req->contract = *contract;
    if (a->so.max_seqs)
        req->workload.batch = a->so.max_seqs;
    req->workload.context = a->so.context        ? a->so.context
                            : hp->context_length ? hp->context_length
                                                 : 2048;
    if (a->plan && strcmp(a->plan, "auto"))
        return px_json_load_file(a->plan, NULL, out, err);
    px_plan *plan = NULL;
    if ((st = px_plan_search(req, &plan, err)) != PX_OK)
        return st;
    *out = px_plan_to_json(plan);
    px_plan_free(plan);
    return *out ? PX_OK : px_err_set(err, PX_ENOMEM, "out of memory");
}

static void describe(const px_serve *s, const serve_args *a, const json_t *plan)
{
    fprintf(stderr, "plexus serve: %s on http://%s/v1", a->model, px_serve_address(s));
    if (!plan) {
        fprintf(stderr, " (in this process, on the cpu)\n");
        return;
    }
    uint32_t n = px_rt_plan_replicas(plan);
    fprintf(stderr, " (%u replica%s of plan %s)\n", n, n == 1 ? "" : "s",
            json_string_value(json_object_get(plan, "id"))
                ? json_string_value(json_object_get(plan, "id"))
                : "?");
    if (json_is_true(json_object_get(plan, "emulated")))
        fprintf(stderr, "plexus serve: the plan uses EMULATED devices: their speed comes from "
                        "emulation profiles on this machine, not from real hardware\n");
}

int px__cmd_serve(int argc, char **argv)
{
    serve_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0)
        return PX_EXIT_OK; /* --help */
    if (rc != PX_EXIT_OK)
        return rc;
    px_err err;
    px_err_clear(&err);
    px_hw_graph *graph = NULL;
    json_t *inventory_doc = NULL, *plan = NULL;
    px_ir_model *ir = NULL;
    px_contract *contract = NULL;
    px_serve *s = NULL;
    px_rt_local_launcher *launcher = NULL;
    char ret_addr[96];
    char *key = NULL;
    rc = PX_EXIT_FAIL;
    if (a.key_file && read_key(a.key_file, &key, &err) != PX_OK)
        goto fail;
    a.so.api_key = key;
    a.so.model_path = a.model;
    if (a.inventory) {
        px_diags diags;
        px_diags_init(&diags);
        if (px_hw_graph_load(a.inventory, NULL, &graph, &diags, &err) != PX_OK) {
            char *report = px_diags_format(&diags, a.inventory);
            fprintf(stderr, "plexus serve: refusing the inventory %s:\n%s", a.inventory,
                    report ? report : err.msg);
            free(report);
            px_diags_release(&diags);
            goto done;
        }
        px_diags_release(&diags);
        if (px_json_load_file(a.inventory, NULL, &inventory_doc, &err) != PX_OK)
            goto fail;
    }
    if (a.inventory || a.plan) {
        if (px_ir_model_open_any(a.model, NULL, &ir, &err) != PX_OK ||
            get_plan(&a, graph, ir, &a.so.request, &contract, &plan, &err) != PX_OK)
            goto fail;
        /* Without --max-seqs each replica batches as the plan says for it
         * (px_serve_new reads the plan's per-replica batches). */
        a.so.plan = plan;
        a.so.graph = graph;
        a.so.inventory_doc = inventory_doc;
        a.so.executor = (px_rt_executor_opts){
            .transport = a.transport, .n_threads = a.threads, .timeout_ms = (int)a.timeout_ms};
        if (a.stage_host) {
            /* Stages started by a launcher on that address, reached over
             * authenticated TCP. */
            if (px_rt_local_launcher_new(NULL, a.stage_host, (int)a.timeout_ms, &launcher, &err) !=
                PX_OK)
                goto fail;
            snprintf(ret_addr, sizeof ret_addr, "tcp:%s:0", a.stage_host);
            a.so.executor.launcher = px_rt_local_launcher_iface(launcher);
            a.so.executor.listen = ret_addr;
        }
        a.so.heal = !a.no_heal;
        a.so.injects = a.injects;
        a.so.n_injects = a.n_injects;
    } else {
        a.so.n_threads = a.threads;
    }
    /* SIGINT and SIGTERM are blocked in every thread the server starts
     * and taken here. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (px_serve_new(&a.so, &s, &err) != PX_OK)
        goto fail;
    describe(s, &a, plan);
    printf("listening on %s\n", px_serve_address(s));
    fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    fprintf(stderr, "plexus serve: %s: stopping\n", strsignal(sig));
    px_serve_stop(s);
    if (a.run_report && write_report(s, a.run_report, &err) != PX_OK)
        goto fail;
    rc = PX_EXIT_OK;
    goto done;
fail:
    px__cli_fail("serve", &err);
done:
    px_serve_free(s);
    px_rt_local_launcher_free(launcher);
    if (key) {
        explicit_bzero(key, strlen(key));
        free(key);
    }
    px_contract_free(contract);
    json_decref(plan);
    json_decref(inventory_doc);
    px_ir_model_free(ir);
    px_hw_graph_free(graph);
    return rc;
}
