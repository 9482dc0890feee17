/* A test seam, as SQLite's own tests inject I/O failures: when
 * px__store_fail_flag is set before a server starts, that server's store
 * is wrapped so that every write fails while the flag is nonzero, with the
 * message a full disk gives.  Reads pass through.  Production code never
 * sets the flag. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

atomic_int *px__store_fail_flag;

typedef struct faulty {
    px__store inner;
    atomic_int *flag;
    px__store_ops ops;
} faulty;

static px_status full(const faulty *f, px_err *err)
{
    (void)f;
    return px_err_set(err, PX_EIO, "fleet.db: database or disk is full (injected)");
}

#define FAILING(f) (atomic_load((f)->flag) != 0)

static void f_close(void *self)
{
    faulty *f = self;
    f->inner.ops->close(f->inner.self);
    free(f);
}

static px_status f_put_node(void *self, const char *name, const char *reg, const char *state,
                            int64_t last_seen, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->put_node(f->inner.self, name, reg, state, last_seen, err);
}

static px_status f_list_nodes(void *self, px__node_cb cb, void *ud, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->list_nodes(f->inner.self, cb, ud, err);
}

static px_status f_insert_job(void *self, px__job_row *row, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->insert_job(f->inner.self, row, err);
}

static px_status f_update_job(void *self, const px__job_row *row, const char *reason, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->update_job(f->inner.self, row, reason, err);
}

static px_status f_get_job(void *self, const char *id, px__job_row *out, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->get_job(f->inner.self, id, out, err);
}

static px_status f_list_jobs(void *self, const char *state, const char *owner, int limit,
                             px__job_cb cb, void *ud, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->list_jobs(f->inner.self, state, owner, limit, cb, ud, err);
}

static px_status f_find_idempotent(void *self, const char *owner, const char *key, px__job_row *out,
                                   px_err *err)
{
    faulty *f = self;
    return f->inner.ops->find_idempotent(f->inner.self, owner, key, out, err);
}

static px_status f_append_log(void *self, const char *job, int attempt, int rank,
                              const char *stream, const void *data, size_t len, int64_t *seq,
                              px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->append_log(f->inner.self, job, attempt, rank, stream, data,
                                                 len, seq, err);
}

static px_status f_read_logs(void *self, const char *job, int64_t after, const char *stream,
                             size_t max_bytes, px__log_cb cb, void *ud, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->read_logs(f->inner.self, job, after, stream, max_bytes, cb, ud, err);
}

static px_status f_job_usage(void *self, const char *job, int64_t *logs, int64_t *arts, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->job_usage(f->inner.self, job, logs, arts, err);
}

static px_status f_put_artifact(void *self, const px__artifact_row *a, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->put_artifact(f->inner.self, a, err);
}

static px_status f_list_artifacts(void *self, const char *job, px__artifact_cb cb, void *ud,
                                  px_err *err)
{
    faulty *f = self;
    return f->inner.ops->list_artifacts(f->inner.self, job, cb, ud, err);
}

static px_status f_put_explanation(void *self, const char *job, int attempt, const char *json,
                                   px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->put_explanation(f->inner.self, job, attempt, json, err);
}

static px_status f_get_explanation(void *self, const char *job, char **out, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->get_explanation(f->inner.self, job, out, err);
}

static px_status f_put_heartbeat(void *self, const char *node, int64_t at, const char *live,
                                 px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->put_heartbeat(f->inner.self, node, at, live, err);
}

static px_status f_put_credential(void *self, const char *node, const char *hash, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->put_credential(f->inner.self, node, hash, err);
}

static px_status f_drop_credentials(void *self, const char *node, const char *keep, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->drop_credentials(f->inner.self, node, keep, err);
}

static px_status f_list_credentials(void *self, px__credential_cb cb, void *ud, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->list_credentials(f->inner.self, cb, ud, err);
}

static px_status f_set_revoked(void *self, const char *node, bool revoked, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->set_revoked(f->inner.self, node, revoked, err);
}

static px_status f_list_revoked(void *self, px__name_cb cb, void *ud, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->list_revoked(f->inner.self, cb, ud, err);
}

static px_status f_lease(void *self, bool *held, px_err *err)
{
    faulty *f = self;
    *held = true;
    return f->inner.ops->lease ? f->inner.ops->lease(f->inner.self, held, err) : PX_OK;
}

static px_status f_claim_jobs(void *self, int max, px__job_cb cb, void *ud, px_err *err)
{
    faulty *f = self;
    if (!f->inner.ops->claim_jobs)
        return PX_OK;
    return FAILING(f) ? full(f, err) : f->inner.ops->claim_jobs(f->inner.self, max, cb, ud, err);
}

static px_status f_batch_begin(void *self, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->batch_begin ? f->inner.ops->batch_begin(f->inner.self, err) : PX_OK;
}

static px_status f_batch_end(void *self, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->batch_end ? f->inner.ops->batch_end(f->inner.self, err) : PX_OK;
}

static px_status f_wait_jobs(void *self, int timeout_ms, bool *woken, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->wait_jobs(f->inner.self, timeout_ms, woken, err);
}

static px_status f_put_deployment(void *self, const px__deploy_row *row, bool replace, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->put_deployment(f->inner.self, row, replace, err);
}

static px_status f_get_deployment(void *self, const char *name, px__deploy_row *out, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->get_deployment(f->inner.self, name, out, err);
}

static px_status f_list_deployments(void *self, const char *owner, px__deploy_cb cb, void *ud,
                                    px_err *err)
{
    faulty *f = self;
    return f->inner.ops->list_deployments(f->inner.self, owner, cb, ud, err);
}

static px_status f_delete_deployment(void *self, const char *name, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->delete_deployment(f->inner.self, name, err);
}

static px_status f_update_jobs(void *self, const px__job_row *rows, int n, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->update_jobs(f->inner.self, rows, n, err);
}

static px_status f_put_explanations(void *self, const px__explanation_row *rows, int n, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->put_explanations(f->inner.self, rows, n, err);
}

static px_status f_append_deploy_record(void *self, const char *deployment, const char *kind,
                                        int64_t at, const char *body, int keep, int64_t *seq,
                                        px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->append_deploy_record(f->inner.self, deployment, kind, at,
                                                           body, keep, seq, err);
}

static px_status f_list_deploy_records(void *self, const char *deployment, const char *kind,
                                       int64_t after, int limit, px__deploy_record_cb cb, void *ud,
                                       px_err *err)
{
    faulty *f = self;
    return f->inner.ops->list_deploy_records(f->inner.self, deployment, kind, after, limit, cb, ud,
                                             err);
}

/* Version 9: blobs and cancellations. */
static px_status f_put_blob(void *self, const char *hex, int fd, int64_t size, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->put_blob(f->inner.self, hex, fd, size, err);
}

