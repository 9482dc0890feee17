/*
 * Opening a large GGUF file and inspecting it must not read its weights.
 *
 * Writes a synthetic f32 llama model of about 1 GB (in $PX_BENCH_DIR, or a
 * fresh folder under $TMPDIR), then times, over several runs, opening it
 * (header, metadata, tensor table, mmap, graph, cost summary) plus a full
 * inspection (the JSON description with every op and tensor, the cost of a
 * prefill and a decode step of the whole graph, the summary of every row).
 * Prints the times and how much the process's resident and peak memory grew:
 * both stay far below the file size because the weights are mapped, not
 * read.  Deletes the file afterwards.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plexus/ir.h"

/* A benchmark whose set-up fails measures nothing: stop there. */
static void must(px_status st, const char *what)
{
    if (st != PX_OK) {
        fprintf(stderr, "%s: %s: %s\n", __FILE__, what, px_status_str(st));
        exit(1);
    }
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static long peak_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void)
{
    char dir[512];
    const char *env = getenv("PX_BENCH_DIR");
    bool own_dir = !env || !*env;
    if (own_dir) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/plexus-bench-ir-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(dir)) {
            perror("bench_ir_gguf: mkdtemp");
            return 1;
        }
    } else {
        snprintf(dir, sizeof dir, "%s", env);
    }
    char path[600];
    snprintf(path, sizeof path, "%s/bench-1g.gguf", dir);

    /* dim 2048, hidden 5632, 4 layers, 16 heads (4 kv), vocab 32000, tied:
     * 245 M parameters, 983 MB in f32. */
    px_ir_synth_opts o;
    px_ir_synth_defaults(&o);
    o.dim = 2048;
    o.hidden_dim = 5632;
    o.n_layers = 4;
    o.n_heads = 16;
    o.n_kv_heads = 4;
    o.vocab_size = 32000;
    o.context_length = 4096;
    o.tied_classifier = true;
    o.seed = 7;
    px_err err;
    uint64_t t0 = px_now_ns();
    if (px_ir_synth_write(&o, path, &err) != PX_OK) {
        fprintf(stderr, "bench_ir_gguf: %s\n", err.msg);
        return 1;
    }
    double write_s = (double)(px_now_ns() - t0) / 1e9;
    struct stat st;
    stat(path, &st);
    printf("file            %s, %.3f GB (written in %.2f s, %.0f MB/s)\n", path,
           (double)st.st_size / 1e9, write_s, (double)st.st_size / 1e6 / write_s);

    enum { RUNS = 7 };
    double open_ms[RUNS], inspect_ms[RUNS];
    long rss_before = rss_kib(), peak_before = peak_kib(), rss_grow = 0;
    uint64_t sink = 0;
    int rc = 0;
    for (int r = 0; r < RUNS && !rc; r++) {
        uint64_t a = px_now_ns();
        px_ir_model *m;
        if (px_ir_model_open(path, NULL, &m, &err) != PX_OK) {
            fprintf(stderr, "bench_ir_gguf: %s\n", err.msg);
            rc = 1;
            break;
        }
        uint64_t b = px_now_ns();
        const px_ir_layer_cost *rows = px_ir_model_layer_costs(m);
        for (uint32_t i = 0; i < px_ir_model_n_rows(m); i++)
            sink += px_ir_decode_flops(&rows[i], 4096) + px_ir_prefill_flops(&rows[i], 4096) +
                    rows[i].weight_bytes_at[PX_DTYPE_Q4_K];
        px_ir_cost c;
        must(px_ir_graph_cost(m, px_ir_model_phase_dims(m, PX_IR_PHASE_PREFILL, 1, 4096), &c, NULL),
             "graph cost");
        sink += c.flops;
        must(px_ir_graph_cost(m, px_ir_model_phase_dims(m, PX_IR_PHASE_DECODE, 8, 4096), &c, NULL),
             "graph cost");
        sink += c.bytes_read;
        px_ir_describe_opts d = {.with_ops = true, .with_tensors = true};
        json_t *j = px_ir_model_describe(m, &d);
        char *s = px_json_dump_canonical(j);
        sink += s ? strlen(s) : 0;
        free(s);
        json_decref(j);
        uint64_t e = px_now_ns();
        long grow = rss_kib() - rss_before;
        if (grow > rss_grow)
            rss_grow = grow;
        px_ir_model_free(m);
        open_ms[r] = (double)(b - a) / 1e6;
        inspect_ms[r] = (double)(e - a) / 1e6;
    }
    if (!rc) {
        qsort(open_ms, RUNS, sizeof *open_ms, cmp_double);
        qsort(inspect_ms, RUNS, sizeof *inspect_ms, cmp_double);
        printf(
            "open (mmap, parse, graph, summary)   median %.2f ms, min %.2f, max %.2f (%d runs)\n",
            open_ms[RUNS / 2], open_ms[0], open_ms[RUNS - 1], RUNS);
        printf("open + full inspect                  median %.2f ms, min %.2f, max %.2f\n",
               inspect_ms[RUNS / 2], inspect_ms[0], inspect_ms[RUNS - 1]);
        long peak_grow = peak_kib() - peak_before;
        printf("resident memory growth               %.1f MB while open (file %.0f MB, %.3f%%)\n",
               rss_grow / 1024.0, (double)st.st_size / 1e6,
               100.0 * rss_grow * 1024.0 / (double)st.st_size);
        printf("peak resident growth                 %.1f MB\n", peak_grow / 1024.0);
        printf("(checksum %llu)\n", (unsigned long long)(sink & 0xffff));
    }
    unlink(path);
    if (own_dir)
        rmdir(dir);
    return rc;
}
