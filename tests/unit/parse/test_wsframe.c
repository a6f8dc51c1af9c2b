/*
 * test_wsframe.c — the WebSocket frame parser (wsframe.c): frames built here
 * (masked client frames, unmasked server ones, 7-, 16- and 64-bit lengths),
 * fed whole, cut at every byte and one byte at a time; fragmented messages
 * with control frames between their fragments; every rule the parser
 * enforces broken once (reserved opcode, wrong masking, long or fragmented
 * control frames, stray or interleaved continuations, the 64-bit length's
 * top bit, the frame and message limits), each named and its frame not
 * taken; the close frame it writes, masked and not.
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

#include "wsframe.h"

/* ---- building frames -------------------------------------------------- */

static const uint8_t MASK[4] = { 0x37, 0xfa, 0x21, 0x3d };

/* One frame onto buf at *len. */
static void put_frame(uint8_t *buf, size_t *len, bool fin, uint8_t op, const void *payload, size_t n, bool masked)
{
	uint8_t *p = buf + *len;
	size_t off = 2;

	p[0] = (uint8_t)((fin ? 0x80 : 0) | op);
	if (n < 126) {
		p[1] = (uint8_t)n;
	} else if (n < 65536) {
		p[1] = 126;
		p[2] = (uint8_t)(n >> 8);
		p[3] = (uint8_t)n;
		off = 4;
	} else {
		p[1] = 127;
		for (int i = 0; i < 8; i++)
			p[2 + i] = (uint8_t)((uint64_t)n >> (56 - 8 * i));
		off = 10;
	}
	if (masked) {
		p[1] |= 0x80;
		memcpy(p + off, MASK, 4);
		off += 4;
	}
	for (size_t i = 0; i < n; i++)
		p[off + i] = ((const uint8_t *)payload)[i] ^ (masked ? MASK[i & 3] : 0);
	*len += off + n;
}

/* ---- what the hooks saw ------------------------------------------------ */

struct seen {
	char text[1 << 18]; /* data payload, messages separated by '|' */
	size_t text_len;
	char ctl[256]; /* control opcodes in order, as hex digits */
	size_t nctl;
	unsigned frames, ends, msg_ends;
};

static void on_frame(void *arg, const struct wsf_frame *f)
{
	struct seen *s = arg;
	s->frames++;
	if (f->opcode & 8)
		s->ctl[s->nctl++] = "0123456789abcdef"[f->opcode];
}

static void on_payload(void *arg, const struct wsf_frame *f, const uint8_t *p, size_t n)
{
	struct seen *s = arg;
	if (f->opcode & 8)
		return;
	assert_true(s->text_len + n < sizeof(s->text));
	memcpy(s->text + s->text_len, p, n);
	s->text_len += n;
}

static void on_frame_end(void *arg, const struct wsf_frame *f)
{
	struct seen *s = arg;
	s->ends++;
	if (!(f->opcode & 8) && f->fin) {
		s->msg_ends++;
		s->text[s->text_len++] = '|';
	}
}

static const struct wsf_hooks hooks = { .frame = on_frame, .payload = on_payload, .frame_end = on_frame_end };

/* Feeds `buf` in pieces of `step` bytes (0: whole); returns bytes taken. */
static size_t run(struct wsf_parser *p, struct seen *s, bool from_client, const struct wsf_limits *lim,
		  const uint8_t *buf, size_t len, size_t step)
{
	size_t at = 0;

	memset(s, 0, sizeof(*s));
	wsf_init(p, from_client, lim, &hooks, s);
	while (at < len) {
		size_t n = step && len - at > step ? step : len - at;
		size_t took = wsf_feed(p, buf + at, n, NULL);
		at += took;
		if (took < n)
			break;
	}
	return at;
}

static uint8_t big[300000];

