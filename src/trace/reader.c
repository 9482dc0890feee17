/* Reading plexus.trace/1 files: bounded, validated, chain-checked. */
#include "trace/trace_impl.h"

#define DEFAULT_MAX_LINE   ((size_t)16 << 20)
#define DEFAULT_MAX_EVENTS ((size_t)10000000)
#define DEFAULT_MAX_FILE   ((size_t)4 << 30)

struct px_trace_reader {
    FILE *f;         /* file source, or NULL */
    const char *mem; /* memory source */
    size_t mem_len, mem_pos;
    char *name;
    px_trace_limits lim;
    size_t consumed; /* bytes read so far */
    uint64_t line_no;
    uint64_t next_seq;
    char chain[PX_TRACE_ID_LEN];
    px_strbuf line;
    json_t *current; /* the event handed out last */
    char *command, *tool;
};

/* Reads one line (without the newline) into r->line.  *eof is set when no
 * more lines remain. */
static px_status read_line(px_trace_reader *r, bool *eof, px_err *err)
{
    px_strbuf_reset(&r->line);
    *eof = false;
    if (r->f) {
        int c;
        bool any = false;
        while ((c = getc(r->f)) != EOF) {
            any = true;
            if (++r->consumed > r->lim.max_file)
                return px_err_set(err, PX_ELIMIT, "%s: larger than the limit of %zu bytes", r->name,
                                  r->lim.max_file);
            if (c == '\n')
                return PX_OK;
            if (r->line.len >= r->lim.max_line)
                return px_err_set(err, PX_ELIMIT,
                                  "%s:%" PRIu64 ": line longer than the limit of %zu bytes",
                                  r->name, r->line_no + 1, r->lim.max_line);
            if (px_strbuf_addch(&r->line, (char)c) != PX_OK)
                return px_err_set(err, PX_ENOMEM, "%s: out of memory", r->name);
        }
        if (ferror(r->f))
            return px_err_set(err, PX_EIO, "%s: read failed", r->name);
        *eof = !any;
        return PX_OK;
    }
    if (r->mem_pos >= r->mem_len) {
        *eof = true;
        return PX_OK;
    }
    const char *start = r->mem + r->mem_pos;
    const char *nl = memchr(start, '\n', r->mem_len - r->mem_pos);
    size_t len = nl ? (size_t)(nl - start) : r->mem_len - r->mem_pos;
    if (len > r->lim.max_line)
        return px_err_set(err, PX_ELIMIT, "%s:%" PRIu64 ": line longer than the limit of %zu bytes",
                          r->name, r->line_no + 1, r->lim.max_line);
    r->mem_pos += len + (nl ? 1 : 0);
    if (px_strbuf_add(&r->line, start, len) != PX_OK)
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", r->name);
    return PX_OK;
}

/* Parses the current line, checks and strips its chain, advances the
 * chain.  Returns the object (new reference) in *out. */
static px_status parse_checked(px_trace_reader *r, json_t **out, px_err *err)
{
    char where[64];
    snprintf(where, sizeof where, "%s:%" PRIu64, r->name, r->line_no);
    px_json_limits jl = {.max_bytes = r->lim.max_line, .max_depth = 64};
    json_t *obj;
    px_status st = px_json_parse(r->line.buf, r->line.len, where, &jl, &obj, err);
    if (st != PX_OK)
        return st;
    if (!json_is_object(obj)) {
        json_decref(obj);
        return px_err_set(err, PX_EPARSE, "%s: a trace line must be a JSON object", where);
    }
    json_t *jc = json_object_get(obj, "chain");
    if (!json_is_string(jc) || json_string_length(jc) != PX_TRACE_ID_LEN - 1) {
        json_decref(obj);
        return px_err_set(err, PX_EPARSE,
                          "%s: missing or malformed \"chain\"; the trace was not written by "
                          "plexus or was edited",
                          where);
    }
    char recorded[PX_TRACE_ID_LEN];
    px_strlcpy(recorded, json_string_value(jc), sizeof recorded);
    json_object_del(obj, "chain");
    char *canon = px_json_dump_line(obj);
    if (!canon) {
        json_decref(obj);
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", where);
    }
    char expect[PX_TRACE_ID_LEN];
    px_status chained = px__trace_chain(r->chain, canon, strlen(canon), expect);
    free(canon);
    if (chained != PX_OK) {
        json_decref(obj);
        return px_err_set(err, PX_ENOMEM, "%s: out of memory", where);
    }
    if (strcmp(expect, recorded) != 0) {
        json_decref(obj);
        return px_err_set(err, PX_EPARSE,
                          "%s: hash chain broken: this line or one before it was changed, "
                          "dropped or reordered; the trace cannot be trusted",
                          where);
    }
    memcpy(r->chain, recorded, sizeof recorded);
    *out = obj;
    return PX_OK;
}

