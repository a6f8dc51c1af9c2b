/*
 * reqparse.c — the client request parser: llhttp for requests plus the
 * checks tokentap adds before anything reaches an upstream.
 *
 * llhttp, built in strict mode (CMakeLists.txt), already refuses most
 * malformed framing; what it leaves, and tokentap refuses itself, is every
 * shape a server behind could read differently (request smuggling) and
 * every limit:
 *
 *   bytes ─▶ head_scan (bare CR/LF, obs-fold) ─▶ llhttp (strict) ─▶ on_* callbacks
 *            on_url / on_header_*: head size, header count, name and
 *                                  value characters
 *            on_headers_complete:  CONNECT, request_head_check (version,
 *                                  target, Host, Transfer-Encoding),
 *                                  Upgrade, declared body size, Expect;
 *                                  then hooks->head
 *            on_chunk_*:           chunk extension length; hooks->chunk;
 *                                  at the last chunk, a pause while
 *                                  head_scan takes the trailer section
 *            on_body:              body size; hooks->body
 *            on_message_complete:  hooks->complete, then a pause
 *
 * Invariants: a head that reaches hooks->head holds at most
 * lim.max_header_size bytes and lim.max_headers fields and has passed every
 * check; body bytes reach hooks->body only while the body is within
 * lim.max_body_size; a refusal is decided here, and the caller only answers
 * it. The parser pauses at each message end, so a pipelined request waits
 * until reqparse_resume.
 */
#include "reqparse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "strutil.h"

/* ---- the head ---- */

/* A head's header array starts this long and doubles as fields come, up to
 * lim.max_headers: a request holds room for the fields it has (most send a
 * dozen), not for the most it may have. */
#define HDRS_FIRST 16u

int reqhead_init(struct reqhead *h, const struct reqparse_limits *lim)
{
	memset(h, 0, sizeof(*h));
	h->lim = *lim;
	h->hdr_cap = lim->max_headers < HDRS_FIRST ? lim->max_headers : HDRS_FIRST;
	h->hdrs = calloc(h->hdr_cap, sizeof(*h->hdrs));
	return h->hdrs ? 0 : -1;
}

int reqhead_reset(struct reqhead *h, const struct reqparse_limits *lim)
{
	char *buf = h->buf;
	size_t cap = h->cap;
	struct hdr *hdrs = h->hdrs;
	unsigned hdr_cap = h->hdr_cap;

	if (!hdrs)
		return reqhead_init(h, lim);
	memset(h, 0, sizeof(*h));
	h->lim = *lim;
	h->buf = buf;
	h->cap = cap;
	h->hdrs = hdrs; /* room beyond a lowered max_headers is never used: the count stops there */
	h->hdr_cap = hdr_cap;
	return 0;
}

/* Room for one more field: the array doubled when full, up to
 * lim.max_headers. False when out of memory. */
static bool hdrs_room(struct reqhead *h)
{
	if (h->nhdr < h->hdr_cap)
		return true;
	unsigned cap = h->hdr_cap * 2 < h->lim.max_headers ? h->hdr_cap * 2 : h->lim.max_headers;
	struct hdr *p = realloc(h->hdrs, (size_t)cap * sizeof(*p));
	if (!p)
		return false;
	h->hdrs = p;
	h->hdr_cap = cap;
	return true;
}

void reqhead_free(struct reqhead *h)
{
	free(h->buf);
	free(h->hdrs);
	h->buf = NULL;
	h->hdrs = NULL;
	h->hdr_cap = 0;
	h->len = h->cap = 0;
	h->nhdr = 0;
}

static bool head_append(struct reqhead *h, const char *at, size_t len)
{
	size_t max = h->lim.max_header_size;

	if (h->len + len > max)
		return false;
	if (h->len + len > h->cap) {
		size_t cap = h->cap ? h->cap : 1024;
		while (cap < h->len + len)
			cap *= 2;
		if (cap > max)
			cap = max;
		char *p = realloc(h->buf, cap);
		if (!p)
			return false;
		h->buf = p;
		h->cap = cap;
	}
	memcpy(h->buf + h->len, at, len);
	h->len += len;
	return true;
}

