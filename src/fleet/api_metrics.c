/* Prometheus text metrics (format 0.0.4) for GET /metrics. */
#include "base/common.h"

#include "fleet/fleet_impl.h"

/* Histogram bucket upper bounds in seconds; the last bucket is +Inf. */
static const double bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                0.1,    0.25,  0.5,    1,     2.5,  5,     10};
#define N_BOUNDS (sizeof bounds / sizeof bounds[0])

void px__metrics_observe(uint64_t *hist, double *sum, uint64_t *count, double seconds)
{
    for (size_t i = 0; i < N_BOUNDS; i++)
        if (seconds <= bounds[i])
            hist[i]++;
    *sum += seconds;
    (*count)++;
}

static void histogram(px_strbuf *sb, const char *name, const char *help, const uint64_t *hist,
                      double sum, uint64_t count)
{
    px_strbuf_addf(sb, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t i = 0; i < N_BOUNDS; i++)
        px_strbuf_addf(sb, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, bounds[i], hist[i]);
    px_strbuf_addf(sb, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n%s_sum %.6f\n%s_count %" PRIu64 "\n",
                   name, count, name, sum, name, count);
}

static void counter(px_strbuf *sb, const char *name, const char *help, uint64_t v)
{
    px_strbuf_addf(sb, "# HELP %s %s\n# TYPE %s counter\n%s %" PRIu64 "\n", name, help, name, name,
                   v);
}

char *px__metrics_render(px_fleet_server *srv)
{
    px_strbuf sb = PX_STRBUF_INIT;
    const px__metrics *m = &srv->metrics;
    uint64_t by_state[PX__JOB_CANCELLED + 1] = {0};
    for (const px__job *j = srv->jobs; j; j = j->next)
        by_state[j->state]++;
    px_strbuf_adds(&sb, "# HELP plexus_jobs Jobs that have not ended, by state.\n"
                        "# TYPE plexus_jobs gauge\n");
    for (int s = PX__JOB_QUEUED; s <= PX__JOB_RUNNING; s++)
        px_strbuf_addf(&sb, "plexus_jobs{state=\"%s\"} %" PRIu64 "\n",
                       px__job_state_name((px__job_state)s), by_state[s]);
    uint64_t nodes[3] = {0};
    for (size_t i = 0; i < px_fleet_sched_n_nodes(srv->sched); i++)
        nodes[px_fleet_sched_state(srv->sched, i)]++;
    px_strbuf_addf(&sb,
                   "# HELP plexus_nodes Nodes by state.\n# TYPE plexus_nodes gauge\n"
                   "plexus_nodes{state=\"online\"} %" PRIu64 "\n"
                   "plexus_nodes{state=\"offline\"} %" PRIu64 "\n"
                   "plexus_nodes{state=\"draining\"} %" PRIu64 "\n",
                   nodes[0], nodes[1], nodes[2]);
    counter(&sb, "plexus_jobs_submitted_total", "Jobs accepted since the server started.",
            m->submitted);
    counter(&sb, "plexus_jobs_claimed_total",
            "Jobs other replicas accepted that this one took in to schedule.", m->claimed);
    counter(&sb, "plexus_store_notifications_total",
            "Wake-ups by the database: another replica accepted jobs.", m->notifications);
    counter(&sb, "plexus_agent_calls_stored_total",
            "Agents' calls this replica answered from the database while another scheduled.",
            m->agent_calls_stored);
    counter(&sb, "plexus_standby_poll_reads_total",
            "Reads of the database for the agents' polls waiting on this replica while another "
            "scheduled (one per tick, whatever the number of polls).",
            m->poll_reads);
    counter(&sb, "plexus_commit_waits_total",
            "Cancels and agents' reports that met a job whose assignment was being committed, "
            "and waited for the commit.",
            m->commit_waits);
    counter(&sb, "plexus_scheduling_decisions_total", "Placement attempts.", m->decisions);
    counter(&sb, "plexus_placements_total", "Placement attempts that placed the job.",
            m->placements);
    counter(&sb, "plexus_requeues_total", "Jobs put back in the queue with a new attempt.",
            m->requeues);
    px_strbuf_adds(&sb, "# HELP plexus_http_requests_total HTTP requests by status class.\n"
                        "# TYPE plexus_http_requests_total counter\n");
    for (int c = 1; c <= 5; c++)
        px_strbuf_addf(&sb, "plexus_http_requests_total{code=\"%dxx\"} %" PRIu64 "\n", c,
                       m->http_by_class[c]);
    histogram(&sb, "plexus_http_request_seconds", "Time to answer an HTTP request.", m->http_hist,
              m->http_sum, m->http_count);
    histogram(&sb, "plexus_scheduler_pass_seconds", "Time of one scheduling pass.", m->pass_hist,
              m->pass_sum, m->pass_count);
    histogram(&sb, "plexus_job_queue_seconds",
              "Time from a job's arrival in this replica's queue (accepted, claimed from "
              "another replica, or requeued) to its assignment written.",
              m->queue_hist, m->queue_sum, m->queue_count);
    histogram(&sb, "plexus_job_dispatch_seconds",
              "Time from a job's assignment written to every member reported started.",
              m->dispatch_hist, m->dispatch_sum, m->dispatch_count);
    if (sb.len == 0)
        return NULL;
    return px_strbuf_detach(&sb, NULL);
}
