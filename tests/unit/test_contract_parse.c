/* Contracts: reading, validation of hostile input, canonical export, built-ins. */
#include "px_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plexus/contract.h"

static const char *mixed_text =
    "{\"schema\": \"plexus.contract/1\", \"name\": \"mixed\",\n"
    " \"description\": \"ffn quantizable, attention repeatable, head exact\",\n"
    " \"reference\": \"cpu\",\n"
    " \"validation\": {\"prompt_set\": \"stories\", \"prompts\": 8, \"tokens\": 512},\n"
    " \"default\": {\"deterministic\": true, \"tolerance\": {\"atol\": 1e-5, \"rtol\": 1e-4}},\n"
    " \"regions\": {\n"
    "   \"layer.*.ffn\": {\"divergence\": {\"kl_max\": 0.01}},\n"
    "   \"layer.0-1.attention\": {\"deterministic\": {\"seed\": 7}},\n"
    "   \"embedding\": {\"bitwise\": {\"reference\": \"scalar-reference\"}},\n"
    "   \"head\": {\"agreement\": {\"top1_min\": 0.99, \"positions\": 256},\n"
    "            \"exact_logits\": [{\"tokens\": [1, 403, 407, 261, 378]}, {\"prompt\": "
    "\"greeting\"}]}\n"
    " }}\n";

static px_contract *parse_ok(const char *text, px_diags *diags)
{
    px_contract *c = NULL;
    px_err err;
    px_assert_ok(px_contract_parse(text, strlen(text), "test.json", diags, &c, &err), &err);
    assert_non_null(c);
    return c;
}

static void test_parse_reads_every_field_of_a_mixed_contract(void **state)
{
    (void)state;
    px_contract *c = parse_ok(mixed_text, NULL);
    assert_string_equal(px_contract_name(c), "mixed");
    assert_string_equal(px_contract_reference(c), "cpu");
    px_contract_budget b = px_contract_get_budget(c);
    assert_string_equal(b.prompt_set, "stories");
    assert_int_equal(b.prompts, 8);
    assert_int_equal(b.tokens, 512);
    assert_int_equal(px_contract_region_count(c), 4);
    /* Entries come back in canonical (sorted) order. */
    assert_string_equal(px_contract_region_at(c, 0)->pattern, "embedding");
    assert_string_equal(px_contract_region_at(c, 1)->pattern, "head");
    assert_string_equal(px_contract_region_at(c, 2)->pattern, "layer.*.ffn");
    assert_string_equal(px_contract_region_at(c, 3)->pattern, "layer.0-1.attention");
    assert_null(px_contract_region_at(c, 4));

    const px_contract_clause *def = px_contract_default(c);
    assert_int_equal(def->reqs, PX_CONTRACT_DETERMINISTIC | PX_CONTRACT_TOLERANCE);
    assert_true(def->atol == 1e-5 && def->rtol == 1e-4);
    assert_false(def->has_seed);

    const px_contract_clause *emb = px_contract_region_at(c, 0);
    assert_int_equal(emb->reqs, PX_CONTRACT_BITWISE);
    assert_string_equal(emb->reference, "scalar-reference");

    const px_contract_clause *head = px_contract_region_at(c, 1);
    assert_int_equal(head->reqs, PX_CONTRACT_AGREEMENT | PX_CONTRACT_EXACT_LOGITS);
    assert_true(head->top1_min == 0.99);
    assert_int_equal(head->positions, 256);
    assert_int_equal(head->n_paths, 2);
    assert_int_equal(head->paths[0].n_tokens, 5);
    assert_int_equal(head->paths[0].tokens[1], 403);
    assert_string_equal(head->paths[1].prompt, "greeting");

    const px_contract_clause *attn = px_contract_region_at(c, 3);
    assert_true(attn->has_seed);
    assert_int_equal(attn->seed, 7);
    assert_true(px_contract_region_at(c, 2)->kl_max == 0.01);

    char *text = px_contract_clause_text(head);
    px_assert_contains(text, "agreement top1_min 0.99 over 256 positions");
    px_assert_contains(text, "exact logits on 2 paths");
    free(text);
    px_contract_free(c);
    px_contract_free(NULL);
}

/* Each hostile or broken document must be refused with an error whose
 * message carries the JSON pointer of the problem. */
