/*
 * Functions that are easy to misuse with untrusted input.  Included last by
 * src/base/common.h so that using one is a compile error.
 */
#ifndef PX_BANNED_H
#define PX_BANNED_H

#define PX_BANNED(func) sorry_##func##_is_a_banned_function

#undef strcpy
#define strcpy(x, y) PX_BANNED(strcpy)
#undef strcat
#define strcat(x, y) PX_BANNED(strcat)
#undef strncpy
#define strncpy(x, y, n) PX_BANNED(strncpy)
#undef strncat
#define strncat(x, y, n) PX_BANNED(strncat)
#undef sprintf
#define sprintf(...) PX_BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) PX_BANNED(vsprintf)
#undef strtok
#define strtok(x, y) PX_BANNED(strtok)
#undef gets
#define gets(x) PX_BANNED(gets)
#undef atoi
#define atoi(x) PX_BANNED(atoi)

#endif
