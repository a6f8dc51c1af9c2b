/*
 * strutil.h — small string helpers shared by the parsers and the proxy.
 *
 * Header only, no state. Neither helper reads past the lengths it is given;
 * copy_trunc always leaves dst terminated.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

/* Case-insensitive comparison of (a, alen) with the string `lit`: an HTTP
 * header name, or a token of a header value. */
static inline bool name_eq(const char *a, size_t alen, const char *lit)
{
	size_t n = strlen(lit);
	return alen == n && strncasecmp(a, lit, n) == 0;
}

/* Copies (src, len) into dst[dstlen] (dstlen > 0), cut to dstlen - 1 bytes,
 * and terminates it. */
static inline void copy_trunc(char *dst, size_t dstlen, const char *src, size_t len)
{
	if (len >= dstlen)
		len = dstlen - 1;
	memcpy(dst, src, len);
	dst[len] = '\0';
}
