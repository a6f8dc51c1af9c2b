/*
 * quotes.h — JSON written with single quotes in the unit tests: J(s) is `s`
 * with every ' replaced by ". Four rotating buffers, so that a test can hold
 * a few at once. Include after <cmocka.h> (an overlong `s` fails the test).
 */
#pragma once

#include <string.h>

static inline const char *J(const char *s)
{
	static char bufs[4][8192];
	static int next;
	char *b = bufs[next++ % 4];
	size_t n = strlen(s);
	assert_true(n < sizeof(bufs[0]));
	for (size_t i = 0; i <= n; i++)
		b[i] = s[i] == '\'' ? '"' : s[i];
	return b;
}
