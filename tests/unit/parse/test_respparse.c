/*
 * test_respparse.c — the response parser's keep-alive answer: the field
 * rp.keep_alive, set at the response's end beside the complete hook, says
 * what the hook is told, whatever the version and Connection header say,
 * and a 1xx before the final response leaves it alone; the caller's hold
 * on a parsed head; and chunked bodies, read by respparse itself, seen by
 * the hooks (body or body_v) and ended or refused exactly as llhttp reads
 * them (rp.llhttp_chunks), for well-formed and broken chunks cut anywhere.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "respparse.h"
#include "respparse_fixture.h"
#include "testrand.h"

struct seen {
	int completes;
	bool hook_keep_alive;
	bool field_at_hook; /* rp.keep_alive as the hook ran */
	struct respparse *rp;
};

static void on_complete(void *arg, bool keep_alive)
{
	struct seen *s = arg;

	s->completes++;
	s->hook_keep_alive = keep_alive;
	s->field_at_hook = s->rp->keep_alive;
}

static const struct respparse_hooks hooks = { ignore_head, ignore_body, on_complete, NULL };

/* Feeds `text` whole; returns the parser's status. */
static enum respparse_status parse(struct respparse *rp, struct seen *s, const char *text)
{
	size_t used;

	memset(s, 0, sizeof(*s));
	s->rp = rp;
	respparse_init(rp, &hooks, s);
	return respparse_feed(rp, text, strlen(text), &used);
}

static void check(const char *text, bool want)
{
	struct respparse rp;
	struct seen s;

	assert_int_equal(parse(&rp, &s, text), RESPPARSE_DONE);
	assert_int_equal(s.completes, 1);
	assert_int_equal(s.hook_keep_alive, want);
	assert_int_equal(s.field_at_hook, want);
	assert_int_equal(rp.keep_alive, want);
}

static void test_http11_keeps_alive(void **state)
{
	(void)state;
	check("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", true);
	check("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", true);
}

static void test_connection_close_ends_it(void **state)
{
	(void)state;
	check("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", false);
}

static void test_http10_ends_it_unless_asked(void **state)
{
	(void)state;
	check("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", false);
	check("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok", true);
}