const struct hdr *reqhead_header(const struct reqhead *h, const char *name)
{
	for (unsigned i = 0; i < h->nhdr; i++)
		if (name_eq(h->buf + h->hdrs[i].name_off, h->hdrs[i].name_len, name))
			return &h->hdrs[i];
	return NULL;
}

/* Whether `pred` holds for some token of the Connection headers the
 * parser counted (nconn, from conn_first); an empty token is none. */
static bool connection_token_any(const struct reqhead *h, bool (*pred)(const char *tok, size_t n, const void *arg),
				 const void *arg)
{
	unsigned left = h->nconn;

	for (unsigned i = h->conn_first; left && i < h->nhdr; i++) {
		const struct hdr *f = &h->hdrs[i];
		if (f->kind != HDR_CONNECTION)
			continue;
		left--;
		const char *v = h->buf + f->val_off, *end = v + f->val_len;
		while (v < end) {
			while (v < end && (*v == ' ' || *v == '\t' || *v == ','))
				v++;
			const char *tok = v;
			while (v < end && *v != ',' && *v != ' ' && *v != '\t')
				v++;
			if (v > tok && pred(tok, (size_t)(v - tok), arg))
				return true;
		}
	}
	return false;
}

struct token_name {
	const char *name;
	size_t len;
};

static bool token_is(const char *tok, size_t n, const void *arg)
{
	const struct token_name *t = arg;
	return n == t->len && strncasecmp(tok, t->name, n) == 0;
}

static bool token_not_plain(const char *tok, size_t n, const void *arg)
{
	(void)arg;
	return !(n == 5 && strncasecmp(tok, "close", 5) == 0) && !(n == 10 && strncasecmp(tok, "keep-alive", 10) == 0);
}

/* True when `name` appears as a token of the Connection header. Asked of
 * every header forwarded: only the Connection headers the parser counted
 * are looked at. */
static bool listed_in_connection(const struct reqhead *h, const char *name, size_t nlen)
{
	if (!h->nconn)
		return false;
	if (h->conn_plain) /* "keep-alive" is hop-by-hop anyway */
		return nlen == 5 && strncasecmp(name, "close", 5) == 0;
	return connection_token_any(h, token_is, &(struct token_name){ name, nlen });
}

/* Whether every token of the Connection headers is close or keep-alive
 * (what clients send): then listed_in_connection compares one name. */
static bool connection_plain(const struct reqhead *h)
{
	return !connection_token_any(h, token_not_plain, NULL);
}

enum hdr_kind reqhead_kind_of(const char *name, size_t len)
{
	/* by length, then the first letter: one comparison at most */
	const char *lit = NULL;
	enum hdr_kind k = HDR_OTHER;
	char c = len ? (char)(name[0] | 0x20) : 0;
	switch (len) {
	case 2: lit = "te", k = HDR_TE; break;
	case 4: lit = "host", k = HDR_HOST; break;
	case 6: lit = "expect", k = HDR_EXPECT; break;
	case 7:
		if (c == 'u')
			lit = "upgrade", k = HDR_UPGRADE;
		else
			lit = "trailer", k = HDR_TRAILER;
		break;
	case 10:
		if (c == 'c')
			lit = "connection", k = HDR_CONNECTION;
		else if (c == 'k')
			lit = "keep-alive", k = HDR_KEEP_ALIVE;
		else
			lit = "tracestate", k = HDR_TRACESTATE;
		break;
	case 11: lit = "traceparent", k = HDR_TRACEPARENT; break;
	case 12: lit = "x-request-id", k = HDR_X_REQUEST_ID; break;
	case 14: lit = "http2-settings", k = HDR_HTTP2_SETTINGS; break;
	case 16: lit = "proxy-connection", k = HDR_PROXY_CONNECTION; break;
	case 17: lit = "transfer-encoding", k = HDR_TRANSFER_ENCODING; break;
	default: break;
	}
	/* each name's length is its case's: the first letter, then the rest */
	return lit && c == lit[0] && strncasecmp(name, lit, len) == 0 ? k : HDR_OTHER;
}

