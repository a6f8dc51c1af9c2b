/*
 * test_tokens_per_event.c — tokens per token event (record_event_tokens),
 * taken from the output count a server puts on every chunk (vLLM's
 * continuous_usage_stats), with the framer and the classifier in front as
 * the meter has them: a stream fed whole, cut once at every byte and fed a
 * byte at a time gives the same counts. The count of an event is the rise
 * since the last token event (a chunk without text that counted tokens
 * hands them to the next one); a stream whose first token event carried
 * no count is never counted (usage only at the end, TGI's count on its
 * last token, no usage at all), nor is a stream past a count that fell;
 * the request's mean (RM_TOKENS_PER_EVENT) is NaN when nothing was counted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include <cmocka.h>

#include "classify.h"
#include "framer.h"
#include "timeline.h"

#define MAX_COUNTED 64

struct run {
	struct framer f;
	struct req_record rec;
	uint64_t counted[MAX_COUNTED];
	int n;
};

/* What meter.c's on_event does with an event, less the clock. */
static void on_event(void *arg, const struct framer_event *ev)
{
	struct run *r = arg;
	uint64_t n;
	enum token_kind kind = classify_event_shaped(r->rec.api, &r->f, ev, &r->rec.usage, &r->rec.hint);

	if (kind != TOKEN_NONE)
		r->rec.token_events++;
	if (kind != TOKEN_NONE && !ev->same_shape && r->rec.tpe_on >= 0 && record_event_tokens(&r->rec, &n)) {
		assert_true(r->n < MAX_COUNTED);
		r->counted[r->n++] = n;
	}
}

