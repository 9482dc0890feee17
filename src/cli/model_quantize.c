/* `plexus model quantize IN OUT --type T` (src/cli/cmd_model.c reads
 * the command line and calls here). */
#include "cli/cli.h"
#include "plexus/rt.h"

int px__cmd_model_quantize(const char *in, const char *out, const char *type, px_cli_format fmt)
{
    px_err err;
    px_rt_quantize_stats st;
    if (px_rt_quantize_file(in, out, type, &st, &err) != PX_OK)
        return px__cli_fail("model quantize", &err);
    if (fmt != PX_CLI_TEXT) {
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
        int rc = px__cli_print_doc(j, fmt);
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
