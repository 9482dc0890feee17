/*
 * A real PostgreSQL server for tests: initdb and pg_ctl (Debian's
 * /usr/lib/postgresql/VERSION/bin) in a temporary folder, listening on a
 * Unix socket in that folder only (no TCP), run as an unprivileged user
 * (initdb refuses root: as root the server runs as `nobody`, the folder
 * owned by it), stopped and removed at exit (by a watchdog when the test
 * is killed).  When PostgreSQL is not
 * installed, pg_harness_start returns false with the reason, and the test
 * skips with that message.
 *
 *     pg_harness pg;
 *     if (!pg_harness_start(&pg)) { skip(); }
 *     char *uri = pg_harness_database(&pg, "jobs");   // a fresh database
 *     ... px__store_pg_open(uri, ...) or plexus server --store URI ...
 *     free(uri);
 *
 * One server per test process, shared by its tests (each takes a database
 * of its own); pg_harness_stop runs at exit too.
 */
#ifndef PX_PG_HARNESS_H
#define PX_PG_HARNESS_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct pg_harness {
    char bin[256]; /* the folder of initdb and pg_ctl */
    char root[64]; /* the temporary folder: data/, the socket, the log */
    char why[256]; /* why it could not start */
    uid_t uid;     /* the user the server runs as */
    gid_t gid;
    bool running;
} pg_harness;

static pg_harness *pg_harness_current;

/* The newest /usr/lib/postgresql/VERSION/bin holding initdb. */
static inline bool pg_harness_find_bin(pg_harness *h)
{
    DIR *d = opendir("/usr/lib/postgresql");
    int best = -1;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char *end;
            long v = strtol(e->d_name, &end, 10);
            char path[300];
            snprintf(path, sizeof path, "/usr/lib/postgresql/%s/bin/initdb", e->d_name);
            if (end != e->d_name && !*end && v > best && access(path, X_OK) == 0)
                best = (int)v;
        }
        closedir(d);
    }
    if (best < 0) {
        snprintf(h->why, sizeof h->why,
                 "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb; "
                 "scripts/install-deps installs it)");
        return false;
    }
    snprintf(h->bin, sizeof h->bin, "/usr/lib/postgresql/%d/bin", best);
    return true;
}

/* Runs argv as the harness's user with a clean environment, output to
 * ROOT/log; its exit status. */
static inline int pg_harness_run(pg_harness *h, char *const argv[])
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char log[128];
        snprintf(log, sizeof log, "%s/log", h->root);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (geteuid() == 0 &&
            (setgroups(0, NULL) != 0 || setgid(h->gid) != 0 || setuid(h->uid) != 0))
            _exit(126);
        /* A clean environment: the database server must not carry the
         * test's tokens where another process of its user (a job run as
         * nobody, say) can read them. */
        char *const env[] = {"PATH=/usr/bin:/bin", "LC_ALL=C", NULL};
        execve(argv[0], argv, env);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static inline void pg_harness_stop(pg_harness *h)
{
    if (!h || !h->root[0])
        return;
    if (h->running) {
        char data[128], pg_ctl[300];
        snprintf(data, sizeof data, "%s/data", h->root);
        snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", h->bin);
        char *argv[] = {pg_ctl, "-D", data, "-m", "immediate", "-w", "stop", NULL};
        pg_harness_run(h, argv);
        h->running = false;
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", h->root);
    if (system(cmd) != 0)
        fprintf(stderr, "pg_harness: could not remove %s\n", h->root);
    h->root[0] = '\0';
}

static inline void pg_harness_at_exit(void)
{
    pg_harness_stop(pg_harness_current);
}

/* A test killed by its time limit runs no atexit handler: a watchdog,
 * detached from the test's process tree, stops the server and removes
 * its folder once the test's end of a pipe closes (at any exit). */
static inline void pg_harness_watch(pg_harness *h)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return;
    pid_t pid = fork();
    if (pid == 0) {
        if (fork() != 0)
            _exit(0);
        setsid();
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++)
            dup2(null, fd);
        for (int fd = 3; fd < 1024; fd++)
            if (fd != p[0])
                close(fd);
        char c;
        while (read(p[0], &c, 1) < 0 && errno == EINTR) {
        }
        pg_harness_stop(h);
        _exit(0);
    }
    close(p[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    /* p[1] stays open for the life of the test process. */
}

/* Starts the server; false (with h->why) when it cannot. */
static inline bool pg_harness_start(pg_harness *h)
{
    memset(h, 0, sizeof *h);
    if (!pg_harness_find_bin(h))
        return false;
    h->uid = geteuid();
    h->gid = getegid();
    if (h->uid == 0) {
        struct passwd *pw = getpwnam("nobody");
        if (!pw) {
            snprintf(h->why, sizeof h->why, "no user \"nobody\" to run PostgreSQL as");
            return false;
        }
        h->uid = pw->pw_uid;
        h->gid = pw->pw_gid;
    }
    snprintf(h->root, sizeof h->root, "/tmp/px-pg-XXXXXX");
    if (!mkdtemp(h->root) || chown(h->root, h->uid, h->gid) != 0) {
        snprintf(h->why, sizeof h->why, "cannot make a folder for PostgreSQL: %s", strerror(errno));
        h->root[0] = '\0';
        return false;
    }
    pg_harness_current = h;
    atexit(pg_harness_at_exit);
    char data[128], initdb[300], pg_ctl[300], opts[256], log[128];
    snprintf(data, sizeof data, "%s/data", h->root);
    snprintf(initdb, sizeof initdb, "%s/initdb", h->bin);
    snprintf(pg_ctl, sizeof pg_ctl, "%s/pg_ctl", h->bin);
    snprintf(log, sizeof log, "%s/server.log", h->root);
    /* The socket in our folder, no TCP at all; fsync stays on, as in
     * production, so the durability tests mean something. */
    snprintf(opts, sizeof opts,
             "-k %s -c listen_addresses= -p 5432 -c max_connections=200 -c fsync=on", h->root);
    char *init_argv[] = {
        initdb, "-D", data, "-U", "plexus", "--auth=trust", "-E", "UTF8", "-N", "--no-instructions",
        NULL};
    char *start_argv[] = {pg_ctl, "-D", data, "-o", opts,    "-l",
                          log,    "-w", "-t", "60", "start", NULL};
    if (pg_harness_run(h, init_argv) != 0) {
        snprintf(h->why, sizeof h->why, "initdb failed (see %s/log)", h->root);
        return false;
    }
    if (pg_harness_run(h, start_argv) != 0) {
        snprintf(h->why, sizeof h->why, "pg_ctl start failed (see %s/server.log)", h->root);
        return false;
    }
    h->running = true;
    pg_harness_watch(h);
    return true;
}

/* The URI of a fresh database `name` ([a-z0-9_]) on the harness's server
 * (owned; free()), or NULL with the reason on stderr. */
static inline char *pg_harness_database(pg_harness *h, const char *name)
{
    char admin[200];
    snprintf(admin, sizeof admin, "host=%s port=5432 user=plexus dbname=postgres", h->root);
    PGconn *c = PQconnectdb(admin);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "pg_harness: %s", PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    char sql[160];
    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s", name);
    PQclear(PQexec(c, sql));
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
    PGresult *r = PQexec(c, sql);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "pg_harness: %s", PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(c);
    if (!ok)
        return NULL;
    size_t n = strlen(h->root) + strlen(name) + 64;
    char *uri = malloc(n);
    if (uri)
        snprintf(uri, n, "postgresql://plexus@/%s?host=%s&port=5432", name, h->root);
    return uri;
}

#endif
