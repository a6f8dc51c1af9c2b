/*
 * test_promtext.c — the Prometheus text parser (src/parse/promtext.c) on the
 * shapes the engines serve (vLLM, SGLang, llama.cpp), on label escapes, and
 * on broken lines: each is skipped and counted, the lines around it still
 * read, and nothing past the input is read (each input ends right before a
 * page that cannot be read).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "promtext.h"

#define MAXS 64

struct seen {
	unsigned n;
	char name[MAXS][128];
	char labels[MAXS][512]; /* k=v;k=v */
	double value[MAXS];
};

static void on_sample(void *arg, const struct promtext_sample *s)
{
	struct seen *z = arg;
	if (z->n == MAXS)
		return;
	snprintf(z->name[z->n], sizeof(z->name[0]), "%.*s", (int)s->name_len, s->name);
	z->labels[z->n][0] = '\0';
	for (unsigned i = 0; i < s->nlabels; i++) {
		size_t at = strlen(z->labels[z->n]);
		snprintf(z->labels[z->n] + at, sizeof(z->labels[0]) - at, "%s%.*s=%s", i ? ";" : "",
			 (int)s->labels[i].name_len, s->labels[i].name, s->labels[i].value);
		assert_int_equal(strlen(s->labels[i].value), s->labels[i].value_len);
	}
	z->value[z->n] = s->value;
	z->n++;
}

/* Parses `text` placed to end right before an unreadable page. */
static struct promtext_result parse_fenced(const char *text, struct seen *z)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), len = strlen(text);
	size_t pages = (len + page - 1) / page + 1;
	char *base = mmap(NULL, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct promtext_result r;

	assert_true(base != MAP_FAILED);
	assert_int_equal(mprotect(base + (pages - 1) * page, page, PROT_NONE), 0);
	char *at = base + (pages - 1) * page - len;
	memcpy(at, text, len);
	memset(z, 0, sizeof(*z));
	promtext_parse(at, len, on_sample, z, &r);
	munmap(base, pages * page);
	return r;
}

static void test_vllm(void **state)
{
	(void)state;
	struct seen z;
	struct promtext_result r = parse_fenced(
		"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
		"# TYPE vllm:num_requests_running gauge\n"
		"vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3.0\n"
		"vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 12.0\n"
		"vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.4375\n"
		"# TYPE vllm:prefix_cache_queries counter\n"
		"vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 1.5e+06\n"
		"vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 750000.0\n"
		"vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 42.0\n",
		&z);
	assert_int_equal(r.samples, 6);
	assert_int_equal(r.skipped, 0);
	assert_string_equal(z.name[0], "vllm:num_requests_running");
	assert_string_equal(z.labels[0], "engine=0;model_name=meta-llama/Llama-3.1-8B-Instruct");
	assert_true(z.value[0] == 3.0);
	assert_true(z.value[1] == 12.0);
	assert_true(z.value[2] == 0.4375);
	assert_true(z.value[3] == 1.5e6);
	assert_string_equal(z.labels[5], "le=+Inf;model_name=m");
}

static void test_sglang_and_llamacpp(void **state)
{
	(void)state;
	struct seen z;
	struct promtext_result r = parse_fenced(
		"sglang:num_running_reqs{model_name=\"q\"} 2\n"
		"sglang:num_queue_reqs{model_name=\"q\"} 7\n"
		"sglang:token_usage{model_name=\"q\"} 0.28\n"
		"sglang:cache_hit_rate{model_name=\"q\"} 0.0075\n"
		"llamacpp:requests_processing 1\n"
		"llamacpp:requests_deferred 4\n"
		"llamacpp:kv_cache_usage_ratio 0.5",
		&z); /* no final newline */
	assert_int_equal(r.samples, 7);
	assert_int_equal(r.skipped, 0);
	assert_string_equal(z.name[6], "llamacpp:kv_cache_usage_ratio");
	assert_string_equal(z.labels[6], "");
	assert_true(z.value[6] == 0.5);
	assert_true(z.value[3] == 0.0075);
}

static void test_escapes_spaces_timestamps(void **state)
{
	(void)state;
	struct seen z;
	struct promtext_result r = parse_fenced(
		"a{path=\"C:\\\\dir\\\\f\",q=\"say \\\"hi\\\"\",nl=\"x\\ny\"} 1\n"
		"  b { x = \"1\" , y=\"2\", } \t 2.5 1700000000000\r\n"
		"c{} NaN\n"
		"d +Inf\n"
		"e -Inf\n"
		"f{x=\"{}\\\" 9\"} -0.5\n",
		&z);
	assert_int_equal(r.skipped, 0);
	assert_int_equal(r.samples, 6);
	assert_string_equal(z.labels[0], "path=C:\\dir\\f;q=say \"hi\";nl=x\ny");
	assert_string_equal(z.name[1], "b");
	assert_string_equal(z.labels[1], "x=1;y=2");
	assert_true(z.value[1] == 2.5);
	assert_true(isnan(z.value[2]));
	assert_true(isinf(z.value[3]) && z.value[3] > 0);
	assert_true(isinf(z.value[4]) && z.value[4] < 0);
	assert_string_equal(z.labels[5], "x={}\" 9");
	assert_true(z.value[5] == -0.5);
}

