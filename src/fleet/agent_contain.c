/*
 * What keeps jobs apart from the agent and from each other, set up once
 * when the agent starts:
 *
 *   - the agent is not dumpable: a process of its uid cannot read its
 *     memory or environment (/proc/PID/mem, environ) nor ptrace it;
 *   - the agent is a subreaper, so a process that escapes its job's
 *     supervisor comes to the agent, which ends it (px__proc_sweep);
 *   - with a job user (the agent runs as root), every job runs under that
 *     uid, in a folder it owns, unable to read the agent's state;
 *   - where the cgroup v2 hierarchy is writable, each job gets a cgroup of
 *     its own under one folder of this agent, and the leftovers of an
 *     earlier run of the agent (killed with its supervisors) are killed
 *     when it starts again.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

static px_status resolve_user(px__agent *a, const char *who, px_err *err)
{
    struct passwd pw, *res = NULL;
    char buf[4096];
    char *end;
    long num = strtol(who, &end, 10);
    int rc = *who && !*end ? getpwuid_r((uid_t)num, &pw, buf, sizeof buf, &res)
                           : getpwnam_r(who, &pw, buf, sizeof buf, &res);
    if (rc != 0 || !res)
        return px_err_set(err, PX_EINVAL, "--job-user \"%s\": no such user on this node", who);
    a->uid = pw.pw_uid;
    a->gid = pw.pw_gid;
    int n = 64;
    a->groups = calloc((size_t)n, sizeof *a->groups);
    if (!a->groups)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    if (getgrouplist(pw.pw_name, pw.pw_gid, a->groups, &n) < 0) {
        gid_t *g = realloc(a->groups, (size_t)n * sizeof *g);
        if (!g)
            return px_err_set(err, PX_ENOMEM, "out of memory");
        a->groups = g;
        if (getgrouplist(pw.pw_name, pw.pw_gid, a->groups, &n) < 0)
            n = 0;
    }
    a->n_groups = n;
    return PX_OK;
}

static bool user_may_enter(const px__agent *a, const struct stat *sb)
{
    if (sb->st_mode & S_IXOTH)
        return true;
    if (sb->st_uid == a->uid)
        return (sb->st_mode & S_IXUSR) != 0;
    bool member = sb->st_gid == a->gid;
    for (int i = 0; i < a->n_groups && !member; i++)
        member = a->groups[i] == sb->st_gid;
    return member && (sb->st_mode & S_IXGRP);
}

/* The job user must be able to walk down to its folders and to the
 * models in the cache. */
static px_status check_reach(const px__agent *a, const char *dir, px_err *err)
{
    char *real = realpath(dir, NULL);
    if (!real)
        return px_err_set(err, PX_EIO, "%s: %s", dir, strerror(errno));
    px_status st = PX_OK;
    for (char *p = real;;) {
        char *slash = strchr(p + 1, '/');
        if (slash)
            *slash = '\0';
        struct stat sb;
        if (stat(*real ? real : "/", &sb) == 0 && !user_may_enter(a, &sb)) {
            st = px_err_set(err, PX_EINVAL,
                            "the job user (uid %u) cannot enter %s (mode %04o, owner %u), on the "
                            "way to %s: choose a --work folder it can reach, or open it with "
                            "chmod o+x %s",
                            (unsigned)a->uid, real, (unsigned)(sb.st_mode & 07777),
                            (unsigned)sb.st_uid, dir, real);
            break;
        }
        if (!slash)
            break;
        *slash = '/';
        p = slash;
    }
    free(real);
    return st;
}

/* The first folder on the way to path (every component but the last,
 * through the links as given) that the job user cannot search, or the
 * file itself when it cannot execute it; false when none.  *sb gets that
 * one's status, bad its name. */
static bool blocked_on_way(const px__agent *a, const char *path, struct stat *sb, char *bad,
                           size_t n)
{
    char *p = px_strdup(path);
    if (!p)
        return false;
    bool blocked = false;
    for (char *s = p + 1; !blocked; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char keep = *s;
        *s = '\0';
        if (stat(p, sb) == 0 && !user_may_enter(a, sb)) {
            px_strlcpy(bad, p, n);
            blocked = true;
        }
        if (!keep)
            break;
        *s = keep;
    }
    free(p);
    return blocked;
}

/* A path the job user must be able to run: searchable folders on the way,
 * as given (each link is read from its folder) and as resolved, and an
 * executable file. */
