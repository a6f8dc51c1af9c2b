/*
 * fuzz_request.c — libFuzzer target: request parsing as tokentap does it,
 * llhttp (the build Debian ships) plus the checks of src/proxy.c's on_req_*
 * callbacks, with tokentap's limits.
 *
 * proxy.c's callbacks are static and wired to sockets, timers and the
 * upstream (headers-complete dispatches the request), so they cannot be
 * driven without a socket. Until proxy.c exposes a socket-free request parser
 * (docs/security.md, "Fuzzing"), this file restates their semantics: header
 * name characters (RFC 9110 tchar), control characters in values, the head
 * size limit over URL + names + values, the header count limit, CONNECT and
 * Upgrade (501), a declared body over the limit (413), Expect (417), the
 * body limit while reading, and a pause at each message end with the next
 * pipelined request parsed after a resume. Keep it in step with proxy.c.
 *
 * Input layout: byte 0 picks the limits (head 256 B .. 32 KiB, 4 or 100
 * headers, body 0 .. 32 MiB); bytes 1-8 are piece lengths used in turn to
 * cut the rest, as TCP reads would (0 means 1 byte); the rest is what a
 * client sent.
 *
 * Checked: nothing crashes; every accepted request respects the limits; a
 * body with a declared length has exactly that length; the stream parsed in
 * one piece and in pieces yields the same requests (method, version, URL,
 * headers, body, byte for byte) and ends the same way (accepted or refused).
 *
 * With -DFUZZ_REQUEST_POLICY the target also demands what docs/security.md
 * promises of an accepted request (no Content-Length with Transfer-Encoding,
 * one Content-Length, chunked last and only for HTTP/1.1, one Host, no obs-
 * fold): run it that way to find what llhttp lets through that proxy.c must
 * refuse itself.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <llhttp.h>

#include "fuzz_check.h"

#define NSPLIT 8
#define HEAD_MAX_CAP (32u << 10)
#define MAX_REQS 64

struct limits {
	size_t max_header_size;
	unsigned max_headers;
	uint64_t max_body_size;
};

struct hdr {
	uint32_t name_off, name_len, val_off, val_len;
};

/* One parse of the whole input: what proxy.c's request object holds. */
struct parse {
	const struct limits *lim;
	/* current request head */
	char hbuf[HEAD_MAX_CAP];
	size_t hlen;
	struct hdr hdrs[100];
	unsigned nhdr;
	size_t url_off, url_len;
	bool in_url, in_name;
	uint64_t body_bytes;
	uint64_t body_hash;
	int reject_status;
	/* results */
	unsigned nreq;
	uint64_t req_hash[MAX_REQS]; /* digest of each accepted request */
	bool failed;		     /* the stream ended in a refusal */
	int fail_status;	     /* 400 unless a callback chose */
};

static uint64_t fnv(uint64_t h, const void *p, size_t len)
{
	const unsigned char *s = p;
	for (size_t i = 0; i < len; i++)
		h = (h ^ s[i]) * 0x100000001b3ull;
	return h;
}

static int reject(struct parse *ps, int status)
{
	ps->reject_status = status;
	return -1;
}

static bool hbuf_append(struct parse *ps, const char *at, size_t len)
{
	if (ps->hlen + len > ps->lim->max_header_size)
		return false;
	memcpy(ps->hbuf + ps->hlen, at, len);
	ps->hlen += len;
	return true;
}

static bool is_tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool name_eq(const char *s, size_t len, const char *lit)
{
	return strlen(lit) == len && strncasecmp(s, lit, len) == 0;
}

static const struct hdr *header(const struct parse *ps, const char *name, unsigned *count)
{
	const struct hdr *first = NULL;
	unsigned n = 0;
	for (unsigned i = 0; i < ps->nhdr; i++)
		if (name_eq(ps->hbuf + ps->hdrs[i].name_off, ps->hdrs[i].name_len, name)) {
			if (!first)
				first = &ps->hdrs[i];
			n++;
		}
	if (count)
		*count = n;
	return first;
}

