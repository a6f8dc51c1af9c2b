/*
 * fuzz_shape.c — libFuzzer target: same-shape events (framer.h,
 * classify.c "Same-shape events") against the line-by-line path.
 *
 * Input layout: byte 0 picks the API (bits 0-1: chat completions,
 * Anthropic's Messages, the Responses API, or, with bit 2 as well, one of
 * the APIs that never arm a shape) and the event size bound (bits 3-5:
 * 64 B .. 1 KiB, or the 1 MiB default); bytes 1-8 are piece lengths, used
 * in turn to cut the rest (0 means 1 byte). The rest is an SSE body.
 *
 * The body is framed three ways: whole by a framer on which no shape is
 * ever armed, every event classified by classify_event() (the reference);
 * then whole and in pieces with classify_event_shaped(), which arms the
 * shape and answers same-shape events from it. Checked: the three give the
 * same events (names and data, byte for byte), the same token kind, usage
 * and hint after every event, and the same counters. ASan/UBSan catch the
 * rest.
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

static const enum api_kind armed_apis[] = { API_OPENAI_CHAT, API_ANTHROPIC, API_OPENAI_RESPONSES, API_OPENAI_CHAT };
static const enum api_kind other_apis[] = { API_OPENAI_COMPLETIONS, API_LLAMACPP, API_TGI, API_UNKNOWN };

/* What one run saw: a digest of every event and what classifying it left. */
struct run {
	enum api_kind api;
	bool shaped;
	struct framer f;
	size_t n, same;
	uint64_t digest[MAX_EVENTS]; /* (name, data) */
	uint64_t after[MAX_EVENTS];  /* (token kind, usage, hint) */
	struct usage usage;
	struct classify_hint hint;
};

/* Field by field: struct usage has padding after `outcome`. */
static uint64_t usage_fnv(uint64_t h, const struct usage *u)
{
	const int64_t v[] = { u->input_tokens,		u->output_tokens,    u->cached_tokens,
			      u->cache_write_tokens,	u->reasoning_tokens, (int64_t)u->outcome,
			      u->server.queue_ns,	u->server.load_ns,   u->server.validation_ns,
			      u->server.prefill_ns,	u->server.decode_ns, u->server.inference_ns,
			      (int64_t)u->server.source };
	return fuzz_fnv(h, v, sizeof(v));
}

static void on_event(void *arg, const struct framer_event *ev)
{
	struct run *r = arg;

	CHECK(!ev->same_shape || r->shaped);
	r->same += ev->same_shape;
	uint64_t h = fuzz_fnv(FUZZ_FNV_SEED, &ev->name_len, sizeof(ev->name_len));
	h = fuzz_fnv(h, ev->name ? ev->name : "", ev->name_len);
	h = fuzz_fnv(h, &ev->data_len, sizeof(ev->data_len));
	h = fuzz_fnv(h, ev->data, ev->data_len);
	enum token_kind t = r->shaped ? classify_event_shaped(r->api, &r->f, ev, &r->usage, &r->hint)
				      : classify_event(r->api, ev, &r->usage, &r->hint);
	CHECK(t <= TOKEN_TOOL);
	uint64_t a = fuzz_fnv(FUZZ_FNV_SEED, &t, sizeof(t));
	a = usage_fnv(a, &r->usage);
	const uint64_t hv[] = { r->hint.rule, r->hint.at };
	a = fuzz_fnv(a, hv, sizeof(hv));
	if (r->n < MAX_EVENTS) {
		r->digest[r->n] = h;
		r->after[r->n] = a;
	}
	r->n++;
}

/* `split`, when not NULL, cuts the body into pieces. */
static void run_stream(struct run *r, enum api_kind api, bool shaped, size_t max_event, const uint8_t *body, size_t len,
		       const uint8_t *split)
{
	r->api = api;
	r->shaped = shaped;
	r->n = r->same = 0;
	r->usage = USAGE_UNKNOWN;
	r->hint = (struct classify_hint){ 0 };
	framer_init(&r->f, FRAMER_SSE, max_event, on_event, r);
	fuzz_feed(&r->f, body, len, split, NSPLIT);
	CHECK(r->f.events == r->n);
	if (!shaped)
		CHECK(r->f.shape == NULL);
	framer_free(&r->f);
}

static void check_same(const struct run *ref, const struct run *got)
{
	CHECK(ref->n == got->n);
	CHECK(ref->f.oversized == got->f.oversized);
	size_t n = ref->n < MAX_EVENTS ? ref->n : MAX_EVENTS;
	for (size_t i = 0; i < n; i++) {
		CHECK(ref->digest[i] == got->digest[i]);
		CHECK(ref->after[i] == got->after[i]);
	}
}

/* FUZZ_SHAPE_STATS=1 in the environment: how many events were taken as
 * the shape's, printed at exit, to see that the fuzzer gets there. */
static uint64_t stat_events, stat_same;
static void print_stats(void)
{
	fprintf(stderr, "fuzz_shape: %llu events, %llu same-shape (whole, shaped)\n", (unsigned long long)stat_events,
		(unsigned long long)stat_same);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct run ref, whole, pieces;
	static const size_t bounds[8] = { 64, 150, 200, 236, 260, 512, 1024, 1u << 20 };
	static int stats = -1;

	if (stats < 0) {
		const char *e = getenv("FUZZ_SHAPE_STATS");
		stats = e != NULL && *e == '1';
		if (stats)
			atexit(print_stats);
	}
	if (size < 1 + NSPLIT)
		return 0;
	enum api_kind api = (data[0] & 4) ? other_apis[data[0] & 3] : armed_apis[data[0] & 3];
	size_t max_event = bounds[(data[0] >> 3) & 7];
	const uint8_t *split = data + 1;
	const uint8_t *body = data + 1 + NSPLIT;
	size_t len = size - 1 - NSPLIT;

	run_stream(&ref, api, false, max_event, body, len, NULL);
	run_stream(&whole, api, true, max_event, body, len, NULL);
	run_stream(&pieces, api, true, max_event, body, len, split);
	check_same(&ref, &whole);
	check_same(&ref, &pieces);
	stat_events += whole.n;
	stat_same += whole.same;
	return 0;
}
