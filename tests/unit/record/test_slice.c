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
#include "varint.h"

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

/* A slice as main's encoder wrote it before answer TTFT and reasoning
 * were recorded (layout version 1: 11
 * counters then the error kinds; histogram slots 12 metrics, then the load
 * curves, then the prompt buckets): counters 100 + i at every position;
 * ttft 3 x 50 ms; inflight 4; the ITL load curve's bucket 2, 7 x 1.5 ms;
 * the prompt bucket 9, 2 x 80 ms; the last prompt bucket, 120 ms. */
static const uint8_t slice_v1_fixture[] = {
	0x01, 0x15, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71,
	0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x05, 0x00, 0x0e, 0x03, 0xf0, 0x93, 0x09, 0xd0, 0x86,
	0x03, 0xd0, 0x86, 0x03, 0x02, 0x89, 0x04, 0x03, 0x0b, 0x07, 0x01, 0x04, 0x04, 0x04, 0x02, 0x04,
	0x01, 0x1a, 0x0b, 0x07, 0x84, 0x52, 0xdc, 0x0b, 0xdc, 0x0b, 0x02, 0xd3, 0x02, 0x07, 0x39, 0x0e,
	0x02, 0x80, 0xe2, 0x09, 0x80, 0xf1, 0x04, 0x80, 0xf1, 0x04, 0x02, 0xa2, 0x04, 0x02, 0x45, 0x0e,
	0x01, 0xc0, 0xa9, 0x07, 0xc0, 0xa9, 0x07, 0xc0, 0xa9, 0x07, 0x02, 0xb7, 0x04, 0x01,
};

static void assert_v1_fixture_values(const struct slice *b)
{
	/* the counters of version 1 keep their meaning */
	for (unsigned c = 0; c < CT_CACHED_TOKENS; c++)
		assert_int_equal(b->counters[c], 100 + c);
	for (unsigned e = 0; e < REQ_ERR_NO_MEMORY; e++) /* the ten kinds it had */
		assert_int_equal(b->counters[CT_ERR_BASE + e], 100 + 11 + e);
	assert_int_equal(b->counters[CT_ERR_BASE + REQ_ERR_NO_MEMORY], 0); /* a kind added since reads 0 */
	for (unsigned c = CT_CACHED_TOKENS; c < CT_ERR_BASE; c++)
		assert_int_equal(b->counters[c], 0);
	assert_int_equal(b->slot[HM_TTFT]->count, 3);
	assert_int_equal(b->slot[HM_TTFT]->min, 50000);
	assert_int_equal(b->slot[HM_INFLIGHT]->count, 1);
	assert_int_equal(b->slot[HM_INFLIGHT]->max, 4);
	assert_int_equal(b->slot[SLOT_CURVE(CURVE_ITL, 2)]->count, 7);
	assert_int_equal(b->slot[SLOT_CURVE(CURVE_ITL, 2)]->min, 1500);
	/* version 1 keyed the prompt curve on the prompt as reported: with no
	 * caching reported that is the prefill too, so both curves get it */
	for (int raw = 0; raw < 2; raw++) {
		unsigned s9 = raw ? SLOT_PROMPT_RAW(9) : SLOT_PROMPT(9);
		unsigned slast = raw ? SLOT_PROMPT_RAW(PROMPT_BUCKETS - 1) : SLOT_PROMPT(PROMPT_BUCKETS - 1);
		assert_int_equal(b->slot[s9]->count, 2);
		assert_int_equal(b->slot[s9]->min, 80000);
		assert_int_equal(b->slot[slast]->count, 1);
		assert_int_equal(b->slot[slast]->max, 120000);
	}
	unsigned used = 0;
	for (unsigned i = 0; i < SLICE_SLOTS; i++)
		used += b->slot[i] && b->slot[i]->count;
	assert_int_equal(used, 7);
	assert_true(!b->slot[HM_ANSWER_TTFT] || !b->slot[HM_ANSWER_TTFT]->count);
}

/* A slice as main's encoder wrote it once answer TTFT and reasoning were
 * recorded (version 2: 25 counters,
 * slots at fixed positions, 14 metrics then 3 load curves then 2 prompt
 * curves): counters 100 + i at every position; ttft 3 x 50 ms; inflight 4;
 * answer_ttft 2 x 30 ms; reasoning 20 ms; the ITL load curve's bucket 2,
 * 7 x 1.5 ms; the prefill prompt curve's bucket 9, 2 x 80 ms; the raw one's
 * bucket 10, 120 ms, and its last, 130 ms. */
