/*
 * Private to the fleet module, server and agent alike: files that hold
 * secrets (tokens, node credentials, TLS keys) and the random secrets
 * themselves.  A secret file is a regular file that neither group nor
 * others can read; one that they can is refused with the fix.
 */
#ifndef PX_FLEET_SECRET_IMPL_H
#define PX_FLEET_SECRET_IMPL_H

#include "base/common.h"

#include <sys/stat.h>

/* Checks an open secret file: a regular file with no group or world
 * access.  `what` names it in messages ("--token-file"). */
px_status px__secret_check_fd(int fd, const char *path, const char *what, px_err *err);
/* Reads a whole secret file (at most max bytes) after checking it;
 * returns owned text (wipe with px__secret_wipe, then free). */
px_status px__secret_read_file(const char *path, const char *what, size_t max, char **out,
                               size_t *len, px_err *err);
/* Writes data to path atomically (temporary file in the same folder,
 * fsync, rename, fsync of the folder) with mode 0600 whatever the umask,
 * never following a link. */
px_status px__secret_write_file(const char *path, const void *data, size_t len, px_err *err);
/* Makes a folder (mode 0700, or tightens an existing one to 0700). */
px_status px__private_dir(const char *path, px_err *err);
/* A fresh random secret: prefix, then 64 hex digits (256 bits). out must
 * hold strlen(prefix) + 65 bytes. */
px_status px__secret_new(const char *prefix, char *out, size_t n, px_err *err);
/* Overwrites n bytes (or the string when n is 0) so the secret does not
 * linger in freed memory. */
void px__secret_wipe(void *p, size_t n);
/* Whether a token is 16 to 256 printable ASCII characters without spaces. */
bool px__token_valid(const char *token);

#endif
