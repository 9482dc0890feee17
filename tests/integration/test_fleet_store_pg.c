/* The PostgreSQL store on a real PostgreSQL server the test starts itself
 * (tests/support/pg_harness.h): the same records as the SQLite store's
 * tests (jobs with members and attempts, owners and idempotency keys, log
 * numbers and usage with binary output, artifacts, explanations, node
 * credentials and revocations, nodes), what was written is there after
 * the connection is closed and opened again, newer schemas and passwords
 * in the URI are refused, and the scheduler lease: one holder at a time,
 * taken over when its holder's connection goes, and jobs accepted by a
 * replica that does not schedule are claimed once; blobs in chunks, read
 * back whole, checked against their digest on the way in and out;
 * cancellations recorded by any replica, taken once; agents' calls
 * recorded by any replica and read back by change number; the lease's
 * epoch, which fences writes on a second connection (a takeover waits for
 * a fenced commit in flight, and fences out the old holder after it). */
#include "px_test.h"

#include "fleet/fleet_impl.h"
#include "fleet/store_pg_impl.h"
#include "store_deploy_check.h"
#include "pg_harness.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

static pg_harness pg;
static bool pg_up;

static int setup(void **state)
{
    (void)state;
    pg_up = pg_harness_start(&pg);
    if (!pg_up)
        fprintf(stderr, "SKIP: %s\n", pg.why);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pg_harness_stop(&pg);
    return 0;
}

static char *fresh(const char *name)
{
    if (!pg_up)
        return NULL;
    char *uri = pg_harness_database(&pg, name);
    assert_non_null(uri);
    return uri;
}

static void count_job(const px__job_row *row, void *ud)
{
    (void)row;
    (*(int *)ud)++;
}

/* One value from the database, through libpq directly. */
static long long query_int(const char *uri, const char *sql)
{
    PGconn *c = PQconnectdb(uri);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PGresult *r = PQexec(c, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    long long v = PQntuples(r) ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
    PQclear(r);
    PQfinish(c);
    return v;
}

static void test_pg_store_migrates_and_persists_jobs(void **state)
{
    (void)state;
    char *uri = fresh("jobs");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    px__job_row row = {.name = "train",
                       .state = "queued",
                       .attempt = 1,
                       .spec = "{\"command\":[\"true\"]}",
                       .members = "[]",
                       .exit_code = INT_MIN,
                       .created = 100,
                       .updated = 100};
    px_assert_ok(st.ops->insert_job(st.self, &row, &err), &err);
    assert_string_equal(row.id, "j-000001");
    char *first_id = row.id;
    row.id = NULL;
    px_assert_ok(st.ops->insert_job(st.self, &row, &err), &err);
    assert_string_equal(row.id, "j-000002");
    row.state = "assigned";
    row.members = "[{\"node\":\"n1\",\"devices\":[\"gpu0\"],\"state\":\"assigned\"}]";
    px_assert_ok(st.ops->update_job(st.self, &row, NULL, &err), &err);
    row.attempt = 2;
    row.state = "queued";
    row.not_before = 1234.5;
    px_assert_ok(st.ops->update_job(st.self, &row, "node n1 lost", &err), &err);
    st.ops->close(st.self);

    assert_int_equal(query_int(uri, "SELECT MAX(version) FROM schema_version"),
                     px__store_pg_schema_version());
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM attempts WHERE reason = 'node n1 lost'"),
                     1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM members WHERE node = 'n1'"), 1);

    /* Reopening applies no migration twice and finds the rows. */
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    px__job_row got;
    px_assert_ok(st.ops->get_job(st.self, "j-000002", &got, &err), &err);
    assert_string_equal(got.state, "queued");
    assert_int_equal(got.attempt, 2);
    assert_int_equal(got.exit_code, INT_MIN);
    assert_true(got.not_before == 1234.5);
    px__job_row_release(&got);
    assert_int_equal(st.ops->get_job(st.self, "j-999999", &got, &err), PX_ENOTFOUND);
    int n = 0;
    px_assert_ok(st.ops->list_jobs(st.self, "active", NULL, 100, count_job, &n, &err), &err);
    assert_int_equal(n, 2);
    n = 0;
    px_assert_ok(st.ops->list_jobs(st.self, "succeeded", NULL, 100, count_job, &n, &err), &err);
    assert_int_equal(n, 0);
    n = 0;
    px_assert_ok(st.ops->list_jobs(st.self, "", NULL, 1, count_job, &n, &err), &err);
    assert_int_equal(n, 1);
    st.ops->close(st.self);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM schema_version"),
                     px__store_pg_schema_version());
    free(first_id);
    free(row.id);
    free(uri);
}

typedef struct logs_seen {
    int n;
    int64_t last;
    size_t bytes;
    char text[256];
} logs_seen;

static void log_seen(const px__log_chunk *c, void *ud)
{
    logs_seen *s = ud;
    s->n++;
    s->last = c->seq;
    s->bytes += c->len;
    size_t have = strlen(s->text), n = PX_MIN(c->len, sizeof s->text - have - 1);
    memcpy(s->text + have, c->data, n);
    s->text[have + n] = '\0';
}

static void binary_seen(const px__log_chunk *c, void *ud)
{
    /* Output is bytes, not text: a NUL and invalid UTF-8 come back as sent. */
    assert_int_equal(c->len, 4);
    assert_memory_equal(c->data, "\0\xff\x01\x80", 4);
    (*(int *)ud)++;
}

static void test_pg_store_logs_artifacts_explanations_nodes(void **state)
{
    (void)state;
    char *uri = fresh("misc");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    int64_t seq;
    px_assert_ok(st.ops->append_log(st.self, "j-1", 1, 0, "stdout", "hello ", 6, &seq, &err), &err);
    assert_int_equal(seq, 1);
    px_assert_ok(st.ops->append_log(st.self, "j-1", 1, 0, "stderr", "oops\n", 5, &seq, &err), &err);
    px_assert_ok(st.ops->append_log(st.self, "j-1", 1, 0, "stdout", "world", 5, &seq, &err), &err);
    assert_int_equal(seq, 3);
    px_assert_ok(st.ops->append_log(st.self, "j-2", 1, 0, "stdout", "x", 1, &seq, &err), &err);
    assert_int_equal(seq, 1); /* numbered per job */
    px_assert_ok(
        st.ops->append_log(st.self, "j-3", 1, 0, "stdout", "\0\xff\x01\x80", 4, &seq, &err), &err);
    logs_seen s = {0};
    px_assert_ok(st.ops->read_logs(st.self, "j-1", 0, "stdout", SIZE_MAX, log_seen, &s, &err),
                 &err);
    assert_int_equal(s.n, 2);
    assert_string_equal(s.text, "hello world");
    memset(&s, 0, sizeof s);
    px_assert_ok(st.ops->read_logs(st.self, "j-1", 2, NULL, SIZE_MAX, log_seen, &s, &err), &err);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.last, 3);
    /* At most max_bytes, but always at least one chunk. */
    memset(&s, 0, sizeof s);
    px_assert_ok(st.ops->read_logs(st.self, "j-1", 0, NULL, 1, log_seen, &s, &err), &err);
    assert_int_equal(s.n, 1);
    int nb = 0;
    px_assert_ok(st.ops->read_logs(st.self, "j-3", 0, NULL, SIZE_MAX, binary_seen, &nb, &err),
                 &err);
    assert_int_equal(nb, 1);
    px__artifact_row a = {"j-1", "out/model.pt", "ab", 3, 0, 1, 5};
    px_assert_ok(st.ops->put_artifact(st.self, &a, &err), &err);
    px_assert_ok(st.ops->put_artifact(st.self, &a, &err), &err); /* replaced, not doubled */
    px_assert_ok(st.ops->put_explanation(st.self, "j-1", 1, "{\"a\":1}", &err), &err);
    px_assert_ok(st.ops->put_explanation(st.self, "j-1", 2, "{\"a\":2}", &err), &err);
    char *ex;
    px_assert_ok(st.ops->get_explanation(st.self, "j-1", &ex, &err), &err);
    assert_string_equal(ex, "{\"a\":2}");
    free(ex);
    assert_int_equal(st.ops->get_explanation(st.self, "j-9", &ex, &err), PX_ENOTFOUND);
    int64_t log_bytes, art_bytes;
    px_assert_ok(st.ops->job_usage(st.self, "j-1", &log_bytes, &art_bytes, &err), &err);
    assert_int_equal(log_bytes, 16);
    assert_int_equal(art_bytes, 3);
    px_assert_ok(st.ops->put_node(st.self, "n1", "{\"name\":\"n1\"}", "online", 7, &err), &err);
    px_assert_ok(st.ops->put_node(st.self, "n1", NULL, "offline", 8, &err), &err);
    px_assert_ok(st.ops->put_heartbeat(st.self, "n1", 9, "{}", &err), &err);
    px_assert_ok(st.ops->put_heartbeat(st.self, "n1", 10, "{}", &err), &err);
    st.ops->close(st.self);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM nodes WHERE state = 'offline' AND "
                                    "registration LIKE '%n1%'"),
                     1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM artifacts"), 1);
    assert_int_equal(query_int(uri, "SELECT at FROM heartbeats WHERE node = 'n1'"), 10);
    free(uri);
}

