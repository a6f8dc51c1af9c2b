/*
 * client.c — one client connection: reading, the client state machine, the
 * request parser's hooks and error answers. reqparse.c parses each request
 * and decides what to refuse; client.c acts on its hooks (dispatch, body
 * bytes, message end) and answers its refusals. request.c holds the
 * request, exchange.c its upstream side, which reaches the client only
 * through the hooks at the end of this file (client_xhooks). proxy.c
 * accepts the connections.
 *
 *   client ──bytes──▶ [reqparse: llhttp + checks] ──head+body──▶ upstream connection
 *   client ◀──same bytes── [llhttp response ─▶ framer ─▶ classifier] ◀── upstream
 *
 * A client connection carries one request at a time: a pipelined request
 * waits, unparsed, in the client's input buffer until the response before it
 * has been written (llhttp is paused at each message end). The request head
 * is re-written for the upstream (hop-by-hop headers dropped, x-request-id
 * added); the request body is streamed as it arrives. The response is never
 * rewritten: once its head has parsed, every byte read from the upstream is
 * written to the client in the same callback (client_forward: straight to
 * the socket, over TLS through SSL_write, or into the output buffer when
 * the socket is behind).
 * Parsing it only stamps the timeline and feeds the event framer.
 *
 * Client states (client_set_state is the one place they change; the table
 * client_legal says which changes are legal, and CHECK aborts on others):
 *
 *   IDLE ──first byte──▶ HEAD ──headers──▶ BODY ──message end──▶ WAIT
 *     ▲                                                            │
 *     └──────────── response written, keep-alive ◀─────────────────┘
 *   IDLE, HEAD, BODY, WAIT ──error answer──▶ LINGER ──EOF / LINGER_MS──▶ CLOSED
 *   WAIT ──a WebSocket's 101──▶ TUNNEL ──either side closes, a limit──▶ CLOSED
 *   any ──close──▶ CLOSED ──next loop turn──▶ freed
 *
 * The upstream side of a request has its own states (EXCHANGE_STATES in
 * exchange.h, exchange.c).
 *
 * Backpressure follows libevent's le-proxy: when the destination's output
 * passes STREAM_BUFFER (exchange.h) the source stops reading, and the destination's
 * write callback (low watermark at half) resumes it. Memory per stream stays
 * bounded by a few buffers whatever the speeds of either side.
 *
 * Objects are never freed inside a call chain that may still touch them:
 * client_close() tears down the sockets at once (so an upstream sees an
 * aborted client immediately) and frees the memory from a zero timer.
 */
#include "client.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>
#include <jansson.h>
#include <linux/sockios.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bevio.h"
#include "check.h"
#include "config.h"
#include "exchange.h"
#include "log.h"
#include "loop.h"
#include "reqparse.h"
#include "request.h"
#include "router.h"
#include "rxstamp.h"
#include "timeline.h"
#include "tls.h"

static void client_close(struct client *cl, const char *why);
static void client_parse(struct client *cl);
static void client_reading(struct client *cl, bool on);
static const struct exchange_hooks client_xhooks;

static inline const struct config *client_cfg(const struct client *cl)
{
	return &cl->set->renv.router->cfg;
}

static const char *const client_state_names[] = {
#define X(s) #s,
	CLIENT_STATES(X)
#undef X
};

/* ---- small helpers ---- */

static const char *status_reason(int status)
{
	switch (status) {
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 408: return "Request Timeout";
	case 413: return "Content Too Large";
	case 414: return "URI Too Long";
	case 417: return "Expectation Failed";
	case 431: return "Request Header Fields Too Large";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	default: return "Error";
	}
}

#define CL_BIT(s) (1u << CL_##s)
/* For each state, the states it may change to. */
static const unsigned client_legal[CLIENT_STATE_COUNT] = {
	[CL_IDLE] = CL_BIT(HEAD) | CL_BIT(LINGER) | CL_BIT(CLOSED),
	[CL_HEAD] = CL_BIT(BODY) | CL_BIT(LINGER) | CL_BIT(CLOSED),
	[CL_BODY] = CL_BIT(WAIT) | CL_BIT(LINGER) | CL_BIT(CLOSED),
	[CL_WAIT] = CL_BIT(IDLE) | CL_BIT(TUNNEL) | CL_BIT(LINGER) | CL_BIT(CLOSED),
	[CL_TUNNEL] = CL_BIT(CLOSED),
	[CL_LINGER] = CL_BIT(CLOSED),
	[CL_CLOSED] = 0,
};

bool client_transition_legal(enum client_state from, enum client_state to)
{
	if ((unsigned)from >= CLIENT_STATE_COUNT || (unsigned)to >= CLIENT_STATE_COUNT)
		return false;
	return (client_legal[from] >> to) & 1u;
}

