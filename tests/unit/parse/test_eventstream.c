/*
 * test_eventstream.c — the AWS event-stream framer (eventstream.c) and the
 * Bedrock APIs on top of it: messages built here byte by byte (CRCs from
 * zlib), fed whole, cut at every byte and one byte at a time; every way the
 * format can be broken (bad prelude or message CRC, lengths below the
 * minimum or past the bounds, headers overrunning their section, unknown
 * value types, too many headers, a body ending inside a message); every
 * header value type read; messages past the framer's bound skipped but
 * still checked. Then the framer as framer.h hands the messages out
 * (InvokeModel chunks decoded) and the classification of Converse and
 * InvokeModel events, usage and Bedrock's own timings included; the API and
 * the model read from a Bedrock path.
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
#include <zlib.h>

#include "classify.h"
#include "eventstream.h"
#include "framer.h"
#include "quotes.h"
#include "reqinfo.h"

/* ---- building messages ------------------------------------------------ */

static void put32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

/* A headers section being built. */
struct hdrs {
	unsigned char b[8192];
	size_t n;
};

static void hdr_str(struct hdrs *h, const char *name, const char *val)
{
	size_t nl = strlen(name), vl = strlen(val);
	h->b[h->n++] = (unsigned char)nl;
	memcpy(h->b + h->n, name, nl);
	h->n += nl;
	h->b[h->n++] = 7;
	h->b[h->n++] = (unsigned char)(vl >> 8);
	h->b[h->n++] = (unsigned char)vl;
	memcpy(h->b + h->n, val, vl);
	h->n += vl;
}

/* A header of `type` with `vlen` raw value bytes (0xAB each). */
static void hdr_raw(struct hdrs *h, const char *name, unsigned type, size_t vlen)
{
	size_t nl = strlen(name);
	h->b[h->n++] = (unsigned char)nl;
	memcpy(h->b + h->n, name, nl);
	h->n += nl;
	h->b[h->n++] = (unsigned char)type;
	memset(h->b + h->n, 0xAB, vlen);
	h->n += vlen;
}

/* A whole message into out (returns its length), with a right prelude
 * CRC and message CRC. */
static size_t build(unsigned char *out, const struct hdrs *h, const char *payload, size_t plen)
{
	size_t total = EVS_MIN_MESSAGE + h->n + plen;
	put32(out, (uint32_t)total);
	put32(out + 4, (uint32_t)h->n);
	put32(out + 8, (uint32_t)crc32(0, out, 8));
	memcpy(out + 12, h->b, h->n);
	memcpy(out + 12 + h->n, payload, plen);
	put32(out + total - 4, (uint32_t)crc32(0, out, (uInt)(total - 4)));
	return total;
}

/* An event message as Bedrock sends it: three string headers. */
static size_t build_event(unsigned char *out, const char *type, const char *payload)
{
	struct hdrs h = { .n = 0 };
	hdr_str(&h, ":event-type", type);
	hdr_str(&h, ":content-type", "application/json");
	hdr_str(&h, ":message-type", "event");
	return build(out, &h, payload, strlen(payload));
}

static size_t build_exception(unsigned char *out, const char *type, const char *payload)
{
	struct hdrs h = { .n = 0 };
	hdr_str(&h, ":exception-type", type);
	hdr_str(&h, ":content-type", "application/json");
	hdr_str(&h, ":message-type", "exception");
	return build(out, &h, payload, strlen(payload));
}

/* Re-seals a message after a test changed its bytes: both CRCs right. */
static void reseal(unsigned char *m, size_t total)
{
	put32(m + 8, (uint32_t)crc32(0, m, 8));
	put32(m + total - 4, (uint32_t)crc32(0, m, (uInt)(total - 4)));
}

/* ---- what the framer delivered ---------------------------------------- */

#define MAX_MSGS 16

struct got {
	int n;
	char type[MAX_MSGS][64];
	char payload[MAX_MSGS][512];
	size_t payload_len[MAX_MSGS];
	enum evs_msg_type mtype[MAX_MSGS];
	unsigned headers[MAX_MSGS];
};

static void on_msg(void *arg, const struct evs_message *m)
{
	struct got *g = arg;
	assert_true(g->n < MAX_MSGS);
	const struct evs_str *name = m->type == EVS_MSG_EXCEPTION ? &m->exception_type : &m->event_type;
	assert_true(name->n < sizeof(g->type[0]));
	memcpy(g->type[g->n], name->p ? name->p : "", name->n);
	g->type[g->n][name->n] = '\0';
	assert_true(m->payload_len <= sizeof(g->payload[0]));
	memcpy(g->payload[g->n], m->payload, m->payload_len);
	g->payload_len[g->n] = m->payload_len;
	g->mtype[g->n] = m->type;
	g->headers[g->n] = m->headers;
	g->n++;
}

