/*
 * classify_bench.c — what the cheap byte scan saves over parsing each event.
 *
 * Builds a realistic vLLM-style OpenAI chat stream (role-only chunk, a few
 * hundred content chunks, finish chunk, usage chunk, [DONE]), frames it once,
 * then times over the same events:
 *   - classify_event() with a per-stream hint, as the proxy calls it, and
 *     without one (every event searched from its start);
 *   - a full jansson parse of each event plus the lookup of
 *     choices[0].delta.content, the obvious alternative.
 * Prints ns/event for both. Then the same classify_event() timing over an
 * OpenAI Responses stream (event: names, lifecycle events around the
 * output_text deltas, usage in response.completed), and over three more
 * chat streams of the same length: reasoning deltas as vLLM sends them
 * ({"reasoning_content":..} alone in the delta), reasoning deltas as SGLang
 * sends them (content and tool_calls null beside the reasoning), and answer
 * text as llama.cpp sends it with timings_per_token (a "timings" object in
 * every chunk). Not a test: run it by hand.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "classify.h"
#include "framer.h"

#define MAX_EVENTS 1024
#define CONTENT_CHUNKS 500

struct events {
	int n;
	char *data[MAX_EVENTS];
	size_t len[MAX_EVENTS];
	char *name[MAX_EVENTS]; /* NULL when the event had none */
	size_t name_len[MAX_EVENTS];
};

static void on_event(void *arg, const struct framer_event *ev)
{
	struct events *e = arg;
	if (e->n == MAX_EVENTS)
		return;
	e->data[e->n] = malloc(ev->data_len + 1);
	memcpy(e->data[e->n], ev->data, ev->data_len);
	e->data[e->n][ev->data_len] = '\0';
	e->len[e->n] = ev->data_len;
	e->name[e->n] = NULL;
	e->name_len[e->n] = ev->name_len;
	if (ev->name) {
		e->name[e->n] = malloc(ev->name_len + 1);
		memcpy(e->name[e->n], ev->name, ev->name_len);
	}
	e->n++;
}

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Every event of `stream`, framed in one piece. */
static void frame_all(const char *stream, size_t len, struct events *ev)
{
	struct framer f;

	framer_init(&f, FRAMER_SSE, 0, on_event, ev);
	framer_feed(&f, stream, len);
	framer_finish(&f);
	framer_free(&f);
}

static void events_free(struct events *ev)
{
	for (int i = 0; i < ev->n; i++) {
		free(ev->data[i]);
		free(ev->name[i]);
	}
}

/* classify_event() over every event of one stream, `rounds` times: with a
 * per-stream hint (a fresh one each round, as the proxy has per response)
 * and then without one. */
struct timing {
	double ns[2];	/* per event: [0] with the hint, [1] without */
	long kinds[2];	/* the kinds returned, summed: equal when both agree event by event */
	long tokens[2]; /* events of any token kind */
	long want;	/* with the hint, events of the kind `want` */
};

static void time_classify(enum api_kind api, const struct events *ev, enum token_kind want, int rounds, struct usage *u,
			  struct timing *t)
{
	*t = (struct timing){ 0 };
	for (int h = 0; h < 2; h++) {
		double t0 = now_ns();
		for (int r = 0; r < rounds; r++) {
			struct classify_hint hint = { 0 };
			for (int i = 0; i < ev->n; i++) {
				struct framer_event fe = { .name = ev->name[i],
							   .name_len = ev->name_len[i],
							   .data = ev->data[i],
							   .data_len = ev->len[i] };
				enum token_kind k = classify_event(api, &fe, u, h ? NULL : &hint);
				t->kinds[h] += k;
				t->tokens[h] += k != TOKEN_NONE;
				t->want += !h && k == want;
			}
		}
		t->ns[h] = (now_ns() - t0) / ((double)rounds * ev->n);
	}
}