static void client_set_state(struct client *cl, enum client_state st)
{
	if (cl->state == st)
		return;
	if (log_enabled(LOG_DEBUG))
		log_conn(LOG_DEBUG, cl->id, "%s -> %s", client_state_names[cl->state], client_state_names[st]);
	CHECK(client_transition_legal(cl->state, st));
	/* TLS: OpenSSL's record buffers are let go whenever empty (tls.c), so
	 * that an idle keep-alive client holds none; while a response streams
	 * that would be a free and an allocation per record (about 690
	 * instructions of the 7,750 a one-event record costs), so they stay
	 * from the end of the request to the end of its answer. */
	if (!cl->rev && cl->bev && (st == CL_WAIT || cl->state == CL_WAIT))
		tls_bev_keep_buffers(cl->bev, st == CL_WAIT);
	cl->state = st;
}

/* ---- error answers ---- */

/* Answers the current request with a JSON error and closes the connection
 * (with a lingering read so the client sees the answer). When the response
 * already started, the only honest signal left is closing mid-stream. */
static void client_fail(struct client *cl, int status, enum req_error kind, const char *type, const char *msg)
{
	struct request *req = cl->req;

	if (client_ending(cl))
		return;
	if (req) {
		req->rec.error = kind;
		exchange_release(&req->x, false);
		if (req->rec.bytes_out) { /* the response has begun */
			log_conn(LOG_WARN, cl->id, "request %s: %s; closing mid-response", req->rec.id, msg);
			client_close(cl, msg);
			return;
		}
		req->rec.status = status;
	}
	json_t *body = json_pack("{s:{s:s,s:s,s:i}}", "error", "message", msg, "type", type, "code", status);
	char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	size_t tlen = text ? strlen(text) : 0;
	struct evbuffer *out = bufferevent_get_output(cl->bev);
	bool bad = false; /* an add failed: out of memory, no answer rather than a truncated one */
	bad |= evbuffer_add_printf(out,
				   "HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %zu\r\n"
				   "connection: close\r\n",
				   status, status_reason(status), tlen) < 0;
	if (req && req->rec.id[0])
		bad |= evbuffer_add_printf(out, "x-request-id: %s\r\n", req->rec.id) < 0;
	bad |= evbuffer_add(out, "\r\n", 2) == -1;
	bad |= evbuffer_add(out, text ? text : "", tlen) == -1;
	free(text);
	if (bad) {
		log_conn(LOG_WARN, cl->id, "%d %s: no memory for the error answer; closing", status, msg);
		client_close(cl, "no memory for the error answer");
		return;
	}
	log_conn(status >= 500 ? LOG_WARN : LOG_INFO, cl->id, "%d %s%s%s", status, msg, req ? " request " : "",
		 req ? req->rec.id : "");
	if (req)
		request_record(req);
	cl->close_after = true;
	client_set_state(cl, CL_LINGER);
	/* The answer goes out from the write callback; then linger. */
	bufferevent_setwatermark(cl->bev, EV_WRITE, 0, 0);
	bufferevent_enable(cl->bev, EV_WRITE);
	client_reading(cl, true);
	loop_deadline_set(&cl->timer, LINGER_MS);
}

/* ---- the request parser's hooks (reqparse.h decides, these act) ---- */

/*
 * The upload's timer (state BODY): the idle timeout from the last byte read
 * (a stalled upload), or the body deadline when that comes first. A client
 * that keeps trickling re-arms the first but never moves the second, so it
 * cannot hold an upstream connection and its admission slot for longer than
 * timeouts.body. While tokentap itself is not reading the client (upload
 * backpressure) the deadline is held (client_upload_blocked).
 */
static void client_body_timer(struct client *cl)
{
	uint64_t ms = client_cfg(cl)->idle_timeout_ms;

	cl->body_timer_deadline = false;
	if (cl->body_deadline_ns && !cl->blocked_since_ns) {
		uint64_t now = clock_now_ns();
		uint64_t left = cl->body_deadline_ns > now ? (cl->body_deadline_ns - now + 999999u) / 1000000u : 0;
		if (!ms || left <= ms) {
			ms = left;
			cl->body_timer_deadline = true;
		}
	}
	if (ms || cl->body_timer_deadline)
		loop_deadline_set(&cl->timer, ms);
	else
		loop_deadline_clear(&cl->timer);
}

/* Upload backpressure: stop (or resume) reading the client while its
 * upstream cannot take more of the body; the time stopped does not count
 * against the body deadline. */
static void client_upload_blocked(struct client *cl, bool blocked)
{
	if (cl->reading_blocked == blocked)
		return;
	cl->reading_blocked = blocked;
	if (blocked) {
		cl->blocked_since_ns = clock_now_ns();
	} else {
		if (cl->body_deadline_ns)
			cl->body_deadline_ns += clock_now_ns() - cl->blocked_since_ns;
		cl->blocked_since_ns = 0;
	}
	client_reading(cl, !blocked);
	if (cl->state == CL_BODY)
		client_body_timer(cl);
}

/* A request on `cl`, arrived when its bytes were last read. */
static struct request *client_request_new(struct client *cl)
{
	struct request *req = request_new(&cl->set->renv, &client_xhooks, cl,
					  cl->last_read_ns ? cl->last_read_ns : clock_now_ns(), cl->id);

