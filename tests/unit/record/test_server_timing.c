/*
 * test_server_timing.c — each engine's own per-request timings, read as the
 * response passes: llama.cpp's "timings", Ollama's durations, vLLM's
 * "metrics", TGI's headers. Present, absent, malformed, and cut at every
 * byte (events through the framer, headers through the response parser);
 * then the decomposition record_derive builds from them. JSON is written
 * with single quotes; J() turns them into double quotes.
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

#include "classify.h"
#include "framer.h"
#include "respparse.h"
#include "respparse_fixture.h"
#include "timeline.h"
#include "quotes.h"

static void timing_eq(const struct server_timing *a, const struct server_timing *b)
{
	assert_int_equal(a->queue_ns, b->queue_ns);
	assert_int_equal(a->load_ns, b->load_ns);
	assert_int_equal(a->validation_ns, b->validation_ns);
	assert_int_equal(a->prefill_ns, b->prefill_ns);
	assert_int_equal(a->decode_ns, b->decode_ns);
	assert_int_equal(a->inference_ns, b->inference_ns);
	assert_int_equal(a->source, b->source);
}

/* One event on its own, with a hint and without (same answer), from an
 * exact-size heap copy so ASan sees a read past its end. */
static void event(enum api_kind api, const char *name, const char *data, struct usage *u)
{
	static struct classify_hint hint;
	struct framer_event ev = { .name = name, .name_len = name ? strlen(name) : 0, .data_len = strlen(data) };
	char *copy = malloc(ev.data_len ? ev.data_len : 1);
	assert_non_null(copy);
	memcpy(copy, data, ev.data_len);
	ev.data = copy;
	struct usage hinted = *u;
	enum token_kind k = classify_event(api, &ev, u, NULL);
	assert_int_equal(classify_event(api, &ev, &hinted, &hint), k);
	timing_eq(&u->server, &hinted.server);
	free(copy);
}

static struct usage body(enum api_kind api, const char *json)
{
	struct usage u = USAGE_UNKNOWN;
	size_t n = strlen(json);
	char *copy = malloc(n ? n : 1);
	assert_non_null(copy);
	memcpy(copy, json, n);
	classify_body(api, copy, n, &u);
	free(copy);
	return u;
}

/* A report of the engines the tables below cover (TGI's headers are
 * further down): the source and the four durations in ns (-1: not
 * reported); validation, inference and first byte, which none of them
 * reports, unknown. */
static struct server_timing timing(enum server_source src, int64_t queue, int64_t load, int64_t prefill, int64_t decode)
{
	struct server_timing t = SERVER_TIMING_UNKNOWN;
	t.source = src;
	t.queue_ns = queue;
	t.load_ns = load;
	t.prefill_ns = prefill;
	t.decode_ns = decode;
	return t;
}

#define NOTHING timing(SERVER_NONE, -1, -1, -1, -1)

struct timing_case {
	const char *what;
	enum api_kind api;
	const char *name;   /* the event's `event:` name, or NULL */
	const char *before; /* events: a token event first, that reports nothing */
	const char *json;
	enum server_source src;
	int64_t queue, load, prefill, decode;
};

/* The report read from the last event of a stream (after `before`) or from
 * a body, checked whole. */
static void check_timing(const struct timing_case *c, bool is_body)
{
	struct usage u = USAGE_UNKNOWN;
	struct server_timing want = timing(c->src, c->queue, c->load, c->prefill, c->decode), none = NOTHING;

	print_message("%s\n", c->what);
	if (is_body) {
		u = body(c->api, J(c->json));
	} else {
		if (c->before) {
			event(c->api, c->name, J(c->before), &u);
			timing_eq(&u.server, &none);
		}
		event(c->api, c->name, J(c->json), &u);
	}
	timing_eq(&u.server, &want);
}

