/* plexus contract: validate, show and query numerical contracts. */
#include "cli/cli.h"

#include "plexus/contract.h"

const char px__cmd_contract_summary[] =
    "validate, show and query numerical contracts (plexus.contract/1)";

#define MAX_ITEMS 64

static void usage(FILE *f)
{
    fprintf(f,
            "usage: plexus contract validate FILE... [-o text|json]\n"
            "       plexus contract show FILE|NAME [-o text|json]\n"
            "       plexus contract check --contract FILE|NAME --region R --transform T\n"
            "                             [--device D]... [--equivalence EVIDENCE] [-o text|json]\n"
            "       plexus contract list\n"
            "\n"
            "validate  reads each contract and reports every problem with its JSON pointer\n"
            "          and a fix; exits 3 when any file is refused, 1 when one is unreadable.\n"
            "show      prints a contract (a file, or a built-in: strict, deterministic,\n"
            "          relaxed); -o json prints its canonical form.\n"
            "check     says whether the transformation T may be applied to region R:\n"
            "          allowed (with the proof), allowed after validation (with the\n"
            "          obligations) or forbidden (with the reason); exits 3 when forbidden.\n"
            "          --region and --transform may repeat; the verdicts are combined.\n"
            "list      lists the built-in contracts.\n"
            "\n"
            "T is KIND[:ARG][,targets=weights+activations+kv][,from=DTYPE][,order=dynamic]:\n"
            "  precision:DTYPE  quantize:DTYPE  alt-kernel[:NAME]  reorder  placement\n"
            "  pipeline-cut[:WIRE_DTYPE]  tensor-split[:output|reduction]  recompute\n"
            "  kv-offload[:DTYPE]  fusion[:NAME]\n"
            "D is ID[,backend=B][,vendor=V][,arch=A][,deterministic][,emulated]; the first\n"
            "two devices are 'from' and 'to' for placement and pipeline-cut.\n"
            "--equivalence EVIDENCE records that T on these devices was validated\n"
            "bit-identical (evidence: a trace id or report digest).\n");
}

static int load_contract(const char *spec, px_contract **out)
{
    px_err err;
    px_diags diags;
    px_diags_init(&diags);
    px_status st = px_contract_load(spec, &diags, out, &err);
    if (st != PX_OK) {
        if (diags.n) {
            char *report = px_diags_format(&diags, spec);
            fputs(report ? report : err.msg, stderr);
            free(report);
        } else {
            fprintf(stderr, "plexus contract: %s\n", err.msg);
        }
    }
    px_diags_release(&diags);
    return st == PX_OK ? PX_EXIT_OK : PX_EXIT_FAIL;
}

/* Pulls "-o FORMAT" out of argv; returns false after a usage error. */
static bool take_format(int *argc, char **argv, px_cli_format *fmt)
{
    int w = 0;
    for (int i = 0; i < *argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (i + 1 >= *argc) {
                px__cli_usage_error("contract", "-o needs text or json");
                return false;
            }
            if (!px__cli_parse_format("contract", argv[++i], fmt))
                return false;
            continue;
        }
        argv[w++] = argv[i];
    }
    *argc = w;
    return true;
}