static void test_parse_rejects_bad_contracts_naming_the_place(void **state)
{
    (void)state;
#define HEAD "{\"schema\": \"plexus.contract/1\", "
    static const struct {
        const char *text;
        const char *needle; /* in err.msg */
    } cases[] = {
        {"[1, 2]", "a contract is a JSON object"},
        {"{\"default\": {\"bitwise\": true}}", "\"schema\" is missing"},
        {"{\"schema\": \"plexus.contract/2\", \"default\": {\"bitwise\": true}}",
         "/schema: unsupported schema \"plexus.contract/2\""},
        {"{\"schema\": 1, \"default\": {\"bitwise\": true}}",
         "/schema: unsupported schema (an integer)"},
        {HEAD "\"regions\": {}}", "\"default\" is missing"},
        {HEAD "\"default\": {\"bitwise\": true}, \"regionz\": {}}", "/regionz: unknown member"},
        {HEAD "\"default\": {\"bitwize\": true}}", "/default/bitwize: unknown member"},
        {HEAD "\"default\": {\"tolerance\": {\"rtol\": 0.1}}}",
         "/default/tolerance: \"atol\" is missing"},
        {HEAD "\"default\": {\"tolerance\": {\"atol\": -1, \"rtol\": 0.1}}}",
         "/default/tolerance/atol: atol = -1 is outside"},
        {HEAD "\"default\": {\"tolerance\": {\"atol\": 0.1, \"rtol\": 5}}}",
         "/default/tolerance/rtol: rtol = 5 is outside"},
        {HEAD "\"default\": {\"tolerance\": {\"atol\": \"1e-3\", \"rtol\": 0.1}}}",
         "/default/tolerance/atol: atol must be a number, not a string"},
        {HEAD "\"default\": {\"tolerance\": {\"atol\": null, \"rtol\": 0.1}}}",
         "/default/tolerance/atol: atol must be a number, not null"},
        {HEAD "\"default\": {\"tolerance\": [0.1, 0.1]}}",
         "/default/tolerance: tolerance must be an object"},
        {HEAD "\"default\": {\"bitwise\": true}, \"regions\": {\"head\": {\"divergence\": "
              "{\"kl_max\": 0}}}}",
         "/regions/head/divergence/kl_max: kl_max = 0 is outside"},
        {HEAD "\"default\": {\"divergence\": {\"kl_max\": 50}}}", "/default/divergence/kl_max"},
        {HEAD "\"default\": {\"divergence\": {\"kl_max\": -0.5}}}", "/default/divergence/kl_max"},
        {HEAD "\"default\": {\"divergence\": {}}}", "/default/divergence: \"kl_max\" is missing"},
        {HEAD "\"default\": {\"agreement\": {\"top1_min\": 1.5}}}",
         "/default/agreement/top1_min: top1_min = 1.5 is outside the sane range [0, 1]"},
        {HEAD "\"default\": {\"agreement\": {\"top1_min\": -0.1}}}", "/default/agreement/top1_min"},
        {HEAD "\"default\": {\"agreement\": {\"top1_min\": 0.9, \"prompt_set\": \"a\", "
              "\"positions\": 5}}}",
         "/default/agreement: agreement names both"},
        {HEAD "\"default\": {\"agreement\": {\"top1_min\": 0.9, \"positions\": 0}}}",
         "/default/agreement/positions: positions is 0, out of range"},
        {HEAD "\"default\": {\"agreement\": {\"top1_min\": 0.9, \"positions\": 2.5}}}",
         "/default/agreement/positions: positions must be an integer"},
        {HEAD
         "\"default\": {\"bitwise\": true}, \"regions\": {\"layer.*x.ffn\": {\"bitwise\": true}}}",
         "/regions/layer.*x.ffn: region pattern \"layer.*x.ffn\" segment \"*x\" mixes"},
        {HEAD
         "\"default\": {\"bitwise\": true}, \"regions\": {\"layer.5-2.ffn\": {\"bitwise\": true}}}",
         "/regions/layer.5-2.ffn: region pattern \"layer.5-2.ffn\" range \"5-2\" is empty"},
        {HEAD "\"default\": {\"bitwise\": true}, \"regions\": {\"layer.01-3.ffn\": {\"bitwise\": "
              "true}}}",
         "leading zero"},
        {HEAD "\"default\": {\"bitwise\": true}, \"regions\": {\"layer.0-2000000.ffn\": "
              "{\"bitwise\": true}}}",
         "past the limit"},
        {HEAD
         "\"default\": {\"bitwise\": true}, \"regions\": {\"layer..ffn\": {\"bitwise\": true}}}",
         "/regions/layer..ffn: region pattern \"layer..ffn\" has an empty segment"},
        {HEAD "\"default\": {\"bitwise\": true}, \"regions\": {\"a/b\": {\"bitwise\": true}}}",
         "/regions/a~1b: region pattern \"a/b\" has the character 0x2f at byte 1"},
        {HEAD "\"default\": {\"bitwise\": true}, \"regions\": {\"\": {\"bitwise\": true}}}",
         "/regions/: region pattern \"\" is empty"},
        {HEAD "\"default\": {\"bitwise\": true}, \"regions\": "
              "{\"a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q\": {\"bitwise\": true}}}",
         "more than 16 dot-separated segments"},
        {HEAD
         "\"default\": {\"bitwise\": true}, \"regions\": {\"layer.*.ffn\": {\"bitwise\": true}, "
         "\"layer.3.*\": {\"deterministic\": true}}}",
         "/regions/layer.3.*: \"layer.*.ffn\" and \"layer.3.*\" are equally specific and both "
         "match \"layer.3.ffn\""},
        {HEAD
         "\"default\": {\"bitwise\": true}, \"regions\": {\"layer.0-3.ffn\": {\"bitwise\": true}, "
         "\"layer.2-5.ffn\": {\"deterministic\": true}}}",
         "both match \"layer.2.ffn\""},
        {HEAD "\"default\": {}}", "/default: the clause requires nothing"},
        {HEAD "\"default\": \"bitwise\"}", "/default: a clause is an object of requirements"},
        {HEAD "\"default\": {\"bitwise\": false}}",
         "/default/bitwise: \"bitwise\": false requires nothing"},
        {HEAD "\"default\": {\"bitwise\": {\"ref\": \"x\"}}}",
         "/default/bitwise/ref: unknown member"},
        {HEAD "\"default\": {\"deterministic\": {\"seed\": -1}}}",
         "/default/deterministic/seed: the seed is -1"},
        {HEAD "\"default\": {\"deterministic\": 1}}",
         "/default/deterministic: deterministic must be true"},
        {HEAD "\"default\": {\"exact_logits\": []}}",
         "/default/exact_logits: exact_logits must be a non-empty array"},
        {HEAD "\"default\": {\"exact_logits\": [{\"tokens\": [1], \"prompt\": \"p\"}]}}",
         "/default/exact_logits/0: a path needs either"},
        {HEAD "\"default\": {\"exact_logits\": [{\"tokens\": [1, -4]}]}}",
         "/default/exact_logits/0/tokens/1: a token id is -4"},
        {HEAD "\"default\": {\"exact_logits\": [{\"tokens\": [2147483648]}]}}",
         "/default/exact_logits/0/tokens/0: a token id is 2147483648"},
        {HEAD "\"default\": {\"exact_logits\": [{\"tokens\": []}]}}",
         "/default/exact_logits/0/tokens"},
        {HEAD "\"default\": {\"exact_logits\": [7]}}",
         "/default/exact_logits/0: a path must be an object"},
        {HEAD "\"default\": {\"bitwise\": true}, \"validation\": {\"prompts\": 0}}",
         "/validation/prompts: prompts is 0"},
        {HEAD
         "\"default\": {\"bitwise\": true}, \"validation\": {\"prompts\": 100, \"tokens\": 10}}",
         "/validation: the budget of 10 tokens is smaller than its 100 prompts"},
        {HEAD "\"default\": {\"bitwise\": true}, \"validation\": {\"seed\": 1}}",
         "/validation/seed: unknown member"},
        {HEAD "\"default\": {\"bitwise\": true}, \"reference\": \"scalar ref\"}",
         "/reference: the reference has the character 0x20 at byte 6"},
        {HEAD "\"default\": {\"bitwise\": true}, \"reference\": \"\"}",
         "/reference: the reference is 0 bytes"},
        {HEAD "\"default\": {\"bitwise\": true}, \"name\": \"a\\nb\"}",
         "/name: the name has the control character 0x0a"},
        {HEAD "\"default\": {\"bitwise\": true}, \"regions\": []}",
         "/regions: regions must be an object"},
    };
#undef HEAD
    for (size_t i = 0; i < PX_ARRAY_LEN(cases); i++) {
        px_contract *c = (px_contract *)0x1;
        px_err err;
        px_diags diags;
        px_diags_init(&diags);
        px_status st =
            px_contract_parse(cases[i].text, strlen(cases[i].text), "bad.json", &diags, &c, &err);
        if (st == PX_OK)
            fail_msg("case %zu accepted: %s", i, cases[i].text);
        assert_int_equal(st, PX_EVALIDATE);
        assert_null(c);
        px_assert_contains(err.msg, "bad.json: ");
        px_assert_contains(err.msg, cases[i].needle);
        assert_true(diags.n_errors >= 1);
        /* Every error carries a fix. */
        for (size_t k = 0; k < diags.n; k++)
            if (diags.items[k].severity == PX_SEV_ERROR && !diags.items[k].fix)
                fail_msg("case %zu: diagnostic without a fix: %s", i, diags.items[k].message);
        px_diags_release(&diags);
    }
}

