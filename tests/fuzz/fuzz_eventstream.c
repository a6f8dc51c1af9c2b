/*
 * fuzz_eventstream.c — libFuzzer target: the AWS event-stream framer
 * (eventstream.c), alone and behind framer.h with the Bedrock classifiers,
 * on bytes cut at points the fuzzer chooses.
 *
 * Input layout: byte 0: bits 0-2 pick the framer's bound (16 B .. 64 KiB, or
 * the 1 MiB default, so that skipped messages are reached), bit 3 the API
 * the events are classified for (Converse or InvokeModel), bit 4 "seal":
 * the body's messages, as their own preludes delimit them, get right CRCs
 * before the run, so that the fuzzer reaches the headers, the payloads and
 * the classifiers instead of stopping at the first CRC. Bytes 1-8 are piece
 * lengths, used in turn to cut the rest (0 means 1 byte). The rest is the
 * body.
 *
 * Checked: one piece and many give the same messages (headers read and
 * payload, byte for byte), the same error at the same offset, the same
 * counters; every message delivered is one evs_parse accepts on its own,
 * at the offset the framer says, with the same payload; none is longer
 * than the bound; the buffer never outgrows it; after an error nothing is
 * delivered; behind framer.h, the same events, token kinds and usage in
 * one piece and in many, and no event data past the bound. ASan/UBSan
 * catch the rest.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "classify.h"
#include "eventstream.h"
#include "framer.h"
#include "fuzz_check.h"

#define NSPLIT 8

struct run {
	const uint8_t *body;
	size_t len;
	struct evs_framer *f;
	uint64_t n;
	uint64_t digest;
	bool after_error; /* a callback came after the error was set */
};

static uint64_t str_digest(uint64_t h, struct evs_str s)
{
	h = fuzz_fnv(h, &s.n, sizeof(s.n));
	return fuzz_fnv(h, s.p ? s.p : "", s.n);
}

static void on_msg(void *arg, const struct evs_message *m)
{
	struct run *r = arg;
	struct evs_message alone;
	uint64_t at = r->f->offset; /* where this message began */

	if (r->f->error != EVS_OK)
		r->after_error = true;
	CHECK(at + EVS_MIN_MESSAGE <= r->len);
	uint32_t total = (uint32_t)r->body[at] << 24 | (uint32_t)r->body[at + 1] << 16 |
			 (uint32_t)r->body[at + 2] << 8 | r->body[at + 3];
	CHECK(total <= r->f->max_message && at + total <= r->len);
	CHECK(evs_parse((const char *)r->body + at, total, &alone) == EVS_OK);
	CHECK(alone.payload_len == m->payload_len && memcmp(alone.payload, m->payload, m->payload_len) == 0);
	CHECK(alone.type == m->type && alone.headers == m->headers && m->headers <= EVS_MAX_HEADER_COUNT);
	uint64_t h = fuzz_fnv(r->digest, &m->type, sizeof(m->type));
	h = str_digest(h, m->event_type);
	h = str_digest(h, m->exception_type);
	h = str_digest(h, m->error_code);
	h = str_digest(h, m->content_type);
	h = fuzz_fnv(h, &m->headers, sizeof(m->headers));
	h = fuzz_fnv(h, &m->payload_len, sizeof(m->payload_len));
	r->digest = fuzz_fnv(h, m->payload, m->payload_len);
	r->n++;
}

static void run_evs(struct run *r, const uint8_t *body, size_t len, size_t max, const uint8_t *split,
		    struct evs_framer *out)
{
	struct evs_framer f;

	memset(r, 0, sizeof(*r));
	r->body = body;
	r->len = len;
	r->f = &f;
	r->digest = FUZZ_FNV_SEED;
	evs_init(&f, max, on_msg, r);
	size_t off = 0;
	for (unsigned k = 0; off < len; k++) {
		size_t piece = split ? (split[k % NSPLIT] ? split[k % NSPLIT] : 1) : len;
		if (piece > len - off)
			piece = len - off;
		/* each piece in a block of its own size: ASan sees a read past it */
		char *p = malloc(piece);
		CHECK(p != NULL);
		memcpy(p, body + off, piece);
		evs_feed(&f, p, piece);
		free(p);
		off += piece;
	}
	evs_finish(&f);
	CHECK(f.cap <= f.max_message);
	CHECK(f.messages == r->n);
	CHECK(!r->after_error);
	*out = f;
	out->buf = NULL;
	evs_free(&f);
}

/* Behind framer.h, classified: a digest of the events and their kinds. */
struct classified {
	enum api_kind api;
	size_t max;
	uint64_t n, digest;
	struct usage usage;
	struct classify_hint hint;
};

static bool usage_eq(const struct usage *a, const struct usage *b)
{
	return a->input_tokens == b->input_tokens && a->output_tokens == b->output_tokens &&
	       a->cached_tokens == b->cached_tokens && a->cache_write_tokens == b->cache_write_tokens &&
	       a->reasoning_tokens == b->reasoning_tokens && a->outcome == b->outcome &&
	       a->server.inference_ns == b->server.inference_ns && a->server.first_byte_ns == b->server.first_byte_ns &&
	       a->server.source == b->server.source;
}

