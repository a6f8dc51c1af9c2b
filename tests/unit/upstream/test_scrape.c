/*
 * test_scrape.c — scrape_read (src/upstream/scrape.c): what an engine's /metrics
 * answer means. Each engine's names; several models summed, the fullest
 * KV cache kept; vLLM's older KV name and prefix counters; `auto` picking
 * the engine by the gauges present; an engine named that the answer does
 * not speak, garbage and non-finite values, counts past any engine's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "scrape.h"

static int read_text(const char *text, enum engine_kind want, struct engine_state *st, char *err, size_t errlen)
{
	memset(st, 0, sizeof(*st));
	err[0] = '\0';
	return scrape_read(text, strlen(text), want, st, err, errlen);
}

static void test_vllm_two_models(void **state)
{
	(void)state;
	struct engine_state st;
	char err[200];
	assert_int_equal(read_text("# TYPE vllm:num_requests_running gauge\n"
				   "vllm:num_requests_running{engine=\"0\",model_name=\"a\"} 3.0\n"
				   "vllm:num_requests_running{engine=\"0\",model_name=\"b\"} 2.0\n"
				   "vllm:num_requests_waiting{engine=\"0\",model_name=\"a\"} 7.0\n"
				   "vllm:num_requests_waiting{engine=\"0\",model_name=\"b\"} 1.0\n"
				   "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"a\"} 0.25\n"
				   "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"b\"} 0.75\n"
				   "vllm:prefix_cache_queries_total{model_name=\"a\"} 300\n"
				   "vllm:prefix_cache_queries_total{model_name=\"b\"} 100\n"
				   "vllm:prefix_cache_hits_total{model_name=\"a\"} 90\n"
				   "vllm:prefix_cache_hits_total{model_name=\"b\"} 10\n",
				   ENGINE_AUTO, &st, err, sizeof(err)),
			 0);
	assert_true(st.scraped);
	assert_int_equal(st.engine, ENGINE_VLLM);
	assert_int_equal(st.running, 5);
	assert_int_equal(st.waiting, 8);
	assert_true(st.kv_use == 0.75);
	assert_true(fabs(st.prefix_hit - 0.25) < 1e-12);
}

static void test_vllm_older_names(void **state)
{
	(void)state;
	struct engine_state st;
	char err[200];
	assert_int_equal(read_text("vllm:num_requests_running{model_name=\"m\"} 1\n"
				   "vllm:num_requests_waiting{model_name=\"m\"} 0\n"
				   "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n"
				   "vllm:gpu_prefix_cache_hit_rate{model_name=\"m\"} 0.125\n",
				   ENGINE_VLLM, &st, err, sizeof(err)),
			 0);
	assert_int_equal(st.running, 1);
	assert_int_equal(st.waiting, 0);
	assert_true(st.kv_use == 0.5);
	assert_true(st.prefix_hit == 0.125);
	/* the newer KV name wins over the older when both are there */
	assert_int_equal(read_text("vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.5\n"
				   "vllm:kv_cache_usage_perc 0.2\n",
				   ENGINE_VLLM, &st, err, sizeof(err)),
			 0);
	assert_true(st.kv_use == 0.2);
	assert_int_equal(st.waiting, -1); /* not in the answer */
	assert_true(isnan(st.prefix_hit));
}

static void test_sglang_and_llamacpp(void **state)
{
	(void)state;
	struct engine_state st;
	char err[200];
	assert_int_equal(read_text("sglang:num_running_reqs{model_name=\"q\"} 4\n"
				   "sglang:num_queue_reqs{model_name=\"q\"} 9\n"
				   "sglang:token_usage{model_name=\"q\"} 0.28\n"
				   "sglang:cache_hit_rate{model_name=\"q\"} 0.5\n",
				   ENGINE_AUTO, &st, err, sizeof(err)),
			 0);
	assert_int_equal(st.engine, ENGINE_SGLANG);
	assert_int_equal(st.running, 4);
	assert_int_equal(st.waiting, 9);
	assert_true(st.kv_use == 0.28);
	assert_true(st.prefix_hit == 0.5);
	assert_int_equal(read_text("llamacpp:requests_processing 2\nllamacpp:requests_deferred 6\n", ENGINE_AUTO, &st,
				   err, sizeof(err)),
			 0);
	assert_int_equal(st.engine, ENGINE_LLAMACPP);
	assert_int_equal(st.running, 2);
	assert_int_equal(st.waiting, 6);
	assert_true(isnan(st.kv_use)); /* current llama.cpp builds export none */
	assert_true(isnan(st.prefix_hit));
}

