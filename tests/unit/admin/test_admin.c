/*
 * test_admin.c — the admin API's pure parts: the knee of a load curve on
 * constructed curves, Prometheus label escaping, the Host check, and the
 * /stats, /stats/curve and /metrics renderings of a hand-built store result
 * (keys generated from the X-macros, warm and cold merged per the cold
 * filter, cumulative buckets monotonic and ending at the count), and the
 * store's lifetime counts that /metrics reads.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <jansson.h>

#include "series_key.h"
#include "admin.h"
#include "admin_gate.h"
#include "admin_stats.h"
#include "knee.h"
#include "prom.h"
#include "stats.h"
#include "store.h"

/* --- knee --------------------------------------------------------------- */

/* Throughput rises linearly to 8 in flight, then stays flat while latency
 * climbs: the knee is at 8, and the curve has bent (saturated). */
static void test_knee_saturating_curve(void **state)
{
	const struct knee_point pts[] = {
		{ 1, 1, 100, 50 }, { 2, 2, 100, 50 },  { 4, 4, 100, 50 },
		{ 8, 8, 100, 50 }, { 16, 8, 300, 50 }, { 32, 8, 700, 50 },
	};
	struct knee k = knee_find(pts, 6, 5);
	assert_int_equal(k.index, 3);
	assert_true(k.saturated);
}

/* Latency grows, but throughput grows faster everywhere: no bend yet, the
 * best point is the highest load and is reported as not saturated. */
static void test_knee_not_reached(void **state)
{
	const struct knee_point pts[] = {
		{ 1, 1, 100, 10 },
		{ 2, 2, 110, 10 },
		{ 4, 4, 130, 10 },
		{ 8, 8, 160, 10 },
	};
	struct knee k = knee_find(pts, 4, 5);
	assert_int_equal(k.index, 3);
	assert_false(k.saturated);
}

/* Relative throughput gain below relative latency increase from the very
 * first step: the knee is the lowest load. */
static void test_knee_at_first_point(void **state)
{
	const struct knee_point pts[] = {
		{ 1, 10, 10, 10 },
		{ 2, 12, 20, 10 },
		{ 4, 13, 40, 10 },
	};
	struct knee k = knee_find(pts, 3, 5);
	assert_int_equal(k.index, 0);
	assert_true(k.saturated);
}

/* A sparse point (too few requests) can neither be the knee nor hide it. */
static void test_knee_skips_sparse_points(void **state)
{
	const struct knee_point pts[] = {
		{ 1, 1, 100, 50 },
		{ 2, 2, 100, 50 },
		{ 4, 400, 1, 2 }, /* absurd power, 2 requests */
		{ 8, 2.5, 400, 50 },
	};
	struct knee k = knee_find(pts, 4, 5);
	assert_int_equal(k.index, 1);
	assert_true(k.saturated);
}

/* Equal power: the lowest load wins, and a later equal point does count as
 * "did no better". */
static void test_knee_ties_lowest_load(void **state)
{
	const struct knee_point pts[] = {
		{ 1, 1, 10, 10 },
		{ 2, 2, 20, 10 },
		{ 4, 4, 40, 10 },
	};
	struct knee k = knee_find(pts, 3, 1);
	assert_int_equal(k.index, 0);
	assert_true(k.saturated);
}

/* Power 1, 2, 1.5, 3, 2: the step from 2 to 4 in flight stops paying, so the
 * knee is 2 in flight, though 8 in flight reaches a higher power later. */
static void test_knee_is_the_first_bend(void **state)
{
	const struct knee_point pts[] = {
		{ 1, 10, 10, 50 }, { 2, 20, 10, 50 }, { 4, 30, 20, 50 }, { 8, 60, 20, 50 }, { 16, 60, 30, 50 },
	};
	struct knee k = knee_find(pts, 5, 5);
	assert_int_equal(k.index, 1);
	assert_true(k.saturated);
	/* a sparse dip does not end the climb: the knee is then the 8 */
	struct knee_point sparse[5];
	memcpy(sparse, pts, sizeof(pts));
	sparse[2].requests = 4;
	k = knee_find(sparse, 5, 5);
	assert_int_equal(k.index, 3);
	assert_true(k.saturated);
}

