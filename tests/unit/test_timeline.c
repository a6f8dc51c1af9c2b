/*
 * test_timeline.c — a request's token-event record: the first token event
 * starts the timeline's decode phase, each later one adds a gap (kept only
 * when asked for, always counted, summed and maxed), and a stamp earlier
 * than the last one (two clocks' readings that disagree by a little, as a
 * kernel receive stamp mapped onto CLOCK_MONOTONIC can) never makes a
 * negative gap.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "timeline.h"

#define US 1000ull /* ns */

static void test_gaps_counted_and_kept(void **state)
{
	struct req_record r;
	uint64_t gap = 7;

	(void)state;
	memset(&r, 0, sizeof(r));
	r.itl_keep = true;
	assert_false(record_token_event(&r, 100 * US, &gap));
	assert_int_equal(gap, 7); /* the first token has no gap */
	assert_int_equal(r.at[TL_FIRST_TOKEN], 100 * US);
	assert_true(record_token_event(&r, 130 * US, &gap));
	assert_int_equal(gap, 30 * US);
	assert_true(record_token_event(&r, 140 * US, &gap));
	assert_int_equal(gap, 10 * US);
	assert_int_equal(r.token_events, 3);
	assert_int_equal(r.itl_total, 2);
	assert_int_equal(r.itl_n, 2);
	assert_int_equal(r.itl_ns[0], 30 * US);
	assert_int_equal(r.itl_ns[1], 10 * US);
	assert_int_equal(r.itl_sum, 40 * US);
	assert_int_equal(r.itl_max, 30 * US);
	assert_int_equal(r.at[TL_LAST_TOKEN], 140 * US);
	record_release(&r);
	assert_null(r.itl_ns);
}

static void test_stamp_before_the_last_is_a_zero_gap(void **state)
{
	struct req_record r;
	uint64_t gap;

	(void)state;
	memset(&r, 0, sizeof(r));
	r.itl_keep = true;
	assert_false(record_token_event(&r, 100 * US, &gap));
	assert_true(record_token_event(&r, 200 * US, &gap));
	assert_true(record_token_event(&r, 199 * US, &gap)); /* 1 µs early */
	assert_int_equal(gap, 0);
	assert_int_equal(r.at[TL_LAST_TOKEN], 200 * US); /* the timeline does not go back */
	assert_int_equal(r.itl_max, 100 * US);
	assert_int_equal(r.itl_sum, 100 * US);
	assert_int_equal(r.itl_ns[1], 0);
	assert_true(record_token_event(&r, 250 * US, &gap));
	assert_int_equal(gap, 50 * US);
	assert_int_equal(r.itl_total, 3);
	record_release(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gaps_counted_and_kept),
		cmocka_unit_test(test_stamp_before_the_last_is_a_zero_gap),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