/* Feeds `len` bytes in pieces of `step` (0: whole), each piece in a heap
 * block of its exact size so that ASan sees any read past it. */
static void feed_steps(struct evs_framer *f, const unsigned char *b, size_t len, size_t step)
{
	if (step == 0)
		step = len ? len : 1;
	for (size_t off = 0; off < len; off += step) {
		size_t n = len - off < step ? len - off : step;
		char *piece = malloc(n);
		assert_non_null(piece);
		memcpy(piece, b + off, n);
		evs_feed(f, piece, n);
		free(piece);
	}
}

/* Feeds b cut at `cut` into two pieces. */
static void feed_cut(struct evs_framer *f, const unsigned char *b, size_t len, size_t cut)
{
	feed_steps(f, b, cut, 0);
	feed_steps(f, b + cut, len - cut, 0);
}

static void got_eq(const struct got *a, const struct got *b)
{
	assert_int_equal(a->n, b->n);
	for (int i = 0; i < a->n; i++) {
		assert_string_equal(a->type[i], b->type[i]);
		assert_int_equal(a->payload_len[i], b->payload_len[i]);
		assert_memory_equal(a->payload[i], b->payload[i], a->payload_len[i]);
		assert_int_equal(a->mtype[i], b->mtype[i]);
	}
}

/* A Converse stream, as Bedrock sends it (with its "p" padding). */
static size_t converse_stream(unsigned char *b)
{
	size_t n = 0;
	n += build_event(b + n, "messageStart", J("{'p':'abcdefghij','role':'assistant'}"));
	n += build_event(b + n, "contentBlockDelta",
			 J("{'contentBlockIndex':0,'delta':{'text':'Hello'},'p':'abcdefghijklmn'}"));
	n += build_event(b + n, "contentBlockDelta", J("{'contentBlockIndex':0,'delta':{'text':' world'},'p':'ab'}"));
	n += build_event(b + n, "contentBlockStop", J("{'contentBlockIndex':0,'p':'abcd'}"));
	n += build_event(b + n, "messageStop", J("{'p':'abc','stopReason':'end_turn'}"));
	n += build_event(b + n, "metadata",
			 J("{'metrics':{'latencyMs':412},'p':'abcdef','usage':{'inputTokens':11,'outputTokens':2,"
			   "'totalTokens':13}}"));
	return n;
}

static void test_split_everywhere(void **state)
{
	(void)state;
	static unsigned char b[4096];
	size_t len = converse_stream(b);
	struct got whole = { 0 }, part = { 0 };
	struct evs_framer f;

	evs_init(&f, 0, on_msg, &whole);
	feed_steps(&f, b, len, 0);
	evs_finish(&f);
	assert_int_equal(f.error, EVS_OK);
	assert_int_equal(whole.n, 6);
	assert_int_equal(f.messages, 6);
	assert_int_equal(f.offset, len);
	assert_string_equal(whole.type[1], "contentBlockDelta");
	assert_int_equal(whole.mtype[1], EVS_MSG_EVENT);
	assert_int_equal(whole.headers[1], 3);
	evs_free(&f);

	for (size_t cut = 0; cut <= len; cut++) {
		memset(&part, 0, sizeof(part));
		evs_init(&f, 0, on_msg, &part);
		feed_cut(&f, b, len, cut);
		evs_finish(&f);
		assert_int_equal(f.error, EVS_OK);
		got_eq(&whole, &part);
		evs_free(&f);
	}
	for (size_t step = 1; step <= 13; step++) {
		memset(&part, 0, sizeof(part));
		evs_init(&f, 0, on_msg, &part);
		feed_steps(&f, b, len, step);
		evs_finish(&f);
		assert_int_equal(f.error, EVS_OK);
		got_eq(&whole, &part);
		evs_free(&f);
	}
}

/* Each broken message, after a good one: the good one is delivered, the
 * error is the one expected, whole or cut at any byte, and nothing after
 * it is framed (a good message following is not delivered). */
static void expect_error(const unsigned char *bad, size_t bad_len, enum evs_error want)
{
	static unsigned char b[1 << 16];
	size_t n = build_event(b, "messageStart", J("{'role':'assistant'}"));
	size_t first = n;
	assert_true(n + bad_len + 256 < sizeof(b));
	memcpy(b + n, bad, bad_len);
	n += bad_len;
	n += build_event(b + n, "messageStop", J("{'stopReason':'end_turn'}"));

	for (size_t cut = 0; cut <= n; cut += (cut < first + bad_len + 16 ? 1 : 7)) {
		struct got g = { 0 };
		struct evs_framer f;
		evs_init(&f, 0, on_msg, &g);
		feed_cut(&f, b, n, cut);
		evs_finish(&f);
		assert_int_equal(f.error, want);
		assert_int_equal(g.n, 1);
		assert_int_equal(f.messages, 1);
		assert_int_equal(f.offset, first); /* where the failing message began */
		evs_free(&f);
	}
}

