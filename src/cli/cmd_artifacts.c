/* plexus artifacts: list a job's artifacts, or fetch one. */
#include "cli/fleet_cli.h"

#include <unistd.h>

const char px__cmd_artifacts_summary[] =
    "list a job's artifacts, or fetch one (--get NAME --out FILE)";

static px__fleet_cli o;
static const char *get, *out;
static const px_cli_opt opts[] = {
    PX_CLI_OPT("get", 0, PX_CLI_STR, &get, "NAME", "fetch the artifact NAME (with --out)"),
    PX_CLI_OPT("out", 0, PX_CLI_STR, &out, "FILE", "where --get writes it (\"-\" for stdout)"),
    PX__FLEET_CLI_OPTS(o),
    {0},
};
static const px_cli_spec spec = {
    .name = "artifacts",
    .synopsis = "JOB [--get NAME --out FILE] [options]",
    .about = "Lists the files the job declared with --artifact and its agents uploaded (name,\n"
             "size, SHA-256, rank, attempt).  With --get, writes one to FILE.",
    .opts = opts,
    .operands = "JOB",
    .min_operands = 1,
    .max_operands = 1,
    .examples = "plexus artifacts j-000012\n"
                "plexus artifacts j-000012 --get metrics.json --out metrics.json\n",
};
const px_cli_spec *const px__cmd_artifacts_specs[] = {&spec, NULL};

int px__cmd_artifacts(int argc, char **argv)
{
    o = (px__fleet_cli){.cmd = "artifacts"};
    get = out = NULL;
    px_cli_args args;
    int prc;
    if (!px__cli_parse(&spec, argc, argv, &args, &prc))
        return prc;
    const char *id = args.v[0];
    if (!px__fleet_cli_valid_id(id))
        return px__cli_usage_error("artifacts", "\"%s\" is not a job id (e.g. j-000012)", id);
    if (get && !out)
        return px__cli_usage_error("artifacts",
                                   "--get NAME needs --out FILE (or --out - for stdout)");
    if (out && !get)
        return px__cli_usage_error("artifacts", "--out goes with --get NAME");
    px_fleet_client *c = px__fleet_cli_connect(&o);
    if (!c)
        return PX_EXIT_FAIL;
    int rc = PX_EXIT_OK;
    if (get) {
        char *esc = px_fleet_url_escape(get);
        char path[2048];
        snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/%s", id, esc ? esc : "");
        free(esc);
        px_err err;
        if (!strcmp(out, "-")) {
            char tmpl[] = "/tmp/plexus-artifact-XXXXXX";
            int fd = mkstemp(tmpl);
            if (fd < 0) {
                px_err_set(&err, PX_EIO, "cannot create a temporary file");
                rc = px__cli_fail("artifacts", &err);
            } else {
                close(fd);
                if (px_fleet_client_download(c, path, tmpl, NULL, &err) != PX_OK) {
                    rc = px__cli_fail("artifacts", &err);
                } else {
                    char *data;
                    size_t len;
                    if (px_read_file(tmpl, (size_t)1 << 32, &data, &len, &err) == PX_OK) {
                        fwrite(data, 1, len, stdout);
                        free(data);
                    } else {
                        rc = px__cli_fail("artifacts", &err);
                    }
                }
                unlink(tmpl);
            }
        } else if (px_fleet_client_download(c, path, out, NULL, &err) != PX_OK) {
            rc = px__cli_fail("artifacts", &err);
        } else {
            px__cli_wrote("artifacts", out, get);
        }
        px_fleet_client_free(c);
        px__fleet_cli_release(&o);
        return rc;
    }
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", id);
    json_t *reply = px__fleet_cli_get(&o, c, "GET", path, NULL);
    px_fleet_client_free(c);
    px__fleet_cli_release(&o);
    if (!reply)
        return PX_EXIT_FAIL;
    if (o.format != PX_CLI_TEXT) {
        rc = px__fleet_cli_print(&o, reply);
    } else {
        const json_t *list = json_object_get(reply, "artifacts");
        if (!json_array_size(list))
            printf("job %s has no artifacts\n", id);
        size_t i;
        json_t *a;
        json_array_foreach(list, i, a)
        {
            char size[32];
            px__fleet_cli_bytes(json_number_value(json_object_get(a, "size")), size, sizeof size);
            printf("%-32s %10s  %.16s  rank %lld  attempt %lld\n",
                   px__fleet_cli_str(a, "name", "?"), size, px__fleet_cli_str(a, "sha256", ""),
                   (long long)json_integer_value(json_object_get(a, "rank")),
                   (long long)json_integer_value(json_object_get(a, "attempt")));
        }
    }
    json_decref(reply);
    return rc;
}
