/*
 * fuzz_framer.c — libFuzzer target: the SSE / NDJSON / JSON-array framer
 * and the token classifier, on bytes cut at points the fuzzer chooses.
 *
 * Input layout: byte 0 picks the framer kind (bit 0: SSE or NDJSON; bit 4
 * set: the JSON array, Gemini's stream, whatever bit 0 says) and the
 * event size bound (bits 1-3: 16 B .. 2 KiB, or the 1 MiB default, so that
 * oversized events are reached); bytes 1-8 are piece lengths, used in turn
 * to cut the rest (0 means 1 byte). The rest is the response body.
 * A JSON-array element has no name and is not empty, and starts with no
 * blank, ',' or ']'.
 *
 * Checked: the body framed in one piece and in pieces gives the same events
 * (names and data, byte for byte), the same counters and the same
 * classification for every API; classifying with a per-stream hint (started
 * at a place the input picks) answers exactly as without one, event by
 * event, usage included; `events` equals the number of callbacks; no
 * event is larger than the bound; NDJSON events have no name and no line
 * end; SSE data holds no CR. ASan/UBSan catch the rest.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "classify.h"
#include "framer.h"
#include "fuzz_check.h"
#include "fuzz_feed.h"

#define NSPLIT 8
#define MAX_EVENTS 4096

static const enum api_kind apis[] = { API_UNKNOWN,	   API_OPENAI_CHAT, API_OPENAI_COMPLETIONS,
				      API_ANTHROPIC,	   API_TGI,	    API_LLAMACPP,
				      API_OLLAMA_GENERATE, API_OLLAMA_CHAT, API_OPENAI_RESPONSES,
				      API_GEMINI_STREAM };
#define NAPI (sizeof(apis) / sizeof(apis[0]))

/* What one run saw: a digest of every event, in order. */
struct run {
	enum framer_kind kind;
	size_t max_event;
	uint64_t callbacks;
	size_t n;
	uint64_t digest[MAX_EVENTS]; /* hash of (name, data) */
	uint32_t tokens[MAX_EVENTS]; /* bits 2i, 2i+1: the token kind for apis[i] */
	struct usage usage[NAPI];
	struct usage usage_hinted[NAPI];
	struct classify_hint hint[NAPI];
};

/* Field by field: struct usage has padding after `outcome`. */
static bool usage_eq(const struct usage *a, const struct usage *b)
{
	return a->input_tokens == b->input_tokens && a->output_tokens == b->output_tokens &&
	       a->cached_tokens == b->cached_tokens && a->cache_write_tokens == b->cache_write_tokens &&
	       a->reasoning_tokens == b->reasoning_tokens && a->outcome == b->outcome &&
	       a->server.queue_ns == b->server.queue_ns && a->server.load_ns == b->server.load_ns &&
	       a->server.validation_ns == b->server.validation_ns && a->server.prefill_ns == b->server.prefill_ns &&
	       a->server.decode_ns == b->server.decode_ns && a->server.inference_ns == b->server.inference_ns &&
	       a->server.source == b->server.source;
}

