/*
 * test_oom.c — out of memory while a request is written for its upstream,
 * where a failed add that went unnoticed would send a body without its
 * head, or a head that lost bytes: libevent's allocator is replaced by one
 * that fails after a given number of allocations, and every write the
 * request path makes into an evbuffer either completes or reports -1,
 * never carrying on with a head or body that lost bytes.
 *
 * - exchange_head_write: for every point at which allocation starts to
 *   fail, it returns -1 with nothing of the head added (it is measured and
 *   written in one reservation), or 0 with the whole head (the same bytes as
 *   with memory to spare);
 * - request_body_bytes, a chunked body re-framed: -1 when its bytes cannot
 *   all be added, else all of them, framed;
 * - request_mirror_copy, the shadow's head and body so far: -1, or all of
 *   it, whether the head's adds or the body's ran out;
 * - the error kind the exchange fails with, no_memory: 503 "overloaded",
 *   the last of REQUEST_ERRORS (stored slices read counters by position);
 * - bevio_copy (the replay copy): -1, or all of the bytes in order, the
 *   source unchanged;
 * - client_fail, the error answer, on a client over a socket pair (client.c
 *   is included, to call it): the peer reads the whole answer, the same
 *   bytes as with memory to spare, or nothing and the end of the stream —
 *   never part of it; the client is freed on the loop's next turn either
 *   way (its deferred free allocates nothing).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/event.h>

#include "../../../src/proxy/client.c"
#include "bevio.h"
#include "exchange.h"
#include "reqparse.h"
#include "request.h"
#include "router.h"
#include "timeline.h"
#include "upstream.h"

/* Allocations left before they fail; negative: never fail. */
static long allow = -1;

static void *oom_malloc(size_t n)
{
	if (allow == 0)
		return NULL;
	if (allow > 0)
		allow--;
	return malloc(n);
}

static void *oom_realloc(void *p, size_t n)
{
	if (allow == 0)
		return NULL;
	if (allow > 0)
		allow--;
	return realloc(p, n);
}

static void oom_free(void *p)
{
	free(p);
}

static struct reqhead *on_begin(void *arg)
{
	return arg;
}

static int on_head(void *arg, struct reqhead *h)
{
	(void)arg, (void)h;
	return 0;
}

static int on_chunk(void *arg)
{
	(void)arg;
	return 0;
}

static void on_body(void *arg, const char *at, size_t len)
{
	(void)arg, (void)at, (void)len;
}

static void on_complete(void *arg)
{
	(void)arg;
}

static const struct reqparse_hooks hooks = { on_begin, on_head, on_chunk, on_body, on_complete };

/* A head with enough headers that writing it takes several chains. */
static void parse_head(struct reqhead *head)
{
	const struct reqparse_limits lim = { 32 << 10, 100, 1 << 20 };
	char raw[8192];
	size_t len = 0, used = 0;
	struct reqparse rp;

	len += (size_t)snprintf(raw + len, sizeof(raw) - len, "POST /v1/chat/completions HTTP/1.1\r\nhost: h\r\n");
	for (int i = 0; i < 40; i++)
		len += (size_t)snprintf(raw + len, sizeof(raw) - len, "x-header-%02d: %0120d\r\n", i, i);
	len += (size_t)snprintf(raw + len, sizeof(raw) - len, "content-length: 2\r\n\r\n{}");
	assert_int_equal(reqhead_init(head, &lim), 0);
	reqparse_init(&rp, &hooks, head);
	assert_int_not_equal(reqparse_feed(&rp, raw, len, &used), REQPARSE_REFUSED);
	assert_true(head->parsed);
}

/* `out` holds exactly the bytes of `want`. */
static void assert_same_bytes(struct evbuffer *out, struct evbuffer *want)
{
	size_t n = evbuffer_get_length(want);

	assert_int_equal(evbuffer_get_length(out), n);
	assert_memory_equal(evbuffer_pullup(out, -1), evbuffer_pullup(want, -1), n);
}

static void test_head_write(void **state)
{
	struct reqhead head;
	struct req_record rec;
	struct upstream up;
	unsigned failed = 0, whole = 0;

	(void)state;
	memset(&rec, 0, sizeof(rec));
	memset(&up, 0, sizeof(up));
	strcpy(rec.method, "POST");
	strcpy(rec.id, "oom-1");
	up.name = "up";
	parse_head(&head);

	struct evbuffer *want = evbuffer_new();
	assert_non_null(want);
	assert_int_equal(exchange_head_write(&head, &rec, &up, want), 0);
	assert_true(evbuffer_get_length(want) > 4096); /* several chains */

	for (long k = 0; k < 64; k++) {
		struct evbuffer *out = evbuffer_new();
		assert_non_null(out);
		allow = k;
		int r = exchange_head_write(&head, &rec, &up, out);
		allow = -1;
		if (r == -1) {
			assert_int_equal(evbuffer_get_length(out), 0); /* none of it */
			failed++;
		} else {
			assert_int_equal(r, 0);
			assert_same_bytes(out, want);
			whole++;
		}
		evbuffer_free(out);
	}
	assert_true(failed > 0);
	assert_true(whole > 0);
	evbuffer_free(want);
	reqhead_free(&head);
}

