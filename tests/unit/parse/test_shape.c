/*
 * test_shape.c — same-shape events (framer.h, classify.c "Same-shape
 * events"): a stream framed and classified with the shape armed gives the
 * same events, token kinds, usage and hint as the line-by-line framer and
 * classify_event() on every event, for recorded streams of chat
 * completions, the Responses API and Anthropic's Messages API, whole, cut
 * at every byte and fed a byte at a time, under several event size bounds.
 * The streams hold what must not be taken as the shape: text that is a key
 * name, or ends in an escaped '"' and a key name (`\"content`, which makes
 * a quoted key of the text's closing quote), empty text, a usage chunk,
 * CRLF line ends, a sequence number that grows a digit; and what may:
 * escapes, escaped quotes and backslashes anywhere (`\\"`, `\\\\` at
 * the end, one that escapes the string's end), long text, UTF-8.
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

#include "bytes.h"

#include "classify.h"
#include "framer.h"

#define MAX_EVENTS 128

struct run {
	enum api_kind api;
	bool shaped; /* classify_event_shaped, else classify_event on every event */
	struct framer f;
	int n, same;
	char *name[MAX_EVENTS];
	char *data[MAX_EVENTS];
	size_t data_len[MAX_EVENTS];
	enum token_kind token[MAX_EVENTS];
	struct usage usage;
	struct classify_hint hint;
};

static void on_event(void *arg, const struct framer_event *ev)
{
	struct run *r = arg;
	assert_true(r->n < MAX_EVENTS);
	r->name[r->n] = ev->name ? dup_bytes(ev->name, ev->name_len) : NULL;
	r->data[r->n] = dup_bytes(ev->data, ev->data_len);
	r->data_len[r->n] = ev->data_len;
	r->same += ev->same_shape;
	r->token[r->n] = r->shaped ? classify_event_shaped(r->api, &r->f, ev, &r->usage, &r->hint)
				   : classify_event(r->api, ev, &r->usage, &r->hint);
	r->n++;
}

/* Frames `s` in slices of `step` bytes (0: cut once at `cut`). */
static void run_stream(struct run *r, enum api_kind api, bool shaped, size_t max_event, const char *s, size_t len,
		       size_t cut, size_t step)
{
	memset(r, 0, sizeof(*r));
	r->api = api;
	r->shaped = shaped;
	r->usage = USAGE_UNKNOWN;
	framer_init(&r->f, FRAMER_SSE, max_event, on_event, r);
	if (step) {
		for (size_t i = 0; i < len; i += step)
			framer_feed(&r->f, s + i, len - i < step ? len - i : step);
	} else {
		framer_feed(&r->f, s, cut);
		framer_feed(&r->f, s + cut, len - cut);
	}
	framer_finish(&r->f);
	framer_free(&r->f);
}

static void run_free(struct run *r)
{
	for (int i = 0; i < r->n; i++) {
		free(r->name[i]);
		free(r->data[i]);
	}
}

static void assert_same(const struct run *a, const struct run *b)
{
	assert_int_equal(a->n, b->n);
	for (int i = 0; i < a->n; i++) {
		assert_copies_equal(a->name[i], b->name[i], a->data[i], a->data_len[i], b->data[i], b->data_len[i]);
		assert_int_equal(a->token[i], b->token[i]);
	}
	assert_memory_equal(&a->usage, &b->usage, sizeof(a->usage));
	assert_int_equal(a->hint.rule, b->hint.rule);
	assert_int_equal(a->hint.at, b->hint.at);
}

/* The shaped run equals the byte-at-a-time reference run for every cut,
 * and, whole, it took `min_same` events as the shape's (counted by hand:
 * an event that breaks the shape and cannot be armed itself leaves the
 * shape armed unless it changed the usage, so the event after it matches;
 * one that can be armed re-arms it, and only the events after it match). */
