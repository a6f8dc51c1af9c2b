/*
 * test_reqparse.c — the request parser without sockets: framing that llhttp
 * 8.1 accepts in its lenient build, or even in strict mode, is refused with
 * 400 whether a stream arrives whole or a byte at a time; well-framed
 * requests (an h2c offer among them) parse, and the next request on the
 * connection after them too; which header names are hop-by-hop.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reqparse.h"

/* What the hooks saw of one stream. */
struct seen {
	struct reqhead head;
	unsigned heads, completes;
	char body[256];
	size_t body_len;
	char url[2][64]; /* of the first two requests */
};

static struct reqhead *on_begin(void *arg)
{
	return &((struct seen *)arg)->head;
}

/* Called on each parsed head when set. */
static void (*head_check)(const struct reqhead *h);

static int on_head(void *arg, struct reqhead *h)
{
	struct seen *s = arg;
	if (head_check)
		head_check(h);
	if (s->heads < 2)
		snprintf(s->url[s->heads], sizeof(s->url[0]), "%.*s", (int)h->url_len, h->buf + h->url_off);
	s->heads++;
	return 0;
}

static int on_chunk(void *arg)
{
	(void)arg;
	return 0;
}

static void on_body(void *arg, const char *at, size_t len)
{
	struct seen *s = arg;
	assert_true(s->body_len + len <= sizeof(s->body));
	memcpy(s->body + s->body_len, at, len);
	s->body_len += len;
}

static void on_complete(void *arg)
{
	((struct seen *)arg)->completes++;
}

static const struct reqparse_hooks hooks = { on_begin, on_head, on_chunk, on_body, on_complete };

/*
 * Feeds `raw` in pieces of `step` bytes (0: whole), resuming after each
 * message end as client.c does; each piece is a heap copy of exact size, so
 * ASan sees any read past it. Returns the status the stream ended with: 0
 * when every byte was taken, else the refusal's.
 */
static int run(const char *raw, size_t len, size_t step, struct seen *s)
{
	const struct reqparse_limits lim = { 32 << 10, 100, 1 << 20 };
	struct reqparse rp;
	size_t off = 0;
	int status = 0;

	memset(s, 0, sizeof(*s));
	assert_int_equal(reqhead_init(&s->head, &lim), 0);
	reqparse_init(&rp, &hooks, s);
	while (off < len && !status) {
		size_t n = step && len - off > step ? step : len - off;
		char *piece = malloc(n);
		size_t used = 0;
		assert_non_null(piece);
		memcpy(piece, raw + off, n);
		for (size_t at = 0; at < n;) { /* a pipelined request follows a pause */
			enum reqparse_status rs = reqparse_feed(&rp, piece + at, n - at, &used);
			if (rs == REQPARSE_REFUSED || rs == REQPARSE_STOPPED) {
				char msg[160];
				status = reqparse_refusal(&rp, msg, sizeof(msg));
				assert_true(msg[0] != '\0');
				break;
			}
			at += used;
			if (rs == REQPARSE_PAUSED)
				reqparse_resume(&rp);
		}
		free(piece);
		off += n;
	}
	reqhead_free(&s->head);
	return status;
}

#define RUN(lit, step, s) run(lit, sizeof(lit) - 1, step, s)

#define CHUNKED "POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"

/* Each refused whole and in every piece size from 1 to 8, the head never
 * handed on where the fault is in the head. */
static void expect_refused(const char *raw, size_t len, bool in_head)
{
	struct seen s;
	for (size_t step = 0; step <= 8; step++) {
		int status = run(raw, len, step, &s);
		if (status != 400)
			fail_msg("step %zu: status %d for \"%s\"", step, status, raw);
		assert_int_equal(s.completes, 0);
		if (in_head)
			assert_int_equal(s.heads, 0);
	}
}

#define REFUSED(lit, in_head) expect_refused(lit, sizeof(lit) - 1, in_head)

static void test_lenient_chunk_framing(void **state)
{
	(void)state;
	REFUSED(CHUNKED "5\r\nhelloXY0\r\n\r\n", false); /* chunk data not followed by CRLF */
	REFUSED(CHUNKED "5\r\nhello\rZ0\r\n\r\n", false);
	REFUSED(CHUNKED "5\r\nhello\nZ0\r\n\r\n", false);
	REFUSED(CHUNKED "5\r\nhello0\r\n\r\n", false);
	REFUSED(CHUNKED "5\rZhello\r\n0\r\n\r\n", false); /* chunk-size line: CR and any byte */
	REFUSED(CHUNKED "5;a=b\rZhello\r\n0\r\n\r\n", false);
	REFUSED(CHUNKED "5\nhello\r\n0\r\n\r\n", false);
	REFUSED(CHUNKED "5\r\nhello\r\n0\rZ\r\n", false);
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\n\rZ", false); /* CR and any byte as the blank line */
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\n\r\r", false);
}