static void on_event(void *arg, const struct framer_event *ev)
{
	struct run *r = arg;

	r->callbacks++;
	CHECK(ev->data != NULL || ev->data_len == 0);
	CHECK(ev->name_len + ev->data_len <= r->max_event);
	CHECK((ev->name == NULL) == (ev->name_len == 0));
	if (r->kind == FRAMER_NDJSON) {
		CHECK(ev->name == NULL);
		CHECK(memchr(ev->data, '\n', ev->data_len) == NULL);
	} else if (r->kind == FRAMER_JSON_ARRAY) {
		CHECK(ev->name == NULL && ev->data_len > 0);
		CHECK(strchr(" \t\r\n,]", ev->data[0]) == NULL || ev->data[0] == '\0');
	} else {
		CHECK(memchr(ev->data, '\r', ev->data_len) == NULL);
		if (ev->name)
			CHECK(memchr(ev->name, '\r', ev->name_len) == NULL &&
			      memchr(ev->name, '\n', ev->name_len) == NULL);
	}
	uint64_t h = fuzz_fnv(FUZZ_FNV_SEED, &ev->name_len, sizeof(ev->name_len));
	h = fuzz_fnv(h, ev->name ? ev->name : "", ev->name_len);
	h = fuzz_fnv(h, &ev->data_len, sizeof(ev->data_len));
	h = fuzz_fnv(h, ev->data, ev->data_len);
	uint32_t tok = 0;
	for (size_t i = 0; i < NAPI; i++) {
		enum token_kind t = classify_event(apis[i], ev, &r->usage[i], NULL);
		CHECK(t <= TOKEN_TOOL);
		tok |= (uint32_t)t << (2 * i);
		CHECK(r->usage[i].input_tokens >= -1 && r->usage[i].output_tokens >= -1);
		CHECK(r->usage[i].cached_tokens >= -1 && r->usage[i].cache_write_tokens >= -1 &&
		      r->usage[i].reasoning_tokens >= -1);
		CHECK(r->usage[i].outcome <= OUTCOME_FAILED);
		CHECK(r->usage[i].server.queue_ns >= -1 && r->usage[i].server.load_ns >= -1 &&
		      r->usage[i].server.prefill_ns >= -1 && r->usage[i].server.decode_ns >= -1 &&
		      r->usage[i].server.source <= SERVER_TGI);
		CHECK(classify_event(apis[i], ev, &r->usage_hinted[i], &r->hint[i]) == t);
		CHECK(usage_eq(&r->usage[i], &r->usage_hinted[i]));
	}
	if (r->n < MAX_EVENTS) {
		r->digest[r->n] = h;
		r->tokens[r->n] = tok;
	}
	r->n++;
}

/* `seed` (NSPLIT bytes) picks the hints a run starts from; `split`, when
 * not NULL, cuts the body into pieces. */
static void run_framer(struct run *r, const uint8_t *body, size_t len, const uint8_t *seed, const uint8_t *split,
		       struct framer *out)
{
	struct framer f;

	r->callbacks = 0;
	r->n = 0;
	for (size_t i = 0; i < NAPI; i++) {
		r->usage[i] = r->usage_hinted[i] = USAGE_UNKNOWN;
		/* Any hint is allowed to be wrong: start from one the input
		 * chooses, not only from none. */
		r->hint[i].rule = (uint8_t)(seed[i % NSPLIT] % 5);
		r->hint[i].at = seed[(i + 1) % NSPLIT];
	}
	framer_init(&f, r->kind, r->max_event, on_event, r);
	fuzz_feed(&f, body, len, split, NSPLIT);
	CHECK(f.events == r->callbacks);
	CHECK(f.len <= f.cap && f.cap <= r->max_event);
	*out = f; /* counters only: the buffer is freed below */
	out->buf = NULL;
	framer_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct run whole, pieces;
	static const size_t bounds[8] = { 16, 64, 200, 512, 700, 1024, 2048, 1u << 20 };
	struct framer fw, fp;

	if (size < 1 + NSPLIT)
		return 0;
	whole.kind = pieces.kind = (data[0] & 0x10) ? FRAMER_JSON_ARRAY : (data[0] & 1) ? FRAMER_NDJSON : FRAMER_SSE;
	whole.max_event = pieces.max_event = bounds[(data[0] >> 1) & 7];
	const uint8_t *split = data + 1;
	const uint8_t *body = data + 1 + NSPLIT;
	size_t len = size - 1 - NSPLIT;

	run_framer(&whole, body, len, split, NULL, &fw);
	run_framer(&pieces, body, len, split, split, &fp);

	CHECK(fw.events == fp.events);
	CHECK(fw.oversized == fp.oversized);
	CHECK(whole.n == pieces.n);
	size_t n = whole.n < MAX_EVENTS ? whole.n : MAX_EVENTS;
	CHECK(memcmp(whole.digest, pieces.digest, n * sizeof(whole.digest[0])) == 0);
	CHECK(memcmp(whole.tokens, pieces.tokens, n * sizeof(whole.tokens[0])) == 0);
	for (size_t i = 0; i < NAPI; i++)
		CHECK(usage_eq(&whole.usage[i], &pieces.usage[i]));
	/* Every event and every dropped one came from at least one byte. */
	CHECK(fw.events + fw.oversized <= len + 1);
	return 0;
}