/* The fixed hop-by-hop headers (RFC 9110 7.6.1, and those of the protocols
 * tokentap ends: keep-alive, proxy-connection, HTTP/2's settings, Expect). */
static bool kind_hop(enum hdr_kind k)
{
	switch (k) {
	case HDR_TE:
	case HDR_EXPECT:
	case HDR_UPGRADE:
	case HDR_TRAILER:
	case HDR_CONNECTION:
	case HDR_KEEP_ALIVE:
	case HDR_HTTP2_SETTINGS:
	case HDR_PROXY_CONNECTION:
	case HDR_TRANSFER_ENCODING: return true;
	default: return false;
	}
}

const struct hdr *reqhead_kind(const struct reqhead *h, enum hdr_kind k)
{
	for (unsigned i = 0; i < h->nhdr; i++)
		if (h->hdrs[i].kind == (uint32_t)k)
			return &h->hdrs[i];
	return NULL;
}

bool reqhead_hop_by_hop(const struct reqhead *h, const char *name, size_t len)
{
	return kind_hop(reqhead_kind_of(name, len)) || listed_in_connection(h, name, len);
}

bool reqhead_field_hop_by_hop(const struct reqhead *h, unsigned i)
{
	const struct hdr *f = &h->hdrs[i];
	return kind_hop((enum hdr_kind)f->kind) || listed_in_connection(h, h->buf + f->name_off, f->name_len);
}

/* ---- llhttp callbacks ---- */

static int reject(struct reqparse *rp, int status, const char *msg)
{
	rp->reject_status = status;
	rp->reject_msg = msg;
	return -1;
}

/* A hook's answer: -1 stops the parse without a refusal of ours. */
static int hook_result(struct reqparse *rp, int rc)
{
	if (rc == -1)
		rp->stopped = true;
	return rc == -1 ? -1 : 0;
}

static int on_message_begin(llhttp_t *p)
{
	struct reqparse *rp = p->data;
	struct reqhead *h = rp->hooks->begin(rp->arg);

	rp->head = h;
	if (!h)
		return -1;
	h->len = 0;
	h->nhdr = 0;
	h->nconn = h->conn_first = 0;
	h->conn_plain = false;
	h->url_off = h->url_len = 0;
	h->in_url = h->in_name = false;
	h->parsed = false;
	h->body_bytes = 0;
	h->chunk_ext = 0;
	h->trailer_len = h->trailer_name = 0;
	return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
	struct reqparse *rp = p->data;
	struct reqhead *h = rp->head;

	if (!h->in_url) {
		h->in_url = true;
		h->url_off = h->len;
	}
	if (!head_append(h, at, len))
		return reject(rp, 414, "request URL too long");
	h->url_len += len;
	return 0;
}

/* RFC 9110 token characters, one table lookup a byte. The llhttp build
 * Debian ships tolerates some others (a space before the colon, for one);
 * tokentap does not, since a server behind it may read such a header
 * differently. */
static const bool tchar[256] = {
	['a' ... 'z'] = true, ['A' ... 'Z'] = true, ['0' ... '9'] = true, ['!'] = true, ['#'] = true, ['$'] = true,
	['%'] = true,	      ['&'] = true,	    ['\''] = true,	  ['*'] = true, ['+'] = true, ['-'] = true,
	['.'] = true,	      ['^'] = true,	    ['_'] = true,	  ['`'] = true, ['|'] = true, ['~'] = true,
};

/* Whether (at, len) holds a control character a field value may not: below
 * 0x20 but for tab, or DEL. Eight bytes a step where loads of them are
 * cheap: a word with no byte below 0x20 and none 0x7f passes at once, one
 * that might have one is looked at byte by byte. */
