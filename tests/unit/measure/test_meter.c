/*
 * test_meter.c — the meter's runs of same-shape events (framer.h `runs`,
 * meter.c on_shaped): a chat or Responses API stream (one string hole; a
 * digits hole and a string hole) metered with the runs on leaves the
 * same record (events, token events, the timeline, the gaps and their
 * samples, usage, the hint) and the same ITL histogram in its series as
 * with each event handed out on its own, for reads cut at random, slices
 * of a read cut at random (meter_body_v), clocks that stand still or move
 * between reads, and the gaps kept (itl_keep) or not. The words hold
 * escaped quotes and backslashes as the wire has them (`\"`, ` \\\"`,
 * ` z\\`, and `\"content`, which is never taken as the shape's).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "meter.h"
#include "respparse.h"
#include "stats.h"
#include "testrand.h"
#include "timeline.h"

static const char *const words[] = {
	" the", " a",	     " model",	    "next",   " \\\"quoted\\\"", " line\\n", " back\\\\slash", " caf\xc3\xa9",
	",",	".",	     "usage",	    " x",     " token",		 " seven",   " forty-two",     " y",
	"\\\"", " \\\\\\\"", "\\\"content", " z\\\\",
};

/* A Responses API stream of `n` text deltas, their sequence numbers
 * growing (a digit more now and then, which breaks the shape). */
static size_t responses_stream(char *out, size_t cap, int n)
{
	size_t len = 0;

	len += (size_t)snprintf(out + len, cap - len,
				"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,"
				"\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n");
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(
			out + len, cap - len,
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\","
			"\"sequence_number\":%d,\"item_id\":\"msg_1\",\"output_index\":0,"
			"\"content_index\":0,\"delta\":\"%s\",\"logprobs\":[]}\n\n",
			i + 1, words[(size_t)(uniform() * (sizeof(words) / sizeof(words[0])))]);
	len += (size_t)snprintf(
		out + len, cap - len,
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":%d,"
		"\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":5,"
		"\"output_tokens\":%d}}}\n\n",
		n + 1, n);
	assert_true(len < cap);
	return len;
}

/* A chat completions stream of `n` token events, the sim's shape. */
static size_t chat_stream(char *out, size_t cap, int n)
{
	static const char pre[] =
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
		"\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{";
	static const char post[] = "},\"logprobs\":null,\"finish_reason\":null}]}\n\n";
	size_t len = 0;

	len += (size_t)snprintf(out + len, cap - len, "%s\"role\":\"assistant\",\"content\":\"\"%s", pre, post);
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(out + len, cap - len, "%s\"content\":\"%s\"%s", pre,
					words[(size_t)(uniform() * (sizeof(words) / sizeof(words[0])))], post);
	len += (size_t)snprintf(
		out + len, cap - len,
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,"
		"\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
		"data: [DONE]\n\n");
	assert_true(len < cap);
	return len;
}

struct metered {
	struct respparse rp;
	struct req_record rec;
	struct meter m;
};

static void meter_start(struct metered *t, struct stats_shard *sh, const char *route, bool runs, bool keep,
			enum api_kind api)
{
	memset(t, 0, sizeof(*t));
	t->rec.usage = USAGE_UNKNOWN;
	t->rec.inputs = -1;
	t->rec.api = api;
	t->rec.itl_keep = keep;
	snprintf(t->rec.model, sizeof(t->rec.model), "m");
	t->rp.status = 200;
	t->rp.kind = FRAMER_SSE;
	struct meter_env env = { .stats = sh };
	meter_init(&t->m, &env, &t->rec, &t->rp, 0, false);
	meter_label(&t->m, route, "up", false, 1);
	meter_read_begin(&t->m, 1000);
	meter_head(&t->m, &t->rp);
	t->m.framer.runs = runs;
}