static px_status f_get_blob(void *self, const char *hex, int fd, int64_t *size, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->get_blob(f->inner.self, hex, fd, size, err);
}

static px_status f_request_cancel(void *self, const char *job, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->request_cancel(f->inner.self, job, err);
}

/* Taking forgets what it hands over: a write. */
static px_status f_take_cancels(void *self, int max, px__name_cb cb, void *ud, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->take_cancels(f->inner.self, max, cb, ud, err);
}

/* Version 10: artifacts' bytes. */
static px_status f_put_artifact_data(void *self, const char *hex, int fd, int64_t size, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->put_artifact_data(f->inner.self, hex, fd, size, err);
}

static px_status f_get_artifact_data(void *self, const char *hex, int fd, int64_t *size,
                                     px_err *err)
{
    faulty *f = self;
    return f->inner.ops->get_artifact_data(f->inner.self, hex, fd, size, err);
}

/* Version 11: nodes through every replica. */
static px_status f_node_of_credential(void *self, const char *sha256_hex, char *name, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->node_of_credential(f->inner.self, sha256_hex, name, err);
}

static px_status f_note_node(void *self, const char *name, const char *kind, const char *body,
                             px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->note_node(f->inner.self, name, kind, body, err);
}

static px_status f_node_mark(void *self, int64_t *mark, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->node_mark(f->inner.self, mark, err);
}

static px_status f_changed_nodes(void *self, int64_t after, int max, px__node_change_cb cb,
                                 void *ud, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->changed_nodes(f->inner.self, after, max, cb, ud, err);
}

