/*
 * Private declarations shared by the local discovery files (discover*.c):
 * the state of one discovery run, the helpers that build quantities and
 * read files under the sysroot, the bounded command runner, and one entry
 * point per probe.
 */
#ifndef PX_HW_DISCOVER_IMPL_H
#define PX_HW_DISCOVER_IMPL_H

#include "base/common.h"
#include "plexus/hw.h"

/* Bounds on what discovery reads from the system and from commands. */
enum {
    PX__DISC_MAX_OUTPUT = 1 << 20, /* bytes of stdout kept per command */
    PX__DISC_MAX_STDERR = 4096,    /* bytes of stderr kept per command */
    PX__DISC_MAX_FILE = 1 << 20,   /* bytes of a /proc or /sys file */
    PX__DISC_MAX_LINES = 4096,     /* lines of a parsed text */
    PX__DISC_MAX_LINE = 1024,      /* bytes of one parsed line */
    PX__DISC_MAX_GPUS = 64,        /* GPUs of one node */
    PX__DISC_MAX_MIG = 256,        /* MIG instances of one node */
};

/* The state of one px_hw_discover call.  The JSON members are borrowed
 * references into the document being built. */
typedef struct px__disc {
    const px_hw_discover_options *opt;
    const char *sysroot; /* "" for the running system, else without a trailing '/' */
    double timeout;      /* seconds per external command */
    int64_t at;          /* time stamped on every figure */
    char node_id[72];
    json_t *doc;
    json_t *node;
    json_t *devices;  /* node's "devices" */
    json_t *memory;   /* node's "memory" */
    json_t *links;    /* document's "links" */
    json_t *probes;   /* node's "x-probes" */
    px_diags *report; /* may be NULL */
    /* Facts one probe finds and a later one uses. */
    bool nvidia_driver;     /* nvidia-smi ran, or the kernel module is loaded */
    unsigned n_threads;     /* hardware threads (PUs), 0 when unknown */
    unsigned n_cores;       /* physical cores, 0 when unknown */
    uint64_t llc_bytes;     /* last-level cache, all instances together */
    uint64_t mem_available; /* bytes, 0 when unknown */
    json_t *cpu;            /* the CPU device, or NULL */
    json_t *ddr;            /* the node's ddr0 tier, or NULL */
    bool cpu_estimated;     /* the CPU's compute is an estimate ("assumed") */
} px__disc;

/* Outcome of a probe, as recorded under x-probes. */
typedef enum px__probe_status {
    PX__PROBE_OK = 0,
    PX__PROBE_PARTIAL, /* ran, with warnings */
    PX__PROBE_FAILED,
    PX__PROBE_SKIPPED,
} px__probe_status;

/* Records a probe's outcome under x-probes and, unless it is OK or
 * skipped, a warning in the report whose fix is `fix` (may be NULL).
 * source names the command or file; may be NULL.  started_ns is
 * px_now_ns() when the probe began.  Returns PX_ENOMEM or PX_OK. */
px_status px__disc_record(px__disc *d, const char *probe, px__probe_status status,
                          const char *source, uint64_t started_ns, const char *fix, const char *fmt,
                          ...) PX_PRINTF(7, 8);
/* Adds a warning about a probe to the report without recording an
 * outcome (a probe that continues past a problem).  Returns PX_ENOMEM or
 * PX_OK. */
px_status px__disc_warn(px__disc *d, const char *probe, const char *fix, const char *fmt, ...)
    PX_PRINTF(4, 5);

/* A quantity in JSON form with provenance kind, source and the run's time;
 * rel > 0 adds a relative uncertainty.  New reference, NULL on ENOMEM. */
json_t *px__disc_qty(const px__disc *d, double value, px_dim dim, px_prov_kind kind,
                     const char *source, double rel);
/* Like px__disc_qty with an interval uncertainty [lo, hi]. */
json_t *px__disc_qty_interval(const px__disc *d, double value, px_dim dim, px_prov_kind kind,
                              const char *source, double lo, double hi);

/* The path of a system file ("/proc/meminfo") under the sysroot.  Returns
 * owned memory (free()), NULL on ENOMEM. */
char *px__disc_path(const px__disc *d, const char *abs);
/* Reads a system file under the sysroot, at most max bytes (NUL added).
 * PX_EIO / PX_ENOTFOUND / PX_ELIMIT with err naming the file. */