static void count_cred(const char *node, const char *hash, void *ud)
{
    (void)hash;
    if (!strcmp(node, "n1"))
        (*(int *)ud)++;
}

static void count_name(const char *name, void *ud)
{
    (void)name;
    (*(int *)ud)++;
}

static void test_pg_store_owners_keys_and_credentials(void **state)
{
    (void)state;
    char *uri = fresh("owners");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    px__job_row row = {.name = "a",
                       .state = "queued",
                       .attempt = 1,
                       .spec = "{}",
                       .members = "[]",
                       .exit_code = INT_MIN,
                       .owner = "alice",
                       .idem_key = "k1",
                       .idem_hash = "h1"};
    px_assert_ok(st.ops->insert_job(st.self, &row, &err), &err);
    free(row.id);
    row.id = NULL;
    /* The same key for the same owner is taken; another owner has its own. */
    assert_int_equal(st.ops->insert_job(st.self, &row, &err), PX_EEXIST);
    px_assert_contains(err.msg, "Idempotency-Key");
    assert_null(row.id);
    row.owner = "bob";
    px_assert_ok(st.ops->insert_job(st.self, &row, &err), &err);
    free(row.id);
    row.id = NULL;
    px__job_row got;
    px_assert_ok(st.ops->find_idempotent(st.self, "alice", "k1", &got, &err), &err);
    assert_string_equal(got.owner, "alice");
    assert_string_equal(got.idem_hash, "h1");
    px__job_row_release(&got);
    assert_int_equal(st.ops->find_idempotent(st.self, "alice", "k2", &got, &err), PX_ENOTFOUND);
    int n = 0;
    px_assert_ok(st.ops->list_jobs(st.self, "", "bob", 100, count_job, &n, &err), &err);
    assert_int_equal(n, 1);
    n = 0;
    px_assert_ok(st.ops->list_jobs(st.self, "active", NULL, 100, count_job, &n, &err), &err);
    assert_int_equal(n, 2);
    px_assert_ok(st.ops->put_credential(st.self, "n1", "aa", &err), &err);
    px_assert_ok(st.ops->put_credential(st.self, "n1", "bb", &err), &err);
    px_assert_ok(st.ops->put_credential(st.self, "n2", "cc", &err), &err);
    px_assert_ok(st.ops->drop_credentials(st.self, "n1", "bb", &err), &err);
    n = 0;
    px_assert_ok(st.ops->list_credentials(st.self, count_cred, &n, &err), &err);
    assert_int_equal(n, 1);
    px_assert_ok(st.ops->set_revoked(st.self, "n3", true, &err), &err);
    px_assert_ok(st.ops->set_revoked(st.self, "n4", true, &err), &err);
    px_assert_ok(st.ops->set_revoked(st.self, "n4", false, &err), &err);
    n = 0;
    px_assert_ok(st.ops->list_revoked(st.self, count_name, &n, &err), &err);
    assert_int_equal(n, 1);
    st.ops->close(st.self);
    free(uri);
}

static void test_pg_store_refuses_passwords_bad_uris_and_newer_schemas(void **state)
{
    (void)state;
    px__store st;
    px_err err;
    assert_int_equal(px__store_pg_open("postgres://u:hunter2@db.example/x", &st, &err), PX_EAUTH);
    px_assert_contains(err.msg, ".pgpass");
    assert_null(strstr(err.msg, "hunter2"));
    assert_int_equal(px__store_pg_open("postgres://u@/x?nosuchoption=1", &st, &err), PX_EINVAL);
    px_assert_contains(err.msg, "--store");
    char *uri = fresh("future");
    if (!uri)
        skip();
    /* A server that is not there: the error names where, and no password. */
    char *wrong = px_asprintf("postgresql://plexus@/x?host=%s&port=1", pg.root);
    assert_int_equal(px__store_pg_open(wrong, &st, &err), PX_EIO);
    px_assert_contains(err.msg, "cannot connect");
    free(wrong);
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    st.ops->close(st.self);
    PGconn *c = PQconnectdb(uri);
    PQclear(PQexec(c, "INSERT INTO schema_version VALUES(999, 0)"));
    PQfinish(c);
    assert_int_equal(px__store_pg_open(uri, &st, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "newer");
    free(uri);
}

static void claimed(const px__job_row *row, void *ud)
{
    char *ids = ud;
    size_t have = strlen(ids);
    snprintf(ids + have, 128 - have, "%s ", row->id);
}

static void test_pg_lease_one_holder_taken_over_and_jobs_claimed_once(void **state)
{
    (void)state;
    char *uri = fresh("lease");
    if (!uri)
        skip();
    px__store a, b;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &a, &err), &err);
    px_assert_ok(px__store_pg_open(uri, &b, &err), &err);
    bool held_a = false, held_b = true;
    px_assert_ok(a.ops->lease(a.self, &held_a, &err), &err);
    px_assert_ok(b.ops->lease(b.self, &held_b, &err), &err);
    assert_true(held_a);
    assert_false(held_b);
    px_assert_ok(a.ops->lease(a.self, &held_a, &err), &err); /* still held */
    assert_true(held_a);
    /* A job the standby accepts waits for the scheduler to claim it; one
     * the scheduler accepts is its own already. */
    px__job_row row = {.name = "x",
                       .state = "queued",
                       .attempt = 1,
                       .spec = "{}",
                       .members = "[]",
                       .exit_code = INT_MIN};
    px_assert_ok(b.ops->insert_job(b.self, &row, &err), &err);
    char *from_b = row.id;
    row.id = NULL;
    px_assert_ok(a.ops->insert_job(a.self, &row, &err), &err);
    char ids[128] = "";
    px_assert_ok(a.ops->claim_jobs(a.self, 10, claimed, ids, &err), &err);
    char want[64];
    snprintf(want, sizeof want, "%s ", from_b);
    assert_string_equal(ids, want);
    ids[0] = '\0';
    px_assert_ok(a.ops->claim_jobs(a.self, 10, claimed, ids, &err), &err);
    assert_string_equal(ids, "");
    /* The holder goes: its session ends (the server notices at once, but
     * in its own time) and the standby takes the lease. */
    a.ops->close(a.self);
    for (int i = 0; i < 300 && !held_b; i++) {
        px_assert_ok(b.ops->lease(b.self, &held_b, &err), &err);
        if (!held_b)
            usleep(100000);
    }
    assert_true(held_b);
    b.ops->close(b.self);
    free(from_b);
    free(row.id);
    free(uri);
}