static px_status f_node_assignments(void *self, const char *node, px__name_cb cb, void *ud,
                                    px_err *err)
{
    faulty *f = self;
    return f->inner.ops->node_assignments(f->inner.self, node, cb, ud, err);
}

static px_status f_node_stops(void *self, const char *node, const char *running, char **out,
                              px_err *err)
{
    faulty *f = self;
    return f->inner.ops->node_stops(f->inner.self, node, running, out, err);
}

static px_status f_put_member_report(void *self, const char *node, const char *job,
                                     const char *kind, const char *body, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->put_member_report(f->inner.self, node, job, kind, body, err);
}

static px_status f_take_member_reports(void *self, int max, px__member_report_cb cb, void *ud,
                                       px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->take_member_reports(f->inner.self, max, cb, ud, err);
}

static px_status f_set_holder(void *self, const char *url, px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err) : f->inner.ops->set_holder(f->inner.self, url, err);
}

static px_status f_get_holder(void *self, char *url, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->get_holder(f->inner.self, url, err);
}

/* Version 12: the lease's epoch, and writes fenced by it (a write). */
static px_status f_lease_epoch(void *self, int64_t *epoch, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->lease_epoch(f->inner.self, epoch, err);
}

static px_status f_fenced_update_jobs(void *self, int64_t epoch, const px__job_row *rows, int n,
                                      px_err *err)
{
    faulty *f = self;
    return FAILING(f) ? full(f, err)
                      : f->inner.ops->fenced_update_jobs(f->inner.self, epoch, rows, n, err);
}

/* Version 13: the collection of artifacts' bytes no row names (it
 * deletes: a write). */
static px_status f_collect_artifact_data(void *self, int64_t before, int max, int64_t *removed,
                                         int64_t *bytes, px_err *err)
{
    faulty *f = self;
    if (FAILING(f)) {
        *removed = *bytes = 0;
        return full(f, err);
    }
    return f->inner.ops->collect_artifact_data(f->inner.self, before, max, removed, bytes, err);
}

static px_status f_append_log_quota(void *self, const char *job, int attempt, int rank,
                                    const char *stream, const void *data, size_t len, int64_t quota,
                                    const char *note, size_t *taken, bool *cut, int64_t *seq,
                                    px_err *err)
{
    faulty *f = self;
    if (FAILING(f)) {
        *taken = 0;
        *cut = false;
        *seq = 0;
        return full(f, err);
    }
    return f->inner.ops->append_log_quota(f->inner.self, job, attempt, rank, stream, data, len,
                                          quota, note, taken, cut, seq, err);
}

static px_status f_nodes_assignments(void *self, const char *nodes,
                                     void (*cb)(const char *node, const char *text, void *ud),
                                     void *ud, px_err *err)
{
    faulty *f = self;
    return f->inner.ops->nodes_assignments(f->inner.self, nodes, cb, ud, err);
}

static const px__store_ops faulty_ops = {
    .version = 13,
    .close = f_close,
    .put_node = f_put_node,
    .list_nodes = f_list_nodes,
    .insert_job = f_insert_job,
    .update_job = f_update_job,
    .get_job = f_get_job,
    .list_jobs = f_list_jobs,
    .find_idempotent = f_find_idempotent,
    .append_log = f_append_log,
    .read_logs = f_read_logs,
    .job_usage = f_job_usage,
    .put_artifact = f_put_artifact,
    .list_artifacts = f_list_artifacts,
    .put_explanation = f_put_explanation,
    .get_explanation = f_get_explanation,
    .put_heartbeat = f_put_heartbeat,
    .put_credential = f_put_credential,
    .drop_credentials = f_drop_credentials,
    .list_credentials = f_list_credentials,
    .set_revoked = f_set_revoked,
    .list_revoked = f_list_revoked,
    .lease = f_lease,
    .claim_jobs = f_claim_jobs,
    .batch_begin = f_batch_begin,
    .batch_end = f_batch_end,
    .wait_jobs = f_wait_jobs,
    .put_deployment = f_put_deployment,
    .get_deployment = f_get_deployment,
    .list_deployments = f_list_deployments,
    .delete_deployment = f_delete_deployment,
    .update_jobs = f_update_jobs,
    .put_explanations = f_put_explanations,
    .append_deploy_record = f_append_deploy_record,
    .list_deploy_records = f_list_deploy_records,
    .put_blob = f_put_blob,
    .get_blob = f_get_blob,
    .request_cancel = f_request_cancel,
    .take_cancels = f_take_cancels,
    .put_artifact_data = f_put_artifact_data,
    .get_artifact_data = f_get_artifact_data,
    .node_of_credential = f_node_of_credential,
    .note_node = f_note_node,
    .node_mark = f_node_mark,
    .changed_nodes = f_changed_nodes,
    .node_assignments = f_node_assignments,
    .node_stops = f_node_stops,
    .put_member_report = f_put_member_report,
    .take_member_reports = f_take_member_reports,
    .set_holder = f_set_holder,
    .get_holder = f_get_holder,
    .lease_epoch = f_lease_epoch,
    .fenced_update_jobs = f_fenced_update_jobs,
    .collect_artifact_data = f_collect_artifact_data,
    .append_log_quota = f_append_log_quota,
    .nodes_assignments = f_nodes_assignments,
};