static int cmd_validate(int argc, char **argv, px_cli_format fmt)
{
    if (argc < 2)
        return px__cli_usage_error("contract", "validate needs at least one FILE");
    int rc = PX_EXIT_OK;
    json_t *results = fmt == PX_CLI_JSON ? json_array() : NULL;
    for (int i = 1; i < argc; i++) {
        px_diags diags;
        px_diags_init(&diags);
        px_contract *c = NULL;
        px_err err;
        px_status st = px_contract_load_file(argv[i], &diags, &c, &err);
        if (st != PX_OK) /* read but refused: a verdict; unreadable: an error */
            rc = diags.n && rc != PX_EXIT_FAIL ? PX_EXIT_VERDICT : PX_EXIT_FAIL;
        if (results) {
            json_t *diag_json = px_diags_to_json(&diags);
            px_json_push(results, json_pack("{s:s, s:b, s:o*}", "file", argv[i], "valid",
                                            st == PX_OK, "diagnostics", diag_json));
        } else {
            char *report = px_diags_format(&diags, argv[i]);
            if (report && report[0])
                fputs(report, st == PX_OK ? stdout : stderr);
            else if (st != PX_OK)
                fprintf(stderr, "%s: %s\n", argv[i], err.msg);
            free(report);
            if (st == PX_OK)
                printf("%s: ok (%s, %zu region entr%s)\n", argv[i],
                       px_contract_name(c) ? px_contract_name(c) : "unnamed",
                       px_contract_region_count(c), px_contract_region_count(c) == 1 ? "y" : "ies");
        }
        px_contract_free(c);
        px_diags_release(&diags);
    }
    if (results) {
        if (px__cli_print_json(results) != PX_EXIT_OK)
            rc = PX_EXIT_FAIL;
        json_decref(results);
    }
    return rc;
}

static void print_clause(const char *label, const px_contract_clause *cl)
{
    char *text = px_contract_clause_text(cl);
    printf("  %-24s %s\n", label, text ? text : "?");
    free(text);
}

static int cmd_show(int argc, char **argv, px_cli_format fmt)
{
    if (argc != 2)
        return px__cli_usage_error("contract", "show takes one FILE or built-in NAME");
    px_contract *c;
    if (load_contract(argv[1], &c) != PX_EXIT_OK)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (fmt == PX_CLI_JSON) {
        char *text = px_contract_export(c);
        if (text)
            fputs(text, stdout);
        else
            rc = PX_EXIT_FAIL;
        free(text);
        px_contract_free(c);
        return rc;
    }
    char digest[65] = "";
    if (px_contract_digest(c, digest) != PX_OK)
        px_strlcpy(digest, "(out of memory)", sizeof digest);
    px_contract_budget b = px_contract_get_budget(c);
    printf("contract    %s\n", px_contract_name(c) ? px_contract_name(c) : "(unnamed)");
    if (px_contract_description(c))
        printf("about       %s\n", px_contract_description(c));
    printf("id          sha256:%s\n", digest);
    printf("reference   %s\n", px_contract_reference(c));
    printf("validation  %" PRIu64 " prompts, %" PRIu64 " token positions, prompt set \"%s\"\n",
           b.prompts, b.tokens, b.prompt_set);
    printf("clauses (the most specific entry applies; default for unlisted regions):\n");
    for (size_t i = 0; i < px_contract_region_count(c); i++) {
        const px_contract_clause *cl = px_contract_region_at(c, i);
        print_clause(cl->pattern, cl);
    }
    print_clause("default", px_contract_default(c));
    px_contract_free(c);
    return rc;
}

static void print_decision_text(const px_contract_decision *d)
{
    if (d->verdict == PX_VERDICT_ALLOWED)
        printf("verdict: allowed (proof: %s)\n", px_contract_proof_name(d->proof));
    else if (d->verdict == PX_VERDICT_FORBIDDEN)
        printf("verdict: forbidden (%s)\n", px_contract_reason_name(d->reason));
    else
        printf("verdict: allowed-after-validation\n");
    printf("%s\n", d->message);
    if (d->n_obligations)
        printf("obligations:\n");
    for (size_t i = 0; i < d->n_obligations; i++)
        printf("  %zu. %s\n", i + 1, d->obligations[i].text);
}

