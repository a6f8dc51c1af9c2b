/*
 * test_otlp_metrics.c — the GenAI metrics' options: opt-in (the base
 * endpoint alone is for spans), the signal's endpoint used as is, the base
 * one given /v1/metrics only with OTEL_METRICS_EXPORTER=otlp, the file over
 * the environment, the interval, bad numbers refused, /metrics alone, the
 * protocol (http/json from the file or either variable). The
 * export itself is tested over sockets (tests/integration/test_otlp_metrics.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "otlp_metrics.h"

static const char *const vars[] = {
	"OTEL_SDK_DISABLED",	       "OTEL_EXPORTER_OTLP_ENDPOINT",	      "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
	"OTEL_METRICS_EXPORTER",       "OTEL_METRIC_EXPORT_INTERVAL",	      "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
	"OTEL_EXPORTER_OTLP_TIMEOUT",  "OTEL_EXPORTER_OTLP_HEADERS",	      "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
};

static int clean_env(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
	return 0;
}

static int resolve(const struct config *c, struct otlp_metrics_options *o)
{
	char err[300];
	return otlp_metrics_options_resolve(c, o, err, sizeof(err));
}

static void test_opt_in(void **state)
{
	struct config c = { 0 };
	struct otlp_metrics_options o;
	(void)state;
	assert_int_equal(resolve(&c, &o), 0);
	setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318", 1);
	assert_int_equal(resolve(&c, &o), 0); /* spans only */
	setenv("OTEL_METRICS_EXPORTER", "otlp", 1);
	assert_int_equal(resolve(&c, &o), 1);
	assert_string_equal(o.http.url, "http://127.0.0.1:4318/v1/metrics");
	assert_int_equal(o.interval_ms, OTLPM_INTERVAL_MS_DEFAULT);
	assert_int_equal(o.max_series, 256);
	setenv("OTEL_SDK_DISABLED", "true", 1);
	assert_int_equal(resolve(&c, &o), 0);
}

static void test_signal_endpoint_as_is(void **state)
{
	struct config c = { 0 };
	struct otlp_metrics_options o;
	(void)state;
	setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://h:1/custom", 1);
	setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:2", 1);
	setenv("OTEL_METRICS_EXPORTER", "otlp", 1);
	setenv("OTEL_METRIC_EXPORT_INTERVAL", "1500", 1);
	setenv("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "700", 1);
	assert_int_equal(resolve(&c, &o), 1);
	assert_string_equal(o.http.url, "http://h:1/custom");
	assert_int_equal(o.interval_ms, 1500);
	assert_int_equal(o.http.timeout_ms, 700);
}

static void test_file_wins(void **state)
{
	struct config c = { 0 };
	struct otlp_metrics_options o;
	(void)state;
	setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://env:1/v1/metrics", 1);
	setenv("OTEL_METRIC_EXPORT_INTERVAL", "1500", 1);
	setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "a=env", 1);
	c.otlp_metrics_endpoint = "http://file:2//";
	c.otlp_metrics_interval_ms = 250;
	c.otlp_metrics_series = 9;
	c.otlp_headers = "a=file";
	assert_int_equal(resolve(&c, &o), 1);
	assert_string_equal(o.http.url, "http://file:2/v1/metrics");
	assert_int_equal(o.interval_ms, 250);
	assert_int_equal(o.max_series, 9);
	assert_string_equal(o.http.headers, "a=file");
	setenv("OTEL_SDK_DISABLED", "true", 1); /* the file's endpoint stays */
	assert_int_equal(resolve(&c, &o), 1);
}

static void test_bad_interval(void **state)
{
	struct config c = { 0 };
	struct otlp_metrics_options o;
	(void)state;
	setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://h:1/v1/metrics", 1);
	setenv("OTEL_METRIC_EXPORT_INTERVAL", "soon", 1);
	assert_int_equal(resolve(&c, &o), -1);
	setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600001", 1);
	assert_int_equal(resolve(&c, &o), -1);
}

static void test_prometheus_alone(void **state)
{
	struct config c = { 0 };
	struct otlp_metrics_options o;
	(void)state;
	c.genai_prometheus = true;
	assert_int_equal(resolve(&c, &o), 1);
	assert_string_equal(o.http.url, "");
	assert_true(o.prometheus);
}

static void test_protocol(void **state)
{
	struct config c = { 0 };
	struct otlp_metrics_options o;
	(void)state;
	c.otlp_metrics_endpoint = "http://file:2";
	assert_int_equal(resolve(&c, &o), 1);
	assert_false(o.http.json);
	setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", 1);
	assert_int_equal(resolve(&c, &o), 1);
	assert_true(o.http.json);
	setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc", 1); /* the signal's wins; grpc: protobuf */
	assert_int_equal(resolve(&c, &o), 1);
	assert_false(o.http.json);
	c.otlp_metrics_protocol = "http/json"; /* the file wins */
	assert_int_equal(resolve(&c, &o), 1);
	assert_true(o.http.json);
	c.otlp_protocol = "http/protobuf"; /* the spans' setting is the spans' */
	assert_int_equal(resolve(&c, &o), 1);
	assert_true(o.http.json);
	c.otlp_metrics_protocol = "protobuf";
	assert_int_equal(resolve(&c, &o), -1);
	c.otlp_metrics_endpoint = NULL; /* refused with nothing exported too */
	c.genai_prometheus = true;
	assert_int_equal(resolve(&c, &o), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_opt_in, clean_env),
		cmocka_unit_test_setup(test_signal_endpoint_as_is, clean_env),
		cmocka_unit_test_setup(test_file_wins, clean_env),
		cmocka_unit_test_setup(test_bad_interval, clean_env),
		cmocka_unit_test_setup(test_prometheus_alone, clean_env),
		cmocka_unit_test_setup(test_protocol, clean_env),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