static void test_broken_lines_are_skipped(void **state)
{
	(void)state;
	struct seen z;
	struct promtext_result r = parse_fenced(
		"good 1\n"
		"9bad 1\n"		/* name starts with a digit */
		"noval\n"		/* no value */
		"x{a=\"1\" 2\n"		/* unclosed braces */
		"x{a=\"1} 2\n"		/* unclosed quote to the end */
		"x{a=1} 2\n"		/* unquoted value */
		"x{a=\"\\q\"} 2\n"	/* unknown escape */
		"x 1 2 3\n"		/* trailing junk */
		"x 12abc\n"		/* not a number */
		"x 1 17e\n"		/* not a timestamp */
		"x{=\"1\"} 2\n"		/* empty label name */
		"x{a=\"1\"b=\"2\"} 2\n" /* no comma */
		"\n"
		"# a comment {\"\n"
		"#\n"
		"also_good{l=\"v\"} 2\n"
		"x{a=\"1\"",
		&z);
	assert_int_equal(r.samples, 2);
	assert_int_equal(r.skipped, 12);
	assert_string_equal(z.name[0], "good");
	assert_string_equal(z.name[1], "also_good");
	assert_string_equal(z.labels[1], "l=v");

	/* a NUL byte in a label value: the value could not be a C string */
	static const char nul[] = "x{a=\"1\0002\"} 2\ny 1\n";
	memset(&z, 0, sizeof(z));
	promtext_parse(nul, sizeof(nul) - 1, on_sample, &z, &r);
	assert_int_equal(r.samples, 1);
	assert_int_equal(r.skipped, 1);
	assert_string_equal(z.name[0], "y");
}

static void test_limits(void **state)
{
	(void)state;
	static char text[PROMTEXT_LINE_MAX * 2 + 4096];
	struct seen z;
	size_t n = 0;

	/* a line one byte over the limit, then one with too many labels, then a good one */
	n += (size_t)snprintf(text + n, sizeof(text) - n, "long{v=\"");
	while (n < PROMTEXT_LINE_MAX - 4)
		text[n++] = 'a';
	n += (size_t)snprintf(text + n, sizeof(text) - n, "\"} 1\n");
	n += (size_t)snprintf(text + n, sizeof(text) - n, "many{");
	for (int i = 0; i <= PROMTEXT_LABELS_MAX; i++)
		n += (size_t)snprintf(text + n, sizeof(text) - n, "l%d=\"%d\",", i, i);
	n += (size_t)snprintf(text + n, sizeof(text) - n, "} 1\nok 3\n");
	struct promtext_result r = parse_fenced(text, &z);
	assert_int_equal(r.samples, 1);
	assert_int_equal(r.skipped, 2);
	assert_string_equal(z.name[0], "ok");

	/* exactly PROMTEXT_LABELS_MAX labels read */
	n = (size_t)snprintf(text, sizeof(text), "many{");
	for (int i = 0; i < PROMTEXT_LABELS_MAX; i++)
		n += (size_t)snprintf(text + n, sizeof(text) - n, "l%d=\"%d\",", i, i);
	snprintf(text + n, sizeof(text) - n, "} 1\n");
	r = parse_fenced(text, &z);
	assert_int_equal(r.samples, 1);
}

static void test_helpers(void **state)
{
	(void)state;
	struct promtext_sample s;
	memset(&s, 0, sizeof(s));
	s.name = "vllm:num_requests_runningX";
	s.name_len = 25;
	assert_true(promtext_name_is(&s, "vllm:num_requests_running"));
	assert_false(promtext_name_is(&s, "vllm:num_requests_runnin"));
	assert_false(promtext_name_is(&s, "vllm:num_requests_runningX"));
	s.labels[0] = (struct promtext_label){ "model_nameZ", 10, "m", 1 };
	s.nlabels = 1;
	assert_non_null(promtext_label(&s, "model_name"));
	assert_null(promtext_label(&s, "model"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vllm),
		cmocka_unit_test(test_sglang_and_llamacpp),
		cmocka_unit_test(test_escapes_spaces_timestamps),
		cmocka_unit_test(test_broken_lines_are_skipped),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_helpers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
