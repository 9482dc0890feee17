/* plexus worker: one stage of a pipelined run (started by `plexus run`). */
#include "cli/cli.h"

#include <signal.h>

#include <openssl/crypto.h>

#include "plexus/rt.h"

const char px__cmd_worker_summary[] = "run one pipeline stage (started by `plexus run`)";

static const char usage_text[] =
    "usage: plexus worker --stage N --model FILE --layers A-B [--embedding] [--head]\n"
    "                     --backend cpu|emu [--emu-profile JSON] [--device NAME]\n"
    "                     [--threads N] --listen unix:PATH|tcp:A.B.C.D:PORT\n"
    "                     --next unix:PATH|tcp:A.B.C.D:PORT [--timeout-ms T]\n"
    "                     [--max-seqs N] [--context N] [--batch-tokens N]\n"
    "                     [--secret-stdin] [--announce]\n"
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
    "  --timeout-ms T     limit of each read and write towards the next hop (default 10000)\n"
    "  --secret-stdin     read the deployment's secret (hex, one line) from standard\n"
    "                     input: both connections then prove it (HMAC-SHA256 challenge\n"
    "                     and response) and refuse peers without it.  Required to\n"
    "                     listen on an address outside 127.0.0.0/8\n"
    "  --announce         once listening, print \"listening ADDRESS\" (the bound address,\n"
    "                     with the port picked for port 0) on standard output, and on\n"
    "                     failure \"error MESSAGE\" there too, for the launcher\n";

int px__cmd_worker(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        fputs(usage_text, stdout);
        return PX_EXIT_OK;
    }
    px_rt_worker_opts o;
    bool secret_stdin = false;
    px_err err;
    if (px_rt_worker_args_parse(argc - 1, argv + 1, &o, &secret_stdin, &err) != PX_OK)
        return px__cli_usage_error("worker", "%s", err.msg);
    uint8_t secret[PX_RT_SECRET_MAX];
    if (secret_stdin) {
        if (px_rt_secret_read_fd(0, secret, &o.secret_len, &err) != PX_OK) {
            fprintf(stderr, "plexus worker: %s\n", err.msg);
            return PX_EXIT_FAIL;
        }
        o.secret = secret;
    }
    /* A launcher that stopped reading its end of the announcement pipe
     * must not end the worker. */
    if (o.announce)
        signal(SIGPIPE, SIG_IGN);
    px_status st = px_rt_worker_run(&o, &err);
    OPENSSL_cleanse(secret, sizeof secret);
    /* A failure that came from elsewhere in the ring is reported there. */
    if (st != PX_OK && st != PX_EPEER) {
        fprintf(stderr, "plexus worker: %s\n", err.msg);
        if (o.announce) {
            printf("error %s\n", err.msg);
            fflush(stdout);
        }
    }
    return st == PX_OK ? PX_EXIT_OK : PX_EXIT_FAIL;
}