/* Streamed: the report on the stream's last event, none before it. */
static void test_event_timings(void **state)
{
	static const struct timing_case cases[] = {
		{ "llama.cpp native /completion, the final object", API_LLAMACPP, NULL,
		  "{'content':'The','stop':false}",
		  "{'content':'','stop':true,'tokens_predicted':25,'tokens_evaluated':68,'timings':{'cache_n':60,"
		  "'prompt_n':8,'prompt_ms':43.237,'prompt_per_token_ms':5.404625,'prompt_per_second':185.03,"
		  "'predicted_n':25,'predicted_ms':238.74,'predicted_per_token_ms':9.5496,'predicted_per_second':104."
		  "72}}",
		  SERVER_LLAMACPP, -1, -1, 43237000, 238740000 }, /* llama.cpp reports no queue, no load */
		{ "llama.cpp, OpenAI chat without include_usage: timings on the finish chunk", API_OPENAI_CHAT, NULL,
		  NULL,
		  "{'choices':[{'finish_reason':'stop','index':0,'delta':{}}],'created':1,'id':'c','model':'m',"
		  "'object':'chat.completion.chunk','timings':{'prompt_n':5,'prompt_ms':1.5,'predicted_n':3,"
		  "'predicted_ms':2}}",
		  SERVER_LLAMACPP, -1, -1, 1500000, 2000000 },
		{ "llama.cpp, OpenAI chat with include_usage: on the usage chunk; 1e1 ms, 0.0005 ms", API_OPENAI_CHAT,
		  NULL, NULL,
		  "{'choices':[],'usage':{'prompt_tokens':5,'completion_tokens':3},'timings':{'prompt_ms':1e1,"
		  "'predicted_ms':0.0005}}",
		  SERVER_LLAMACPP, -1, -1, 10000000, 500 },
		{ "Ollama chat, the done object", API_OLLAMA_CHAT, NULL,
		  "{'model':'m','message':{'role':'assistant','content':'Hi'},'done':false}",
		  "{'model':'m','message':{'role':'assistant','content':''},'done':true,'done_reason':'stop',"
		  "'total_duration':4883583458,'load_duration':1334875,'prompt_eval_count':26,"
		  "'prompt_eval_duration':342546000,'eval_count':282,'eval_duration':4535599000}",
		  SERVER_OLLAMA, -1, 1334875, 342546000, 4535599000 },
		{ "vLLM streamed chat: on the final usage chunk", API_OPENAI_CHAT, NULL,
		  "{'choices':[{'index':0,'delta':{'content':'a'}}],'usage':null}",
		  "{'id':'c','choices':[],'usage':{'prompt_tokens':42,'completion_tokens':128,'total_tokens':170},"
		  "'metrics':{'time_to_first_token_ms':85.2,'generation_time_ms':1240.5,'queue_time_ms':12.3,"
		  "'mean_itl_ms':9.1,'tokens_per_second':103.2}}",
		  SERVER_VLLM, 12300000, -1, 85200000, 1240500000 },
		{ "vLLM Responses: in the response of response.completed", API_OPENAI_RESPONSES, "response.completed",
		  NULL,
		  "{'type':'response.completed','response':{'id':'r','status':'completed','usage':{'input_tokens':3,"
		  "'output_tokens':2},'metrics':{'queue_time_ms':4,'time_to_first_token_ms':5,'generation_time_ms':6}}"
		  "}",
		  SERVER_VLLM, 4000000, -1, 5000000, 6000000 },
	};
	(void)state;

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
		check_timing(&cases[c], false);
	/* the usage chunk that carries timings still gives its tokens */
	struct usage u = USAGE_UNKNOWN;
	event(API_OPENAI_CHAT, NULL, J(cases[2].json), &u);
	assert_int_equal(u.input_tokens, 5);
}

/* Whole bodies; and what is not a report: malformed durations, a key in a
 * string or deeper down, none at all. */