static px_status check_path(const px__agent *a, const char *path, const char *what, px_err *err)
{
    struct stat sb;
    char bad[PATH_MAX];
    char *real = realpath(path, NULL);
    bool blocked = blocked_on_way(a, path, &sb, bad, sizeof bad) ||
                   (real && blocked_on_way(a, real, &sb, bad, sizeof bad));
    px_status st = PX_OK;
    if (blocked)
        st = px_err_set(err, PX_EINVAL,
                        "%s %s%s%s cannot be run by the job user (uid %u): it cannot %s %s "
                        "(mode %04o, owner %u); install it where every user can run it (a "
                        "system python3, /usr/bin/python3) and name that path in the node's "
                        "inventory (python.path), or open the way with chmod o+x %s",
                        what, path, real && strcmp(real, path) ? " -> " : "",
                        real && strcmp(real, path) ? real : "", (unsigned)a->uid,
                        S_ISDIR(sb.st_mode) ? "enter" : "execute", bad,
                        (unsigned)(sb.st_mode & 07777), (unsigned)sb.st_uid, bad);
    free(real);
    return st;
}

px_status px__agent_job_user_may_run(const px__agent *a, const char *program, const char *what,
                                     char **resolved, px_err *err)
{
    if (resolved)
        *resolved = NULL;
    if (!a->set_user || !program || !program[0])
        return PX_OK;
    if (strchr(program, '/'))
        return check_path(a, program, what, err);
    /* A bare name is looked up on the PATH the job gets (the agent's), as
     * the job user's own lookup would: past entries it cannot run. */
    const char *env = getenv("PATH");
    char *dirs = px_strdup(env && env[0] ? env : "/usr/local/bin:/usr/bin:/bin");
    if (!dirs)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    px_status first = PX_OK;
    px_err first_err = {0};
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        char *c = px_asprintf("%s/%s", d, program);
        if (!c || access(c, X_OK) != 0) {
            free(c);
            continue;
        }
        px_err e;
        px_status st = check_path(a, c, what, &e);
        if (st == PX_OK) {
            free(dirs);
            if (resolved)
                *resolved = c;
            else
                free(c);
            return PX_OK;
        }
        if (first == PX_OK) {
            first = st;
            first_err = e;
        }
        free(c);
    }
    free(dirs);
    if (first != PX_OK && err)
        *err = first_err;
    return first; /* PX_OK when not found at all: the start says so */
}

static px_status make_dir(const char *path, mode_t mode, px_err *err)
{
    char *p = px_strdup(path);
    if (!p)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char keep = *s;
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                px_status st = px_err_set(err, PX_EIO, "%s: cannot create: %s", p, strerror(errno));
                free(p);
                return st;
            }
            if (!keep)
                break;
            *s = keep;
        }
    }
    free(p);
    struct stat sb;
    if (stat(path, &sb) == 0 && sb.st_uid == geteuid() && (sb.st_mode & 07777) != mode &&
        chmod(path, mode) != 0)
        return px_err_set(err, PX_EIO, "%s: cannot set its mode: %s", path, strerror(errno));
    return PX_OK;
}

/* ---- cgroup v2 ---- */

static char *cgroup2_mount(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return NULL;
    char line[4096], *found = NULL;
    while (!found && fgets(line, sizeof line, f)) {
        /* "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - FSTYPE SOURCE SUPER" */
        char *dash = strstr(line, " - cgroup2 ");
        if (!dash)
            continue;
        char root[1024], point[1024];
        if (sscanf(line, "%*s %*s %*s %1023s %1023s", root, point) == 2 && !strcmp(root, "/"))
            found = px_strdup(point);
    }
    fclose(f);
    return found;
}

static char *own_cgroup(void)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return NULL;
    char line[4096], *found = NULL;
    while (!found && fgets(line, sizeof line, f))
        if (px_str_starts_with(line, "0::")) {
            line[strcspn(line, "\n")] = '\0';
            found = px_strdup(line + 3);
        }
    fclose(f);
    return found;
}

/* Kills what is left in a job's cgroup and removes it. */
static bool end_cgroup(const char *path)
{
    char kill_path[PATH_MAX];
    snprintf(kill_path, sizeof kill_path, "%s/cgroup.kill", path);
    int fd = open(kill_path, O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)!write(fd, "1", 1);
        close(fd);
    }
    for (int i = 0; i < 400; i++) {
        if (rmdir(path) == 0 || errno == ENOENT)
            return true;
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return false;
}

