/* Contracts: discharging obligations from measured evidence, with margins. */
#include "px_test.h"

#include <math.h>
#include <string.h>

#include "plexus/contract.h"

static px_contract *parse(const char *text)
{
    px_contract *c;
    px_err err;
    px_assert_ok(px_contract_parse(text, strlen(text), "ev.json", NULL, &c, &err), &err);
    return c;
}

static const px_contract_clause *clause(const px_contract *c, const char *region)
{
    const px_contract_clause *cl;
    px_assert_ok(px_contract_lookup(c, region, &cl, NULL), (px_err *)NULL);
    return cl;
}

static const char *text = "{\"schema\": \"plexus.contract/1\", \"default\": {\"bitwise\": true},"
                          " \"regions\": {"
                          "  \"tol\": {\"tolerance\": {\"atol\": 0.01, \"rtol\": 0.1}},"
                          "  \"kl\": {\"divergence\": {\"kl_max\": 0.02}},"
                          "  \"top\": {\"agreement\": {\"top1_min\": 0.9, \"positions\": 100}},"
                          "  \"det\": {\"deterministic\": true},"
                          "  \"exact\": {\"exact_logits\": [{\"prompt\": \"p\"}]},"
                          "  \"both\": {\"deterministic\": true, \"divergence\": {\"kl_max\": 0.1},"
                          "            \"agreement\": {\"top1_min\": 0.5}}}}";

static void near(double a, double b)
{
    if (fabs(a - b) > 1e-12)
        fail_msg("%.17g != %.17g", a, b);
}

static void test_divergence_passes_and_fails_with_the_margin(void **state)
{
    (void)state;
    px_contract *c = parse(text);
    px_contract_check r;
    px_contract_evidence ev = {.measured = PX_CONTRACT_DIVERGENCE, .kl = 0.015};
    px_contract_check_evidence(clause(c, "kl"), &ev, &r);
    assert_true(r.pass);
    assert_int_equal(r.n_items, 1);
    assert_int_equal(r.items[0].req, PX_CONTRACT_DIVERGENCE);
    near(r.items[0].margin, 0.005);
    near(r.items[0].bound, 0.02);
    px_assert_contains(r.items[0].text, "KL 0.015 nats <= kl_max 0.02");
    ev.kl = 0.03;
    px_contract_check_evidence(clause(c, "kl"), &ev, &r);
    assert_false(r.pass);
    near(r.items[0].margin, -0.01);
    ev.kl = 0.02; /* on the bound passes */
    px_contract_check_evidence(clause(c, "kl"), &ev, &r);
    assert_true(r.pass);
    ev.kl = NAN;
    px_contract_check_evidence(clause(c, "kl"), &ev, &r);
    assert_false(r.pass);
    assert_true(r.items[0].measured);
    px_assert_contains(r.items[0].text, "not a number");
    /* Evidence for something else does not count. */
    ev = (px_contract_evidence){.measured = PX_CONTRACT_AGREEMENT, .top1 = 1};
    px_contract_check_evidence(clause(c, "kl"), &ev, &r);
    assert_false(r.pass);
    assert_false(r.items[0].measured);
    assert_string_equal(r.items[0].text, "not measured");
    px_contract_free(c);
}

static void test_agreement_needs_the_floor_and_enough_positions(void **state)
{
    (void)state;
    px_contract *c = parse(text);
    px_contract_check r;
    px_contract_evidence ev = {.measured = PX_CONTRACT_AGREEMENT, .top1 = 0.95, .positions = 128};
    px_contract_check_evidence(clause(c, "top"), &ev, &r);
    assert_true(r.pass);
    near(r.items[0].margin, 0.05);
    ev.top1 = 0.85;
    px_contract_check_evidence(clause(c, "top"), &ev, &r);
    assert_false(r.pass);
    near(r.items[0].margin, -0.05);
    px_assert_contains(r.items[0].text, "top-1 agreement 0.85 < top1_min 0.9");
    ev.top1 = 0.99;
    ev.positions = 50;
    px_contract_check_evidence(clause(c, "top"), &ev, &r);
    assert_false(r.pass);
    px_assert_contains(r.items[0].text, "measured over 50 positions; the clause requires 100");
    ev.positions = 100;
    ev.top1 = 1.5;
    px_contract_check_evidence(clause(c, "top"), &ev, &r);
    assert_false(r.pass);
    px_assert_contains(r.items[0].text, "not a fraction");
    px_contract_free(c);
}

