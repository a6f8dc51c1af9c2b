/*
 * test_compare.c — the rank test and KS distance on histograms, against
 * values worked out by hand and against sampled distributions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compare.h"
#include "series_key.h"
#include "slice.h"
#include "store.h"
#include "testrand.h"

static struct hist *hnew(void)
{
	struct hist *h = malloc(sizeof(*h));
	assert_non_null(h);
	hist_init(h);
	return h;
}

static void test_hand_worked(void **state)
{
	struct hist *a = hnew(), *b = hnew();
	struct rank_test rt;

	/* a = {1, 2}, b = {3, 4}: every a below every b, U = 0 */
	hist_record(a, 1);
	hist_record(a, 2);
	hist_record(b, 3);
	hist_record(b, 4);
	rank_test_hist(a, b, &rt);
	assert_true(rt.u == 0);
	assert_true(rt.prob_a_greater == 0);
	assert_true(rt.z < 0);
	/* n = 4, no ties: var = 2*2/12 * 5 = 5/3; z = (0 - 2)/sqrt(5/3) */
	assert_true(fabs(rt.z - (-2 / sqrt(5.0 / 3))) < 1e-12);
	assert_true(fabs(ks_distance(a, b) - 1.0) < 1e-12);
	/* the other way round */
	rank_test_hist(b, a, &rt);
	assert_true(rt.u == 4 && rt.z > 0);
	/* ties count half: a = b = {5} */
	hist_init(a);
	hist_init(b);
	hist_record(a, 5);
	hist_record(b, 5);
	rank_test_hist(a, b, &rt);
	assert_true(rt.prob_a_greater == 0.5);
	assert_true(rt.p == 1);
	assert_true(ks_distance(a, b) == 0);
	/* empty sides say nothing */
	hist_init(b);
	rank_test_hist(a, b, &rt);
	assert_true(rt.p == 1 && rt.na == 0);
	free(a);
	free(b);
}

static void test_same_distribution_not_rejected(void **state)
{
	unsigned rejected = 0;

	/* 100 trials of two samples from one distribution: at the 1 % level
	 * about one rejection is expected, and far fewer than 10 */
	for (int trial = 0; trial < 100; trial++) {
		struct hist *a = hnew(), *b = hnew();
		struct rank_test rt;
		for (int i = 0; i < 2000; i++) {
			hist_record(a, (uint64_t)lognormal(50000, 0.4));
			hist_record(b, (uint64_t)lognormal(50000, 0.4));
		}
		rank_test_hist(a, b, &rt);
		rejected += rt.p < 0.01;
		assert_true(ks_distance(a, b) < ks_critical(a->count, b->count, 0.999));
		free(a);
		free(b);
	}
	assert_true(rejected < 10);
}

static void test_shift_detected(void **state)
{
	struct hist *a = hnew(), *b = hnew();
	struct rank_test rt;

	/* a 5 % slower median, 3000 samples each */
	for (int i = 0; i < 3000; i++) {
		hist_record(a, (uint64_t)lognormal(52500, 0.3));
		hist_record(b, (uint64_t)lognormal(50000, 0.3));
	}
	rank_test_hist(a, b, &rt);
	assert_true(rt.z > 3);
	assert_true(rt.p < 1e-3);
	assert_true(rt.prob_a_greater > 0.5);
	free(a);
	free(b);
}

static void test_ks_critical(void **state)
{
	/* the textbook coefficient 1.628 at 99 % for equal sizes */
	double d = ks_critical(1000, 1000, 0.99);
	assert_true(fabs(d - 1.6276 * sqrt(2000.0 / 1e6)) < 1e-3);
	assert_true(ks_critical(0, 10, 0.99) == 1);
}

/* Worked by hand: 10/100 against 20/100 pools to 0.15, se = sqrt(0.15 *
 * 0.85 * 0.02) = 0.0504975, z = -1.98030, p = 0.047670. */
static void test_prop_test(void **state)
{
	struct prop_test pt;

	(void)state;
	prop_test(10, 100, 20, 100, &pt);
	assert_true(fabs(pt.diff + 0.1) < 1e-12);
	assert_true(fabs(pt.z + 1.98030) < 1e-4);
	assert_true(fabs(pt.p - 0.047670) < 1e-5);
	prop_test(50, 1000, 100, 1000, &pt); /* 5 % against 10 %: clear at 99 % */
	assert_true(pt.p < 0.01 && pt.z < 0);
	prop_test(0, 500, 0, 700, &pt); /* no errors either side */
	assert_true(pt.p == 1 && pt.z == 0 && pt.diff == 0);
	prop_test(500, 500, 700, 700, &pt); /* all met the SLO both sides */
	assert_true(pt.p == 1 && pt.z == 0);
	prop_test(3, 0, 1, 10, &pt); /* no sample on one side */
	assert_true(pt.p == 1 && pt.z == 0);
	prop_test(50, 1000, 52, 1000, &pt); /* 5.0 % against 5.2 %: noise */
	assert_true(pt.p > 0.5);
}