px_status px__store_wrap_faults(px__store *store, px_err *err)
{
    if (!px__store_fail_flag)
        return PX_OK;
    faulty *f = calloc(1, sizeof *f);
    if (!f)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    f->inner = *store;
    f->flag = px__store_fail_flag;
    /* The optional operations only where the store under has them: a
     * lease would make a lone server a replica standing by. */
    f->ops = faulty_ops;
    if (!f->inner.ops->lease)
        f->ops.lease = NULL;
    if (!f->inner.ops->claim_jobs)
        f->ops.claim_jobs = NULL;
    if (!f->inner.ops->batch_begin || !f->inner.ops->batch_end)
        f->ops.batch_begin = f->ops.batch_end = NULL;
    if (f->inner.ops->version < 4 || !f->inner.ops->wait_jobs)
        f->ops.wait_jobs = NULL;
    if (f->inner.ops->version < 6 || !f->inner.ops->update_jobs)
        f->ops.update_jobs = NULL;
    if (f->inner.ops->version < 6 || !f->inner.ops->put_explanations)
        f->ops.put_explanations = NULL;
    if (f->inner.ops->version < 7) {
        f->ops.append_deploy_record = NULL;
        f->ops.list_deploy_records = NULL;
    }
    const px__store_ops *in = f->inner.ops;
    if (in->version < 9 || !in->put_blob || !in->get_blob) {
        f->ops.put_blob = NULL;
        f->ops.get_blob = NULL;
    }
    if (in->version < 9 || !in->request_cancel || !in->take_cancels) {
        f->ops.request_cancel = NULL;
        f->ops.take_cancels = NULL;
    }
    if (in->version < 10 || !in->put_artifact_data || !in->get_artifact_data) {
        f->ops.put_artifact_data = NULL;
        f->ops.get_artifact_data = NULL;
    }
    /* Version 11's ten come together or not at all. */
    if (in->version < 11 || !in->node_of_credential) {
        f->ops.node_of_credential = NULL;
        f->ops.note_node = NULL;
        f->ops.node_mark = NULL;
        f->ops.changed_nodes = NULL;
        f->ops.node_assignments = NULL;
        f->ops.node_stops = NULL;
        f->ops.put_member_report = NULL;
        f->ops.take_member_reports = NULL;
        f->ops.set_holder = NULL;
        f->ops.get_holder = NULL;
    }
    if (in->version < 12 || !in->lease_epoch || !in->fenced_update_jobs) {
        f->ops.lease_epoch = NULL;
        f->ops.fenced_update_jobs = NULL;
    }
    if (in->version < 13 || !in->collect_artifact_data)
        f->ops.collect_artifact_data = NULL;
    if (in->version < 13 || !in->append_log_quota)
        f->ops.append_log_quota = NULL;
    if (in->version < 13 || !in->nodes_assignments)
        f->ops.nodes_assignments = NULL;
    store->ops = &f->ops;
    store->self = f;
    return PX_OK;
}