static char *build_stream(size_t *out_len)
{
	static const char *words[] = { " The", " quick", " brown",	  " fox",     " jumps", " over",
				       " the", " lazy",	 " dog",	  ".",	      "\\n",	" It",
				       "'s",   " a",	 " \\\"test\\\"", " sentence" };
	static const char head[] =
		"data: {\"id\":\"chatcmpl-5b1c2f0e8a9d4e7fb0c1d2e3f4a5b6c7\",\"object\":\"chat.completion.chunk\","
		"\"created\":1718000000,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[{\"index\":0,";
	size_t cap = 1 << 20, n = 0;
	char *s = malloc(cap);
	n += (size_t)snprintf(
		s + n, cap - n,
		"%s\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
		head);
	for (int i = 0; i < CONTENT_CHUNKS; i++)
		n += (size_t)snprintf(
			s + n, cap - n,
			"%s\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", head,
			words[i % (int)(sizeof(words) / sizeof(words[0]))]);
	n += (size_t)snprintf(s + n, cap - n,
			      "%s\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\",\"stop_reason\":null}]}\n\n",
			      head);
	n += (size_t)snprintf(
		s + n, cap - n,
		"data: {\"id\":\"chatcmpl-5b1c2f0e8a9d4e7fb0c1d2e3f4a5b6c7\",\"object\":\"chat.completion.chunk\","
		"\"created\":1718000000,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[],"
		"\"usage\":{\"prompt_tokens\":412,\"total_tokens\":912,\"completion_tokens\":500}}\n\n");
	n += (size_t)snprintf(s + n, cap - n, "data: [DONE]\n\n");
	*out_len = n;
	return s;
}

/* A Responses stream as the hosted API sends it, CONTENT_CHUNKS deltas. */
static char *build_responses_stream(size_t *out_len)
{
	static const char resp[] =
		"{\"id\":\"resp_68b5c2f0e8a9d4e7fb0c1d2e3f4a5b6c7\",\"object\":\"response\","
		"\"created_at\":1751642570,\"status\":\"%s\",\"model\":\"gpt-4o-2024-08-06\","
		"\"output\":[],\"usage\":%s,\"error\":null,\"incomplete_details\":null}";
	static const char item[] =
		"\"item_id\":\"msg_68b5c2f1a2b3c4d5e6f708192a3b4c5d\",\"output_index\":0,"
		"\"content_index\":0";
	size_t cap = 1 << 20, n = 0;
	int seq = 0;
	char *s = malloc(cap), obj[512];

#define EV(name, ...) \
	n += (size_t)snprintf(s + n, cap - n, "event: " name "\ndata: {\"type\":\"" name "\",\"sequence_number\":%d,", \
			      seq++); \
	n += (size_t)snprintf(s + n, cap - n, __VA_ARGS__)
	snprintf(obj, sizeof(obj), resp, "in_progress", "null");
	EV("response.created", "\"response\":%s}\n\n", obj);
	EV("response.in_progress", "\"response\":%s}\n\n", obj);
	EV("response.output_item.added",
	   "\"output_index\":0,\"item\":{\"id\":\"msg_68b5c2f1a2b3c4d5e6f708192a3b4c5d\",\"type\":\"message\","
	   "\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n");
	EV("response.content_part.added",
	   "%s,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[],\"logprobs\":[]}}\n\n", item);
	for (int i = 0; i < CONTENT_CHUNKS; i++) {
		EV("response.output_text.delta", "%s,\"delta\":\"%s\",\"logprobs\":[],\"obfuscation\":\"%.*s\"}\n\n",
		   item, i % 2 ? " word" : " \\\"quoted\\\"", 4 + i % 8, "Ab3dEf6hIj8l");
	}
	EV("response.output_text.done", "%s,\"text\":\"...\",\"logprobs\":[]}\n\n", item);
	EV("response.content_part.done",
	   "%s,\"part\":{\"type\":\"output_text\",\"text\":\"...\",\"annotations\":[]}}\n\n", item);
	EV("response.output_item.done",
	   "\"output_index\":0,\"item\":{\"id\":\"msg_68b5c2f1a2b3c4d5e6f708192a3b4c5d\",\"type\":\"message\","
	   "\"status\":\"completed\",\"role\":\"assistant\",\"content\":[]}}\n\n");
	snprintf(obj, sizeof(obj), resp, "completed",
		 "{\"input_tokens\":412,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":500,"
		 "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":912}");
	EV("response.completed", "\"response\":%s}\n\n", obj);
#undef EV
	*out_len = n;
	return s;
}