static void test_pg_batch_commits_together_and_survives_a_failed_write(void **state)
{
    (void)state;
    char *uri = fresh("batch");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    px__job_row row = {.name = "a",
                       .state = "queued",
                       .attempt = 1,
                       .spec = "{}",
                       .members = "[]",
                       .exit_code = INT_MIN,
                       .owner = "alice",
                       .idem_key = "k1",
                       .idem_hash = "h1"};
    px_assert_ok(st.ops->insert_job(st.self, &row, &err), &err);
    char *id = row.id;
    int64_t seq = row.seq;
    row.id = NULL;
    px_assert_ok(st.ops->batch_begin(st.self, &err), &err);
    /* A write that fails inside the batch changes nothing and leaves the
     * batch usable. */
    assert_int_equal(st.ops->insert_job(st.self, &row, &err), PX_EEXIST);
    row.id = id;
    row.seq = seq; /* the failed insert took a number of its own */
    row.state = "assigned";
    row.members = "[{\"node\":\"n1\",\"devices\":[],\"state\":\"assigned\"}]";
    px_assert_ok(st.ops->update_job(st.self, &row, NULL, &err), &err);
    px_assert_ok(st.ops->put_explanation(st.self, id, 1, "{}", &err), &err);
    /* Nobody sees the batch before it commits. */
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM jobs WHERE state = 'assigned'"), 0);
    px_assert_ok(st.ops->batch_end(st.self, &err), &err);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM jobs WHERE state = 'assigned'"), 1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM members WHERE node = 'n1'"), 1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM explanations"), 1);
    /* Outside a batch each write commits at once again. */
    row.state = "running";
    px_assert_ok(st.ops->update_job(st.self, &row, NULL, &err), &err);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM jobs WHERE state = 'running'"), 1);
    /* A job's write is all or nothing (its statements go in one round
     * trip): an attempt reason the database refuses (not UTF-8) leaves
     * the row and its members as they were, in a batch or alone, and the
     * batch goes on. */
    row.state = "queued";
    row.attempt = 2;
    row.members = "[{\"node\":\"n2\",\"devices\":[0],\"state\":\"assigned\",\"started\":7}]";
    assert_int_equal(st.ops->update_job(st.self, &row, "lost \xff\xfe", &err), PX_EIO);
    assert_non_null(strstr(err.msg, "update job"));
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM jobs WHERE state = 'running'"), 1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM members WHERE node = 'n2'"), 0);
    px_assert_ok(st.ops->batch_begin(st.self, &err), &err);
    assert_int_equal(st.ops->update_job(st.self, &row, "lost \xff\xfe", &err), PX_EIO);
    px_assert_ok(st.ops->update_job(st.self, &row, "lost its node", &err), &err);
    px_assert_ok(st.ops->batch_end(st.self, &err), &err);
    assert_int_equal(
        query_int(uri, "SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND attempt = 2"), 1);
    assert_int_equal(
        query_int(uri, "SELECT COUNT(*) FROM members WHERE node = 'n2' AND attempt = 2 AND rank = 0"
                       " AND devices = '[0]' AND started = 7 AND exit_code IS NULL"),
        1);
    assert_int_equal(
        query_int(uri,
                  "SELECT COUNT(*) FROM attempts WHERE attempt = 2 AND reason = 'lost its node'"),
        1);
    st.ops->close(st.self);
    free(id);
    free(uri);
}

static char *deploy_uri;

static void reopen_pg(px__store *st)
{
    px_err err;
    st->ops->close(st->self);
    px_assert_ok(px__store_pg_open(deploy_uri, st, &err), &err);
}

static void test_pg_store_keeps_deployments_by_name(void **state)
{
    (void)state;
    char *uri = fresh("deployments");
    if (!uri)
        skip();
    deploy_uri = uri;
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    store_deploy_check(&st, reopen_pg);
    store_deploy_records_check(&st);
    st.ops->close(st.self);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM deployments"), 2);
    free(uri);
}

/* A scheduling pass's writes: many jobs and explanations in one call each,
 * more than one pipeline's worth, all or nothing. */
static void test_pg_many_jobs_and_explanations_in_one_call(void **state)
{
    (void)state;
    char *uri = fresh("many");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    enum { N = 600 };
    static px__job_row rows[N];
    static px__explanation_row ex[N];
    static char members[N][96];
    for (int i = 0; i < N; i++) {
        rows[i] = (px__job_row){
            .state = "queued", .attempt = 1, .spec = "{}", .members = "[]", .exit_code = INT_MIN};
        px_assert_ok(st.ops->insert_job(st.self, &rows[i], &err), &err);
        snprintf(members[i], sizeof members[i],
                 "[{\"node\":\"n%d\",\"devices\":[],\"state\":\"assigned\"}]", i);
        rows[i].state = "assigned";
        rows[i].members = members[i];
        ex[i] = (px__explanation_row){rows[i].id, 1, "{\"decision\": \"placed\"}"};
    }
    px_assert_ok(st.ops->batch_begin(st.self, &err), &err);
    /* The last row is refused (not UTF-8): none of them is written, and
     * the batch goes on. */
    rows[N - 1].error = "\xff";
    assert_int_equal(st.ops->update_jobs(st.self, rows, N, &err), PX_EIO);
    assert_non_null(strstr(err.msg, "update jobs"));
    rows[N - 1].error = NULL;
    px_assert_ok(st.ops->update_jobs(st.self, rows, N, &err), &err);
    px_assert_ok(st.ops->put_explanations(st.self, ex, N, &err), &err);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM jobs WHERE state = 'assigned'"), 0);
    px_assert_ok(st.ops->batch_end(st.self, &err), &err);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM jobs WHERE state = 'assigned'"), N);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM members WHERE node LIKE 'n%'"), N);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM explanations"), N);
    /* Outside a batch too: one refused explanation, none stored. */
    ex[0].json = "{\"decision\": \"\xff\"}";
    ex[1].attempt = 2;
    assert_int_equal(st.ops->put_explanations(st.self, ex, 2, &err), PX_EIO);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM explanations WHERE attempt = 2"), 0);
    for (int i = 0; i < N; i++)
        free(rows[i].id);
    st.ops->close(st.self);
    free(uri);
}

/* A temporary file holding n bytes of a pattern (n may be 0); its digest
 * in hex.  The file is unlinked: only the descriptor remains. */
static int pattern_file(size_t n, char hex[65])
{
    char path[] = "/tmp/px-blob-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    px_sha256_ctx *h;
    px_err err;
    px_assert_ok(px_sha256_new(&h, &err), &err);
    char buf[4096];
    for (size_t done = 0; done < n;) {
        size_t k = PX_MIN(sizeof buf, n - done);
        for (size_t i = 0; i < k; i++)
            buf[i] = (char)((done + i) * 2654435761u >> 13);
        px_sha256_update(h, buf, k);
        assert_int_equal(write(fd, buf, k), (ssize_t)k);
        done += k;
    }
    px_digest d;
    px_sha256_final(h, &d);
    px_digest_hex(&d, hex);
    return fd;
}

/* Whether the file behind fd holds what pattern_file(n) wrote. */
static bool same_bytes(int a, int b, size_t n)
{
    char x[4096], y[4096];
    for (size_t at = 0; at < n;) {
        size_t k = PX_MIN(sizeof x, n - at);
        if (pread(a, x, k, (off_t)at) != (ssize_t)k || pread(b, y, k, (off_t)at) != (ssize_t)k ||
            memcmp(x, y, k) != 0)
            return false;
        at += k;
    }
    char extra;
    return pread(b, &extra, 1, (off_t)n) == 0;
}

static int empty_file(void)
{
    char path[] = "/tmp/px-blob-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    return fd;
}

static void test_pg_blobs_in_chunks_checked_both_ways(void **state)
{
    (void)state;
    char *uri = fresh("blobs");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    /* Two chunks and a bit, stored once however often it is put. */
    size_t n = (5u << 19) + 3;
    char hex[65];
    int src = pattern_file(n, hex);
    px_assert_ok(st.ops->put_blob(st.self, hex, src, (int64_t)n, &err), &err);
    px_assert_ok(st.ops->put_blob(st.self, hex, src, (int64_t)n, &err), &err);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM blobs"), 1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM blob_chunks"), 3);
    int dst = empty_file();
    int64_t size = -1;
    px_assert_ok(st.ops->get_blob(st.self, hex, dst, &size, &err), &err);
    assert_int_equal(size, (int64_t)n);
    assert_true(same_bytes(src, dst, n));
    close(dst);
    /* An empty blob is a blob. */
    char empty_hex[65];
    int e = pattern_file(0, empty_hex);
    px_assert_ok(st.ops->put_blob(st.self, empty_hex, e, 0, &err), &err);
    dst = empty_file();
    px_assert_ok(st.ops->get_blob(st.self, empty_hex, dst, &size, &err), &err);
    assert_int_equal(size, 0);
    close(dst);
    close(e);
    /* None of that name. */
    const char *none = "0000000000000000000000000000000000000000000000000000000000000000";
    dst = empty_file();
    assert_int_equal(st.ops->get_blob(st.self, none, dst, &size, &err), PX_ENOTFOUND);
    /* Bytes that are not those of the name are refused, and nothing is
     * kept of them. */
    assert_int_equal(st.ops->put_blob(st.self, none, src, (int64_t)n, &err), PX_EIO);
    assert_non_null(strstr(err.msg, "upload it again"));
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM blobs"), 2);
    /* A file shorter than it says. */
    assert_int_equal(st.ops->put_blob(st.self, none, src, (int64_t)n + 10, &err), PX_EIO);
    assert_non_null(strstr(err.msg, "shorter"));
    /* A chunk damaged in the database: the read says so, the blob is
     * removed, and the next upload stores it afresh. */
    PGconn *c = PQconnectdb(uri);
    PGresult *r = PQexec(c, "UPDATE blob_chunks SET data = set_byte(data, 100, "
                            "(get_byte(data, 100) + 1) % 256) WHERE n = 1");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    PQfinish(c);
    assert_int_equal(st.ops->get_blob(st.self, hex, dst, &size, &err), PX_EIO);
    assert_non_null(strstr(err.msg, "damaged"));
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM blob_chunks WHERE n = 1"), 0);
    px_assert_ok(st.ops->put_blob(st.self, hex, src, (int64_t)n, &err), &err);
    close(dst);
    dst = empty_file();
    px_assert_ok(st.ops->get_blob(st.self, hex, dst, &size, &err), &err);
    assert_true(same_bytes(src, dst, n));
    /* A chunk gone missing. */
    assert_int_equal(query_int(uri, "WITH d AS (DELETE FROM blob_chunks WHERE n = 2 RETURNING 1) "
                                    "SELECT COUNT(*) FROM d"),
                     1);
    close(dst);
    dst = empty_file();
    assert_int_equal(st.ops->get_blob(st.self, hex, dst, &size, &err), PX_EIO);
    assert_non_null(strstr(err.msg, "missing"));
    close(dst);
    close(src);
    st.ops->close(st.self);
    free(uri);
}