static bool value_has_control(const char *at, size_t len)
{
	size_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
	for (; i + 8 <= len; i += 8) {
		uint64_t w, d;
		memcpy(&w, at + i, 8);
		d = w ^ (ones * 0x7f);
		/* a byte below 0x20, or one equal to 0x7f, sets its high bit
		 * (and may set others: only a clean word is let through) */
		if ((((w - ones * 0x20) & ~w) | ((d - ones) & ~d)) & highs)
			break;
	}
#endif
	for (; i < len; i++) {
		unsigned char c = (unsigned char)at[i];
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return true;
	}
	return false;
}

/* Trailer fields (after a chunked body) pass the same character checks and
 * count against the head size, but are not kept: the head was checked, and
 * may have gone upstream, before they arrived, and tokentap ends the body it
 * forwards with its own last chunk. Kept, they would join the head that a
 * later write (routing that waited for the body, a failover) sends. */
static int on_trailer_bytes(struct reqparse *rp, size_t len, bool name)
{
	struct reqhead *h = rp->head;

	h->trailer_len += len;
	if (name)
		h->trailer_name += len;
	if (h->trailer_len > h->lim.max_header_size)
		return reject(rp, 431, "request trailer fields too large");
	return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct reqparse *rp = p->data;
	struct reqhead *h = rp->head;

	for (size_t i = 0; i < len; i++)
		if (!tchar[(unsigned char)at[i]])
			return reject(rp, 400, "invalid character in a request header name");
	if (h->parsed)
		return on_trailer_bytes(rp, len, true);

	if (!h->in_name) {
		if (h->nhdr == h->lim.max_headers)
			return reject(rp, 431, "too many request header fields");
		if (!hdrs_room(h))
			return reject(rp, 431, "request header fields too large"); /* out of memory for them */
		h->in_name = true;
		h->hdrs[h->nhdr].name_off = (uint32_t)h->len;
		h->hdrs[h->nhdr].name_len = 0;
		h->hdrs[h->nhdr].val_off = (uint32_t)h->len;
		h->hdrs[h->nhdr].val_len = 0;
		h->hdrs[h->nhdr].kind = HDR_OTHER;
		h->nhdr++;
	}
	if (!head_append(h, at, len))
		return reject(rp, 431, "request header fields too large");
	h->hdrs[h->nhdr - 1].name_len += (uint32_t)len;
	return 0;
}

static int on_header_field_complete(llhttp_t *p)
{
	struct reqparse *rp = p->data;
	struct reqhead *h = rp->head;

	/* llhttp (as Debian builds it) takes ": value" as a header with an
	 * empty name; RFC 9110 wants at least one token character */
	if (h->parsed ? h->trailer_name == 0 : !h->in_name || h->hdrs[h->nhdr - 1].name_len == 0)
		return reject(rp, 400, "a request header with an empty name");
	h->trailer_name = 0;
	if (h->parsed)
		return 0;
	h->in_name = false;
	struct hdr *f = &h->hdrs[h->nhdr - 1];
	f->kind = reqhead_kind_of(h->buf + f->name_off, f->name_len);
	if (f->kind == HDR_CONNECTION && h->nconn++ == 0)
		h->conn_first = h->nhdr - 1;
	h->hdrs[h->nhdr - 1].val_off = (uint32_t)h->len;
	return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct reqparse *rp = p->data;
	struct reqhead *h = rp->head;

	if (value_has_control(at, len))
		return reject(rp, 400, "control character in a request header value");
	if (h->parsed)
		return on_trailer_bytes(rp, len, false);
	if (!head_append(h, at, len))
		return reject(rp, 431, "request header fields too large");
	h->hdrs[h->nhdr - 1].val_len += (uint32_t)len;
	return 0;
}

/*
 * What the head must also satisfy before anything is forwarded, beyond
 * what llhttp checks as Debian builds it: HTTP/1.x (no HTTP/0.9, no 2.0), a path
 * as target (tokentap is never a forward proxy), exactly one Host (in
 * HTTP/1.1, required), and no transfer coding but a single "chunked", and
 * that only in HTTP/1.1. Each ambiguity here is one a server behind could
 * resolve differently from tokentap: request smuggling.
 */