static void test_knee_none(void **state)
{
	const struct knee_point bad[] = {
		{ 1, 0, 10, 10 },	 /* no throughput */
		{ 2, 1, 0, 10 },	 /* no latency */
		{ 4, NAN, 10, 10 },	 /* not a number */
		{ 8, INFINITY, 10, 10 }, /* not finite */
		{ 16, 1, 10, 0 },	 /* no requests */
	};
	struct knee k = knee_find(bad, 5, 1);
	assert_int_equal(k.index, -1);
	assert_false(k.saturated);
	k = knee_find(NULL, 0, 1);
	assert_int_equal(k.index, -1);
	/* without a minimum, the request-less point is the one valid one */
	k = knee_find(bad, 5, 0);
	assert_int_equal(k.index, 4);
	assert_false(k.saturated);
}

static void test_knee_single_point(void **state)
{
	const struct knee_point one[] = { { 3, 5, 20, 9 } };
	struct knee k = knee_find(one, 1, 5);
	assert_int_equal(k.index, 0);
	assert_false(k.saturated);
}

/* --- Prometheus label escaping ------------------------------------------ */

static void test_prom_escape(void **state)
{
	char out[64];
	size_t n;

	n = prom_label_escape(out, sizeof(out), "plain-model_1.0");
	assert_string_equal(out, "plain-model_1.0");
	assert_int_equal(n, strlen("plain-model_1.0"));

	n = prom_label_escape(out, sizeof(out), "a\"b\\c\nd");
	assert_string_equal(out, "a\\\"b\\\\c\\nd");
	assert_int_equal(n, strlen("a\\\"b\\\\c\\nd"));

	/* tabs, carriage returns and UTF-8 pass unchanged */
	n = prom_label_escape(out, sizeof(out), "t\tr\r\xc3\xa9");
	assert_string_equal(out, "t\tr\r\xc3\xa9");
	assert_int_equal(n, 6);

	n = prom_label_escape(out, sizeof(out), "");
	assert_string_equal(out, "");
	assert_int_equal(n, 0);
}

static void test_prom_escape_truncates_like_snprintf(void **state)
{
	char out[5];
	size_t n;

	memset(out, 'X', sizeof(out));
	n = prom_label_escape(out, sizeof(out), "\"\"\"\"");
	assert_int_equal(n, 8);
	assert_string_equal(out, "\\\"\\\"");
	/* size query */
	assert_int_equal(prom_label_escape(NULL, 0, "a\nb"), 4);
	/* cap 1: only the NUL */
	n = prom_label_escape(out, 1, "abc");
	assert_int_equal(n, 3);
	assert_string_equal(out, "");
}

static void test_prom_le_sorted(void **state)
{
	size_t n = prom_le_count();
	assert_true(n >= 22);
	for (size_t i = 1; i < n; i++)
		assert_true(strtod(prom_le_label(i - 1), NULL) < strtod(prom_le_label(i), NULL));
	/* vLLM's edges are all there, spelt as vLLM spells them */
	static const char *const vllm[] = { "0.001", "0.025", "0.06", "0.15", "1.0", "2.5", "80.0", "2560.0" };
	for (size_t v = 0; v < sizeof(vllm) / sizeof(vllm[0]); v++) {
		size_t i;
		for (i = 0; i < n; i++)
			if (strcmp(prom_le_label(i), vllm[v]) == 0)
				break;
		assert_true(i < n);
	}
	assert_string_equal(prom_le_label(n), "+Inf");
}

/* --- Host check ---------------------------------------------------------- */

