/*
 * How much slower the code under test runs in this build.  ThreadSanitizer
 * slows the library and the plexus processes a test starts 5 to 15 times,
 * so deadlines on processes starting, on leases and on whole suites are
 * four times longer there; every other build keeps them as written.  The
 * build sets the factor (PX_TEST_SLOWDOWN in CMakeLists.txt, which
 * multiplies ctest's timeouts by it too); a file compiled without it
 * falls back on the compiler's word.
 */
#ifndef PX_SLOWDOWN_H
#define PX_SLOWDOWN_H

#ifndef PX_TEST_SLOWDOWN
#if defined(__SANITIZE_THREAD__)
#define PX_TEST_SLOWDOWN 4
#else
#define PX_TEST_SLOWDOWN 1
#endif
#endif

/* A workload a test runs in full, or in part where the build is slowed
 * (ThreadSanitizer): a race shows in a thread's first rounds as well as
 * in its hundredth, and every other build checks the full workload. */
#define PX_TEST_WORKLOAD(full, slowed) (PX_TEST_SLOWDOWN > 1 ? (slowed) : (full))

#endif