static void test_pg_artifact_bytes_kept_apart_from_blobs(void **state)
{
    (void)state;
    char *uri = fresh("artifact_bytes");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    assert_true(st.ops->version >= 10);
    size_t n = (3u << 19) + 11;
    char hex[65];
    int src = pattern_file(n, hex);
    px_assert_ok(st.ops->put_artifact_data(st.self, hex, src, (int64_t)n, &err), &err);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM blobs WHERE digest LIKE 'artifact/%'"),
                     1);
    assert_int_equal(
        query_int(uri, "SELECT COUNT(*) FROM blob_chunks WHERE digest LIKE 'artifact/%'"), 2);
    /* An artifact's bytes are never served as a blob, nor a blob's as an
     * artifact. */
    int dst = empty_file();
    int64_t size = -1;
    assert_int_equal(st.ops->get_blob(st.self, hex, dst, &size, &err), PX_ENOTFOUND);
    char other[65];
    int b = pattern_file(1000, other);
    px_assert_ok(st.ops->put_blob(st.self, other, b, 1000, &err), &err);
    assert_int_equal(st.ops->get_artifact_data(st.self, other, dst, &size, &err), PX_ENOTFOUND);
    assert_non_null(strstr(err.msg, "no artifact"));
    px_assert_ok(st.ops->get_artifact_data(st.self, hex, dst, &size, &err), &err);
    assert_int_equal(size, (int64_t)n);
    assert_true(same_bytes(src, dst, n));
    close(dst);
    /* Bytes that are not those of the digest are refused. */
    assert_int_equal(st.ops->put_artifact_data(st.self, other, src, (int64_t)n, &err), PX_EIO);
    assert_non_null(strstr(err.msg, "artifact"));
    /* Damaged in the database: refused on the way out, and removed. */
    assert_int_equal(query_int(uri, "WITH u AS (UPDATE blob_chunks SET data = set_byte(data, 7,"
                                    " (get_byte(data, 7) + 1) % 256) WHERE digest LIKE"
                                    " 'artifact/%' AND n = 0 RETURNING 1) SELECT COUNT(*) FROM u"),
                     1);
    dst = empty_file();
    assert_int_equal(st.ops->get_artifact_data(st.self, hex, dst, &size, &err), PX_EIO);
    assert_non_null(strstr(err.msg, "artifact"));
    assert_non_null(strstr(err.msg, "damaged"));
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM blobs WHERE digest LIKE 'artifact/%'"),
                     0);
    close(dst);
    close(b);
    close(src);
    st.ops->close(st.self);
    free(uri);
}

/* The rows of artifacts' bytes stored (or stored again) under a digest. */
static long long artifact_rows(const char *uri, const char *hex, const char *table)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM %s WHERE digest = 'artifact/%s'", table, hex);
    return query_int(uri, sql);
}

/* Dates every artifact's bytes back by `by` seconds, as if stored then. */
static void age_artifacts(const char *uri, int by)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "WITH u AS (UPDATE blobs SET created = created - %d WHERE digest LIKE 'artifact/%%'"
             " RETURNING 1) SELECT COUNT(*) FROM u",
             by);
    assert_true(query_int(uri, sql) >= 1);
}

/* Bytes whose artifact row never came (the upload refused after its bytes
 * were stored, or cut off) are removed once older than the grace period;
 * bytes a row names, an upload in flight (stored within the grace period),
 * users' blobs, and bytes an upload found stored and so dated again, stay.
 * The clock is the caller's `before`, and the rows are dated back. */