static void test_bad_prelude_crc(void **state)
{
	(void)state;
	unsigned char m[256];
	size_t n = build_event(m, "contentBlockDelta", J("{'delta':{'text':'x'}}"));
	m[8] ^= 0x01;
	expect_error(m, n, EVS_ERR_PRELUDE_CRC);
	/* a length changed but the prelude CRC left: the same */
	n = build_event(m, "contentBlockDelta", J("{'delta':{'text':'x'}}"));
	m[3] ^= 0x04;
	expect_error(m, n, EVS_ERR_PRELUDE_CRC);
}

static void test_bad_message_crc(void **state)
{
	(void)state;
	unsigned char m[256];
	size_t n = build_event(m, "contentBlockDelta", J("{'delta':{'text':'x'}}"));
	m[n - 10] ^= 0x20; /* a payload byte */
	expect_error(m, n, EVS_ERR_MESSAGE_CRC);
	n = build_event(m, "contentBlockDelta", J("{'delta':{'text':'x'}}"));
	m[n - 1] ^= 0x80; /* the CRC itself */
	expect_error(m, n, EVS_ERR_MESSAGE_CRC);
}

/* A prelude with a right CRC over whatever lengths it says. */
static void prelude_only(unsigned char *m, uint32_t total, uint32_t hlen)
{
	put32(m, total);
	put32(m + 4, hlen);
	put32(m + 8, (uint32_t)crc32(0, m, 8));
}

static void test_lengths(void **state)
{
	(void)state;
	unsigned char m[64] = { 0 };

	for (uint32_t t = 0; t < EVS_MIN_MESSAGE; t++) {
		prelude_only(m, t, 0);
		expect_error(m, 16, EVS_ERR_SHORT);
	}
	prelude_only(m, EVS_MAX_MESSAGE + 1, 0);
	expect_error(m, 12, EVS_ERR_LONG);
	prelude_only(m, 0xFFFFFFFFu, 0);
	expect_error(m, 12, EVS_ERR_LONG);
	/* headers longer than the message leaves room for */
	prelude_only(m, 32, 17);
	expect_error(m, 32, EVS_ERR_HEADERS_LENGTH);
	prelude_only(m, 32, 0xFFFFFFF0u);
	expect_error(m, 32, EVS_ERR_HEADERS_LENGTH);
	/* headers past the format's bound, in a message long enough */
	prelude_only(m, EVS_MAX_HEADERS + 1 + 16, EVS_MAX_HEADERS + 1);
	expect_error(m, 12, EVS_ERR_HEADERS_LENGTH);
	/* a payload past its bound */
	prelude_only(m, EVS_MAX_MESSAGE, 0);
	expect_error(m, 12, EVS_ERR_HEADERS_LENGTH);
	/* the smallest message: no headers, no payload, is one */
	struct hdrs h = { .n = 0 };
	size_t n = build(m, &h, "", 0);
	assert_int_equal(n, 16);
	struct evs_message msg;
	assert_int_equal(evs_parse((const char *)m, n, &msg), EVS_OK);
	assert_int_equal(msg.payload_len, 0);
	assert_int_equal(msg.type, EVS_MSG_OTHER);
}

static void test_headers_overrun(void **state)
{
	(void)state;
	unsigned char m[512];
	struct hdrs h = { .n = 0 };

	/* a string whose length runs past the section */
	hdr_str(&h, ":event-type", "chunk");
	size_t n = build(m, &h, "{}", 2);
	m[12 + 1 + 11 + 1 + 1] = 0x40; /* its u16 length: 0x40.. */
	reseal(m, n);
	expect_error(m, n, EVS_ERR_HEADER_OVERRUN);
	/* a name running past it: the section ends inside the name */
	h.n = 0;
	hdr_str(&h, ":event-type", "chunk");
	h.b[h.n++] = 200;
	h.b[h.n++] = 'x';
	n = build(m, &h, "{}", 2);
	expect_error(m, n, EVS_ERR_HEADER_OVERRUN);
	/* a fixed-size value cut by the section's end (a uuid, 16 bytes) */
	h.n = 0;
	hdr_raw(&h, "id", 9, 8);
	n = build(m, &h, "{}", 2);
	expect_error(m, n, EVS_ERR_HEADER_OVERRUN);
	/* a string's length field itself cut */
	h.n = 0;
	hdr_raw(&h, "s", 7, 1);
	n = build(m, &h, "", 0);
	expect_error(m, n, EVS_ERR_HEADER_OVERRUN);
	/* a name with no type byte after it */
	h.n = 0;
	h.b[h.n++] = 2;
	h.b[h.n++] = 'a';
	h.b[h.n++] = 'b';
	n = build(m, &h, "", 0);
	expect_error(m, n, EVS_ERR_HEADER_OVERRUN);
}

