/*
 * test_keyscan.c — keyscan_find() answers what memmem() answers,
 * keyscan_find_any() what the earliest of its keys' memmem() answers, and
 * neither reads anything outside the bytes it is given.
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

/* The earliest of memmem() over keys[0, n), the lowest index on a tie. */
static void expect_first_of(const char *hay, size_t len, const struct keyscan_key *keys, size_t n)
{
	const char *want = NULL;
	size_t want_k = 0, got_k = SIZE_MAX;
	for (size_t k = 0; k < n; k++) {
		const char *h = memmem(hay, len, keys[k].q, keys[k].qlen);
		if (h && (want == NULL || h < want)) {
			want = h;
			want_k = k;
		}
	}
	const char *got = keyscan_find_any(hay, hay + len, keys, n, &got_k);
	if (want != got || (got && got_k != want_k))
		fail_msg("len %zu, %zu keys: memmem at %td (key %zu), keyscan_find_any at %td (key %zu)", len, n,
			 want ? want - hay : (ptrdiff_t)-1, want_k, got ? got - hay : (ptrdiff_t)-1, got_k);
	/* the same keys checked once, as a set */
	struct keyscan_set set;
	assert_int_equal(keyscan_set_init(&set, keys, n), 0);
	got_k = SIZE_MAX;
	got = keyscan_find_set(hay, hay + len, &set, &got_k);
	if (want != got || (got && got_k != want_k))
		fail_msg("len %zu, %zu keys: memmem at %td (key %zu), keyscan_find_set at %td (key %zu)", len, n,
			 want ? want - hay : (ptrdiff_t)-1, want_k, got ? got - hay : (ptrdiff_t)-1, got_k);
}

/* The key sets classify.c passes, each key at every position of every
 * length up to 160, both fence sides; filler full of the keys' first and
 * second-to-last letters and of quotes. */
static void test_any_every_position(void **state)
{
	static const struct keyscan_key sets[][5] = {
		{ { "\"usage\"", 7 }, { "\"timings\"", 9 } },
		{ { "\"content\"", 9 },
		  { "\"refusal\"", 9 },
		  { "\"tool_calls\"", 12 },
		  { "\"usage\"", 7 },
		  { "\"timings\"", 9 } },
		{ { "\"content\"", 9 }, { "\"refusal\"", 9 }, { "\"usage\"", 7 }, { "\"timings\"", 9 } },
		{ { "\"content\"", 9 }, { "\"tool_calls\"", 12 }, { "\"reasoning_content\"", 19 } },
	};
	static const size_t nkeys[] = { 2, 5, 4, 3 };
	struct fence f = fence_new();
	char buf[256];

	for (size_t set = 0; set < sizeof(nkeys) / sizeof(nkeys[0]); set++) {
		const struct keyscan_key *keys = sets[set];
		for (size_t len = 0; len <= 160; len++) {
			for (size_t i = 0; i < len; i++)
				buf[i] = "\"ct\"ul\"se:_"[i % 11];
			for (int side = 0; side < 2; side++)
				expect_first_of(fence_put(&f, buf, len, side), len, keys, nkeys[set]);
			for (size_t k = 0; k < nkeys[set]; k++) {
				for (size_t at = 0; at + keys[k].qlen <= len; at++) {
					char save[32];
					memcpy(save, buf + at, keys[k].qlen);
					memcpy(buf + at, keys[k].q, keys[k].qlen);
					for (int side = 0; side < 2; side++)
						expect_first_of(fence_put(&f, buf, len, side), len, keys, nkeys[set]);
					memcpy(buf + at, save, keys[k].qlen);
				}
			}
		}
	}
	fence_free(&f);
}

/* Random keys (2 to 5 of them, 3 to 26 bytes, all opening with a quote)
 * over random bytes of a three-letter alphabet, so that candidates,
 * overlaps and partial matches are common. */