static void check_stream(enum api_kind api, const char *s, int min_same)
{
	static const size_t bounds[] = { 0, 64, 150, 200, 236, 260 };
	size_t len = strlen(s);
	for (size_t b = 0; b < sizeof(bounds) / sizeof(bounds[0]); b++) {
		struct run ref, got;
		run_stream(&ref, api, false, bounds[b], s, len, 0, 1);
		run_stream(&got, api, true, bounds[b], s, len, len, 0);
		assert_same(&ref, &got);
		if (bounds[b] == 0)
			assert_int_equal(got.same, min_same);
		run_free(&got);
		for (size_t cut = 0; cut <= len; cut++) {
			run_stream(&got, api, true, bounds[b], s, len, cut, 0);
			assert_same(&ref, &got);
			run_free(&got);
		}
		run_stream(&got, api, true, bounds[b], s, len, 0, 1);
		assert_same(&ref, &got);
		run_free(&got);
		run_stream(&got, api, true, bounds[b], s, len, 0, 7);
		assert_same(&ref, &got);
		run_free(&got);
		run_free(&ref);
	}
}

#define CHAT_HEAD "data: {\"id\":\"chatcmpl-7e6e\",\"object\":\"chat.completion.chunk\",\"created\":1716882813,"
#define CHAT(text) \
	CHAT_HEAD "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" text \
		  "\"},\"logprobs\":null," \
		  "\"finish_reason\":null}]}\n\n"

static void test_chat(void **state)
{
	(void)state;
	check_stream(API_OPENAI_CHAT,
		     CHAT_HEAD "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
			       "\"logprobs\":null,\"finish_reason\":null}]}\n\n" CHAT(" the") CHAT(" event") CHAT(" byte")
				       CHAT("usage") CHAT(" fast") CHAT("") CHAT(" a") CHAT("timings") CHAT(" \\\"q\\\"")
					       CHAT(" b{\\n") CHAT(" caf\xc3\xa9") CHAT(" :") CHAT("the") CHAT(" c")
						       CHAT_HEAD
		     "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" d\"},\"logprobs\":null,"
		     "\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9}}\n\n" CHAT(" e")
			     CHAT(" f") ": keep-alive\n\n" CHAT(" g") CHAT(" h")
		     "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\" i\"}}],\"timings\":{\"predicted_n\":4}}\n\n"
			     CHAT(" j") CHAT(" k") "data: " CHAT_HEAD "\r\n\r\n" CHAT(" l") CHAT(" m")
		     "data: {\"id\":\"chatcmpl-7e6e\",\"object\":\"chat.completion.chunk\",\"created\":1716882813,"
		     "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" n\"},\"logprobs\":null,"
		     "\"finish_reason\":null}]}\r\n\r\n" CHAT(" o") CHAT(" p") CHAT(" q") CHAT(" incomprehensibilities") CHAT("a.b") CHAT("abcdefgh")
				     CHAT("abcdefgh.") CHAT(" r") CHAT("abcdefg\xc3") CHAT(" x\\") CHAT(" s") CHAT(" y\\\\")
					     CHAT("\\u00e9") CHAT("\\n") CHAT(" t") "data: [DONE]\n\n",
		     27);
}

/* Between events of the shape, a token event that cannot be armed (a
 * text that is a key name) and leaves the hint as it was keeps the shape
 * armed; one
 * that leaves another hint (a reasoning key, further on) clears it, and
 * the event after it re-arms it. */
static void test_chat_kept_past_unarmed(void **state)
{
	(void)state;
	check_stream(API_OPENAI_CHAT,
		     CHAT(" a") CHAT(" b") CHAT("q") CHAT(" b2") CHAT_HEAD
		     "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":null,\"reasoning_content\":\" "
		     "\\\"r\\\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n" CHAT(" c")
			     CHAT(" d") "data: [DONE]\n\n",
		     3);
}

/* Escapes in the text, escaped quotes among them: the string hole goes on
 * to the first '"' no backslash escapes, wherever a read cuts it. A text
 * whose bytes after its last escaped '"' are a key name is turned away:
 * `\"content` and the string's closing quote make the key "content" (and
 * `\"timings`, which the usage search notes wherever it is). */
