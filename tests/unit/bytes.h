/*
 * bytes.h — for tests that keep what a callback was handed (events, their
 * names) past the call: dup_bytes(p, n), a NUL-ended copy of n bytes; and
 * assert_copies_equal, two such copies of an optional name and its data
 * compared. Include after <cmocka.h>: out of memory fails the test.
 */
#pragma once

#include <stdlib.h>
#include <string.h>

static inline char *dup_bytes(const char *p, size_t n)
{
	char *s = malloc(n + 1);
	assert_non_null(s);
	memcpy(s, p, n);
	s[n] = '\0';
	return s;
}

/* Names NULL when the event had none: then both must be. */
static inline void assert_copies_equal(const char *name_a, const char *name_b, const char *data_a, size_t len_a,
				       const char *data_b, size_t len_b)
{
	if (name_a == NULL || name_b == NULL)
		assert_ptr_equal(name_a, name_b);
	else
		assert_string_equal(name_a, name_b);
	assert_int_equal(len_a, len_b);
	assert_memory_equal(data_a, data_b, len_a);
}