static void test_not_set_before_the_end(void **state)
{
	struct respparse rp;
	struct seen s;

	(void)state;
	/* a 1xx, then the final head without its body: no end yet */
	assert_int_equal(parse(&rp, &s, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"),
			 RESPPARSE_MORE);
	assert_int_equal(s.completes, 0);
	assert_false(rp.keep_alive);
	assert_false(rp.done);
}

/* While the caller holds the response (rp.hold), take hands out nothing,
 * head or body, and the bytes stay held; once it lets go, all of them at
 * once. */
static void test_hold_keeps_the_head(void **state)
{
	static const char head[] = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
	static const char chunk[] = "2\r\nok\r\n";
	struct respparse rp;
	struct seen s;
	size_t used, n;

	(void)state;
	memset(&s, 0, sizeof(s));
	s.rp = &rp;
	respparse_init(&rp, &hooks, &s);
	rp.hold = true;
	assert_int_equal(respparse_feed(&rp, head, strlen(head), &used), RESPPARSE_MORE);
	assert_true(rp.head_done);
	assert_int_equal(respparse_take(&rp, &n), RESPPARSE_MORE);
	assert_int_equal(n, 0);
	assert_int_equal(respparse_feed(&rp, chunk, strlen(chunk), &used), RESPPARSE_MORE);
	assert_int_equal(respparse_take(&rp, &n), RESPPARSE_MORE);
	assert_int_equal(n, 0);
	assert_int_equal(rp.held, strlen(head) + strlen(chunk));
	rp.hold = false;
	assert_int_equal(respparse_take(&rp, &n), RESPPARSE_MORE);
	assert_int_equal(n, strlen(head) + strlen(chunk));
	assert_int_equal(rp.held, 0);
}

/* What a parse did, as text: the hooks' calls (each body slice as it came)
 * and each feed's answer, then the error's name and the held bytes. */
struct transcript {
	char log[16384];
	size_t len;
};

static void tr_put(struct transcript *t, const char *s, size_t n)
{
	if (n > sizeof(t->log) - 1 - t->len)
		n = sizeof(t->log) - 1 - t->len;
	memcpy(t->log + t->len, s, n);
	t->len += n;
	t->log[t->len] = '\0';
}

static void tr_printf(struct transcript *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tr_printf(struct transcript *t, const char *fmt, ...)
{
	char b[256];
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(b, sizeof(b), fmt, ap);
	va_end(ap);
	tr_put(t, b, n < 0 ? 0 : (size_t)n);
}

static void tr_head(void *arg, const struct respparse *rp)
{
	tr_printf(arg, "[head %d %d]", rp->status, (int)rp->kind);
}

static void tr_body(void *arg, const char *at, size_t len)
{
	tr_printf(arg, "[body %zu:", len);
	tr_put(arg, at, len);
	tr_put(arg, "]", 1);
}

static void tr_complete(void *arg, bool keep_alive)
{
	tr_printf(arg, "[end %d]", keep_alive);
}

static void tr_body_v(void *arg, const struct framer_slice *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		tr_body(arg, v[i].at, v[i].len);
}

static const struct respparse_hooks tr_hooks = { tr_head, tr_body, tr_complete, NULL };
static const struct respparse_hooks tr_hooks_v = { tr_head, tr_body, tr_complete, tr_body_v };

/* Feeds `text` in the pieces `cuts` (offsets, ascending, ending at len)
 * says, as exchange.c does: no more after an answer other than MORE. */
static void tr_parse(struct transcript *t, const char *text, size_t len, const size_t *cuts, size_t ncuts,
		     bool llhttp_chunks, bool head_request, bool body_v)
{
	struct respparse rp;
	size_t from = 0;

	memset(t, 0, sizeof(*t));
	respparse_init(&rp, body_v ? &tr_hooks_v : &tr_hooks, t);
	rp.llhttp_chunks = llhttp_chunks;
	rp.head_request = head_request;
	for (size_t i = 0; i < ncuts; i++) {
		size_t used = 0, n = cuts[i] - from;
		enum respparse_status st = respparse_feed(&rp, text + from, n, &used);
		tr_printf(t, "(feed %zu: %d %zu)", n, (int)st, used);
		from = cuts[i];
		if (st == RESPPARSE_INVALID) {
			tr_printf(t, "(error %s)", respparse_error(&rp));
			break;
		}
		if (st != RESPPARSE_MORE)
			break;
	}
	size_t took = 0;
	enum respparse_status st = respparse_take(&rp, &took);
	tr_printf(t, "(take %d %zu held %zu done %d keep %d eof %d)", (int)st, took, rp.held, rp.done, rp.keep_alive,
		  respparse_needs_eof(&rp));
}

/* The same bytes, the same cuts: both readers of a chunked body agree. */
static void same_both_ways(const char *text, size_t len, const size_t *cuts, size_t ncuts, bool head_request)
{
	static struct transcript fast, slow;

	tr_parse(&slow, text, len, cuts, ncuts, true, head_request, false);
	for (int v = 0; v < 2; v++) {
		tr_parse(&fast, text, len, cuts, ncuts, false, head_request, v);
		if (strcmp(fast.log, slow.log) != 0) {
			print_error("input: %.*s\nrespparse%s: %s\nllhttp:    %s\n", (int)len, text,
				    v ? " (body_v)" : "", fast.log, slow.log);
			fail();
		}
	}
}

static const char *const chunked_cases[] = {
	"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
	"c\r\ndata: one\n\n\r\nC\r\ndata: two\n\n\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0002\r\nok\r\n00\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;ext=1\r\nok\r\n3;a=\"b\"\r\nabc\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\ncontent-type: text/event-stream\r\n"
	"x-trailer: 1\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
	"HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nokX\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\rX0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\rX\nok\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\nok\n0\n\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\ng\r\nok\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2 \r\nok\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\r\n2\r\nok\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffff\r\nok\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\nok",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n000000000000000000002\r\nok\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nbad trailer\r\n\r\n",
	"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n2\r\nok\r\n0\r\n\r\n",
};

/* Every case cut at every byte, and in two pieces at every pair. */
static void test_chunks_as_llhttp_reads_them(void **state)
{
	(void)state;
	for (size_t c = 0; c < sizeof(chunked_cases) / sizeof(chunked_cases[0]); c++) {
		const char *t = chunked_cases[c];
		size_t len = strlen(t), cuts[1024];
		for (int head = 0; head < 2; head++) {
			same_both_ways(t, len, &len, 1, head);
			for (size_t i = 0; i < len; i++)
				cuts[i] = i + 1;
			same_both_ways(t, len, cuts, len, head);
			for (size_t a = 1; a < len; a++) {
				cuts[0] = a;
				cuts[1] = len;
				same_both_ways(t, len, cuts, 2, head);
			}
		}
	}
}

/* Chunked responses with a byte changed, put in or taken out, cut at
 * random: still the same both ways. */
static void test_broken_chunks_as_llhttp_reads_them(void **state)
{
	static const char alphabet[] = "0123456789abcdefABCDEFgG;= \t\r\n\"x";
	char buf[1024];
	size_t cuts[1024];

	(void)state;
	testrand_state = 0x5eed31;
	for (int round = 0; round < 20000; round++) {
		const char *t = chunked_cases[(size_t)(uniform() * 8)];
		size_t len = strlen(t), head_end = (size_t)(strstr(t, "\r\n\r\n") - t) + 4;
		memcpy(buf, t, len);
		int edits = 1 + (int)(uniform() * 3);
		for (int e = 0; e < edits && len + 1 < sizeof(buf); e++) {
			size_t at = head_end + (size_t)(uniform() * (double)(len - head_end));
			char c = alphabet[(size_t)(uniform() * (sizeof(alphabet) - 1))];
			double r = uniform();
			if (r < 0.4) {
				buf[at] = c;
			} else if (r < 0.7) {
				memmove(buf + at + 1, buf + at, len - at);
				buf[at] = c;
				len++;
			} else if (at < len) {
				memmove(buf + at, buf + at + 1, len - at - 1);
				len--;
			}
		}
		size_t n = 0, at = 0;
		while (at < len && n < sizeof(cuts) / sizeof(cuts[0]) - 1) {
			at += 1 + (size_t)(uniform() * 24);
			cuts[n++] = at < len ? at : len;
		}
		if (n == 0 || cuts[n - 1] != len)
			cuts[n++] = len;
		same_both_ways(buf, len, cuts, n, false);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_http11_keeps_alive),
		cmocka_unit_test(test_connection_close_ends_it),
		cmocka_unit_test(test_http10_ends_it_unless_asked),
		cmocka_unit_test(test_not_set_before_the_end),
		cmocka_unit_test(test_hold_keeps_the_head),
		cmocka_unit_test(test_chunks_as_llhttp_reads_them),
		cmocka_unit_test(test_broken_chunks_as_llhttp_reads_them),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