px_status px__disc_read(const px__disc *d, const char *abs, size_t max, char **out, size_t *len,
                        px_err *err);
/* Whether a system file exists under the sysroot. */
bool px__disc_exists(const px__disc *d, const char *abs);

/* Splits text into lines without copying.  Lines end at '\n'; a '\r'
 * before it is dropped. */
typedef struct px__lines {
    const char *p, *end;
    size_t lineno; /* 1-based number of the line last returned */
} px__lines;

void px__lines_init(px__lines *it, const char *text, size_t len);
bool px__lines_next(px__lines *it, const char **line, size_t *len);
/* Trims spaces, tabs and '\r' on both sides of [*s, *s + *len). */
void px__trim(const char **s, size_t *len);
/* Copies [s, s + len) into out[n] (cut to fit) and terminates it. */
void px__copy_text(char *out, size_t n, const char *s, size_t len);

/* What a command printed and how it ended. */
typedef struct px__cmd_result {
    char *out; /* stdout, NUL-terminated, at most max_out bytes */
    size_t len;
    char *err_text;  /* the start of stderr, NUL-terminated */
    int exit_code;   /* when it exited; -1 otherwise */
    int term_signal; /* when a signal ended it; 0 otherwise */
} px__cmd_result;

/* Looks a program up: a name with a '/' is checked as given, others are
 * searched on PATH.  Returns owned memory in *out (free()); PX_ENOTFOUND
 * when there is no such executable; PX_ENOMEM. */
px_status px__disc_find_program(const char *name, char **out);
/* Runs argv[0] (a path) with argv, without a shell, stdin from /dev/null,
 * in its own process group.  Waits at most timeout seconds, then kills the
 * group.  On PX_OK res holds the output and exit status (any exit code;
 * callers judge it).  PX_ETIMEOUT when it ran too long, PX_ELIMIT when it
 * printed more than max_out bytes (both kill it; res then holds what it
 * printed), PX_EIO when it could not be started; err says which.  Release
 * res with px__cmd_result_release in every case. */
px_status px__disc_run(char *const argv[], double timeout, size_t max_out, px__cmd_result *res,
                       px_err *err);
void px__cmd_result_release(px__cmd_result *res);
/* A short description of how a command ended ("exited with status 1",
 * "killed by signal 9"), with the first line of its stderr if any. */
void px__cmd_describe(const px__cmd_result *res, char *buf, size_t n);

/* The probes, in the order px_hw_discover runs them.  Each records its
 * outcome itself; only PX_ENOMEM is returned as a failure. */
px_status px__disc_probe_os(px__disc *d);
px_status px__disc_probe_cpu(px__disc *d);
px_status px__disc_probe_mem(px__disc *d);
px_status px__disc_probe_gpu(px__disc *d);
px_status px__disc_probe_python(px__disc *d);
px_status px__disc_probe_measure(px__disc *d);

/* Python package metadata helpers (discover_py_meta.c). */
/* PEP 503 normalization of a distribution name into out[cap]. */
void px__py_normalize(const char *s, size_t n, char *out, size_t cap);
/* Reads at most the first 64 KiB of a file (NUL added).  PX_ENOTFOUND,
 * PX_EIO, PX_ENOMEM. */
px_status px__py_read_head(const char *path, char **out, size_t *len);
/* The CUDA version of a "+cu121" local version ("12.1"). */
bool px__py_cuda_from_local_version(const char *version, char *out, size_t cap);
/* The CUDA version torch/version.py under site names ("cuda = '12.1'");
 * *cpu_only when it says "cuda = None". */
bool px__py_cuda_from_version_py(const char *site, char *out, size_t cap, bool *cpu_only);

/* The microbenchmarks, separate from the probe so that they can be timed
 * on their own.  Each runs for about `seconds` and returns the best and
 * the worst rate of its repetitions. */
typedef struct px__bench_result {
    double best, worst; /* B/s or FLOP/s */
    unsigned reps;
    unsigned threads;
    size_t bytes; /* triad: bytes of one array */
} px__bench_result;

px_status px__bench_triad(unsigned threads, size_t array_bytes, double seconds,
                          px__bench_result *out, px_err *err);
px_status px__bench_fma(unsigned threads, double seconds, px__bench_result *out, px_err *err);

#endif
