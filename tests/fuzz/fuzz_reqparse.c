/*
 * fuzz_reqparse.c — libFuzzer target: a client byte stream through
 * src/parse/reqparse.c, the request parser client.c drives (llhttp as Debian
 * builds it, plus every check and limit tokentap applies to a request), with
 * hooks that record what client.c would be handed instead of dispatching it.
 *
 * Input layout: byte 0 picks the limits (bits 0-1: head 256 B .. 32 KiB;
 * bit 2: 4 or 100 headers; bits 3-4: body 0 .. 32 MiB) and bit 5 makes the
 * second request's begin hook fail as an allocation would; bytes 1-8 are
 * piece lengths used in turn to cut the rest, as TCP reads would (0 means
 * 1 byte); the rest is what a client sent. Each message end pauses the
 * parser, as in client.c, and the next pipelined request parses after a
 * resume.
 *
 * Checked: nothing crashes; hooks come in order (head, then chunks and body,
 * then the end); the head does not change after it was handed over (trailer
 * fields are not added to it); every accepted request respects the limits; a body with a
 * declared length has exactly that length; a refusal carries one of the
 * documented statuses and a reason; the stream parsed in one piece and in
 * pieces yields the same requests (method, version, URL, headers, body,
 * byte for byte) and ends the same way (accepted or refused). And what
 * docs/security.md promises of every request that reaches an upstream: no
 * Content-Length with Transfer-Encoding, at most one Content-Length, a
 * single "chunked" coding and only in HTTP/1.1, one Host and not a list
 * (required in HTTP/1.1), header names of token characters and values
 * without CR, LF or other control characters (no obs-fold), an origin-form
 * target of printable ASCII, no CONNECT, no Upgrade but h2c and websocket
 * (a bodiless HTTP/1.1 GET), no Expect but
 * 100-continue.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "reqparse.h"
#include "strutil.h"

#define NSPLIT 8
#define MAX_REQS 64

/* One parse of the whole input. */
struct parse {
	struct reqparse rp;
	struct reqhead head;
	bool fail_second_begin;
	/* the current request */
	unsigned begun;
	bool in_head, in_body;
	size_t head_len; /* the head as handed over, which must not change after */
	unsigned head_nhdr;
	uint64_t body_hash;
	/* results */
	unsigned nreq;
	uint64_t req_hash[MAX_REQS]; /* digest of each accepted request */
	bool failed;		     /* the stream ended in a refusal */
	int fail_status;
};

static unsigned header_count(const struct reqhead *h, const char *name)
{
	unsigned n = 0;
	for (unsigned i = 0; i < h->nhdr; i++)
		n += name_eq(h->buf + h->hdrs[i].name_off, h->hdrs[i].name_len, name);
	return n;
}

static bool value_is(const struct reqhead *h, const struct hdr *f, const char *lit)
{
	const char *v = h->buf + f->val_off;
	size_t n = f->val_len;
	while (n && (*v == ' ' || *v == '\t'))
		v++, n--;
	while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
		n--;
	return name_eq(v, n, lit);
}