static void test_engine_choice(void **state)
{
	(void)state;
	struct engine_state st;
	char err[200];
	const char *both = "sglang:num_running_reqs 1\nvllm:num_requests_waiting 3\n";
	/* auto: vLLM first; a named engine reads its own names only */
	assert_int_equal(read_text(both, ENGINE_AUTO, &st, err, sizeof(err)), 0);
	assert_int_equal(st.engine, ENGINE_VLLM);
	assert_int_equal(st.waiting, 3);
	assert_int_equal(st.running, -1);
	assert_int_equal(read_text(both, ENGINE_SGLANG, &st, err, sizeof(err)), 0);
	assert_int_equal(st.engine, ENGINE_SGLANG);
	assert_int_equal(st.running, 1);
	assert_int_equal(read_text(both, ENGINE_LLAMACPP, &st, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "llamacpp"));
	assert_false(st.scraped);
}

static void test_garbage_and_odd_values(void **state)
{
	(void)state;
	struct engine_state st;
	char err[200];
	assert_int_equal(read_text("<html>not found</html>\n\x01\x02\n", ENGINE_AUTO, &st, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "2 lines that did not parse"));
	assert_int_equal(read_text("", ENGINE_AUTO, &st, err, sizeof(err)), -1);
	/* NaN and Inf are not counts; out-of-range fractions are clamped */
	assert_int_equal(read_text("vllm:num_requests_running NaN\nvllm:num_requests_running 2\n"
				   "vllm:num_requests_waiting +Inf\nvllm:kv_cache_usage_perc 1.5\n",
				   ENGINE_AUTO, &st, err, sizeof(err)),
			 0);
	assert_int_equal(st.running, 2);
	assert_int_equal(st.waiting, -1);
	assert_true(st.kv_use == 1.0);
}

/* Counts are kept from 0 to ENGINE_COUNT_MAX whatever the samples sum to
 * (their double sum overflowing to +inf included), so any sum of two
 * counts fits; a fraction of a request rounds. */
static void test_counts_saturate(void **state)
{
	(void)state;
	struct engine_state st;
	char err[200];
	assert_int_equal(read_text("vllm:num_requests_running 5e18\nvllm:num_requests_waiting 5e18\n", ENGINE_AUTO, &st,
				   err, sizeof(err)),
			 0);
	assert_int_equal(st.running, ENGINE_COUNT_MAX);
	assert_int_equal(st.waiting, ENGINE_COUNT_MAX);
	assert_int_equal(read_text("vllm:num_requests_running{engine=\"0\"} 1.7e308\n"
				   "vllm:num_requests_running{engine=\"1\"} 1.7e308\n"
				   "vllm:num_requests_waiting -1e300\n",
				   ENGINE_AUTO, &st, err, sizeof(err)),
			 0);
	assert_int_equal(st.running, ENGINE_COUNT_MAX);
	assert_int_equal(st.waiting, 0);
	assert_int_equal(read_text("sglang:num_running_reqs 999999999.4\nsglang:num_queue_reqs 2.5\n", ENGINE_AUTO, &st,
				   err, sizeof(err)),
			 0);
	assert_int_equal(st.running, ENGINE_COUNT_MAX - 1);
	assert_int_equal(st.waiting, 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vllm_two_models),	       cmocka_unit_test(test_vllm_older_names),
		cmocka_unit_test(test_sglang_and_llamacpp),    cmocka_unit_test(test_engine_choice),
		cmocka_unit_test(test_garbage_and_odd_values), cmocka_unit_test(test_counts_saturate),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