static void test_trailer_framing(void **state)
{
	(void)state;
	/* accepted by llhttp 8.1 even in strict mode */
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\n\n", false);
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\nX-T: a\r\n\n", false);
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\nX-T: a\r\n b\r\n\r\n", false);
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\nX-T: a\r\n\tb\r\n\r\n", false);
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\n \r\n\r\n", false);
	/* refused by llhttp itself, kept as regressions */
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\nX-T: a\n\r\n", false);
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\nX-T: a\rY: b\r\n\r\n", false);
	REFUSED(CHUNKED "5\r\nhello\r\n0\r\nX-T: a\r\r\n\r\n", false);
}

static void test_target_bytes(void **state)
{
	static const char *const targets[] = {
		"/ok\t/x",    "/ok\f/x", "/ok?a=\t", "/ok?a=\f", "/ok#f\t", "/ok\xc3\xa9",
		"/ok?q=\x80", "/ok\xff", "/ok\x01",  "/ok\x0b",	 "/ok\x7f", "/ok?\x1b",
	};
	(void)state;
	for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); i++) {
		char raw[128];
		int n = snprintf(raw, sizeof(raw), "GET %s HTTP/1.1\r\nHost: h\r\n\r\n", targets[i]);
		expect_refused(raw, (size_t)n, true);
	}
}

static void test_head_framing(void **state)
{
	(void)state;
	REFUSED("GET /ok HTTP/1.1\r\nHost: h\r\n\rX", true);
	REFUSED("GET /ok HTTP/1.1\r\nHost: h\rX-A: b\r\n\r\n", true);
	REFUSED("GET /ok HTTP/1.1\r\nHost: h\n\r\n", true);
	REFUSED("GET /ok HTTP/1.1\r\nHost: h\r\nX-A: a\r\n b\r\n\r\n", true);
	REFUSED("\rGET /ok HTTP/1.1\r\nHost: h\r\n\r\n", true);
	REFUSED("\nGET /ok HTTP/1.1\r\nHost: h\r\n\r\n", true);
	/* the same deep in long lines, at every offset within eight bytes
	 * (the scan goes a word at a time between line ends), and a long head
	 * that is well framed */
	for (int pad = 0; pad < 24; pad++) {
		static const char *const bad[] = { "\rX", "\n", "\r\r\n" };
		char raw[256];
		for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
			int n = snprintf(raw, sizeof(raw),
					 "GET /ok HTTP/1.1\r\nHost: h\r\nX-Long-Header: %.*s%s\r\n\r\n", pad,
					 "abcdefghijklmnopqrstuvwxyz", bad[b]);
			expect_refused(raw, (size_t)n, true);
		}
		struct seen s;
		int n = snprintf(raw, sizeof(raw), "GET /ok HTTP/1.1\r\nHost: h\r\nX-Long-Header: %.*s\r\n\r\n", pad,
				 "abcdefghijklmnopqrstuvwxyz");
		for (size_t step = 0; step <= 8; step++) {
			assert_int_equal(run(raw, (size_t)n, step, &s), 0);
			assert_int_equal(s.heads, 1);
		}
	}
}

/* Well framed: accepted whole and a byte at a time, with the same body. */
static void test_well_framed(void **state)
{
	static const char two[] = CHUNKED
		"5;a=\"x\ty\"\r\nhello\r\n6\r\n world\r\n0\r\nX-T: a\r\nX-U: b\r\n\r\n"
		"GET /v1/models?a=%20b&c=~!$'()*+,;=:@/?[] HTTP/1.1\r\nHost: h\r\n\r\n";
	struct seen s;
	(void)state;
	for (size_t step = 0; step <= 8; step++) {
		assert_int_equal(RUN(two, step, &s), 0);
		assert_int_equal(s.heads, 2);
		assert_int_equal(s.completes, 2);
		assert_int_equal(s.body_len, 11);
		assert_memory_equal(s.body, "hello world", 11);
		assert_string_equal(s.url[1], "/v1/models?a=%20b&c=~!$'()*+,;=:@/?[]");
	}
}

