/* The calling thread's wait for a core, from the kernel's schedstat. */
#include "base/common.h"

#include <fcntl.h>
#include <unistd.h>

#include "rt/pipeline_impl.h"

uint64_t px__rt_thread_wait_ns(int *fd)
{
    if (*fd == -2)
        *fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return 0;
    char buf[96];
    ssize_t n = pread(*fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    unsigned long long run = 0, wait = 0;
    return sscanf(buf, "%llu %llu", &run, &wait) == 2 ? (uint64_t)wait : 0;
}

void px__rt_thread_wait_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -2;
}
