/* Node-loss incidents of the fleet, for the dashboard and its record.
 *
 * When the lease check finds a node lost (no heartbeat within the lease:
 * the agent was killed, its machine or its devices went away, or the
 * network cut it off), an incident is opened with the work that was on
 * the node.  The scheduler's tick then follows each job of it: requeued
 * with its next attempt, placed again (the candidates the scheduler
 * weighed, accepted and rejected with the scheduler's own reasons, from
 * the job's explanation), restarted (the first start report of the new
 * attempt is the canary: the work runs again), and how it ended.  The
 * recovery time (RTO) runs from the node's last heartbeat (the latest the
 * fault can have happened) to that restart; the lost work is how long the
 * lost attempt had run.
 *
 * Incidents are kept in memory, the last MAX_INCIDENTS; what they point
 * at (jobs, attempts, logs, explanations) is in the store.  Server lock
 * held throughout. */
#include "base/common.h"

#include "fleet/ui_impl.h"

#include <time.h>

#define MAX_INCIDENTS 200
#define MAX_JOBS      64 /* jobs followed per incident */

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void timeline_add(json_t *inc, double t, const char *fmt, ...) PX_PRINTF(3, 4);
static void timeline_add(json_t *inc, double t, const char *fmt, ...)
{
    char text[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    double onset = json_real_value(json_object_get(inc, "onset_unix"));
    json_array_append_new(json_object_get(inc, "timeline"),
                          json_pack("{s:f, s:s}", "t_s", t - onset, "event", text));
}

void px__incident_node_lost(px_fleet_server *srv, size_t node, double silent_s)
{
    if (!srv->incidents && !(srv->incidents = json_array()))
        return;
    double now = wall_now();
    double onset = now - silent_s;
    const char *name = px_fleet_sched_node_name(srv->sched, node);
    char id[32];
    snprintf(id, sizeof id, "inc-%04d", ++srv->incident_seq);
    json_t *devices = json_array();
    json_t *node_json = px__srv_node_json(srv, node);
    json_t *dv;
    size_t k;
    json_array_foreach(json_object_get(node_json, "devices"), k, dv)
    {
        /* Fleet-wide ids, as plans name devices: node.device. */
        const char *dev = json_string_value(json_object_get(dv, "id"));
        char global[200];
        snprintf(global, sizeof global, "%s.%s", name, dev ? dev : "?");
        json_array_append_new(devices, json_string(global));
    }
    json_decref(node_json);
    char evidence[200];
    snprintf(evidence, sizeof evidence, "no heartbeat from %s for %.1f s (lease %.1f s)", name,
             silent_s, srv->opt.lease_s);
    json_t *inc = json_pack(
        "{s:s, s:s, s:s, s:s, s:o, s:f, s:f, s:{s:s, s:s, s:f, s:f}, s:[], s:[], s:s, s:n, "
        "s:f, s:b}",
        "id", id, "schema", "plexus.fleet-incident/1", "class", "node-loss", "node", name,
        "devices", devices, "onset_unix", onset, "detected_unix", now, "detection", "detector",
        "lease", "evidence", evidence, "time_to_detect_s", silent_s, "detected_at_s", silent_s,
        "jobs", "timeline", "outcome", "open", "rto_s", "lost_work_s", 0.0, "open", 1);
    if (!inc)
        return;
    timeline_add(inc, onset, "last heartbeat from %s", name);
    timeline_add(inc, now, "detected: %s", evidence);
    json_t *jobs = json_object_get(inc, "jobs");
    double lost_total = 0;
    for (px__job *j = srv->jobs; j && json_array_size(jobs) < MAX_JOBS; j = j->next) {
        if (j->state != PX__JOB_ASSIGNED && j->state != PX__JOB_RUNNING)
            continue;
        json_t *ranks = json_array();
        double lost = 0;
        for (int m = 0; m < j->n_members; m++) {
            if (j->members[m].node != (int)node)
                continue;
            json_array_append_new(ranks, json_integer(m));
            if (j->members[m].state == PX__MEM_RUNNING && j->members[m].started > 0) {
                double ran = now - (double)j->members[m].started;
                lost = ran > lost ? ran : lost;
            }
        }
        if (json_array_size(ranks) == 0) {
            json_decref(ranks);
            continue;
        }
        lost_total += lost;
        json_array_append_new(
            jobs, json_pack("{s:s, s:s, s:s?, s:i, s:o, s:f, s:s, s:n, s:[], s:[], s:n, s:n}",
                            "job", j->row.id, "name", j->row.name ? j->row.name : j->row.id,
                            "owner", j->row.owner, "lost_attempt", j->row.attempt, "ranks", ranks,
                            "lost_work_s", lost, "outcome", "open", "new_attempt", "placed_on",
                            "candidates", "canary", "rto_s"));
        timeline_add(inc, now, "%s attempt %d lost with its node after %.1f s of work", j->row.id,
                     j->row.attempt, lost);
    }
    json_object_set_new(inc, "lost_work_s", json_real(lost_total));
    if (json_array_size(jobs) == 0) {
        json_object_set_new(inc, "outcome", json_string("no work was on the node"));
        json_object_set_new(inc, "open", json_false());
    }
    json_array_append_new(srv->incidents, inc);
    while (json_array_size(srv->incidents) > MAX_INCIDENTS)
        json_array_remove(srv->incidents, 0);
    pthread_cond_broadcast(&srv->changed);
}

/* The candidates of a placement, from the job's explanation: the nodes
 * scored (the chosen ones accepted) and the nodes filtered out with the
 * scheduler's reason. */
static json_t *candidates_of(const json_t *explain)
{
    json_t *out = json_array();
    const json_t *chosen = json_object_get(json_object_get(explain, "decision"), "nodes");
    const char *summary =
        json_string_value(json_object_get(json_object_get(explain, "decision"), "summary"));
    const json_t *c;
    size_t i;
    json_array_foreach(json_object_get(explain, "scored"), i, c)
    {
        const char *node = json_string_value(json_object_get(c, "node"));
        bool accepted = false;
        const json_t *n;
        size_t k;
        json_array_foreach(chosen, k, n) accepted |=
            node && json_is_string(n) && !strcmp(json_string_value(n), node);
        char reason[300];
        if (accepted)
            snprintf(reason, sizeof reason, "chosen: %s", summary ? summary : "highest score");
        else
            snprintf(reason, sizeof reason, "feasible, scored lower (%.1f)",
                     json_number_value(json_object_get(c, "score")));
        json_array_append_new(out, json_pack("{s:s?, s:b, s:O?, s:s}", "node", node, "accepted",
                                             accepted, "score", json_object_get(c, "score"),
                                             "reason", reason));
    }
    json_array_foreach(json_object_get(explain, "rejected"), i, c) json_array_append_new(
        out,
        json_pack("{s:O?, s:b, s:O?, s:O?}", "node", json_object_get(c, "node"), "accepted", 0,
                  "reason", json_object_get(c, "reason"), "detail", json_object_get(c, "detail")));
    return out;
}

static json_t *node_names(px_fleet_server *srv, const px__job *j)
{
    json_t *out = json_array();
    for (int m = 0; m < j->n_members; m++)
        if (j->members[m].node >= 0)
            json_array_append_new(
                out, json_string(px_fleet_sched_node_name(srv->sched, (size_t)j->members[m].node)));
    return out;
}

/* Follows one job of an incident; true once its story ended. */
static bool follow(px_fleet_server *srv, json_t *inc, json_t *e, double now)
{
    const char *id = json_string_value(json_object_get(e, "job"));
    int lost = (int)json_integer_value(json_object_get(e, "lost_attempt"));
    double onset = json_real_value(json_object_get(inc, "onset_unix"));
    px__job *j = px__srv_find_job(srv, id);
    if (j) {
        if (j->row.attempt <= lost)
            return false;
        if (json_is_null(json_object_get(e, "new_attempt")))
            timeline_add(inc, now, "%s requeued as attempt %d", id, j->row.attempt);
        json_object_set_new(e, "new_attempt", json_integer(j->row.attempt));
        if ((j->state == PX__JOB_ASSIGNED || j->state == PX__JOB_RUNNING) &&
            json_array_size(json_object_get(e, "placed_on")) == 0) {
            json_t *placed = node_names(srv, j);
            json_t *cands = j->explain ? candidates_of(j->explain) : json_array();
            size_t acc = 0, rej = 0;
            json_t *c;
            size_t i;
            json_array_foreach(cands, i, c)
            {
                if (json_is_true(json_object_get(c, "accepted")))
                    acc++;
                else
                    rej++;
            }
            px_strbuf where = PX_STRBUF_INIT;
            json_t *n;
            json_array_foreach(placed, i, n)
                px_strbuf_addf(&where, "%s%s", i ? ", " : "", json_string_value(n));
            timeline_add(inc, now, "%s attempt %d placed on %s (%zu accepted, %zu rejected)", id,
                         j->row.attempt, where.len ? where.buf : "?", acc, rej);
            px_strbuf_release(&where);
            json_object_set_new(e, "placed_on", placed);
            json_object_set_new(e, "candidates", cands);
        }
        if (j->state == PX__JOB_RUNNING && json_is_null(json_object_get(e, "rto_s"))) {
            json_t *placed = json_object_get(e, "placed_on");
            const char *first = json_string_value(json_array_get(placed, 0));
            char check[200];
            snprintf(check, sizeof check, "attempt %d reported its start on %s", j->row.attempt,
                     first ? first : "its node");
            json_object_set_new(e, "canary",
                                json_pack("{s:s, s:s}", "check", check, "verdict", "pass"));
            json_object_set_new(e, "rto_s", json_real(now - onset));
            json_object_set_new(e, "outcome", json_string("recovered"));
            timeline_add(inc, now, "%s running again: %s (RTO %.1f s)", id, check, now - onset);
        }
        return false;
    }
    /* The job ended: how, from the store. */
    px__job_row row = {0};
    px_err err;
    if (srv->store.ops->get_job(srv->store.self, id, &row, &err) != PX_OK)
        return false; /* the store is failing: again on the next tick */
    const char *state = row.state ? row.state : "unknown";
    bool recovered = json_is_string(json_object_get(e, "outcome")) &&
                     !strcmp(json_string_value(json_object_get(e, "outcome")), "recovered");
    if (row.attempt <= lost) {
        json_object_set_new(e, "outcome", json_string(state));
        timeline_add(inc, now, "%s %s without another attempt%s%s", id, state,
                     row.error ? ": " : "", row.error ? row.error : "");
    } else {
        if (!recovered && strcmp(state, "cancelled") != 0) {
            /* It ran and ended between two ticks. */
            json_object_set_new(e, "rto_s", json_real(now - onset));
            json_object_set_new(e, "canary",
                                json_pack("{s:s, s:s}", "check", "the new attempt ran to its end",
                                          "verdict",
                                          strcmp(state, "succeeded") == 0 ? "pass" : "fail"));
        }
        json_object_set_new(e, "new_attempt", json_integer(row.attempt));
        json_object_set_new(e, "outcome", json_string(state));
        timeline_add(inc, now, "%s attempt %d %s", id, row.attempt, state);
    }
    px__job_row_release(&row);
    return true;
}

void px__incidents_tick(px_fleet_server *srv)
{
    if (!srv->incidents)
        return;
    double now = wall_now();
    json_t *inc;
    size_t i;
    json_array_foreach(srv->incidents, i, inc)
    {
        if (!json_is_true(json_object_get(inc, "open")))
            continue;
        json_t *jobs = json_object_get(inc, "jobs");
        json_t *before = json_deep_copy(jobs);
        bool all_done = true;
        json_t *e;
        size_t k;
        json_array_foreach(jobs, k, e)
        {
            if (json_is_true(json_object_get(e, "done")))
                continue;
            if (follow(srv, inc, e, now))
                json_object_set_new(e, "done", json_true());
            else
                all_done = false;
        }
        double rto = -1;
        size_t recovered = 0, n = json_array_size(jobs);
        json_array_foreach(jobs, k, e)
        {
            double r = json_number_value(json_object_get(e, "rto_s"));
            if (json_is_number(json_object_get(e, "rto_s"))) {
                recovered++;
                rto = r > rto ? r : rto;
            }
        }
        if (rto >= 0)
            json_object_set_new(inc, "rto_s", json_real(rto));
        json_object_set_new(inc, "outcome",
                            json_string(recovered == n ? "recovered"
                                        : all_done
                                            ? (recovered ? "partly recovered" : "not recovered")
                                            : "open"));
        if (all_done)
            json_object_set_new(inc, "open", json_false());
        if (!json_equal(before, jobs) || all_done)
            pthread_cond_broadcast(&srv->changed);
        json_decref(before);
    }
}

/* A copy of the incident with only the jobs viewer may see. */
static json_t *visible_copy(const json_t *inc, const px__who *viewer)
{
    json_t *c = json_deep_copy(inc);
    if (!c || viewer->admin)
        return c;
    json_t *jobs = json_object_get(c, "jobs");
    size_t hidden = 0;
    for (size_t k = json_array_size(jobs); k-- > 0;) {
        const char *owner = json_string_value(json_object_get(json_array_get(jobs, k), "owner"));
        if (!owner || strcmp(owner, viewer->name) != 0) {
            json_array_remove(jobs, k);
            hidden++;
        }
    }
    if (hidden) {
        /* The timeline names jobs; another user's stay unnamed. */
        json_t *tl = json_object_get(c, "timeline");
        for (size_t k = json_array_size(tl); k-- > 0;) {
            const char *ev = json_string_value(json_object_get(json_array_get(tl, k), "event"));
            if (ev && strncmp(ev, "j-", 2) == 0) {
                bool mine = false;
                json_t *e;
                size_t m;
                json_array_foreach(jobs, m, e)
                {
                    const char *id = json_string_value(json_object_get(e, "job"));
                    mine |= id && px_str_starts_with(ev, id) && ev[strlen(id)] == ' ';
                }
                if (!mine)
                    json_array_remove(tl, k);
            }
        }
        json_object_set_new(c, "other_jobs", json_integer((json_int_t)hidden));
    }
    return c;
}

json_t *px__incidents_json(px_fleet_server *srv, const px__who *viewer)
{
    json_t *out = json_array();
    for (size_t i = json_array_size(srv->incidents); i-- > 0;)
        json_array_append_new(out, visible_copy(json_array_get(srv->incidents, i), viewer));
    return out;
}

json_t *px__incident_json(px_fleet_server *srv, const char *id, const px__who *viewer)
{
    json_t *inc;
    size_t i;
    json_array_foreach(srv->incidents, i, inc)
    {
        const char *v = json_string_value(json_object_get(inc, "id"));
        if (v && strcmp(v, id) == 0)
            return visible_copy(inc, viewer);
    }
    return NULL;
}

void px__incidents_free(px_fleet_server *srv)
{
    json_decref(srv->incidents);
    srv->incidents = NULL;
}