static void test_tolerance_uses_the_per_element_ratio_when_given(void **state)
{
    (void)state;
    px_contract *c = parse(text);
    const px_contract_clause *tol = clause(c, "tol");
    /* Reference values and candidates: elements 2 and 3 have absolute
     * errors of 0.05 and 0.1, above atol, but inside atol + rtol |r|. */
    float r[] = {0.0f, 0.5f, 1.0f, -2.0f};
    float x[] = {0.0f, 0.5f, 1.05f, -2.1f};
    px_contract_evidence ev = {.tol_ratio = NAN};
    px_contract_measure_tolerance(x, r, 4, tol->atol, tol->rtol, &ev);
    assert_true(ev.measured & PX_CONTRACT_TOLERANCE);
    assert_true(fabs(ev.max_abs_err - 0.1) < 1e-6);
    assert_true(fabs(ev.max_rel_err - 0.05) < 1e-6);
    /* The worst element is 3: 0.1 / (0.01 + 0.2). */
    assert_true(fabs(ev.tol_ratio - 0.1 / 0.21) < 1e-6);
    px_contract_check r1;
    px_contract_check_evidence(tol, &ev, &r1);
    assert_true(r1.pass);
    assert_true(fabs(r1.items[0].margin - (1 - 0.1 / 0.21)) < 1e-6);

    /* Without the ratio, the maxima prove it only when one term covers
     * every element on its own: here the relative term does. */
    ev.tol_ratio = NAN;
    px_contract_check_evidence(tol, &ev, &r1);
    assert_true(r1.pass);
    /* Both maxima above their terms: inconclusive, so it fails. */
    ev.max_abs_err = 0.5;
    ev.max_rel_err = 0.5;
    px_contract_check_evidence(tol, &ev, &r1);
    assert_false(r1.pass);
    px_assert_contains(r1.items[0].text, "without the per-element ratio");

    /* A NaN where the reference has a number is an infinite error. */
    float xn[] = {NAN, 0.5f};
    px_contract_evidence bad = {.tol_ratio = NAN};
    px_contract_measure_tolerance(xn, r, 2, tol->atol, tol->rtol, &bad);
    assert_true(isinf(bad.max_abs_err));
    px_contract_check_evidence(tol, &bad, &r1);
    assert_false(r1.pass);
    px_assert_contains(r1.items[0].text, "exceeds");
    /* NaN against NaN and equal infinities match. */
    float rn[] = {NAN, INFINITY};
    float xs[] = {NAN, INFINITY};
    px_contract_measure_tolerance(xs, rn, 2, tol->atol, tol->rtol, &bad);
    assert_true(bad.max_abs_err == 0 && bad.tol_ratio == 0);
    /* A zero-tolerance clause passes only exact equality. */
    px_contract_clause zero = *tol;
    zero.atol = zero.rtol = 0;
    px_contract_measure_tolerance(x, x, 4, 0, 0, &bad);
    px_contract_check_evidence(&zero, &bad, &r1);
    assert_true(r1.pass);
    px_contract_measure_tolerance(x, r, 4, 0, 0, &bad);
    px_contract_check_evidence(&zero, &bad, &r1);
    assert_false(r1.pass);
    px_contract_free(c);
}

static void test_bit_equality_requirements_read_their_flags(void **state)
{
    (void)state;
    px_contract *c = parse(text);
    px_contract_check r;
    px_contract_evidence ev = {.measured = PX_CONTRACT_BITWISE, .bitwise_equal = true};
    px_contract_check_evidence(clause(c, "embedding"), &ev, &r); /* default: bitwise */
    assert_true(r.pass);
    ev.bitwise_equal = false;
    px_contract_check_evidence(clause(c, "embedding"), &ev, &r);
    assert_false(r.pass);
    px_assert_contains(r.items[0].text, "differ");
    ev = (px_contract_evidence){.measured = PX_CONTRACT_DETERMINISTIC, .replay_equal = true};
    px_contract_check_evidence(clause(c, "det"), &ev, &r);
    assert_true(r.pass);
    /* The flag alone, unmarked as measured, is not evidence. */
    ev = (px_contract_evidence){.replay_equal = true};
    px_contract_check_evidence(clause(c, "det"), &ev, &r);
    assert_false(r.pass);
    ev = (px_contract_evidence){.measured = PX_CONTRACT_EXACT_LOGITS, .exact_logits_equal = true};
    px_contract_check_evidence(clause(c, "exact"), &ev, &r);
    assert_true(r.pass);
    ev.exact_logits_equal = false;
    px_contract_check_evidence(clause(c, "exact"), &ev, &r);
    assert_false(r.pass);
    px_contract_free(c);
}

static void test_every_requirement_of_a_clause_must_pass(void **state)
{
    (void)state;
    px_contract *c = parse(text);
    const px_contract_clause *both = clause(c, "both");
    px_contract_check r;
    px_contract_evidence ev = {.measured = PX_CONTRACT_DETERMINISTIC | PX_CONTRACT_DIVERGENCE |
                                           PX_CONTRACT_AGREEMENT,
                               .replay_equal = true,
                               .kl = 0.05,
                               .top1 = 0.8};
    px_contract_check_evidence(both, &ev, &r);
    assert_true(r.pass);
    assert_int_equal(r.n_items, 3);
    assert_int_equal(r.items[0].req, PX_CONTRACT_DETERMINISTIC);
    assert_int_equal(r.items[1].req, PX_CONTRACT_DIVERGENCE);
    assert_int_equal(r.items[2].req, PX_CONTRACT_AGREEMENT);
    ev.replay_equal = false;
    px_contract_check_evidence(both, &ev, &r);
    assert_false(r.pass);
    assert_false(r.items[0].pass);
    assert_true(r.items[1].pass && r.items[2].pass);
    ev.replay_equal = true;
    ev.measured &= ~(unsigned)PX_CONTRACT_AGREEMENT;
    px_contract_check_evidence(both, &ev, &r);
    assert_false(r.pass);
    assert_false(r.items[2].measured);
    px_contract_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_divergence_passes_and_fails_with_the_margin),
        cmocka_unit_test(test_agreement_needs_the_floor_and_enough_positions),
        cmocka_unit_test(test_tolerance_uses_the_per_element_ratio_when_given),
        cmocka_unit_test(test_bit_equality_requirements_read_their_flags),
        cmocka_unit_test(test_every_requirement_of_a_clause_must_pass),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
