/*
 * test_otlp_json.c — OTLP/JSON (otlp_json.h): lowerCamelCase keys, ids in
 * hex, other bytes in base64, enums as integers, 64-bit integers as decimal
 * strings, defaults left out unless the field has presence (a oneof member,
 * proto2 `optional`), non-finite doubles as strings. That real receivers
 * read it is tested over sockets (tests/integration/test_otlp.py and
 * test_otlp_metrics.py, the decoder proven on the official exporter's).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <otlp_metrics.pb-c.h>
#include <otlp_trace.pb-c.h>
#include <stdlib.h>
#include <string.h>

#include "otlp_json.h"

static json_t *encode(const ProtobufCMessage *m, char **text)
{
	size_t len;
	char *s = otlp_json_encode(m, &len);
	assert_non_null(s);
	assert_int_equal(strlen(s), len);
	json_error_t e;
	json_t *j = json_loads(s, 0, &e);
	if (!j)
		fail_msg("not JSON: %s: %s", e.text, s);
	if (text)
		*text = s;
	else
		free(s);
	return j;
}

static void test_status_exact(void **state)
{
	(void)state;
	Tokentap__Otlp__Status st = TOKENTAP__OTLP__STATUS__INIT;
	char *s;
	json_decref(encode(&st.base, &s));
	assert_string_equal(s, "{}"); /* every field at its default: left out */
	free(s);
	st.code = TOKENTAP__OTLP__STATUS__STATUS_CODE__STATUS_CODE_ERROR;
	st.message = "upstream_reset";
	json_decref(encode(&st.base, &s));
	assert_string_equal(s, "{\"message\":\"upstream_reset\",\"code\":2}");
	free(s);
}

