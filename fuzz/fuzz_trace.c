/* Fuzz target: the trace reader on arbitrary bytes, and the healing
 * loop's step records (heal.step.N) as replay reads them.  A mutated line
 * breaks the reader's hash chain, which stops it there; but the chain is
 * no secret (anyone can chain the lines they wrote), so every line is
 * also parsed on its own and each event named "heal.step..." goes through
 * the step reader.  It must refuse cleanly, naming the record, or give a
 * sample within its bounds that survives its own round trip; the samples
 * it accepts then run through the detector as a replay would run them. */
#include "base/common.h"

#include "heal/heal_run_impl.h"
#include "plexus/trace.h"

#define MAX_STEPS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* For fuzz/smoke.c: 0 when the inputs run so far reached the step reader
 * both ways (a step read, a step refused), else 1 with what is missing. */
int px_fuzz_smoke_check(void);

static size_t steps_read, steps_refused;

int px_fuzz_smoke_check(void)
{
    fprintf(stderr, "heal.step records: %zu read, %zu refused\n", steps_read, steps_refused);
    return steps_read && steps_refused ? 0 : 1;
}

static bool wait_ok(double wait, double of)
{
    return isnan(wait) || (wait >= 0 && !(wait > of));
}

/* What every accepted sample holds. */
static void check_sample(const px_heal_sample *s, double wall)
{
    uint32_t n = s->n_stages;
    if (n < 1 || n > PX_RT_MAX_STAGES || !(s->t_s >= 0) || !(wall >= 0) ||
        s->context > (uint64_t)s->rows << 24)
        __builtin_trap();
    for (uint32_t i = 0; i <= n; i++) {
        if (i < n && (s->compute_s[i] < 0 || !wait_ok(s->wait_s[i], s->compute_s[i])))
            __builtin_trap();
        if (s->xfer_s[i] < 0 || !wait_ok(s->xfer_wait_s[i], s->xfer_s[i]))
            __builtin_trap();
    }
    /* Written back as replay's writer writes it, it reads back the same. */
    json_t *j = px__hr_sample_json(s, wall);
    if (!j)
        return;
    px_heal_sample again;
    double wall2 = 0;
    px_status st = px__hr_sample_from_json(j, "again", &again, &wall2, NULL);
    json_decref(j);
    if (st != PX_OK || memcmp(s, &again, sizeof again) != 0 || memcmp(&wall, &wall2, sizeof wall))
        __builtin_trap();
}

static void detect(const px_heal_sample *steps, size_t n)
{
    px_heal_envelope env;
    memset(&env, 0, sizeof env);
    env.n_stages = steps[0].n_stages;
    for (uint32_t i = 0; i <= PX_RT_MAX_STAGES; i++) {
        if (i < PX_RT_MAX_STAGES)
            env.compute_p50[i] = env.compute_hi[i] = i < env.n_stages ? 0.001 : NAN;
        env.xfer_p50[i] = env.xfer_hi[i] = NAN;
    }
    for (uint32_t i = 0; i < env.n_stages; i++)
        snprintf(env.device[i], sizeof env.device[i], "local.dev%u", i % 3);
    px_heal_detector_opts o = {
        .baseline_steps = 4, .ratio = 2.0, .floor_s = 0.0005, .confirm = 2, .stale_ratio = 3.0};
    px_heal_finding f;
    json_t *out = NULL;
    if (px__hr_detect(&env, &o, steps, n, &f, &out, NULL) == PX_OK && !out)
        __builtin_trap();
    json_decref(out);
}

static void step_records(const uint8_t *data, size_t size)
{
    static px_heal_sample steps[MAX_STEPS];
    size_t n_steps = 0;
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        json_t *ev = json_loadb(p, len, 0, NULL);
        p += len + (nl != NULL);
        const char *name = json_string_value(json_object_get(ev, "name"));
        if (!name || strncmp(name, "heal.step.", 10) != 0) {
            json_decref(ev);
            continue;
        }
        px_heal_sample s;
        double wall = 0;
        px_err err;
        px_err_clear(&err);
        if (px__hr_sample_from_json(json_object_get(ev, "data"), name, &s, &wall, &err) != PX_OK) {
            /* Every refusal names the record (a long name is cut). */
            if (!strstr(err.msg, "step record \"heal.step."))
                __builtin_trap();
            steps_refused++;
        } else {
            check_sample(&s, wall);
            steps_read++;
            if (n_steps < MAX_STEPS)
                steps[n_steps++] = s;
        }
        json_decref(ev);
    }
    if (n_steps)
        detect(steps, n_steps);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_trace_limits lim = {.max_line = 1 << 16, .max_events = 10000};
    px_trace_reader *r;
    if (px_trace_reader_open_memory((const char *)data, size, "fuzz", &lim, &r, NULL) == PX_OK) {
        px_trace_event ev;
        bool done = false;
        while (!done && px_trace_next(r, &ev, &done, NULL) == PX_OK)
            ;
        px_trace_reader_free(r);
    }
    step_records(data, size);
    return 0;
}