/* classify_event() over the Responses stream, with and without a hint. */
static int bench_responses(int rounds)
{
	size_t len;
	char *stream = build_responses_stream(&len);
	struct events ev = { 0 };
	struct usage u = USAGE_UNKNOWN;
	struct timing t;

	frame_all(stream, len, &ev);
	time_classify(API_OPENAI_RESPONSES, &ev, TOKEN_ANSWER, rounds, &u, &t);
	printf("responses stream: %zu bytes, %d events, tokens per round %ld, usage in=%lld out=%lld\n", len, ev.n,
	       t.tokens[0] / rounds, (long long)u.input_tokens, (long long)u.output_tokens);
	printf("classify_event responses (hint):   %8.1f ns/event\n", t.ns[0]);
	printf("classify_event responses (no hint):%8.1f ns/event\n", t.ns[1]);
	events_free(&ev);
	free(stream);
	return t.tokens[0] == t.tokens[1] && t.tokens[0] / rounds == CONTENT_CHUNKS && u.output_tokens == 500 ? 0 : 1;
}

/* A chat stream of CONTENT_CHUNKS deltas, each `delta_fmt` (one %s, the
 * text) inside the vLLM head; `tail` follows the choices array in every
 * chunk (llama.cpp's timings), then a finish chunk and [DONE]. */
static char *build_chat_stream(const char *delta_fmt, const char *tail, size_t *out_len)
{
	static const char *words[] = { " Let", " me", " think", " about", " this", ".", "\\n", " \\\"x\\\"" };
	static const char head[] =
		"data: {\"id\":\"chatcmpl-5b1c2f0e8a9d4e7fb0c1d2e3f4a5b6c7\",\"object\":\"chat.completion.chunk\","
		"\"created\":1718000000,\"model\":\"Qwen/QwQ-32B\",\"choices\":[{\"index\":0,\"delta\":";
	size_t cap = 1 << 20, n = 0;
	char *s = malloc(cap), delta[256];
	for (int i = 0; i < CONTENT_CHUNKS; i++) {
		snprintf(delta, sizeof(delta), delta_fmt, words[i % (int)(sizeof(words) / sizeof(words[0]))]);
		n += (size_t)snprintf(s + n, cap - n, "%s%s,\"logprobs\":null,\"finish_reason\":null}]%s}\n\n", head,
				      delta, tail);
	}
	n += (size_t)snprintf(s + n, cap - n, "%s{},\"logprobs\":null,\"finish_reason\":\"stop\"}]%s}\n\n", head, tail);
	n += (size_t)snprintf(s + n, cap - n, "data: [DONE]\n\n");
	*out_len = n;
	return s;
}

/* classify_event() over one chat stream, with and without a hint; the
 * kinds must agree event by event. */
static int bench_chat(const char *label, const char *delta_fmt, const char *tail, enum token_kind want, int rounds)
{
	size_t len;
	char *stream = build_chat_stream(delta_fmt, tail, &len);
	struct events ev = { 0 };
	struct usage u = USAGE_UNKNOWN;
	struct timing t;

	frame_all(stream, len, &ev);
	time_classify(API_OPENAI_CHAT, &ev, want, rounds, &u, &t);
	printf("%s: %zu bytes, %d events, %ld of the expected kind per round\n", label, len, ev.n, t.want / rounds);
	printf("classify_event %s (hint):   %8.1f ns/event\n", label, t.ns[0]);
	printf("classify_event %s (no hint):%8.1f ns/event\n", label, t.ns[1]);
	events_free(&ev);
	free(stream);
	return t.kinds[0] == t.kinds[1] && t.want / rounds == CONTENT_CHUNKS ? 0 : 1;
}