static void test_span(void **state)
{
	(void)state;
	uint8_t tid[16], sid[8] = { 0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31 }, bytes[4] = { 1, 2, 3, 4 };
	for (int i = 0; i < 16; i++)
		tid[i] = (uint8_t)(0xf0 + i);
	Tokentap__Otlp__AnyValue av[6];
	Tokentap__Otlp__KeyValue kv[6], *kvp[6];
	const char *keys[6] = { "s", "i", "d", "b", "x", "e" };
	for (int i = 0; i < 6; i++) {
		av[i] = (Tokentap__Otlp__AnyValue)TOKENTAP__OTLP__ANY_VALUE__INIT;
		kv[i] = (Tokentap__Otlp__KeyValue)TOKENTAP__OTLP__KEY_VALUE__INIT;
		kv[i].key = (char *)keys[i];
		kv[i].value = &av[i];
		kvp[i] = &kv[i];
	}
	av[0].value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_STRING_VALUE;
	av[0].string_value = "chat \"m1\"\n";
	av[1].value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_INT_VALUE;
	av[1].int_value = INT64_MIN;
	av[2].value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_DOUBLE_VALUE;
	av[2].double_value = 0.1;
	av[3].value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_BOOL_VALUE;
	av[3].bool_value = 0; /* a oneof member at its default is still there */
	av[4].value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_BYTES_VALUE;
	av[4].bytes_value = (ProtobufCBinaryData){ 4, bytes };
	av[5].value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_INT_VALUE;
	av[5].int_value = 0;

	Tokentap__Otlp__Span__Event ev = TOKENTAP__OTLP__SPAN__EVENT__INIT, *evp = &ev;
	ev.time_unix_nano = 18446744073709551615ull;
	ev.name = "first_token";
	Tokentap__Otlp__Status st = TOKENTAP__OTLP__STATUS__INIT;
	Tokentap__Otlp__Span sp = TOKENTAP__OTLP__SPAN__INIT, *spp = &sp;
	sp.trace_id = (ProtobufCBinaryData){ 16, tid };
	sp.span_id = (ProtobufCBinaryData){ 8, sid };
	sp.flags = 0x301;
	sp.name = "chat m1";
	sp.kind = TOKENTAP__OTLP__SPAN__SPAN_KIND__SPAN_KIND_SERVER;
	sp.start_time_unix_nano = 1764000000123456789ull;
	sp.end_time_unix_nano = 1764000001900000001ull;
	sp.n_attributes = 6;
	sp.attributes = kvp;
	sp.n_events = 1;
	sp.events = &evp;
	sp.status = &st;
	Tokentap__Otlp__InstrumentationScope scope = TOKENTAP__OTLP__INSTRUMENTATION_SCOPE__INIT;
	scope.name = "tokentap";
	Tokentap__Otlp__ScopeSpans ss = TOKENTAP__OTLP__SCOPE_SPANS__INIT, *ssp = &ss;
	ss.scope = &scope;
	ss.n_spans = 1;
	ss.spans = &spp;
	Tokentap__Otlp__Resource res = TOKENTAP__OTLP__RESOURCE__INIT;
	Tokentap__Otlp__ResourceSpans rs = TOKENTAP__OTLP__RESOURCE_SPANS__INIT, *rsp = &rs;
	rs.resource = &res;
	rs.n_scope_spans = 1;
	rs.scope_spans = &ssp;
	Tokentap__Otlp__ExportTraceServiceRequest req = TOKENTAP__OTLP__EXPORT_TRACE_SERVICE_REQUEST__INIT;
	req.n_resource_spans = 1;
	req.resource_spans = &rsp;

	json_t *j = encode(&req.base, NULL);
	json_t *jrs = json_array_get(json_object_get(j, "resourceSpans"), 0);
	assert_non_null(jrs);
	assert_int_equal(json_object_size(json_object_get(jrs, "resource")), 0);
	json_t *jss = json_array_get(json_object_get(jrs, "scopeSpans"), 0);
	assert_string_equal(json_string_value(json_object_get(json_object_get(jss, "scope"), "name")), "tokentap");
	assert_null(json_object_get(json_object_get(jss, "scope"), "version")); /* "" is the default */
	json_t *s = json_array_get(json_object_get(jss, "spans"), 0);
	assert_string_equal(json_string_value(json_object_get(s, "traceId")), "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
	assert_string_equal(json_string_value(json_object_get(s, "spanId")), "b7ad6b7169203331");
	assert_null(json_object_get(s, "parentSpanId")); /* a root span */
	assert_null(json_object_get(s, "traceState"));
	assert_null(json_object_get(s, "trace_id"));
	assert_int_equal(json_integer_value(json_object_get(s, "flags")), 0x301);
	assert_true(json_is_integer(json_object_get(s, "kind")));
	assert_int_equal(json_integer_value(json_object_get(s, "kind")), 2);
	assert_string_equal(json_string_value(json_object_get(s, "startTimeUnixNano")), "1764000000123456789");
	assert_string_equal(json_string_value(json_object_get(s, "endTimeUnixNano")), "1764000001900000001");
	json_t *a = json_object_get(s, "attributes");
	assert_int_equal(json_array_size(a), 6);
#define VAL(i, k) json_object_get(json_object_get(json_array_get(a, i), "value"), k)
	assert_string_equal(json_string_value(json_object_get(json_array_get(a, 0), "key")), "s");
	assert_string_equal(json_string_value(VAL(0, "stringValue")), "chat \"m1\"\n");
	assert_string_equal(json_string_value(VAL(1, "intValue")), "-9223372036854775808");
	assert_true(json_is_real(VAL(2, "doubleValue")));
	assert_true(json_real_value(VAL(2, "doubleValue")) == 0.1); /* round-trips exactly */
	assert_true(json_is_false(VAL(3, "boolValue")));
	assert_string_equal(json_string_value(VAL(4, "bytesValue")), "AQIDBA==");
	assert_string_equal(json_string_value(VAL(5, "intValue")), "0");
	assert_int_equal(json_object_size(json_object_get(json_array_get(a, 0), "value")), 1);
#undef VAL
	json_t *e = json_array_get(json_object_get(s, "events"), 0);
	assert_string_equal(json_string_value(json_object_get(e, "timeUnixNano")), "18446744073709551615");
	assert_string_equal(json_string_value(json_object_get(e, "name")), "first_token");
	assert_null(json_object_get(e, "attributes")); /* empty repeated: left out */
	assert_int_equal(json_object_size(json_object_get(s, "status")), 0);
	json_decref(j);

	/* a child span has its parent, in hex */
	sp.parent_span_id = (ProtobufCBinaryData){ 8, sid };
	j = encode(&req.base, NULL);
	s = json_array_get(
		json_object_get(json_array_get(json_object_get(json_array_get(json_object_get(j, "resourceSpans"), 0),
							       "scopeSpans"),
					       0),
				"spans"),
		0);
	assert_string_equal(json_string_value(json_object_get(s, "parentSpanId")), "b7ad6b7169203331");
	json_decref(j);
}

static void test_exponential_histogram(void **state)
{
	(void)state;
	uint64_t counts[3] = { 1, 0, 7 };
	Tokentap__Otlp__ExponentialHistogramDataPoint__Buckets pos =
		TOKENTAP__OTLP__EXPONENTIAL_HISTOGRAM_DATA_POINT__BUCKETS__INIT;
	pos.has_offset = 1;
	pos.offset = -2;
	pos.n_bucket_counts = 3;
	pos.bucket_counts = counts;
	Tokentap__Otlp__ExponentialHistogramDataPoint dp = TOKENTAP__OTLP__EXPONENTIAL_HISTOGRAM_DATA_POINT__INIT,
						      *dpp = &dp;
	dp.has_time_unix_nano = 1;
	dp.time_unix_nano = 5;
	dp.has_count = 1;
	dp.count = 8;
	dp.has_sum = 1;
	dp.sum = 0; /* present: proto2's optional has it, so it is said */
	dp.has_scale = 1;
	dp.scale = -3;
	dp.has_zero_count = 1;
	dp.zero_count = 0;
	dp.positive = &pos;
	dp.has_max = 1;
	dp.max = NAN;
	dp.min = 3; /* has_min unset: absent */
	Tokentap__Otlp__ExponentialHistogram eh = TOKENTAP__OTLP__EXPONENTIAL_HISTOGRAM__INIT;
	eh.n_data_points = 1;
	eh.data_points = &dpp;
	eh.has_aggregation_temporality = 1;
	eh.aggregation_temporality = TOKENTAP__OTLP__AGGREGATION_TEMPORALITY__AGGREGATION_TEMPORALITY_CUMULATIVE;
	Tokentap__Otlp__Metric m = TOKENTAP__OTLP__METRIC__INIT;
	m.name = "gen_ai.client.operation.duration";
	m.unit = "s";
	m.data_case = TOKENTAP__OTLP__METRIC__DATA_EXPONENTIAL_HISTOGRAM;
	m.exponential_histogram = &eh;

	json_t *j = encode(&m.base, NULL);
	assert_string_equal(json_string_value(json_object_get(j, "name")), "gen_ai.client.operation.duration");
	assert_string_equal(json_string_value(json_object_get(j, "unit")), "s");
	assert_null(json_object_get(j, "description")); /* NULL: not set */
	json_t *h = json_object_get(j, "exponentialHistogram");
	assert_int_equal(json_integer_value(json_object_get(h, "aggregationTemporality")), 2);
	json_t *p = json_array_get(json_object_get(h, "dataPoints"), 0);
	assert_null(json_object_get(p, "startTimeUnixNano"));
	assert_string_equal(json_string_value(json_object_get(p, "timeUnixNano")), "5");
	assert_string_equal(json_string_value(json_object_get(p, "count")), "8");
	assert_true(json_is_real(json_object_get(p, "sum")));
	assert_true(json_real_value(json_object_get(p, "sum")) == 0);
	assert_int_equal(json_integer_value(json_object_get(p, "scale")), -3);
	assert_string_equal(json_string_value(json_object_get(p, "zeroCount")), "0");
	assert_null(json_object_get(p, "min"));
	assert_string_equal(json_string_value(json_object_get(p, "max")), "NaN");
	assert_null(json_object_get(p, "negative"));
	json_t *b = json_object_get(p, "positive");
	assert_int_equal(json_integer_value(json_object_get(b, "offset")), -2);
	json_t *c = json_object_get(b, "bucketCounts");
	assert_int_equal(json_array_size(c), 3);
	assert_string_equal(json_string_value(json_array_get(c, 0)), "1");
	assert_string_equal(json_string_value(json_array_get(c, 1)), "0");
	assert_string_equal(json_string_value(json_array_get(c, 2)), "7");
	json_decref(j);

	dp.max = -INFINITY;
	j = encode(&m.base, NULL);
	p = json_array_get(json_object_get(json_object_get(j, "exponentialHistogram"), "dataPoints"), 0);
	assert_string_equal(json_string_value(json_object_get(p, "max")), "-Infinity");
	json_decref(j);
}

static void test_not_utf8(void **state)
{
	(void)state;
	Tokentap__Otlp__Status st = TOKENTAP__OTLP__STATUS__INIT;
	char *s;
	st.message =
		"a\xff\xfe"
		"b";
	json_decref(encode(&st.base, &s));
	assert_string_equal(s, "{\"message\":\"a??b\"}");
	free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_status_exact),
		cmocka_unit_test(test_span),
		cmocka_unit_test(test_exponential_histogram),
		cmocka_unit_test(test_not_utf8),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
