/* The SQLite store: migrations, jobs with members and attempts, owners and
 * idempotency keys, log sequence numbers and usage, artifacts,
 * explanations, node credentials and revocations, nodes, deployments, files private
 * whatever the umask, and that what was written is there after the
 * database is closed and opened again. */
#include "px_test.h"

#include "fleet/fleet_impl.h"
#include "store_deploy_check.h"

#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>

static char *db_path(const char *name)
{
    return px_asprintf("%s/%s", px_test_tmpdir(), name);
}

static void count_job(const px__job_row *row, void *ud)
{
    (void)row;
    (*(int *)ud)++;
}

typedef struct logs_seen {
    int n;
    int64_t last;
    char text[256];
} logs_seen;

static void log_seen(const px__log_chunk *c, void *ud)
{
    logs_seen *s = ud;
    s->n++;
    s->last = c->seq;
    size_t have = strlen(s->text), n = PX_MIN(c->len, sizeof s->text - have - 1);
    memcpy(s->text + have, c->data, n);
    s->text[have + n] = '\0';
}

static int query_int(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    int v = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

static void test_store_migrates_and_persists_jobs(void **state)
{
    (void)state;
    char *path = db_path("jobs.db");
    px__store st;
    px_err err;
    px_assert_ok(px__store_sqlite_open(path, &st, &err), &err);
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
    /* Assign, then requeue with a new attempt. */
    row.state = "assigned";
    row.members = "[{\"node\":\"n1\",\"devices\":[\"gpu0\"],\"state\":\"assigned\"}]";
    px_assert_ok(st.ops->update_job(st.self, &row, NULL, &err), &err);
    row.attempt = 2;
    row.state = "queued";
    px_assert_ok(st.ops->update_job(st.self, &row, "node n1 lost", &err), &err);
    st.ops->close(st.self);

    assert_int_equal(query_int(path, "SELECT MAX(version) FROM schema_version"),
                     px__store_sqlite_schema_version());
    assert_int_equal(query_int(path, "SELECT COUNT(*) FROM attempts WHERE reason = 'node n1 lost'"),
                     1);
    assert_int_equal(query_int(path, "SELECT COUNT(*) FROM members WHERE node = 'n1'"), 1);

    /* Reopening applies no migration twice and finds the rows. */
    px_assert_ok(px__store_sqlite_open(path, &st, &err), &err);
    px__job_row got;
    px_assert_ok(st.ops->get_job(st.self, "j-000002", &got, &err), &err);
    assert_string_equal(got.state, "queued");
    assert_int_equal(got.attempt, 2);
    assert_int_equal(got.exit_code, INT_MIN);
    px__job_row_release(&got);
    assert_int_equal(st.ops->get_job(st.self, "j-999999", &got, &err), PX_ENOTFOUND);
    int n = 0;
    px_assert_ok(st.ops->list_jobs(st.self, "active", NULL, 100, count_job, &n, &err), &err);
    assert_int_equal(n, 2);
    n = 0;
    px_assert_ok(st.ops->list_jobs(st.self, "succeeded", NULL, 100, count_job, &n, &err), &err);
    assert_int_equal(n, 0);
    st.ops->close(st.self);
    assert_int_equal(query_int(path, "SELECT COUNT(*) FROM schema_version"),
                     px__store_sqlite_schema_version());
    free(first_id);
    free(row.id);
    free(path);
}

static void test_store_logs_artifacts_explanations_nodes(void **state)
{
    (void)state;
    char *path = db_path("misc.db");
    px__store st;
    px_err err;
    px_assert_ok(px__store_sqlite_open(path, &st, &err), &err);
    int64_t seq;
    px_assert_ok(st.ops->append_log(st.self, "j-1", 1, 0, "stdout", "hello ", 6, &seq, &err), &err);
    assert_int_equal(seq, 1);
    px_assert_ok(st.ops->append_log(st.self, "j-1", 1, 0, "stderr", "oops\n", 5, &seq, &err), &err);
    px_assert_ok(st.ops->append_log(st.self, "j-1", 1, 0, "stdout", "world", 5, &seq, &err), &err);
    assert_int_equal(seq, 3);
    px_assert_ok(st.ops->append_log(st.self, "j-2", 1, 0, "stdout", "x", 1, &seq, &err), &err);
    assert_int_equal(seq, 1); /* numbered per job */
    logs_seen s = {0};
    px_assert_ok(st.ops->read_logs(st.self, "j-1", 0, "stdout", SIZE_MAX, log_seen, &s, &err),
                 &err);
    assert_int_equal(s.n, 2);
    assert_string_equal(s.text, "hello world");
    memset(&s, 0, sizeof s);
    px_assert_ok(st.ops->read_logs(st.self, "j-1", 2, NULL, SIZE_MAX, log_seen, &s, &err), &err);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.last, 3);
    px__artifact_row a = {"j-1", "out/model.pt", "ab", 3, 0, 1, 5};
    px_assert_ok(st.ops->put_artifact(st.self, &a, &err), &err);
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
    st.ops->close(st.self);
    assert_int_equal(query_int(path, "SELECT COUNT(*) FROM nodes WHERE state = 'offline' AND "
                                     "registration LIKE '%n1%'"),
                     1);
    assert_int_equal(query_int(path, "SELECT COUNT(*) FROM artifacts"), 1);
    free(path);
}