static void same_record(const struct req_record *a, const struct req_record *b)
{
	assert_int_equal(a->events, b->events);
	assert_int_equal(a->token_events, b->token_events);
	assert_int_equal(a->reasoning_events, b->reasoning_events);
	assert_int_equal(a->tool_call_events, b->tool_call_events);
	assert_int_equal(a->itl_total, b->itl_total);
	assert_int_equal(a->itl_sum, b->itl_sum);
	assert_int_equal(a->itl_max, b->itl_max);
	assert_int_equal(a->itl_n, b->itl_n);
	if (a->itl_n)
		assert_memory_equal(a->itl_ns, b->itl_ns, a->itl_n * sizeof(a->itl_ns[0]));
	assert_memory_equal(a->at, b->at, sizeof(a->at));
	assert_memory_equal(&a->usage, &b->usage, sizeof(a->usage));
	assert_memory_equal(&a->hint, &b->hint, sizeof(a->hint));
	assert_string_equal(a->resp_model, b->resp_model);
}

static void test_runs_record_as_events_do(void **state)
{
	static char body[1 << 20];
	struct config c;

	(void)state;
	config_defaults(&c);
	struct stats_shard *sh = stats_shard_new(NULL, NULL, &c);
	config_free(&c);
	assert_non_null(sh);
	uint64_t itl_samples = 0;
	testrand_state = 0x31e7e7;
	for (int round = 0; round < 200; round++) {
		bool keep = round & 1;
		enum api_kind api = round & 2 ? API_OPENAI_RESPONSES : API_OPENAI_CHAT;
		int events = 1 + (int)(uniform() * 400);
		size_t len = api == API_OPENAI_CHAT ? chat_stream(body, sizeof(body), events)
						    : responses_stream(body, sizeof(body), events);
		static struct metered on, off;
		char r_on[32], r_off[32];
		snprintf(r_on, sizeof(r_on), "on%d", round);
		snprintf(r_off, sizeof(r_off), "off%d", round);
		meter_start(&on, sh, r_on, true, keep, api);
		meter_start(&off, sh, r_off, false, keep, api);
		uint64_t now = 2000;
		for (size_t at = 0; at < len;) {
			size_t n = 1 + (size_t)(uniform() * (uniform() < 0.5 ? 300 : 20000));
			if (n > len - at)
				n = len - at;
			struct framer_slice v[8];
			size_t nv = 0, from = at;
			while (from < at + n && nv < 8) {
				size_t k = nv == 7 ? at + n - from : 1 + (size_t)(uniform() * (double)(at + n - from));
				v[nv++] = (struct framer_slice){ body + from, k };
				from += k;
			}
			if (uniform() < 0.7)
				now += (uint64_t)(uniform() * 3e6);
			meter_read_begin(&on.m, now);
			meter_read_begin(&off.m, now);
			meter_body_v(&on.m, v, nv);
			meter_body_v(&off.m, v, nv);
			meter_read_end(&on.m);
			meter_read_end(&off.m);
			at += n;
		}
		meter_complete(&on.m);
		meter_complete(&off.m);
		same_record(&on.rec, &off.rec);
		assert_int_equal(on.m.framer.events, off.m.framer.events);
		const struct slice *a = stats_series_slice(stats_series(sh, r_on, "up", "m", false, true));
		const struct slice *b = stats_series_slice(stats_series(sh, r_off, "up", "m", false, true));
		assert_true((a->slot[HM_ITL] == NULL) == (b->slot[HM_ITL] == NULL));
		if (a->slot[HM_ITL]) {
			assert_memory_equal(a->slot[HM_ITL], b->slot[HM_ITL], sizeof(struct hist));
			itl_samples += a->slot[HM_ITL]->count;
		}
		meter_free(&on.m);
		meter_free(&off.m);
		record_release(&on.rec);
		record_release(&off.rec);
	}
	assert_true(itl_samples > 10000); /* the histograms compared were not all empty */
	stats_shard_free(sh);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_runs_record_as_events_do),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