static void test_host_allowed(void **state)
{
	assert_true(admin_host_allowed("127.0.0.1", "127.0.0.1"));
	assert_true(admin_host_allowed("127.0.0.1:9901", "127.0.0.1"));
	assert_true(admin_host_allowed("localhost", "127.0.0.1"));
	assert_true(admin_host_allowed("LOCALHOST:80", "127.0.0.1"));
	assert_true(admin_host_allowed("[::1]", "127.0.0.1"));
	assert_true(admin_host_allowed("[::1]:9901", "[::1]"));
	assert_true(admin_host_allowed("10.1.2.3:9901", "10.1.2.3"));
	/* a wildcard bind accepts address literals, never names */
	assert_true(admin_host_allowed("10.1.2.3:9901", "0.0.0.0"));
	assert_true(admin_host_allowed("[fe80::1]:9901", "[::]"));
	assert_false(admin_host_allowed("attacker.example:9901", "0.0.0.0"));

	assert_false(admin_host_allowed("evil.example.com", "127.0.0.1"));
	assert_false(admin_host_allowed("localhost.evil.example", "127.0.0.1"));
	assert_false(admin_host_allowed("127.0.0.1.nip.io", "127.0.0.1"));
	assert_false(admin_host_allowed("10.1.2.3", "127.0.0.1"));
	assert_false(admin_host_allowed("", "127.0.0.1"));
	assert_false(admin_host_allowed("127.0.0.1:", "127.0.0.1"));
	assert_false(admin_host_allowed("127.0.0.1:99999x", "127.0.0.1"));
	assert_false(admin_host_allowed("[::1", "127.0.0.1"));
	assert_false(admin_host_allowed("[::1]x", "127.0.0.1"));
	assert_false(admin_host_allowed(NULL, "127.0.0.1"));
}

/* --- renderings of a constructed store result ---------------------------- */

static void add_series(struct store_result *r, const char *route, const char *up, const char *model, bool cold)
{
	char key[SERIES_KEY_MAX];
	size_t len = series_key_build(key, route, up, model, cold);

	assert_true(len > 0);
	assert_non_null(store_result_series(r, key, len));
}

/* Requests at in-flight loads 1, 2, 4, 8, 16, 32 whose e2e stays 1 s up to
 * 8 and then grows with load (throughput flat), and whose ttft is 90 ms up
 * to 8 and then 280 and 690 ms: the knee is the 5-8 bucket. Values sit off
 * the `le` edges so that the bucket counts below are exact. */
static void fill_curve(struct slice *s)
{
	static const struct {
		unsigned inflight;
		uint64_t e2e_us, ttft_us;
	} rows[] = {
		{ 1, 1000000, 90000 }, { 2, 1000000, 90000 },	{ 4, 1000000, 90000 },
		{ 8, 1000000, 90000 }, { 16, 2000000, 280000 }, { 32, 4000000, 690000 },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		unsigned b = log2_bucket(rows[i].inflight, INFLIGHT_BUCKETS);
		hist_record_n(slice_hist(s, SLOT_CURVE(CURVE_E2E, b)), rows[i].e2e_us, 20);
		hist_record_n(slice_hist(s, SLOT_CURVE(CURVE_TTFT, b)), rows[i].ttft_us, 20);
		hist_record_n(slice_hist(s, HM_TTFT), rows[i].ttft_us, 20);
		s->counters[CT_REQUESTS] += 20;
		s->counters[CT_STATUS_2XX] += 20;
	}
}

static void build_result(struct store_result *r)
{
	memset(r, 0, sizeof(*r));
	r->start_sec = 1000;
	r->end_sec = 1099;
	add_series(r, "default", "up-b", "m\"x", false);
	add_series(r, "default", "up-a", "m1", false);
	add_series(r, "default", "up-a", "m1", true);
	/* up-b: a few warm requests */
	struct slice *b = &r->series[0].slice;
	b->counters[CT_REQUESTS] = 3;
	b->counters[CT_STATUS_5XX] = 3;
	b->counters[CT_ERR_BASE + REQ_ERR_TIMEOUT] = 3;
	hist_record_n(slice_hist(b, HM_E2E), 5000, 3);
	/* up-a warm: the curve; cold: 4 slow requests */
	fill_curve(&r->series[1].slice);
	struct slice *c = &r->series[2].slice;
	c->counters[CT_REQUESTS] = 4;
	c->counters[CT_STATUS_2XX] = 4;
	c->counters[CT_OUTPUT_TOKENS] = 40;
	hist_record_n(slice_hist(c, HM_TTFT), 9000000, 4);
}

