/*
 * test_otlp.c — the span exporter's options: the file wins over the
 * environment, the environment over the defaults, the signal's endpoint used
 * as is and the base one given /v1/traces, bad numbers refused; and the
 * endpoints otlp_open refuses; the protocol, http/json from the file or
 * either variable, an unknown one refused in the file. The export itself is tested over sockets
 * (tests/integration/test_otlp.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "otlp.h"

static const char *const vars[] = {
	"OTEL_SDK_DISABLED",
	"OTEL_EXPORTER_OTLP_ENDPOINT",
	"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_HEADERS",
	"OTEL_EXPORTER_OTLP_TRACES_HEADERS",
	"OTEL_EXPORTER_OTLP_TIMEOUT",
	"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
	"OTEL_EXPORTER_OTLP_PROTOCOL",
	"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_EXPORTER_OTLP_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
	"OTEL_SERVICE_NAME",
	"OTEL_RESOURCE_ATTRIBUTES",
	"OTEL_BSP_SCHEDULE_DELAY",
	"OTEL_BSP_MAX_QUEUE_SIZE",
	"OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
};

static int clean_env(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
	return 0;
}

static int resolve(const struct config *c, struct otlp_options *o)
{
	char err[300];
	int rc = otlp_options_resolve(c, o, err, sizeof(err));
	return rc;
}

static void test_off_without_endpoint(void **state)
{
	struct config c = { 0 };
	struct otlp_options o;
	(void)state;
	assert_int_equal(resolve(&c, &o), 0);
	setenv("OTEL_SERVICE_NAME", "x", 1);
	assert_int_equal(resolve(&c, &o), 0);
}

static void test_defaults(void **state)
{
	struct config c = { 0 };
	struct otlp_options o;
	(void)state;
	c.otlp_endpoint = "http://collector:4318/";
	assert_int_equal(resolve(&c, &o), 1);
	assert_string_equal(o.url, "http://collector:4318/v1/traces");
	assert_int_equal(o.timeout_ms, OTLP_TIMEOUT_MS_DEFAULT);
	assert_int_equal(o.delay_ms, OTLP_DELAY_MS_DEFAULT);
	assert_int_equal(o.queue_max, OTLP_QUEUE_DEFAULT);
	assert_int_equal(o.batch_max, OTLP_BATCH_DEFAULT);
	assert_null(o.headers);
	assert_null(o.service);
	assert_null(o.ca_file);
	assert_int_equal(o.attempts, OTLP_ATTEMPTS);
}

static void test_environment(void **state)
{
	struct config c = { 0 };
	struct otlp_options o;
	(void)state;
	setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318", 1);
	assert_int_equal(resolve(&c, &o), 1);
	assert_string_equal(o.url, "http://base:4318/v1/traces");
	/* the signal's own endpoint is used as it is */
	setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://traces:443/custom", 1);
	setenv("OTEL_EXPORTER_OTLP_HEADERS", "a=1", 1);
	setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "b=2", 1);
	setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1500", 1);
	setenv("OTEL_BSP_SCHEDULE_DELAY", "250", 1);
	setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100", 1);
	setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "500", 1);
	setenv("OTEL_SERVICE_NAME", "svc", 1);
	setenv("OTEL_RESOURCE_ATTRIBUTES", "k=v", 1);
	setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem", 1);
	assert_int_equal(resolve(&c, &o), 1);
	assert_string_equal(o.url, "https://traces:443/custom");
	assert_string_equal(o.headers, "b=2");
	assert_int_equal(o.timeout_ms, 1500);
	assert_int_equal(o.delay_ms, 250);
	assert_int_equal(o.queue_max, 100);
	assert_int_equal(o.batch_max, 100); /* never above the queue */
	assert_string_equal(o.service, "svc");
	assert_string_equal(o.resource, "k=v");
	assert_string_equal(o.ca_file, "/ca.pem");
	/* disabled: the environment's endpoint is off */
	setenv("OTEL_SDK_DISABLED", "true", 1);
	assert_int_equal(resolve(&c, &o), 0);
}

static void test_file_wins(void **state)
{
	struct config c = { 0 };
	struct otlp_options o;
	(void)state;
	setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://env:1/x", 1);
	setenv("OTEL_EXPORTER_OTLP_HEADERS", "a=1", 1);
	setenv("OTEL_BSP_SCHEDULE_DELAY", "250", 1);
	setenv("OTEL_SERVICE_NAME", "svc", 1);
	setenv("OTEL_SDK_DISABLED", "true", 1);
	c.otlp_endpoint = "http://file:2";
	c.otlp_headers = "f=1";
	c.otlp_delay_ms = 40;
	c.otlp_service = "filesvc";
	assert_int_equal(resolve(&c, &o), 1);
	assert_string_equal(o.url, "http://file:2/v1/traces");
	assert_string_equal(o.headers, "f=1");
	assert_int_equal(o.delay_ms, 40);
	assert_string_equal(o.service, "filesvc");
}

