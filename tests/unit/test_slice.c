/*
 * test_slice.c — slices and stats shards without a store: a slice encodes
 * and decodes back to itself, gaps are stored rounded to nearest, the
 * log2 buckets of the load curves, and the per-route model cap of the
 * shards (names admitted only with a successful answer, the rest folded
 * into "other").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "slice.h"
#include "stats.h"
#include "store_fixture.h"

static void test_slice_encode_roundtrip(void **state)
{
	struct slice a, b;
	struct req_record r;
	uint8_t *blob = NULL;
	size_t len;

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	fake_request(&r, 50000, 20, 10000);
	slice_record_request(&a, &r, 3, &test_slo);
	for (size_t i = 0; i < r.itl_n; i++)
		slice_record_itl(&a, r.itl_ns[i], 3);
	record_release(&r);
	len = slice_encode(&a, &blob);
	assert_true(len > 0);
	assert_int_equal(slice_decode_merge(&b, blob, len), 0);
	for (unsigned i = 0; i < CT__COUNT; i++)
		assert_int_equal(a.counters[i], b.counters[i]);
	for (unsigned i = 0; i < SLICE_SLOTS; i++) {
		if (!a.slot[i] || !a.slot[i]->count) {
			assert_true(!b.slot[i] || !b.slot[i]->count);
			continue;
		}
		assert_non_null(b.slot[i]);
		assert_memory_equal(a.slot[i], b.slot[i], sizeof(struct hist));
	}
	assert_int_equal(b.counters[CT_REQUESTS], 1);
	assert_int_equal(b.counters[CT_OUTPUT_TOKENS], 20);
	assert_int_equal(b.slot[HM_ITL]->count, 19);
	assert_int_equal(b.slot[HM_TTFT]->min, 50000);
	assert_int_equal(b.slot[SLOT_CURVE(CURVE_TTFT, log2_bucket(3, INFLIGHT_BUCKETS))]->count, 1);
	/* truncated and garbage input are refused, dst untouched */
	for (size_t cut = 0; cut < len; cut++)
		assert_int_equal(slice_decode_merge(&b, blob, cut), -1);
	assert_int_equal(b.counters[CT_REQUESTS], 1);
	free(blob);
	slice_release(&a);
	slice_release(&b);
}

/* ITL gaps are stored in µs rounded to nearest, as ttft and the rest are
 * (and as the access log prints them), not rounded down. */
static void test_itl_rounds_to_nearest(void **state)
{
	struct slice sl;
	struct req_record r;

	memset(&sl, 0, sizeof(sl));
	slice_record_itl(&sl, 1999, 1);
	slice_record_itl(&sl, 2499, 1);
	slice_record_itl(&sl, 2500, 1);
	assert_int_equal(sl.slot[HM_ITL]->min, 2);
	assert_int_equal(sl.slot[HM_ITL]->max, 3);
	assert_int_equal(sl.slot[HM_ITL]->sum, 2 + 2 + 3);
	fake_request(&r, 1000, 4, 1000);
	r.at[TL_FIRST_TOKEN] = r.at[TL_ARRIVE] + 1999; /* ttft 1.999 µs */
	slice_record_request(&sl, &r, 1, &test_slo);
	assert_int_equal(sl.slot[HM_TTFT]->max, 2);
	record_release(&r);
	slice_release(&sl);
}

static void test_log2_buckets(void **state)
{
	assert_int_equal(log2_bucket(0, 12), 0);
	assert_int_equal(log2_bucket(1, 12), 0);
	assert_int_equal(log2_bucket(2, 12), 1);
	assert_int_equal(log2_bucket(3, 12), 2);
	assert_int_equal(log2_bucket(4, 12), 2);
	assert_int_equal(log2_bucket(5, 12), 3);
	assert_int_equal(log2_bucket(1024, 12), 10);
	assert_int_equal(log2_bucket(1025, 12), 11);
	assert_int_equal(log2_bucket(1u << 30, 12), 11);
	for (unsigned b = 0; b < 11; b++) {
		assert_int_equal(log2_bucket(log2_bucket_low(b), 12), b);
		assert_int_equal(log2_bucket(log2_bucket_high(b, 12), 12), b);
	}
}

static void test_model_cap(void **state)
{
	struct stats_shard *sh = stats_shard_new(NULL, NULL, 2, 0, &test_slo, 1000);
	struct series *a = stats_series(sh, "r", "u", "a", false, true);
	struct series *b = stats_series(sh, "r", "u", "b", false, true);
	struct series *a_cold = stats_series(sh, "r", "u", "a", true, true);
	struct series *c = stats_series(sh, "r", "u", "c", false, true);
	struct series *d = stats_series(sh, "r", "u", "d", false, true);

	assert_non_null(a);
	assert_ptr_not_equal(a, b);
	assert_ptr_not_equal(a, a_cold);
	assert_ptr_equal(a, stats_series(sh, "r", "u", "a", false, true));
	/* past the cap, new models fold into one "other" series */
	assert_ptr_equal(c, d);
	assert_ptr_equal(c, stats_series(sh, "r", "u", "other", false, true));
	/* the cap is the route's, for every shard and upstream: another worker
	 * names a and b, on any upstream, and folds c into "other" */
	struct stats_shard *sh2 = stats_shard_new(NULL, NULL, 2, 0, &test_slo, 1000);
	struct series *o2 = stats_series(sh2, "r", "u2", "other", false, true);
	assert_ptr_not_equal(stats_series(sh2, "r", "u2", "a", false, true), o2);
	assert_ptr_not_equal(stats_series(sh2, "r", "u", "b", false, true), o2);
	assert_ptr_equal(stats_series(sh2, "r", "u2", "c", false, true), o2);
	/* another route has a budget of its own */
	assert_ptr_not_equal(stats_series(sh2, "r2", "u", "c", false, true),
			     stats_series(sh2, "r2", "u", "other", false, true));
	/* a failed answer admits no name, but stays under one already admitted */
	struct series *o3 = stats_series(sh2, "r3", "u", "other", false, true);
	assert_ptr_equal(stats_series(sh2, "r3", "u", "x", false, false), o3);
	struct series *y = stats_series(sh2, "r3", "u", "y", false, true);
	assert_ptr_not_equal(y, o3);
	assert_ptr_equal(stats_series(sh2, "r3", "u", "y", false, false), y);
	assert_ptr_not_equal(stats_series(sh2, "r3", "u", "y", true, false), o3);
	assert_ptr_equal(stats_series(sh2, "r3", "u", "x", true, false),
			 stats_series(sh2, "r3", "u", "other", true, true));
	assert_ptr_not_equal(stats_series(sh2, "r3", "u", "x", false, true), o3);
	stats_shard_free(sh2);
	stats_shard_free(sh);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slice_encode_roundtrip),
		cmocka_unit_test(test_log2_buckets),
		cmocka_unit_test(test_itl_rounds_to_nearest),
		cmocka_unit_test(test_model_cap),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
