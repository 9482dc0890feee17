/*
 * Helpers the benchmarks share (static; included by bench_*.c): where the
 * plexus binary is, and the emulated fleet agents of the fleet benchmarks.
 */
#ifndef PX_BENCH_UTIL_H
#define PX_BENCH_UTIL_H

#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plexus/base.h"

/* qsort's order of doubles, for the percentiles the benchmarks print. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline void bench_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline int bench__rm_entry(const char *path, const struct stat *sb, int flag,
                                  struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* Removes the folder dir and everything under it (a benchmark's scratch). */
static inline void bench_rm_tree(const char *dir)
{
    nftw(dir, bench__rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* The plexus binary the benchmark starts: $PLEXUS_BIN, or `plexus`
 * beside this benchmark's binary.  False when neither can be named (the
 * caller checks that it runs). */
static inline bool bench_plexus_bin(char *out, size_t cap)
{
    const char *env = getenv("PLEXUS_BIN");
    if (env)
        return (size_t)snprintf(out, cap, "%s", env) < cap;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return false;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    return (size_t)snprintf(out, cap, "%s/plexus", self) < cap;
}

/* Writes the inventory of an emulated CPU-only node named `name` (64 GiB,
 * no device) to path. */
static inline px_status bench_write_cpu_node(const char *path, const char *name)
{
    char *inv = px_asprintf(
        "{\"schema\": \"plexus.inventory/1\", \"emulated\": true, \"nodes\": [{\"id\": \"%s\", "
        "\"memory\": [{\"id\": \"ddr0\", \"kind\": \"ddr\", \"capacity\": \"64 GiB\"}], "
        "\"devices\": []}]}",
        name);
    if (!inv)
        return PX_ENOMEM;
    px_status st = px_write_file(path, inv, strlen(inv), NULL);
    free(inv);
    return st;
}

/* Starts `plexus agent` for node `name` in a process group of its own,
 * its output in log; servers: one URL or several, comma-separated; ca may
 * be NULL.  A root agent runs its jobs as nobody.  Returns its pid, or -1. */
static inline pid_t bench_start_agent(const char *plexus, const char *servers,
                                      const char *join_file, const char *ca, const char *inventory,
                                      const char *name, const char *work, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        unsetenv("PLEXUS_TOKEN");
        const char *argv[20] = {plexus,    "agent",       "--server", servers,  "--join-token-file",
                                join_file, "--inventory", inventory,  "--name", name,
                                "--work",  work};
        int n = 12;
        if (ca) {
            argv[n++] = "--ca";
            argv[n++] = ca;
        }
        if (geteuid() == 0) {
            argv[n++] = "--job-user";
            argv[n++] = "nobody";
        }
        argv[n] = NULL;
        execv(plexus, (char *const *)argv);
        _exit(127);
    }
    if (pid > 0)
        setpgid(pid, pid);
    return pid;
}

#endif