	if (req)
		req->seq = ++cl->nrequests;
	return req;
}

static struct reqhead *on_req_begin(void *arg)
{
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);

	if (!cl->req) {
		cl->req = client_request_new(cl);
		if (!cl->req)
			return NULL;
	}
	client_set_state(cl, CL_HEAD);
	loop_deadline_set(&cl->timer, client_cfg(cl)->header_timeout_ms);
	return &cl->req->head;
}

static int on_req_head(void *arg, struct reqhead *h)
{
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	struct request *req = cl->req;
	const struct config *cfg = client_cfg(cl);

	loop_deadline_clear(&cl->timer);
	request_note_head(req);
	if (h->send_continue && bufferevent_write(cl->bev, "HTTP/1.1 100 Continue\r\n\r\n", 25) == -1) {
		client_close(cl, "out of memory for 100 Continue");
		return -1;
	}
	if (!h->keep_alive)
		cl->close_after = true;

	client_set_state(cl, CL_BODY);
	cl->body_deadline_ns = 0;
	if (h->chunked || h->content_length > 0) {
		cl->body_timeout_ms = cfg->body_timeout_ms;
		cl->body_deadline_ns = clock_now_ns() + cfg->body_timeout_ms * 1000000u;
	}
	client_body_timer(cl);
	/* Routing on the model or a body field waits for the body's first
	 * bytes (or its end); they wait in pending meanwhile. A chunked body
	 * waits at least for its first chunk line to parse, so a request whose
	 * framing is broken reaches no upstream. */
	if (req->x.rt->needs_body && (h->chunked || h->content_length > 0))
		exchange_set_state(&req->x, XS_AWAIT_BODY);
	else if (h->chunked)
		exchange_set_state(&req->x, XS_AWAIT_CHUNK);
	else
		request_route(req);
	return client_ending(cl) ? -1 : 0;
}

static int on_req_chunk(void *arg)
{
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	struct request *req = cl->req;

	if (req->x.xstate == XS_AWAIT_CHUNK)
		request_route(req);
	return client_ending(cl) ? -1 : 0;
}

static void on_req_body(void *arg, const char *at, size_t len)
{
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	struct request *req = cl->req;

	if (!req->reqinfo_done) {
		size_t room = BODY_INSPECT_MAX - req->body_prefix_len;
		size_t take = len < room ? len : room;
		if (request_prefix_buf(req)) {
			memcpy(req->body_prefix + req->body_prefix_len, at, take);
			req->body_prefix_len += take;
		}
		if (!req->body_prefix || req->body_prefix_len == BODY_INSPECT_MAX)
			request_learn_body(req, false);
	}
	if (request_body_bytes(req, at, len) == -1)
		client_fail(cl, 503, REQ_ERR_NO_MEMORY, "overloaded", "out of memory for the request body");
}

static void on_req_complete(void *arg)
{
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	struct request *req = cl->req;

	if (request_body_end(req) == -1)
		client_fail(cl, 503, REQ_ERR_NO_MEMORY, "overloaded", "out of memory for the request body");
	/* Routing on the body may have refused it: the answer is going out
	 * (LINGER), and the linger timer runs. */
	if (client_ending(cl))
		return;
	loop_deadline_clear(&cl->timer);
	cl->body_deadline_ns = 0;
	client_set_state(cl, CL_WAIT); /* reqparse pauses: a pipelined request waits for this response */
}

static const struct reqparse_hooks client_hooks = {
	.begin = on_req_begin,
	.head = on_req_head,
	.chunk = on_req_chunk,
	.body = on_req_body,
	.complete = on_req_complete,
};

/* ---- client connection ---- */

static void client_free(struct client *cl)
{
	struct client_set *set = cl->set;

	LIST_REMOVE(cl, link);
	set->nclients--;
	atomic_fetch_sub(set->clients_all, 1);
	request_free(cl->req);
	if (cl->rev)
		event_free(cl->rev);
	if (cl->bev)
		bufferevent_free(cl->bev);
	if (cl->timer.ev)
		event_free(cl->timer.ev);
	OBJ_MAGIC_CLEAR(cl);
	free(cl);
	if (set->draining && LIST_EMPTY(&set->clients) && set->drained) {
		void (*done)(void *) = set->drained;
		set->drained = NULL;
		done(set->drained_arg);
	}
}

static void on_deferred_free(evutil_socket_t fd, short what, void *arg)
{
	CHECK_OBJ((struct client *)arg, CLIENT_MAGIC);
	client_free(arg);
}

/* Ends the connection now: sockets close at once (an upstream sees its
 * client go within the same loop turn), memory goes on the next turn. */