/* One upstream's requests on route "chat": `n` of them, each phase's
 * histogram at the given value (µs; 0: the phase not recorded), the ttft
 * their sum. */
static void add_upstream(struct store_result *r, const char *up, uint64_t n, uint64_t server_queue_us,
			 uint64_t prefill_us, uint64_t unattributed_us)
{
	char key[SERIES_KEY_MAX];
	size_t len = series_key_build(key, "chat", up, "m", false);
	struct store_series *se = store_result_series(r, key, len);
	assert_non_null(se);
	struct slice *s = &se->slice;
	s->counters[CT_REQUESTS] = n;
	s->counters[CT_STATUS_2XX] = n;
	hist_record_n(slice_hist(s, HM_QUEUE), 20, n);
	hist_record_n(slice_hist(s, HM_CONNECT), 300, n);
	hist_record_n(slice_hist(s, HM_UPLOAD), 40, n);
	if (server_queue_us)
		hist_record_n(slice_hist(s, HM_SERVER_QUEUE), server_queue_us, n);
	hist_record_n(slice_hist(s, HM_SERVER_PREFILL), prefill_us, n);
	hist_record_n(slice_hist(s, HM_UNATTRIBUTED), unattributed_us, n);
	hist_record_n(slice_hist(s, HM_TTFT), 360 + server_queue_us + prefill_us + unattributed_us, n);
}

static json_t *compare_json(const struct store_result *r)
{
	json_error_t e;
	char *text = compare_render(r, "chat", WIN_5M, 1, 0, NULL, NULL);
	assert_non_null(text);
	json_t *doc = json_loads(text, 0, &e);
	free(text);
	assert_non_null(doc);
	return doc;
}

/* B's ttft is worse than A's because its requests wait in the engine's
 * queue: /compare says so, phase by phase, largest difference first, with
 * the counts behind each; a phase one side has no sample of comes last,
 * without a difference. */
static void test_attribution(void **state)
{
	struct store_result r;
	(void)state;

	memset(&r, 0, sizeof(r));
	r.start_sec = 1000;
	r.end_sec = 1099;
	add_upstream(&r, "fast", 100, 1000, 40000, 5000);
	add_upstream(&r, "slow", 60, 200000, 41000, 5000);
	json_t *doc = compare_json(&r);
	assert_string_equal(json_string_value(json_object_get(doc, "baseline")), "fast");
	json_t *slow = json_array_get(json_object_get(doc, "upstreams"), 1);
	json_t *sq = json_object_get(json_object_get(slow, "metrics"), "server_queue");
	assert_int_equal(json_integer_value(json_object_get(sq, "count")), 60);
	json_t *d = json_array_get(json_object_get(doc, "differences"), 0);
	json_t *a = json_object_get(d, "ttft_attribution");
	assert_non_null(a);
	assert_true(json_is_true(json_object_get(a, "slower")));
	assert_string_equal(json_string_value(json_object_get(a, "cause")), "server_queue");
	assert_string_equal(json_string_value(json_object_get(a, "cause_label")), "queueing (server)");
	assert_true(fabs(json_real_value(json_object_get(a, "ttft_p50_diff_ms")) - 200.0) < 3.0);
	json_t *ph = json_object_get(a, "phases");
	assert_int_equal(json_array_size(ph), 7);
	json_t *p0 = json_array_get(ph, 0), *p1 = json_array_get(ph, 1);
	assert_string_equal(json_string_value(json_object_get(p0, "phase")), "server_queue");
	assert_true(fabs(json_real_value(json_object_get(p0, "p50_diff_ms")) - 199.0) < 2.5);
	assert_true(fabs(json_real_value(json_object_get(p0, "p90_diff_ms")) - 199.0) < 2.5);
	assert_int_equal(json_integer_value(json_object_get(p0, "count")), 60);
	assert_int_equal(json_integer_value(json_object_get(p0, "baseline_count")), 100);
	assert_true(json_real_value(json_object_get(p0, "share")) > 0.95);
	assert_string_equal(json_string_value(json_object_get(p1, "phase")), "server_prefill");
	assert_true(fabs(json_real_value(json_object_get(p1, "p50_diff_ms")) - 1.0) < 0.5);
	/* the phases neither side lacks are all listed; server_load has no
	 * sample on either side and comes last, its differences null */
	json_t *last = json_array_get(ph, 6);
	assert_string_equal(json_string_value(json_object_get(last, "phase")), "server_load");
	assert_true(json_is_null(json_object_get(last, "p50_diff_ms")));
	assert_int_equal(json_integer_value(json_object_get(last, "count")), 0);
	json_decref(doc);
	store_result_free(&r);

	/* the other way round (the queue-bound upstream is the baseline): the
	 * faster one is not slower, and no cause is named */
	memset(&r, 0, sizeof(r));
	r.start_sec = 1000;
	r.end_sec = 1099;
	add_upstream(&r, "fast", 60, 1000, 40000, 5000);
	add_upstream(&r, "slow", 100, 200000, 41000, 5000);
	doc = compare_json(&r);
	a = json_object_get(json_array_get(json_object_get(doc, "differences"), 0), "ttft_attribution");
	assert_true(json_is_false(json_object_get(a, "slower")));
	assert_true(json_is_null(json_object_get(a, "cause")));
	json_decref(doc);
	store_result_free(&r);
}

