/*
 * Private include for every plexus source file: the C library headers the
 * code uses everywhere, the public base API, and banned.h last.
 */
#ifndef PX_COMMON_H
#define PX_COMMON_H

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/base.h"

/* Checked size arithmetic: return false on overflow. */
static inline bool px__mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool px__add_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

#include "base/alloc.h"
#include "base/banned.h"

#endif
