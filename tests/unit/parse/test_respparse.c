/*
 * test_respparse.c — the response parser's keep-alive answer: the field
 * rp.keep_alive, set at the response's end beside the complete hook, says
 * what the hook is told, whatever the version and Connection header say,
 * and a 1xx before the final response leaves it alone; and the caller's
 * hold on a parsed head.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "respparse.h"
#include "respparse_fixture.h"

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

static const struct respparse_hooks hooks = { ignore_head, ignore_body, on_complete };

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_http11_keeps_alive),	    cmocka_unit_test(test_connection_close_ends_it),
		cmocka_unit_test(test_http10_ends_it_unless_asked), cmocka_unit_test(test_not_set_before_the_end),
		cmocka_unit_test(test_hold_keeps_the_head),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