static void test_parse_reports_every_problem_not_only_the_first(void **state)
{
    (void)state;
    const char *text = "{\"schema\": \"plexus.contract/1\", \"extra\": 1,\n"
                       " \"default\": {\"tolerance\": {\"atol\": -1, \"rtol\": 9}},\n"
                       " \"regions\": {\"head\": {\"agreement\": {\"top1_min\": 2}},\n"
                       "             \"layer.*.ffn\": {\"divergence\": {\"kl_max\": \"big\"}},\n"
                       "             \"layer.x*\": {\"bitwise\": true}}}";
    px_diags diags;
    px_diags_init(&diags);
    px_contract *c;
    px_err err;
    assert_int_equal(px_contract_parse(text, strlen(text), "many.json", &diags, &c, &err),
                     PX_EVALIDATE);
    assert_int_equal(diags.n_errors, 6);
    px_assert_contains(err.msg, "and 5 more problems");
    char *report = px_diags_format(&diags, "many.json");
    px_assert_contains(report, "many.json: error: /extra: unknown member");
    px_assert_contains(report, "/default/tolerance/atol");
    px_assert_contains(report, "/default/tolerance/rtol");
    px_assert_contains(report, "/regions/head/agreement/top1_min");
    px_assert_contains(report, "/regions/layer.*.ffn/divergence/kl_max");
    px_assert_contains(report, "/regions/layer.x*: region pattern");
    px_assert_contains(report, "fix: ");
    free(report);
    px_diags_release(&diags);
}