static json_t *render(const struct store_result *r, const struct stats_query *q, enum stats_view v)
{
	char *text = admin_stats_render(r, q, v, 0);
	json_error_t e;
	assert_non_null(text);
	json_t *j = json_loads(text, 0, &e);
	free(text);
	assert_non_null(j);
	return j;
}

static json_t *series_named(json_t *root, const char *upstream)
{
	size_t i;
	json_t *s;
	json_array_foreach (json_object_get(root, "series"), i, s) {
		if (strcmp(json_string_value(json_object_get(s, "upstream")), upstream) == 0)
			return s;
	}
	fail_msg("no series for %s", upstream);
	return NULL;
}

static void test_stats_summary(void **state)
{
	struct store_result r;
	struct stats_query q = { .window = WIN_5M, .cold = COLD_INCLUDE };
	build_result(&r);

	json_t *root = render(&r, &q, VIEW_SUMMARY);
	assert_int_equal(json_array_size(json_object_get(root, "series")), 2);
	/* sorted: up-a before up-b */
	assert_string_equal(
		json_string_value(json_object_get(json_array_get(json_object_get(root, "series"), 0), "upstream")),
		"up-a");
	assert_int_equal(json_integer_value(json_object_get(root, "elapsed_s")), 100);
	json_t *a = series_named(root, "up-a");
	assert_int_equal(json_integer_value(json_object_get(a, "requests")), 124);
	assert_int_equal(json_integer_value(json_object_get(a, "cold_requests")), 4);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "status"), "2xx")), 124);
	json_t *m = json_object_get(a, "metrics");
	/* every metric of the X-macro is there, time ones in ms */
	for (unsigned i = 0; i < HM__COUNT; i++)
		assert_non_null(json_object_get(m, hist_metric_name((enum hist_metric)i)));
	json_t *ttft = json_object_get(m, "ttft");
	assert_int_equal(json_integer_value(json_object_get(ttft, "count")), 124);
	assert_true(json_real_value(json_object_get(ttft, "max_ms")) == 9000.0);
	assert_non_null(json_object_get(ttft, "p99_9_ms"));
	assert_non_null(json_object_get(json_object_get(m, "decode_rate"), "p50_tokens_per_s"));
	assert_non_null(json_object_get(json_object_get(m, "inflight"), "p50"));
	json_t *cold = json_object_get(json_object_get(a, "context"), "cold");
	assert_int_equal(json_integer_value(json_object_get(cold, "warm_requests")), 120);
	assert_int_equal(json_integer_value(json_object_get(cold, "cold_requests")), 4);
	json_t *tp = json_object_get(a, "throughput");
	assert_true(fabs(json_real_value(json_object_get(tp, "requests_per_s")) - 1.24) < 1e-9);
	assert_true(fabs(json_real_value(json_object_get(tp, "output_tokens_per_s")) - 0.4) < 1e-9);
	json_t *b = series_named(root, "up-b");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(b, "errors"), "timeout")), 3);
	assert_true(json_is_null(json_object_get(json_object_get(json_object_get(b, "metrics"), "ttft"), "p50_ms")));
	assert_true(json_is_null(json_object_get(json_object_get(b, "goodput"), "ratio")));
	json_decref(root);

	/* cold=only keeps up-a's cold series alone; up-b has none */
	q.cold = COLD_ONLY;
	root = render(&r, &q, VIEW_SUMMARY);
	assert_int_equal(json_array_size(json_object_get(root, "series")), 1);
	a = series_named(root, "up-a");
	assert_int_equal(json_integer_value(json_object_get(a, "requests")), 4);
	assert_string_equal(json_string_value(json_object_get(a, "cold")), "only");
	json_decref(root);

	/* cold=exclude and a label filter */
	q.cold = COLD_EXCLUDE;
	q.upstream = "up-a";
	root = render(&r, &q, VIEW_SUMMARY);
	assert_int_equal(json_array_size(json_object_get(root, "series")), 1);
	a = series_named(root, "up-a");
	assert_int_equal(json_integer_value(json_object_get(a, "requests")), 120);
	assert_int_equal(json_integer_value(json_object_get(a, "cold_requests")), 0);
	json_decref(root);

	/* collection started after the window did: rates over the shorter span */
	q.upstream = NULL;
	char *text = admin_stats_render(&r, &q, VIEW_SUMMARY, 1090);
	root = json_loads(text, 0, NULL);
	free(text);
	assert_int_equal(json_integer_value(json_object_get(root, "elapsed_s")), 10);
	json_decref(root);
	store_result_free(&r);
}