static px_status open_common(px_trace_reader *r, px_trace_reader **out, px_err *err)
{
    bool eof;
    px_status st = read_line(r, &eof, err);
    if (st == PX_OK && eof)
        st = px_err_set(err, PX_EPARSE, "%s: empty file; a trace starts with a header line",
                        r->name);
    json_t *hdr = NULL;
    if (st == PX_OK) {
        r->line_no = 1;
        st = parse_checked(r, &hdr, err);
    }
    if (st == PX_OK) {
        const char *schema = json_string_value(json_object_get(hdr, "schema"));
        const char *tool = json_string_value(json_object_get(hdr, "tool"));
        const char *cmd = json_string_value(json_object_get(hdr, "command"));
        if (!schema || strcmp(schema, PX_TRACE_SCHEMA) != 0)
            st = px_err_set(err, PX_EPARSE,
                            "%s:1: schema is \"%.40s\", expected \"" PX_TRACE_SCHEMA "\"", r->name,
                            schema ? schema : "(none)");
        else if (!tool || !cmd)
            st = px_err_set(err, PX_EPARSE, "%s:1: header lacks \"tool\" or \"command\"", r->name);
        else {
            r->tool = px_strdup(tool);
            r->command = px_strdup(cmd);
            if (!r->tool || !r->command)
                st = px_err_set(err, PX_ENOMEM, "%s: out of memory", r->name);
        }
    }
    json_decref(hdr);
    if (st != PX_OK) {
        px_trace_reader_free(r);
        return st;
    }
    r->next_seq = 1;
    *out = r;
    return PX_OK;
}

static px_trace_reader *reader_new(const char *name, const px_trace_limits *lim)
{
    px_trace_reader *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->name = px_strdup(name);
    if (!r->name) {
        free(r);
        return NULL;
    }
    if (lim)
        r->lim = *lim;
    if (!r->lim.max_line)
        r->lim.max_line = DEFAULT_MAX_LINE;
    if (!r->lim.max_events)
        r->lim.max_events = DEFAULT_MAX_EVENTS;
    if (!r->lim.max_file)
        r->lim.max_file = DEFAULT_MAX_FILE;
    px_strbuf_init(&r->line);
    return r;
}

px_status px_trace_reader_open(const char *path, const px_trace_limits *lim, px_trace_reader **out,
                               px_err *err)
{
    px_trace_reader *r = reader_new(path, lim);
    if (!r)
        return px_err_set(err, PX_ENOMEM, "out of memory opening a trace");
    r->f = fopen(path, "rb");
    if (!r->f) {
        px_status st = px_err_set(err, errno == ENOENT ? PX_ENOTFOUND : PX_EIO,
                                  "%s: cannot open: %s", path, strerror(errno));
        px_trace_reader_free(r);
        return st;
    }
    return open_common(r, out, err);
}