/* An h2c offer is declined: the message is an ordinary one and the next
 * request on the connection parses (llhttp stopped with
 * HPE_PAUSED_UPGRADE there before). */
static void test_h2c_offer_then_next_request(void **state)
{
	static const char get[] =
		"GET /a HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n"
		"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
		"GET /b HTTP/1.1\r\nHost: h\r\n\r\n";
	static const char post[] =
		"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nConnection: Upgrade\r\n"
		"Upgrade: h2c\r\n\r\nhello"
		"GET /b HTTP/1.1\r\nHost: h\r\n\r\n";
	static const char ws[] = "GET /a HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
	static const char irc[] = "GET /a HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: IRC/6.9\r\n\r\n";
	static const char ws_post[] =
		"POST /a HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
		"Content-Length: 2\r\n\r\nhi";
	static const char ws_noconn[] = "GET /a HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n";
	static const char ws_10[] = "GET /a HTTP/1.0\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
	struct seen s;
	(void)state;
	for (size_t step = 0; step <= 8; step++) {
		assert_int_equal(RUN(get, step, &s), 0);
		assert_int_equal(s.completes, 2);
		assert_string_equal(s.url[1], "/b");
		assert_int_equal(RUN(post, step, &s), 0);
		assert_int_equal(s.completes, 2);
		assert_int_equal(s.body_len, 5);
		assert_string_equal(s.url[1], "/b");
		/* a WebSocket handshake passes (tunnelled after its 101), as one
		 * message: what follows it is frames, not parsed here */
		assert_int_equal(RUN(ws, step, &s), 0);
		assert_int_equal(s.completes, 1);
		assert_int_equal(RUN(irc, step, &s), 501);
		assert_int_equal(RUN(ws_post, step, &s), 400);
		assert_int_equal(RUN(ws_noconn, step, &s), 400);
		assert_int_equal(RUN(ws_10, step, &s), 400);
	}
}

/* A header name takes RFC 9110's token characters and no other byte. */
static void test_header_name_bytes(void **state)
{
	static const char tchar[] = "!#$%&'*+-.^_`|~";
	(void)state;
	for (int c = 1; c < 256; c++) {
		if (c == ':')
			continue; /* ends the name */
		char raw[64];
		struct seen s;
		int n = snprintf(raw, sizeof(raw), "GET / HTTP/1.1\r\nHost: h\r\nX%cY: v\r\n\r\n", c);
		bool token = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			     strchr(tchar, c) != NULL;
		int status = run(raw, (size_t)n, 0, &s);
		if (token ? status != 0 : status != 400)
			fail_msg("byte 0x%02x in a header name: status %d", c, status);
	}
}

/* Every byte in a field value, at each offset of a long one (the check
 * goes eight bytes a step), after a tab too: refused exactly for the
 * controls but tab, and for DEL. (The strict llhttp build refuses the same
 * bytes on its own; reqparse's check is there should it not.) */
static void test_header_value_bytes(void **state)
{
	(void)state;
	for (int c = 1; c < 256; c++) {
		if (c == '\r' || c == '\n')
			continue; /* end the line: the framing's checks, test_head_framing */
		bool bad = (c < 0x20 && c != '\t') || c == 0x7f;
		for (int at = 0; at < 20; at++) {
			for (int tab = 0; tab < 2; tab++) {
				char v[32], raw[128];
				memset(v, 'v', 24);
				v[24] = 0;
				if (tab)
					v[at / 2] = '\t';
				v[at] = (char)c;
				int n = snprintf(raw, sizeof(raw), "GET / HTTP/1.1\r\nHost: h\r\nX-Long: a%sz\r\n\r\n",
						 v);
				struct seen s;
				int status = run(raw, (size_t)n, 0, &s);
				if (bad ? status != 400 : status != 0)
					fail_msg("byte 0x%02x at %d of a header value (tab %d): status %d", c, at, tab,
						 status);
			}
		}
	}
}

static void check_kinds(const struct reqhead *h)
{
	static const enum hdr_kind want[] = { HDR_HOST, HDR_X_REQUEST_ID, HDR_OTHER, HDR_TRACEPARENT };
	assert_int_equal(h->nhdr, 4);
	for (unsigned i = 0; i < 4; i++)
		assert_int_equal(h->hdrs[i].kind, want[i]);
	assert_ptr_equal(reqhead_kind(h, HDR_TRACEPARENT), &h->hdrs[3]);
	assert_null(reqhead_kind(h, HDR_TRACESTATE));
}