static void test_stats_curve_knee(void **state)
{
	struct store_result r;
	struct stats_query q = { .window = WIN_5M, .upstream = "up-a", .cold = COLD_EXCLUDE };
	build_result(&r);

	json_t *root = render(&r, &q, VIEW_CURVE);
	json_t *a = series_named(root, "up-a");
	json_t *buckets = json_object_get(a, "buckets");
	assert_int_equal(json_array_size(buckets), 6);
	json_t *knee = json_object_get(a, "knee");
	assert_true(json_is_object(knee));
	assert_int_equal(json_integer_value(json_object_get(knee, "inflight_low")), 5);
	assert_int_equal(json_integer_value(json_object_get(knee, "inflight_high")), 8);
	assert_true(json_is_true(json_object_get(knee, "saturated")));
	assert_string_equal(json_string_value(json_object_get(knee, "latency_basis")), "ttft");
	/* bucket 5-8 stands for 6.5 in flight, at 1 s each: 6.5 requests/s */
	assert_true(fabs(json_real_value(json_object_get(knee, "throughput_estimate_rps")) - 6.5) < 1e-6);
	size_t i;
	json_t *e;
	int knees = 0;
	json_array_foreach (buckets, i, e) {
		assert_int_equal(json_integer_value(json_object_get(e, "requests")), 20);
		knees += json_is_true(json_object_get(e, "knee"));
	}
	assert_int_equal(knees, 1);
	/* the open-ended last bucket has no upper bound; 17-32 is not last */
	assert_true(json_is_integer(json_object_get(json_array_get(buckets, 5), "inflight_high")));
	json_decref(root);
	store_result_free(&r);
}

static void test_stats_prompt(void **state)
{
	struct store_result r;
	struct stats_query q = { .window = WIN_5M, .cold = COLD_INCLUDE };
	build_result(&r);
	hist_record_n(slice_hist(&r.series[1].slice, SLOT_PROMPT(log2_bucket(100, PROMPT_BUCKETS))), 50000, 7);
	hist_record_n(slice_hist(&r.series[1].slice, SLOT_PROMPT(PROMPT_BUCKETS - 1)), 90000, 1);

	json_t *root = render(&r, &q, VIEW_PROMPT);
	json_t *b = json_object_get(series_named(root, "up-a"), "buckets");
	assert_int_equal(json_array_size(b), 2);
	json_t *e = json_array_get(b, 0);
	assert_int_equal(json_integer_value(json_object_get(e, "input_tokens_low")), 65);
	assert_int_equal(json_integer_value(json_object_get(e, "input_tokens_high")), 128);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(e, "ttft"), "count")), 7);
	assert_true(json_is_null(json_object_get(json_array_get(b, 1), "input_tokens_high")));
	assert_int_equal(json_array_size(json_object_get(series_named(root, "up-b"), "buckets")), 0);
	json_decref(root);
	store_result_free(&r);
}

/* Usage details in /stats: the token counters, and the prefix-cache hit
 * ratio over the requests that reported caching (null when none did). */
