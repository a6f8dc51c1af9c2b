/*
 * test_admin_recent.c — GET /requests/recent's pure parts: the `n` parameter
 * and the JSON of hand-built ring entries (every timeline event and derived
 * metric under its X-macro key, ms since arrive, null where not reached or
 * not applicable), plus the ring itself: newest first, wrapping at capacity.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "admin_recent.h"
#include "recent.h"
#include "timeline.h"

#define MS 1000000ull /* ns */

static void test_parse_n(void **state)
{
	char err[160];
	size_t n = 0;

	assert_int_equal(admin_recent_parse_n("1", 1024, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_int_equal(admin_recent_parse_n("1024", 1024, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1024);
	assert_int_equal(admin_recent_parse_n("007", 1024, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 7);

	static const char *const bad[] = { "",	 "0",  "1025", "-1",   "+5",  " 5",
					   "5 ", "5x", "1e3",  "0x10", "2.5", "99999999999999999999999999" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		n = 42;
		err[0] = '\0';
		assert_int_equal(admin_recent_parse_n(bad[i], 1024, &n, err, sizeof(err)), -1);
		assert_int_equal(n, 42);
		/* the message names the parameter and the range */
		assert_non_null(strstr(err, "for n"));
		assert_non_null(strstr(err, "1 to 1024"));
	}
	assert_int_equal(admin_recent_parse_n(NULL, 10, &n, err, sizeof(err)), -1);
}

/* A streamed request: every event reached, 4 token events at 100, 110,
 * 130, 160 ms after arrive (reasoning at 100 to 130, the answer from 140),
 * usage known, with its details. */
static void streamed_entry(struct recent_entry *e)
{
	struct req_record *r = &e->rec;
	uint64_t t0 = 5000 * MS;

	memset(e, 0, sizeof(*e));
	snprintf(r->id, sizeof(r->id), "req-1");
	snprintf(r->method, sizeof(r->method), "POST");
	snprintf(r->path, sizeof(r->path), "/v1/chat/completions");
	snprintf(r->model, sizeof(r->model), "m\"odel<b>");
	r->upstream = "127.0.0.1:8000";
	r->api = API_OPENAI_CHAT;
	r->stream = 1;
	r->status = 200;
	r->error = REQ_ERR_NONE;
	r->usage.input_tokens = 12;
	r->usage.output_tokens = 4;
	r->usage.cached_tokens = 8;
	r->usage.cache_write_tokens = -1;
	r->usage.reasoning_tokens = 2;
	r->usage.server = SERVER_TIMING_UNKNOWN;
	r->usage.server.source = SERVER_VLLM;
	r->usage.server.queue_ns = 20 * (int64_t)MS;
	r->usage.server.load_ns = 1 * (int64_t)MS;
	r->usage.server.validation_ns = 2 * (int64_t)MS;
	r->usage.server.prefill_ns = 67 * (int64_t)MS;
	r->usage.server.decode_ns = 60 * (int64_t)MS;
	r->usage.server.inference_ns = 127 * (int64_t)MS;
	r->events = 7;
	r->token_events = 4;
	r->reasoning_events = 2;
	r->tool_call_events = 1;
	r->bytes_in = 300;
	r->bytes_out = 2000;
	r->at[TL_ARRIVE] = t0;
	r->at[TL_REQ_HEADERS] = t0 + MS / 10;
	r->at[TL_DISPATCH] = t0 + MS / 5;
	r->at[TL_UP_CONNECTED] = t0 + MS;
	r->at[TL_REQ_SENT] = t0 + 2 * MS;
	r->at[TL_RESP_HEADERS] = t0 + 50 * MS;
	r->at[TL_FIRST_EVENT] = t0 + 90 * MS;
	r->at[TL_FIRST_TOKEN] = t0 + 100 * MS;
	r->at[TL_FIRST_REASONING] = t0 + 100 * MS;
	r->at[TL_LAST_REASONING] = t0 + 130 * MS;
	r->at[TL_FIRST_ANSWER] = t0 + 140 * MS;
	r->at[TL_LAST_TOKEN] = t0 + 160 * MS;
	r->at[TL_RESP_END] = t0 + 170 * MS;
	r->at[TL_CLIENT_DONE] = t0 + 171 * MS;
	r->itl_n = 3;
	r->itl_total = 3;
	e->unix_ms = 1796000000123ull; /* 2026-11-30T00:53:20.123Z */
	e->load = 3;
	e->cold = true;
	e->itl_mean_ms = 20.0;
	e->itl_max_ms = 30.0;
}

/* A request refused before it reached an upstream: no timeline past the
 * headers, no usage, no ITL. */
static void failed_entry(struct recent_entry *e)
{
	struct req_record *r = &e->rec;

	memset(e, 0, sizeof(*e));
	snprintf(r->id, sizeof(r->id), "req-2");
	snprintf(r->method, sizeof(r->method), "GET");
	snprintf(r->path, sizeof(r->path), "/v1/models");
	r->api = API_UNKNOWN;
	r->stream = -1;
	r->status = 502;
	r->error = REQ_ERR_CONNECT_FAILED;
	r->usage = USAGE_UNKNOWN;
	r->at[TL_ARRIVE] = 7 * MS;
	r->at[TL_REQ_HEADERS] = 7 * MS + 1000;
	e->unix_ms = 1796000000999ull;
	e->load = 1;
	e->itl_mean_ms = NAN;
	e->itl_max_ms = NAN;
}

static json_t *parse(const char *text)
{
	json_error_t je;
	json_t *doc = json_loads(text, 0, &je);
	if (!doc)
		fail_msg("not JSON: %s (%s)", je.text, text);
	return doc;
}

static double real_of(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_number(v))
		fail_msg("%s is not a number", key);
	return json_number_value(v);
}

static void test_render_entries(void **state)
{
	struct recent_entry es[2];
	char *text;
	json_t *doc, *reqs, *a, *b, *tl;

	streamed_entry(&es[0]);
	failed_entry(&es[1]);
	text = admin_recent_render(es, 2, 1024);
	assert_non_null(text);
	doc = parse(text);
	assert_int_equal(json_integer_value(json_object_get(doc, "capacity")), 1024);
	assert_int_equal(json_integer_value(json_object_get(doc, "n")), 2);
	reqs = json_object_get(doc, "requests");
	assert_int_equal(json_array_size(reqs), 2);

	a = json_array_get(reqs, 0);
	assert_string_equal(json_string_value(json_object_get(a, "id")), "req-1");
	assert_string_equal(json_string_value(json_object_get(a, "finished")), "2026-11-30T00:53:20.123Z");
	assert_string_equal(json_string_value(json_object_get(a, "method")), "POST");
	assert_string_equal(json_string_value(json_object_get(a, "path")), "/v1/chat/completions");
	assert_string_equal(json_string_value(json_object_get(a, "api")), "openai-chat");
	/* client-chosen text travels as a JSON string, escaped by the encoder */
	assert_string_equal(json_string_value(json_object_get(a, "model")), "m\"odel<b>");
	assert_string_equal(json_string_value(json_object_get(a, "upstream")), "127.0.0.1:8000");
	assert_true(json_is_true(json_object_get(a, "stream")));
	assert_int_equal(json_integer_value(json_object_get(a, "status")), 200);
	assert_true(json_is_null(json_object_get(a, "error")));
	assert_int_equal(json_integer_value(json_object_get(a, "input_tokens")), 12);
	assert_int_equal(json_integer_value(json_object_get(a, "output_tokens")), 4);
	assert_int_equal(json_integer_value(json_object_get(a, "token_events")), 4);
	assert_true(json_is_true(json_object_get(a, "cold")));
	assert_int_equal(json_integer_value(json_object_get(a, "inflight")), 3);

	/* every event of the X-macro list, in ms since arrive */
	tl = json_object_get(a, "timeline_ms");
	assert_int_equal(json_object_size(tl), TL__COUNT);
	static const double want_tl[TL__COUNT] = { 0, 0.1, 0.2, 1, 2, 50, 90, 100, 100, 130, 140, 160, 170, 171 };
	for (int i = 0; i < TL__COUNT; i++)
		assert_float_equal(real_of(tl, timeline_event_name((enum tl_event)i)), want_tl[i], 1e-9);

	/* derived metrics: the same numbers record_derive gives, by their keys */
	double m[RM__COUNT];
	record_derive(&es[0].rec, m);
	for (int i = 0; i < RM__COUNT; i++) {
		const char *key = req_metric_key((enum req_metric)i);
		if (isnan(m[i])) /* not defined for this request (per_input_ms of a chat): null */
			assert_true(json_is_null(json_object_get(a, key)));
		else
			assert_float_equal(real_of(a, key), round(m[i] * 1000) / 1000, 1e-9);
	}
	assert_true(json_is_null(json_object_get(a, "per_input_ms")));
	assert_float_equal(real_of(a, "ttft_ms"), 100.0, 1e-9);
	assert_float_equal(real_of(a, "e2e_ms"), 170.0, 1e-9);
	assert_float_equal(real_of(a, "tpot_ms"), 20.0, 1e-9);		/* (160 - 100) / (4 - 1) */
	assert_float_equal(real_of(a, "decode_tps"), 50.0, 1e-9);	/* 3 / 0.06 s */
	assert_float_equal(real_of(a, "upstream_ttft_ms"), 98.0, 1e-9); /* first_token - req_sent */
	assert_float_equal(real_of(a, "answer_ttft_ms"), 140.0, 1e-9);
	assert_float_equal(real_of(a, "reasoning_ms"), 30.0, 1e-9);
	/* the server's phases and what neither side accounts for: request
	 * sent to first token (98) less queue, load, validation, prefill */
	assert_string_equal(json_string_value(json_object_get(a, "server_timing")), "vllm");
	assert_float_equal(real_of(a, "upload_ms"), 1.0, 1e-9);
	assert_float_equal(real_of(a, "server_queue_ms"), 20.0, 1e-9);
	assert_float_equal(real_of(a, "server_prefill_ms"), 67.0, 1e-9);
	assert_float_equal(real_of(a, "unattributed_ms"), 8.0, 1e-9);
	assert_int_equal(json_integer_value(json_object_get(a, "reasoning_events")), 2);
	assert_int_equal(json_integer_value(json_object_get(a, "tool_call_events")), 1);
	assert_int_equal(json_integer_value(json_object_get(a, "cached_tokens")), 8);
	assert_true(json_is_null(json_object_get(a, "cache_write_tokens")));
	assert_int_equal(json_integer_value(json_object_get(a, "reasoning_tokens")), 2);
	json_t *itl = json_object_get(a, "itl");
	assert_int_equal(json_integer_value(json_object_get(itl, "count")), 3);
	assert_float_equal(real_of(itl, "mean_ms"), 20.0, 1e-9);
	assert_float_equal(real_of(itl, "max_ms"), 30.0, 1e-9);

	/* the failed one: nulls where nothing was reached or known */
	b = json_array_get(reqs, 1);
	assert_string_equal(json_string_value(json_object_get(b, "error")), "connect_failed");
	assert_int_equal(json_integer_value(json_object_get(b, "status")), 502);
	assert_true(json_is_null(json_object_get(b, "model")));
	assert_true(json_is_null(json_object_get(b, "upstream")));
	assert_true(json_is_null(json_object_get(b, "stream")));
	assert_true(json_is_null(json_object_get(b, "input_tokens")));
	assert_true(json_is_null(json_object_get(b, "server_timing"))); /* tokentap's phases only */
	assert_true(json_is_null(json_object_get(b, "unattributed_ms")));
	assert_true(json_is_null(json_object_get(b, "output_tokens")));
	assert_true(json_is_null(json_object_get(b, "cached_tokens")));
	assert_true(json_is_null(json_object_get(b, "reasoning_tokens")));
	assert_int_equal(json_integer_value(json_object_get(b, "reasoning_events")), 0);
	assert_true(json_is_false(json_object_get(b, "cold")));
	tl = json_object_get(b, "timeline_ms");
	assert_float_equal(real_of(tl, "arrive"), 0.0, 1e-9);
	assert_float_equal(real_of(tl, "req_headers"), 0.001, 1e-9);
	assert_true(json_is_null(json_object_get(tl, "first_token")));
	assert_true(json_is_null(json_object_get(tl, "client_done")));
	for (int i = 0; i < RM__COUNT; i++)
		assert_true(json_is_null(json_object_get(b, req_metric_key((enum req_metric)i))));
	itl = json_object_get(b, "itl");
	assert_int_equal(json_integer_value(json_object_get(itl, "count")), 0);
	assert_true(json_is_null(json_object_get(itl, "mean_ms")));
	assert_true(json_is_null(json_object_get(itl, "max_ms")));

	json_decref(doc);
	free(text);
}

/* The answer's key order, the one it has always had (the access log's
 * differs: RECORD_FIELDS carries both); the derived metrics between the
 * timeline and the ITL summary, in their list's order. */
static void test_render_key_order(void **state)
{
	static const char *const before[] = { "id",
					      "trace_id",
					      "span_id",
					      "finished",
					      "method",
					      "path",
					      "api",
					      "model",
					      "tenant",
					      "upstream",
					      "pick",
					      "pick_predicted_ttft_ms",
					      "pick_prefix_blocks",
					      "stream",
					      "status",
					      "error",
					      "input_tokens",
					      "output_tokens",
					      "cached_tokens",
					      "cache_write_tokens",
					      "reasoning_tokens",
					      "server_timing",
					      "engine",
					      "token_events",
					      "reasoning_events",
					      "tool_call_events",
					      "events",
					      "bytes_in",
					      "bytes_out",
					      "cold",
					      "inflight",
					      "timeline_ms" };
	struct recent_entry e;
	char *text, *at, key[64];
	json_t *doc, *a;

	streamed_entry(&e);
	e.rec.mirror = true; /* the access log's optional keys stay out */
	e.rec.deadline_ms = 500;
	text = admin_recent_render(&e, 1, 4);
	assert_non_null(text);
	at = text;
	for (size_t i = 0; i < sizeof(before) / sizeof(before[0]); i++) {
		snprintf(key, sizeof(key), "\"%s\": ", before[i]);
		assert_non_null(at = strstr(at, key));
	}
	for (int i = 0; i < RM__COUNT; i++) {
		snprintf(key, sizeof(key), "\"%s\": ", req_metric_key((enum req_metric)i));
		assert_non_null(at = strstr(at, key));
	}
	assert_non_null(strstr(at, "\"itl\": "));
	doc = parse(text);
	a = json_array_get(json_object_get(doc, "requests"), 0);
	assert_int_equal(json_object_size(a), sizeof(before) / sizeof(before[0]) + RM__COUNT + 1);
	assert_null(json_object_get(a, "mirror"));
	assert_null(json_object_get(a, "deadline_missed"));
	assert_null(json_object_get(a, "inputs"));
	assert_null(json_object_get(a, "ts"));
	json_decref(doc);
	free(text);
}

static void test_render_empty(void **state)
{
	char *text = admin_recent_render(NULL, 0, 16);
	json_t *doc;

	assert_non_null(text);
	doc = parse(text);
	assert_int_equal(json_integer_value(json_object_get(doc, "n")), 0);
	assert_int_equal(json_integer_value(json_object_get(doc, "capacity")), 16);
	assert_int_equal(json_array_size(json_object_get(doc, "requests")), 0);
	json_decref(doc);
	free(text);
}

/* The ring the endpoint reads: newest first, oldest dropped past capacity,
 * ITL summarised from the record's gaps. */
static void test_ring_snapshot(void **state)
{
	struct recent *rc = recent_new(3);
	struct recent_entry out[5];
	struct req_record r;
	uint64_t gap;

	assert_non_null(rc);
	assert_int_equal(recent_capacity(rc), 3);
	assert_int_equal(recent_capacity(NULL), 0);
	assert_int_equal(recent_snapshot(rc, out, 5), 0);
	for (int i = 0; i < 5; i++) {
		memset(&r, 0, sizeof(r));
		snprintf(r.id, sizeof(r.id), "r%d", i);
		/* the gaps are kept only for an access log; the ring's mean and
		 * max come out the same either way */
		r.itl_keep = i % 2 == 0;
		assert_false(record_token_event(&r, TOKEN_ANSWER, MS, &gap));
		assert_true(record_token_event(&r, TOKEN_ANSWER, 11 * MS, &gap));
		assert_true(record_token_event(&r, TOKEN_ANSWER, 41 * MS, &gap));
		assert_int_equal(gap, 30 * MS);
		assert_int_equal(r.itl_total, 2);
		assert_int_equal(r.itl_n, r.itl_keep ? 2 : 0);
		recent_push(rc, &r, (unsigned)i + 1, i == 4);
		record_release(&r);
	}
	assert_int_equal(recent_snapshot(rc, out, 5), 3);
	assert_string_equal(out[0].rec.id, "r4");
	assert_string_equal(out[1].rec.id, "r3");
	assert_string_equal(out[2].rec.id, "r2");
	assert_true(out[0].cold);
	assert_int_equal(out[0].load, 5);
	assert_null(out[0].rec.itl_ns); /* never a pointer into a finished request */
	assert_float_equal(out[0].itl_mean_ms, 20.0, 1e-9);
	assert_float_equal(out[0].itl_max_ms, 30.0, 1e-9);
	assert_float_equal(out[1].itl_mean_ms, 20.0, 1e-9); /* r3: gaps not kept */
	assert_float_equal(out[1].itl_max_ms, 30.0, 1e-9);
	assert_int_equal(recent_snapshot(rc, out, 1), 1);
	assert_string_equal(out[0].rec.id, "r4");
	recent_free(rc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_n),		 cmocka_unit_test(test_render_entries),
		cmocka_unit_test(test_render_key_order), cmocka_unit_test(test_render_empty),
		cmocka_unit_test(test_ring_snapshot),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