static void test_body_timings(void **state)
{
	static const struct timing_case cases[] = {
		{ "llama.cpp, non-streamed chat: timings next to usage", API_OPENAI_CHAT, NULL, NULL,
		  "{'choices':[{'message':{'content':'x'}}],'usage':{'prompt_tokens':2,'completion_tokens':1},"
		  "'timings':{'prompt_ms':7.25,'predicted_ms':0}}",
		  SERVER_LLAMACPP, -1, -1, 7250000, 0 },
		{ "llama.cpp: a string, a negative", API_LLAMACPP, NULL, NULL,
		  "{'content':'','timings':{'prompt_ms':'43.2','predicted_ms':-1.5}}", SERVER_NONE, -1, -1, -1, -1 },
		{ "llama.cpp: null, a bare dot", API_LLAMACPP, NULL, NULL,
		  "{'content':'','timings':{'prompt_ms':null,'predicted_ms':1.}}", SERVER_NONE, -1, -1, -1, -1 },
		{ "llama.cpp: an object, an exponent without digits", API_LLAMACPP, NULL, NULL,
		  "{'content':'','timings':{'prompt_ms':{'a':1},'predicted_ms':1e}}", SERVER_NONE, -1, -1, -1, -1 },
		{ "llama.cpp: out of range, letters", API_LLAMACPP, NULL, NULL,
		  "{'content':'','timings':{'prompt_ms':1e400,'predicted_ms':12x}}", SERVER_NONE, -1, -1, -1, -1 },
		{ "llama.cpp: \"timings\" in a string, and nested deeper", API_LLAMACPP, NULL, NULL,
		  "{'content':'\\'timings\\':{\\'prompt_ms\\':1}','x':{'timings':{'prompt_ms':1}}}", SERVER_NONE, -1,
		  -1, -1, -1 },
		{ "llama.cpp: absent", API_LLAMACPP, NULL, NULL, "{'content':'x','tokens_predicted':1}", SERVER_NONE,
		  -1, -1, -1, -1 },
		{ "Ollama generate: prompt_eval_duration omitted (omitempty)", API_OLLAMA_GENERATE, NULL, NULL,
		  "{'response':'x','done':true,'eval_count':1,'eval_duration':5}", SERVER_OLLAMA, -1, -1, -1, 5 },
		{ "Ollama: ns are integers; a fraction, a sign or a string is not one", API_OLLAMA_GENERATE, NULL, NULL,
		  "{'response':'x','done':true,'eval_count':1,'eval_duration':5.5,'load_duration':-3,"
		  "'prompt_eval_duration':'9'}",
		  SERVER_NONE, -1, -1, -1, -1 },
		{ "vLLM non-streamed completions; a null field stays unknown", API_OPENAI_COMPLETIONS, NULL, NULL,
		  "{'choices':[{'text':'x'}],'usage':{'prompt_tokens':1,'completion_tokens':1},'metrics':{"
		  "'time_to_first_token_ms':3,'generation_time_ms':null,'queue_time_ms':0.001,'mean_itl_ms':null}}",
		  SERVER_VLLM, 1000, -1, 3000000, -1 },
		{ "vLLM: \"metrics\": null (n > 1)", API_OPENAI_CHAT, NULL, NULL,
		  "{'choices':[],'usage':{'prompt_tokens':1},'metrics':null}", SERVER_NONE, -1, -1, -1, -1 },
		{ "vLLM Responses, a body", API_OPENAI_RESPONSES, NULL, NULL,
		  "{'id':'r','status':'completed','metrics':{'queue_time_ms':7.5}}", SERVER_VLLM, 7500000, -1, -1, -1 },
	};
	(void)state;

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
		check_timing(&cases[c], true);
}

/* Every event of `stream` fed through the framer cut at `cut` bytes (and
 * whole): the server timings come out the same. */
struct fed {
	enum api_kind api;
	struct usage u;
};

static void on_event(void *arg, const struct framer_event *ev)
{
	struct fed *f = arg;
	classify_event(f->api, ev, &f->u, NULL);
}

/* Token events and usage of `stream`, cut at `cut` (0: whole). */
struct counted {
	enum api_kind api;
	struct usage u;
	unsigned tokens;
};

static void on_counted(void *arg, const struct framer_event *ev)
{
	struct counted *c = arg;
	c->tokens += classify_event(c->api, ev, &c->u, NULL) != TOKEN_NONE;
}

static struct counted count_split(enum api_kind api, const char *stream, size_t cut)
{
	struct framer fr;
	struct counted c = { api, USAGE_UNKNOWN, 0 };
	size_t n = strlen(stream);
	framer_init(&fr, FRAMER_SSE, 1 << 16, on_counted, &c);
	framer_feed(&fr, stream, cut ? cut : n);
	if (cut)
		framer_feed(&fr, stream + cut, n - cut);
	framer_finish(&fr);
	framer_free(&fr);
	return c;
}