static unsigned want_fields;

/* Fields X-F0 .. X-F<n-1>, each valued its number, all there in order. */
static void check_fields(const struct reqhead *h)
{
	assert_int_equal(h->nhdr, want_fields + 1); /* and Host */
	for (unsigned i = 0; i < want_fields; i++) {
		char name[16], val[16];
		const struct hdr *f = &h->hdrs[i + 1];
		int nl = snprintf(name, sizeof(name), "X-F%u", i), vl = snprintf(val, sizeof(val), "%u", i);
		assert_int_equal(f->name_len, nl);
		assert_memory_equal(h->buf + f->name_off, name, (size_t)nl);
		assert_int_equal(f->val_len, vl);
		assert_memory_equal(h->buf + f->val_off, val, (size_t)vl);
	}
}

/* The header array grows as fields come (16, 32, 64, then the limit's 100):
 * every count up to the limit parses whole, in one read and in pieces of
 * three bytes; one field more is refused with 431. */
static void test_header_array_grows(void **state)
{
	static char raw[8192];
	(void)state;
	for (unsigned n = 0; n <= 100; n++) {
		int len = snprintf(raw, sizeof(raw), "GET / HTTP/1.1\r\nHost: h\r\n");
		for (unsigned i = 0; i < n - (n == 100); i++) /* Host is one of the 100 */
			len += snprintf(raw + len, sizeof(raw) - (size_t)len, "X-F%u: %u\r\n", i, i);
		len += snprintf(raw + len, sizeof(raw) - (size_t)len, "\r\n");
		want_fields = n - (n == 100);
		for (size_t step = 0; step <= 3; step += 3) {
			struct seen s;
			head_check = check_fields;
			assert_int_equal(run(raw, (size_t)len, step, &s), 0);
			head_check = NULL;
			assert_int_equal(s.heads, 1);
		}
	}
	int len = snprintf(raw, sizeof(raw), "GET / HTTP/1.1\r\nHost: h\r\n");
	for (unsigned i = 0; i < 100; i++)
		len += snprintf(raw + len, sizeof(raw) - (size_t)len, "X-F%u: %u\r\n", i, i);
	len += snprintf(raw + len, sizeof(raw) - (size_t)len, "\r\n");
	struct seen s;
	assert_int_equal(run(raw, (size_t)len, 0, &s), 431);
	assert_int_equal(s.heads, 0);
}

static bool hop(const struct reqhead *h, const char *name)
{
	return reqhead_hop_by_hop(h, name, strlen(name));
}

static void check_hop(const struct reqhead *h)
{
	static const char *const fixed[] = { "connection", "Keep-Alive", "PROXY-CONNECTION",
					     "te",	   "Trailer",	 "transfer-encoding",
					     "UpGrade",	   "expect",	 "HTTP2-Settings" };
	/* the same lengths, one letter off; and end-to-end headers */
	static const char *const not_hop[] = { "tx",
					       "keep-alivf",
					       "proxy-connectioN2",
					       "connectiox",
					       "upgradx",
					       "trailex",
					       "expecx",
					       "http2-settingz",
					       "transfer-encodinx",
					       "content-length",
					       "host",
					       "x-request-id",
					       "k",
					       "" };
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		if (!hop(h, fixed[i]))
			fail_msg("%s is hop-by-hop", fixed[i]);
	for (size_t i = 0; i < sizeof(not_hop) / sizeof(not_hop[0]); i++)
		if (hop(h, not_hop[i]))
			fail_msg("%s is not hop-by-hop", not_hop[i]);
	/* and what the Connection header names, in any case */
	assert_true(hop(h, "x-private"));
	assert_true(hop(h, "X-Other"));
	assert_false(hop(h, "x-mid"));
}

/* Without a Connection header only the fixed names are hop-by-hop; with
 * one after others, what it lists still is. */
static void check_no_connection(const struct reqhead *h)
{
	assert_true(hop(h, "te"));
	assert_false(hop(h, "x-private"));
	assert_false(hop(h, "close"));
}

/* What clients send: close and keep-alive only, in any case, one header
 * or two. */