static void test_bad_numbers(void **state)
{
	struct config c = { 0 };
	struct otlp_options o;
	char err[300];
	(void)state;
	c.otlp_endpoint = "http://file:2";
	const char *bad[] = { "abc", "-1", "10ms", "", "99999999999" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("OTEL_BSP_SCHEDULE_DELAY", bad[i], 1);
		int rc = otlp_options_resolve(&c, &o, err, sizeof(err));
		if (bad[i][0]) { /* an empty variable is as unset */
			assert_int_equal(rc, -1);
			assert_non_null(strstr(err, "OTEL_BSP_SCHEDULE_DELAY"));
		} else {
			assert_int_equal(rc, 1);
		}
	}
}

static void test_protocol(void **state)
{
	struct config c = { 0 };
	struct otlp_options o;
	char err[300];
	(void)state;
	c.otlp_endpoint = "http://file:2";
	assert_int_equal(resolve(&c, &o), 1);
	assert_false(o.json);
	setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", 1);
	assert_int_equal(resolve(&c, &o), 1);
	assert_true(o.json);
	/* the signal's variable wins over the common one */
	setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf", 1);
	assert_int_equal(resolve(&c, &o), 1);
	assert_false(o.json);
	/* grpc, or a value not known, in the environment: warned, protobuf */
	setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc", 1);
	assert_int_equal(resolve(&c, &o), 1);
	assert_false(o.json);
	setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/xml", 1);
	assert_int_equal(resolve(&c, &o), 1);
	assert_false(o.json);
	/* the file wins, and refuses what it does not know */
	c.otlp_protocol = "http/json";
	assert_int_equal(resolve(&c, &o), 1);
	assert_true(o.json);
	c.otlp_protocol = "json";
	assert_int_equal(otlp_options_resolve(&c, &o, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "\"json\""));
	c.otlp_protocol = "grpc";
	assert_int_equal(resolve(&c, &o), 1);
	assert_false(o.json);
	/* refused in the file even with no endpoint */
	c.otlp_endpoint = NULL;
	assert_int_equal(resolve(&c, &o), 0);
	c.otlp_protocol = "http/JSON";
	assert_int_equal(otlp_options_resolve(&c, &o, err, sizeof(err)), -1);
}

static void test_open_refuses_bad_urls(void **state)
{
	struct config c = { 0 };
	struct otlp_options o;
	char err[300];
	(void)state;
	const char *bad[] = {
		"ftp://x", "http://", "http://host:0", "http://host:70000", "http://[::1", "http://h:1x"
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", bad[i], 1);
		assert_int_equal(otlp_options_resolve(&c, &o, err, sizeof(err)), 1);
		assert_int_equal(otlp_open(&o, err, sizeof(err)), -1);
		assert_non_null(strstr(err, "OTLP endpoint"));
		assert_false(otlp_active());
	}
	/* a good one starts and stops, with nothing to send */
	setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://[::1]:9/v1/traces", 1);
	assert_int_equal(otlp_options_resolve(&c, &o, err, sizeof(err)), 1);
	assert_int_equal(otlp_open(&o, err, sizeof(err)), 0);
	assert_true(otlp_active());
	struct otlp_counts n;
	assert_true(otlp_counts(&n));
	assert_int_equal(n.exported + n.failures + n.dropped[OTLP_DROP_QUEUE_FULL], 0);
	otlp_close();
	assert_false(otlp_active());
	assert_false(otlp_counts(&n));
	/* an https one whose CA file cannot be read fails at open */
	setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://127.0.0.1:9", 1);
	setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem", 1);
	assert_int_equal(otlp_options_resolve(&c, &o, err, sizeof(err)), 1);
	assert_int_equal(otlp_open(&o, err, sizeof(err)), -1);
	assert_false(otlp_active());
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_off_without_endpoint, clean_env),
		cmocka_unit_test_setup(test_defaults, clean_env),
		cmocka_unit_test_setup(test_environment, clean_env),
		cmocka_unit_test_setup(test_file_wins, clean_env),
		cmocka_unit_test_setup(test_bad_numbers, clean_env),
		cmocka_unit_test_setup(test_protocol, clean_env),
		cmocka_unit_test_setup(test_open_refuses_bad_urls, clean_env),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