/* llama.cpp's native /completion and TGI's /generate_stream as
 * tokentap-sim writes them (the engines' shapes: TGI's "data:" without a
 * space, its details on the last token's event; llama.cpp's closing object
 * with "stop":true and timings), cut at every byte: the same token events,
 * token counts and timings. */
static void test_native_streams_split(void **state)
{
	(void)state;
	static const struct {
		enum api_kind api;
		const char *stream;
		unsigned tokens;
		int64_t in, out;
	} cases[] = {
		{ API_TGI,
		  "data:{\"index\":1,\"token\":{\"id\":1000,\"text\":\"forty-two\",\"logprob\":-0.25,\"special\":false}"
		  ","
		  "\"generated_text\":null,\"details\":null}\n\n"
		  "data:{\"index\":2,\"token\":{\"id\":8919,\"text\":\" seven\",\"logprob\":-0.25,\"special\":false},"
		  "\"generated_text\":null,\"details\":null}\n\n"
		  "data:{\"index\":3,\"token\":{\"id\":16838,\"text\":\" with\",\"logprob\":-0.25,\"special\":false},"
		  "\"generated_text\":\"forty-two seven with\",\"details\":{\"finish_reason\":\"length\","
		  "\"generated_tokens\":3,\"seed\":null,\"input_length\":3}}\n\n",
		  3, 3, 3 },
		{ API_LLAMACPP,
		  "data: {\"index\":0,\"content\":\"prompt\",\"tokens\":[],\"stop\":false,\"id_slot\":0,"
		  "\"tokens_predicted\":1,\"tokens_evaluated\":5}\n\n"
		  "data: {\"index\":0,\"content\":\" chunk\",\"tokens\":[],\"stop\":false,\"id_slot\":0,"
		  "\"tokens_predicted\":2,\"tokens_evaluated\":5}\n\n"
		  "data: {\"index\":0,\"content\":\"\",\"tokens\":[],\"id_slot\":0,\"stop\":true,\"model\":\"m\","
		  "\"tokens_predicted\":2,\"tokens_evaluated\":5,\"prompt\":\"\",\"has_new_line\":false,"
		  "\"truncated\":false,\"stop_type\":\"limit\",\"stopping_word\":\"\",\"tokens_cached\":7,"
		  "\"timings\":{\"cache_n\":0,\"prompt_n\":5,\"prompt_ms\":9.008536,\"predicted_n\":2,"
		  "\"predicted_ms\":18.383409}}\n\n",
		  2, 5, 2 },
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct counted whole = count_split(cases[c].api, cases[c].stream, 0);
		assert_int_equal(whole.tokens, cases[c].tokens);
		assert_int_equal(whole.u.input_tokens, cases[c].in);
		assert_int_equal(whole.u.output_tokens, cases[c].out);
		if (cases[c].api == API_LLAMACPP) {
			assert_int_equal(whole.u.server.source, SERVER_LLAMACPP);
			assert_int_equal(whole.u.server.prefill_ns, 9008536);
			assert_int_equal(whole.u.server.decode_ns, 18383409);
		} else {
			assert_int_equal(whole.u.server.source, SERVER_NONE);
		}
		for (size_t cut = 1; cut < strlen(cases[c].stream); cut++) {
			struct counted part = count_split(cases[c].api, cases[c].stream, cut);
			assert_int_equal(part.tokens, whole.tokens);
			assert_int_equal(part.u.input_tokens, whole.u.input_tokens);
			assert_int_equal(part.u.output_tokens, whole.u.output_tokens);
			timing_eq(&part.u.server, &whole.u.server);
		}
	}
}

static struct usage feed_split(enum api_kind api, enum framer_kind kind, const char *stream, size_t cut)
{
	struct framer fr;
	struct fed f = { api, USAGE_UNKNOWN };
	size_t n = strlen(stream);
	framer_init(&fr, kind, 1 << 16, on_event, &f);
	if (cut == 0) {
		framer_feed(&fr, stream, n);
	} else {
		framer_feed(&fr, stream, cut);
		framer_feed(&fr, stream + cut, n - cut);
	}
	framer_finish(&fr);
	framer_free(&fr);
	return f.u;
}