static void check_plain_connection(const struct reqhead *h)
{
	assert_true(hop(h, "Close"));
	assert_true(hop(h, "keep-alive"));
	assert_false(hop(h, "x-a"));
	assert_false(hop(h, "closf"));
}

static void check_late_connection(const struct reqhead *h)
{
	assert_true(hop(h, "x-last"));
	assert_true(hop(h, "close"));
	assert_false(hop(h, "x-a"));
}

/* Each name tokentap reads has its kind in any case; the same lengths one
 * letter off, and other names, have none. */
static void test_header_kinds(void **state)
{
	static const struct {
		const char *name;
		enum hdr_kind kind;
	} known[] = {
		{ "te", HDR_TE },
		{ "Host", HDR_HOST },
		{ "EXPECT", HDR_EXPECT },
		{ "Upgrade", HDR_UPGRADE },
		{ "trailer", HDR_TRAILER },
		{ "Connection", HDR_CONNECTION },
		{ "keep-alive", HDR_KEEP_ALIVE },
		{ "TraceState", HDR_TRACESTATE },
		{ "traceparent", HDR_TRACEPARENT },
		{ "X-Request-ID", HDR_X_REQUEST_ID },
		{ "HTTP2-Settings", HDR_HTTP2_SETTINGS },
		{ "proxy-connection", HDR_PROXY_CONNECTION },
		{ "Transfer-Encoding", HDR_TRANSFER_ENCODING },
	};
	static const char *const others[] = { "tf",
					      "hosu",
					      "expecu",
					      "upgradf",
					      "trailes",
					      "connectioo",
					      "keep-alivf",
					      "tracestatf",
					      "traceparenu",
					      "x-request-ie",
					      "http2-settingt",
					      "proxy-connectioo",
					      "transfer-encodinh",
					      "x",
					      "content-length",
					      "" };
	(void)state;
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		assert_int_equal(reqhead_kind_of(known[i].name, strlen(known[i].name)), known[i].kind);
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
		assert_int_equal(reqhead_kind_of(others[i], strlen(others[i])), HDR_OTHER);

	/* a parsed head's fields carry theirs, names split across reads too */
	static const char get[] =
		"GET /a HTTP/1.1\r\nHOST: h\r\nX-Request-Id: r\r\nX-Other: 1\r\n"
		"traceparent: t\r\n\r\n";
	for (size_t step = 0; step <= 4; step++) {
		struct seen s;
		head_check = check_kinds;
		assert_int_equal(RUN(get, step, &s), 0);
		head_check = NULL;
		assert_int_equal(s.heads, 1);
	}
}

static void test_hop_by_hop(void **state)
{
	static const char get[] =
		"GET /a HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, X-Private\r\nX-Mid: 1\r\n"
		"connection: x-other\r\n\r\n";
	struct seen s;
	(void)state;
	head_check = check_hop;
	assert_int_equal(RUN(get, 0, &s), 0);
	head_check = NULL;
	assert_int_equal(s.heads, 1);

	static const char plain[] = "GET /a HTTP/1.1\r\nHost: h\r\nX-Private: 1\r\n\r\n";
	head_check = check_no_connection;
	assert_int_equal(RUN(plain, 0, &s), 0);
	assert_int_equal(s.heads, 1);

	static const char late[] =
		"GET /a HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nX-B: 2\r\nCONNECTION: close, X-Last\r\n\r\n";
	static const char kept[] =
		"GET /a HTTP/1.1\r\nHost: h\r\nConnection: Keep-Alive\r\nX-A: 1\r\nconnection: ,CLOSE \r\n\r\n";
	head_check = check_plain_connection;
	assert_int_equal(RUN(kept, 0, &s), 0);
	assert_int_equal(s.heads, 1);

	head_check = check_late_connection;
	assert_int_equal(RUN(late, 3, &s), 0); /* names split across reads too */
	head_check = NULL;
	assert_int_equal(s.heads, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lenient_chunk_framing),
		cmocka_unit_test(test_trailer_framing),
		cmocka_unit_test(test_target_bytes),
		cmocka_unit_test(test_head_framing),
		cmocka_unit_test(test_well_framed),
		cmocka_unit_test(test_h2c_offer_then_next_request),
		cmocka_unit_test(test_header_kinds),
		cmocka_unit_test(test_header_array_grows),
		cmocka_unit_test(test_hop_by_hop),
		cmocka_unit_test(test_header_name_bytes),
		cmocka_unit_test(test_header_value_bytes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