static int on_message_begin(llhttp_t *p)
{
	struct parse *ps = p->data;
	ps->hlen = ps->nhdr = 0;
	ps->url_off = ps->url_len = 0;
	ps->in_url = ps->in_name = false;
	ps->body_bytes = 0;
	ps->body_hash = 0xcbf29ce484222325ull;
	return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
	struct parse *ps = p->data;
	if (!ps->in_url) {
		ps->in_url = true;
		ps->url_off = ps->hlen;
	}
	if (!hbuf_append(ps, at, len))
		return reject(ps, 414);
	ps->url_len += len;
	return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct parse *ps = p->data;
	for (size_t i = 0; i < len; i++)
		if (!is_tchar((unsigned char)at[i]))
			return reject(ps, 400);
	if (!ps->in_name) {
		if (ps->nhdr == ps->lim->max_headers)
			return reject(ps, 431);
		ps->in_name = true;
		ps->hdrs[ps->nhdr] = (struct hdr){ (uint32_t)ps->hlen, 0, (uint32_t)ps->hlen, 0 };
		ps->nhdr++;
	}
	if (!hbuf_append(ps, at, len))
		return reject(ps, 431);
	ps->hdrs[ps->nhdr - 1].name_len += (uint32_t)len;
	return 0;
}

static int on_header_field_complete(llhttp_t *p)
{
	struct parse *ps = p->data;
	ps->in_name = false;
	ps->hdrs[ps->nhdr - 1].val_off = (uint32_t)ps->hlen;
	return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct parse *ps = p->data;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)at[i];
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return reject(ps, 400);
	}
	if (!hbuf_append(ps, at, len))
		return reject(ps, 431);
	ps->hdrs[ps->nhdr - 1].val_len += (uint32_t)len;
	return 0;
}

#ifdef FUZZ_REQUEST_POLICY
/* What docs/security.md promises about every request that reaches the
 * upstream; llhttp's strict mode should already hold most of it. */
static void check_policy(const struct parse *ps, llhttp_t *p)
{
	unsigned ncl, nte, nhost;
	const struct hdr *te = header(ps, "transfer-encoding", &nte);
	header(ps, "content-length", &ncl);
	header(ps, "host", &nhost);
	CHECK(ncl <= 1);
	CHECK(!(ncl && nte));
	CHECK(nte <= 1);
	CHECK(nhost <= 1);
	if (te) {
		CHECK(p->http_major == 1 && p->http_minor == 1);
		CHECK(name_eq(ps->hbuf + te->val_off, te->val_len, "chunked"));
	}
	for (unsigned i = 0; i < ps->nhdr; i++) {
		const char *v = ps->hbuf + ps->hdrs[i].val_off;
		for (uint32_t k = 0; k < ps->hdrs[i].val_len; k++)
			CHECK(v[k] != '\r' && v[k] != '\n');
	}
}
#endif

static int on_headers_complete(llhttp_t *p)
{
	struct parse *ps = p->data;
	const struct hdr *h;

	if (llhttp_get_method(p) == HTTP_CONNECT)
		return reject(ps, 501);
	h = header(ps, "upgrade", NULL);
	if (h && !name_eq(ps->hbuf + h->val_off, h->val_len, "h2c"))
		return reject(ps, 501);
	if ((p->flags & F_CONTENT_LENGTH) && p->content_length > ps->lim->max_body_size)
		return reject(ps, 413);
	h = header(ps, "expect", NULL);
	if (h && !name_eq(ps->hbuf + h->val_off, h->val_len, "100-continue"))
		return reject(ps, 417);
#ifdef FUZZ_REQUEST_POLICY
	check_policy(ps, p);
#endif
	/* What an accepted head holds. */
	CHECK(ps->hlen <= ps->lim->max_header_size);
	CHECK(ps->nhdr <= ps->lim->max_headers);
	return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct parse *ps = p->data;
	ps->body_bytes += len;
	if (ps->body_bytes > ps->lim->max_body_size)
		return reject(ps, 413);
	ps->body_hash = fnv(ps->body_hash, at, len);
	return 0;
}