static void test_any_random(void **state)
{
	struct fence f = fence_new();
	uint64_t x = 0x2545f4914f6cdd1dull;
	char hay[400], q[5][28];
	struct keyscan_key keys[5];

	for (int round = 0; round < 100000; round++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t len = (size_t)(x % sizeof(hay));
		size_t n = 2 + (size_t)((x >> 9) % 4);
		uint64_t y = x;
		for (size_t k = 0; k < n; k++) {
			y = y * 6364136223846793005ull + 1442695040888963407ull;
			size_t qlen = 3 + (size_t)((y >> 40) % 24);
			q[k][0] = '"';
			for (size_t i = 1; i < qlen; i++) {
				y = y * 6364136223846793005ull + 1442695040888963407ull;
				q[k][i] = "ab\""[(y >> 33) % 3];
			}
			keys[k] = (struct keyscan_key){ q[k], qlen };
		}
		for (size_t i = 0; i < len; i++) {
			y = y * 6364136223846793005ull + 1442695040888963407ull;
			hay[i] = "ab\""[(y >> 33) % 3];
		}
		expect_first_of(fence_put(&f, hay, len, (int)(x & 1)), len, keys, n);
	}
	fence_free(&f);
}

/* Outside the contract: keys that do not share their first byte, more
 * than KEYSCAN_MAX_KEYS of them, one shorter than three bytes. */
static void test_any_contract(void **state)
{
	const char hay[] = "{\"usage\":{},'timings':{}}";
	const struct keyscan_key mixed[] = { { "\"usage\"", 7 }, { "'timings'", 9 } };
	const struct keyscan_key six[] = { { "\"a\"", 3 }, { "\"b\"", 3 }, { "\"c\"", 3 },
					   { "\"d\"", 3 }, { "\"e\"", 3 }, { "\"usage\"", 7 } };
	const struct keyscan_key shortk[] = { { "\"usage\"", 7 }, { "\"u", 2 } };
	size_t which = 9;
	assert_null(keyscan_find_any(hay, hay + sizeof(hay) - 1, mixed, 2, &which));
	assert_null(keyscan_find_any(hay, hay + sizeof(hay) - 1, six, 6, &which));
	assert_null(keyscan_find_any(hay, hay + sizeof(hay) - 1, shortk, 2, &which));
	assert_ptr_equal(keyscan_find_any(hay, hay + sizeof(hay) - 1, six + 4, 2, &which), hay + 1);
	assert_int_equal(which, 1);
}

/* keyscan_set_init refuses what keyscan_find_any refuses (the set then
 * finds nothing); KEYSCAN_SET2 makes the set keyscan_set_init would. */
static void test_set_contract(void **state)
{
	const char hay[] = "{\"usage\":{},\"timings\":{}}";
	const struct keyscan_key mixed[] = { { "\"usage\"", 7 }, { "'timings'", 9 } };
	const struct keyscan_key shortk[] = { { "\"usage\"", 7 }, { "\"u", 2 } };
	const struct keyscan_key both[] = { { "\"timings\"", 9 }, { "\"usage\"", 7 } };
	struct keyscan_set set;
	size_t which = 9;
	assert_int_equal(keyscan_set_init(&set, mixed, 2), -1);
	assert_null(keyscan_find_set(hay, hay + sizeof(hay) - 1, &set, &which));
	assert_int_equal(keyscan_set_init(&set, shortk, 2), -1);
	assert_null(keyscan_find_set(hay, hay + sizeof(hay) - 1, &set, &which));
	assert_int_equal(keyscan_set_init(&set, both, 0), -1);
	assert_int_equal(keyscan_set_init(&set, both, KEYSCAN_MAX_KEYS + 1), -1);
	assert_int_equal(keyscan_set_init(&set, both, 2), 0);
#define QKEY(k) ("\"" k "\""), (sizeof("\"" k "\"") - 1)
	const struct keyscan_set made = KEYSCAN_SET2(QKEY("timings"), QKEY("usage"));
#undef QKEY
	assert_int_equal(made.n, set.n);
	assert_int_equal(made.minlen, set.minlen);
	assert_int_equal(made.maxlen, set.maxlen);
	assert_ptr_equal(keyscan_find_set(hay, hay + sizeof(hay) - 1, &made, &which), hay + 1);
	assert_int_equal(which, 1);
	assert_ptr_equal(keyscan_find_set(hay + 2, hay + sizeof(hay) - 1, &set, &which), hay + 12);
	assert_int_equal(which, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_length_and_position),
		cmocka_unit_test(test_random_against_memmem),
		cmocka_unit_test(test_short_keys),
		cmocka_unit_test(test_any_every_position),
		cmocka_unit_test(test_any_random),
		cmocka_unit_test(test_any_contract),
		cmocka_unit_test(test_set_contract),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
