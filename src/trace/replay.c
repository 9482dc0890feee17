/* Replay: recompute every recorded decision and compare. */
#include "trace/trace_impl.h"

static const px_trace_deriver *find_deriver(const px_trace_deriver *d, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(d[i].name, name))
            return &d[i];
    return NULL;
}

px_status px_trace_replay(const char *path, const px_trace_deriver *derivers, size_t n_derivers,
                          void *ctx, px_trace_replay_report *report, px_err *err)
{
    memset(report, 0, sizeof *report);
    px_trace_reader *r;
    px_status st = px_trace_reader_open(path, NULL, &r, err);
    if (st != PX_OK)
        return st;
    json_t *history = json_object();
    if (!history) {
        px_trace_reader_free(r);
        return px_err_set(err, PX_ENOMEM, "out of memory replaying %s", path);
    }
    for (;;) {
        px_trace_event ev;
        bool done;
        st = px_trace_next(r, &ev, &done, err);
        if (st != PX_OK || done)
            break;
        report->n_events++;
        bool is_decision = ev.kind == PX_TRACE_DECISION || ev.kind == PX_TRACE_MITIGATION;
        if (is_decision) {
            report->n_decisions++;
            const px_trace_deriver *d = find_deriver(derivers, n_derivers, ev.name);
            if (!d) {
                report->n_unreplayed++;
            } else {
                json_t *again = NULL;
                st = d->derive(ctx, &ev, history, &again, err);
                if (st != PX_OK) {
                    px_err_prefix(err, st, "%s: event %" PRIu64 " (%s \"%s\"): ", path, ev.seq,
                                  px_trace_kind_name(ev.kind), ev.name);
                    report->diverged = true;
                    report->divergence_seq = ev.seq;
                    px_textf(report->divergence, sizeof report->divergence,
                             "%s \"%s\" could not be recomputed: %s", px_trace_kind_name(ev.kind),
                             ev.name, err ? err->msg : "");
                    st = PX_EDIVERGED;
                    break;
                }
                char want[PX_TRACE_ID_LEN], got[PX_TRACE_ID_LEN];
                bool hashed = px_json_digest_hex(ev.data, want) == PX_OK &&
                              px_json_digest_hex(again, got) == PX_OK;
                json_decref(again);
                if (!hashed) {
                    st = px_err_set(err, PX_ENOMEM, "out of memory replaying %s", path);
                    break;
                }
                if (strcmp(want, got) != 0) {
                    report->diverged = true;
                    report->divergence_seq = ev.seq;
                    snprintf(report->divergence, sizeof report->divergence,
                             "event %" PRIu64 ": %s \"%s\" (id %.12s) came out different: "
                             "recorded output %.12s, recomputed %.12s",
                             ev.seq, px_trace_kind_name(ev.kind), ev.name, ev.id, want, got);
                    st = px_err_set(err, PX_EDIVERGED, "%s: %s", path, report->divergence);
                    break;
                }
                report->n_identical++;
            }
        }
        if (ev.kind != PX_TRACE_OUTCOME &&
            json_object_set(history, ev.name, (json_t *)ev.data) != 0) {
            st = px_err_set(err, PX_ENOMEM, "out of memory replaying %s", path);
            break;
        }
    }
    json_decref(history);
    px_trace_reader_free(r);
    return st;
}