px_status px_trace_reader_open_memory(const char *data, size_t len, const char *name,
                                      const px_trace_limits *lim, px_trace_reader **out,
                                      px_err *err)
{
    px_trace_reader *r = reader_new(name ? name : "trace", lim);
    if (!r)
        return px_err_set(err, PX_ENOMEM, "out of memory opening a trace");
    if (len > r->lim.max_file) {
        px_trace_reader_free(r);
        return px_err_set(err, PX_ELIMIT, "%s: larger than the limit", name ? name : "trace");
    }
    r->mem = data;
    r->mem_len = len;
    return open_common(r, out, err);
}

void px_trace_reader_free(px_trace_reader *r)
{
    if (!r)
        return;
    if (r->f)
        fclose(r->f);
    json_decref(r->current);
    px_strbuf_release(&r->line);
    free(r->name);
    free(r->command);
    free(r->tool);
    free(r);
}

const char *px_trace_reader_command(const px_trace_reader *r)
{
    return r->command;
}

const char *px_trace_reader_tool(const px_trace_reader *r)
{
    return r->tool;
}

px_status px_trace_next(px_trace_reader *r, px_trace_event *ev, bool *done, px_err *err)
{
    json_decref(r->current);
    r->current = NULL;
    *done = false;
    bool eof;
    px_status st = read_line(r, &eof, err);
    if (st != PX_OK)
        return st;
    if (eof) {
        *done = true;
        return PX_OK;
    }
    r->line_no++;
    if (r->next_seq > r->lim.max_events)
        return px_err_set(err, PX_ELIMIT, "%s: more than %zu events", r->name, r->lim.max_events);
    json_t *obj;
    st = parse_checked(r, &obj, err);
    if (st != PX_OK)
        return st;
    r->current = obj;
    char where[64];
    snprintf(where, sizeof where, "%s:%" PRIu64, r->name, r->line_no);
    json_t *jseq = json_object_get(obj, "seq");
    if (!json_is_integer(jseq) || (uint64_t)json_integer_value(jseq) != r->next_seq)
        return px_err_set(err, PX_EPARSE, "%s: expected event seq %" PRIu64, where, r->next_seq);
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    const char *name = json_string_value(json_object_get(obj, "name"));
    if (!kind || !name)
        return px_err_set(err, PX_EPARSE, "%s: an event needs a \"kind\" and a \"name\"", where);
    px_trace_kind k = px__trace_kind_parse(kind);
    if (k == PX_TRACE_KIND_COUNT_)
        return px_err_set(err, PX_EPARSE,
                          "%s: unknown event kind \"%.40s\"; this trace needs a newer plexus",
                          where, kind);
    memset(ev, 0, sizeof *ev);
    ev->seq = r->next_seq;
    ev->kind = k;
    ev->name = name;
    ev->data = json_object_get(obj, "data");
    ev->inputs = json_object_get(obj, "inputs");
    if (!ev->data)
        return px_err_set(err, PX_EPARSE, "%s: event has no \"data\"", where);
    const char *id = json_string_value(json_object_get(obj, "id"));
    bool needs_id = k == PX_TRACE_INPUT || k == PX_TRACE_DECISION || k == PX_TRACE_MITIGATION;
    if (needs_id) {
        px_digest d;
        if (!id || px_digest_parse(id, &d) != PX_OK)
            return px_err_set(err, PX_EPARSE, "%s: %s event needs a 64-digit hex \"id\"", where,
                              kind);
        px_strlcpy(ev->id, id, sizeof ev->id);
        /* Ids are derived, never trusted: recompute them. */
        char expect[PX_TRACE_ID_LEN];
        if ((k == PX_TRACE_INPUT ? px_json_digest_hex(ev->data, expect)
                                 : px__trace_decision_id(name, ev->inputs, expect)) != PX_OK)
            return px_err_set(err, PX_ENOMEM, "%s: out of memory", where);
        if (strcmp(expect, id) != 0)
            return px_err_set(err, PX_EPARSE,
                              "%s: the id of %s \"%.40s\" does not match its content", where, kind,
                              name);
    }
    r->next_seq++;
    return PX_OK;
}
