/*
 * Where the decode benchmarks keep the models they write (static;
 * included by bench_rt_*.c): $PX_BENCH_DIR, or bench-models beside the
 * benchmark's own binary.
 */
#ifndef PX_BENCH_MODELS_H
#define PX_BENCH_MODELS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The folder into out (n bytes); false when the binary's own path cannot
 * be read. */
static inline bool bench_models_dir(char *out, size_t n)
{
    const char *env = getenv("PX_BENCH_DIR");
    if (env) {
        snprintf(out, n, "%s", env);
        return true;
    }
    char self[1024];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return false;
    self[len] = 0;
    char *slash = strrchr(self, '/');
    snprintf(out, n, "%.*s/bench-models", (int)(slash ? slash - self : 0), self);
    return true;
}

#endif