static void test_body_bytes(void **state)
{
	struct request *req = calloc(1, sizeof(*req));
	char body[3000];
	unsigned failed = 0;

	(void)state;
	assert_non_null(req);
	memset(body, 'b', sizeof(body));
	req->head.chunked = true;
	for (long k = 0; k < 16; k++) {
		req->x.pending = evbuffer_new();
		assert_non_null(req->x.pending);
		/* a first small piece fills a chain's start, so that the big one
		 * needs a chain of its own */
		assert_int_equal(request_body_bytes(req, "{}", 2), 0);
		size_t before = evbuffer_get_length(req->x.pending);
		allow = k;
		int r = request_body_bytes(req, body, sizeof(body));
		allow = -1;
		if (r == -1)
			failed++;
		else
			assert_int_equal(evbuffer_get_length(req->x.pending) - before, 5 + sizeof(body) + 2);
		evbuffer_free(req->x.pending);
	}
	assert_true(failed > 0);
	free(req);
}

/* The shadow's copy of a request (request_mirror_copy): its head, then the
 * body bytes read so far, copied segment by segment. Either all of it
 * (the same bytes as with memory to spare) or -1, whichever add fails:
 * the head's or the body's. */
static void test_mirror_copy(void **state)
{
	struct request *req = calloc(1, sizeof(*req));
	struct upstream shadow;
	char body[3000];
	unsigned failed_in_body = 0, whole = 0;

	(void)state;
	assert_non_null(req);
	memset(&shadow, 0, sizeof(shadow));
	shadow.name = "shadow";
	strcpy(req->rec.method, "POST");
	strcpy(req->rec.id, "oom-2");
	parse_head(&req->head);
	req->x.pending = evbuffer_new();
	assert_non_null(req->x.pending);
	memset(body, 'b', sizeof(body));
	assert_int_equal(evbuffer_add(req->x.pending, "{", 1), 0);
	for (int i = 0; i < 4; i++) /* several chains */
		assert_int_equal(evbuffer_add(req->x.pending, body, sizeof(body)), 0);
	size_t body_len = evbuffer_get_length(req->x.pending);

	struct evbuffer *want = evbuffer_new();
	assert_non_null(want);
	assert_int_equal(request_mirror_copy(req, &shadow, want), 0);
	assert_true(evbuffer_get_length(want) > body_len);

	for (long k = 0; k < 64; k++) {
		struct evbuffer *out = evbuffer_new(), *head_only = evbuffer_new();
		assert_non_null(out);
		assert_non_null(head_only);
		allow = k;
		int h = exchange_head_write(&req->head, &req->rec, &shadow, head_only);
		allow = -1;
		allow = k;
		int r = request_mirror_copy(req, &shadow, out);
		allow = -1;
		if (r == -1) {
			if (h == 0)
				failed_in_body++;
		} else {
			assert_int_equal(r, 0);
			assert_same_bytes(out, want);
			whole++;
		}
		evbuffer_free(out);
		evbuffer_free(head_only);
	}
	assert_true(failed_in_body > 0); /* the body's adds are checked too */
	assert_true(whole > 0);
	assert_int_equal(evbuffer_get_length(req->x.pending), body_len); /* the request's own are left */
	evbuffer_free(want);
	evbuffer_free(req->x.pending);
	reqhead_free(&req->head);
	free(req);
}

static void test_no_memory_kind(void **state)
{
	(void)state;
	assert_int_equal(REQ_ERR_NO_MEMORY, REQ_ERR__COUNT - 1);
	assert_string_equal(req_error_name(REQ_ERR_NO_MEMORY), "no_memory");
	assert_int_equal(exchange_fails[XF_NO_MEMORY].status, 503);
	assert_string_equal(exchange_fails[XF_NO_MEMORY].type, "overloaded");
	assert_int_equal(exchange_fails[XF_NO_MEMORY].kind, REQ_ERR_NO_MEMORY);
}