static void client_close(struct client *cl, const char *why)
{
	struct request *req = cl->req;

	if (cl->state == CL_CLOSED && !cl->bev)
		return;
	client_set_state(cl, CL_CLOSED);
	if (req) {
		if (req->x.xstate != XS_DONE || evbuffer_get_length(bufferevent_get_output(cl->bev))) {
			if (req->rec.error == REQ_ERR_NONE)
				req->rec.error = REQ_ERR_CLIENT_ABORTED;
		}
		exchange_release(&req->x, false);
		if (req->rec.at[TL_REQ_HEADERS] || req->rec.status)
			request_record(req);
		request_free(req);
		cl->req = NULL;
	}
	log_conn(LOG_DEBUG, cl->id, "closed: %s", why);
	if (cl->tls_now || cl->tls_queued)
		log_conn(LOG_DEBUG, cl->id, "TLS: %llu response bytes written in the upstream read's call, %llu queued",
			 (unsigned long long)cl->tls_now, (unsigned long long)cl->tls_queued);
	if (cl->rev)
		event_del(cl->rev); /* freed with the client: this may be its callback */
	if (cl->bev) {
		bufferevent_free(cl->bev);
		cl->bev = NULL;
	}
	loop_deadline_stop(&cl->timer);
	struct timeval zero = { 0, 0 };
	if (event_base_once(cl->set->base, -1, EV_TIMEOUT, on_deferred_free, cl, &zero) == -1) {
		/* no memory even for that (a close for want of memory): the
		 * client's own timer frees it, which allocates nothing; freeing
		 * a timer in its own callback is safe */
		event_assign(cl->timer.ev, cl->set->base, -1, 0, on_deferred_free, cl);
		event_active(cl->timer.ev, EV_TIMEOUT, 1);
	}
}

/* The response is fully written: log it, then either close or take the next
 * (possibly already buffered) request. */
static void client_request_done(struct client *cl)
{
	struct request *req = cl->req;

	timeline_mark(&req->rec, TL_CLIENT_DONE, clock_now_ns());
	request_record(req);
	cl->req = NULL;
	cl->reading_blocked = false;
	cl->blocked_since_ns = 0;
	cl->body_deadline_ns = 0;
	request_retire(req); /* its memory and buffers serve a next request */
	if (cl->close_after || cl->set->draining) {
		client_close(cl, cl->set->draining ? "draining" : "response done, connection: close");
		return;
	}
	client_set_state(cl, CL_IDLE);
	reqparse_resume(&cl->parser);
	bufferevent_setwatermark(cl->bev, EV_WRITE, 0, 0);
	client_reading(cl, true);
	loop_deadline_set(&cl->timer, client_cfg(cl)->keepalive_timeout_ms);
	if (evbuffer_get_length(bufferevent_get_input(cl->bev)))
		client_parse(cl);
}

/* Answers a request reqparse refused, with the status and reason it chose. */
static void client_reject(struct client *cl)
{
	struct request *req = cl->req;
	char msg[160];
	int status;

	if (!req) {
		cl->req = req = client_request_new(cl);
		if (!req) {
			client_close(cl, "out of memory");
			return;
		}
	}
	status = reqparse_refusal(&cl->parser, msg, sizeof(msg));
	if (req->head.parsed)
		request_note_head(req);
	if (!req->rec.id[0])
		request_id_generate(&cl->set->renv.ids, req->rec.id, sizeof(req->rec.id));
	client_fail(cl, status, REQ_ERR_BAD_REQUEST, "invalid_request", msg);
}

/* Feeds buffered client bytes to the request parser, one request at a time. */
static void client_parse(struct client *cl)
{
	struct evbuffer *in;

	if (!cl->bev)
		return;
	in = bufferevent_get_input(cl->bev);
	while (cl->state != CL_WAIT && !client_ending(cl) && evbuffer_get_length(in)) {
		struct evbuffer_iovec v;
		size_t used;
		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
			break;
		if (cl->req)
			cl->req->x.corked = true; /* inside a parse pass: flushed after it */
		enum reqparse_status rs = reqparse_feed(&cl->parser, v.iov_base, v.iov_len, &used);
		if (cl->req)
			cl->req->x.corked = false;
		if (client_ending(cl))
			return; /* a hook already answered or closed */
		if (rs == REQPARSE_REFUSED || rs == REQPARSE_STOPPED) {
			client_reject(cl);
			return;
		}
		evbuffer_drain(in, used);
		if (cl->req)
			cl->req->rec.bytes_in += used;
		if (cl->req)
			(void)exchange_flush(&cl->req->x); /* a failure answers: the loop ends */
		if (rs == REQPARSE_PAUSED)
			break;
		if (cl->reading_blocked)
			break;
	}
	if (cl->input_full && evbuffer_get_length(in) < CLIENT_INPUT_MAX) {
		cl->input_full = false;
		client_reading(cl, cl->reading);
	}
	if (cl->req && !client_ending(cl))
		exchange_check_sent(&cl->req->x);
}

/*
 * Reading a client. Over plain TCP tokentap reads the socket itself with
 * recvmsg() instead of through the bufferevent, because only recvmsg()
 * carries the kernel's receive stamp (rxstamp.h): a request `arrive`s when
 * its first byte reached this host, not when this loop got round to reading
 * it. Without that, a loop busy finishing the previous response (logging,
 * recording) would shorten the ttft of the request the client sent right
 * after it. The bufferevent still does the writing, and over TLS both.
 * At most CLIENT_INPUT_MAX bytes wait unparsed (a pipelined request waits
 * for the response before it); beyond that reading pauses until
 * client_parse() has consumed some.
 */