static bool is_tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* What docs/security.md promises of every request tokentap forwards. */
static void check_policy(const struct reqhead *h)
{
	unsigned ncl = header_count(h, "content-length"), nte = header_count(h, "transfer-encoding");
	unsigned nhost = header_count(h, "host");
	const struct hdr *te = reqhead_header(h, "transfer-encoding");
	const struct hdr *host = reqhead_header(h, "host");
	const struct hdr *up = reqhead_header(h, "upgrade");
	const struct hdr *expect = reqhead_header(h, "expect");
	const char *url = h->buf + h->url_off;
	bool http11 = h->http_major == 1 && h->http_minor == 1;

	CHECK(h->http_major == 1);
	CHECK(h->http10 == (h->http_minor == 0));
	CHECK(ncl <= 1);
	CHECK(!(ncl && nte));
	CHECK(nte <= 1);
	CHECK(h->chunked == (nte == 1));
	if (te) {
		CHECK(http11);
		CHECK(value_is(h, te, "chunked"));
	}
	CHECK(nhost <= 1);
	CHECK(nhost == 1 || h->http_minor == 0);
	if (host)
		CHECK(!memchr(h->buf + host->val_off, ',', host->val_len));
	CHECK(h->method != HTTP_CONNECT);
	CHECK((h->url_len && url[0] == '/') || (h->url_len == 1 && url[0] == '*' && h->method == HTTP_OPTIONS));
	for (size_t k = 0; k < h->url_len; k++) /* strict mode: printable ASCII, no space */
		CHECK((unsigned char)url[k] > 0x20 && (unsigned char)url[k] < 0x7f);
	CHECK(!up || name_eq(h->buf + up->val_off, up->val_len, "h2c") ||
	      name_eq(h->buf + up->val_off, up->val_len, "websocket"));
	/* a WebSocket handshake: a bodiless HTTP/1.1 GET */
	CHECK(h->websocket == (up && name_eq(h->buf + up->val_off, up->val_len, "websocket")));
	if (h->websocket)
		CHECK(h->method == HTTP_GET && http11 && !h->chunked && h->content_length == 0);
	CHECK(!expect || name_eq(h->buf + expect->val_off, expect->val_len, "100-continue"));
	CHECK(h->send_continue == (expect && http11));
	for (unsigned i = 0; i < h->nhdr; i++) {
		const struct hdr *f = &h->hdrs[i];
		CHECK(f->name_len > 0);
		for (uint32_t k = 0; k < f->name_len; k++)
			CHECK(is_tchar((unsigned char)h->buf[f->name_off + k]));
		for (uint32_t k = 0; k < f->val_len; k++) {
			unsigned char c = (unsigned char)h->buf[f->val_off + k];
			CHECK((c >= 0x20 || c == '\t') && c != 0x7f); /* no CR, LF: no obs-fold */
		}
	}
}

static struct reqhead *on_begin(void *arg)
{
	struct parse *ps = arg;

	CHECK(!ps->in_head && !ps->in_body); /* the previous message ended */
	if (ps->fail_second_begin && ps->begun == 1)
		return NULL;
	ps->begun++;
	ps->in_head = true;
	ps->body_hash = FUZZ_FNV_SEED;
	return &ps->head;
}

static int on_head(void *arg, struct reqhead *h)
{
	struct parse *ps = arg;

	CHECK(h == &ps->head);
	CHECK(ps->in_head);
	ps->in_head = false;
	ps->in_body = true;
	/* What an accepted head holds. */
	CHECK(h->parsed);
	CHECK(h->len <= h->lim.max_header_size);
	CHECK(h->len <= h->cap);
	CHECK(h->nhdr <= h->lim.max_headers);
	CHECK(h->url_off + h->url_len <= h->len);
	for (unsigned i = 0; i < h->nhdr; i++) {
		CHECK((size_t)h->hdrs[i].name_off + h->hdrs[i].name_len <= h->len);
		CHECK((size_t)h->hdrs[i].val_off + h->hdrs[i].val_len <= h->len);
	}
	CHECK(h->content_length <= h->lim.max_body_size);
	CHECK(h->body_bytes == 0);
	check_policy(h);
	ps->head_len = h->len;
	ps->head_nhdr = h->nhdr;
	return 0;
}

static int on_chunk(void *arg)
{
	struct parse *ps = arg;

	CHECK(ps->in_body);
	CHECK(ps->head.chunked);
	return 0;
}

static void on_body(void *arg, const char *at, size_t len)
{
	struct parse *ps = arg;

	CHECK(ps->in_body);
	CHECK(len > 0);
	CHECK(ps->head.body_bytes <= ps->head.lim.max_body_size);
	ps->body_hash = fuzz_fnv(ps->body_hash, at, len);
}