static void test_header_types(void **state)
{
	(void)state;
	unsigned char m[1024];
	struct hdrs h = { .n = 0 };
	static const size_t fixed[] = { 0, 0, 1, 2, 4, 8, 0, 0, 8, 16 };

	/* one of each type, then the string tokentap reads */
	for (unsigned t = 0; t <= 9; t++) {
		char name[8];
		snprintf(name, sizeof(name), "h%u", t);
		if (t == 6 || t == 7) {
			hdr_raw(&h, name, t, 0);
			h.n -= 0;
			h.b[h.n++] = 0;
			h.b[h.n++] = 3;
			memcpy(h.b + h.n, "abc", 3);
			h.n += 3;
		} else {
			hdr_raw(&h, name, t, fixed[t]);
		}
	}
	hdr_str(&h, ":event-type", "chunk");
	hdr_str(&h, ":message-type", "event");
	size_t n = build(m, &h, "{}", 2);
	struct evs_message msg;
	assert_int_equal(evs_parse((const char *)m, n, &msg), EVS_OK);
	assert_int_equal(msg.headers, 12);
	assert_true(evs_str_is(msg.event_type, "chunk"));
	assert_int_equal(msg.type, EVS_MSG_EVENT);
	assert_int_equal(msg.payload_len, 2);

	/* no type 10 and up */
	for (unsigned t = 10; t < 256; t += 37) {
		h.n = 0;
		hdr_raw(&h, "x", t, 0);
		n = build(m, &h, "{}", 2);
		expect_error(m, n, EVS_ERR_HEADER_TYPE);
	}
	/* an empty name */
	h.n = 0;
	h.b[h.n++] = 0;
	h.b[h.n++] = 0;
	n = build(m, &h, "{}", 2);
	expect_error(m, n, EVS_ERR_HEADER_NAME);
	/* :message-type that is not a string does not count */
	h.n = 0;
	hdr_raw(&h, ":message-type", 0, 0);
	n = build(m, &h, "{}", 2);
	assert_int_equal(evs_parse((const char *)m, n, &msg), EVS_OK);
	assert_int_equal(msg.type, EVS_MSG_OTHER);
}

static void test_header_count(void **state)
{
	(void)state;
	static unsigned char m[16384];
	struct hdrs h = { .n = 0 };

	for (unsigned i = 0; i < EVS_MAX_HEADER_COUNT; i++)
		hdr_raw(&h, "b", 0, 0); /* the smallest header: 3 bytes */
	size_t n = build(m, &h, "{}", 2);
	struct evs_message msg;
	assert_int_equal(evs_parse((const char *)m, n, &msg), EVS_OK);
	assert_int_equal(msg.headers, EVS_MAX_HEADER_COUNT);
	hdr_raw(&h, "b", 0, 0);
	n = build(m, &h, "{}", 2);
	expect_error(m, n, EVS_ERR_HEADER_COUNT);
	/* thousands, as many as fit: the same, at the 65th */
	while (h.n + 3 < sizeof(h.b))
		hdr_raw(&h, "b", 0, 0);
	n = build(m, &h, "", 0);
	expect_error(m, n, EVS_ERR_HEADER_COUNT);
}

static void test_oversized_skipped(void **state)
{
	(void)state;
	static unsigned char b[8192];
	char big[1500];
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';

	size_t n = build_event(b, "messageStart", "{}");
	n += build_event(b + n, "contentBlockDelta", big);
	n += build_event(b + n, "messageStop", "{}");
	for (size_t step = 1; step <= n; step = step * 3 + 1) {
		struct got g = { 0 };
		struct evs_framer f;
		evs_init(&f, 256, on_msg, &g);
		feed_steps(&f, b, n, step);
		evs_finish(&f);
		assert_int_equal(f.error, EVS_OK);
		assert_int_equal(g.n, 2);
		assert_string_equal(g.type[1], "messageStop");
		assert_int_equal(f.oversized, 1);
		assert_true(f.cap <= 256);
		evs_free(&f);
	}
	/* skipped, yet its CRC is checked */
	size_t first = build_event(b, "messageStart", "{}");
	size_t bad = build_event(b + first, "contentBlockDelta", big);
	b[first + bad - 30] ^= 1;
	struct got g = { 0 };
	struct evs_framer f;
	evs_init(&f, 256, on_msg, &g);
	feed_steps(&f, b, first + bad, 7);
	assert_int_equal(f.error, EVS_ERR_MESSAGE_CRC);
	assert_int_equal(f.oversized, 0);
	evs_free(&f);
}

static void test_truncated(void **state)
{
	(void)state;
	unsigned char b[512];
	size_t n = build_event(b, "messageStart", "{}");
	for (size_t cut = 1; cut < n; cut++) {
		struct got g = { 0 };
		struct evs_framer f;
		evs_init(&f, 0, on_msg, &g);
		feed_steps(&f, b, cut, 0);
		evs_finish(&f);
		assert_int_equal(f.error, EVS_ERR_TRUNCATED);
		assert_int_equal(g.n, 0);
		evs_free(&f);
	}
	assert_string_equal(evs_error_name(EVS_ERR_MESSAGE_CRC), "message_crc");
	assert_string_equal(evs_error_name(EVS_OK), "ok");
}