static void client_reading(struct client *cl, bool on)
{
	if (!cl->bev)
		return;
	if (!cl->rev) {
		if (on)
			bufferevent_enable(cl->bev, EV_READ);
		else
			bufferevent_disable(cl->bev, EV_READ);
		return;
	}
	cl->reading = on;
	if (on && !cl->input_full)
		event_add(cl->rev, NULL);
	else
		event_del(cl->rev);
}

static void on_client_event(struct bufferevent *bev, short what, void *arg);

/*
 * Queues the first n bytes of `src` on the client's output by copying them
 * into the free end of its last chain, not by moving `src`'s chains: an
 * upstream read reserves 64 KiB, which libevent allocates as a 128 KiB
 * chain, and a moved chain keeps its whole allocation, so a stream that
 * arrives an event per read would hold STREAM_BUFFER's worth of bytes in
 * over a hundred times that much memory while its client is slow. What
 * cannot be copied (more pieces than `v` holds, no memory) is moved.
 */
static void client_queue(struct evbuffer *out, struct evbuffer *src, size_t n)
{
	struct evbuffer_iovec v[4];
	int nv = evbuffer_peek(src, (ev_ssize_t)n, NULL, v, 4);
	size_t done = 0;

	for (int i = 0; i < nv && i < 4 && done < n; i++) {
		size_t len = v[i].iov_len < n - done ? v[i].iov_len : n - done;
		if (evbuffer_add(out, v[i].iov_base, len) == -1)
			break;
		done += len;
	}
	evbuffer_drain(src, done);
	if (done < n)
		evbuffer_remove_buffer(src, out, n - done);
}

/*
 * Sends the first n bytes of `src` to the client. When nothing is queued
 * before them, they are written to the socket here and now: over plain TCP
 * with one writev, over TLS with SSL_write from `src`'s own chains
 * (tls_bev_write, a record per chain piece of up to 16 KiB). A bufferevent
 * would copy them into its output and write on the next loop turn (two
 * epoll_ctl calls and a wake-up per chunk, and the token that much later):
 * over TLS that was every response's first read (its head and the events
 * that came with it) and a last read that ended it. Whatever the socket does
 * not take is queued (client_queue) on the bufferevent's output, which
 * writes it as the socket drains and reports errors. A failed write leaves
 * the bytes for the bufferevent too, so errors have one path.
 */
static void client_forward(struct client *cl, struct evbuffer *src, size_t n)
{
	struct evbuffer *out = bufferevent_get_output(cl->bev);

	if (cl->rev && evbuffer_get_length(out) == 0) {
		int w = evbuffer_write_atmost(src, bufferevent_getfd(cl->bev), (ev_ssize_t)n);
		if (w > 0)
			n -= (size_t)w;
	} else if (!cl->rev) { /* tls_bev_write takes nothing while bytes wait in `out` */
		struct evbuffer_iovec v[4];
		int nv = evbuffer_peek(src, (ev_ssize_t)n, NULL, v, 4);
		size_t done = 0;
		for (int i = 0; i < nv && i < 4 && done < n; i++) {
			size_t len = v[i].iov_len < n - done ? v[i].iov_len : n - done;
			size_t w = tls_bev_write(cl->bev, v[i].iov_base, len);
			done += w;
			if (w < len)
				break; /* the socket is full (or failed): the rest queues behind */
		}
		evbuffer_drain(src, done);
		n -= done;
		cl->tls_now += done;
		cl->tls_queued += n;
	}
	if (n)
		client_queue(out, src, n);
}

/* client_forward for `n` bytes in memory the caller keeps: those the socket
 * does not take now are copied onto the output. Returns false when they
 * could not be (no memory): the client has been closed, the stream being
 * cut. */
static bool client_forward_mem(struct client *cl, const char *p, size_t n)
{
	struct evbuffer *out = bufferevent_get_output(cl->bev);

	if (cl->rev && evbuffer_get_length(out) == 0) {
		ssize_t w = send(bufferevent_getfd(cl->bev), p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w > 0) {
			p += w;
			n -= (size_t)w;
		}
	} else if (!cl->rev) {
		size_t w = tls_bev_write(cl->bev, p, n); /* TLS: now too */
		p += w;
		n -= w;
		cl->tls_now += w;
		cl->tls_queued += n;
	}
	if (n && evbuffer_add(out, p, n) == -1) {
		client_close(cl, "no memory for the response's bytes");
		return false;
	}
	return true;
}

/* A tunnel took client bytes: reading goes on if it stopped at
 * CLIENT_INPUT_MAX (bytes that came while the handshake waited for its
 * 101 fill the input up to it). */
static void client_tunnel_refill(struct client *cl)
{
	if (cl->state == CL_TUNNEL && cl->input_full &&
	    evbuffer_get_length(bufferevent_get_input(cl->bev)) < CLIENT_INPUT_MAX) {
		cl->input_full = false;
		client_reading(cl, cl->reading);
	}
}

