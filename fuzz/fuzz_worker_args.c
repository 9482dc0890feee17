/* Fuzz target: a worker's command line as a launcher receives it from
 * elsewhere (NUL-separated arguments) must parse into options a worker
 * can run, or be refused cleanly; what parses must build back into a
 * command line that parses to the same options. */
#include "base/common.h"

#include "plexus/rt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[PX_RT_WORKER_MAX_ARGS];
    int argc = 0;
    for (char *p = buf; p <= buf + size && argc < PX_RT_WORKER_MAX_ARGS; p += strlen(p) + 1)
        argv[argc++] = p;
    px_rt_worker_opts o;
    bool secret_stdin;
    px_err err;
    if (px_rt_worker_args_parse(argc, argv, &o, &secret_stdin, &err) == PX_OK) {
        if (o.stage >= PX_RT_MAX_STAGES || o.layer_begin > o.layer_end || !o.listen || !o.next ||
            px_rt_addr_check(o.listen, NULL) != PX_OK || px_rt_addr_check(o.next, NULL) != PX_OK)
            __builtin_trap();
        px_rt_worker_argv av;
        if (px_rt_worker_args_build(&o, NULL, &av, &err) == PX_OK) {
            px_rt_worker_opts back;
            bool s2;
            if (px_rt_worker_args_parse(av.argc - 2, av.argv + 2, &back, &s2, &err) != PX_OK ||
                back.stage != o.stage || back.layer_begin != o.layer_begin ||
                back.layer_end != o.layer_end || strcmp(back.listen, o.listen) ||
                strcmp(back.next, o.next) || strcmp(back.model_path, o.model_path))
                __builtin_trap();
            px_rt_worker_args_release(&av);
        }
    }
    free(buf);
    return 0;
}