/* ---- framer.h: messages as events -------------------------------------- */

struct events {
	int n;
	char name[32][64];
	char data[32][1024];
	bool exception[32];
	enum token_kind token[32];
	enum api_kind api;
	struct usage usage;
	struct classify_hint hint;
};

static void on_event(void *arg, const struct framer_event *ev)
{
	struct events *e = arg;
	assert_true(e->n < 32);
	assert_true(ev->name_len < 64 && ev->data_len < 1024);
	memcpy(e->name[e->n], ev->name ? ev->name : "", ev->name_len);
	e->name[e->n][ev->name_len] = '\0';
	memcpy(e->data[e->n], ev->data, ev->data_len);
	e->data[e->n][ev->data_len] = '\0';
	e->exception[e->n] = ev->exception;
	e->token[e->n] = classify_event(e->api, ev, &e->usage, &e->hint);
	e->n++;
}

static void events_start(struct events *e, enum api_kind api)
{
	memset(e, 0, sizeof(*e));
	e->api = api;
	e->usage = USAGE_UNKNOWN;
}

static void frame_all(struct events *e, const unsigned char *b, size_t len, size_t cut, const char **error)
{
	struct framer f;
	framer_init(&f, FRAMER_EVENTSTREAM, 0, on_event, e);
	framer_feed(&f, (const char *)b, cut);
	framer_feed(&f, (const char *)b + cut, len - cut);
	framer_finish(&f);
	*error = framer_error(&f);
	assert_int_equal(f.events, (uint64_t)e->n);
	framer_free(&f);
}

static void base64(const char *in, char *out)
{
	static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t n = strlen(in), o = 0;
	const unsigned char *u = (const unsigned char *)in;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v =
			(uint32_t)u[i] << 16 | (i + 1 < n ? (uint32_t)u[i + 1] << 8 : 0) | (i + 2 < n ? u[i + 2] : 0);
		out[o++] = t[v >> 18 & 63];
		out[o++] = t[v >> 12 & 63];
		out[o++] = i + 1 < n ? t[v >> 6 & 63] : '=';
		out[o++] = i + 2 < n ? t[v & 63] : '=';
	}
	out[o] = '\0';
}

/* An InvokeModel chunk wrapping the model's JSON, as Bedrock sends it. */
static size_t build_chunk(unsigned char *out, const char *inner)
{
	char b64[2048], payload[2200];
	base64(inner, b64);
	snprintf(payload, sizeof(payload), "{\"bytes\":\"%s\",\"p\":\"abcdefghijklmnopqrstuvwxyzABCDEF\"}", b64);
	return build_event(out, "chunk", payload);
}

static void test_converse_classified(void **state)
{
	(void)state;
	static unsigned char b[8192];
	size_t n = 0;
	n += build_event(b + n, "messageStart", J("{'p':'abcdefghij','role':'assistant'}"));
	n += build_event(b + n, "contentBlockDelta",
			 J("{'contentBlockIndex':0,'delta':{'reasoningContent':{'text':'Let me think'}},'p':'ab'}"));
	n += build_event(b + n, "contentBlockDelta",
			 J("{'contentBlockIndex':0,'delta':{'reasoningContent':{'signature':'c2ln'}},'p':'ab'}"));
	n += build_event(b + n, "contentBlockStop", J("{'contentBlockIndex':0}"));
	n += build_event(b + n, "contentBlockDelta",
			 J("{'contentBlockIndex':1,'delta':{'text':'Hi \\'text\\': there'},'p':'abc'}"));
	n += build_event(b + n, "contentBlockDelta", J("{'contentBlockIndex':1,'delta':{'text':''}}"));
	n += build_event(b + n, "contentBlockStart",
			 J("{'contentBlockIndex':2,'start':{'toolUse':{'name':'get','toolUseId':'t1'}}}"));
	n += build_event(b + n, "contentBlockDelta",
			 J("{'contentBlockIndex':2,'delta':{'toolUse':{'input':'{\\'a'}}}"));
	n += build_event(b + n, "messageStop", J("{'stopReason':'tool_use'}"));
	n += build_event(b + n, "metadata",
			 J("{'metrics':{'latencyMs':412},'p':'abcdef','usage':{'cacheReadInputTokens':100,"
			   "'cacheWriteInputTokens':20,'inputTokens':11,'outputTokens':7,'totalTokens':138}}"));
	static const enum token_kind want[] = { TOKEN_NONE, TOKEN_REASONING, TOKEN_NONE, TOKEN_NONE, TOKEN_ANSWER,
						TOKEN_NONE, TOKEN_NONE,	     TOKEN_TOOL, TOKEN_NONE, TOKEN_NONE };
	for (size_t cut = 0; cut <= n; cut++) {
		struct events e;
		const char *err;
		events_start(&e, API_BEDROCK_CONVERSE);
		frame_all(&e, b, n, cut, &err);
		assert_null(err);
		assert_int_equal(e.n, 10);
		for (int i = 0; i < 10; i++)
			assert_int_equal(e.token[i], want[i]);
		assert_string_equal(e.name[1], "contentBlockDelta");
		assert_int_equal(e.usage.input_tokens, 131); /* 11 + 100 read + 20 written */
		assert_int_equal(e.usage.cached_tokens, 100);
		assert_int_equal(e.usage.cache_write_tokens, 20);
		assert_int_equal(e.usage.output_tokens, 7);
		assert_int_equal(e.usage.server.source, SERVER_BEDROCK);
		assert_int_equal(e.usage.server.inference_ns, 412000000);
		assert_int_equal(e.usage.server.first_byte_ns, -1);
		assert_int_equal(e.usage.outcome, OUTCOME_NONE);
	}
}