/* New bytes are in the client's input buffer, read at cl->last_read_ns. */
static void client_input(struct client *cl)
{
	struct evbuffer *in = bufferevent_get_input(cl->bev);

	if (client_ending(cl)) {
		/* lingering: drop what the client still sends */
		evbuffer_drain(in, evbuffer_get_length(in));
		return;
	}
	if (cl->state == CL_TUNNEL) {
		tunnel_client_input(&cl->req->tunnel);
		client_tunnel_refill(cl);
		return;
	}
	if (cl->state == CL_BODY)
		client_body_timer(cl); /* the idle stall re-armed; the deadline stays */
	client_parse(cl);
}

#define CLIENT_READ_MAX (16u << 10) /* bytes asked of one recvmsg() */

static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
	uint64_t now = clock_now_ns(); /* first: the fallback stamp */
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	size_t have = evbuffer_get_length(bufferevent_get_input(cl->bev));
	union rxstamp_ctl ctl;
	struct msghdr msg = { 0 };
	ssize_t n;

	(void)what;
	if (have >= CLIENT_INPUT_MAX) {
		cl->input_full = true;
		client_reading(cl, cl->reading);
		return;
	}
	size_t want = CLIENT_INPUT_MAX - have < CLIENT_READ_MAX ? CLIENT_INPUT_MAX - have : CLIENT_READ_MAX;
	rxstamp_prepare(&msg, &ctl);
	n = bevio_recv(cl->bev, fd, want, &msg);
	if (n == BEVIO_NOMEM) {
		client_close(cl, "out of memory reading the client");
		return;
	}
	if (n <= 0) {
		if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return;
		on_client_event(cl->bev, BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), cl);
		return;
	}
	cl->last_read_ns = rxstamp_of(&cl->set->rxclock, &msg, now);
	client_input(cl);
}

/* TLS: the bufferevent reads (and decrypts). */
static void on_client_read(struct bufferevent *bev, void *arg)
{
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);

	(void)bev;
	cl->last_read_ns = clock_now_ns();
	client_input(cl);
}

static void on_client_write(struct bufferevent *bev, void *arg)
{
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	struct request *req = cl->req;
	struct evbuffer *out = bufferevent_get_output(bev);

	if (cl->state == CL_LINGER) {
		if (evbuffer_get_length(out) == 0) {
			/* error answer written: half-close and linger until EOF or
			 * timer (over TLS, the timer alone: a TCP half-close would
			 * cut the TLS session short) */
			if (!tls_bev_is_tls(bev))
				shutdown(bufferevent_getfd(bev), SHUT_WR);
		}
		return;
	}
	if (!req)
		return;
	if (cl->state == CL_TUNNEL) {
		if (req->tunnel.ended && evbuffer_get_length(out) == 0)
			client_close(cl, "WebSocket tunnel ended");
		else
			tunnel_client_drained(&req->tunnel);
		return;
	}
	if (req->x.xstate == XS_PAUSED && req->x.uc) {
		if (exchange_resume(&req->x) == XR_ENDED)
			return; /* it ended there: `req` may be gone */
	}
	if (req->x.xstate == XS_DONE && evbuffer_get_length(out) == 0)
		client_request_done(cl);
}

static void on_client_event(struct bufferevent *bev, short what, void *arg)
{
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);

	if (what & BEV_EVENT_CONNECTED)
		return; /* a TLS handshake finished: nothing to do */

	if (cl->state == CL_LINGER && cl->req && cl->req->x.xstate == XS_DONE) {
		client_close(cl, "closed after error answer");
		return;
	}
	if (cl->state == CL_TUNNEL && !cl->req->tunnel.ended) {
		tunnel_client_closed(&cl->req->tunnel, !(what & BEV_EVENT_EOF)); /* its end hook closes */
		return;
	}
	client_close(cl, (what & BEV_EVENT_EOF) ? "client closed the connection" : "client connection error");
}

static void on_client_timer(evutil_socket_t fd, short what, void *arg)
{
	struct client *cl = arg;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	char msg[120];

	if (!loop_deadline_due(&cl->timer))
		return; /* moved later, or cleared, since the event was armed */
	switch (cl->state) {
	case CL_IDLE: client_close(cl, "keep-alive timeout"); break;
	case CL_HEAD:
		snprintf(msg, sizeof(msg), "request headers not received within %llu ms",
			 (unsigned long long)client_cfg(cl)->header_timeout_ms);
		client_fail(cl, 408, REQ_ERR_BAD_REQUEST, "request_timeout", msg);
		break;
	case CL_BODY:
		/* the client's fault either way, so client_aborted; if the
		 * upstream already answered, client_fail cuts the exchange */
		if (cl->body_timer_deadline)
			snprintf(msg, sizeof(msg), "request body not received within %llu ms of its head",
				 (unsigned long long)cl->body_timeout_ms);
		else
			snprintf(msg, sizeof(msg), "request body stalled for %llu ms",
				 (unsigned long long)client_cfg(cl)->idle_timeout_ms);
		client_fail(cl, 408, REQ_ERR_CLIENT_ABORTED, "request_timeout", msg);
		break;
	case CL_LINGER: client_close(cl, "linger done"); break;
	case CL_TUNNEL: client_close(cl, "WebSocket tunnel ended; the client did not take its last bytes"); break;
	case CL_WAIT:
	case CL_CLOSED: break;
	}
}