/* A least_request route: the assignment is called load-dependent and the
 * verdicts not causal; equal_load compares only the in-flight levels both
 * upstreams were seen at (here 1 in flight, the same ttft: no difference),
 * not the whole, where the busy one's requests mostly met 5-8 in flight.
 * Under weights the same numbers are causal. */
static void test_load_dependent_assignment(void **state)
{
	struct store_result r;
	json_error_t e;
	(void)state;

	memset(&r, 0, sizeof(r));
	r.start_sec = 1000;
	r.end_sec = 1099;
	add_upstream(&r, "busy", 100, 0, 40000, 5000);
	add_upstream(&r, "idle", 40, 0, 40000, 5000);
	for (size_t i = 0; i < r.n; i++) {
		struct slice *s = &r.series[i].slice;
		bool busy = i == 0;
		hist_record_n(slice_hist(s, SLOT_CURVE(CURVE_TTFT, 0)), 50000, busy ? 20 : 40);
		if (busy)
			hist_record_n(slice_hist(s, SLOT_CURVE(CURVE_TTFT, 3)), 200000, 80);
	}
	json_t *lr = json_pack("{s:s,s:i,s:n}", "balance", "least_request", "targets", 2, "mirror");
	char *text = compare_render(&r, "chat", WIN_1H, 1, 0, NULL, lr);
	json_t *doc = json_loads(text, 0, &e);
	free(text);
	assert_non_null(doc);
	assert_string_equal(json_string_value(json_object_get(doc, "balance")), "least_request");
	assert_string_equal(json_string_value(json_object_get(doc, "assignment")), "load_dependent");
	assert_non_null(strstr(json_string_value(json_object_get(doc, "assignment_note")), "paired"));
	json_t *d = json_array_get(json_object_get(doc, "differences"), 0);
	assert_true(json_is_false(json_object_get(d, "causal")));
	json_t *eq = json_object_get(d, "equal_load");
	assert_int_equal(json_array_size(eq), 1);
	json_t *lvl = json_array_get(eq, 0);
	assert_int_equal(json_integer_value(json_object_get(lvl, "inflight_low")), 1);
	assert_int_equal(json_integer_value(json_object_get(lvl, "inflight_high")), 1);
	assert_int_equal(json_integer_value(json_object_get(lvl, "requests")), 40);
	assert_int_equal(json_integer_value(json_object_get(lvl, "baseline_requests")), 20);
	assert_string_equal(json_string_value(json_object_get(lvl, "verdict")), "no difference");
	assert_true(fabs(json_real_value(json_object_get(lvl, "ttft_p50_ms")) - 50.0) < 1.0);
	json_decref(doc);

	json_t *w = json_pack("{s:s,s:i,s:n}", "balance", "weighted", "targets", 2, "mirror");
	text = compare_render(&r, "chat", WIN_1H, 1, 0, NULL, w);
	doc = json_loads(text, 0, &e);
	free(text);
	assert_non_null(doc);
	assert_string_equal(json_string_value(json_object_get(doc, "assignment")), "load_independent");
	d = json_array_get(json_object_get(doc, "differences"), 0);
	assert_true(json_is_true(json_object_get(d, "causal")));
	json_decref(doc);
	json_decref(w);
	json_decref(lr);
	store_result_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hand_worked),
		cmocka_unit_test(test_same_distribution_not_rejected),
		cmocka_unit_test(test_shift_detected),
		cmocka_unit_test(test_ks_critical),
		cmocka_unit_test(test_prop_test),
		cmocka_unit_test(test_attribution),
		cmocka_unit_test(test_load_dependent_assignment),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