static const uint8_t slice_v2_fixture[] = {
	0x02, 0x19, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72,
	0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7a, 0x7b, 0x7c, 0x08, 0x00, 0x0e, 0x03, 0xf0, 0x93, 0x09,
	0xd0, 0x86, 0x03, 0xd0, 0x86, 0x03, 0x02, 0x89, 0x04, 0x03, 0x0b, 0x07, 0x01, 0x04, 0x04, 0x04, 0x02,
	0x04, 0x01, 0x0c, 0x0e, 0x02, 0xe0, 0xd4, 0x03, 0xb0, 0xea, 0x01, 0xb0, 0xea, 0x01, 0x02, 0xef, 0x03,
	0x02, 0x0d, 0x0e, 0x01, 0xa0, 0x9c, 0x01, 0xa0, 0x9c, 0x01, 0xa0, 0x9c, 0x01, 0x02, 0xda, 0x03, 0x01,
	0x1c, 0x0b, 0x07, 0x84, 0x52, 0xdc, 0x0b, 0xdc, 0x0b, 0x02, 0xd3, 0x02, 0x07, 0x3b, 0x0e, 0x02, 0x80,
	0xe2, 0x09, 0x80, 0xf1, 0x04, 0x80, 0xf1, 0x04, 0x02, 0xa2, 0x04, 0x02, 0x52, 0x0e, 0x01, 0xc0, 0xa9,
	0x07, 0xc0, 0xa9, 0x07, 0xc0, 0xa9, 0x07, 0x02, 0xb7, 0x04, 0x01, 0x5d, 0x0e, 0x01, 0xd0, 0xf7, 0x07,
	0xd0, 0xf7, 0x07, 0xd0, 0xf7, 0x07, 0x02, 0xbb, 0x04, 0x01,
};

static void assert_v2_fixture_values(const struct slice *b)
{
	for (unsigned c = 0; c < CT_ERR_BASE + REQ_ERR_NO_MEMORY; c++) /* the 25 it had */
		assert_int_equal(b->counters[c], 100 + c);
	assert_int_equal(b->counters[CT_ERR_BASE + REQ_ERR_NO_MEMORY], 0); /* a kind added since reads 0 */
	assert_int_equal(b->slot[HM_TTFT]->count, 3);
	assert_int_equal(b->slot[HM_TTFT]->min, 50000);
	assert_int_equal(b->slot[HM_INFLIGHT]->max, 4);
	assert_int_equal(b->slot[HM_ANSWER_TTFT]->count, 2);
	assert_int_equal(b->slot[HM_ANSWER_TTFT]->min, 30000);
	assert_int_equal(b->slot[HM_REASONING]->count, 1);
	assert_int_equal(b->slot[HM_REASONING]->max, 20000);
	assert_int_equal(b->slot[SLOT_CURVE(CURVE_ITL, 2)]->count, 7);
	assert_int_equal(b->slot[SLOT_CURVE(CURVE_ITL, 2)]->sum, 7 * 1500);
	assert_int_equal(b->slot[SLOT_PROMPT(9)]->count, 2);
	assert_int_equal(b->slot[SLOT_PROMPT(9)]->min, 80000);
	assert_int_equal(b->slot[SLOT_PROMPT_RAW(10)]->max, 120000);
	assert_int_equal(b->slot[SLOT_PROMPT_RAW(PROMPT_BUCKETS - 1)]->max, 130000);
	unsigned used = 0;
	for (unsigned i = 0; i < SLICE_SLOTS; i++)
		used += b->slot[i] && b->slot[i]->count;
	assert_int_equal(used, 8);
}