static void test_invoke_classified(void **state)
{
	(void)state;
	static unsigned char b[16384];
	size_t n = 0;
	n += build_chunk(b + n, J("{'type':'message_start','message':{'id':'msg_1','type':'message','role':'assistant',"
				  "'model':'claude','content':[],'usage':{'input_tokens':9,'cache_read_input_tokens':4,"
				  "'output_tokens':1}}}"));
	n += build_chunk(b + n,
			 J("{'type':'content_block_start','index':0,'content_block':{'type':'text','text':''}}"));
	n += build_chunk(b + n,
			 J("{'type':'content_block_delta','index':0,'delta':{'type':'text_delta','text':'Hi'}}"));
	n += build_chunk(b + n,
			 J("{'type':'content_block_delta','index':0,'delta':{'type':'text_delta','text':' there?'}}"));
	n += build_chunk(b + n, J("{'type':'content_block_stop','index':0}"));
	n += build_chunk(b + n, J("{'type':'message_delta','delta':{'stop_reason':'end_turn'},'usage':{'output_tokens':"
				  "3}}"));
	n += build_chunk(b + n, J("{'type':'message_stop','amazon-bedrock-invocationMetrics':{'inputTokenCount':9,"
				  "'outputTokenCount':3,'invocationLatency':731,'firstByteLatency':204}}"));
	static const enum token_kind want[] = { TOKEN_NONE, TOKEN_NONE, TOKEN_ANSWER, TOKEN_ANSWER,
						TOKEN_NONE, TOKEN_NONE, TOKEN_NONE };
	for (size_t cut = 0; cut <= n; cut++) {
		struct events e;
		const char *err;
		events_start(&e, API_BEDROCK_INVOKE);
		frame_all(&e, b, n, cut, &err);
		assert_null(err);
		assert_int_equal(e.n, 7);
		for (int i = 0; i < 7; i++)
			assert_int_equal(e.token[i], want[i]);
		assert_string_equal(e.name[2], "chunk");
		assert_string_equal(
			e.data[2],
			J("{'type':'content_block_delta','index':0,'delta':{'type':'text_delta','text':'Hi'}}"));
		assert_int_equal(e.usage.input_tokens, 13); /* 9 + the 4 read from the cache */
		assert_int_equal(e.usage.cached_tokens, 4);
		assert_int_equal(e.usage.output_tokens, 3);
		assert_int_equal(e.usage.server.source, SERVER_BEDROCK);
		assert_int_equal(e.usage.server.first_byte_ns, 204000000);
		assert_int_equal(e.usage.server.inference_ns, 731000000);
	}
}