static void test_split_at_every_byte(void **state)
{
	(void)state;
	static const struct {
		enum api_kind api;
		enum framer_kind kind;
		const char *stream;
		enum server_source src;
	} cases[] = {
		{ API_LLAMACPP, FRAMER_SSE,
		  "data: {\"content\":\"a\",\"stop\":false}\n\n"
		  "data: {\"content\":\"\",\"stop\":true,\"timings\":{\"prompt_n\":3,\"prompt_ms\":12.345,"
		  "\"predicted_n\":2,\"predicted_ms\":6.5}}\n\n",
		  SERVER_LLAMACPP },
		{ API_OLLAMA_GENERATE, FRAMER_NDJSON,
		  "{\"response\":\"a\",\"done\":false}\n"
		  "{\"response\":\"\",\"done\":true,\"load_duration\":1000,\"prompt_eval_count\":2,"
		  "\"prompt_eval_duration\":2000,\"eval_count\":1,\"eval_duration\":3000}\n",
		  SERVER_OLLAMA },
		{ API_OPENAI_CHAT, FRAMER_SSE,
		  "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"
		  "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1},\"metrics\":{\"queue_time_ms\":1.25,"
		  "\"time_to_first_token_ms\":2.5,\"generation_time_ms\":3.75}}\n\ndata: [DONE]\n\n",
		  SERVER_VLLM },
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct usage whole = feed_split(cases[c].api, cases[c].kind, cases[c].stream, 0);
		assert_int_equal(whole.server.source, cases[c].src);
		assert_true(whole.server.prefill_ns > 0);
		for (size_t cut = 1; cut < strlen(cases[c].stream); cut++) {
			struct usage part = feed_split(cases[c].api, cases[c].kind, cases[c].stream, cut);
			timing_eq(&whole.server, &part.server);
		}
	}
}

/* ---- TGI headers, through the response parser ---------------------------- */

static void on_complete(void *arg, bool keep_alive)
{
	(void)arg;
	(void)keep_alive;
}
static const struct respparse_hooks hooks = { ignore_head, ignore_body, on_complete, NULL };

/* The response fed in pieces of `step` bytes; its parsed server timing. */
static struct server_timing parse_head(const char *resp, size_t step)
{
	struct respparse rp;
	size_t n = strlen(resp), off = 0;
	respparse_init(&rp, &hooks, NULL);
	while (off < n && !rp.done) {
		size_t len = step && step < n - off ? step : n - off, used = 0;
		enum respparse_status st = respparse_feed(&rp, resp + off, len, &used);
		assert_true(st == RESPPARSE_MORE || st == RESPPARSE_DONE);
		size_t taken = 0;
		while (respparse_take(&rp, &taken) == RESPPARSE_MORE && taken)
			;
		off += len;
	}
	struct server_timing t = rp.server;
	respparse_finish(&rp);
	return t;
}

static void test_tgi_headers(void **state)
{
	(void)state;
	const char *resp =
		"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-compute-type: gpu+optimized\r\n"
		"x-compute-time: 1.25\r\nX-Total-Time: 1250\r\nx-validation-time: 2\r\n"
		"x-queue-time: 17\r\nx-inference-time: 1231\r\nx-time-per-token: 38\r\n"
		"x-prompt-tokens: 9\r\nx-generated-tokens: 32\r\ncontent-length: 2\r\n\r\n{}";
	struct server_timing whole = parse_head(resp, 0);
	assert_int_equal(whole.source, SERVER_TGI);
	assert_int_equal(whole.queue_ns, 17000000);
	assert_int_equal(whole.validation_ns, 2000000);
	assert_int_equal(whole.inference_ns, 1231000000);
	assert_int_equal(whole.prefill_ns, -1); /* TGI does not split it from decode */
	for (size_t step = 1; step < 40; step++) {
		struct server_timing part = parse_head(resp, step);
		timing_eq(&whole, &part);
	}
	/* absent: a streamed head */
	struct server_timing none = parse_head(
		"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
		"x-compute-type: gpu\r\ncontent-length: 0\r\n\r\n",
		0);
	assert_int_equal(none.source, SERVER_NONE);
	assert_int_equal(none.queue_ns, -1);
	/* malformed: a fraction, a sign, empty, letters; blanks are fine */
	struct server_timing bad = parse_head(
		"HTTP/1.1 200 OK\r\nx-queue-time: 1.5\r\nx-inference-time: -3\r\n"
		"x-validation-time: \r\nX-Queue-Time: 1x\r\ncontent-length: 0\r\n\r\n",
		0);
	assert_int_equal(bad.source, SERVER_NONE);
	struct usage u = USAGE_UNKNOWN;
	classify_header("X-QUEUE-TIME", 12, " 5 ", 3, &u.server);
	assert_int_equal(u.server.queue_ns, 5000000);
	classify_header("x-queue-time", 12, "99999999999999999999", 20, &u.server);
	assert_int_equal(u.server.queue_ns, 5000000); /* too large: left as it was */
}