static void test_parse_warns_about_redundant_or_vacuous_clauses(void **state)
{
    (void)state;
    const char *text = "{\"schema\": \"plexus.contract/1\",\n"
                       " \"default\": {\"bitwise\": true, \"deterministic\": true},\n"
                       " \"regions\": {\"default\": {\"tolerance\": {\"atol\": 0, \"rtol\": 0}},\n"
                       "             \"head\": {\"agreement\": {\"top1_min\": 0}}}}";
    px_diags diags;
    px_diags_init(&diags);
    px_contract *c = parse_ok(text, &diags);
    assert_int_equal(diags.n_errors, 0);
    assert_int_equal(diags.n_warnings, 4);
    char *report = px_diags_format(&diags, "w.json");
    px_assert_contains(report, "/default: bitwise already implies");
    px_assert_contains(report, "/regions/default: an entry named \"default\"");
    px_assert_contains(report, "/regions/default/tolerance: a tolerance of zero");
    px_assert_contains(report, "/regions/head/agreement/top1_min: top1_min = 0");
    free(report);
    px_diags_release(&diags);
    px_contract_free(c);
}

static void test_parse_refuses_oversize_and_malformed_documents(void **state)
{
    (void)state;
    px_contract *c;
    px_err err;
    /* Not JSON at all, trailing garbage, duplicate keys, overflowing numbers. */
    const char *syntax[] = {
        "{",
        "{\"schema\": \"plexus.contract/1\"} x",
        "{\"a\": 1, \"a\": 2}",
        ("{\"schema\": \"plexus.contract/1\", \"default\": {\"tolerance\": {\"atol\": 1e999, "
         "\"rtol\": 0}}}"),
        "",
        "\xff\xfe",
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(syntax); i++) {
        assert_int_equal(px_contract_parse(syntax[i], strlen(syntax[i]), "s.json", NULL, &c, &err),
                         PX_EPARSE);
        px_assert_contains(err.msg, "s.json:");
    }
    /* Deep nesting. */
    px_strbuf sb = PX_STRBUF_INIT;
    for (int i = 0; i < 40; i++)
        px_strbuf_adds(&sb, "[");
    for (int i = 0; i < 40; i++)
        px_strbuf_adds(&sb, "]");
    assert_int_equal(px_contract_parse(sb.buf, sb.len, "deep.json", NULL, &c, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "nesting deeper");
    /* More than 1 MiB. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.contract/1\", \"description\": \"");
    while (sb.len < PX_CONTRACT_MAX_BYTES + 10)
        px_strbuf_adds(&sb, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    px_strbuf_adds(&sb, "\"}");
    assert_int_equal(px_contract_parse(sb.buf, sb.len, "big.json", NULL, &c, &err), PX_ELIMIT);
    px_assert_contains(err.msg, "big.json: document is");
    /* Too many region entries: reported with the pointer, not by the
     * generic JSON bound. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.contract/1\", \"default\": {\"bitwise\": true}, "
                        "\"regions\": {");
    for (int i = 0; i <= PX_CONTRACT_MAX_REGIONS; i++)
        px_strbuf_addf(&sb, "%s\"layer.%d.ffn\": {\"bitwise\": true}", i ? ", " : "", i);
    px_strbuf_adds(&sb, "}}");
    assert_int_equal(px_contract_parse(sb.buf, sb.len, "wide.json", NULL, &c, &err), PX_EVALIDATE);
    px_assert_contains(err.msg,
                       "wide.json: /regions: 1025 region entries, more than the limit of 1024");
    /* A path longer than the token limit. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.contract/1\", \"default\": {\"exact_logits\": "
                        "[{\"tokens\": [");
    for (int i = 0; i <= PX_CONTRACT_MAX_PATH_TOKENS; i++)
        px_strbuf_addf(&sb, "%s%d", i ? "," : "", i);
    px_strbuf_adds(&sb, "]}]}}");
    assert_int_equal(px_contract_parse(sb.buf, sb.len, "long.json", NULL, &c, &err), PX_EVALIDATE);
    px_assert_contains(
        err.msg,
        "/default/exact_logits/0/tokens: tokens must be a non-empty array of at most 4096");
    /* A pattern past the length limit. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.contract/1\", \"default\": {\"bitwise\": true}, "
                        "\"regions\": {\"");
    for (int i = 0; i < 200; i++)
        px_strbuf_addch(&sb, 'a');
    px_strbuf_adds(&sb, "\": {\"bitwise\": true}}}");
    assert_int_equal(px_contract_parse(sb.buf, sb.len, "pat.json", NULL, &c, &err), PX_EVALIDATE);
    px_assert_contains(err.msg, "is 200 bytes long, more than the limit of 128");
    /* Many overlapping ranges: the report is bounded. */
    px_strbuf_reset(&sb);
    px_strbuf_adds(&sb, "{\"schema\": \"plexus.contract/1\", \"default\": {\"bitwise\": true}, "
                        "\"regions\": {");
    for (int i = 1; i <= 200; i++)
        px_strbuf_addf(&sb, "%s\"layer.0-%d.ffn\": {\"bitwise\": true}", i > 1 ? ", " : "", i);
    px_strbuf_adds(&sb, "}}");
    px_diags diags;
    px_diags_init(&diags);
    assert_int_equal(px_contract_parse(sb.buf, sb.len, "overlap.json", &diags, &c, &err),
                     PX_EVALIDATE);
    assert_int_equal(diags.n_errors, 65);
    px_assert_contains(diags.items[64].message, "more overlapping entries not listed");
    px_diags_release(&diags);
    px_strbuf_release(&sb);
}

/* Mutations of a valid contract: every one is either accepted or refused
 * with an error, never a crash or a leak (run under ASan). */
static void test_parse_survives_random_mutations(void **state)
{
    (void)state;
    size_t len = strlen(mixed_text);
    char *buf = malloc(len + 1);
    px_rng rng;
    px_rng_seed(&rng, 2026);
    size_t n_ok = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, mixed_text, len + 1);
        int n_mut = 1 + (int)px_rng_below(&rng, 4);
        size_t cut = len;
        for (int m = 0; m < n_mut; m++) {
            size_t at = px_rng_below(&rng, len);
            switch (px_rng_below(&rng, 4)) {
            case 0:
                buf[at] = (char)px_rng_below(&rng, 256);
                break;
            case 1:
                buf[at] = "{}[]\",:0-9e.*"[px_rng_below(&rng, 13)];
                break;
            case 2:
                cut = at;
                break;
            default:
                buf[at] = buf[px_rng_below(&rng, len)];
                break;
            }
        }
        px_contract *c = NULL;
        px_diags diags;
        px_diags_init(&diags);
        px_err err;
        px_status st = px_contract_parse(buf, cut, "m.json", &diags, &c, &err);
        if (st == PX_OK) {
            n_ok++;
            char *text = px_contract_export(c);
            assert_non_null(text);
            px_contract *back;
            px_assert_ok(px_contract_parse(text, strlen(text), "back.json", NULL, &back, &err),
                         &err);
            char *again = px_contract_export(back);
            assert_string_equal(text, again);
            free(again);
            free(text);
            px_contract_free(back);
        } else {
            assert_null(c);
            assert_true(err.msg[0] != '\0');
        }
        px_contract_free(c);
        px_diags_release(&diags);
    }
    free(buf);
    /* Some mutations (inside strings, say) keep the document valid. */
    assert_true(n_ok > 0);
}

