/* `plexus run --transport tcp:A.B.C.D`: the stage workers are started by
 * a launcher on that address and reached over authenticated TCP; the run
 * prints the tokens of a run over Unix sockets, and a stage killed
 * mid-generation is found through the launcher's health, healed on a new
 * plan, and every token is still the fault-free one.  Skipped without the
 * shared model. */
#include "stories_run.h"

#include <string.h>

static json_t *run_json(const char *transport, const char *inject)
{
    const char *args[24] = {
        "run",  "--model",     model,    "--inventory", inventory,          "--plan",
        plan,   "-n",          "32",     "--prompt",    "Once upon a time", "-o",
        "json", "--transport", transport};
    size_t n = 15;
    if (inject) {
        args[n++] = "--inject";
        args[n++] = inject;
    }
    args[n] = NULL;
    char *out = NULL, *errs = NULL;
    int rc = run_plexus(args, &out, &errs);
    if (rc != 0)
        fail_msg("plexus run --transport %s exited %d:\n%s\n%s", transport, rc, out, errs);
    json_t *doc = NULL;
    px_err err;
    px_assert_ok(px_json_parse(out, strlen(out), "run", NULL, &doc, &err), &err);
    free(out);
    free(errs);
    return doc;
}

static const char *text_of(const json_t *doc)
{
    return json_string_value(
        json_object_get(json_array_get(json_object_get(doc, "results"), 0), "text"));
}

static void test_launched_stages_run_and_heal_with_the_same_tokens(void **state)
{
    (void)state;
    if (!model)
        skip();
    json_t *local = run_json("unix", NULL);
    json_t *launched = run_json("tcp:127.0.0.2", NULL);
    assert_string_equal(text_of(local), text_of(launched));
    /* A stage killed mid-generation: found, healed, same tokens. */
    json_t *healed = run_json("tcp:127.0.0.2", "kill:stage1@token12");
    assert_string_equal(text_of(local), text_of(healed));
    const json_t *inc = json_object_get(healed, "incidents");
    assert_true(json_array_size(inc) >= 1);
    char *text = json_dumps(inc, 0);
    px_assert_contains(text, "device-loss");
    free(text);
    json_decref(local);
    json_decref(launched);
    json_decref(healed);
}

static void test_run_refuses_a_stage_host_that_is_not_an_address(void **state)
{
    (void)state;
    if (!model)
        skip();
    const char *args[] = {
        "run", "--model", model,      "--inventory", inventory,     "--plan",          plan,
        "-n",  "4",       "--prompt", "Once",        "--transport", "tcp:example.org", NULL};
    char *out = NULL, *errs = NULL;
    assert_int_not_equal(run_plexus(args, &out, &errs), 0);
    px_assert_contains(errs, "numeric IPv4");
    free(out);
    free(errs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launched_stages_run_and_heal_with_the_same_tokens),
        cmocka_unit_test(test_run_refuses_a_stage_host_that_is_not_an_address),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
