/*
 * fuzz_respparse.c — libFuzzer target: an upstream's byte stream through the
 * response parser (src/parse/respparse.c), the SSE / NDJSON framer and the token
 * classifier, driven as exchange.c drives them, with the stream cut into
 * reads at points the fuzzer chooses.
 *
 * Input layout: byte 0 holds flags: bit 0, the request was a HEAD; bits 1-2
 * the head bound (64 B, 512 B, 4 KiB or RESP_HEAD_MAX); bits 3-5 the event
 * size bound (16 B .. 2 KiB, or the 1 MiB default). Bytes 1-8 are read
 * lengths, used in turn (0 means 1 byte). The rest is what the upstream
 * sends; its end is the upstream closing the connection.
 *
 * Each read is appended to an input buffer; the unparsed part of it is fed
 * as exchange.c's exchange_read feeds it, then the bytes respparse_take hands
 * over are moved from the buffer's front to an output buffer, as they would
 * go to the client. Checked: the output is the input's prefix the parser
 * consumed, byte for byte, and all of it once the head has parsed; nothing
 * is consumed past a response's end (the consumed prefix alone parses to
 * the same end); hooks come in order (one head, body only after it and not
 * for a HEAD, a 204 or a 304, one completion, nothing after it); a head is refused as too
 * large only past the bound; the whole stream in one read and in many reads
 * gives the same status, framer kind, body, events, classifications, usage,
 * keep-alive and end, and unless that end is an error, the same bytes
 * consumed and forwarded (an error stops a read, and what earlier reads
 * held went out before it). The head bound is decided read by read: there
 * the pieces may meet it before the whole stream does, never after. The
 * pieces read again with llhttp reading chunked bodies too
 * (rp.llhttp_chunks) give all the same, errors included. ASan/UBSan catch
 * the rest.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "classify.h"
#include "framer.h"
#include "fuzz_check.h"
#include "respparse.h"

#define NSPLIT 8
#define MAX_EVENTS 1024

static const enum api_kind apis[] = { API_UNKNOWN,	   API_OPENAI_CHAT, API_OPENAI_COMPLETIONS,
				      API_ANTHROPIC,	   API_TGI,	    API_LLAMACPP,
				      API_OLLAMA_GENERATE, API_OLLAMA_CHAT, API_OPENAI_RESPONSES };
#define NAPI (sizeof(apis) / sizeof(apis[0]))

enum end { END_MORE, END_DONE, END_DONE_EOF, END_INVALID, END_SWITCHING, END_HEAD_TOO_LARGE };

/* What one run saw. */
static bool timing_eq(const struct server_timing *a, const struct server_timing *b)
{
	return a->queue_ns == b->queue_ns && a->load_ns == b->load_ns && a->validation_ns == b->validation_ns &&
	       a->prefill_ns == b->prefill_ns && a->decode_ns == b->decode_ns && a->inference_ns == b->inference_ns &&
	       a->source == b->source;
}

struct run {
	/* set by the caller */
	bool head_request, llhttp_chunks;
	size_t head_max, max_event;
	/* hooks */
	unsigned heads, completes;
	int status;
	enum framer_kind kind;
	bool content_encoded, keep_alive;
	struct server_timing hdr; /* TGI's headers, as the head left them */
	size_t body_len;
	uint64_t body_digest;
	char *body; /* a non-streamed body, for classify_body */
	struct framer framer;
	size_t n;
	uint64_t digest[MAX_EVENTS];
	uint32_t tokens[MAX_EVENTS]; /* bits 2i, 2i+1: the token kind for apis[i] */
	struct usage usage[NAPI];
	/* the end */
	enum end end;
	size_t consumed;  /* sum of *used */
	size_t forwarded; /* sum of what respparse_take handed over */
};

static void on_event(void *arg, const struct framer_event *ev)
{
	struct run *r = arg;

	CHECK(ev->name_len + ev->data_len <= r->max_event);
	uint64_t h = fuzz_fnv(FUZZ_FNV_SEED, &ev->name_len, sizeof(ev->name_len));
	h = fuzz_fnv(h, ev->name ? ev->name : "", ev->name_len);
	h = fuzz_fnv(h, &ev->data_len, sizeof(ev->data_len));
	h = fuzz_fnv(h, ev->data, ev->data_len);
	uint32_t tok = 0;
	for (size_t i = 0; i < NAPI; i++)
		tok |= (uint32_t)classify_event(apis[i], ev, &r->usage[i], NULL) << (2 * i);
	if (r->n < MAX_EVENTS) {
		r->digest[r->n] = h;
		r->tokens[r->n] = tok;
	}
	r->n++;
}

static void on_head(void *arg, const struct respparse *rp)
{
	struct run *r = arg;

	CHECK(r->heads == 0 && r->completes == 0);
	CHECK(rp->head_done && !rp->done);
	CHECK(rp->status >= 200 && rp->status <= 999);
	CHECK(!rp->content_encoded || rp->kind == FRAMER_NONE);
	r->heads++;
	r->status = rp->status;
	r->kind = rp->kind;
	r->content_encoded = rp->content_encoded;
	r->hdr = rp->server;
	if (rp->kind != FRAMER_NONE)
		framer_init(&r->framer, rp->kind, r->max_event, on_event, r);
}