static void test_export_round_trip_is_byte_identical(void **state)
{
    (void)state;
    px_contract *c = parse_ok(mixed_text, NULL);
    char *first = px_contract_export(c);
    assert_non_null(first);
    px_assert_contains(first, "\"schema\": \"plexus.contract/1\"");
    px_contract *back = parse_ok(first, NULL);
    char *second = px_contract_export(back);
    assert_string_equal(first, second);
    char d1[65], d2[65];
    px_assert_ok(px_contract_digest(c, d1), (px_err *)NULL);
    px_assert_ok(px_contract_digest(back, d2), (px_err *)NULL);
    assert_string_equal(d1, d2);
    free(first);
    free(second);
    px_contract_free(c);
    px_contract_free(back);
}

static void test_equal_contracts_export_equal_bytes(void **state)
{
    (void)state;
    /* Same meaning, written differently: member order, integers for reals,
     * defaults spelled out or left implicit, bitwise against the contract's
     * own reference written out. */
    const char *a = "{\"schema\": \"plexus.contract/1\", \"default\": {\"bitwise\": true},"
                    " \"regions\": {\"layer.*.ffn\": {\"tolerance\": {\"atol\": 0, \"rtol\": 1}},"
                    " \"head\": {\"deterministic\": true}}}";
    const char *b =
        "{\"regions\": {\"head\": {\"deterministic\": true},"
        " \"layer.*.ffn\": {\"tolerance\": {\"rtol\": 1.0, \"atol\": 0.0}}},"
        " \"reference\": \"scalar-reference\","
        " \"validation\": {\"tokens\": 2048, \"prompts\": 16, \"prompt_set\": \"default\"},"
        " \"default\": {\"bitwise\": {\"reference\": \"scalar-reference\"}},"
        " \"schema\": \"plexus.contract/1\"}";
    const char *different =
        "{\"schema\": \"plexus.contract/1\", \"default\": {\"bitwise\": true},"
        " \"regions\": {\"layer.*.ffn\": {\"tolerance\": {\"atol\": 0, \"rtol\": 0.5}},"
        " \"head\": {\"deterministic\": true}}}";
    px_contract *ca = parse_ok(a, NULL), *cb = parse_ok(b, NULL), *cd = parse_ok(different, NULL);
    char *ta = px_contract_export(ca), *tb = px_contract_export(cb), *td = px_contract_export(cd);
    assert_string_equal(ta, tb);
    assert_string_not_equal(ta, td);
    char da[65], dd[65];
    assert_int_equal(px_contract_digest(ca, da), PX_OK);
    assert_int_equal(px_contract_digest(cd, dd), PX_OK);
    assert_string_not_equal(da, dd);
    free(ta);
    free(tb);
    free(td);
    px_contract_free(ca);
    px_contract_free(cb);
    px_contract_free(cd);
}