/* Many chains, each its own bytes: copied whole or not at all. */
static void test_copy(void **state)
{
	static char data[40][1000];
	struct evbuffer *src = evbuffer_new();
	unsigned failed = 0, whole = 0;

	(void)state;
	assert_non_null(src);
	for (int i = 0; i < 40; i++) {
		memset(data[i], 'a' + i % 26, sizeof(data[i]));
		data[i][0] = (char)i;
		assert_int_equal(evbuffer_add_reference(src, data[i], sizeof(data[i]), NULL, NULL), 0);
	}
	size_t len = evbuffer_get_length(src);
	for (long k = 0; k < 48; k++) {
		struct evbuffer *dst = evbuffer_new();
		assert_non_null(dst);
		assert_int_equal(evbuffer_add(dst, "head", 4), 0);
		allow = k;
		int r = bevio_copy(dst, src);
		allow = -1;
		assert_int_equal(evbuffer_get_length(src), len);
		if (r == -1) {
			failed++;
		} else {
			assert_int_equal(r, 0);
			assert_int_equal(evbuffer_get_length(dst), 4 + len);
			const char *d = (const char *)evbuffer_pullup(dst, -1);
			assert_memory_equal(d, "head", 4);
			for (int i = 0; i < 40; i++)
				assert_memory_equal(d + 4 + i * 1000, data[i], 1000);
			whole++;
		}
		evbuffer_free(dst);
	}
	assert_true(failed > 1);
	assert_true(whole > 0);
	evbuffer_free(src);
}

/* One client on a socket pair in `set`; its peer's end in *peer. */
static struct client *pair_client(struct client_set *set, int *peer)
{
	int sv[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
	atomic_fetch_add(set->clients_all, 1);
	client_new(set, sv[0], "pair", NULL);
	assert_int_equal(set->nclients, 1);
	*peer = sv[1];
	return LIST_FIRST(&set->clients);
}

/* What the peer reads until the answer is whole (its content-length met)
 * or the stream ends, the loop running meanwhile; *eof: it ended. */
static size_t read_answer(struct event_base *base, int fd, char *buf, size_t cap, bool *eof)
{
	size_t got = 0;

	*eof = false;
	for (int turn = 0; turn < 2000; turn++) {
		event_base_loop(base, EVLOOP_NONBLOCK);
		ssize_t n = recv(fd, buf + got, cap - 1 - got, MSG_DONTWAIT);
		if (n == 0) {
			*eof = true;
			break;
		}
		if (n > 0)
			got += (size_t)n;
		buf[got] = 0;
		const char *end = strstr(buf, "\r\n\r\n"), *cl = strstr(buf, "content-length: ");
		if (end && cl && got - (size_t)(end + 4 - buf) >= strtoull(cl + 16, NULL, 10))
			break;
		if (n < 0)
			nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	return got;
}

static void test_client_fail_whole_or_closed(void **state)
{
	struct event_base *base = event_base_new();
	struct router rt;
	_Atomic unsigned all = 0;
	struct client_set set = { .base = base, .clients_all = &all };
	/* a message long enough that the answer's body needs a chain of its
	 * own after its head's: an add can fail between them */
	char msg[3000], want[8192], got[8192];
	unsigned failed = 0, whole = 0;
	bool eof;
	int peer;

	(void)state;
	assert_non_null(base);
	memset(&rt, 0, sizeof(rt));
	config_defaults(&rt.cfg);
	set.renv.router = &rt;
	LIST_INIT(&set.clients);
	memset(msg, 'm', sizeof(msg) - 1);
	msg[sizeof(msg) - 1] = 0;

	struct client *cl = pair_client(&set, &peer);
	client_fail(cl, 503, REQ_ERR_NO_MEMORY, "overloaded", msg);
	size_t want_len = read_answer(base, peer, want, sizeof(want), &eof);
	assert_false(eof);
	assert_true(want_len > sizeof(msg));
	assert_memory_equal(want, "HTTP/1.1 503 ", 13);
	client_set_free_all(&set);
	close(peer);

	for (long k = 0; k < 12; k++) {
		cl = pair_client(&set, &peer);
		allow = k;
		client_fail(cl, 503, REQ_ERR_NO_MEMORY, "overloaded", msg);
		allow = -1;
		size_t n = read_answer(base, peer, got, sizeof(got), &eof);
		if (n == 0) {
			assert_true(eof); /* closed, nothing said */
			failed++;
			/* freed on the loop's next turn, as any closed client */
			for (int turn = 0; turn < 10 && set.nclients; turn++)
				event_base_loop(base, EVLOOP_NONBLOCK);
			assert_int_equal(set.nclients, 0);
		} else {
			assert_int_equal(n, want_len); /* never part of it */
			assert_memory_equal(got, want, want_len);
			whole++;
		}
		client_set_free_all(&set);
		close(peer);
	}
	assert_true(failed > 1); /* not only the first add failed */
	assert_true(whole > 0);
	assert_int_equal(all, 0);
	config_free(&rt.cfg);
	event_base_free(base);
}

int main(void)
{
	/* before any other libevent call: everything it allocates goes
	 * through these */
	event_set_mem_functions(oom_malloc, oom_realloc, oom_free);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_head_write),  cmocka_unit_test(test_body_bytes),
		cmocka_unit_test(test_mirror_copy), cmocka_unit_test(test_no_memory_kind),
		cmocka_unit_test(test_copy),	    cmocka_unit_test(test_client_fail_whole_or_closed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
