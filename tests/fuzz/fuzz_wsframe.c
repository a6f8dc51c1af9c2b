/*
 * fuzz_wsframe.c — libFuzzer target: the WebSocket frame parser (wsframe.c)
 * on bytes cut at points the fuzzer chooses.
 *
 * Input layout: byte 0: bit 0 the direction (client frames, masked, or a
 * server's), bits 1-3 the frame limit (16 B .. 64 KiB or none), bits 4-6
 * the message limit likewise. Bytes 1-8 are piece lengths, used in turn to
 * cut the rest (0 means 1 byte). The rest is the stream.
 *
 * Checked: one piece and many take the same bytes (but for header bytes of
 * the bad frame taken before its header was whole), stop at the same error,
 * see the same frames, messages and payload bytes (unmasked, by digest);
 * the bytes taken end at a frame boundary when an error stops the stream;
 * no frame over the frame limit and no message over the message limit is
 * delivered; no control frame over 125 bytes; no hook after the error.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_check.h"
#include "wsframe.h"

#define NSPLIT 8

struct run {
	struct wsf_parser p;
	uint64_t digest, msg_bytes, frame_bytes;
	bool after_error;
};

static void on_frame(void *arg, const struct wsf_frame *f)
{
	struct run *r = arg;
	if (r->p.err)
		r->after_error = true;
	CHECK(!(f->opcode & 8) || f->len <= WSF_CONTROL_MAX);
	CHECK(!r->p.lim.max_frame || (f->opcode & 8) || f->len <= r->p.lim.max_frame);
	r->digest = fuzz_fnv(r->digest, &f->opcode, 1);
	r->digest = fuzz_fnv(r->digest, &f->len, sizeof(f->len));
	r->frame_bytes = 0;
}

static void on_payload(void *arg, const struct wsf_frame *f, const uint8_t *p, size_t n)
{
	struct run *r = arg;
	CHECK(n > 0 && n <= WSF_CHUNK);
	r->frame_bytes += n;
	CHECK(r->frame_bytes <= f->len);
	if (!(f->opcode & 8)) {
		r->msg_bytes += n;
		CHECK(!r->p.lim.max_message || r->msg_bytes <= r->p.lim.max_message);
	}
	r->digest = fuzz_fnv(r->digest, p, n);
}

static void on_frame_end(void *arg, const struct wsf_frame *f)
{
	struct run *r = arg;
	CHECK(r->frame_bytes == f->len);
	if (!(f->opcode & 8) && f->fin)
		r->msg_bytes = 0;
	r->digest = fuzz_fnv(r->digest, "E", 1);
}

static const struct wsf_hooks hooks = { .frame = on_frame, .payload = on_payload, .frame_end = on_frame_end };

static const uint64_t limits[8] = { 0, 16, 125, 126, 1000, 65535, 65536, 1u << 20 };

static size_t drive(struct run *r, bool client, const struct wsf_limits *lim, const uint8_t *buf, size_t len,
		    const uint8_t *cuts)
{
	size_t at = 0, k = 0;

	memset(r, 0, sizeof(*r));
	r->digest = FUZZ_FNV_SEED;
	wsf_init(&r->p, client, lim, &hooks, r);
	while (at < len) {
		size_t n = len - at;
		if (cuts) {
			size_t c = cuts[k++ % NSPLIT];
			c = c ? c : 1;
			n = n < c ? n : c;
		}
		size_t bnd = 0, took = wsf_feed(&r->p, buf + at, n, &bnd);
		CHECK(took <= n && bnd <= took);
		if (r->p.err)
			CHECK(bnd == took); /* stopped at a frame boundary */
		at += took;
		if (took < n)
			break;
	}
	return at;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct run one, many;

	if (size < 1 + NSPLIT)
		return 0;
	bool client = data[0] & 1;
	struct wsf_limits lim = { limits[(data[0] >> 1) & 7], limits[(data[0] >> 4) & 7] };
	const uint8_t *cuts = data + 1, *body = data + 1 + NSPLIT;
	size_t len = size - 1 - NSPLIT;

	size_t a = drive(&one, client, &lim, body, len, NULL);
	size_t b = drive(&many, client, &lim, body, len, cuts);
	CHECK(one.p.err == many.p.err);
	/* in pieces, header bytes of the bad frame taken by an earlier call
	 * stay taken (wsf_feed), and only then */
	if (one.p.err)
		CHECK(b == a || (many.p.err_split && b > a && b - a < WSF_HEADER_MAX));
	else
		CHECK(a == b);
	CHECK(one.p.frames == many.p.frames && one.p.messages == many.p.messages);
	CHECK(one.digest == many.digest);
	CHECK(!one.after_error && !many.after_error);
	CHECK(one.p.err || a == len);
	return 0;
}