static void test_pg_collects_artifact_bytes_no_row_names(void **state)
{
    (void)state;
    char *uri = fresh("artifact_collect");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    assert_true(st.ops->version >= 13);
    assert_non_null(st.ops->collect_artifact_data);
    char refused[65], named[65], again[65], live[65], blob[65];
    size_t n_refused = (5u << 19) + 3; /* three chunks */
    int f_refused = pattern_file(n_refused, refused);
    int f_named = pattern_file(1000, named);
    int f_again = pattern_file(2000, again);
    int f_live = pattern_file(3000, live);
    int f_blob = pattern_file(4000, blob);
    px_assert_ok(st.ops->put_artifact_data(st.self, refused, f_refused, (int64_t)n_refused, &err),
                 &err);
    px_assert_ok(st.ops->put_artifact_data(st.self, named, f_named, 1000, &err), &err);
    px__artifact_row a = {"j-1", "out/named.bin", named, 1000, 0, 1, px_wall_time()};
    px_assert_ok(st.ops->put_artifact(st.self, &a, &err), &err);
    px_assert_ok(st.ops->put_artifact_data(st.self, again, f_again, 2000, &err), &err);
    px_assert_ok(st.ops->put_blob(st.self, blob, f_blob, 4000, &err), &err);
    assert_int_equal(query_int(uri, "WITH u AS (UPDATE blobs SET created = created - 7200"
                                    " RETURNING 1) SELECT COUNT(*) FROM u"),
                     4);
    assert_int_equal(artifact_rows(uri, refused, "blob_chunks"), 3);
    /* An upload that finds its bytes stored dates them again; another is
     * in flight (stored, its row not yet written). */
    px_assert_ok(st.ops->put_artifact_data(st.self, again, f_again, 2000, &err), &err);
    px_assert_ok(st.ops->put_artifact_data(st.self, live, f_live, 3000, &err), &err);

    int64_t now = px_wall_time(), removed = -1, bytes = -1;
    px_assert_ok(st.ops->collect_artifact_data(st.self, now - 3600, 100, &removed, &bytes, &err),
                 &err);
    assert_int_equal(removed, 1);
    assert_int_equal(bytes, (int64_t)n_refused);
    assert_int_equal(artifact_rows(uri, refused, "blobs"), 0);
    assert_int_equal(artifact_rows(uri, refused, "blob_chunks"), 0);
    assert_int_equal(artifact_rows(uri, named, "blobs"), 1);
    assert_int_equal(artifact_rows(uri, again, "blobs"), 1);
    assert_int_equal(artifact_rows(uri, live, "blob_chunks"), 1);
    assert_int_equal(
        query_int(uri, "SELECT COUNT(*) FROM blobs WHERE digest NOT LIKE 'artifact/%'"), 1);
    int dst = empty_file();
    int64_t size = -1;
    px_assert_ok(st.ops->get_artifact_data(st.self, live, dst, &size, &err), &err);
    assert_int_equal(size, 3000);
    assert_true(same_bytes(f_live, dst, 3000));
    close(dst);
    /* Nothing more to take at that date. */
    px_assert_ok(st.ops->collect_artifact_data(st.self, now - 3600, 100, &removed, &bytes, &err),
                 &err);
    assert_int_equal(removed, 0);
    assert_int_equal(bytes, 0);
    /* Past the grace period of the others, at most max at a time, the
     * oldest first; the bytes a row names stay whatever their age. */
    age_artifacts(uri, 7200);
    assert_int_equal(query_int(uri, "WITH u AS (UPDATE blobs SET created = created - 10 WHERE"
                                    " digest LIKE 'artifact/%' AND size = 2000 RETURNING 1)"
                                    " SELECT COUNT(*) FROM u"),
                     1);
    px_assert_ok(st.ops->collect_artifact_data(st.self, now - 3600, 1, &removed, &bytes, &err),
                 &err);
    assert_int_equal(removed, 1);
    assert_int_equal(bytes, 2000);
    assert_int_equal(artifact_rows(uri, again, "blobs"), 0);
    assert_int_equal(artifact_rows(uri, live, "blobs"), 1);
    px_assert_ok(st.ops->collect_artifact_data(st.self, now - 3600, 1, &removed, &bytes, &err),
                 &err);
    assert_int_equal(removed, 1);
    assert_int_equal(artifact_rows(uri, live, "blobs"), 0);
    assert_int_equal(artifact_rows(uri, named, "blobs"), 1);
    assert_int_equal(artifact_rows(uri, named, "blob_chunks"), 1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM blobs"), 2);
    /* Collected bytes uploaded again are stored afresh. */
    px_assert_ok(st.ops->put_artifact_data(st.self, refused, f_refused, (int64_t)n_refused, &err),
                 &err);
    assert_int_equal(artifact_rows(uri, refused, "blob_chunks"), 3);
    close(f_refused);
    close(f_named);
    close(f_again);
    close(f_live);
    close(f_blob);
    st.ops->close(st.self);
    free(uri);
}

/* Runs one statement (rows or none) through libpq directly. */
static void exec_sql(const char *uri, const char *sql)
{
    PGconn *c = PQconnectdb(uri);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PGresult *r = PQexec(c, sql);
    ExecStatusType t = PQresultStatus(r);
    if (t != PGRES_COMMAND_OK && t != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
}

/* Migration 9 on a database of version 8 that holds artifacts: the index
 * on artifacts.sha256 is made, the rows stay, and the collection's
 * statement looks its candidates up through it (its plan says so). */
static void test_pg_migration_9_indexes_artifacts_by_digest(void **state)
{
    (void)state;
    char *uri = fresh("artifact_index");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    st.ops->close(st.self);
    /* Back to version 8, as a database of the previous release. */
    exec_sql(uri, "DROP INDEX artifacts_sha256");
    exec_sql(uri, "DELETE FROM schema_version WHERE version = 9");
    assert_int_equal(query_int(uri, "SELECT MAX(version) FROM schema_version"), 8);
    exec_sql(uri, "INSERT INTO artifacts(job, name, size, sha256, rank, attempt, created)"
                  " SELECT 'j-' || i, 'out', 1, md5(i::text) || md5((i + 1)::text), 0, 1, 0"
                  " FROM generate_series(1, 20000) i");
    /* Bytes of five of them, and bytes no row names, all long stored. */
    exec_sql(uri, "INSERT INTO blobs(digest, size, chunks, created)"
                  " SELECT 'artifact/' || md5(i::text) || md5((i + 1)::text), 1, 0, 0"
                  " FROM generate_series(1, 5) i");
    exec_sql(uri, "INSERT INTO blobs(digest, size, chunks, created)"
                  " VALUES('artifact/' || repeat('ab', 32), 7, 0, 0)");
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM pg_indexes WHERE indexname ="
                                    " 'artifacts_sha256'"),
                     0);

    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    assert_int_equal(query_int(uri, "SELECT MAX(version) FROM schema_version"),
                     px__store_pg_schema_version());
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM pg_indexes WHERE tablename ="
                                    " 'artifacts' AND indexname = 'artifacts_sha256'"),
                     1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM artifacts"), 20000);
    exec_sql(uri, "ANALYZE artifacts");
    exec_sql(uri, "ANALYZE blobs");
    PGconn *c = PQconnectdb(uri);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    char now[24];
    snprintf(now, sizeof now, "%lld", (long long)px_wall_time());
    const char *v[] = {now, "256"};
    PGresult *r =
        PQexecParams(c, "EXPLAIN (COSTS OFF) " PX__PG_COLLECT_ARTIFACTS, 2, NULL, v, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    px_strbuf plan = PX_STRBUF_INIT;
    for (int i = 0; i < PQntuples(r); i++) {
        px_strbuf_adds(&plan, PQgetvalue(r, i, 0));
        px_strbuf_adds(&plan, "\n");
    }
    PQclear(r);
    PQfinish(c);
    if (!strstr(plan.buf, "artifacts_sha256"))
        fail_msg("the collection does not look artifacts up by their index:\n%s", plan.buf);
    assert_null(strstr(plan.buf, "Seq Scan on artifacts"));
    px_strbuf_release(&plan);
    /* And it still tells named bytes from the rest. */
    int64_t removed = -1, bytes = -1;
    px_assert_ok(
        st.ops->collect_artifact_data(st.self, px_wall_time() - 3600, 100, &removed, &bytes, &err),
        &err);
    assert_int_equal(removed, 1);
    assert_int_equal(bytes, 7);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM blobs"), 5);
    st.ops->close(st.self);
    free(uri);
}

/* A replica that does not schedule makes its lost connection again; the
 * new session has the store's settings, not the database's defaults
 * (here synchronous_commit off and every notice sent). */
static void test_pg_reconnect_keeps_the_session_settings(void **state)
{
    (void)state;
    char *uri = fresh("reconnect");
    if (!uri)
        skip();
    exec_sql(uri, "ALTER DATABASE reconnect SET synchronous_commit = off");
    exec_sql(uri, "ALTER DATABASE reconnect SET client_min_messages = debug1");
    assert_int_equal(query_int(uri, "SELECT (current_setting('synchronous_commit') = 'off')::int"),
                     1);
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    char value[64];
    px_assert_ok(px__store_pg_setting(st.self, "synchronous_commit", value, sizeof value, &err),
                 &err);
    assert_string_equal(value, "on");
    /* The store's one connection is ended from outside (waiting until its
     * backend is gone). */
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM pg_stat_activity WHERE datname ="
                                    " 'reconnect' AND backend_type = 'client backend' AND"
                                    " pid <> pg_backend_pid()"),
                     1);
    assert_int_equal(query_int(uri, "SELECT pg_terminate_backend(pid, 10000)::int FROM"
                                    " pg_stat_activity WHERE datname = 'reconnect' AND"
                                    " backend_type = 'client backend' AND"
                                    " pid <> pg_backend_pid()"),
                     1);
    px__job_row got;
    assert_int_equal(st.ops->get_job(st.self, "j-000001", &got, &err), PX_EIO);
    /* The next statement connects again, configured. */
    px_assert_ok(px__store_pg_setting(st.self, "synchronous_commit", value, sizeof value, &err),
                 &err);
    assert_string_equal(value, "on");
    px_assert_ok(px__store_pg_setting(st.self, "client_min_messages", value, sizeof value, &err),
                 &err);
    assert_string_equal(value, "warning");
    assert_int_equal(st.ops->get_job(st.self, "j-000001", &got, &err), PX_ENOTFOUND);
    st.ops->close(st.self);
    free(uri);
}

static void collect_name(const char *name, void *ud)
{
    char *out = ud;
    size_t n = strlen(out);
    snprintf(out + n, 256 - n, "%s;", name);
}

static void test_pg_cancel_requests_taken_once(void **state)
{
    (void)state;
    char *uri = fresh("cancels");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    px_assert_ok(st.ops->request_cancel(st.self, "j-000007", &err), &err);
    px_assert_ok(st.ops->request_cancel(st.self, "j-000007", &err), &err);
    px_assert_ok(st.ops->request_cancel(st.self, "j-000009", &err), &err);
    char got[256] = "";
    px_assert_ok(st.ops->take_cancels(st.self, 1, collect_name, got, &err), &err);
    assert_string_equal(got, "j-000007;");
    px_assert_ok(st.ops->take_cancels(st.self, 10, collect_name, got, &err), &err);
    assert_string_equal(got, "j-000007;j-000009;");
    px_assert_ok(st.ops->take_cancels(st.self, 10, collect_name, got, &err), &err);
    assert_string_equal(got, "j-000007;j-000009;");
    st.ops->close(st.self);
    free(uri);
}

/* Statements are prepared once per session as a pipeline first sends
 * them; one whose preparation the database skipped (after an earlier
 * statement failed) is prepared again next time. */
static void test_pg_statements_prepared_again_after_a_failed_pipeline(void **state)
{
    (void)state;
    char *uri = fresh("prepared");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    px__job_row rows[2];
    for (int i = 0; i < 2; i++) {
        rows[i] = (px__job_row){
            .state = "queued", .attempt = 1, .spec = "{}", .members = "[]", .exit_code = INT_MIN};
        px_assert_ok(st.ops->insert_job(st.self, &rows[i], &err), &err);
    }
    /* The first row fails before the members' statement is first sent. */
    rows[0].error = "\xff";
    rows[1].state = "assigned";
    rows[1].members = "[{\"node\":\"n1\",\"devices\":[],\"state\":\"assigned\"}]";
    assert_int_equal(st.ops->update_jobs(st.self, rows, 2, &err), PX_EIO);
    rows[0].error = NULL;
    px_assert_ok(st.ops->update_jobs(st.self, rows, 2, &err), &err);
    px_assert_ok(st.ops->update_jobs(st.self, rows, 2, &err), &err);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM members WHERE node = 'n1'"), 1);
    for (int i = 0; i < 2; i++)
        free(rows[i].id);
    st.ops->close(st.self);
    free(uri);
}