/* ---- the decomposition ------------------------------------------------------ */

static void test_decomposition(void **state)
{
	(void)state;
	struct req_record r;
	double m[RM__COUNT];
	const uint64_t ms = 1000000;

	memset(&r, 0, sizeof(r));
	r.usage = USAGE_UNKNOWN;
	r.at[TL_ARRIVE] = 1000 * ms;
	r.at[TL_REQ_HEADERS] = 1001 * ms;
	r.at[TL_DISPATCH] = 1003 * ms;
	r.at[TL_UP_CONNECTED] = 1004 * ms;
	r.at[TL_REQ_SENT] = 1006 * ms;
	r.at[TL_RESP_HEADERS] = 1010 * ms;
	r.at[TL_FIRST_TOKEN] = 1100 * ms;
	r.at[TL_LAST_TOKEN] = 1200 * ms;
	r.at[TL_RESP_END] = 1201 * ms;

	/* the server said nothing: tokentap's phases only */
	record_derive(&r, m);
	assert_true(fabs(m[RM_QUEUE] - 2) < 1e-9);
	assert_true(fabs(m[RM_CONNECT] - 1) < 1e-9);
	assert_true(fabs(m[RM_UPLOAD] - 2) < 1e-9);
	assert_true(isnan(m[RM_SERVER_QUEUE]) && isnan(m[RM_SERVER_PREFILL]) && isnan(m[RM_UNATTRIBUTED]));

	/* streamed: the remainder is what is left of request-sent to first
	 * token after the server's queue, load and prefill */
	r.usage.server.source = SERVER_VLLM;
	r.usage.server.queue_ns = 30 * (int64_t)ms;
	r.usage.server.prefill_ns = 50 * (int64_t)ms;
	r.usage.server.decode_ns = 99 * (int64_t)ms; /* after the first token: not in it */
	record_derive(&r, m);
	assert_true(fabs(m[RM_SERVER_QUEUE] - 30) < 1e-9);
	assert_true(fabs(m[RM_SERVER_PREFILL] - 50) < 1e-9);
	assert_true(fabs(m[RM_UNATTRIBUTED] - 14) < 1e-9);
	/* the phases add up to the ttft */
	double head = (double)(r.at[TL_REQ_HEADERS] - r.at[TL_ARRIVE]) / 1e6;
	assert_true(fabs(head + m[RM_QUEUE] + m[RM_CONNECT] + m[RM_UPLOAD] + m[RM_SERVER_QUEUE] + m[RM_SERVER_PREFILL] +
			 m[RM_UNATTRIBUTED] - m[RM_TTFT]) < 1e-9);

	/* non-streamed (TGI): request sent to the response's end, less
	 * validation, queue and inference */
	r.at[TL_FIRST_TOKEN] = r.at[TL_LAST_TOKEN] = 0;
	r.usage.server = SERVER_TIMING_UNKNOWN;
	r.usage.server.source = SERVER_TGI;
	r.usage.server.validation_ns = 2 * (int64_t)ms;
	r.usage.server.queue_ns = 17 * (int64_t)ms;
	r.usage.server.inference_ns = 170 * (int64_t)ms;
	record_derive(&r, m);
	assert_true(fabs(m[RM_SERVER_INFERENCE] - 170) < 1e-9);
	assert_true(fabs(m[RM_UNATTRIBUTED] - (195 - 189)) < 1e-9);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_event_timings),	    cmocka_unit_test(test_body_timings),
		cmocka_unit_test(test_split_at_every_byte), cmocka_unit_test(test_native_streams_split),
		cmocka_unit_test(test_tgi_headers),	    cmocka_unit_test(test_decomposition),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