static int request_head_check(struct reqparse *rp, llhttp_t *p)
{
	const struct reqhead *rh = rp->head;
	const char *url = rh->buf + rh->url_off;
	unsigned hosts = 0, codings = 0;
	const struct hdr *host = NULL;

	if (p->http_major == 0)
		return reject(rp, 400, "the request line has no HTTP version");
	if (p->http_major != 1) /* llhttp takes HTTP/2.0 too; it would go out as HTTP/1.1 */
		return reject(rp, 400, "only HTTP/1.0 and HTTP/1.1 requests are accepted");
	if (!(rh->url_len && url[0] == '/') &&
	    !(rh->url_len == 1 && url[0] == '*' && llhttp_get_method(p) == HTTP_OPTIONS))
		return reject(rp, 400, "the request target must be a path; absolute URLs are for forward proxies");
	for (unsigned i = 0; i < rh->nhdr; i++) {
		const struct hdr *h = &rh->hdrs[i];
		const char *v = rh->buf + h->val_off;
		size_t vlen = h->val_len;
		if (h->kind == HDR_HOST) {
			hosts++;
			host = h;
		} else if (h->kind == HDR_TRANSFER_ENCODING) {
			while (vlen && (*v == ' ' || *v == '\t'))
				v++, vlen--;
			while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
				vlen--;
			if (vlen == 0)
				return reject(rp, 400, "empty Transfer-Encoding header");
			if (!name_eq(v, vlen, "chunked") || ++codings > 1)
				return reject(rp, 501,
					      "transfer codings other than a single chunked are not supported");
		}
	}
	/* llhttp reads "chunked" followed by a tab as no coding at all (and the
	 * body as the next request): refuse what the two read differently */
	if (codings && !(p->flags & F_CHUNKED))
		return reject(rp, 400, "a Transfer-Encoding header that is not exactly chunked");
	if (codings && !(p->http_major == 1 && p->http_minor >= 1))
		return reject(rp, 400, "chunked transfer coding needs HTTP/1.1");
	if (hosts > 1)
		return reject(rp, 400, "more than one Host header");
	if (host && memchr(rh->buf + host->val_off, ',', host->val_len))
		return reject(rp, 400, "a Host header with more than one value");
	if (!hosts && p->http_major == 1 && p->http_minor >= 1)
		return reject(rp, 400, "HTTP/1.1 requests need a Host header");
	return 0;
}

static int on_headers_complete(llhttp_t *p)
{
	struct reqparse *rp = p->data;
	struct reqhead *h = rp->head;
	const struct hdr *f;

	h->parsed = true;
	h->conn_plain = connection_plain(h);
	h->method = llhttp_get_method(p);
	h->http_major = p->http_major;
	h->http_minor = p->http_minor;

	if (h->method == HTTP_CONNECT)
		return reject(rp, 501, "CONNECT is not supported: tokentap is a reverse proxy");
	if (request_head_check(rp, p) == -1)
		return -1;
	f = reqhead_kind(h, HDR_UPGRADE);
	h->websocket = false;
	if (f && name_eq(h->buf + f->val_off, f->val_len, "websocket")) {
		/* RFC 6455 4.1: a GET over HTTP/1.1 whose Connection lists
		 * upgrade, with no body (the bytes after the head are frames) */
		if (h->method != HTTP_GET || p->http_major != 1 || p->http_minor < 1 ||
		    !listed_in_connection(h, "upgrade", 7))
			return reject(rp, 400, "a WebSocket handshake is a GET over HTTP/1.1 with Connection: upgrade");
		if ((p->flags & F_CHUNKED) || ((p->flags & F_CONTENT_LENGTH) && p->content_length > 0))
			return reject(rp, 400, "a WebSocket handshake has no body");
		h->websocket = true;
	} else if (f && !name_eq(h->buf + f->val_off, f->val_len, "h2c")) {
		return reject(rp, 501, "protocol upgrades other than WebSocket are not supported");
	}
	/* An h2c offer is declined by answering in HTTP/1.1 (RFC 9113 leaves
	 * that to the server; the offer's headers are hop-by-hop, never
	 * forwarded). llhttp took Connection: upgrade as an upgrade and would
	 * stop after this message with HPE_PAUSED_UPGRADE, failing the next
	 * request on the connection: this message is an ordinary one. */
	p->upgrade = 0;
	if ((p->flags & F_CONTENT_LENGTH) && p->content_length > h->lim.max_body_size)
		return reject(rp, 413, "request body exceeds the configured maximum body size");
	f = reqhead_kind(h, HDR_EXPECT);
	h->send_continue = false;
	if (f) {
		if (!name_eq(h->buf + f->val_off, f->val_len, "100-continue"))
			return reject(rp, 417, "only the expectation 100-continue is supported");
		h->send_continue = p->http_major == 1 && p->http_minor >= 1;
	}
	h->http10 = p->http_major == 1 && p->http_minor == 0;
	h->chunked = (p->flags & F_CHUNKED) != 0;
	h->content_length = (p->flags & F_CONTENT_LENGTH) ? p->content_length : 0;
	h->keep_alive = llhttp_should_keep_alive(p);
	return hook_result(rp, rp->hooks->head(rp->arg, h));
}