typedef struct changes_seen {
    char text[512];
    int64_t last;
} changes_seen;

static void change_seen(const px__node_change *c, void *ud)
{
    changes_seen *x = ud;
    size_t n = strlen(x->text);
    snprintf(x->text + n, sizeof x->text - n, "%s:%s:%s;", c->name, c->kind,
             c->registered ? "reg" : "-");
    assert_true(c->change > x->last);
    x->last = c->change;
}

static void report_seen(const char *node, const char *job, const char *kind, const char *body,
                        void *ud)
{
    (void)body;
    char *out = ud;
    size_t n = strlen(out);
    snprintf(out + n, 256 - n, "%s/%s/%s;", node, job, kind);
}

/* Agents through any replica: a credential found by its hash (not once
 * revoked), calls of unregistered nodes refused, only changes above the
 * reader's mark handed over and in order, a poll keeping the last
 * registration's body, assignments written with the members and read per
 * node, the stop list from the rows, members' reports taken once in
 * order, and the scheduler's URL. */
static void test_pg_nodes_through_any_replica(void **state)
{
    (void)state;
    char *uri = fresh("nodecalls");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    assert_true(px__store_serves_agents(&st));
    char name[65] = "";
    const char *hash = "ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01";
    assert_int_equal(st.ops->node_of_credential(st.self, hash, name, &err), PX_ENOTFOUND);
    px_assert_ok(st.ops->put_credential(st.self, "n1", hash, &err), &err);
    px_assert_ok(st.ops->node_of_credential(st.self, hash, name, &err), &err);
    assert_string_equal(name, "n1");
    px_assert_ok(st.ops->set_revoked(st.self, "n1", true, &err), &err);
    assert_int_equal(st.ops->node_of_credential(st.self, hash, name, &err), PX_ENOTFOUND);

    int64_t mark = -1;
    px_assert_ok(st.ops->node_mark(st.self, &mark, &err), &err);
    assert_int_equal(mark, 0);
    assert_int_equal(st.ops->note_node(st.self, "n1", "heartbeat", "{}", &err), PX_ENOTFOUND);
    assert_int_equal(st.ops->note_node(st.self, "n1", "register", "[1", &err), PX_EINVAL);
    px_assert_ok(st.ops->note_node(st.self, "n1", "register",
                                   "{\"name\":\"n1\",\"running\":[{\"job\":\"j-000001\"}]}", &err),
                 &err);
    px_assert_ok(st.ops->note_node(st.self, "n2", "register", "{\"name\":\"n2\"}", &err), &err);
    px_assert_ok(st.ops->note_node(st.self, "n1", "poll", NULL, &err), &err);
    /* The registration is kept without its running list; the poll kept
     * the registration's body. */
    assert_int_equal(
        query_int(uri, "SELECT COUNT(*) FROM nodes WHERE name = 'n1' AND registration NOT LIKE "
                       "'%running%' AND call_body LIKE '%running%' AND state = 'online'"),
        1);
    changes_seen x = {"", mark};
    px_assert_ok(st.ops->changed_nodes(st.self, mark, 100, change_seen, &x, &err), &err);
    assert_string_equal(x.text, "n2:register:reg;n1:register:reg;");
    /* Only what changed since. */
    int64_t seen = x.last;
    px_assert_ok(st.ops->note_node(st.self, "n2", "heartbeat", "{\"live\":{}}", &err), &err);
    x = (changes_seen){"", seen};
    px_assert_ok(st.ops->changed_nodes(st.self, seen, 100, change_seen, &x, &err), &err);
    assert_string_equal(x.text, "n2:heartbeat:-;");
    x = (changes_seen){"", x.last};
    px_assert_ok(st.ops->changed_nodes(st.self, x.last, 100, change_seen, &x, &err), &err);
    assert_string_equal(x.text, "");

    /* Assignments go with the members and are read by node. */
    px__job_row row = {
        .state = "queued", .attempt = 1, .spec = "{}", .members = "[]", .exit_code = INT_MIN};
    px_assert_ok(st.ops->insert_job(st.self, &row, &err), &err);
    row.state = "assigned";
    row.members = "[{\"node\":\"n1\",\"devices\":[],\"state\":\"assigned\"},"
                  "{\"node\":\"n2\",\"devices\":[],\"state\":\"running\"}]";
    row.assignments = "[{\"job\":\"j-000001\",\"rank\":0},null]";
    px_assert_ok(st.ops->update_jobs(st.self, &row, 1, &err), &err);
    row.assignments = NULL;
    char got[256] = "";
    px_assert_ok(st.ops->node_assignments(st.self, "n1", collect_name, got, &err), &err);
    assert_string_equal(got, "{\"job\":\"j-000001\",\"rank\":0};");
    got[0] = '\0';
    px_assert_ok(st.ops->node_assignments(st.self, "n2", collect_name, got, &err), &err);
    assert_string_equal(got, "");
    char *stop = NULL;
    px_assert_ok(st.ops->node_stops(st.self, "n1",
                                    "[{\"job\":\"j-000001\",\"attempt\":1,\"rank\":0},"
                                    "{\"job\":\"j-000001\",\"attempt\":2,\"rank\":0},"
                                    "{\"job\":\"j-000001\",\"attempt\":1,\"rank\":1},"
                                    "{\"job\":\"j-000404\",\"attempt\":1,\"rank\":0}]",
                                    &stop, &err),
                 &err);
    /* The other attempt, the other rank and the unknown job; not the
     * node's current work. */
    json_t *arr = json_loads(stop, 0, NULL);
    assert_int_equal(json_array_size(arr), 3);
    char seen_stops[256] = "";
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *e = json_array_get(arr, i);
        size_t n = strlen(seen_stops);
        snprintf(seen_stops + n, sizeof seen_stops - n, "%s/%lld/%lld;",
                 json_string_value(json_object_get(e, "job")),
                 (long long)json_integer_value(json_object_get(e, "attempt")),
                 (long long)json_integer_value(json_object_get(e, "rank")));
    }
    assert_string_equal(seen_stops, "j-000001/2/0;j-000001/1/1;j-000404/1/0;");
    json_decref(arr);
    free(stop);
    /* Once a job is requeued its member is no longer waiting anywhere. */
    row.state = "queued";
    row.members = "[]";
    px_assert_ok(st.ops->update_job(st.self, &row, NULL, &err), &err);
    px_assert_ok(st.ops->node_assignments(st.self, "n1", collect_name, got, &err), &err);
    assert_string_equal(got, "");
    free(row.id);

    /* Reports: taken once, in the order they came. */
    px_assert_ok(st.ops->put_member_report(st.self, "n1", "j-000001", "start", "{}", &err), &err);
    px_assert_ok(st.ops->put_member_report(st.self, "n1", "j-000001", "finish", "{}", &err), &err);
    px_assert_ok(st.ops->take_member_reports(st.self, 10, report_seen, got, &err), &err);
    assert_string_equal(got, "n1/j-000001/start;n1/j-000001/finish;");
    px_assert_ok(st.ops->take_member_reports(st.self, 10, report_seen, got, &err), &err);
    assert_string_equal(got, "n1/j-000001/start;n1/j-000001/finish;");

    char url[256] = "x";
    px_assert_ok(st.ops->get_holder(st.self, url, &err), &err);
    assert_string_equal(url, "");
    px_assert_ok(st.ops->set_holder(st.self, "https://sched-1:7070", &err), &err);
    px_assert_ok(st.ops->get_holder(st.self, url, &err), &err);
    assert_string_equal(url, "https://sched-1:7070");
    st.ops->close(st.self);
    free(uri);
}

/* A fenced write held between its last statement and its commit (the
 * store's test hook): the thread writing signals, and waits for the test
 * to let it commit. */
typedef struct fence_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool in_flight, go;
} fence_gate;

