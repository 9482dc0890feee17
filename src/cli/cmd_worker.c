/* plexus worker: one stage of a pipelined run (started by `plexus run`). */
#include "cli/cli.h"

#include "plexus/rt.h"

const char px__cmd_worker_summary[] = "run one pipeline stage (started by `plexus run`)";

static const char usage_text[] =
    "usage: plexus worker --stage N --model FILE --layers A-B [--embedding] [--head]\n"
    "                     --backend cpu|emu [--emu-profile JSON] [--device NAME]\n"
    "                     [--threads N] --listen unix:PATH|tcp:127.0.0.1:PORT\n"
    "                     --next unix:PATH|tcp:127.0.0.1:PORT [--timeout-ms T]\n"
    "                     [--max-seqs N] [--context N] [--batch-tokens N]\n"
    "\n"
    "Internal: `plexus run` starts one worker per stage of a plan and joins them in a\n"
    "ring of framed connections.  A worker holds layers A to B (inclusive) of the model\n"
    "and their KV cache on its backend, takes steps from the previous hop (--listen),\n"
    "runs them and passes the hidden states (or, with --head, the logits) to the next\n"
    "(--next).  It exits when the ring shuts down, or with an error frame that names\n"
    "it when something fails.\n"
    "\n"
    "options:\n"
    "  --stage N          the stage's index in the plan\n"
    "  --layers A-B       blocks held (inclusive); none@A: no block, the stage sits\n"
    "                     before block A (none@0 with --embedding: embedding only;\n"
    "                     none@<blocks> with --head: head only)\n"
    "  --embedding        the stage embeds token ids (it starts at block 0)\n"
    "  --head             the stage applies the final norm and classifier\n"
    "  --backend NAME     cpu, or emu (an emulated device paced by --emu-profile)\n"
    "  --emu-profile JSON {\"compute_slowdown\": 3, \"memory_slowdown\": 2, \"jitter\": 0,\n"
    "                     \"seed\": 1, \"memory_bytes\": N, \"name\": \"local.emu-a\"}\n"
    "  --device NAME      the inventory device, for messages\n"
    "  --threads N        threads of the backend (default 1)\n"
    "  --timeout-ms T     limit of each read and write towards the next hop (default 10000)\n";

static bool parse_u32(const char *arg, const char *opt, uint32_t max, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] == '-' || v > max) {
        px__cli_usage_error("worker", "%s takes a whole number from 0 to %u, not \"%s\"", opt, max,
                            arg);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

int px__cmd_worker(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        fputs(usage_text, stdout);
        return PX_EXIT_OK;
    }
    px_rt_worker_opts o = {.backend = "cpu", .n_threads = 1};
    bool have_stage = false, have_layers = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--embedding")) {
            o.embedding = true;
            continue;
        }
        if (!strcmp(a, "--head")) {
            o.head = true;
            continue;
        }
        if (i + 1 >= argc)
            return px__cli_usage_error("worker", "%s needs a value", a);
        const char *v = argv[++i];
        uint32_t tmo = 0;
        if (!strcmp(a, "--stage")) {
            if (!parse_u32(v, a, PX_RT_MAX_STAGES - 1, &o.stage))
                return PX_EXIT_USAGE;
            have_stage = true;
        } else if (!strcmp(a, "--model")) {
            o.model_path = v;
        } else if (!strcmp(a, "--layers")) {
            unsigned a0, b0;
            char tail;
            if (!strncmp(v, "none@", 5) && v[5] >= '0' && v[5] <= '9' &&
                sscanf(v + 5, "%u%c", &a0, &tail) == 1 && a0 < 1000000) {
                o.layer_begin = o.layer_end = a0;
            } else if (sscanf(v, "%u-%u%c", &a0, &b0, &tail) == 2 && b0 >= a0 && b0 < 1000000) {
                o.layer_begin = a0;
                o.layer_end = b0 + 1;
            } else {
                return px__cli_usage_error(
                    "worker", "--layers takes A-B with A <= B, or none@A, not \"%s\"", v);
            }
            have_layers = true;
        } else if (!strcmp(a, "--backend")) {
            o.backend = v;
        } else if (!strcmp(a, "--emu-profile")) {
            o.emu_profile = v;
        } else if (!strcmp(a, "--device")) {
            o.device_name = v;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_u32(v, a, 1024, &o.n_threads))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--listen")) {
            o.listen = v;
        } else if (!strcmp(a, "--next")) {
            o.next = v;
        } else if (!strcmp(a, "--timeout-ms")) {
            if (!parse_u32(v, a, 86400000, &tmo))
                return PX_EXIT_USAGE;
            o.timeout_ms = (int)tmo;
        } else if (!strcmp(a, "--max-seqs")) {
            if (!parse_u32(v, a, 65536, &o.max_seqs))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--context")) {
            if (!parse_u32(v, a, 1u << 24, &o.context))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--batch-tokens")) {
            if (!parse_u32(v, a, 1u << 20, &o.max_batch_tokens))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--kv-blocks")) {
            if (!parse_u32(v, a, INT32_MAX, &o.kv_blocks))
                return PX_EXIT_USAGE;
        } else if (!strcmp(a, "--kv-block-size")) {
            if (!parse_u32(v, a, 1u << 24, &o.kv_block_size))
                return PX_EXIT_USAGE;
        } else {
            return px__cli_usage_error("worker", "unexpected argument \"%s\"", a);
        }
    }
    if (!have_stage || !have_layers || !o.model_path || !o.listen || !o.next)
        return px__cli_usage_error("worker", "--stage, --model, --layers, --listen and --next "
                                             "are required");
    px_err err;
    px_status st = px_rt_worker_run(&o, &err);
    /* A failure that came from elsewhere in the ring is reported there. */
    if (st != PX_OK && st != PX_EPEER)
        fprintf(stderr, "plexus worker: %s\n", err.msg);
    return st == PX_OK ? PX_EXIT_OK : PX_EXIT_FAIL;
    return PX_EXIT_OK;
}