static void on_event(void *arg, const struct framer_event *ev)
{
	struct classified *c = arg;

	CHECK(ev->data != NULL);
	CHECK((ev->name == NULL) == (ev->name_len == 0));
	CHECK(ev->data_len <= c->max);
	struct usage before = c->usage;
	enum token_kind t = classify_event(c->api, ev, &c->usage, &c->hint);
	CHECK(t <= TOKEN_TOOL);
	CHECK(c->usage.input_tokens >= -1 && c->usage.output_tokens >= -1 && c->usage.cached_tokens >= -1);
	CHECK(c->usage.server.first_byte_ns >= -1 && c->usage.server.inference_ns >= -1);
	CHECK(c->usage.outcome >= before.outcome);
	if (ev->exception)
		CHECK(c->usage.outcome == OUTCOME_FAILED && t == TOKEN_NONE);
	uint64_t h = fuzz_fnv(c->digest, &ev->name_len, sizeof(ev->name_len));
	h = fuzz_fnv(h, ev->name ? ev->name : "", ev->name_len);
	h = fuzz_fnv(h, &ev->data_len, sizeof(ev->data_len));
	h = fuzz_fnv(h, ev->data, ev->data_len);
	h = fuzz_fnv(h, &ev->exception, sizeof(ev->exception));
	c->digest = fuzz_fnv(h, &t, sizeof(t));
	c->n++;
}

static void run_framer(struct classified *c, const uint8_t *body, size_t len, const uint8_t *split, const char **error)
{
	struct framer f;

	c->n = 0;
	c->digest = FUZZ_FNV_SEED;
	c->usage = USAGE_UNKNOWN;
	memset(&c->hint, 0, sizeof(c->hint));
	framer_init(&f, FRAMER_EVENTSTREAM, c->max, on_event, c);
	size_t off = 0;
	for (unsigned k = 0; off < len; k++) {
		size_t piece = split ? (split[k % NSPLIT] ? split[k % NSPLIT] : 1) : len;
		if (piece > len - off)
			piece = len - off;
		framer_feed(&f, (const char *)body + off, piece);
		off += piece;
	}
	framer_finish(&f);
	CHECK(f.events == c->n);
	CHECK(f.cap <= c->max);
	*error = framer_error(&f);
	framer_free(&f);
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* Gives every message its preludes delimit right CRCs, as far as they fit. */
static void seal(uint8_t *b, size_t len)
{
	size_t off = 0;
	while (len - off >= EVS_MIN_MESSAGE) {
		uint32_t total =
			(uint32_t)b[off] << 24 | (uint32_t)b[off + 1] << 16 | (uint32_t)b[off + 2] << 8 | b[off + 3];
		if (total < EVS_MIN_MESSAGE || total > len - off)
			return;
		put32(b + off + 8, (uint32_t)crc32(0, b + off, 8));
		put32(b + off + total - 4, (uint32_t)crc32(0, b + off, (uInt)(total - 4)));
		off += total;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t bounds[8] = { 16, 40, 64, 200, 1024, 4096, 65536, 0 };
	struct run whole, pieces;
	struct evs_framer fw, fp;

	if (size < 1 + NSPLIT)
		return 0;
	size_t max = bounds[data[0] & 7];
	const uint8_t *split = data + 1;
	size_t len = size - 1 - NSPLIT;
	uint8_t *body = malloc(len ? len : 1);
	CHECK(body != NULL);
	memcpy(body, data + 1 + NSPLIT, len);
	if (data[0] & 0x10)
		seal(body, len);

	run_evs(&whole, body, len, max, NULL, &fw);
	run_evs(&pieces, body, len, max, split, &fp);
	CHECK(whole.n == pieces.n && whole.digest == pieces.digest);
	CHECK(fw.error == fp.error && fw.offset == fp.offset && fw.oversized == fp.oversized);
	CHECK(fw.offset <= len);
	CHECK(fw.error != EVS_OK || fw.offset == len);
	CHECK((fw.messages + fw.oversized) * EVS_MIN_MESSAGE <= len);

	struct classified cw = { .api = (data[0] & 8) ? API_BEDROCK_INVOKE : API_BEDROCK_CONVERSE };
	cw.max = max ? max : (1u << 20);
	struct classified cp = cw;
	const char *ew, *ep;
	run_framer(&cw, body, len, NULL, &ew);
	run_framer(&cp, body, len, split, &ep);
	CHECK(cw.n == cp.n && cw.digest == cp.digest);
	CHECK(usage_eq(&cw.usage, &cp.usage));
	CHECK((ew == NULL) == (ep == NULL) && (ew == NULL || strcmp(ew, ep) == 0));
	CHECK((ew == NULL) == (fw.error == EVS_OK));
	CHECK(cw.n == fw.messages);
	free(body);
	return 0;
}