static void test_store_refuses_unusable_paths_and_newer_schemas(void **state)
{
    (void)state;
    px__store st;
    px_err err;
    assert_int_equal(px__store_sqlite_open("/nonexistent-dir/x/fleet.db", &st, &err), PX_EIO);
    px_assert_contains(err.msg, "/nonexistent-dir/x/fleet.db");
    char *path = db_path("future.db");
    px_assert_ok(px__store_sqlite_open(path, &st, &err), &err);
    st.ops->close(st.self);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db, "INSERT INTO schema_version VALUES(999, 0)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(px__store_sqlite_open(path, &st, &err), PX_EUNSUPPORTED);
    px_assert_contains(err.msg, "newer");
    free(path);
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

static void test_store_owners_keys_credentials_and_private_files(void **state)
{
    (void)state;
    char *path = db_path("owners.db");
    /* A database made under a loose umask, and one left world-readable by
     * an older plexus, both end up readable by the owner alone. */
    mode_t old = umask(0);
    px__store st;
    px_err err;
    px_assert_ok(px__store_sqlite_open(path, &st, &err), &err);
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
    free(row.id);
    row.id = NULL;
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
    /* Credentials by node; a rotation keeps one and drops the rest. */
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
    umask(old);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    char *wal = px_asprintf("%s-wal", path);
    chmod(path, 0644);
    if (stat(wal, &sb) == 0)
        chmod(wal, 0644);
    px_assert_ok(px__store_sqlite_open(path, &st, &err), &err);
    st.ops->close(st.self);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    if (stat(wal, &sb) == 0)
        assert_int_equal(sb.st_mode & 0777, 0600);
    free(wal);
    free(path);
}

static char *deploy_db;

static void reopen_sqlite(px__store *st)
{
    px_err err;
    st->ops->close(st->self);
    px_assert_ok(px__store_sqlite_open(deploy_db, st, &err), &err);
}

static void test_store_keeps_deployments_by_name(void **state)
{
    (void)state;
    deploy_db = db_path("deployments.db");
    px__store st;
    px_err err;
    px_assert_ok(px__store_sqlite_open(deploy_db, &st, &err), &err);
    store_deploy_check(&st, reopen_sqlite);
    store_deploy_records_check(&st);
    st.ops->close(st.self);
    assert_int_equal(query_int(deploy_db, "SELECT COUNT(*) FROM deployments"), 2);
    free(deploy_db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_migrates_and_persists_jobs),
        cmocka_unit_test(test_store_logs_artifacts_explanations_nodes),
        cmocka_unit_test(test_store_owners_keys_credentials_and_private_files),
        cmocka_unit_test(test_store_refuses_unusable_paths_and_newer_schemas),
        cmocka_unit_test(test_store_keeps_deployments_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