/* The other families InvokeModel streams, one chunk each. */
static void test_invoke_families(void **state)
{
	(void)state;
	static const struct {
		const char *inner;
		enum token_kind want;
		int64_t in, out;
	} cases[] = {
		{ "{'generation':' Hello','prompt_token_count':12,'generation_token_count':1,'stop_reason':null}",
		  TOKEN_ANSWER, 12, 1 },
		{ "{'generation':'','prompt_token_count':null,'generation_token_count':5,'stop_reason':'stop'}",
		  TOKEN_NONE, -1, 5 },
		{ "{'outputText':'Hi','index':0,'totalOutputTextTokenCount':2,'completionReason':null,"
		  "'inputTextTokenCount':6}",
		  TOKEN_ANSWER, 6, 2 },
		{ "{'outputs':[{'text':' word','stop_reason':null}]}", TOKEN_ANSWER, -1, -1 },
		{ "{'contentBlockDelta':{'delta':{'text':'Nova'},'contentBlockIndex':0}}", TOKEN_ANSWER, -1, -1 },
		{ "{'contentBlockDelta':{'delta':{'reasoningContent':{'text':'hm'}},'contentBlockIndex':0}}",
		  TOKEN_REASONING, -1, -1 },
		{ "{'metadata':{'usage':{'inputTokens':5,'outputTokens':8}}}", TOKEN_NONE, 5, 8 },
		{ "{'is_finished':false,'event_type':'text-generation','text':'co'}", TOKEN_ANSWER, -1, -1 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		unsigned char b[4096];
		size_t n = build_chunk(b, J(cases[i].inner));
		struct events e;
		const char *err;
		events_start(&e, API_BEDROCK_INVOKE);
		frame_all(&e, b, n, n / 2, &err);
		assert_null(err);
		assert_int_equal(e.n, 1);
		assert_int_equal(e.token[0], cases[i].want);
		assert_int_equal(e.usage.input_tokens, cases[i].in);
		assert_int_equal(e.usage.output_tokens, cases[i].out);
	}
}

static void test_exceptions(void **state)
{
	(void)state;
	static unsigned char b[4096];
	for (int api = 0; api < 2; api++) {
		size_t n = 0;
		n += build_event(
			b + n, api ? "chunk" : "contentBlockDelta",
			api ? "{\"bytes\":\"eyJ0eXBlIjoiY29udGVudF9ibG9ja19kZWx0YSIsImRlbHRhIjp7InRleHQiOiJhIn19\"}"
			    : J("{'delta':{'text':'a'}}"));
		n += build_exception(b + n, "throttlingException", J("{'message':'Too many requests, please wait'}"));
		struct events e;
		const char *err;
		events_start(&e, api ? API_BEDROCK_INVOKE : API_BEDROCK_CONVERSE);
		frame_all(&e, b, n, 5, &err);
		assert_null(err);
		assert_int_equal(e.n, 2);
		assert_int_equal(e.token[0], TOKEN_ANSWER);
		assert_string_equal(e.name[1], "throttlingException");
		assert_true(e.exception[1]);
		assert_false(e.exception[0]);
		assert_int_equal(e.token[1], TOKEN_NONE);
		assert_int_equal(e.usage.outcome, OUTCOME_FAILED);
	}
	/* an unmodelled error (:message-type error, :error-code) as well, its
	 * payload not even JSON */
	struct hdrs h = { .n = 0 };
	hdr_str(&h, ":message-type", "error");
	hdr_str(&h, ":error-code", "InternalFailure");
	hdr_str(&h, ":error-message", "boom");
	size_t n = build(b, &h, "", 0);
	struct events e;
	const char *err;
	events_start(&e, API_BEDROCK_CONVERSE);
	frame_all(&e, b, n, 0, &err);
	assert_int_equal(e.n, 1);
	assert_string_equal(e.name[0], "InternalFailure");
	assert_int_equal(e.usage.outcome, OUTCOME_FAILED);
}

static void test_framer_error(void **state)
{
	(void)state;
	static unsigned char b[4096];
	size_t n = build_event(b, "contentBlockDelta", J("{'delta':{'text':'a'}}"));
	size_t m = build_event(b + n, "contentBlockDelta", J("{'delta':{'text':'b'}}"));
	b[n + m - 2] ^= 1;
	struct events e;
	const char *err;
	events_start(&e, API_BEDROCK_CONVERSE);
	frame_all(&e, b, n + m, n + 3, &err);
	assert_non_null(err);
	assert_string_equal(err, "message_crc");
	assert_int_equal(e.n, 1);
	/* a chunk whose bytes are not base64: the payload as it came */
	n = build_event(b, "chunk", "{\"bytes\":\"not*base64\"}");
	events_start(&e, API_BEDROCK_INVOKE);
	frame_all(&e, b, n, 0, &err);
	assert_null(err);
	assert_int_equal(e.n, 1);
	assert_string_equal(e.data[0], "{\"bytes\":\"not*base64\"}");
	assert_int_equal(e.token[0], TOKEN_NONE);
	/* the content type picks the framer */
	assert_int_equal(framer_kind_for_content_type("application/vnd.amazon.eventstream", 34), FRAMER_EVENTSTREAM);
	assert_int_equal(framer_kind_for_content_type("Application/VND.Amazon.EventStream; x=1", 39),
			 FRAMER_EVENTSTREAM);
}

/* ---- paths ----------------------------------------------------------- */

static void test_paths(void **state)
{
	(void)state;
	static const struct {
		const char *path;
		enum api_kind api;
		bool streams;
		const char *model;
	} cases[] = {
		{ "/model/anthropic.claude-3-haiku-20240307-v1:0/converse-stream", API_BEDROCK_CONVERSE, true,
		  "anthropic.claude-3-haiku-20240307-v1:0" },
		{ "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse", API_BEDROCK_CONVERSE, false,
		  "anthropic.claude-3-haiku-20240307-v1:0" },
		{ "/model/meta.llama3-8b-instruct-v1%3A0/invoke-with-response-stream", API_BEDROCK_INVOKE, true,
		  "meta.llama3-8b-instruct-v1:0" },
		{ "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-v2/"
		  "invoke",
		  API_BEDROCK_INVOKE, false,
		  "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-v2" },
		{ "/model/arn:aws:bedrock:us-east-1:1:inference-profile/us.x/converse-stream", API_BEDROCK_CONVERSE,
		  true, "arn:aws:bedrock:us-east-1:1:inference-profile/us.x" },
		{ "/model/bad%zz%0a%ff/converse", API_BEDROCK_CONVERSE, false, "bad%zz\xef\xbf\xbd\xef\xbf\xbd" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *p = cases[i].path;
		size_t len = strlen(p), off, mlen;
		char model[REQINFO_MODEL_MAX];
		assert_int_equal(classify_api(p, len), cases[i].api);
		assert_int_equal(classify_path_streams(cases[i].api, p, len), cases[i].streams);
		assert_true(classify_bedrock_path_model(p, len, &off, &mlen));
		reqinfo_path_model(p + off, mlen, model, sizeof(model));
		assert_string_equal(model, cases[i].model);
	}
	/* not Bedrock */
	static const char *const others[] = { "/model//converse", "/model/x/converse-streamz", "/models/x/converse",
					      "/model/x", "/v1/messages" };
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
		size_t off, mlen;
		assert_false(classify_bedrock_path_model(others[i], strlen(others[i]), &off, &mlen));
		enum api_kind api = classify_api(others[i], strlen(others[i]));
		assert_true(api != API_BEDROCK_CONVERSE && api != API_BEDROCK_INVOKE);
	}
	/* a model longer than the record holds: cut at a character */
	char longp[600], model[REQINFO_MODEL_MAX];
	size_t n = (size_t)snprintf(longp, sizeof(longp), "/model/");
	for (int i = 0; i < 200; i++)
		n += (size_t)snprintf(longp + n, sizeof(longp) - n, "\xc3\xa9");
	reqinfo_path_model(longp + 7, n - 7, model, sizeof(model));
	assert_int_equal(strlen(model), 126);
	assert_string_equal(classify_api_name(API_BEDROCK_CONVERSE), "bedrock-converse");
	assert_string_equal(classify_api_name(API_BEDROCK_INVOKE), "bedrock-invoke");
	assert_string_equal(classify_server_name(SERVER_BEDROCK), "bedrock");
}

static void test_bodies(void **state)
{
	(void)state;
	struct usage u = USAGE_UNKNOWN;
	const char *b =
		J("{'metrics':{'latencyMs':250},'output':{'message':{'content':[{'text':'Hi'}],'role':'assistant'}},"
		  "'stopReason':'end_turn','usage':{'inputTokens':12,'outputTokens':3,'totalTokens':15}}");
	classify_body(API_BEDROCK_CONVERSE, b, strlen(b), &u);
	assert_int_equal(u.input_tokens, 12);
	assert_int_equal(u.output_tokens, 3);
	assert_int_equal(u.server.inference_ns, 250000000);
	u = USAGE_UNKNOWN;
	b = J("{'id':'msg_1','type':'message','content':[{'type':'text','text':'Hi'}],'usage':{'input_tokens':7,"
	      "'cache_read_input_tokens':2,'output_tokens':4}}");
	classify_body(API_BEDROCK_INVOKE, b, strlen(b), &u);
	assert_int_equal(u.input_tokens, 9);
	assert_int_equal(u.output_tokens, 4);
	u = USAGE_UNKNOWN;
	b = J("{'generation':'Hi','prompt_token_count':5,'generation_token_count':2,'stop_reason':'stop'}");
	classify_body(API_BEDROCK_INVOKE, b, strlen(b), &u);
	assert_int_equal(u.input_tokens, 5);
	assert_int_equal(u.output_tokens, 2);
	/* InvokeModel's latency header */
	struct server_timing t = SERVER_TIMING_UNKNOWN;
	classify_header("X-Amzn-Bedrock-Invocation-Latency", 33, " 812 ", 5, &t);
	assert_int_equal(t.inference_ns, 812000000);
	assert_int_equal(t.source, SERVER_BEDROCK);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_split_everywhere),
		cmocka_unit_test(test_bad_prelude_crc),
		cmocka_unit_test(test_bad_message_crc),
		cmocka_unit_test(test_lengths),
		cmocka_unit_test(test_headers_overrun),
		cmocka_unit_test(test_header_types),
		cmocka_unit_test(test_header_count),
		cmocka_unit_test(test_oversized_skipped),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_converse_classified),
		cmocka_unit_test(test_invoke_classified),
		cmocka_unit_test(test_invoke_families),
		cmocka_unit_test(test_exceptions),
		cmocka_unit_test(test_framer_error),
		cmocka_unit_test(test_paths),
		cmocka_unit_test(test_bodies),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
