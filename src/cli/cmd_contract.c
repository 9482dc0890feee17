/* plexus contract: validate, show and query numerical contracts. */
#include "cli/cli.h"

#include "plexus/contract.h"

const char px__cmd_contract_summary[] =
    "validate, show and query numerical contracts (plexus.contract/1)";

#define MAX_ITEMS 64

static struct {
    px_cli_format fmt;
    const char *contract, *evidence;
    px_cli_list regions, transforms, devices;
} K;

#define FORMAT_ROW                                             \
    PX_CLI_OPT("output", 'o', PX_CLI_FORMAT, &K.fmt, "FORMAT", \
               "report format: text (default), json or yaml", .choices = "text|json|yaml")
static const px_cli_opt fmt_opts[] = {FORMAT_ROW, {0}};
static const px_cli_opt check_opts[] = {
    PX_CLI_OPT("contract", 'c', PX_CLI_STR, &K.contract, "FILE|NAME",
               "the contract: a file or strict, deterministic, relaxed", .flags = PX_CLI_REQUIRED),
    PX_CLI_OPT("region", 'r', PX_CLI_LIST, &K.regions, "R",
               "the region (repeat: the verdicts are combined)"),
    PX_CLI_OPT("transform", 't', PX_CLI_LIST, &K.transforms, "T",
               "the transformation (repeat), see below"),
    PX_CLI_OPT("device", 'd', PX_CLI_LIST, &K.devices, "D",
               "a device (repeat); the first two are 'from' and 'to'\n"
               "for placement and pipeline-cut"),
    PX_CLI_OPT("equivalence", 0, PX_CLI_STR, &K.evidence, "EVIDENCE",
               "T on these devices was validated bit-identical\n"
               "(evidence: a trace id or report digest)"),
    FORMAT_ROW,
    {0},
};

static const px_cli_spec validate_spec = {
    .name = "contract validate",
    .summary = "check contract files (exit 3 when one is refused)",
    .synopsis = "FILE... [-o text|json|yaml]",
    .about = "Reads each contract and reports every problem with its JSON pointer and a fix;\n"
             "exits 3 when any file is refused, 1 when one is unreadable.",
    .opts = fmt_opts,
    .operands = "FILE",
    .min_operands = 1,
    .max_operands = -1,
    .examples = "plexus contract validate data/contracts/*.json\n",
};
static const px_cli_spec show_spec = {
    .name = "contract show",
    .summary = "print a contract, a file or a built-in",
    .synopsis = "FILE|NAME [-o text|json|yaml]",
    .about = "Prints a contract (a file, or a built-in: strict, deterministic, relaxed); -o\n"
             "json prints its canonical form.",
    .opts = fmt_opts,
    .operands = "FILE|NAME",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus contract show strict\nplexus contract show my-contract.json -o json\n",
};
static const px_cli_spec check_spec = {
    .name = "contract check",
    .summary = "may a transformation be applied to a region? (exit 3 when forbidden)",
    .synopsis = "--contract FILE|NAME --region R --transform T [--device D]... [options]",
    .about = "Says whether the transformation T may be applied to region R: allowed (with the\n"
             "proof), allowed after validation (with the obligations) or forbidden (with the\n"
             "reason); exits 3 when forbidden.",
    .opts = check_opts,
    .more = "T is KIND[:ARG][,targets=weights+activations+kv][,from=DTYPE][,order=dynamic]:\n"
            "  precision:DTYPE  quantize:DTYPE  alt-kernel[:NAME]  reorder  placement\n"
            "  pipeline-cut[:WIRE_DTYPE]  tensor-split[:output|reduction]  recompute\n"
            "  kv-offload[:DTYPE]  fusion[:NAME]\n"
            "D is ID[,backend=B][,vendor=V][,arch=A][,deterministic][,emulated].",
    .examples = "plexus contract check --contract strict --region 'blk.*.attn' \\\n"
                "    --transform precision:bf16      # forbidden: exit 3\n"
                "plexus contract check -c relaxed -r output -t quantize:q8_0 -o json\n",
};
static const px_cli_spec list_spec = {
    .name = "contract list",
    .summary = "the built-in contracts",
    .synopsis = "[-o text|json|yaml]",
    .about = "Lists the built-in contracts with what each promises.",
    .opts = fmt_opts,
    .examples = "plexus contract list\nplexus contract list -o json\n",
};
const px_cli_spec *const px__cmd_contract_specs[] = {&validate_spec, &show_spec, &check_spec,
                                                     &list_spec, NULL};

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