static void fence_hold(void *ud)
{
    fence_gate *g = ud;
    pthread_mutex_lock(&g->mu);
    g->in_flight = true;
    pthread_cond_broadcast(&g->cv);
    while (!g->go)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

typedef struct fenced_call {
    px__store *st;
    int64_t epoch;
    px__job_row *row;
    px_status rc;
    px_err err;
} fenced_call;

static void *fenced_write(void *ud)
{
    fenced_call *c = ud;
    c->rc = c->st->ops->fenced_update_jobs(c->st->self, c->epoch, c->row, 1, &c->err);
    return NULL;
}

typedef struct lease_call {
    px__store *st;
    bool held;
    px_status rc;
    px_err err;
} lease_call;

static void *take_lease(void *ud)
{
    lease_call *c = ud;
    for (int i = 0; i < 300 && !c->held; i++) {
        c->rc = c->st->ops->lease(c->st->self, &c->held, &c->err);
        if (c->rc != PX_OK)
            return NULL;
        if (!c->held)
            usleep(20000);
    }
    return NULL;
}

static void test_pg_lease_epoch_fences_writes_on_another_connection(void **state)
{
    (void)state;
    char *uri = fresh("epoch");
    if (!uri)
        skip();
    px__store a, b;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &a, &err), &err);
    px_assert_ok(px__store_pg_open(uri, &b, &err), &err);
    assert_true(a.ops->version >= 12 && a.ops->lease_epoch && a.ops->fenced_update_jobs);
    int64_t ea = -1, eb = -1;
    px_assert_ok(a.ops->lease_epoch(a.self, &ea, &err), &err);
    assert_int_equal(ea, 0); /* no lease, no epoch */
    bool held = false;
    px_assert_ok(a.ops->lease(a.self, &held, &err), &err);
    assert_true(held);
    px_assert_ok(a.ops->lease_epoch(a.self, &ea, &err), &err);
    assert_int_equal(ea, 1);
    px_assert_ok(a.ops->lease(a.self, &held, &err), &err); /* kept: the same epoch */
    px_assert_ok(a.ops->lease_epoch(a.self, &ea, &err), &err);
    assert_int_equal(ea, 1);
    px_assert_ok(b.ops->lease(b.self, &held, &err), &err);
    assert_false(held);
    px_assert_ok(b.ops->lease_epoch(b.self, &eb, &err), &err);
    assert_int_equal(eb, 0);

    px__job_row row = {.name = "f",
                       .state = "queued",
                       .attempt = 1,
                       .spec = "{}",
                       .members = "[]",
                       .exit_code = INT_MIN};
    px_assert_ok(a.ops->insert_job(a.self, &row, &err), &err);
    /* The holder's fenced write commits on its second connection. */
    row.state = "assigned";
    row.members = "[{\"node\":\"n1\",\"devices\":[],\"state\":\"assigned\"}]";
    px_assert_ok(a.ops->fenced_update_jobs(a.self, ea, &row, 1, &err), &err);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM members WHERE node = 'n1'"), 1);

    /* A takeover while a fenced write is in flight: the holder's lease
     * session dies, the standby's increment waits for the write's commit,
     * and the new holder then sees what it committed. */
    fence_gate g = {.in_flight = false, .go = false};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    px__store_pg_set_fence_hook(fence_hold, &g);
    row.attempt = 2;
    row.members = "[{\"node\":\"n2\",\"devices\":[],\"state\":\"assigned\"}]";
    fenced_call fc = {.st = &a, .epoch = ea, .row = &row};
    pthread_t tw, tl;
    assert_int_equal(pthread_create(&tw, NULL, fenced_write, &fc), 0);
    pthread_mutex_lock(&g.mu);
    while (!g.in_flight)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    px__store_pg_set_fence_hook(NULL, NULL);
    assert_int_equal(query_int(uri, "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_locks"
                                    " WHERE locktype = 'advisory' AND classid = 1886152056"
                                    " AND objid = 1 AND granted"),
                     1);
    lease_call lc = {.st = &b};
    assert_int_equal(pthread_create(&tl, NULL, take_lease, &lc), 0);
    /* The standby has the advisory lock and waits on the epoch's row. */
    long long waiting = 0;
    for (int i = 0; i < 1500 && !waiting; i++) {
        waiting = query_int(uri, "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type ="
                                 " 'Lock' AND query LIKE 'UPDATE lease%'");
        if (!waiting)
            usleep(20000);
    }
    assert_int_equal(waiting, 1);
    assert_int_equal(query_int(uri, "SELECT epoch FROM lease"), 1);
    pthread_mutex_lock(&g.mu);
    g.go = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(tw, NULL);
    px_assert_ok(fc.rc, &fc.err);
    pthread_join(tl, NULL);
    px_assert_ok(lc.rc, &lc.err);
    assert_true(lc.held);
    px_assert_ok(b.ops->lease_epoch(b.self, &eb, &err), &err);
    assert_int_equal(eb, 2);
    px__job_row seen = {0};
    px_assert_ok(b.ops->get_job(b.self, row.id, &seen, &err), &err);
    assert_int_equal(seen.attempt, 2);
    px__job_row_release(&seen);

    /* After the takeover the old holder's fenced writes are refused and
     * change nothing; the new holder's go through. */
    row.attempt = 3;
    row.members = "[{\"node\":\"n3\",\"devices\":[],\"state\":\"assigned\"}]";
    assert_int_equal(a.ops->fenced_update_jobs(a.self, ea, &row, 1, &err), PX_ESTATE);
    assert_non_null(strstr(err.msg, "epoch 2"));
    assert_non_null(strstr(err.msg, "another replica has taken over"));
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM members WHERE node = 'n3'"), 0);
    assert_int_equal(query_int(uri, "SELECT attempt FROM jobs"), 2);
    px_assert_ok(b.ops->fenced_update_jobs(b.self, eb, &row, 1, &err), &err);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM members WHERE node = 'n3'"), 1);
    /* A connection of fenced writes that was lost is made again. */
    assert_int_equal(query_int(uri, "SELECT COUNT(pg_terminate_backend(pid)) FROM"
                                    " pg_stat_activity WHERE query LIKE 'COMMIT%'"
                                    " AND datname = current_database()"
                                    " AND pid <> pg_backend_pid()"),
                     1);
    row.attempt = 4;
    px__job_row *rows = &row;
    assert_int_equal(b.ops->fenced_update_jobs(b.self, eb, rows, 1, &err), PX_EIO);
    px_assert_ok(b.ops->fenced_update_jobs(b.self, eb, rows, 1, &err), &err);
    assert_int_equal(query_int(uri, "SELECT attempt FROM jobs"), 4);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
    a.ops->close(a.self);
    b.ops->close(b.self);
    free(row.id);
    free(uri);
}

static void count_report(const char *node, const char *job, const char *kind, const char *body,
                         void *ud)
{
    (void)node, (void)job, (void)kind, (void)body;
    (*(int *)ud)++;
}

/* The fault-injecting wrapper (store_fault.c) passes every slot of the
 * store under through, at its version: while the flag is up each write
 * of the newer slots is refused as a full disk would, changing nothing,
 * and each read still answers. */
