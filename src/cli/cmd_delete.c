/* plexus delete: end jobs or deployments by kind and name, as kubectl
 * does, asking first on a terminal. */
#include "cli/fleet_cli.h"

#include <strings.h>
#include <unistd.h>

const char px__cmd_delete_summary[] = "delete jobs (cancel them) or deployments (undeploy them)";

static px__fleet_cli o;
static bool yes;
static const px_cli_opt opts[] = {
    PX_CLI_OPT("yes", 'y', PX_CLI_FLAG, &yes, NULL,
               "delete without asking (needed where stdin is not a terminal)"),
    PX__FLEET_CLI_OPTS(o),
    {0},
};
static const px_cli_spec spec = {
    .name = "delete",
    .synopsis = "KIND NAME... [options] | KIND/NAME... [options]",
    .about = "Deletes fleet objects.  KIND is job (or jobs, j) or deployment (or deployments,\n"
             "deploy).  Deleting a job cancels it: agents kill its process groups at their next\n"
             "heartbeat, and its record stays in `plexus jobs` with the state cancelled; a job\n"
             "that already ended cannot be deleted.  Deleting a deployment ends it as\n"
             "`plexus undeploy` does.\n"
             "\n"
             "On a terminal, delete names what it will delete and asks for y; --yes skips\n"
             "the question.  Where stdin is not a terminal (a script, a pipe), nothing is\n"
             "asked and --yes is required: without it nothing is deleted (exit 2).",
    .opts = opts,
    .operands = "KIND NAME",
    .min_operands = 1,
    .max_operands = -1,
    .examples = "plexus delete job j-000012                 # asks first on a terminal\n"
                "plexus delete jobs j-000012 j-000013 --yes\n"
                "plexus delete deployment/llama-chat --yes  # as plexus undeploy llama-chat\n",
    .more = "exit status: 0 every object deleted; 1 one could not be (the others still are),\n"
            "or the question was answered no; 2 bad usage, or --yes missing without a "
            "terminal.",
};
const px_cli_spec *const px__cmd_delete_specs[] = {&spec, NULL};

typedef enum kind { KIND_JOB, KIND_DEPLOYMENT } kind;

static const char *const kind_words[] = {"job",         "jobs",   "j", "deployment",
                                         "deployments", "deploy", NULL};

static bool parse_kind(const char *s, size_t len, kind *k)
{
    for (size_t i = 0; kind_words[i]; i++)
        if (strlen(kind_words[i]) == len && !strncmp(kind_words[i], s, len)) {
            *k = i < 3 ? KIND_JOB : KIND_DEPLOYMENT;
            return true;
        }
    return false;
}

static int bad_kind(const char *s, size_t len)
{
    char word[64];
    snprintf(word, sizeof word, "%.*s", (int)PX_MIN(len, sizeof word - 1), s);
    const char *near = px__cli_nearest(word, kind_words);
    return px__cli_usage_error("delete", "\"%s\" is not a kind to delete: job or deployment%s%s%s",
                               word, near ? " (did you mean " : "", near ? near : "",
                               near ? "?)" : "");
}

typedef struct target {
    kind k;
    const char *name;
} target;

/* Asks on the terminal; true when the answer is y or yes. */
static bool confirm(const target *t, int n)
{
    fprintf(stderr, "delete");
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%s %s %s", i ? "," : "", t[i].k == KIND_JOB ? "job" : "deployment",
                t[i].name);
    fprintf(stderr, "? [y/N] ");
    fflush(stderr);
    char line[32];
    if (!fgets(line, sizeof line, stdin))
        return false;
    line[strcspn(line, "\r\n")] = '\0';
    return !strcasecmp(line, "y") || !strcasecmp(line, "yes");
}

static int delete_one(px_fleet_client *c, const target *t)
{
    char path[256];
    json_t *reply;
    if (t->k == KIND_JOB) {
        snprintf(path, sizeof path, "/v1/jobs/%s/cancel", t->name);
        json_t *body = json_object();
        reply = px__fleet_cli_get(&o, c, "POST", path, body);
        json_decref(body);
    } else {
        snprintf(path, sizeof path, "/v1/deployments/%s", t->name);
        reply = px__fleet_cli_get(&o, c, "DELETE", path, NULL);
    }
    if (!reply)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (o.format != PX_CLI_TEXT)
        rc = px__fleet_cli_print(&o, reply);
    else if (json_object_get(reply, "cancel"))
        /* A replica that does not schedule took it; the scheduler had not
         * stopped the job yet when it answered (as for plexus cancel). */
        printf("job %s %s (cancellation requested)\n", t->name,
               px__fleet_cli_str(reply, "state", "?"));
    else
        printf("%s %s %s\n", t->k == KIND_JOB ? "job" : "deployment", t->name,
               px__fleet_cli_str(reply, "state", "deleted"));
    json_decref(reply);
    return rc;
}

int px__cmd_delete(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "delete"};
    yes = false;
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    /* KIND NAME... or KIND/NAME... (each with its own kind). */
    target *t = calloc((size_t)args.n, sizeof *t);
    if (!t)
        return PX_EXIT_FAIL;
    int n = 0, rc = PX_EXIT_OK;
    kind k = KIND_JOB;
    bool have_kind = false;
    for (int i = 0; i < args.n && rc == PX_EXIT_OK; i++) {
        const char *a = args.v[i], *slash = strchr(a, '/');
        if (slash) {
            if (!parse_kind(a, (size_t)(slash - a), &t[n].k)) {
                rc = bad_kind(a, (size_t)(slash - a));
                break;
            }
            t[n++].name = slash + 1;
        } else if (i == 0) {
            if (!parse_kind(a, strlen(a), &k))
                rc = bad_kind(a, strlen(a));
            have_kind = true;
            continue;
        } else if (!have_kind) {
            rc = px__cli_usage_error("delete",
                                     "\"%s\" has no kind: write job/%s or put the kind "
                                     "first (plexus delete job %s)",
                                     a, a, a);
            break;
        } else {
            t[n].k = k;
            t[n++].name = a;
        }
        if (!px__fleet_cli_valid_id(t[n - 1].name))
            rc = px__cli_usage_error("delete", "\"%s\" is not a %s name", t[n - 1].name,
                                     t[n - 1].k == KIND_JOB ? "job" : "deployment");
    }
    if (rc == PX_EXIT_OK && n == 0)
        rc = px__cli_usage_error("delete",
                                 "nothing to delete: name at least one %s after the "
                                 "kind (plexus delete job j-000012)",
                                 have_kind && k == KIND_DEPLOYMENT ? "deployment" : "job");
    if (rc == PX_EXIT_OK && !yes) {
        if (!isatty(STDIN_FILENO))
            rc = px__cli_usage_error("delete",
                                     "stdin is not a terminal to confirm on: pass --yes to delete "
                                     "%s %s%s",
                                     t[0].k == KIND_JOB ? "job" : "deployment", t[0].name,
                                     n > 1 ? " and the others" : "");
        else if (!confirm(t, n)) {
            fprintf(stderr, "plexus delete: nothing deleted\n");
            rc = PX_EXIT_FAIL;
        }
    }
    if (rc != PX_EXIT_OK) {
        free(t);
        return rc;
    }
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c) {
        free(t);
        return PX_EXIT_FAIL;
    }
    for (int i = 0; i < n; i++)
        if (delete_one(c, &t[i]) != PX_EXIT_OK)
            rc = PX_EXIT_FAIL;
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    free(t);
    return rc;
}