static void on_complete(void *arg)
{
	struct parse *ps = arg;
	const struct reqhead *h = &ps->head;
	const struct hdr *cl = reqhead_header(h, "content-length");

	CHECK(ps->in_body);
	ps->in_body = false;
	CHECK(h->len == ps->head_len && h->nhdr == ps->head_nhdr); /* trailers are not kept */
	CHECK(h->body_bytes <= h->lim.max_body_size);
	if (cl) {
		/* the whole value: leading zeros are allowed, so it can be longer
		 * than any buffer for the number */
		uint64_t declared = 0;
		size_t i = 0;
		for (; i < cl->val_len && h->buf[cl->val_off + i] >= '0' && h->buf[cl->val_off + i] <= '9'; i++) {
			uint64_t d = (uint64_t)(h->buf[cl->val_off + i] - '0');
			CHECK(declared <= (UINT64_MAX - d) / 10);
			declared = declared * 10 + d;
		}
		for (; i < cl->val_len; i++) /* trailing whitespace, if kept */
			CHECK(h->buf[cl->val_off + i] == ' ' || h->buf[cl->val_off + i] == '\t');
		CHECK(declared == h->body_bytes);
		CHECK(h->content_length == h->body_bytes);
		/* llhttp counts content_length down to 0 while reading the body */
		CHECK(ps->rp.parser.content_length == 0);
	} else if (!h->chunked) {
		CHECK(h->body_bytes == 0);
	}

	uint64_t d = FUZZ_FNV_SEED;
	uint8_t meta[5] = { (uint8_t)h->method, h->http_major, h->http_minor, h->chunked, h->keep_alive };
	d = fuzz_fnv(d, meta, sizeof(meta));
	d = fuzz_fnv(d, h->buf, h->len); /* URL, names and values in order */
	for (unsigned i = 0; i < h->nhdr; i++)
		d = fuzz_fnv(d, &h->hdrs[i], sizeof(h->hdrs[i]));
	d = fuzz_fnv(d, &h->body_bytes, sizeof(h->body_bytes));
	d = fuzz_fnv(d, &ps->body_hash, sizeof(ps->body_hash));
	if (ps->nreq < MAX_REQS)
		ps->req_hash[ps->nreq] = d;
	ps->nreq++;
}

static const struct reqparse_hooks hooks = {
	.begin = on_begin,
	.head = on_head,
	.chunk = on_chunk,
	.body = on_body,
	.complete = on_complete,
};

static void run(struct parse *ps, const struct reqparse_limits *lim, bool fail_second_begin, const uint8_t *in,
		size_t len, const uint8_t *split)
{
	size_t off = 0;

	memset(ps, 0, sizeof(*ps));
	ps->fail_second_begin = fail_second_begin;
	CHECK(reqhead_init(&ps->head, lim) == 0);
	reqparse_init(&ps->rp, &hooks, ps);
	for (unsigned k = 0; off < len && k < 1u << 20; k++) {
		size_t piece = len - off, used = 0;
		if (split) {
			size_t want = split[k % NSPLIT] ? split[k % NSPLIT] : 1;
			piece = want < piece ? want : piece;
		}
		enum reqparse_status rs = reqparse_feed(&ps->rp, (const char *)in + off, piece, &used);
		CHECK(rs != REQPARSE_STOPPED); /* these hooks never stop it */
		if (rs == REQPARSE_REFUSED) {
			char msg[160];
			ps->failed = true;
			ps->fail_status = reqparse_refusal(&ps->rp, msg, sizeof(msg));
			CHECK(ps->fail_status == 400 || ps->fail_status == 413 || ps->fail_status == 414 ||
			      ps->fail_status == 417 || ps->fail_status == 431 || ps->fail_status == 501);
			CHECK(msg[0] != '\0');
			break;
		}
		CHECK(used <= piece);
		off += used;
		if (rs == REQPARSE_PAUSED) {
			CHECK(!ps->in_head && !ps->in_body);
			CHECK(ps->nreq == ps->begun);
			reqparse_resume(&ps->rp);
		} else {
			CHECK(used == piece);
		}
	}
	reqhead_free(&ps->head);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct parse whole, pieces;
	static const size_t head_sizes[4] = { 256, 1024, 4096, 32u << 10 };
	static const uint64_t body_sizes[4] = { 0, 16, 1024, 32u << 20 };
	struct reqparse_limits lim;

	if (size < 1 + NSPLIT)
		return 0;
	lim.max_header_size = head_sizes[data[0] & 3];
	lim.max_headers = (data[0] & 4) ? 4 : 100;
	lim.max_body_size = body_sizes[(data[0] >> 3) & 3];
	bool fail_second = (data[0] & 0x20) != 0;
	const uint8_t *split = data + 1;
	const uint8_t *in = data + 1 + NSPLIT;
	size_t len = size - 1 - NSPLIT;

	run(&whole, &lim, fail_second, in, len, NULL);
	run(&pieces, &lim, fail_second, in, len, split);

	CHECK(whole.nreq == pieces.nreq);
	size_t n = whole.nreq < MAX_REQS ? whole.nreq : MAX_REQS;
	CHECK(memcmp(whole.req_hash, pieces.req_hash, n * sizeof(whole.req_hash[0])) == 0);
	CHECK(whole.failed == pieces.failed);
	return 0;
}