/* Version 2 reads back the same, and is written again in today's layout. */
static void test_slice_decodes_version_2(void **state)
{
	struct slice b, c;
	uint8_t *blob = NULL;
	(void)state;

	memset(&b, 0, sizeof(b));
	memset(&c, 0, sizeof(c));
	assert_int_equal(slice_decode_merge(&b, slice_v2_fixture, sizeof(slice_v2_fixture)), 0);
	assert_v2_fixture_values(&b);
	size_t len = slice_encode(&b, &blob);
	assert_true(len > 0);
	assert_int_equal(blob[0], 3);
	/* the layout costs 4 bytes: a count of kinds and a count per kind; the
	 * error kind added since (no_memory, 0) one more */
	assert_int_equal(len, sizeof(slice_v2_fixture) + 4 + 1);
	assert_int_equal(slice_decode_merge(&c, blob, len), 0);
	assert_v2_fixture_values(&c);
	free(blob);
	slice_release(&b);
	slice_release(&c);
}

/* Appends `n` bytes to a blob being built. */
static size_t put(uint8_t *buf, size_t at, const uint8_t *src, size_t n)
{
	memcpy(buf + at, src, n);
	return at + n;
}

/* Appends a histogram at `slot`: the v2 fixture's ttft (3 x 50 ms, 14
 * bytes), as a version-3 slice lists it. */
static size_t put_ttft(uint8_t *buf, size_t at, unsigned slot)
{
	at += varint_put(buf + at, slot);
	buf[at++] = 14;
	return put(buf, at, slice_v2_fixture + 30, 14);
}

/* A version-3 slice carries its layout: one from a writer with fewer rows
 * (12 metrics, as before answer_ttft) reads with the rows it lacks empty and
 * its curves where they are today; one from a writer with more (another
 * metric, a fourth load curve, a third prompt curve, a fourth kind) reads
 * with the rows this reader lacks skipped; slots past the layout are
 * refused. The histogram in each is the v2 fixture's ttft (3 x 50 ms). */
static void test_slice_layout_appends(void **state)
{
	uint8_t buf[256];
	struct slice b;
	size_t n = 0;
	(void)state;

	/* older: 1 counter; layout 12 metrics, 3 curves, 1 prompt curve; the
	 * ttft at slot 0 and at slot 12, the first load curve's bucket 0 */
	const uint8_t head_old[] = { 3, 1, 9, 3, 12, 3, 1, 2 };
	n = put(buf, n, head_old, sizeof(head_old));
	n = put_ttft(buf, n, 0);
	n = put_ttft(buf, n, 12);
	memset(&b, 0, sizeof(b));
	assert_int_equal(slice_decode_merge(&b, buf, n), 0);
	assert_int_equal(b.counters[0], 9);
	assert_int_equal(b.slot[HM_TTFT]->count, 3);
	assert_int_equal(b.slot[SLOT_CURVE(CURVE_TTFT, 0)]->count, 3);
	assert_int_equal(b.slot[SLOT_CURVE(CURVE_TTFT, 0)]->min, 50000);
	assert_null(b.slot[HM_ANSWER_TTFT]);
	/* slot 12 + 3 x 12 + 22 = 70 is past that layout */
	buf[sizeof(head_old) + 16] = 70;
	assert_int_equal(slice_decode_merge(&b, buf, n), -1);
	buf[sizeof(head_old) + 16] = 69; /* the last prompt bucket */
	assert_int_equal(slice_decode_merge(&b, buf, n), 0);
	assert_int_equal(b.slot[SLOT_PROMPT(PROMPT_BUCKETS - 1)]->count, 3);
	assert_null(b.slot[SLOT_PROMPT_RAW(PROMPT_BUCKETS - 1)]);
	slice_release(&b);

	/* newer: layout HM__COUNT + 1 metrics, one load curve more than
	 * ours, 3 prompt curves and a fourth kind with 2 rows; histograms at
	 * the unknown metric, at the unknown curve, at the third prompt curve
	 * and past all of them (the fourth kind), all skipped; and at the
	 * second prompt curve's bucket 5, kept */
	const unsigned m = HM__COUNT + 1, cv = m + (CURVE__COUNT + 1) * INFLIGHT_BUCKETS;
	const unsigned slots[] = { HM__COUNT, m + CURVE__COUNT * INFLIGHT_BUCKETS, cv + 2 * PROMPT_BUCKETS + 1,
				   cv + 3 * PROMPT_BUCKETS + 5, cv + PROMPT_BUCKETS + 5 };
	n = 0;
	const uint8_t head_new[] = { 3, 0, 4, (uint8_t)m, CURVE__COUNT + 1, 3, 2, 5 };
	n = put(buf, n, head_new, sizeof(head_new));
	for (unsigned i = 0; i < 5; i++)
		n = put_ttft(buf, n, slots[i]);
	memset(&b, 0, sizeof(b));
	assert_int_equal(slice_decode_merge(&b, buf, n), 0);
	unsigned used = 0;
	for (unsigned i = 0; i < SLICE_SLOTS; i++)
		used += b.slot[i] && b.slot[i]->count;
	assert_int_equal(used, 1);
	assert_int_equal(b.slot[SLOT_PROMPT_RAW(5)]->count, 3);
	slice_release(&b);
}

