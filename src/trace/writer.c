/* Writing plexus.trace/1 files: JSON Lines with a hash chain. */
#include "trace/trace_impl.h"

#include <unistd.h>

struct px_trace_writer {
    FILE *f;
    char *path;
    uint64_t seq;
    char chain[PX_TRACE_ID_LEN];
};

static const char *kind_names[PX_TRACE_KIND_COUNT_] = {
    [PX_TRACE_INPUT] = "input",
    [PX_TRACE_DECISION] = "decision",
    [PX_TRACE_OBSERVATION] = "observation",
    [PX_TRACE_FAULT] = "fault",
    [PX_TRACE_MITIGATION] = "mitigation",
    [PX_TRACE_OUTCOME] = "outcome",
};

const char *px_trace_kind_name(px_trace_kind kind)
{
    return (unsigned)kind < PX_TRACE_KIND_COUNT_ ? kind_names[kind] : "unknown";
}

px_trace_kind px__trace_kind_parse(const char *name)
{
    for (int k = 0; k < PX_TRACE_KIND_COUNT_; k++)
        if (!strcmp(name, kind_names[k]))
            return (px_trace_kind)k;
    return PX_TRACE_KIND_COUNT_;
}

px_status px__trace_chain(const char prev[PX_TRACE_ID_LEN], const char *line, size_t len,
                          char out[PX_TRACE_ID_LEN])
{
    px_sha256_ctx *h;
    px_digest d;
    if (px_sha256_new(&h, NULL) != PX_OK)
        return PX_ENOMEM;
    px_sha256_update(h, prev, strlen(prev));
    px_sha256_update(h, "\n", 1);
    px_sha256_update(h, line, len);
    px_sha256_final(h, &d);
    px_digest_hex(&d, out);
    return PX_OK;
}

px_status px__trace_decision_id(const char *name, const json_t *inputs, char out[PX_TRACE_ID_LEN])
{
    char *canon = px_json_dump_line(inputs ? inputs : json_null());
    if (!canon)
        return PX_ENOMEM;
    px_sha256_ctx *h;
    if (px_sha256_new(&h, NULL) != PX_OK) {
        free(canon);
        return PX_ENOMEM;
    }
    px_digest d;
    px_sha256_update(h, name, strlen(name));
    px_sha256_update(h, "\n", 1);
    px_sha256_update(h, canon, strlen(canon));
    px_sha256_final(h, &d);
    px_digest_hex(&d, out);
    free(canon);
    return PX_OK;
}

/* Writes obj (without "chain") as one line followed by its chain. */
static px_status write_line(px_trace_writer *w, json_t *obj, px_err *err)
{
    char *line = px_json_dump_line(obj);
    if (!line)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory writing the trace", w->path);
    char chain[PX_TRACE_ID_LEN];
    px_status st = px__trace_chain(w->chain, line, strlen(line), chain);
    if (st == PX_OK)
        st = px_json_set(obj, "chain", json_string(chain));
    free(line);
    if (st != PX_OK)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory writing the trace", w->path);
    line = px_json_dump_line(obj);
    if (!line)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory writing the trace", w->path);
    bool ok = fputs(line, w->f) >= 0 && fputc('\n', w->f) != EOF;
    free(line);
    if (!ok)
        return px_err_set(err, PX_EIO, "%s: cannot write: %s", w->path, strerror(errno));
    memcpy(w->chain, chain, sizeof chain);
    return PX_OK;
}

px_status px_trace_writer_open(const char *path, const char *command, px_trace_writer **out,
                               px_err *err)
{
    px_trace_writer *w = calloc(1, sizeof *w);
    if (!w)
        return px_err_set(err, PX_ENOMEM, "out of memory opening a trace");
    w->path = px_strdup(path);
    w->f = fopen(path, "w");
    if (!w->path || !w->f) {
        px_status st =
            px_err_set(err, PX_EIO, "%s: cannot create the trace: %s", path, strerror(errno));
        if (w->f)
            fclose(w->f);
        free(w->path);
        free(w);
        return st;
    }
    char tool[64];
    snprintf(tool, sizeof tool, "plexus %s", px_version());
    json_t *hdr = json_pack("{s:s, s:s, s:s, s:I}", "schema", PX_TRACE_SCHEMA, "tool", tool,
                            "command", command ? command : "", "seq", (json_int_t)0);
    px_status st =
        hdr ? write_line(w, hdr, err) : px_err_set(err, PX_ENOMEM, "out of memory opening a trace");
    json_decref(hdr);
    if (st != PX_OK) {
        fclose(w->f);
        free(w->path);
        free(w);
        return st;
    }
    *out = w;
    return PX_OK;
}