static int cmd_check(int argc, char **argv, px_cli_format fmt)
{
    const char *contract_spec = NULL, *evidence = NULL;
    const char *regions[MAX_ITEMS];
    px_transform ts[MAX_ITEMS];
    px_contract_device devs[MAX_ITEMS];
    size_t n_regions = 0, n_ts = 0, n_devs = 0;
    px_err err;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (i + 1 >= argc)
            return px__cli_usage_error("contract", "%s needs a value", opt);
        char *val = argv[++i];
        if (!strcmp(opt, "--contract")) {
            contract_spec = val;
        } else if (!strcmp(opt, "--region")) {
            if (n_regions == MAX_ITEMS)
                return px__cli_usage_error("contract", "at most %d regions", MAX_ITEMS);
            regions[n_regions++] = val;
        } else if (!strcmp(opt, "--transform")) {
            if (n_ts == MAX_ITEMS)
                return px__cli_usage_error("contract", "at most %d transformations", MAX_ITEMS);
            if (px_transform_parse(val, &ts[n_ts], &err) != PX_OK)
                return px__cli_usage_error("contract", "--transform: %s", err.msg);
            n_ts++;
        } else if (!strcmp(opt, "--device")) {
            if (n_devs == MAX_ITEMS)
                return px__cli_usage_error("contract", "at most %d devices", MAX_ITEMS);
            if (px_contract_device_parse(val, &devs[n_devs], &err) != PX_OK)
                return px__cli_usage_error("contract", "--device: %s", err.msg);
            n_devs++;
        } else if (!strcmp(opt, "--equivalence")) {
            evidence = val;
        } else {
            return px__cli_usage_error("contract", "unknown option \"%s\"", opt);
        }
    }
    if (!contract_spec || !n_regions || !n_ts)
        return px__cli_usage_error("contract", "check needs --contract, --region and --transform");
    px_equivalence eqs[MAX_ITEMS];
    for (size_t i = 0; i < n_ts; i++) {
        ts[i].devices = n_devs ? devs : NULL;
        ts[i].n_devices = n_devs;
        eqs[i] = (px_equivalence){.transform = ts[i], .region = NULL, .evidence = evidence};
    }
    px_contract *c;
    if (load_contract(contract_spec, &c) != PX_EXIT_OK)
        return PX_EXIT_FAIL;
    px_contract_decision d;
    size_t n_eqs = evidence ? n_ts : 0;
    /* A single question gets its own message rather than the summary. */
    px_status st =
        n_regions == 1 && n_ts == 1
            ? px_contract_evaluate(c, regions[0], &ts[0], eqs, n_eqs, &d, &err)
            : px_contract_evaluate_all(c, regions, n_regions, ts, n_ts, eqs, n_eqs, &d, &err);
    int rc;
    if (st != PX_OK) {
        rc = px__cli_fail("contract", &err);
        goto done;
    }
    if (fmt == PX_CLI_JSON) {
        json_t *j = px_contract_decision_to_json(&d);
        rc = j ? px__cli_print_json(j) : PX_EXIT_FAIL;
        json_decref(j);
    } else {
        print_decision_text(&d);
        rc = PX_EXIT_OK;
    }
    if (rc == PX_EXIT_OK && d.verdict == PX_VERDICT_FORBIDDEN)
        rc = PX_EXIT_VERDICT;
    px_contract_decision_release(&d);
done:
    px_contract_free(c);
    return rc;
}

int px__cmd_contract(int argc, char **argv)
{
    if (px__cli_wants_help(argc, argv)) {
        usage(stdout);
        return PX_EXIT_OK;
    }
    if (argc < 2)
        return px__cli_usage_error("contract", "name an action: validate, show, check or list");
    px_cli_format fmt = PX_CLI_TEXT;
    if (!take_format(&argc, argv, &fmt))
        return PX_EXIT_USAGE;
    const char *action = argv[1];
    if (!strcmp(action, "validate"))
        return cmd_validate(argc - 1, argv + 1, fmt);
    if (!strcmp(action, "show"))
        return cmd_show(argc - 1, argv + 1, fmt);
    if (!strcmp(action, "check"))
        return cmd_check(argc - 1, argv + 1, fmt);
    if (!strcmp(action, "list")) {
        for (const char *const *n = px_contract_builtin_names(); *n; n++) {
            px_contract *c;
            if (px_contract_builtin(*n, &c, NULL) != PX_OK)
                return PX_EXIT_FAIL;
            printf("%-14s %s\n", *n, px_contract_description(c) ? px_contract_description(c) : "");
            px_contract_free(c);
        }
        return PX_EXIT_OK;
    }
    return px__cli_usage_error("contract",
                               "unknown action \"%s\"; use validate, show, check or list", action);
}