static void test_messages_any_cut(void **state)
{
	static uint8_t buf[400000];
	static char payload[70000];
	size_t len = 0;
	(void)state;

	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (char)('a' + i % 26);
	put_frame(buf, &len, true, WSF_OP_TEXT, "hello", 5, true);
	put_frame(buf, &len, false, WSF_OP_TEXT, "frag", 4, true);
	put_frame(buf, &len, true, WSF_OP_PING, "p", 1, true); /* between fragments */
	put_frame(buf, &len, false, WSF_OP_CONT, "ment", 4, true);
	put_frame(buf, &len, true, WSF_OP_PONG, "", 0, true);
	put_frame(buf, &len, true, WSF_OP_CONT, "ed", 2, true);
	put_frame(buf, &len, true, WSF_OP_BINARY, payload, 300, true); /* 16-bit length */
	put_frame(buf, &len, true, WSF_OP_TEXT, payload, 70000, true); /* 64-bit length */
	put_frame(buf, &len, true, WSF_OP_TEXT, "", 0, true);
	put_frame(buf, &len, true, WSF_OP_CLOSE, "\x03\xe8", 2, true);

	char want[80000];
	size_t wl = 0;
	wl += (size_t)sprintf(want, "hello|fragmented|");
	memcpy(want + wl, payload, 300), wl += 300, want[wl++] = '|';
	memcpy(want + wl, payload, 70000), wl += 70000, want[wl++] = '|';
	want[wl++] = '|';

	static struct seen s;
	struct wsf_parser p;
	const size_t steps[] = { 0, 1, 2, 3, 7, 13, 4096 };
	for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
		assert_int_equal(run(&p, &s, true, NULL, buf, len, steps[k]), len);
		assert_int_equal(p.err, WSF_OK);
		assert_int_equal(s.text_len, wl);
		assert_memory_equal(s.text, want, wl);
		assert_int_equal(p.frames, 10);
		assert_int_equal(p.messages, 5);
		assert_int_equal(p.control_frames, 3);
		assert_int_equal(s.nctl, 3);
		assert_memory_equal(s.ctl, "9a8", 3);
		assert_true(wsf_at_boundary(&p));
	}
	/* every cut point in two pieces, for the frames before the big one */
	size_t small = 0;
	{
		size_t l = 0;
		put_frame(big, &l, true, WSF_OP_TEXT, "hello", 5, true);
		put_frame(big, &l, false, WSF_OP_TEXT, "frag", 4, true);
		put_frame(big, &l, true, WSF_OP_PING, "p", 1, true);
		put_frame(big, &l, true, WSF_OP_CONT, "ment", 4, true);
		small = l;
	}
	for (size_t cut = 0; cut <= small; cut++) {
		memset(&s, 0, sizeof(s));
		wsf_init(&p, true, NULL, &hooks, &s);
		assert_int_equal(wsf_feed(&p, big, cut, NULL), cut);
		assert_int_equal(wsf_feed(&p, big + cut, small - cut, NULL), small - cut);
		assert_int_equal(s.text_len, strlen("hello|fragment|"));
		assert_memory_equal(s.text, "hello|fragment|", s.text_len);
	}
}

static void test_server_frames(void **state)
{
	uint8_t buf[256];
	size_t len = 0, bnd = 0;
	static struct seen s;
	struct wsf_parser p;
	(void)state;

	put_frame(buf, &len, true, WSF_OP_TEXT, "{\"type\":\"x\"}", 12, false);
	size_t one = len;
	put_frame(buf, &len, true, WSF_OP_TEXT, "abc", 3, false);
	memset(&s, 0, sizeof(s));
	wsf_init(&p, false, NULL, &hooks, &s);
	/* a cut inside the second frame: the boundary is after the first */
	assert_int_equal(wsf_feed(&p, buf, one + 2, &bnd), one + 2);
	assert_int_equal(bnd, one);
	assert_false(wsf_at_boundary(&p));
	assert_int_equal(wsf_feed(&p, buf + one + 2, len - one - 2, &bnd), len - one - 2);
	assert_int_equal(bnd, len - one - 2);
	assert_true(wsf_at_boundary(&p));
	assert_int_equal(p.messages, 2);
}

/* `bad` after a good frame: the good one taken, `e` named, nothing more. */
static void expect_error(bool from_client, const struct wsf_limits *lim, const uint8_t *bad, size_t badlen,
			 enum wsf_error e)
{
	uint8_t buf[512];
	size_t len = 0, bnd = 7;
	static struct seen s;
	struct wsf_parser p;

	put_frame(buf, &len, true, WSF_OP_TEXT, "ok", 2, from_client);
	size_t good = len;
	memcpy(buf + len, bad, badlen);
	len += badlen;
	for (size_t step = 0; step < 3; step++) {
		/* in pieces, header bytes of the bad frame taken by an earlier
		 * call stay taken: at most WSF_HEADER_MAX - 1 of them */
		size_t took = run(&p, &s, from_client, lim, buf, len, step);
		assert_true(step ? took >= good && took < good + WSF_HEADER_MAX : took == good);
		assert_int_equal(p.err, e);
		assert_int_equal(p.messages, 1);
	}
	wsf_init(&p, from_client, lim, NULL, NULL);
	assert_int_equal(wsf_feed(&p, buf, len, &bnd), good);
	assert_int_equal(bnd, good);
	assert_int_equal(wsf_feed(&p, buf, len, &bnd), 0); /* nothing after an error */
	assert_string_not_equal(wsf_error_name(e), "unknown");
}

