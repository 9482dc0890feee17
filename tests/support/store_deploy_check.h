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

typedef struct record_seen {
    int n;
    int64_t first, last;
    char bodies[512];
} record_seen;

static void record_seen_one(int64_t seq, int64_t at, const char *body, void *ud)
{
    record_seen *s = ud;
    assert_true(at >= 1000);
    if (!s->n++)
        s->first = seq;
    s->last = seq;
    size_t have = strlen(s->bodies);
    snprintf(s->bodies + have, sizeof s->bodies - have, "%s", body);
}

/* Records of a deployment (version 7): a ring per deployment and kind,
 * read after a sequence number, gone with the deployment.  Needs the
 * deployment "chat" that store_deploy_check leaves. */
static void store_deploy_records_check(px__store *st)
{
    px_err err;
    assert_true(st->ops->version >= 7);
    int64_t seq = 0;
    char body[32];
    for (int i = 1; i <= 5; i++) {
        snprintf(body, sizeof body, "{\"i\":%d}", i);
        px_assert_ok(st->ops->append_deploy_record(st->self, "chat", "observation", 1000 + i, body,
                                                   3, &seq, &err),
                     &err);
        assert_int_equal(seq, i);
    }
    px_assert_ok(st->ops->append_deploy_record(st->self, "chat", "incident", 1000, "{\"id\":\"x\"}",
                                               3, &seq, &err),
                 &err);
    assert_int_equal(seq, 1); /* numbered per kind */
    record_seen seen = {0};
    px_assert_ok(st->ops->list_deploy_records(st->self, "chat", "observation", 0, 100,
                                              record_seen_one, &seen, &err),
                 &err);
    assert_int_equal(seen.n, 3); /* the ring keeps the latest 3 */
    assert_int_equal(seen.first, 3);
    assert_string_equal(seen.bodies, "{\"i\":3}{\"i\":4}{\"i\":5}");
    memset(&seen, 0, sizeof seen);
    px_assert_ok(st->ops->list_deploy_records(st->self, "chat", "observation", 4, 100,
                                              record_seen_one, &seen, &err),
                 &err);
    assert_int_equal(seen.n, 1);
    assert_int_equal(seen.last, 5);
    memset(&seen, 0, sizeof seen);
    px_assert_ok(st->ops->list_deploy_records(st->self, "chat", "observation", 0, 2,
                                              record_seen_one, &seen, &err),
                 &err);
    assert_int_equal(seen.n, 2);
    assert_int_equal(
        st->ops->append_deploy_record(st->self, "ghost", "observation", 1000, "{}", 3, &seq, &err),
        PX_ENOTFOUND);
    px_assert_contains(err.msg, "ghost");
    /* Undeployed: its records go, and a new deployment of the name starts
     * afresh. */
    px__deploy_row row;
    px_assert_ok(st->ops->get_deployment(st->self, "chat", &row, &err), &err);
    px_assert_ok(st->ops->delete_deployment(st->self, "chat", &err), &err);
    px_assert_ok(st->ops->put_deployment(st->self, &row, false, &err), &err);
    px__deploy_row_release(&row);
    memset(&seen, 0, sizeof seen);
    px_assert_ok(st->ops->list_deploy_records(st->self, "chat", "observation", 0, 100,
                                              record_seen_one, &seen, &err),
                 &err);
    assert_int_equal(seen.n, 0);
    px_assert_ok(
        st->ops->append_deploy_record(st->self, "chat", "observation", 1001, "{}", 3, &seq, &err),
        &err);
    assert_int_equal(seq, 1);
}

#endif
