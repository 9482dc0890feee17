/* `plexus model quantize IN OUT --type T` (src/cli/cmd_model.c
 * dispatches here). */
#include "cli/cli.h"
#include "plexus/rt.h"

int px__cmd_model_quantize(int argc, char **argv)
{
    const char *cmd = "model quantize";
    const char *in = NULL, *out = NULL, *type = NULL;
    px_cli_format fmt = PX_CLI_TEXT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--type") || !strcmp(a, "-t")) {
            if (i + 1 >= argc)
                return px__cli_usage_error(cmd, "%s needs q8_0, q4_0, q4_k_m, q5_k_m or q6_k", a);
            type = argv[++i];
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc || !px__cli_parse_format(cmd, argv[++i], &fmt))
                return PX_EXIT_USAGE;
        } else if (a[0] == '-' && a[1]) {
            return px__cli_usage_error(cmd, "unknown option \"%s\"", a);
        } else if (!in) {
            in = a;
        } else if (!out) {
            out = a;
        } else {
            return px__cli_usage_error(cmd, "unexpected argument \"%s\"", a);
        }
    }
    if (!in || !out)
        return px__cli_usage_error(cmd, "name the model to read and the file to write: IN OUT");
    if (!type)
        return px__cli_usage_error(cmd, "choose the recipe with --type (q8_0, q4_0, q4_k_m, "
                                        "q5_k_m or q6_k)");
    px_err err;
    px_rt_quantize_stats st;
    if (px_rt_quantize_file(in, out, type, &st, &err) != PX_OK)
        return px__cli_fail("model quantize", &err);
    if (fmt == PX_CLI_JSON) {
        json_t *j = json_object(), *by = json_object();
        for (int t = 0; t < PX_DTYPE_COUNT_; t++)
            if (st.n_by_dtype[t])
                px_json_set(by, px_dtype_name((px_dtype)t), json_integer(st.n_by_dtype[t]));
        px_json_set(j, "input", json_string(in));
        px_json_set(j, "output", json_string(out));
        px_json_set(j, "type", json_string(type));
        px_json_set(j, "tensors", json_integer(st.n_tensors));
        px_json_set(j, "quantized", json_integer(st.n_quantized));
        px_json_set(j, "tensors_by_dtype", by);
        px_json_set(j, "bytes_in", json_integer((json_int_t)st.bytes_in));
        px_json_set(j, "bytes_out", json_integer((json_int_t)st.bytes_out));
        px_json_set(j, "rmse", json_real(st.rmse));
        int rc = px__cli_print_json(j);
        json_decref(j);
        return rc;
    }
    printf("%s -> %s (%s): %u tensors, %u quantized;", in, out, type, st.n_tensors, st.n_quantized);
    for (int t = 0; t < PX_DTYPE_COUNT_; t++)
        if (st.n_by_dtype[t])
            printf(" %u %s", st.n_by_dtype[t], px_dtype_name((px_dtype)t));
    printf("\n%.4g MB -> %.4g MB of tensor data; rmse %.6g over %" PRIu64 " values\n",
           (double)st.bytes_in / 1e6, (double)st.bytes_out / 1e6, st.rmse, st.n_values);
    return PX_EXIT_OK;
}
