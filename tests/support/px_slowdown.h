/*
 * How much slower the code under test runs in this build.  ThreadSanitizer
 * slows the library and the plexus processes a test starts 5 to 15 times,
 * so deadlines on processes starting and on leases are four times longer
 * there; every other build keeps them as written.
 */
#ifndef PX_SLOWDOWN_H
#define PX_SLOWDOWN_H

#if defined(__SANITIZE_THREAD__)
#define PX_TEST_SLOWDOWN 4
#else
#define PX_TEST_SLOWDOWN 1
#endif

#endif
