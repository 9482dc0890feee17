/* Discovery: the node's memory, from /proc/meminfo. */
#include "hw/discover_impl.h"

/* The keys discovery needs; the rest of the file is skipped. */
enum { K_TOTAL, K_FREE, K_AVAILABLE, K_BUFFERS, K_CACHED, K_COUNT };
static const char *const keys[K_COUNT] = {"MemTotal", "MemFree", "MemAvailable", "Buffers",
                                          "Cached"};

/* Parses "  16283720 kB" into bytes.  Returns false when the text is not
 * a decimal number of kB or the bytes overflow 64 bits. */
static bool parse_kb(const char *s, size_t len, uint64_t *out)
{
    px__trim(&s, &len);
    size_t i = 0;
    uint64_t v = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) ||
            __builtin_add_overflow(v, (uint64_t)(s[i] - '0'), &v))
            return false;
        i++;
    }
    if (i == 0)
        return false;
    while (i < len && (s[i] == ' ' || s[i] == '\t'))
        i++;
    if (len - i != 2 || s[i] != 'k' || s[i + 1] != 'B')
        return false;
    return !__builtin_mul_overflow(v, 1024, out);
}

px_status px_hw_parse_meminfo(const char *text, size_t len, px_hw_meminfo *out, px_err *err)
{
    memset(out, 0, sizeof *out);
    if (len > PX__DISC_MAX_FILE)
        return px_err_set(err, PX_ELIMIT,
                          "meminfo: %zu bytes, more than the limit of %d; is this /proc/meminfo?",
                          len, PX__DISC_MAX_FILE);
    uint64_t val[K_COUNT] = {0};
    size_t seen[K_COUNT] = {0}; /* line of the first occurrence, 0 when absent */
    px__lines it;
    px__lines_init(&it, text, len);
    const char *line;
    size_t n;
    while (px__lines_next(&it, &line, &n)) {
        if (it.lineno > PX__DISC_MAX_LINES)
            return px_err_set(err, PX_ELIMIT, "meminfo: more than %d lines; is this /proc/meminfo?",
                              PX__DISC_MAX_LINES);
        const char *colon = memchr(line, ':', n);
        if (!colon)
            continue;
        const char *key = line;
        size_t klen = (size_t)(colon - line);
        px__trim(&key, &klen);
        int k = -1;
        for (int j = 0; j < K_COUNT; j++)
            if (strlen(keys[j]) == klen && !memcmp(keys[j], key, klen))
                k = j;
        if (k < 0)
            continue;
        if (seen[k])
            return px_err_set(err, PX_EPARSE,
                              "meminfo: line %zu: %s appears again (first on line %zu); "
                              "the file is not a kernel's /proc/meminfo",
                              it.lineno, keys[k], seen[k]);
        const char *rest = colon + 1;
        size_t rlen = n - (size_t)(rest - line);
        if (!parse_kb(rest, rlen, &val[k])) {
            const char *shown = rest;
            size_t slen = rlen;
            px__trim(&shown, &slen);
            return px_err_set(err, PX_EPARSE,
                              "meminfo: line %zu: %s: expected a number of kB such as "
                              "\"16283720 kB\", got \"%.*s\"",
                              it.lineno, keys[k], (int)PX_MIN(slen, 40), shown);
        }
        seen[k] = it.lineno;
    }
    if (!seen[K_TOTAL])
        return px_err_set(err, PX_EPARSE,
                          "meminfo: no MemTotal line; expected \"MemTotal: <n> kB\" as in "
                          "/proc/meminfo");
    if (val[K_TOTAL] == 0)
        return px_err_set(err, PX_EPARSE, "meminfo: line %zu: MemTotal is 0 kB", seen[K_TOTAL]);
    out->total = val[K_TOTAL];
    out->free = val[K_FREE];
    if (seen[K_AVAILABLE]) {
        if (val[K_AVAILABLE] > val[K_TOTAL])
            return px_err_set(err, PX_EPARSE,
                              "meminfo: line %zu: MemAvailable (%" PRIu64
                              " B) exceeds MemTotal (%" PRIu64 " B)",
                              seen[K_AVAILABLE], val[K_AVAILABLE], val[K_TOTAL]);
        out->available = val[K_AVAILABLE];
    } else {
        /* What kernels before 3.14 leave to user space: free memory plus
         * the page cache and buffers the kernel can drop. */
        uint64_t sum = val[K_FREE];
        if (__builtin_add_overflow(sum, val[K_BUFFERS], &sum) ||
            __builtin_add_overflow(sum, val[K_CACHED], &sum) || sum > out->total)
            sum = out->total;
        out->available = sum;
        out->available_estimated = true;
    }
    if (out->free > out->total)
        out->free = out->total;
    return PX_OK;
}

px_status px__disc_probe_mem(px__disc *d)
{
    uint64_t t0 = px_now_ns();
    char *text = NULL;
    size_t len = 0;
    px_err err;
    px_status st = px__disc_read(d, "/proc/meminfo", PX__DISC_MAX_FILE, &text, &len, &err);
    if (st == PX_ENOMEM)
        return st;
    if (st != PX_OK)
        return px__disc_record(d, "memory", PX__PROBE_FAILED, "/proc/meminfo", t0,
                               "run discovery on Linux with /proc mounted", "%s", err.msg);
    px_hw_meminfo mi;
    st = px_hw_parse_meminfo(text, len, &mi, &err);
    free(text);
    if (st != PX_OK)
        return px__disc_record(d, "memory", PX__PROBE_FAILED, "/proc/meminfo", t0, NULL,
                               "/proc/meminfo: %s", err.msg);

    json_t *tier = json_pack("{s:s, s:s}", "id", "ddr0", "kind", "ddr");
    if (!tier || px_json_push(d->memory, tier) != PX_OK)
        return PX_ENOMEM;
    if (px_json_set(tier, "capacity",
                    px__disc_qty(d, (double)mi.total, PX_DIM_BYTES, PX_PROV_DISCOVERED,
                                 "/proc/meminfo MemTotal", 0)) != PX_OK)
        return PX_ENOMEM;
    d->ddr = tier;
    d->mem_available = mi.available;

    json_t *live = json_object_get(d->node, "live");
    if (!live) {
        live = json_object();
        if (px_json_set(d->node, "live", live) != PX_OK)
            return PX_ENOMEM;
    }
    const char *src = mi.available_estimated
                          ? "/proc/meminfo MemFree + Buffers + Cached (no MemAvailable)"
                          : "/proc/meminfo MemAvailable";
    if (px_json_set(live, "memory_free",
                    px__disc_qty(d, (double)mi.available, PX_DIM_BYTES, PX_PROV_DISCOVERED, src,
                                 0)) != PX_OK)
        return PX_ENOMEM;
    return px__disc_record(d, "memory", PX__PROBE_OK, "/proc/meminfo", t0, NULL,
                           "%" PRIu64 " MiB total, %" PRIu64 " MiB available", mi.total >> 20,
                           mi.available >> 20);
}
