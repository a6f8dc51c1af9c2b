/*
 * test_timeline.c — a request's token-event record: the first token event
 * starts the timeline's decode phase, each later one adds a gap (kept only
 * when asked for, always counted, summed and maxed), and a stamp earlier
 * than the last one (two clocks' readings that disagree by a little, as a
 * kernel receive stamp mapped onto CLOCK_MONOTONIC can) never makes a
 * negative gap. What each token event carries marks the reasoning span and
 * the first answer token, from which answer_ttft and reasoning derive.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
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
	assert_false(record_token_event(&r, TOKEN_ANSWER, 100 * US, &gap));
	assert_int_equal(gap, 7); /* the first token has no gap */
	assert_int_equal(r.at[TL_FIRST_TOKEN], 100 * US);
	assert_true(record_token_event(&r, TOKEN_ANSWER, 130 * US, &gap));
	assert_int_equal(gap, 30 * US);
	assert_true(record_token_event(&r, TOKEN_ANSWER, 140 * US, &gap));
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
	assert_false(record_token_event(&r, TOKEN_ANSWER, 100 * US, &gap));
	assert_true(record_token_event(&r, TOKEN_ANSWER, 200 * US, &gap));
	assert_true(record_token_event(&r, TOKEN_ANSWER, 199 * US, &gap)); /* 1 µs early */
	assert_int_equal(gap, 0);
	assert_int_equal(r.at[TL_LAST_TOKEN], 200 * US); /* the timeline does not go back */
	assert_int_equal(r.itl_max, 100 * US);
	assert_int_equal(r.itl_sum, 100 * US);
	assert_int_equal(r.itl_ns[1], 0);
	assert_true(record_token_event(&r, TOKEN_ANSWER, 250 * US, &gap));
	assert_int_equal(gap, 50 * US);
	assert_int_equal(r.itl_total, 3);
	record_release(&r);
}

/* An empty record, no usage reported, arrived at 1 ms. */
static void record_arrived(struct req_record *r)
{
	memset(r, 0, sizeof(*r));
	r->usage = USAGE_UNKNOWN;
	r->at[TL_ARRIVE] = 1000 * US;
}

/* Reasoning first, then the answer: ttft is the first token of any kind,
 * answer_ttft the first that is not reasoning, reasoning the span from the
 * first reasoning token to the last; gaps run across both. */
static void test_reasoning_then_answer(void **state)
{
	struct req_record r;
	double m[RM__COUNT];
	uint64_t gap;

	(void)state;
	record_arrived(&r);
	r.at[TL_REQ_SENT] = 1000 * US;
	assert_false(record_token_event(&r, TOKEN_REASONING, 1100 * US, &gap));
	assert_true(record_token_event(&r, TOKEN_REASONING, 1200 * US, &gap));
	assert_true(record_token_event(&r, TOKEN_REASONING, 1700 * US, &gap));
	assert_true(record_token_event(&r, TOKEN_ANSWER, 2000 * US, &gap));
	assert_int_equal(gap, 300 * US);
	assert_true(record_token_event(&r, TOKEN_TOOL, 2010 * US, &gap));
	assert_true(record_token_event(&r, TOKEN_ANSWER, 2020 * US, &gap));
	/* reasoning after the answer stretches the span */
	assert_true(record_token_event(&r, TOKEN_REASONING, 2030 * US, &gap));
	r.at[TL_RESP_END] = 2040 * US;
	assert_int_equal(r.token_events, 7);
	assert_int_equal(r.reasoning_events, 4);
	assert_int_equal(r.tool_call_events, 1);
	assert_int_equal(r.at[TL_FIRST_TOKEN], 1100 * US);
	assert_int_equal(r.at[TL_FIRST_REASONING], 1100 * US);
	assert_int_equal(r.at[TL_LAST_REASONING], 2030 * US);
	assert_int_equal(r.at[TL_FIRST_ANSWER], 2000 * US);
	assert_int_equal(r.at[TL_LAST_TOKEN], 2030 * US);
	assert_int_equal(r.itl_total, 6);
	record_derive(&r, m);
	assert_float_equal(m[RM_TTFT], 0.1, 1e-9);
	assert_float_equal(m[RM_ANSWER_TTFT], 1.0, 1e-9);
	assert_float_equal(m[RM_REASONING], 0.93, 1e-9);
	assert_string_equal(req_metric_key(RM_ANSWER_TTFT), "answer_ttft_ms");
	assert_string_equal(req_metric_key(RM_REASONING), "reasoning_ms");
	record_release(&r);
}