px_status px_trace_writer_close(px_trace_writer *w, px_err *err)
{
    if (!w)
        return PX_OK;
    px_status st = PX_OK;
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0)
        st = px_err_set(err, PX_EIO, "%s: cannot flush the trace: %s", w->path, strerror(errno));
    if (fclose(w->f) != 0 && st == PX_OK)
        st = px_err_set(err, PX_EIO, "%s: cannot close the trace: %s", w->path, strerror(errno));
    free(w->path);
    free(w);
    return st;
}

uint64_t px_trace_writer_count(const px_trace_writer *w)
{
    return w->seq;
}

static px_status write_event(px_trace_writer *w, px_trace_kind kind, const char *name,
                             const char *id, const json_t *inputs, const json_t *data, px_err *err)
{
    json_t *ev = json_pack("{s:I, s:s, s:s}", "seq", (json_int_t)(w->seq + 1), "kind",
                           px_trace_kind_name(kind), "name", name);
    if (!ev)
        return px_err_set(err, PX_ENOMEM, "out of memory writing the trace");
    bool ok = true;
    if (id)
        ok = px_json_set(ev, "id", json_string(id)) == PX_OK;
    if (ok && inputs)
        ok = json_object_set(ev, "inputs", (json_t *)inputs) == 0;
    if (ok)
        ok = json_object_set(ev, "data", data ? (json_t *)data : json_null()) == 0;
    if (ok && kind == PX_TRACE_OBSERVATION)
        ok = px_json_set(ev, "nondeterministic", json_true()) == PX_OK;
    px_status st =
        ok ? write_line(w, ev, err) : px_err_set(err, PX_ENOMEM, "out of memory writing the trace");
    json_decref(ev);
    if (st == PX_OK)
        w->seq++;
    return st;
}

px_status px_trace_input(px_trace_writer *w, const char *name, const json_t *data,
                         char id_out[PX_TRACE_ID_LEN], px_err *err)
{
    char id[PX_TRACE_ID_LEN];
    if (px_json_digest_hex(data, id) != PX_OK)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory writing the trace", w->path);
    px_status st = write_event(w, PX_TRACE_INPUT, name, id, NULL, data, err);
    if (st == PX_OK && id_out)
        memcpy(id_out, id, sizeof id);
    return st;
}

static px_status write_decision(px_trace_writer *w, px_trace_kind kind, const char *name,
                                const json_t *inputs, const json_t *output,
                                char id_out[PX_TRACE_ID_LEN], px_err *err)
{
    char id[PX_TRACE_ID_LEN];
    if (px__trace_decision_id(name, inputs, id) != PX_OK)
        return px_err_set(err, PX_ENOMEM, "out of memory writing the trace");
    px_status st = write_event(w, kind, name, id, inputs ? inputs : json_null(), output, err);
    if (st == PX_OK && id_out)
        memcpy(id_out, id, sizeof id);
    return st;
}

px_status px_trace_decision(px_trace_writer *w, const char *name, const json_t *inputs,
                            const json_t *output, char id_out[PX_TRACE_ID_LEN], px_err *err)
{
    return write_decision(w, PX_TRACE_DECISION, name, inputs, output, id_out, err);
}

px_status px_trace_mitigation(px_trace_writer *w, const char *name, const json_t *inputs,
                              const json_t *output, char id_out[PX_TRACE_ID_LEN], px_err *err)
{
    return write_decision(w, PX_TRACE_MITIGATION, name, inputs, output, id_out, err);
}

px_status px_trace_observation(px_trace_writer *w, const char *name, const json_t *data,
                               px_err *err)
{
    return write_event(w, PX_TRACE_OBSERVATION, name, NULL, NULL, data, err);
}

px_status px_trace_fault(px_trace_writer *w, const char *name, const json_t *data, px_err *err)
{
    return write_event(w, PX_TRACE_FAULT, name, NULL, NULL, data, err);
}

px_status px_trace_outcome(px_trace_writer *w, const char *name, const json_t *data, px_err *err)
{
    return write_event(w, PX_TRACE_OUTCOME, name, NULL, NULL, data, err);
}