/* The alternative: parse every event and look the content up. */
static int parse_is_token(const char *data, size_t len)
{
	json_t *root = json_loadb(data, len, 0, NULL);
	if (root == NULL)
		return 0;
	json_t *c = json_object_get(json_object_get(json_array_get(json_object_get(root, "choices"), 0), "delta"),
				    "content");
	int token = json_is_string(c) && json_string_length(c) > 0;
	json_decref(root);
	return token;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 2000;
	size_t len;
	char *stream = build_stream(&len);
	struct events ev = { 0 };
	struct framer f;

	/* Framing cost on its own, fed in 4 KiB slices as a socket would. */
	double t0 = now_ns();
	for (int r = 0; r < rounds; r++) {
		struct events sink = { 0 };
		framer_init(&f, FRAMER_SSE, 0, on_event, r == 0 ? (void *)&ev : (void *)&sink);
		for (size_t at = 0; at < len; at += 4096)
			framer_feed(&f, stream + at, len - at < 4096 ? len - at : 4096);
		framer_finish(&f);
		framer_free(&f);
		for (int i = 0; i < sink.n; i++) {
			free(sink.data[i]);
			free(sink.name[i]);
		}
	}
	double frame_ns = (now_ns() - t0) / ((double)rounds * ev.n);

	struct usage u = USAGE_UNKNOWN;
	struct timing t;
	time_classify(API_OPENAI_CHAT, &ev, TOKEN_ANSWER, rounds, &u, &t);
	long tokens = t.tokens[0];

	long ptokens = 0;
	t0 = now_ns();
	for (int r = 0; r < rounds; r++)
		for (int i = 0; i < ev.n; i++)
			ptokens += parse_is_token(ev.data[i], ev.len[i]);
	double parse_ns = (now_ns() - t0) / ((double)rounds * ev.n);

	printf("stream: %zu bytes, %d events (%d content chunks), %d rounds\n", len, ev.n, CONTENT_CHUNKS, rounds);
	printf("tokens per round: scan %ld, parse %ld; usage in=%lld out=%lld\n", tokens / rounds, ptokens / rounds,
	       (long long)u.input_tokens, (long long)u.output_tokens);
	printf("framer (incl. copying events out): %8.1f ns/event\n", frame_ns);
	printf("classify_event (byte scan, hint):  %8.1f ns/event\n", t.ns[0]);
	printf("classify_event (no hint):          %8.1f ns/event\n", t.ns[1]);
	printf("jansson parse + lookup:            %8.1f ns/event\n", parse_ns);
	printf("speed-up: %.1fx\n", parse_ns / t.ns[0]);

	events_free(&ev);
	free(stream);
	int bad = bench_responses(rounds);
	bad |= bench_chat("reasoning", "{\"reasoning_content\":\"%s\"}", "", TOKEN_REASONING, rounds);
	bad |= bench_chat("reasoning-sglang",
			  "{\"role\":null,\"content\":null,\"reasoning_content\":\"%s\",\"tool_calls\":null}", "",
			  TOKEN_REASONING, rounds);
	bad |= bench_chat("timings", "{\"content\":\"%s\"}",
			  ",\"timings\":{\"prompt_n\":412,\"prompt_ms\":38.51,\"prompt_per_token_ms\":0.093,"
			  "\"prompt_per_second\":10698.5,\"predicted_n\":12,\"predicted_ms\":141.2,"
			  "\"predicted_per_token_ms\":11.77,\"predicted_per_second\":84.98}",
			  TOKEN_ANSWER, rounds);
	return !bad && tokens == t.tokens[1] && tokens / rounds == ptokens / rounds ? 0 : 1;
}