static void test_from_json_borrows_the_document(void **state)
{
    (void)state;
    json_t *doc =
        json_pack("{s:s, s:{s:b}}", "schema", "plexus.contract/1", "default", "deterministic", 1);
    px_contract *c;
    px_err err;
    px_assert_ok(px_contract_from_json(doc, "inline", NULL, &c, &err), &err);
    json_decref(doc); /* the contract must not depend on it */
    assert_int_equal(px_contract_default(c)->reqs, PX_CONTRACT_DETERMINISTIC);
    px_contract_free(c);
}

static void test_builtins_load_by_name_and_match_their_data_files(void **state)
{
    (void)state;
    const char *const *names = px_contract_builtin_names();
    size_t n = 0;
    for (const char *const *p = names; *p; p++, n++) {
        px_contract *builtin, *file;
        px_err err;
        px_assert_ok(px_contract_builtin(*p, &builtin, &err), &err);
        assert_string_equal(px_contract_name(builtin), *p);
        char *rel = px_asprintf("data/contracts/%s.json", *p);
        char *path = px_test_source_path(rel);
        px_assert_ok(px_contract_load_file(path, NULL, &file, &err), &err);
        char *a = px_contract_export(builtin), *b = px_contract_export(file);
        assert_string_equal(a, b);
        free(a);
        free(b);
        free(rel);
        free(path);
        px_contract_free(builtin);
        px_contract_free(file);
    }
    assert_int_equal(n, 3);
    px_contract *c;
    px_err err;
    px_assert_ok(px_contract_builtin("strict", &c, &err), &err);
    assert_int_equal(px_contract_default(c)->reqs, PX_CONTRACT_BITWISE);
    px_contract_free(c);
    px_assert_ok(px_contract_builtin("relaxed", &c, &err), &err);
    assert_true(px_contract_default(c)->reqs & PX_CONTRACT_DIVERGENCE);
    px_contract_free(c);
    assert_int_equal(px_contract_builtin("lenient", &c, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "strict, deterministic or relaxed");
}

static void test_load_takes_a_file_or_a_builtin_name(void **state)
{
    (void)state;
    px_err err;
    px_contract *c;
    char *path = px_asprintf("%s/mixed.json", px_test_tmpdir());
    px_assert_ok(px_write_file(path, mixed_text, strlen(mixed_text), &err), &err);
    px_assert_ok(px_contract_load(path, NULL, &c, &err), &err);
    assert_string_equal(px_contract_name(c), "mixed");
    px_contract_free(c);
    px_assert_ok(px_contract_load("deterministic", NULL, &c, &err), &err);
    assert_string_equal(px_contract_name(c), "deterministic");
    px_contract_free(c);
    px_diags diags;
    px_diags_init(&diags);
    assert_int_equal(px_contract_load("/no/such/contract.json", &diags, &c, &err), PX_ENOTFOUND);
    px_assert_contains(err.msg, "no such file, and not a built-in contract");
    assert_int_equal(diags.n_errors, 1);
    px_diags_release(&diags);
    /* A file that is not a contract reports through diags too. */
    px_assert_ok(px_write_file(path, "{\"schema\": 3}", 13, &err), &err);
    px_diags_init(&diags);
    assert_int_equal(px_contract_load(path, &diags, &c, &err), PX_EVALIDATE);
    assert_int_equal(diags.n_errors, 2); /* bad schema, missing default */
    px_diags_release(&diags);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_reads_every_field_of_a_mixed_contract),
        cmocka_unit_test(test_parse_rejects_bad_contracts_naming_the_place),
        cmocka_unit_test(test_parse_reports_every_problem_not_only_the_first),
        cmocka_unit_test(test_parse_warns_about_redundant_or_vacuous_clauses),
        cmocka_unit_test(test_parse_refuses_oversize_and_malformed_documents),
        cmocka_unit_test(test_parse_survives_random_mutations),
        cmocka_unit_test(test_export_round_trip_is_byte_identical),
        cmocka_unit_test(test_equal_contracts_export_equal_bytes),
        cmocka_unit_test(test_from_json_borrows_the_document),
        cmocka_unit_test(test_builtins_load_by_name_and_match_their_data_files),
        cmocka_unit_test(test_load_takes_a_file_or_a_builtin_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