static void setup_cgroups(px__agent *a)
{
    char *mount = cgroup2_mount(), *own = own_cgroup();
    char *root = NULL;
    if (!mount || !own) {
        px_log_info("agent: no cgroup v2 hierarchy; jobs are contained by their supervisor "
                    "(process group and subreaper)");
        goto done;
    }
    /* One folder per agent: its name and work folder tell it from another
     * agent on the same machine, and stay the same when it restarts. */
    px_digest d;
    px_sha256(a->work_dir, strlen(a->work_dir), &d);
    char hex[65];
    px_digest_hex(&d, hex);
    root = px_asprintf("%s%s/plexus-%s-%.12s", mount, strcmp(own, "/") ? own : "", a->node_id, hex);
    char probe[PATH_MAX], kill_file[PATH_MAX];
    snprintf(probe, sizeof probe, "%s/.probe", root ? root : "");
    snprintf(kill_file, sizeof kill_file, "%s/cgroup.kill", root ? root : "");
    if (!root || (mkdir(root, 0755) != 0 && errno != EEXIST) || access(kill_file, W_OK) != 0 ||
        (mkdir(probe, 0755) != 0 && errno != EEXIST) || rmdir(probe) != 0) {
        px_log_info("agent: cgroup v2 at %s is not writable here (or has no cgroup.kill); jobs "
                    "are contained by their supervisor (process group and subreaper)",
                    mount);
        if (root)
            rmdir(root);
        free(root);
        root = NULL;
        goto done;
    }
    /* Leftovers of an earlier run of this agent: nothing of theirs may
     * run beside the work the server gives now. */
    DIR *dir = opendir(root);
    struct dirent *e;
    size_t ended = 0;
    while (dir && (e = readdir(dir))) {
        if (e->d_type != DT_DIR || e->d_name[0] == '.')
            continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", root, e->d_name);
        ended += end_cgroup(sub);
    }
    if (dir)
        closedir(dir);
    if (ended)
        px_log_warn("agent: ended %zu job(s) left running by an earlier run of this agent", ended);
    px_log_info("agent: each job runs in a cgroup of its own under %s", root);
done:
    a->cgroup_root = root;
    free(mount);
    free(own);
}

px_status px__agent_job_cgroup(px__agent *a, const char *key, char **path, px_err *err)
{
    *path = NULL;
    if (!a->cgroup_root)
        return PX_OK;
    char *p = px_asprintf("%s/%s", a->cgroup_root, key);
    if (!p)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    if (mkdir(p, 0755) != 0 && errno == EEXIST && end_cgroup(p))
        mkdir(p, 0755);
    struct stat sb;
    if (stat(p, &sb) != 0) {
        px_status st = px_err_set(err, PX_EIO, "cgroup %s: %s", p, strerror(errno));
        free(p);
        return st;
    }
    *path = p;
    return PX_OK;
}

px_status px__agent_job_dir(px__agent *a, const char *path, px_err *err)
{
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return px_err_set(err, PX_EIO, "%s: cannot create: %s", path, strerror(errno));
    if (a->set_user && chown(path, a->uid, a->gid) != 0)
        return px_err_set(err, PX_EIO, "%s: cannot give it to the job user: %s", path,
                          strerror(errno));
    return PX_OK;
}

void px__agent_as_job_user(const px__agent *a, px__proc_spec *spec)
{
    spec->set_user = a->set_user;
    spec->uid = a->uid;
    spec->gid = a->gid;
    spec->groups = a->groups;
    spec->n_groups = a->n_groups;
}

px_status px__agent_contain_setup(px__agent *a, px_err *err)
{
    const px_fleet_agent_config *cfg = a->cfg;
    /* Nothing of this uid may read the agent's memory, environment or
     * descriptors, nor trace it. */
    if (prctl(PR_SET_DUMPABLE, 0) != 0)
        return px_err_set(err, PX_EIO, "cannot make the agent undumpable: %s", strerror(errno));
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        px_log_warn("agent: cannot become a subreaper: %s", strerror(errno));
    px_status st;
    if (cfg->job_user) {
        if (geteuid() != 0)
            return px_err_set(err, PX_EINVAL,
                              "--job-user %s: the agent must run as root to run jobs as another "
                              "user",
                              cfg->job_user);
        if ((st = resolve_user(a, cfg->job_user, err)) != PX_OK)
            return st;
        a->set_user = a->uid != 0;
        if (!a->set_user)
            px_log_warn("agent: jobs run as root (--job-user %s): a job can read the node "
                        "credential and take over the node",
                        cfg->job_user);
    } else if (geteuid() == 0) {
        return px_err_set(err, PX_EINVAL,
                          "the agent runs as root, so its jobs would too, and could read the "
                          "node's credential: give --job-user USER to run them as USER (or "
                          "--job-user root to accept that)");
    }
    /* The work folder: private, or passable (not readable) for the job user. */
    mode_t pass = a->set_user ? 0711 : 0700;
    if ((st = make_dir(a->work_dir, pass, err)) != PX_OK)
        return st;
    char *jobs = px_asprintf("%s/jobs", a->work_dir);
    if (!jobs)
        return px_err_set(err, PX_ENOMEM, "out of memory");
    st = make_dir(jobs, pass, err);
    if (st == PX_OK && a->set_user)
        st = check_reach(a, jobs, err);
    free(jobs);
    if (st != PX_OK)
        return st;
    setup_cgroups(a);
    return PX_OK;
}

void px__agent_contain_release(px__agent *a)
{
    if (a->cgroup_root)
        rmdir(a->cgroup_root); /* when no job is left in it */
    free(a->cgroup_root);
    free(a->groups);
    a->cgroup_root = NULL;
    a->groups = NULL;
}
