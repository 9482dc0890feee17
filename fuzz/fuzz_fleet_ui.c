/*
 * libFuzzer target: what a browser sends the dashboard, from arbitrary
 * bytes: the login form's body and the session cookie's value.  Whatever
 * is accepted must fit its buffer, hold no NUL or line end, and a token
 * must survive the round trip through the cookie's hex.  Any crash or
 * sanitizer report is a finding.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/ui_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > PX__UI_BODY_MAX)
        return 0;
    char token[PX__UI_TOKEN_MAX + 1];
    if (px__ui_form_token((const char *)data, size, token, sizeof token)) {
        size_t n = strlen(token);
        if (n == 0 || n >= sizeof token || token[n - 1] == '\n' || token[0] == ' ')
            __builtin_trap();
        /* A printable token goes into the cookie and comes back the same. */
        bool printable = true;
        for (size_t i = 0; i < n; i++)
            printable &= token[i] > ' ' && token[i] <= '~';
        if (printable) {
            char hex[2 * PX__UI_TOKEN_MAX + 1], back[PX__UI_TOKEN_MAX + 1];
            for (size_t i = 0; i < n; i++)
                snprintf(hex + 2 * i, 3, "%02x", (unsigned char)token[i]);
            if (!px__ui_cookie_token(hex, back, sizeof back) || strcmp(back, token) != 0)
                __builtin_trap();
        }
    }
    char *value = malloc(size + 1);
    if (!value)
        return 0;
    memcpy(value, data, size);
    value[size] = '\0';
    char small[17];
    if (px__ui_cookie_token(value, token, sizeof token)) {
        for (const char *c = token; *c; c++)
            if (*c <= ' ' || *c > '~')
                __builtin_trap();
    }
    if (px__ui_cookie_token(value, small, sizeof small) && strlen(small) >= sizeof small)
        __builtin_trap();
    free(value);
    return 0;
}