static void on_body(void *arg, const char *at, size_t len)
{
	struct run *r = arg;

	CHECK(r->heads == 1 && r->completes == 0);
	CHECK(!r->head_request);
	CHECK(r->status != 204 && r->status != 304); /* no body, whatever the headers */
	CHECK(len > 0);
	r->body_digest = fuzz_fnv(r->body_digest, at, len);
	if (r->kind != FRAMER_NONE) {
		framer_feed(&r->framer, at, len);
	} else {
		char *b = realloc(r->body, r->body_len + len);
		CHECK(b != NULL);
		memcpy(b + r->body_len, at, len);
		r->body = b;
	}
	r->body_len += len;
}

static void on_complete(void *arg, bool keep_alive)
{
	struct run *r = arg;

	CHECK(r->heads == 1 && r->completes == 0);
	r->completes++;
	r->keep_alive = keep_alive;
	if (r->kind != FRAMER_NONE) {
		framer_finish(&r->framer);
	} else if (r->status >= 200 && r->status < 300) {
		for (size_t i = 0; i < NAPI; i++)
			classify_body(apis[i], r->body ? r->body : "", r->body_len, &r->usage[i]);
	}
}

static const struct respparse_hooks hooks = { on_head, on_body, on_complete, NULL };

/* The upstream's stream, read by read; `split` NULL: one read. */
static void run_stream(struct run *r, const uint8_t *data, size_t len, const uint8_t *split)
{
	struct respparse rp;
	char *in = malloc(len + 1), *out = malloc(len + 1);
	size_t have = 0, outlen = 0, off = 0; /* `in` holds `have` bytes not yet forwarded */

	CHECK(in && out);
	r->heads = r->completes = 0;
	r->status = 0;
	r->kind = FRAMER_NONE;
	r->content_encoded = r->keep_alive = false;
	r->hdr = SERVER_TIMING_UNKNOWN;
	r->body_len = 0;
	r->body_digest = FUZZ_FNV_SEED;
	r->body = NULL;
	memset(&r->framer, 0, sizeof(r->framer));
	r->n = 0;
	for (size_t i = 0; i < NAPI; i++)
		r->usage[i] = USAGE_UNKNOWN;
	r->end = END_MORE;
	r->consumed = r->forwarded = 0;

	respparse_init(&rp, &hooks, r);
	rp.head_request = r->head_request;
	rp.llhttp_chunks = r->llhttp_chunks;
	rp.head_max = r->head_max;
	for (unsigned k = 0; off < len && r->end == END_MORE; k++) {
		size_t piece = len - off;
		if (split && split[k % NSPLIT] && split[k % NSPLIT] < piece)
			piece = split[k % NSPLIT];
		else if (split && !split[k % NSPLIT])
			piece = 1;
		memcpy(in + have, data + off, piece); /* a read */
		have += piece;
		off += piece;
		/* exchange_read */
		while (!rp.done && have > rp.held) {
			size_t used = 0, held = rp.held;
			enum respparse_status st = respparse_feed(&rp, in + held, have - held, &used);
			if (st == RESPPARSE_INVALID || st == RESPPARSE_SWITCHING) {
				CHECK(used == 0 && rp.held == held);
				CHECK(respparse_error(&rp) != NULL);
				r->end = st == RESPPARSE_INVALID ? END_INVALID : END_SWITCHING;
				break;
			}
			CHECK(rp.held == held + used);
			r->consumed += used;
			if (st == RESPPARSE_DONE) {
				CHECK(rp.done && r->completes == 1 && used <= have - held);
				break;
			}
			CHECK(st == RESPPARSE_MORE && used == have - held);
		}
		if (r->end != END_MORE)
			break;
		size_t n = 0;
		enum respparse_status st = respparse_take(&rp, &n);
		if (st == RESPPARSE_HEAD_TOO_LARGE) {
			CHECK(!rp.head_done && rp.held > rp.head_max && n == 0);
			r->end = END_HEAD_TOO_LARGE;
			break;
		}
		CHECK(n <= have && rp.held <= have);
		CHECK(rp.head_done ? rp.held == 0 : n == 0);
		memcpy(out + outlen, in, n); /* to the client */
		outlen += n;
		memmove(in, in + n, have - n);
		have -= n;
		r->forwarded += n;
		if (st == RESPPARSE_DONE) {
			CHECK(rp.done);
			r->end = END_DONE;
		}
	}
	/* the upstream closes */
	if (r->end == END_MORE && rp.head_done && respparse_needs_eof(&rp)) {
		respparse_finish(&rp);
		if (rp.done) {
			CHECK(r->completes == 1);
			r->end = END_DONE_EOF;
		}
	}
	CHECK((r->completes == 1) == (r->end == END_DONE || r->end == END_DONE_EOF));
	CHECK(r->heads == (rp.head_done ? 1u : 0u));
	/* What went out is the input, byte for byte: all that was consumed,
	 * once there was a head to send. */
	CHECK(outlen == r->forwarded && r->forwarded <= r->consumed && r->consumed <= len);
	CHECK(memcmp(out, data, outlen) == 0);
	if (r->end == END_DONE || r->end == END_DONE_EOF || (r->end == END_MORE && rp.head_done))
		CHECK(r->forwarded == r->consumed);
	if (!rp.head_done)
		CHECK(r->forwarded == 0);
	framer_free(&r->framer);
	free(r->body);
	r->body = NULL;
	free(in);
	free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct run whole, pieces, prefix, slow;
	static const size_t head_bounds[4] = { 64, 512, 4096, RESP_HEAD_MAX };
	static const size_t event_bounds[8] = { 16, 64, 200, 512, 700, 1024, 2048, 1u << 20 };

	if (size < 1 + NSPLIT)
		return 0;
	whole.head_request = pieces.head_request = data[0] & 1;
	whole.head_max = pieces.head_max = head_bounds[(data[0] >> 1) & 3];
	whole.max_event = pieces.max_event = event_bounds[(data[0] >> 3) & 7];
	const uint8_t *split = data + 1;
	const uint8_t *stream = data + 1 + NSPLIT;
	size_t len = size - 1 - NSPLIT;

	run_stream(&whole, stream, len, NULL);
	run_stream(&pieces, stream, len, split);
	slow.head_request = pieces.head_request;
	slow.head_max = pieces.head_max;
	slow.max_event = pieces.max_event;
	slow.llhttp_chunks = true;
	run_stream(&slow, stream, len, split);
	CHECK(slow.end == pieces.end && slow.consumed == pieces.consumed && slow.forwarded == pieces.forwarded);
	CHECK(slow.heads == pieces.heads && slow.completes == pieces.completes && slow.status == pieces.status);
	CHECK(slow.kind == pieces.kind && slow.keep_alive == pieces.keep_alive);
	CHECK(slow.body_len == pieces.body_len && slow.body_digest == pieces.body_digest && slow.n == pieces.n);
	CHECK(memcmp(slow.digest, pieces.digest,
		     (pieces.n < MAX_EVENTS ? pieces.n : MAX_EVENTS) * sizeof(pieces.digest[0])) == 0);

	/* A head still incomplete past the bound in the whole stream is so at
	 * some read of the pieces too; the pieces may meet the bound first. */
	if (whole.end == END_HEAD_TOO_LARGE)
		CHECK(pieces.end == END_HEAD_TOO_LARGE);
	if (pieces.end == END_HEAD_TOO_LARGE) {
		CHECK(pieces.heads == 0 && pieces.forwarded == 0);
		return 0;
	}
	CHECK(whole.end == pieces.end);
	/* After an error nothing more goes out; the pieces before it did. */
	if (whole.end != END_INVALID && whole.end != END_SWITCHING)
		CHECK(whole.consumed == pieces.consumed && whole.forwarded == pieces.forwarded);
	CHECK(whole.heads == pieces.heads && whole.completes == pieces.completes);
	CHECK(whole.status == pieces.status && whole.kind == pieces.kind);
	CHECK(whole.content_encoded == pieces.content_encoded && whole.keep_alive == pieces.keep_alive);
	CHECK(whole.body_len == pieces.body_len && whole.body_digest == pieces.body_digest);
	CHECK(whole.n == pieces.n);
	size_t n = whole.n < MAX_EVENTS ? whole.n : MAX_EVENTS;
	CHECK(memcmp(whole.digest, pieces.digest, n * sizeof(whole.digest[0])) == 0);
	CHECK(memcmp(whole.tokens, pieces.tokens, n * sizeof(whole.tokens[0])) == 0);
	/* Field by field: struct usage has padding after `outcome`. */
	for (size_t i = 0; i < NAPI; i++)
		CHECK(whole.usage[i].input_tokens == pieces.usage[i].input_tokens &&
		      whole.usage[i].output_tokens == pieces.usage[i].output_tokens &&
		      whole.usage[i].cached_tokens == pieces.usage[i].cached_tokens &&
		      whole.usage[i].cache_write_tokens == pieces.usage[i].cache_write_tokens &&
		      whole.usage[i].reasoning_tokens == pieces.usage[i].reasoning_tokens &&
		      whole.usage[i].outcome == pieces.usage[i].outcome &&
		      timing_eq(&whole.usage[i].server, &pieces.usage[i].server));
	CHECK(timing_eq(&whole.hdr, &pieces.hdr));

	/* Nothing past the end: the consumed prefix alone ends the same way. */
	if (whole.end == END_DONE) {
		prefix.head_request = whole.head_request;
		prefix.head_max = whole.head_max;
		prefix.max_event = whole.max_event;
		run_stream(&prefix, stream, whole.consumed, NULL);
		CHECK(prefix.end == END_DONE && prefix.consumed == whole.consumed);
		CHECK(prefix.status == whole.status && prefix.body_digest == whole.body_digest);
		CHECK(prefix.n == whole.n);
	}
	return 0;
}
