/*
 * test_strutil.c — find_either, the search under the request head's
 * CR/LF check and the JSON string skips, against a byte-by-byte search:
 * every length up to 200 (the AVX2 steps of 32 bytes, the words of 8 and
 * the last bytes each end a search somewhere), the match at each offset,
 * both bytes, none, and a buffer that ends exactly where its last step
 * does, so that a step reading past `end` would show under ASan.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "strutil.h"

static const char *naive(const char *p, const char *end, char a, char b)
{
	while (p < end && *p != a && *p != b)
		p++;
	return p;
}

/* Each length n, the match (a or b, or none) at each offset; the buffer is
 * malloc'd at exactly n bytes. */
static void test_find_either_matches_naive(void **state)
{
	(void)state;
	for (size_t n = 0; n <= 200; n++) {
		for (size_t at = 0; at <= n; at++) {
			for (int which = 0; which < 2; which++) {
				char *buf = malloc(n ? n : 1);
				assert_non_null(buf);
				memset(buf, 'x', n);
				if (at < n)
					buf[at] = which ? '\\' : '"';
				const char *got = find_either(buf, buf + n, '"', '\\');
				assert_ptr_equal(got, naive(buf, buf + n, '"', '\\'));
				assert_ptr_equal(got, buf + at);
				free(buf);
			}
		}
	}
}

/* Two matches: the first wins, from any start. */
static void test_find_either_first_of_two(void **state)
{
	char buf[160];

	(void)state;
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (char)('a' + i % 23);
	for (size_t first = 0; first < sizeof(buf); first += 7) {
		for (size_t second = first + 1; second < sizeof(buf); second += 11) {
			char b[sizeof(buf)];
			memcpy(b, buf, sizeof(b));
			b[first] = '\n';
			b[second] = '\r';
			for (size_t start = 0; start <= first; start += 5)
				assert_ptr_equal(find_either(b + start, b + sizeof(b), '\r', '\n'), b + first);
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_find_either_matches_naive),
		cmocka_unit_test(test_find_either_first_of_two),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