static void test_stats_usage_details(void **state)
{
	struct store_result r;
	struct stats_query q = { .window = WIN_5M, .cold = COLD_INCLUDE };
	(void)state;
	build_result(&r);
	struct slice *a = &r.series[1].slice;
	a->counters[CT_INPUT_TOKENS] = 5000;
	a->counters[CT_CACHE_REPORTED_INPUT_TOKENS] = 4000;
	a->counters[CT_CACHED_TOKENS] = 3000;
	a->counters[CT_CACHE_WRITE_TOKENS] = 200;
	a->counters[CT_REASONING_TOKENS] = 70;
	hist_record_n(slice_hist(a, HM_ANSWER_TTFT), 250000, 5);
	hist_record_n(slice_hist(a, HM_REASONING), 200000, 5);

	json_t *root = render(&r, &q, VIEW_SUMMARY);
	json_t *sa = series_named(root, "up-a");
	assert_int_equal(json_integer_value(json_object_get(sa, "cached_tokens")), 3000);
	assert_int_equal(json_integer_value(json_object_get(sa, "cache_write_tokens")), 200);
	assert_int_equal(json_integer_value(json_object_get(sa, "reasoning_tokens")), 70);
	json_t *pc = json_object_get(sa, "prefix_cache");
	assert_int_equal(json_integer_value(json_object_get(pc, "input_tokens")), 4000);
	assert_int_equal(json_integer_value(json_object_get(pc, "cached_tokens")), 3000);
	assert_true(fabs(json_real_value(json_object_get(pc, "hit_ratio")) - 0.75) < 1e-9);
	json_t *m = json_object_get(sa, "metrics");
	assert_true(json_real_value(json_object_get(json_object_get(m, "answer_ttft"), "p50_ms")) > 249.0);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(m, "reasoning"), "count")), 5);
	json_t *sb = series_named(root, "up-b");
	assert_true(json_is_null(json_object_get(json_object_get(sb, "prefix_cache"), "hit_ratio")));
	assert_int_equal(json_integer_value(json_object_get(sb, "cached_tokens")), 0);
	json_decref(root);
	store_result_free(&r);
}

/* /stats/prompt keys the curve on prefill tokens by default; by=prompt
 * gives the raw prompt length. */
static void test_stats_prompt_by(void **state)
{
	struct store_result r;
	struct stats_query q = { .window = WIN_5M, .cold = COLD_INCLUDE };
	(void)state;
	build_result(&r);
	hist_record_n(slice_hist(&r.series[1].slice, SLOT_PROMPT(log2_bucket(100, PROMPT_BUCKETS))), 50000, 7);
	hist_record_n(slice_hist(&r.series[1].slice, SLOT_PROMPT_RAW(log2_bucket(3000, PROMPT_BUCKETS))), 50000, 7);

	json_t *root = render(&r, &q, VIEW_PROMPT);
	json_t *sa = series_named(root, "up-a");
	assert_string_equal(json_string_value(json_object_get(sa, "by")), "prefill");
	json_t *e = json_array_get(json_object_get(sa, "buckets"), 0);
	assert_int_equal(json_integer_value(json_object_get(e, "input_tokens_low")), 65);
	json_decref(root);

	q.prompt_raw = true;
	root = render(&r, &q, VIEW_PROMPT);
	sa = series_named(root, "up-a");
	assert_string_equal(json_string_value(json_object_get(sa, "by")), "prompt");
	assert_int_equal(json_array_size(json_object_get(sa, "buckets")), 1);
	e = json_array_get(json_object_get(sa, "buckets"), 0);
	assert_int_equal(json_integer_value(json_object_get(e, "input_tokens_low")), 2049);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(e, "ttft"), "count")), 7);
	json_decref(root);
	store_result_free(&r);
}