static int on_chunk_extension(llhttp_t *p, const char *at, size_t len)
{
	struct reqparse *rp = p->data;

	(void)at;
	rp->head->chunk_ext += len;
	if (rp->head->chunk_ext > CHUNK_EXT_MAX)
		return reject(rp, 400, "chunk extensions too long");
	return 0;
}

static int on_chunk_header(llhttp_t *p)
{
	struct reqparse *rp = p->data;

	rp->head->chunk_ext = 0;
	if (hook_result(rp, rp->hooks->chunk(rp->arg)) == -1)
		return -1;
	if (p->content_length > 0)
		return 0;
	/* the last chunk: pause, so that reqparse_feed scans the trailer
	 * section before llhttp parses it */
	rp->last_chunk = true;
	return HPE_PAUSED;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct reqparse *rp = p->data;
	struct reqhead *h = rp->head;

	h->body_bytes += len;
	if (h->body_bytes > h->lim.max_body_size)
		return reject(rp, 413, "request body exceeds the configured maximum body size");
	rp->hooks->body(rp->arg, at, len);
	return 0;
}

static int on_message_complete(llhttp_t *p)
{
	struct reqparse *rp = p->data;

	rp->hooks->complete(rp->arg);
	return HPE_PAUSED; /* a pipelined request waits for this response */
}

static const llhttp_settings_t reqparse_settings = {
	.on_message_begin = on_message_begin,
	.on_url = on_url,
	.on_header_field = on_header_field,
	.on_header_field_complete = on_header_field_complete,
	.on_header_value = on_header_value,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
	.on_chunk_extension_name = on_chunk_extension,
	.on_chunk_extension_value = on_chunk_extension,
	.on_chunk_header = on_chunk_header,
};

/*
 * Byte-level rules llhttp (as Debian builds it, strict mode included) leaves
 * to us: every line of the head ends in CRLF (no bare LF, and no bare CR:
 * after the last header line llhttp takes CR and any byte as the blank
 * line), and no header line starts with a space or tab (obs-fold, a line
 * continuation servers read differently). Runs over the head's bytes before
 * llhttp parses them (so a CR that ends one read is judged by the first byte
 * of the next before llhttp sees it) and stops at its blank line. The
 * trailer section after a chunked body is scanned the same way
 * (trailer_scan_start): there llhttp takes a bare LF as a line end and as
 * the blank line, and folds obs-fold lines, even in strict mode. Returns 0,
 * or -1 with the reason in *why.
 */