/*
 * A plain client's output gets its write watch when the first bytes are
 * queued on it, that is when a write from client_forward would have blocked
 * (or an answer goes out from the write callback): enabled at accept, an
 * empty output would cost an epoll_ctl to add the watch, a wake-up as the
 * socket reports itself writable and another epoll_ctl to drop it again,
 * on every connection. Once enabled it stays, as it did before.
 */
static void client_out_added(struct evbuffer *out, const struct evbuffer_cb_info *info, void *arg)
{
	struct client *cl = arg;

	if (!info->n_added)
		return;
	evbuffer_remove_cb(out, client_out_added, cl);
	bufferevent_enable(cl->bev, EV_WRITE);
}

void client_new(struct client_set *set, int fd, const char *peer, struct ssl_ctx_st *tls)
{
	struct client *cl = calloc(1, sizeof(*cl));

	if (!cl) {
		evutil_closesocket(fd);
		atomic_fetch_sub(set->clients_all, 1);
		return;
	}
	OBJ_MAGIC_SET(cl, CLIENT_MAGIC);
	cl->set = set;
	cl->id = ++set->next_client_id;
	cl->bev =
		tls ? tls_bev_accept(set->base, tls, fd) : bufferevent_socket_new(set->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!tls) {
		cl->rev = event_new(set->base, fd, EV_READ | EV_PERSIST, on_client_readable, cl);
	}
	cl->timer.ev = evtimer_new(set->base, on_client_timer, cl);
	if (!cl->bev || !cl->timer.ev || (!tls && !cl->rev)) {
		if (cl->rev)
			event_free(cl->rev);
		if (cl->bev)
			bufferevent_free(cl->bev);
		else
			evutil_closesocket(fd);
		if (cl->timer.ev)
			event_free(cl->timer.ev);
		free(cl);
		atomic_fetch_sub(set->clients_all, 1);
		return;
	}
	snprintf(cl->peer, sizeof(cl->peer), "%s", peer);
	reqparse_init(&cl->parser, &client_hooks, cl);
	LIST_INSERT_HEAD(&set->clients, cl, link);
	set->nclients++;
	bufferevent_setcb(cl->bev, on_client_read, on_client_write, on_client_event, cl);
	bufferevent_setwatermark(cl->bev, EV_READ, 0, CLIENT_INPUT_MAX);
	if (tls || !evbuffer_add_cb(bufferevent_get_output(cl->bev), client_out_added, cl))
		bufferevent_enable(cl->bev, EV_WRITE);
	client_reading(cl, true);
	loop_deadline_set(&cl->timer, client_cfg(cl)->keepalive_timeout_ms);
	log_conn(LOG_DEBUG, cl->id, "accepted from %s", cl->peer);
}

void client_set_free_all(struct client_set *set)
{
	struct client *cl;

	while ((cl = LIST_FIRST(&set->clients)))
		client_free(cl);
}

unsigned client_set_close_idle(struct client_set *set)
{
	struct client *cl, *next;
	unsigned busy = 0;

	for (cl = LIST_FIRST(&set->clients); cl; cl = next) {
		next = LIST_NEXT(cl, link);
		if (cl->state == CL_CLOSED)
			continue;
		if (cl->state == CL_IDLE && !cl->req && evbuffer_get_length(bufferevent_get_input(cl->bev)) == 0)
			client_close(cl, "draining: idle");
		else
			busy++;
	}
	return busy;
}

unsigned client_set_cut(struct client_set *set)
{
	struct client *cl, *next;
	unsigned cut = 0;

	for (cl = LIST_FIRST(&set->clients); cl; cl = next) {
		next = LIST_NEXT(cl, link);
		if (cl->state != CL_CLOSED) {
			cut++;
			client_close(cl, "shutdown grace period over");
		}
	}
	return cut;
}

/* ---- the primary's exchange hooks (exchange.h): the client is the owner ---- */

static enum xr xh_forward(void *owner, const struct xsrc *src, size_t n)
{
	struct client *cl = owner;
	CHECK_OBJ(cl, CLIENT_MAGIC);

	if (src->mem)
		return client_forward_mem(cl, src->mem, n) ? XR_OK : XR_ENDED;
	client_forward(cl, src->buf, n);
	return XR_OK;
}

/* Bytes on their way to the client: its output buffer, and (`deep`) the
 * socket's send queue, which a large send buffer lets hold seconds of a
 * slow reader's stream while the output buffer does not move. */
static size_t xh_backlog(void *owner, bool deep)
{
	struct client *cl = owner;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	size_t n = evbuffer_get_length(bufferevent_get_output(cl->bev));
	int queued = 0;

	if (deep && ioctl(bufferevent_getfd(cl->bev), SIOCOUTQ, &queued) == 0 && queued > 0)
		n += (size_t)queued;
	return n;
}