/* Without reasoning the answer ttft is the ttft and there is no span; a
 * tool call is an answer token; a stream that only reasoned has no answer
 * ttft. */
static void test_answer_without_reasoning(void **state)
{
	struct req_record r;
	double m[RM__COUNT];
	uint64_t gap;

	(void)state;
	record_arrived(&r);
	record_token_event(&r, TOKEN_TOOL, 1500 * US, &gap);
	record_token_event(&r, TOKEN_ANSWER, 1600 * US, &gap);
	record_derive(&r, m);
	assert_float_equal(m[RM_TTFT], 0.5, 1e-9);
	assert_float_equal(m[RM_ANSWER_TTFT], 0.5, 1e-9);
	assert_true(isnan(m[RM_REASONING]));
	assert_int_equal(r.reasoning_events, 0);
	assert_int_equal(r.tool_call_events, 1);

	record_arrived(&r);
	record_token_event(&r, TOKEN_REASONING, 1500 * US, &gap);
	record_derive(&r, m);
	assert_float_equal(m[RM_TTFT], 0.5, 1e-9);
	assert_true(isnan(m[RM_ANSWER_TTFT]));
	assert_float_equal(m[RM_REASONING], 0.0, 1e-9);
	assert_int_equal(r.at[TL_FIRST_ANSWER], 0);
	record_release(&r);
}

/* record_token_event_fast() leaves the record as record_token_event() does,
 * for every kind, time order, keeping or not, through itl_ns's growth and
 * past ITL_SAMPLES_MAX. */
static void test_fast_path_same_record(void **state)
{
	static const enum token_kind kinds[] = { TOKEN_ANSWER, TOKEN_ANSWER, TOKEN_REASONING, TOKEN_ANSWER,
						 TOKEN_TOOL,   TOKEN_ANSWER, TOKEN_ANSWER,    TOKEN_ANSWER };
	(void)state;
	for (int keep = 0; keep < 2; keep++) {
		struct req_record a, b;
		memset(&a, 0, sizeof(a));
		memset(&b, 0, sizeof(b));
		a.itl_keep = b.itl_keep = keep;
		uint64_t now = 1000 * US, ga = 0, gb = 0;
		for (unsigned i = 0; i < ITL_SAMPLES_MAX + 300; i++) {
			enum token_kind k = i < 4 ? TOKEN_REASONING : kinds[(i * 7u) % 8];
			/* mostly forward, now and then the same stamp or one before */
			now += (i % 5 == 0) ? 0 : (i % 11 == 0) ? (uint64_t)-3 : 17 * US;
			bool ra = record_token_event(&a, k, now, &ga);
			bool rb = record_token_event_fast(&b, k, now, &gb);
			assert_int_equal(ra, rb);
			assert_int_equal(ga, gb);
		}
		assert_memory_equal(a.at, b.at, sizeof(a.at));
		assert_int_equal(a.token_events, b.token_events);
		assert_int_equal(a.reasoning_events, b.reasoning_events);
		assert_int_equal(a.tool_call_events, b.tool_call_events);
		assert_int_equal(a.itl_total, b.itl_total);
		assert_int_equal(a.itl_sum, b.itl_sum);
		assert_int_equal(a.itl_max, b.itl_max);
		assert_int_equal(a.itl_n, b.itl_n);
		assert_int_equal(a.itl_n, keep ? ITL_SAMPLES_MAX : 0);
		if (a.itl_n)
			assert_memory_equal(a.itl_ns, b.itl_ns, a.itl_n * sizeof(a.itl_ns[0]));
		record_release(&a);
		record_release(&b);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gaps_counted_and_kept),
		cmocka_unit_test(test_stamp_before_the_last_is_a_zero_gap),
		cmocka_unit_test(test_reasoning_then_answer),
		cmocka_unit_test(test_answer_without_reasoning),
		cmocka_unit_test(test_fast_path_same_record),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
