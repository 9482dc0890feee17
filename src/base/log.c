/* Leveled logging to stderr or a sink. */
#include "base/common.h"

#include <pthread.h>

static px_log_level log_level = PX_LOG_WARN;
static bool log_level_set;
static px_log_sink log_sink;
static void *log_sink_ud;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *level_name(px_log_level l)
{
    switch (l) {
    case PX_LOG_ERROR:
        return "error";
    case PX_LOG_WARN:
        return "warning";
    case PX_LOG_INFO:
        return "info";
    case PX_LOG_DEBUG:
        return "debug";
    }
    return "log";
}

static void level_from_env(void)
{
    if (log_level_set)
        return;
    log_level_set = true;
    const char *e = getenv("PLEXUS_LOG");
    if (!e)
        return;
    if (!strcmp(e, "error"))
        log_level = PX_LOG_ERROR;
    else if (!strcmp(e, "warn"))
        log_level = PX_LOG_WARN;
    else if (!strcmp(e, "info"))
        log_level = PX_LOG_INFO;
    else if (!strcmp(e, "debug"))
        log_level = PX_LOG_DEBUG;
}

void px_log_set_level(px_log_level level)
{
    pthread_mutex_lock(&log_lock);
    log_level = level;
    log_level_set = true;
    pthread_mutex_unlock(&log_lock);
}

px_log_level px_log_get_level(void)
{
    pthread_mutex_lock(&log_lock);
    level_from_env();
    px_log_level l = log_level;
    pthread_mutex_unlock(&log_lock);
    return l;
}

void px_log_set_sink(px_log_sink sink, void *ud)
{
    pthread_mutex_lock(&log_lock);
    log_sink = sink;
    log_sink_ud = ud;
    pthread_mutex_unlock(&log_lock);
}

void px_log(px_log_level level, const char *fmt, ...)
{
    pthread_mutex_lock(&log_lock);
    level_from_env();
    if (level > log_level) {
        pthread_mutex_unlock(&log_lock);
        return;
    }
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_sink)
        log_sink(level, msg, log_sink_ud);
    else
        fprintf(stderr, "plexus: %s: %s\n", level_name(level), msg);
    pthread_mutex_unlock(&log_lock);
}