static int on_message_complete(llhttp_t *p)
{
	struct parse *ps = p->data;
	if (p->flags & F_CONTENT_LENGTH) {
		unsigned ncl;
		const struct hdr *cl = header(ps, "content-length", &ncl);
		CHECK(cl != NULL);
		/* llhttp counts content_length down to 0 while reading the body */
		CHECK(p->content_length == 0);
		char num[32];
		size_t n = cl->val_len < sizeof(num) - 1 ? cl->val_len : sizeof(num) - 1;
		memcpy(num, ps->hbuf + cl->val_off, n);
		num[n] = '\0';
		if (ncl == 1)
			CHECK(strtoull(num, NULL, 10) == ps->body_bytes);
	}
	uint64_t h = 0xcbf29ce484222325ull;
	uint8_t meta[4] = { (uint8_t)llhttp_get_method(p), p->http_major, p->http_minor,
			    (uint8_t)((p->flags & F_CHUNKED) != 0) };
	h = fnv(h, meta, sizeof(meta));
	h = fnv(h, ps->hbuf, ps->hlen); /* URL, names and values in order */
	for (unsigned i = 0; i < ps->nhdr; i++)
		h = fnv(h, &ps->hdrs[i], sizeof(ps->hdrs[i]));
	h = fnv(h, &ps->body_bytes, sizeof(ps->body_bytes));
	h = fnv(h, &ps->body_hash, sizeof(ps->body_hash));
	if (ps->nreq < MAX_REQS)
		ps->req_hash[ps->nreq] = h;
	ps->nreq++;
	return HPE_PAUSED; /* as proxy.c: the next request waits for this response */
}

static llhttp_settings_t settings;

static void run(struct parse *ps, const struct limits *lim, const uint8_t *in, size_t len, const uint8_t *split)
{
	llhttp_t p;
	size_t off = 0;

	memset(ps, 0, offsetof(struct parse, nreq));
	ps->nreq = 0;
	ps->failed = false;
	ps->fail_status = 0;
	ps->lim = lim;
	llhttp_init(&p, HTTP_REQUEST, &settings);
	p.data = ps;
	for (unsigned k = 0; off < len && k < 1u << 20; k++) {
		size_t piece = len - off;
		if (split) {
			size_t want = split[k % NSPLIT] ? split[k % NSPLIT] : 1;
			piece = want < piece ? want : piece;
		}
		const char *at = (const char *)in + off;
		enum llhttp_errno e = llhttp_execute(&p, at, piece);
		if (e == HPE_PAUSED) {
			size_t used = (size_t)(llhttp_get_error_pos(&p) - at);
			CHECK(used <= piece);
			off += used;
			llhttp_resume(&p);
			continue;
		}
		if (e != HPE_OK) {
			ps->failed = true;
			ps->fail_status = ps->reject_status ? ps->reject_status : 400;
			return;
		}
		off += piece;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct parse whole, pieces;
	static const size_t head_sizes[4] = { 256, 1024, 4096, 32u << 10 };
	static const uint64_t body_sizes[4] = { 0, 16, 1024, 32u << 20 };
	struct limits lim;

	if (!settings.on_message_begin) {
		llhttp_settings_init(&settings);
		settings.on_message_begin = on_message_begin;
		settings.on_url = on_url;
		settings.on_header_field = on_header_field;
		settings.on_header_field_complete = on_header_field_complete;
		settings.on_header_value = on_header_value;
		settings.on_headers_complete = on_headers_complete;
		settings.on_body = on_body;
		settings.on_message_complete = on_message_complete;
	}
	if (size < 1 + NSPLIT)
		return 0;
	lim.max_header_size = head_sizes[data[0] & 3];
	lim.max_headers = (data[0] & 4) ? 4 : 100;
	lim.max_body_size = body_sizes[(data[0] >> 3) & 3];
	const uint8_t *split = data + 1;
	const uint8_t *in = data + 1 + NSPLIT;
	size_t len = size - 1 - NSPLIT;

	run(&whole, &lim, in, len, NULL);
	run(&pieces, &lim, in, len, split);

	CHECK(whole.nreq == pieces.nreq);
	size_t n = whole.nreq < MAX_REQS ? whole.nreq : MAX_REQS;
	CHECK(memcmp(whole.req_hash, pieces.req_hash, n * sizeof(whole.req_hash[0])) == 0);
	CHECK(whole.failed == pieces.failed);
	return 0;
}