static int cmd_validate(int n_files, char **files, px_cli_format fmt)
{
    int rc = PX_EXIT_OK;
    json_t *results = fmt != PX_CLI_TEXT ? json_array() : NULL;
    for (int i = 0; i < n_files; i++) {
        px_diags diags;
        px_diags_init(&diags);
        px_contract *c = NULL;
        px_err err;
        px_status st = px_contract_load_file(files[i], &diags, &c, &err);
        if (st != PX_OK) /* read but refused: a verdict; unreadable: an error */
            rc = diags.n && rc != PX_EXIT_FAIL ? PX_EXIT_VERDICT : PX_EXIT_FAIL;
        if (results) {
            json_t *diag_json = px_diags_to_json(&diags);
            px_json_push(results, json_pack("{s:s, s:b, s:o*}", "file", files[i], "valid",
                                            st == PX_OK, "diagnostics", diag_json));
        } else {
            char *report = px_diags_format(&diags, files[i]);
            if (report && report[0])
                fputs(report, st == PX_OK ? stdout : stderr);
            else if (st != PX_OK)
                fprintf(stderr, "%s: %s\n", files[i], err.msg);
            free(report);
            if (st == PX_OK)
                printf("%s: ok (%s, %zu region entr%s)\n", files[i],
                       px_contract_name(c) ? px_contract_name(c) : "unnamed",
                       px_contract_region_count(c), px_contract_region_count(c) == 1 ? "y" : "ies");
        }
        px_contract_free(c);
        px_diags_release(&diags);
    }
    if (results) {
        if (px__cli_print_doc(results, fmt) != PX_EXIT_OK)
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

static int cmd_show(const char *spec, px_cli_format fmt)
{
    px_contract *c;
    if (load_contract(spec, &c) != PX_EXIT_OK)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (fmt != PX_CLI_TEXT) {
        char *text = px_contract_export(c);
        json_t *doc = text && fmt == PX_CLI_YAML ? json_loads(text, 0, NULL) : NULL;
        if (doc)
            rc = px__cli_print_doc(doc, fmt);
        else if (text && fmt == PX_CLI_JSON)
            fputs(text, stdout);
        else
            rc = PX_EXIT_FAIL;
        json_decref(doc);
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

static int cmd_check(px_cli_format fmt)
{
    const char *contract_spec = K.contract, *evidence = K.evidence;
    const char *regions[MAX_ITEMS];
    px_transform ts[MAX_ITEMS];
    px_contract_device devs[MAX_ITEMS];
    size_t n_regions = 0, n_ts = 0, n_devs = 0;
    px_err err;
    for (size_t i = 0; i < K.regions.n; i++)
        regions[n_regions++] = K.regions.v[i];
    /* The parsers cut their text in place: the values are argv's own
     * strings, which are writable. */
    for (size_t i = 0; i < K.transforms.n; i++, n_ts++)
        if (px_transform_parse((char *)K.transforms.v[i], &ts[n_ts], &err) != PX_OK)
            return px__cli_usage_error("contract check", "--transform: %s", err.msg);
    for (size_t i = 0; i < K.devices.n; i++, n_devs++)
        if (px_contract_device_parse((char *)K.devices.v[i], &devs[n_devs], &err) != PX_OK)
            return px__cli_usage_error("contract check", "--device: %s", err.msg);
    if (!n_regions || !n_ts)
        return px__cli_usage_error("contract check", "check needs --region and --transform");
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
    if (fmt != PX_CLI_TEXT) {
        json_t *j = px_contract_decision_to_json(&d);
        rc = j ? px__cli_print_doc(j, fmt) : PX_EXIT_FAIL;
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

static int cmd_list(px_cli_format fmt)
{
    json_t *list = fmt != PX_CLI_TEXT ? json_array() : NULL;
    for (const char *const *n = px_contract_builtin_names(); *n; n++) {
        px_contract *c;
        if (px_contract_builtin(*n, &c, NULL) != PX_OK) {
            json_decref(list);
            return PX_EXIT_FAIL;
        }
        const char *about = px_contract_description(c) ? px_contract_description(c) : "";
        if (list)
            px_json_push(list, json_pack("{s:s, s:s}", "name", *n, "description", about));
        else
            printf("%-14s %s\n", *n, about);
        px_contract_free(c);
    }
    int rc = list ? px__cli_print_doc(list, fmt) : PX_EXIT_OK;
    json_decref(list);
    return rc;
}

int px__cmd_contract(int argc, char **argv)
{
    memset(&K, 0, sizeof K);
    int rc;
    const px_cli_spec *spec = px__cli_action("contract", px__cmd_contract_specs, argc, argv, &rc);
    if (!spec)
        return rc;
    px_cli_args args;
    if (!px__cli_parse(spec, argc - 1, argv + 1, &args, &rc))
        return rc;
    if (spec == &validate_spec)
        return cmd_validate(args.n, args.v, K.fmt);
    if (spec == &show_spec)
        return cmd_show(args.v[0], K.fmt);
    if (spec == &check_spec)
        return cmd_check(K.fmt);
    return cmd_list(K.fmt);
}