static void test_chat_escapes(void **state)
{
	(void)state;
	check_stream(API_OPENAI_CHAT,
		     CHAT(" a") CHAT(" \\\"q\\\"") CHAT("\\\"") CHAT(" \\\\\\\"") CHAT(" y\\\\\\\\") CHAT("\\\\\\\\")
			     CHAT("\\\"\\\\") CHAT("\\\"content") CHAT(" b") CHAT("\\\"timings") CHAT(" c")
				     CHAT("\\\"usage\\\": {") CHAT("\\\"a b") CHAT("x\\\"text")
					     CHAT(" \\\"\\u00e9\\\"\\t") CHAT(" d") "data: [DONE]\n\n",
		     12);
}

#define RESP(seq, text) \
	"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":" seq \
	",\"item_id\":\"msg_256e\",\"output_index\":0,\"content_index\":0,\"delta\":\"" text "\",\"logprobs\":[]}\n\n"

static void test_responses(void **state)
{
	(void)state;
	check_stream(API_OPENAI_RESPONSES,
		     "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":"
		     "{\"id\":\"resp_2\",\"status\":\"in_progress\",\"usage\":null}}\n\n" RESP("4", "time")
			     RESP("5", " number") RESP("6", " fast") RESP("7", "delta") RESP("8", " of") RESP("9", " caf")
				     RESP("10", " to") RESP("11", " a") RESP("12", "") RESP("13", " \\\\") RESP("14", " b")
		     "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":"
		     "15,\"delta\":\" short\"}\n\n" RESP("16", " c") RESP("17", " d")
		     "event: response.reasoning_text.delta\ndata: {\"type\":\"response.reasoning_text.delta\","
		     "\"sequence_number\":18,\"delta\":\" think\"}\n\n" RESP("19", " e") RESP("20", " f")
		     "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":21,"
		     "\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":5,\"output_tokens\":17}}}\n\n",
		     8);
}

#define ANT(text) \
	"event: content_block_delta\ndata: " \
	"{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\"," \
	"\"text\":\"" text "\"}}\n\n"