static void test_errors(void **state)
{
	uint8_t b[64];
	size_t n;
	(void)state;

	n = 0, put_frame(b, &n, true, 0x3, "x", 1, true);
	expect_error(true, NULL, b, n, WSF_ERR_OPCODE);
	n = 0, put_frame(b, &n, true, 0xB, "x", 1, true);
	expect_error(true, NULL, b, n, WSF_ERR_OPCODE);
	n = 0, put_frame(b, &n, true, WSF_OP_TEXT, "x", 1, false); /* a client's, unmasked */
	expect_error(true, NULL, b, n, WSF_ERR_MASK);
	n = 0, put_frame(b, &n, true, WSF_OP_TEXT, "x", 1, true); /* a server's, masked */
	expect_error(false, NULL, b, n, WSF_ERR_MASK);
	n = 0, put_frame(b, &n, false, WSF_OP_PING, "x", 1, true);
	expect_error(true, NULL, b, n, WSF_ERR_CONTROL_FRAGMENT);
	static const uint8_t longping[] = { 0x89, 0x80 | 126, 0x00, 126, 1, 2, 3, 4 };
	expect_error(true, NULL, longping, sizeof(longping), WSF_ERR_CONTROL_LENGTH);
	n = 0, put_frame(b, &n, true, WSF_OP_CONT, "x", 1, true);
	expect_error(true, NULL, b, n, WSF_ERR_CONTINUATION);
	n = 0, put_frame(b, &n, false, WSF_OP_TEXT, "x", 1, true), put_frame(b, &n, true, WSF_OP_TEXT, "y", 1, true);
	{
		/* the fragment is taken, the interloper not */
		uint8_t buf[128];
		size_t len = 0;
		static struct seen s;
		struct wsf_parser p;
		put_frame(buf, &len, false, WSF_OP_TEXT, "x", 1, true);
		size_t good = len;
		put_frame(buf, &len, true, WSF_OP_BINARY, "y", 1, true);
		assert_int_equal(run(&p, &s, true, NULL, buf, len, 0), good);
		assert_int_equal(p.err, WSF_ERR_INTERLEAVED);
	}
	static const uint8_t toplen[] = { 0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 1 };
	expect_error(false, NULL, toplen, sizeof(toplen), WSF_ERR_LENGTH);
	struct wsf_limits lim = { .max_frame = 10, .max_message = 16 };
	n = 0, put_frame(b, &n, true, WSF_OP_TEXT, "0123456789a", 11, true);
	expect_error(true, &lim, b, n, WSF_ERR_FRAME_TOO_BIG);
	assert_int_equal(wsf_error_close_code(WSF_ERR_FRAME_TOO_BIG), 1009);
	n = 0, put_frame(b, &n, false, WSF_OP_TEXT, "0123456789", 10, true),
	put_frame(b, &n, true, WSF_OP_CONT, "0123456", 7, true);
	{
		uint8_t buf[128];
		size_t len = 0;
		static struct seen s;
		struct wsf_parser p;
		put_frame(buf, &len, false, WSF_OP_TEXT, "0123456789", 10, true);
		size_t good = len;
		put_frame(buf, &len, true, WSF_OP_CONT, "0123456", 7, true);
		assert_int_equal(run(&p, &s, true, &lim, buf, len, 0), good);
		assert_int_equal(p.err, WSF_ERR_MESSAGE_TOO_BIG);
		assert_int_equal(wsf_error_close_code(p.err), 1009);
		/* a message of exactly the limit passes, a ping between */
		len = 0;
		put_frame(buf, &len, false, WSF_OP_TEXT, "0123456789", 10, true);
		put_frame(buf, &len, true, WSF_OP_PING, "", 0, true);
		put_frame(buf, &len, true, WSF_OP_CONT, "012345", 6, true);
		assert_int_equal(run(&p, &s, true, &lim, buf, len, 1), len);
		assert_int_equal(p.err, WSF_OK);
	}
	assert_int_equal(wsf_error_close_code(WSF_ERR_MASK), 1002);
}

static void test_close_frame(void **state)
{
	uint8_t out[WSF_HEADER_MAX + WSF_CONTROL_MAX];
	static struct seen s;
	struct wsf_parser p;
	char reason[300];
	(void)state;

	size_t n = wsf_close_frame(out, 1009, "message too big", NULL);
	assert_int_equal(n, 2 + 2 + 15);
	assert_int_equal(out[0], 0x88);
	assert_int_equal(out[2], 1009 >> 8);
	assert_int_equal(out[3], 1009 & 0xff);
	assert_memory_equal(out + 4, "message too big", 15);
	assert_int_equal(run(&p, &s, false, NULL, out, n, 1), n);
	assert_int_equal(p.control_frames, 1);
	/* masked, and a reason cut to fit */
	memset(reason, 'r', sizeof(reason) - 1);
	reason[sizeof(reason) - 1] = 0;
	n = wsf_close_frame(out, 1002, reason, MASK);
	assert_int_equal(n, 2 + 4 + WSF_CONTROL_MAX);
	assert_int_equal(run(&p, &s, true, NULL, out, n, 0), n);
	assert_int_equal(p.err, WSF_OK);
	assert_int_equal(out[6] ^ MASK[0], 1002 >> 8);
	assert_int_equal(out[7] ^ MASK[1], 1002 & 0xff);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_messages_any_cut),
		cmocka_unit_test(test_server_frames),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_close_frame),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