static void test_prom_render(void **state)
{
	struct store_result r;
	struct evbuffer *buf = evbuffer_new();
	build_result(&r);

	assert_int_equal(prom_render(buf, &r), 0);
	size_t len = evbuffer_get_length(buf);
	char *text = malloc(len + 1);
	evbuffer_remove(buf, text, len);
	text[len] = '\0';

	/* label values escaped */
	assert_non_null(strstr(text, "model=\"m\\\"x\""));
	assert_non_null(strstr(text, "# TYPE tokentap_ttft_seconds histogram\n"));
	assert_non_null(strstr(text, "# TYPE tokentap_requests_total counter\n"));
	assert_non_null(strstr(text,
			       "tokentap_errors_total{route=\"default\",upstream=\"up-b\",model=\"m\\\"x\","
			       "kind=\"timeout\"} 3\n"));
	assert_non_null(
		strstr(text, "tokentap_output_tokens_total{route=\"default\",upstream=\"up-a\",model=\"m1\"} 40\n"));
	/* warm and cold merged: 120 + 4 */
	assert_non_null(
		strstr(text, "tokentap_ttft_seconds_count{route=\"default\",upstream=\"up-a\",model=\"m1\"} 124\n"));
	assert_non_null(strstr(
		text,
		"tokentap_ttft_seconds_bucket{route=\"default\",upstream=\"up-a\",model=\"m1\",le=\"+Inf\"} 124\n"));
	/* up-a ttft: 80 at 0.09 s, 20 at 0.28 s, 20 at 0.69 s, 4 at 9 s */
	assert_non_null(strstr(
		text,
		"tokentap_ttft_seconds_bucket{route=\"default\",upstream=\"up-a\",model=\"m1\",le=\"0.1\"} 80\n"));
	assert_non_null(strstr(
		text,
		"tokentap_ttft_seconds_bucket{route=\"default\",upstream=\"up-a\",model=\"m1\",le=\"0.75\"} 120\n"));
	assert_non_null(strstr(
		text,
		"tokentap_ttft_seconds_bucket{route=\"default\",upstream=\"up-a\",model=\"m1\",le=\"10.0\"} 124\n"));
	/* no metric outside the time ones gets a histogram */
	assert_null(strstr(text, "tokentap_decode_rate_seconds"));
	assert_null(strstr(text, "tokentap_inflight_seconds"));
	free(text);
	evbuffer_free(buf);
	store_result_free(&r);
}

/* Every histogram and counter of the lists has a help text, and /metrics
 * gives each family exactly one # HELP, non-empty, right before its # TYPE;
 * a time histogram's help says what one sample is. */
static void test_prom_help_per_family(void **state)
{
	static const char *const hist_help[] = {
#define X(e, n, u, src, help) help,
		HIST_METRICS(X)
#undef X
	};
	static const char *const counter_help[] = {
#define X(e, n, exported, help) help,
		SLICE_COUNTERS(X)
#undef X
	};
	struct store_result r;
	struct evbuffer *buf = evbuffer_new();
	char seen[64][128], prev[128] = "";
	size_t helps = 0, types = 0;

	(void)state;
	for (size_t i = 0; i < sizeof(hist_help) / sizeof(hist_help[0]); i++)
		assert_true(hist_help[i] && hist_help[i][0]);
	for (size_t i = 0; i < sizeof(counter_help) / sizeof(counter_help[0]); i++)
		assert_true(counter_help[i] && counter_help[i][0]);

	build_result(&r);
	assert_int_equal(prom_render(buf, &r), 0);
	size_t len = evbuffer_get_length(buf);
	char *text = malloc(len + 1);
	assert_non_null(text);
	evbuffer_remove(buf, text, len);
	text[len] = '\0';
	assert_non_null(strstr(text,
			       "# HELP tokentap_ttft_seconds Time to first token at the proxy, from the "
			       "request's arrival, in seconds (definition: docs/metrics.md).\n"));
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		char name[128], rest[128];
		if (sscanf(line, "# HELP %127s %127s", name, rest) == 2) {
			for (size_t i = 0; i < helps; i++)
				assert_string_not_equal(seen[i], name); /* one # HELP per family */
			assert_true(helps < 64);
			snprintf(seen[helps++], sizeof(seen[0]), "%s", name);
			snprintf(prev, sizeof(prev), "%s", name);
		} else if (sscanf(line, "# TYPE %127s", name) == 1) {
			types++;
			assert_string_equal(name, prev); /* its # HELP came right before */
			prev[0] = '\0';
		} else {
			assert_true(line[0] != '#');
		}
	}
	assert_int_equal(helps, types);
	assert_true(types > 0);
	free(text);
	evbuffer_free(buf);
	store_result_free(&r);
}