static void test_anthropic(void **state)
{
	(void)state;
	check_stream(API_ANTHROPIC,
		     "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"usage\":"
		     "{\"input_tokens\":1,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":"
		     "\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
		     "event: ping\ndata: {\"type\": \"ping\"}\n\n" ANT("is") ANT(" and") ANT(" word") ANT("text")
			     ANT(" light") ANT("") ANT(" x") ANT(" \\u00e9") ANT(" y") ANT(" z")
		     "event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
		     "\"text_delta\",\"text\":\" w\"}}\r\n\r\n" ANT(" v") ANT(" u")
		     "event:content_block_delta\ndata:{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
		     "\"text_delta\",\"text\":\" t\"}}\n\n" ANT(" s")
		     "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
		     "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},"
		     "\"usage\":{\"output_tokens\":12}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		     8);
}

/* Why `\"timings` at a text's end is turned away: the usage search notes
 * a "timings" hit wherever it is, and then reads the chunk's members, here
 * vLLM's "metrics", which the chunks before it never had read. */
#define CHATM(text) \
	CHAT_HEAD "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" text \
		  "\"},\"finish_reason\":null}],\"metrics\":{\"queue_time_ms\":3}}\n\n"

static void test_chat_escaped_key_read(void **state)
{
	(void)state;
	check_stream(API_OPENAI_CHAT, CHATM(" a") CHATM(" b") CHATM("\\\"timings") CHATM(" c") CHATM(" d"), 2);
}

/* The same for the Anthropic and Responses API deltas: "text" and
 * "delta" after an escaped quote are their keys. */
static void test_escapes_named(void **state)
{
	(void)state;
	check_stream(API_ANTHROPIC,
		     ANT(" a") ANT(" \\\"q\\\"") ANT("\\\"text") ANT(" b\\\\\\\\") ANT("\\\"content") ANT(" \\\\\\\"")
			     ANT("x") "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
		     3);
	check_stream(API_OPENAI_RESPONSES,
		     RESP("4", " a") RESP("5", "\\\"b\\\"") RESP("6", "\\\"delta") RESP("7", " c\\\\\\\\")
			     RESP("8", "\\\"") RESP("9", "\\\"sequence_number") RESP("10", " d") RESP("11", " e"),
		     4);
}

/* Arming checks its holes: none outside the data, none of a wrong kind,
 * none outside the callback. */
static struct framer_hole arm_holes[2];
static size_t arm_n;
static bool arm_ok;

static void on_arm(void *arg, const struct framer_event *ev)
{
	(void)ev;
	arm_ok = framer_shape_arm(arg, arm_holes, arm_n, 1);
}

static void test_arm_bounds(void **state)
{
	(void)state;
	static const char ev[] = "data: {\"n\":12,\"k\":\"ab\",\"t\":\"a b\"}\n\n";
	struct framer f;
	const struct {
		struct framer_hole h[2];
		size_t n;
		bool ok;
	} cases[] = {
		{ { { 22, 3, FRAMER_HOLE_STRING } }, 1, true },
		{ { { 22, 2, FRAMER_HOLE_STRING } }, 1, false }, /* not followed by '"' */
		{ { { 13, 2, FRAMER_HOLE_STRING } }, 1, false }, /* "ab": a key name's bytes only */
		{ { { 5, 2, FRAMER_HOLE_DIGITS } }, 1, true },
		{ { { 4, 3, FRAMER_HOLE_DIGITS } }, 1, false },
		{ { { 5, 9, FRAMER_HOLE_DIGITS } }, 1, false },
		{ { { 22, 3, FRAMER_HOLE_STRING }, { 5, 2, FRAMER_HOLE_DIGITS } }, 2, false }, /* out of order */
		{ { { 5, 2, FRAMER_HOLE_DIGITS }, { 22, 3, FRAMER_HOLE_STRING } }, 2, true },
		{ { { 22, 3, FRAMER_HOLE_STRING }, { 26, 0, FRAMER_HOLE_DIGITS } },
		  2,
		  false }, /* a string hole is last */
		{ { { 22, 3, 9 } }, 1, false },
		{ { { 0, 0, 0 } }, 0, false },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(arm_holes, cases[i].h, sizeof(arm_holes));
		arm_n = cases[i].n;
		arm_ok = !cases[i].ok;
		framer_init(&f, FRAMER_SSE, 0, on_arm, &f);
		framer_feed(&f, ev, sizeof(ev) - 1);
		assert_int_equal(arm_ok, cases[i].ok);
		framer_free(&f);
	}
	framer_init(&f, FRAMER_SSE, 0, NULL, NULL);
	assert_false(framer_shape_arm(&f, arm_holes, 1, 1)); /* no event being delivered */
	framer_free(&f);
}

/* A string hole may hold escaped quotes, but not end in one and a key
 * name's bytes, nor in a backslash that escapes its closing quote. */
static void test_arm_escapes(void **state)
{
	(void)state;
	static const char ev[] = "data: {\"a\":\"\\\"k\",\"b\":\"\\\" k\",\"c\":\"q\\\"\"}\n\n";
	const struct {
		struct framer_hole h;
		bool ok;
	} cases[] = {
		{ { 6, 3, FRAMER_HOLE_STRING }, false },  /* \"k: the key "k" */
		{ { 16, 4, FRAMER_HOLE_STRING }, true },  /* \" k */
		{ { 27, 3, FRAMER_HOLE_STRING }, true },  /* q\" */
		{ { 27, 2, FRAMER_HOLE_STRING }, false }, /* q\ and an escaped '"' */
		{ { 16, 3, FRAMER_HOLE_STRING }, false }, /* not followed by '"' */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct framer f;
		arm_holes[0] = cases[i].h;
		arm_n = 1;
		arm_ok = !cases[i].ok;
		framer_init(&f, FRAMER_SSE, 0, on_arm, &f);
		framer_feed(&f, ev, sizeof(ev) - 1);
		assert_int_equal(arm_ok, cases[i].ok);
		framer_free(&f);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chat),
		cmocka_unit_test(test_chat_kept_past_unarmed),
		cmocka_unit_test(test_chat_escapes),
		cmocka_unit_test(test_escapes_named),
		cmocka_unit_test(test_chat_escaped_key_read),
		cmocka_unit_test(test_responses),
		cmocka_unit_test(test_anthropic),
		cmocka_unit_test(test_arm_bounds),
		cmocka_unit_test(test_arm_escapes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
