/*
 * The deployments of a store, the same checks on SQLite and PostgreSQL:
 * insert, a taken name refused, read back, replace, list by owner, delete.
 * Included by the store tests (static helpers).
 */
#ifndef PX_STORE_DEPLOY_CHECK_H
#define PX_STORE_DEPLOY_CHECK_H

#include "px_test.h"

#include "fleet/fleet_impl.h"

typedef struct deploy_seen {
    int n;
    char names[256];
} deploy_seen;

static void deploy_seen_one(const px__deploy_row *row, void *ud)
{
    deploy_seen *s = ud;
    s->n++;
    size_t have = strlen(s->names);
    snprintf(s->names + have, sizeof s->names - have, "%s%s", have ? "," : "", row->name);
}

/* Runs the checks on an open store; reopen (may be NULL) closes and opens
 * it again, to show the rows are on disk. */
static void store_deploy_check(px__store *st, void (*reopen)(px__store *st))
{
    px_err err;
    assert_true(st->ops->version >= 5);
    px__deploy_row row = {.name = "chat",
                          .owner = "tester",
                          .model =
                              "047bf46455a544931cff6fef14d7910154c56afbc23ab1c5e56a72e69912c04b",
                          .spec = "{\"name\":\"chat\"}",
                          .state = "planned",
                          .plan = "{\"status\":\"planned\"}",
                          .incidents = "[]",
                          .created = 100,
                          .updated = 100};
    px_assert_ok(st->ops->put_deployment(st->self, &row, false, &err), &err);
    assert_int_equal(st->ops->put_deployment(st->self, &row, false, &err), PX_EEXIST);
    px_assert_contains(err.msg, "chat");
    px__deploy_row other = row;
    other.name = "batch";
    other.owner = "other";
    other.plan = NULL;
    other.incidents = NULL;
    px_assert_ok(st->ops->put_deployment(st->self, &other, false, &err), &err);
    if (reopen)
        reopen(st);
    px__deploy_row got;
    px_assert_ok(st->ops->get_deployment(st->self, "chat", &got, &err), &err);
    assert_string_equal(got.owner, "tester");
    assert_string_equal(got.model, row.model);
    assert_string_equal(got.plan, row.plan);
    assert_string_equal(got.state, "planned");
    assert_int_equal(got.created, 100);
    px__deploy_row_release(&got);
    px_assert_ok(st->ops->get_deployment(st->self, "batch", &got, &err), &err);
    assert_null(got.plan);
    assert_null(got.incidents);
    px__deploy_row_release(&got);
    assert_int_equal(st->ops->get_deployment(st->self, "nope", &got, &err), PX_ENOTFOUND);
    /* Replace: the state and incidents change, the name stays. */
    row.state = "degraded";
    row.incidents = "[{\"kind\":\"node lost\"}]";
    row.updated = 200;
    px_assert_ok(st->ops->put_deployment(st->self, &row, true, &err), &err);
    px_assert_ok(st->ops->get_deployment(st->self, "chat", &got, &err), &err);
    assert_string_equal(got.state, "degraded");
    px_assert_contains(got.incidents, "node lost");
    assert_int_equal(got.updated, 200);
    px__deploy_row_release(&got);
    px__deploy_row ghost = row;
    ghost.name = "ghost";
    assert_int_equal(st->ops->put_deployment(st->self, &ghost, true, &err), PX_ENOTFOUND);
    /* Lists: by owner, and every owner's by name. */
    deploy_seen seen = {0};
    px_assert_ok(st->ops->list_deployments(st->self, "tester", deploy_seen_one, &seen, &err), &err);
    assert_int_equal(seen.n, 1);
    assert_string_equal(seen.names, "chat");
    memset(&seen, 0, sizeof seen);
    px_assert_ok(st->ops->list_deployments(st->self, NULL, deploy_seen_one, &seen, &err), &err);
    assert_string_equal(seen.names, "batch,chat");
    /* Delete frees the name. */
    px_assert_ok(st->ops->delete_deployment(st->self, "chat", &err), &err);
    assert_int_equal(st->ops->delete_deployment(st->self, "chat", &err), PX_ENOTFOUND);
    assert_int_equal(st->ops->get_deployment(st->self, "chat", &got, &err), PX_ENOTFOUND);
    row.state = "planned";
    px_assert_ok(st->ops->put_deployment(st->self, &row, false, &err), &err);
}

#endif