/* Stored data written before the layout grew reads back the same. */
static void test_slice_decodes_version_1(void **state)
{
	struct slice b, c;
	uint8_t *blob = NULL;
	(void)state;

	memset(&b, 0, sizeof(b));
	memset(&c, 0, sizeof(c));
	assert_int_equal(slice_decode_merge(&b, slice_v1_fixture, sizeof(slice_v1_fixture)), 0);
	assert_v1_fixture_values(&b);
	/* and once migrated, it is written and read back in today's layout */
	size_t len = slice_encode(&b, &blob);
	assert_true(len > 0);
	assert_int_not_equal(blob[0], 1);
	assert_int_equal(slice_decode_merge(&c, blob, len), 0);
	assert_v1_fixture_values(&c);
	/* a version-1 slot past its layout (70 slots) is refused, not
	 * misplaced: the fixture's ttft histogram (bytes 26 to 39) under slot
	 * 69, then 70 */
	uint8_t one[5 + 14] = { 0x01, 0x00, 0x01, 69, 0x0e };
	memcpy(one + 5, slice_v1_fixture + 26, 14);
	assert_int_equal(slice_decode_merge(&c, one, sizeof(one)), 0);
	one[3] = 70;
	assert_int_equal(slice_decode_merge(&c, one, sizeof(one)), -1);
	free(blob);
	slice_release(&b);
	slice_release(&c);
}

/* A reasoning request with caching reported: answer_ttft and reasoning
 * histograms, the usage-detail counters, the cache hit ratio's
 * denominator, and the prompt curve keyed on prefill with the raw prompt
 * kept beside it. */
