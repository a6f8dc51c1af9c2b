/*
 * test_keyscan.c — keyscan_find() answers what memmem() answers, and reads
 * nothing outside the bytes it is given.
 *
 * Every haystack is placed so that it ends right before a page that cannot
 * be read (PROT_NONE), and starts right after one: a vector load that strays
 * past either end faults, in every build, not only under ASan.
 */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "keyscan.h"

/* Three pages: guard, data, guard. */
struct fence {
	char *base;
	size_t page;
};

static struct fence fence_new(void)
{
	struct fence f;
	f.page = (size_t)sysconf(_SC_PAGESIZE);
	f.base = mmap(NULL, 3 * f.page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(f.base != MAP_FAILED);
	assert_int_equal(mprotect(f.base, f.page, PROT_NONE), 0);
	assert_int_equal(mprotect(f.base + 2 * f.page, f.page, PROT_NONE), 0);
	return f;
}

static void fence_free(struct fence *f)
{
	munmap(f->base, 3 * f->page);
}

/* Copies src (len bytes) flush against the end of the data page, or
 * against its start when `at_start`. */
static const char *fence_put(struct fence *f, const char *src, size_t len, int at_start)
{
	char *dst = at_start ? f->base + f->page : f->base + 2 * f->page - len;
	memcpy(dst, src, len);
	return dst;
}

static void expect_same(const char *hay, size_t len, const char *q, size_t qlen)
{
	const char *want = memmem(hay, len, q, qlen);
	const char *got = keyscan_find(hay, hay + len, q, qlen);
	if (want != got)
		fail_msg("len %zu, key %.*s: memmem at %td, keyscan at %td", len, (int)qlen, q,
			 want ? want - hay : (ptrdiff_t)-1, got ? got - hay : (ptrdiff_t)-1);
}

/* Every haystack length up to 200, the key at every position (and nowhere),
 * both fence sides: covers the scalar path, the 16- and 32-wide steps and the
 * final step moved back over starts already tested. */
static void test_every_length_and_position(void **state)
{
	static const char *keys[] = { "\"usage\"", "\"content\"", "\"x\"", "\"reasoning_content\"",
				      "\"tokens_predicted\"" };
	struct fence f = fence_new();
	char buf[256];

	for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
		const char *q = keys[k];
		size_t qlen = strlen(q);
		for (size_t len = 0; len <= 200; len++) {
			/* Filler full of near misses: the key's first and last
			 * letters at the right distance, but not the key. */
			for (size_t i = 0; i < len; i++)
				buf[i] = "ab\"cu:e,t{}"[i % 11];
			for (size_t i = 0; i + qlen <= len; i += 7) {
				memcpy(buf + i, q, qlen);
				buf[i + qlen / 2] = '#';
			}
			for (int side = 0; side < 2; side++)
				expect_same(fence_put(&f, buf, len, side), len, q, qlen);
			for (size_t at = 0; at + qlen <= len; at++) {
				char save[32];
				memcpy(save, buf + at, qlen);
				memcpy(buf + at, q, qlen);
				for (int side = 0; side < 2; side++)
					expect_same(fence_put(&f, buf, len, side), len, q, qlen);
				memcpy(buf + at, save, qlen);
			}
		}
	}
	fence_free(&f);
}

/* Random bytes over a small alphabet, so that candidates and partial
 * matches are common; many keys and lengths. */
static void test_random_against_memmem(void **state)
{
	struct fence f = fence_new();
	uint64_t x = 0x9e3779b97f4a7c15ull;
	char hay[600], q[24];

	for (int round = 0; round < 200000; round++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t len = (size_t)(x % sizeof(hay));
		size_t qlen = 3 + (size_t)((x >> 20) % 20);
		for (size_t i = 0; i < qlen; i++)
			q[i] = "ab\""[(x >> (i % 40)) % 3];
		uint64_t y = x;
		for (size_t i = 0; i < len; i++) {
			y = y * 6364136223846793005ull + 1442695040888963407ull;
			hay[i] = "ab\""[(y >> 33) % 3];
		}
		expect_same(fence_put(&f, hay, len, (int)(x & 1)), len, q, qlen);
	}
	fence_free(&f);
}

/* Keys shorter than three bytes are passed to memmem(). */
static void test_short_keys(void **state)
{
	const char hay[] = "abcabc\"\"";
	assert_ptr_equal(keyscan_find(hay, hay + 8, "\"\"", 2), hay + 6);
	assert_ptr_equal(keyscan_find(hay, hay + 8, "c", 1), hay + 2);
	assert_null(keyscan_find(hay, hay + 8, "zz", 2));
	assert_null(keyscan_find(hay, hay + 2, "abc", 3));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_length_and_position),
		cmocka_unit_test(test_random_against_memmem),
		cmocka_unit_test(test_short_keys),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