/* The write callback (on_client_write) resumes the exchange once the
 * output is down to `low`. */
static void xh_want_drain(void *owner, size_t low)
{
	struct client *cl = owner;
	CHECK_OBJ(cl, CLIENT_MAGIC);

	bufferevent_setwatermark(cl->bev, EV_WRITE, low, 0);
}

static enum xr xh_upload(void *owner, bool on)
{
	struct client *cl = owner;
	CHECK_OBJ(cl, CLIENT_MAGIC);

	if (!on) {
		if (!cl->reading_blocked)
			client_upload_blocked(cl, true);
		return XR_OK;
	}
	if (!cl->reading_blocked)
		return XR_OK;
	uint64_t seq = cl->req->seq;
	client_upload_blocked(cl, false);
	client_parse(cl);
	return client_runs(cl, seq) ? XR_OK : XR_ENDED;
}

static void xh_fail(void *owner, enum xfail why, const char *msg)
{
	const struct xfail_info *f = &exchange_fails[why];

	CHECK_OBJ((struct client *)owner, CLIENT_MAGIC);
	client_fail(owner, f->status, f->kind, f->type, msg);
}

/* The response is all forwarded: the client finishes the request once its
 * output has drained (here, or from on_client_write). */
static void xh_done(void *owner)
{
	struct client *cl = owner;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	struct request *req = cl->req;

	/* The upstream answered before the client finished its body: the rest
	 * of that body cannot be told from a next request. A response that
	 * ends its connection ends the client's too (on_resp_complete). */
	if (!req->x.body_done || req->x.resp_close)
		cl->close_after = true;
	if (evbuffer_get_length(bufferevent_get_output(cl->bev)) == 0)
		client_request_done(cl);
}

/* ---- the tunnel's hooks (tunnel.h): a WebSocket after its 101 ---- */

static void th_to_client(void *owner, struct evbuffer *src, size_t n)
{
	struct client *cl = owner;
	CHECK_OBJ(cl, CLIENT_MAGIC);

	client_forward(cl, src, n);
}

static size_t th_backlog(void *owner)
{
	return xh_backlog(owner, false);
}

static void th_reading(void *owner, bool on)
{
	struct client *cl = owner;
	CHECK_OBJ(cl, CLIENT_MAGIC);

	client_reading(cl, on);
}

static void th_end(void *owner, const char *why)
{
	struct client *cl = owner;
	CHECK_OBJ(cl, CLIENT_MAGIC);

	if (evbuffer_get_length(bufferevent_get_output(cl->bev)) == 0) {
		client_close(cl, why);
		return;
	}
	/* what is queued goes out first (on_client_write closes), within
	 * LINGER_MS (on_client_timer) */
	log_conn(LOG_DEBUG, cl->id, "%s; writing the client's last bytes", why);
	client_reading(cl, false);
	bufferevent_setwatermark(cl->bev, EV_WRITE, 0, 0);
	loop_deadline_set(&cl->timer, LINGER_MS);
}

static const struct tunnel_hooks client_thooks = {
	.to_client = th_to_client,
	.client_backlog = th_backlog,
	.client_reading = th_reading,
	.client_want_drain = xh_want_drain,
	.end = th_end,
};

/* The upstream answered a WebSocket handshake with 101: it went to the
 * client, and the connection is a tunnel from here. */
static void xh_upgraded(void *owner)
{
	struct client *cl = owner;
	CHECK_OBJ(cl, CLIENT_MAGIC);
	struct request *req = cl->req;
	const struct config *cfg = client_cfg(cl);
	const struct tunnel_conf tc = {
		.max_frame = cfg->ws_max_frame_size,
		.max_message = cfg->ws_max_message_size,
		.idle_ms = cfg->ws_idle_timeout_ms,
		.session_ms = cfg->ws_session_timeout_ms,
	};

	if (cl->state != CL_WAIT) {
		/* the handshake's GET has no body: its message ended before any answer */
		client_close(cl, "a 101 before the handshake's end");
		return;
	}
	loop_deadline_clear(&cl->timer);
	cl->close_after = true;
	client_set_state(cl, CL_TUNNEL);
	log_conn(LOG_DEBUG, cl->id, "request %s: WebSocket tunnel to %s", req->rec.id, req->x.up->name);
	if (tunnel_start(&req->tunnel, cl->set->base, &tc, &client_thooks, cl, &req->x,
			 bufferevent_get_input(cl->bev)) == -1) {
		client_close(cl, "out of memory for the WebSocket tunnel");
		return;
	}
	/* the tunnel may have ended (and the client closed) already */
	client_tunnel_refill(cl);
}

static const struct exchange_hooks client_xhooks = {
	.forward = xh_forward,
	.backlog = xh_backlog,
	.want_drain = xh_want_drain,
	.upload = xh_upload,
	.fail = xh_fail,
	.done = xh_done,
	.upgraded = xh_upgraded,
};