static void test_slice_records_reasoning_and_cache(void **state)
{
	struct slice sl;
	struct req_record r;
	uint64_t gap;
	(void)state;

	memset(&sl, 0, sizeof(sl));
	fake_request(&r, 1000, 0, 0);
	r.usage.input_tokens = 1000;
	r.usage.cached_tokens = 900;
	r.usage.cache_write_tokens = 50;
	r.usage.reasoning_tokens = 30;
	r.usage.output_tokens = 40;
	uint64_t t0 = r.at[TL_ARRIVE];
	record_token_event(&r, TOKEN_REASONING, t0 + 10000000, &gap); /* 10 ms */
	record_token_event(&r, TOKEN_REASONING, t0 + 30000000, &gap);
	record_token_event(&r, TOKEN_ANSWER, t0 + 45000000, &gap); /* 45 ms */
	r.at[TL_RESP_END] = t0 + 50000000;
	slice_record_request(&sl, &r, 1, &test_slo);
	record_release(&r);
	assert_int_equal(sl.slot[HM_TTFT]->min, 10000);
	assert_int_equal(sl.slot[HM_ANSWER_TTFT]->count, 1);
	assert_int_equal(sl.slot[HM_ANSWER_TTFT]->min, 45000);
	assert_int_equal(sl.slot[HM_REASONING]->min, 20000);
	assert_int_equal(sl.counters[CT_CACHED_TOKENS], 900);
	assert_int_equal(sl.counters[CT_CACHE_WRITE_TOKENS], 50);
	assert_int_equal(sl.counters[CT_REASONING_TOKENS], 30);
	assert_int_equal(sl.counters[CT_CACHE_REPORTED_INPUT_TOKENS], 1000);
	assert_int_equal(sl.counters[CT_INPUT_TOKENS], 1000);
	/* prefill 100 tokens: bucket 7 (65-128); the prompt, 1000: bucket 10 */
	assert_int_equal(sl.slot[SLOT_PROMPT(log2_bucket(100, PROMPT_BUCKETS))]->count, 1);
	assert_int_equal(sl.slot[SLOT_PROMPT(log2_bucket(100, PROMPT_BUCKETS))]->min, 10000);
	assert_int_equal(sl.slot[SLOT_PROMPT_RAW(log2_bucket(1000, PROMPT_BUCKETS))]->count, 1);
	assert_null(sl.slot[SLOT_PROMPT(log2_bucket(1000, PROMPT_BUCKETS))]);

	/* no caching reported: both curves on the prompt, no denominator;
	 * no reasoning: answer_ttft is the ttft, no reasoning span */
	fake_request(&r, 2000, 3, 1000);
	r.usage.input_tokens = 1000;
	slice_record_request(&sl, &r, 1, &test_slo);
	record_release(&r);
	assert_int_equal(sl.counters[CT_CACHE_REPORTED_INPUT_TOKENS], 1000);
	assert_int_equal(sl.counters[CT_CACHED_TOKENS], 900);
	assert_int_equal(sl.counters[CT_INPUT_TOKENS], 2000);
	assert_int_equal(sl.slot[SLOT_PROMPT(log2_bucket(1000, PROMPT_BUCKETS))]->count, 1);
	assert_int_equal(sl.slot[SLOT_PROMPT_RAW(log2_bucket(1000, PROMPT_BUCKETS))]->count, 2);
	assert_int_equal(sl.slot[HM_ANSWER_TTFT]->count, 2);
	assert_int_equal(sl.slot[HM_ANSWER_TTFT]->min, 2000);
	assert_int_equal(sl.slot[HM_REASONING]->count, 1);
	/* cached tokens without the input they are part of: not counted, the
	 * ratio's numerator never outgrows its denominator */
	fake_request(&r, 2000, 3, 1000);
	r.usage.input_tokens = -1;
	r.usage.cached_tokens = 500;
	slice_record_request(&sl, &r, 1, &test_slo);
	record_release(&r);
	assert_int_equal(sl.counters[CT_CACHED_TOKENS], 900);
	assert_int_equal(sl.counters[CT_CACHE_REPORTED_INPUT_TOKENS], 1000);
	assert_string_equal(hist_metric_name(HM_ANSWER_TTFT), "answer_ttft");
	assert_string_equal(hist_metric_name(HM_REASONING), "reasoning");
	assert_string_equal(slice_counter_name(CT_CACHED_TOKENS), "cached_tokens");
	assert_string_equal(slice_counter_name(CT_CACHE_WRITE_TOKENS), "cache_write_tokens");
	assert_string_equal(slice_counter_name(CT_REASONING_TOKENS), "reasoning_tokens");
	slice_release(&sl);
}

/* The TTFT decomposition per series: upload for every request, the server
 * phases and the remainder only for requests whose server reported them;
 * a remainder below 0 (clocks disagreeing) is kept as 0, so that every
 * reporting request counts. */