static int head_scan(struct reqparse *rp, const char *p, size_t n, const char **why)
{
	/* the state in locals, stored back on the way out */
	char prev = rp->scan_prev;
	unsigned line = rp->scan_line, lines = rp->scan_lines;
	bool done = rp->scan_done;
	int rc = 0;

	for (size_t i = 0; i < n && !done;) {
		char c = p[i];
		if (prev == '\r' && c != '\n') {
			*why = "a line of the request head ends in a bare CR; lines end in CRLF";
			rc = -1;
			break;
		}
		if (c == '\n') {
			if (prev != '\r') {
				*why = "a line of the request head ends in a bare LF; lines end in CRLF";
				rc = -1;
				break;
			}
			if (line == 0 && lines > 0)
				done = true; /* the blank line: the body is not ours to scan */
			else if (line > 0)
				lines++;
			line = 0;
		} else if (c != '\r') {
			if (line == 0 && lines > 0 && (c == ' ' || c == '\t')) {
				*why = "a header line starts with whitespace (obs-fold line folding is not accepted)";
				rc = -1;
				break;
			}
			/* the rest of the line up to its CR or LF: nothing in it to
			 * check, it only counts */
			size_t run = (size_t)(find_either(p + i + 1, p + n, '\r', '\n') - (p + i));
			line += (unsigned)run;
			i += run;
			prev = p[i - 1];
			continue;
		}
		prev = c;
		i++;
	}
	rp->scan_prev = prev;
	rp->scan_line = line;
	rp->scan_lines = lines;
	rp->scan_done = done;
	return rc;
}

static void head_scan_reset(struct reqparse *rp)
{
	rp->scan_prev = 0;
	rp->scan_line = rp->scan_lines = 0;
	rp->scan_done = false;
}

/* The trailer section starts where a line (the last chunk's) just ended. */
static void trailer_scan_start(struct reqparse *rp)
{
	rp->scan_prev = '\n';
	rp->scan_line = 0;
	rp->scan_lines = 1;
	rp->scan_done = false;
}

/* ---- driving it ---- */

void reqparse_init(struct reqparse *rp, const struct reqparse_hooks *hooks, void *arg)
{
	memset(rp, 0, sizeof(*rp));
	rp->hooks = hooks;
	rp->arg = arg;
	llhttp_init(&rp->parser, HTTP_REQUEST, &reqparse_settings);
	rp->parser.data = rp;
}

enum reqparse_status reqparse_feed(struct reqparse *rp, const char *buf, size_t len, size_t *used)
{
	const char *why = NULL;
	size_t off = 0;

	*used = 0;
	for (;;) { /* at most twice: a last chunk's pause, then the rest */
		if (!rp->scan_done && head_scan(rp, buf + off, len - off, &why) == -1) {
			reject(rp, 400, why);
			return REQPARSE_REFUSED;
		}
		enum llhttp_errno e = llhttp_execute(&rp->parser, buf + off, len - off);
		if (e == HPE_OK) {
			*used = len;
			return REQPARSE_MORE;
		}
		if (e != HPE_PAUSED)
			return rp->stopped ? REQPARSE_STOPPED : REQPARSE_REFUSED;
		off = (size_t)(llhttp_get_error_pos(&rp->parser) - buf);
		if (!rp->last_chunk) {
			*used = off;
			return REQPARSE_PAUSED;
		}
		rp->last_chunk = false;
		trailer_scan_start(rp);
		llhttp_resume(&rp->parser);
	}
}

void reqparse_resume(struct reqparse *rp)
{
	head_scan_reset(rp);
	llhttp_resume(&rp->parser);
}

int reqparse_refusal(const struct reqparse *rp, char *msg, size_t msglen)
{
	llhttp_t *p = (llhttp_t *)&rp->parser; /* llhttp's getters take no const */

	if (rp->reject_status) {
		snprintf(msg, msglen, "%s", rp->reject_msg);
		return rp->reject_status;
	}
	if (llhttp_get_errno(p) == HPE_INVALID_METHOD && llhttp_get_method(p) == HTTP_PRI)
		snprintf(msg, msglen, "HTTP/2 prior knowledge is not supported; speak HTTP/1.1");
	else
		snprintf(msg, msglen, "malformed HTTP request: %s", llhttp_get_error_reason(p));
	return 400;
}