/* Frames `s` in slices of `step` bytes (0: cut once at `cut`). */
static void run_stream(struct run *r, enum api_kind api, enum framer_kind fk, const char *s, size_t cut, size_t step)
{
	size_t len = strlen(s);

	memset(r, 0, sizeof(*r));
	r->rec.api = api;
	r->rec.usage = USAGE_UNKNOWN;
	framer_init(&r->f, fk, 0, on_event, r);
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

/* Every way of feeding `s` counts `want` (n of them). */
static void check_counts(enum api_kind api, enum framer_kind fk, const char *s, const uint64_t *want, int n)
{
	size_t len = strlen(s);
	struct run r;

	for (size_t cut = 0; cut <= len + 1; cut++) {
		if (cut <= len)
			run_stream(&r, api, fk, s, cut, 0);
		else
			run_stream(&r, api, fk, s, 0, 1);
		assert_int_equal(r.n, n);
		for (int i = 0; i < n; i++)
			assert_int_equal(r.counted[i], want[i]);
		uint64_t sum = 0;
		for (int i = 0; i < n; i++)
			sum += want[i];
		assert_int_equal(r.rec.tpe_events, (uint64_t)n);
		assert_int_equal(r.rec.tpe_tokens, sum);
		double m[RM__COUNT];
		record_derive(&r.rec, m);
		if (n)
			assert_true(fabs(m[RM_TOKENS_PER_EVENT] - (double)sum / n) < 1e-12);
		else
			assert_true(isnan(m[RM_TOKENS_PER_EVENT]));
	}
}

#define CHUNK(delta, fin, usage) \
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{" \
	"\"index\":0,\"delta\":" delta ",\"logprobs\":null,\"finish_reason\":" fin "}]" usage "}\n\n"
#define USAGE(n) ",\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":" #n ",\"total_tokens\":" #n "7}"

/* vLLM with continuous_usage_stats and a speculative decoder: the role
 * chunk at 0, events of 1, 3, 2 tokens, a chunk without text that counted
 * one (held back by the detokenizer) whose token the next event carries
 * with its own two (3); the finish chunk's count (the stop token) follows no token
 * event, and the usage chunk repeats it. */
static const char chat_spec[] = CHUNK("{\"role\":\"assistant\",\"content\":\"\"}", "null", USAGE(0)) CHUNK(
	"{\"content\":\"Hello\"}", "null", USAGE(1)) CHUNK("{\"content\":\" big wide\"}", "null", USAGE(4))
	CHUNK("{\"content\":\" world\"}", "null", USAGE(6)) CHUNK("{\"content\":\"\"}", "null", USAGE(7))
		CHUNK("{\"content\":\" again\"}", "null", USAGE(9)) CHUNK("{}", "\"stop\"", USAGE(10))
			"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
			"\"choices\":[]" USAGE(10) "}\n\n"
			"data: [DONE]\n\n";

static void test_chat_continuous_usage(void **state)
{
	static const uint64_t want[] = { 1, 3, 2, 3 };
	(void)state;
	check_counts(API_OPENAI_CHAT, FRAMER_SSE, chat_spec, want, 4);
}

/* The same stream as completions chunks. */
#define CCHUNK(text, usage) \
	"data: {\"id\":\"x\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\",\"choices\":[{" \
	"\"index\":0,\"text\":" text ",\"logprobs\":null,\"finish_reason\":null}]" usage "}\n\n"
static const char completions_spec[] =
	CCHUNK("\"a\"", USAGE(2)) CCHUNK("\" b\"", USAGE(3)) CCHUNK("\" c d\"", USAGE(7)) "data: [DONE]\n\n";

static void test_completions_continuous_usage(void **state)
{
	static const uint64_t want[] = { 2, 1, 4 };
	(void)state;
	check_counts(API_OPENAI_COMPLETIONS, FRAMER_SSE, completions_spec, want, 3);
}

/* One token per event, many events of one shape but for the count: every
 * event is counted, 1 each. */
static const char chat_ones[] = CHUNK("{\"content\":\"a\"}", "null", USAGE(1))
	CHUNK("{\"content\":\"b\"}", "null", USAGE(2)) CHUNK("{\"content\":\"c\"}", "null", USAGE(3))
		CHUNK("{\"content\":\"d\"}", "null", USAGE(4)) "data: [DONE]\n\n";

static void test_one_token_each(void **state)
{
	static const uint64_t want[] = { 1, 1, 1, 1 };
	(void)state;
	check_counts(API_OPENAI_CHAT, FRAMER_SSE, chat_ones, want, 4);
}

/* include_usage only: the count comes once, after the last token event;
 * and a server that puts it on its last token event: neither counted. */
static const char chat_final_usage[] = CHUNK("{\"content\":\"a\"}", "null", "")
	CHUNK("{\"content\":\"b\"}", "null", "") CHUNK("{}", "\"stop\"", "")
		"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
		"\"choices\":[]" USAGE(3) "}\n\n"
		"data: [DONE]\n\n";
static const char chat_usage_on_last[] = CHUNK("{\"content\":\"a\"}", "null", "")
	CHUNK("{\"content\":\"b\"}", "null", "") CHUNK("{\"content\":\"c\"}", "\"stop\"", USAGE(3)) "data: [DONE]\n\n";

static void test_usage_not_on_every_event(void **state)
{
	struct run r;
	(void)state;
	check_counts(API_OPENAI_CHAT, FRAMER_SSE, chat_final_usage, NULL, 0);
	check_counts(API_OPENAI_CHAT, FRAMER_SSE, chat_usage_on_last, NULL, 0);
	run_stream(&r, API_OPENAI_CHAT, FRAMER_SSE, chat_final_usage, 0, 0);
	assert_int_equal(r.rec.tpe_on, -1);
	assert_int_equal(r.rec.token_events, 2);
	assert_int_equal(r.rec.usage.output_tokens, 3);
}

/* TGI's stream names its count on the last token only, and other APIs
 * are not read at all, even where a count rides on every event. */
static const char tgi_stream[] =
	"data: {\"index\":1,\"token\":{\"id\":1,\"text\":\"a\",\"logprob\":0,\"special\":false},"
	"\"generated_text\":null,\"details\":null}\n\n"
	"data: {\"index\":2,\"token\":{\"id\":2,\"text\":\"b\",\"logprob\":0,\"special\":false},"
	"\"generated_text\":\"ab\",\"details\":{\"finish_reason\":\"length\",\"generated_tokens\":2}}\n\n";

static void test_other_apis_not_counted(void **state)
{
	(void)state;
	check_counts(API_TGI, FRAMER_SSE, tgi_stream, NULL, 0);
	check_counts(API_OPENAI_RESPONSES, FRAMER_SSE, chat_spec, NULL, 0);
}

/* A count that falls stops the counting; what was counted stays. */
static const char chat_falls[] =
	CHUNK("{\"content\":\"a\"}", "null", USAGE(2)) CHUNK("{\"content\":\"b\"}", "null", USAGE(1))
		CHUNK("{\"content\":\"c\"}", "null", USAGE(5)) "data: [DONE]\n\n";

static void test_count_that_falls(void **state)
{
	static const uint64_t want[] = { 2 };
	(void)state;
	check_counts(API_OPENAI_CHAT, FRAMER_SSE, chat_falls, want, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chat_continuous_usage),  cmocka_unit_test(test_completions_continuous_usage),
		cmocka_unit_test(test_one_token_each),	       cmocka_unit_test(test_usage_not_on_every_event),
		cmocka_unit_test(test_other_apis_not_counted), cmocka_unit_test(test_count_that_falls),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