static void test_slice_records_decomposition(void **state)
{
	struct slice sl;
	struct req_record r;
	(void)state;

	memset(&sl, 0, sizeof(sl));
	fake_request(&r, 50000, 4, 1000); /* ttft 50 ms; request sent 2 µs in */
	r.usage.server.source = SERVER_VLLM;
	r.usage.server.queue_ns = 20000000;
	r.usage.server.prefill_ns = 25000000;
	r.usage.server.decode_ns = 3000000;
	slice_record_request(&sl, &r, 1, &test_slo);
	record_release(&r);
	assert_int_equal(sl.slot[HM_UPLOAD]->count, 1);
	assert_int_equal(sl.slot[HM_UPLOAD]->max, 1);
	assert_int_equal(sl.slot[HM_SERVER_QUEUE]->max, 20000);
	assert_int_equal(sl.slot[HM_SERVER_PREFILL]->max, 25000);
	assert_int_equal(sl.slot[HM_SERVER_DECODE]->max, 3000);
	assert_int_equal(sl.slot[HM_UNATTRIBUTED]->max, 50000 - 2 - 45000);
	assert_null(sl.slot[HM_SERVER_LOAD]);
	assert_null(sl.slot[HM_SERVER_INFERENCE]);

	/* the server said nothing: tokentap's phases only */
	fake_request(&r, 40000, 4, 1000);
	slice_record_request(&sl, &r, 1, &test_slo);
	record_release(&r);
	assert_int_equal(sl.slot[HM_UPLOAD]->count, 2);
	assert_int_equal(sl.slot[HM_SERVER_QUEUE]->count, 1);
	assert_int_equal(sl.slot[HM_UNATTRIBUTED]->count, 1);

	/* Ollama's load and TGI's inference; a remainder below 0 is 0 */
	fake_request(&r, 10000, 4, 1000);
	r.usage.server.source = SERVER_OLLAMA;
	r.usage.server.load_ns = 7000000;
	r.usage.server.prefill_ns = 4000000;
	slice_record_request(&sl, &r, 1, &test_slo);
	record_release(&r);
	assert_int_equal(sl.slot[HM_SERVER_LOAD]->max, 7000);
	assert_int_equal(sl.slot[HM_UNATTRIBUTED]->count, 2);
	assert_int_equal(sl.slot[HM_UNATTRIBUTED]->min, 0);
	fake_request(&r, 10000, 0, 0);
	r.usage.server.source = SERVER_TGI;
	r.usage.server.inference_ns = 6000000;
	slice_record_request(&sl, &r, 1, &test_slo);
	record_release(&r);
	assert_int_equal(sl.slot[HM_SERVER_INFERENCE]->max, 6000);
	assert_int_equal(sl.slot[HM_SERVER_QUEUE]->count, 1);
	assert_string_equal(hist_metric_name(HM_SERVER_QUEUE), "server_queue");
	assert_string_equal(hist_metric_name(HM_UNATTRIBUTED), "unattributed");
	slice_release(&sl);
}

/* The engine-queue curve: ttft and e2e by the engine's waiting at dispatch
 * (0, 1, 2-3, 4-7, ... buckets), only for a fresh engine view that reports
 * waiting; beside the in-flight curve, which counts every request. */
static void test_slice_records_engine_queue(void **state)
{
	struct slice sl, back;
	struct req_record r;
	uint8_t *blob = NULL;
	(void)state;

	assert_int_equal(engine_queue_bucket(0), 0);
	assert_int_equal(engine_queue_bucket(1), 1);
	assert_int_equal(engine_queue_bucket(2), 2);
	assert_int_equal(engine_queue_bucket(3), 2);
	assert_int_equal(engine_queue_bucket(4), 3);
	assert_int_equal(engine_queue_bucket(7), 3);
	assert_int_equal(engine_queue_bucket(8), 4);
	assert_int_equal(engine_queue_bucket(UINT64_MAX), ENGINE_QUEUE_BUCKETS - 1);
	for (unsigned b = 0; b < ENGINE_QUEUE_BUCKETS; b++) {
		assert_int_equal(engine_queue_bucket(engine_queue_low(b)), b);
		if (b + 1 < ENGINE_QUEUE_BUCKETS) {
			assert_int_equal(engine_queue_bucket(engine_queue_high(b)), b);
			assert_int_equal(engine_queue_low(b + 1), engine_queue_high(b) + 1);
		}
	}
	assert_int_equal(engine_queue_high(ENGINE_QUEUE_BUCKETS - 1), UINT64_MAX);

	memset(&sl, 0, sizeof(sl));
	const struct {
		bool known, fresh;
		int64_t waiting;
		uint64_t ttft_us;
	} reqs[] = {
		{ true, true, 0, 10000 },   { true, true, 5, 30000 },
		{ true, true, 6, 40000 },   { true, false, 6, 90000 }, /* stale: the last scrape failed */
		{ false, false, 0, 80000 },			       /* never scraped */
		{ true, true, -1, 70000 },			       /* the engine reports no queue */
	};
	for (unsigned i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
		fake_request(&r, reqs[i].ttft_us, 4, 1000);
		r.engine.known = reqs[i].known;
		r.engine.fresh = reqs[i].fresh;
		r.engine.waiting = reqs[i].waiting;
		r.engine.running = 2;
		slice_record_request(&sl, &r, 3, &test_slo);
		record_release(&r);
	}
	assert_int_equal(sl.slot[SLOT_CURVE(CURVE_TTFT, log2_bucket(3, INFLIGHT_BUCKETS))]->count, 6);
	assert_int_equal(sl.slot[SLOT_CURVE(CURVE_QUEUE_TTFT, 0)]->count, 1);
	assert_int_equal(sl.slot[SLOT_CURVE(CURVE_QUEUE_TTFT, 0)]->max, 10000);
	assert_int_equal(sl.slot[SLOT_CURVE(CURVE_QUEUE_TTFT, 3)]->count, 2);
	assert_int_equal(sl.slot[SLOT_CURVE(CURVE_QUEUE_TTFT, 3)]->min, 30000);
	assert_int_equal(sl.slot[SLOT_CURVE(CURVE_QUEUE_TTFT, 3)]->max, 40000);
	assert_int_equal(sl.slot[SLOT_CURVE(CURVE_QUEUE_E2E, 3)]->count, 2);
	unsigned used = 0;
	for (unsigned b = 0; b < ENGINE_QUEUE_BUCKETS; b++)
		used += sl.slot[SLOT_CURVE(CURVE_QUEUE_TTFT, b)] != NULL;
	assert_int_equal(used, 2);

	/* stored and read back in today's layout */
	size_t len = slice_encode(&sl, &blob);
	assert_true(len > 0);
	memset(&back, 0, sizeof(back));
	assert_int_equal(slice_decode_merge(&back, blob, len), 0);
	assert_int_equal(back.slot[SLOT_CURVE(CURVE_QUEUE_TTFT, 3)]->count, 2);
	assert_int_equal(back.slot[SLOT_CURVE(CURVE_QUEUE_E2E, 0)]->count, 1);
	free(blob);
	slice_release(&back);
	/* dropped with the other curves (minute slices keep none) */
	slice_drop_curves(&sl);
	assert_null(sl.slot[SLOT_CURVE(CURVE_QUEUE_TTFT, 3)]);
	slice_release(&sl);
}

