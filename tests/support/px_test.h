/*
 * Helpers for plexus tests (cmocka).  Include after <setjmp.h>, <stdarg.h>,
 * <stddef.h> and <cmocka.h>, or just include this header, which does so.
 */
#ifndef PX_TEST_H
#define PX_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "plexus/base.h"

/* Path of a file under ../shared/models (static buffer per call site is
 * not needed: returns malloc'd memory the test frees, or NULL). */
char *px_test_shared_model(const char *name);
/* Skips the current test with a message when ../shared/models/name is
 * absent; otherwise returns its path (malloc'd). */
char *px_test_require_shared_model(const char *name);
/* Path of a file in the source tree (malloc'd). */
char *px_test_source_path(const char *rel);
/* Creates a fresh temporary folder, removed with its contents at exit. */
const char *px_test_tmpdir(void);
/* Path of the plexus command under test (PLEXUS_BIN). */
const char *px_test_plexus_bin(void);

/* Runs argv (argv[0] is the program) with a timeout in seconds, capturing
 * stdout and stderr (malloc'd, NUL-terminated; pass NULL to discard).
 * Returns the exit status, 128+signal when killed, or -1 on failure to
 * start; a timeout kills the process and returns -2. */
int px_test_run(char *const argv[], int timeout_s, char **out, char **err);
/* Like px_test_run, with stdin fed from `input` (may be NULL). */
int px_test_run_input(char *const argv[], const char *input, int timeout_s, char **out, char **err);
/* Runs argv on a new pseudo-terminal (stdin, stdout and stderr all on it, as
 * for a person at a terminal), capturing what it writes there (malloc'd,
 * NUL-terminated; the terminal turns "\n" into "\r\n").  When input is
 * given it is typed once the output holds wait_for (at once for NULL).
 * Returns as px_test_run does. */
int px_test_run_pty(char *const argv[], const char *wait_for, const char *input, int timeout_s,
                    char **out);

static inline const char *px__test_err_msg(const px_err *e)
{
    return e ? e->msg : "";
}

/* Asserts that a px_status is PX_OK, printing the error message if not. */
#define px_assert_ok(expr, errp)                                                                   \
    do {                                                                                           \
        px_status px__st = (expr);                                                                 \
        if (px__st != PX_OK)                                                                       \
            fail_msg("%s returned %s: %s", #expr, px_status_name(px__st), px__test_err_msg(errp)); \
    } while (0)

/* Asserts that haystack contains needle, printing both if not. */
#define px_assert_contains(haystack, needle)                                              \
    do {                                                                                  \
        const char *px__h = (haystack), *px__n = (needle);                                \
        if (!px__h || !strstr(px__h, px__n))                                              \
            fail_msg("expected to find \"%s\" in:\n%s", px__n, px__h ? px__h : "(null)"); \
    } while (0)

#endif