static void test_pg_faults_reach_every_slot(void **state)
{
    (void)state;
    char *uri = fresh("faults");
    if (!uri)
        skip();
    px__store st;
    px_err err;
    px_assert_ok(px__store_pg_open(uri, &st, &err), &err);
    atomic_int full = 0;
    px__store_fail_flag = &full;
    px_assert_ok(px__store_wrap_faults(&st, &err), &err);
    px__store_fail_flag = NULL;
    assert_true(st.ops->version >= 13);
    assert_non_null(st.ops->lease);
    assert_non_null(st.ops->wait_jobs);
    assert_non_null(st.ops->put_blob);
    assert_non_null(st.ops->take_cancels);
    assert_non_null(st.ops->get_artifact_data);
    assert_non_null(st.ops->node_of_credential);
    assert_non_null(st.ops->get_holder);
    assert_non_null(st.ops->collect_artifact_data);
    assert_non_null(st.ops->append_log_quota);
    assert_non_null(st.ops->lease_epoch);
    assert_non_null(st.ops->fenced_update_jobs);
    char hex[65], other[65], url[256];
    int fd = pattern_file(5000, hex), fd_other = pattern_file(6000, other);
    px_assert_ok(st.ops->put_blob(st.self, hex, fd, 5000, &err), &err);
    px_assert_ok(st.ops->put_artifact_data(st.self, hex, fd, 5000, &err), &err);
    px_assert_ok(st.ops->set_holder(st.self, "https://sched-1:7070", &err), &err);
    px_assert_ok(st.ops->request_cancel(st.self, "j-1", &err), &err);
    px_assert_ok(st.ops->note_node(st.self, "n1", "register", "{\"name\":\"n1\"}", &err), &err);
    px_assert_ok(st.ops->put_member_report(st.self, "n1", "j-1", "start", "{}", &err), &err);

    atomic_store(&full, 1);
    int64_t removed = -1, bytes = -1;
    px_status refused[] = {
        st.ops->put_blob(st.self, other, fd_other, 6000, &err),
        st.ops->put_artifact_data(st.self, other, fd_other, 6000, &err),
        st.ops->request_cancel(st.self, "j-2", &err),
        st.ops->take_cancels(st.self, 10, count_name, &(int){0}, &err),
        st.ops->note_node(st.self, "n1", "poll", NULL, &err),
        st.ops->put_member_report(st.self, "n1", "j-1", "finish", "{}", &err),
        st.ops->take_member_reports(st.self, 10, count_report, &(int){0}, &err),
        st.ops->set_holder(st.self, "https://sched-2:7070", &err),
        st.ops->collect_artifact_data(st.self, px_wall_time() + 10, 10, &removed, &bytes, &err),
        st.ops->append_log_quota(st.self, "j-1", 1, 0, "stdout", "out", 3, 100, "[quota]",
                                 &(size_t){0}, &(bool){0}, &(int64_t){0}, &err),
        st.ops->fenced_update_jobs(st.self, 1, NULL, 0, &err),
    };
    for (size_t i = 0; i < PX_ARRAY_LEN(refused); i++) {
        print_message("write %zu\n", i);
        assert_int_equal(refused[i], PX_EIO);
    }
    assert_non_null(strstr(err.msg, "disk is full"));
    assert_int_equal(removed, 0);
    /* Reads answer as ever. */
    int dst = empty_file();
    int64_t size = -1;
    px_assert_ok(st.ops->get_blob(st.self, hex, dst, &size, &err), &err);
    assert_int_equal(size, 5000);
    px_assert_ok(st.ops->get_artifact_data(st.self, hex, dst, &size, &err), &err);
    close(dst);
    px_assert_ok(st.ops->get_holder(st.self, url, &err), &err);
    assert_string_equal(url, "https://sched-1:7070");
    int64_t epoch = -1;
    px_assert_ok(st.ops->lease_epoch(st.self, &epoch, &err), &err);
    assert_int_equal(epoch, 0); /* no lease held */
    char name[72];
    assert_int_equal(st.ops->node_of_credential(st.self, "00", name, &err), PX_ENOTFOUND);
    int64_t mark = -1;
    px_assert_ok(st.ops->node_mark(st.self, &mark, &err), &err);
    assert_true(mark >= 1);
    int n = 0;
    px_assert_ok(st.ops->node_assignments(st.self, "n1", count_name, &n, &err), &err);
    assert_int_equal(n, 0);
    char *stops = NULL;
    px_assert_ok(st.ops->node_stops(st.self, "n1", "[]", &stops, &err), &err);
    assert_string_equal(stops, "[]");
    free(stops);

    /* Nothing refused was done: what was there is handed over once the
     * store takes writes again, and nothing more. */
    atomic_store(&full, 0);
    n = 0;
    px_assert_ok(st.ops->take_cancels(st.self, 10, count_name, &n, &err), &err);
    assert_int_equal(n, 1);
    n = 0;
    px_assert_ok(st.ops->take_member_reports(st.self, 10, count_report, &n, &err), &err);
    assert_int_equal(n, 1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM blobs"), 2);
    px_assert_ok(
        st.ops->collect_artifact_data(st.self, px_wall_time() + 10, 10, &removed, &bytes, &err),
        &err);
    assert_int_equal(removed, 1);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM logs"), 0);
    close(fd);
    close(fd_other);
    st.ops->close(st.self);
    free(uri);
}

/* Writers of one job's output on two replicas at once, as agents sending
 * to a standby and to the scheduler would. */
typedef struct log_writer {
    px__store st;
    int chunks;
    size_t taken, cut;
    int failed;
} log_writer;

#define LOG_QUOTA 10500

static void *write_output(void *arg)
{
    log_writer *w = arg;
    char chunk[1000];
    memset(chunk, 'x', sizeof chunk);
    for (int i = 0; i < w->chunks; i++) {
        size_t taken = 0;
        bool cut = false;
        int64_t seq = 0;
        px_err err;
        if (w->st.ops->append_log_quota(w->st.self, "j-1", 1, 0, "stdout", chunk, sizeof chunk,
                                        LOG_QUOTA, "[quota]", &taken, &cut, &seq, &err) != PX_OK) {
            w->failed++;
            continue;
        }
        w->taken += taken;
        w->cut += cut;
    }
    return NULL;
}

/* A job's log quota is counted by the database under one lock per job, so
 * output sent through two replicas at once stops exactly at the quota,
 * with one note that says so; never a chunk more. */
static void test_pg_log_quota_exact_across_replicas(void **state)
{
    (void)state;
    char *uri = fresh("log_quota");
    if (!uri)
        skip();
    log_writer w[2] = {{.chunks = 12}, {.chunks = 12}};
    px_err err;
    for (int i = 0; i < 2; i++) {
        px_assert_ok(px__store_pg_open(uri, &w[i].st, &err), &err);
        assert_true(w[i].st.ops->version >= 13);
        assert_non_null(w[i].st.ops->append_log_quota);
    }
    /* A log already started counts. */
    int64_t seq = 0;
    px_assert_ok(
        w[0].st.ops->append_log(w[0].st.self, "j-1", 1, 0, "stdout", "hello\n", 6, &seq, &err),
        &err);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, write_output, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(w[0].failed + w[1].failed, 0);
    assert_int_equal(w[0].taken + w[1].taken, LOG_QUOTA - 6);
    /* 24 chunks of 1000 bytes for 10,494 bytes of room: ten stored whole,
     * the rest cut (one stored in part). */
    assert_int_equal(w[0].cut + w[1].cut, 24 - 10);
    assert_int_equal(query_int(uri, "SELECT SUM(length(data)) FROM logs WHERE stream = 'stdout'"),
                     LOG_QUOTA);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM logs WHERE stream = 'stderr'"), 1);
    assert_int_equal(query_int(uri, "SELECT COUNT(DISTINCT seq) FROM logs"),
                     query_int(uri, "SELECT COUNT(*) FROM logs"));
    /* Past the quota: nothing stored, no second note. */
    size_t taken = 9;
    bool cut = false;
    px_assert_ok(w[1].st.ops->append_log_quota(w[1].st.self, "j-1", 1, 0, "stdout", "more", 4,
                                               LOG_QUOTA, "[quota]", &taken, &cut, &seq, &err),
                 &err);
    assert_int_equal(taken, 0);
    assert_true(cut);
    assert_int_equal(seq, 0);
    assert_int_equal(query_int(uri, "SELECT COUNT(*) FROM logs WHERE stream = 'stderr'"), 1);
    /* Another job has a quota of its own. */
    px_assert_ok(w[1].st.ops->append_log_quota(w[1].st.self, "j-2", 1, 0, "stdout", "more", 4,
                                               LOG_QUOTA, "[quota]", &taken, &cut, &seq, &err),
                 &err);
    assert_int_equal(taken, 4);
    assert_false(cut);
    assert_int_equal(seq, 1);
    for (int i = 0; i < 2; i++)
        w[i].st.ops->close(w[i].st.self);
    free(uri);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pg_store_migrates_and_persists_jobs),
        cmocka_unit_test(test_pg_store_logs_artifacts_explanations_nodes),
        cmocka_unit_test(test_pg_store_owners_keys_and_credentials),
        cmocka_unit_test(test_pg_store_refuses_passwords_bad_uris_and_newer_schemas),
        cmocka_unit_test(test_pg_lease_one_holder_taken_over_and_jobs_claimed_once),
        cmocka_unit_test(test_pg_lease_epoch_fences_writes_on_another_connection),
        cmocka_unit_test(test_pg_batch_commits_together_and_survives_a_failed_write),
        cmocka_unit_test(test_pg_store_keeps_deployments_by_name),
        cmocka_unit_test(test_pg_many_jobs_and_explanations_in_one_call),
        cmocka_unit_test(test_pg_blobs_in_chunks_checked_both_ways),
        cmocka_unit_test(test_pg_artifact_bytes_kept_apart_from_blobs),
        cmocka_unit_test(test_pg_collects_artifact_bytes_no_row_names),
        cmocka_unit_test(test_pg_migration_9_indexes_artifacts_by_digest),
        cmocka_unit_test(test_pg_reconnect_keeps_the_session_settings),
        cmocka_unit_test(test_pg_cancel_requests_taken_once),
        cmocka_unit_test(test_pg_nodes_through_any_replica),
        cmocka_unit_test(test_pg_statements_prepared_again_after_a_failed_pipeline),
        cmocka_unit_test(test_pg_faults_reach_every_slot),
        cmocka_unit_test(test_pg_log_quota_exact_across_replicas),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