/* A slice stored before the engine-queue curve (version 3 with 21 metrics,
 * 3 load curves and 2 prompt curves, as session 10 wrote it) reads with that
 * curve empty and its prompt curves where they are today, though today's
 * prompt curves moved two load-curve rows up. The histogram is the v2
 * fixture's ttft (3 x 50 ms): at the in-flight ttft curve's bucket 2 and
 * at the raw prompt curve's bucket 5. */
static void test_slice_decodes_before_engine_queue(void **state)
{
	uint8_t buf[256];
	struct slice b;
	size_t n = 0;
	(void)state;

	const uint8_t head[] = { 3, 1, 7, 3, 21, 3, 2, 2 };
	n = put(buf, n, head, sizeof(head));
	n = put_ttft(buf, n, 21 + 2);
	n = put_ttft(buf, n, 21 + 3 * INFLIGHT_BUCKETS + PROMPT_BUCKETS + 5);
	memset(&b, 0, sizeof(b));
	assert_int_equal(slice_decode_merge(&b, buf, n), 0);
	assert_int_equal(b.counters[0], 7);
	assert_int_equal(b.slot[SLOT_CURVE(CURVE_TTFT, 2)]->count, 3);
	assert_int_equal(b.slot[SLOT_PROMPT_RAW(5)]->count, 3);
	assert_int_equal(b.slot[SLOT_PROMPT_RAW(5)]->min, 50000);
	unsigned used = 0;
	for (unsigned i = 0; i < SLICE_SLOTS; i++)
		used += b.slot[i] && b.slot[i]->count;
	assert_int_equal(used, 2);
	for (unsigned q = 0; q < ENGINE_QUEUE_BUCKETS; q++) {
		assert_null(b.slot[SLOT_CURVE(CURVE_QUEUE_TTFT, q)]);
		assert_null(b.slot[SLOT_CURVE(CURVE_QUEUE_E2E, q)]);
	}
	slice_release(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slice_encode_roundtrip),
		cmocka_unit_test(test_log2_buckets),
		cmocka_unit_test(test_itl_rounds_to_nearest),
		cmocka_unit_test(test_model_cap),
		cmocka_unit_test(test_slice_decodes_version_1),
		cmocka_unit_test(test_slice_decodes_version_2),
		cmocka_unit_test(test_slice_layout_appends),
		cmocka_unit_test(test_slice_records_decomposition),
		cmocka_unit_test(test_slice_records_reasoning_and_cache),
		cmocka_unit_test(test_slice_records_engine_queue),
		cmocka_unit_test(test_slice_decodes_before_engine_queue),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
