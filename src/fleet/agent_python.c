/*
 * Runs a Python function as a job: the node's python3 imports the file by
 * path and calls the function with JSON arguments.  The result (or the
 * exception with its traceback) comes back as JSON on fd 3, so whatever
 * the function prints stays ordinary output.  Nothing is pickled: only
 * JSON crosses the boundary.
 */
#include "base/common.h"

#include "fleet/agent_impl.h"

#include <ctype.h>

/* The embedded runner.  argv: FILE FUNCTION ARGS_JSON_PATH. */
static const char runner_script[] =
    "import importlib.util, json, os, sys, traceback\n"
    "path, func, args_path = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "res = os.fdopen(3, 'w')\n"
    "code = 0\n"
    "try:\n"
    "    args = ()\n"
    "    if args_path != '-':\n"
    "        with open(args_path) as f:\n"
    "            args = json.load(f)\n"
    "    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))\n"
    "    spec = importlib.util.spec_from_file_location('plexus_job', path)\n"
    "    if spec is None or spec.loader is None:\n"
    "        raise ImportError('cannot import ' + path)\n"
    "    mod = importlib.util.module_from_spec(spec)\n"
    "    spec.loader.exec_module(mod)\n"
    "    fn = getattr(mod, func)\n"
    "    if isinstance(args, dict):\n"
    "        value = fn(**args)\n"
    "    elif isinstance(args, list):\n"
    "        value = fn(*args)\n"
    "    elif args == ():\n"
    "        value = fn()\n"
    "    else:\n"
    "        value = fn(args)\n"
    "    text = json.dumps({'ok': True, 'result': value})\n"
    "except BaseException as e:\n"
    "    code = 1\n"
    "    text = json.dumps({'ok': False, 'error': type(e).__name__ + ': ' + str(e),\n"
    "                       'traceback': traceback.format_exc()})\n"
    "sys.stdout.flush()\n"
    "sys.stderr.flush()\n"
    "res.write(text)\n"
    "res.close()\n"
    "sys.exit(code)\n";

void px__python_argv(const char *python, const char *script_path, const char *function,
                     const char *args_path, const char *argv[8])
{
    argv[0] = python && python[0] ? python : "python3";
    argv[1] = "-c";
    argv[2] = runner_script;
    argv[3] = script_path;
    argv[4] = function;
    argv[5] = args_path;
    argv[6] = NULL;
    argv[7] = NULL;
}

px_status px_fleet_python_target_parse(const char *target, char **file, char **function,
                                       px_err *err)
{
    *file = *function = NULL;
    const char *colon = target ? strrchr(target, ':') : NULL;
    if (!colon)
        return px_err_set(err, PX_EINVAL,
                          "--python \"%s\": expected FILE.py:FUNCTION, e.g. train.py:main",
                          target ? target : "");
    size_t flen = (size_t)(colon - target);
    if (flen < 4 || strncmp(colon - 3, ".py", 3))
        return px_err_set(err, PX_EINVAL,
                          "--python \"%s\": the file must end in .py (FILE.py:FUNCTION)", target);
    const char *fn = colon + 1;
    bool ok = (isalpha((unsigned char)fn[0]) || fn[0] == '_') && strlen(fn) <= 200;
    for (const char *c = fn; ok && *c; c++)
        ok = isalnum((unsigned char)*c) || *c == '_';
    if (!ok)
        return px_err_set(err, PX_EINVAL, "--python \"%s\": \"%s\" is not a Python function name",
                          target, fn);
    *file = px_strndup(target, flen);
    *function = px_strdup(fn);
    if (!*file || !*function) {
        free(*file);
        free(*function);
        *file = *function = NULL;
        return px_err_set(err, PX_ENOMEM, "out of memory");
    }
    return PX_OK;
}