/* One batch of one series ("k") with `requests` requests, at `sec`. */
static struct store_batch *lifetime_batch(uint64_t sec, uint64_t requests)
{
	struct store_batch *b = calloc(1, sizeof(*b));
	struct slice s;

	memset(&s, 0, sizeof(s));
	s.counters[CT_REQUESTS] = requests;
	hist_record_n(slice_hist(&s, HM_TTFT), 20000, requests);
	hist_record_n(slice_hist(&s, SLOT_CURVE(CURVE_TTFT, 0)), 20000, requests);
	assert_non_null(b);
	b->sec = sec;
	b->items = calloc(1, sizeof(*b->items));
	assert_non_null(b->items);
	b->n = b->cap = 1;
	b->items[0].key[0] = 'k';
	b->items[0].keylen = 1;
	b->items[0].len = slice_encode(&s, &b->items[0].blob);
	assert_true(b->items[0].len > 0);
	slice_release(&s);
	return b;
}

static uint64_t requests_of(const struct store_result *r)
{
	uint64_t n = 0;
	for (size_t i = 0; i < r->n; i++)
		n += r->series[i].slice.counters[CT_REQUESTS];
	return n;
}

/* What /metrics reads only grows: a second that the memory-only store's
 * ring lets go (its slot taken by one 360 s later) and a reset both leave
 * it whole, while the `all` window loses them. */
static void test_lifetime_outlives_ring_and_reset(void **state)
{
	struct store_options o;
	struct store_result all, life;
	char err[256];
	uint64_t now = (uint64_t)time(NULL);

	store_options_defaults(&o);
	struct store *st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	store_submit(st, lifetime_batch(now - 400, 3));
	store_submit(st, lifetime_batch(now - 40, 5)); /* the same ring slot */
	store_sync(st);
	assert_int_equal(store_query(st, WIN_ALL, &all, err, sizeof(err)), 0);
	assert_int_equal(requests_of(&all), 5);
	store_result_free(&all);
	assert_int_equal(store_query_lifetime(st, &life), 0);
	assert_int_equal(requests_of(&life), 8);
	store_result_free(&life);

	assert_int_equal(store_reset(st, err, sizeof(err)), 0);
	store_submit(st, lifetime_batch(now, 1));
	store_sync(st);
	assert_int_equal(store_query(st, WIN_ALL, &all, err, sizeof(err)), 0);
	assert_int_equal(requests_of(&all), 1);
	store_result_free(&all);
	assert_int_equal(store_query_lifetime(st, &life), 0);
	assert_int_equal(requests_of(&life), 9);
	assert_int_equal(life.n, 1);
	/* the metric histograms, not the load curves */
	assert_int_equal(life.series[0].slice.slot[HM_TTFT]->count, 9);
	assert_null(life.series[0].slice.slot[SLOT_CURVE(CURVE_TTFT, 0)]);
	store_result_free(&life);
	store_close(st);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_knee_saturating_curve),
		cmocka_unit_test(test_knee_not_reached),
		cmocka_unit_test(test_knee_at_first_point),
		cmocka_unit_test(test_knee_skips_sparse_points),
		cmocka_unit_test(test_knee_ties_lowest_load),
		cmocka_unit_test(test_knee_is_the_first_bend),
		cmocka_unit_test(test_knee_none),
		cmocka_unit_test(test_knee_single_point),
		cmocka_unit_test(test_prom_escape),
		cmocka_unit_test(test_prom_escape_truncates_like_snprintf),
		cmocka_unit_test(test_prom_le_sorted),
		cmocka_unit_test(test_host_allowed),
		cmocka_unit_test(test_stats_summary),
		cmocka_unit_test(test_stats_curve_knee),
		cmocka_unit_test(test_stats_prompt),
		cmocka_unit_test(test_stats_usage_details),
		cmocka_unit_test(test_stats_prompt_by),
		cmocka_unit_test(test_prom_render),
		cmocka_unit_test(test_prom_help_per_family),
		cmocka_unit_test(test_lifetime_outlives_ring_and_reset),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
