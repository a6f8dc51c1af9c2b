/*
 * proxy.c — the client side: the listener, client connections, the request
 * state machine and error answers. reqparse.c parses each request and
 * decides what to refuse; proxy.c acts on its hooks (dispatch, body bytes,
 * message end) and answers its refusals. exchange.c holds the upstream side
 * of each request; proxy_int.h what the two share.
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
 * the socket, or moved, not copied, into the output buffer when the socket
 * is behind).
 * Parsing it only stamps the timeline and feeds the event framer.
 *
 * Client states (client_set_state is the one place they change; the table
 * client_legal says which changes are legal, and CHECK aborts on others):
 *
 *   IDLE ──first byte──▶ HEAD ──headers──▶ BODY ──message end──▶ WAIT
 *     ▲                                                            │
 *     └──────────── response written, keep-alive ◀─────────────────┘
 *   IDLE, HEAD, BODY, WAIT ──error answer──▶ LINGER ──EOF / LINGER_MS──▶ CLOSED
 *   any ──close──▶ CLOSED ──next loop turn──▶ freed
 *
 * The upstream side of a request has its own states (EXCHANGE_STATES in
 * proxy_int.h, exchange.c).
 *
 * Backpressure follows libevent's le-proxy: when the destination's output
 * passes cfg->stream_buffer the source stops reading, and the destination's
 * write callback (low watermark at half) resumes it. Memory per stream stays
 * bounded by a few buffers whatever the speeds of either side.
 *
 * Objects are never freed inside a call chain that may still touch them:
 * client_close() tears down the sockets at once (so an upstream sees an
 * aborted client immediately) and frees the memory from a zero timer.
 */
#include "proxy.h"
#include "proxy_int.h"

#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <jansson.h>
#include <llhttp.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bevio.h"
#include "check.h"
#include "classify.h"
#include "config.h"
#include "fdlimit.h"
#include "log.h"
#include "loop.h"
#include "mirror.h"
#include "reqparse.h"
#include "reqinfo.h"
#include "router.h"
#include "rxstamp.h"
#include "strutil.h"
#include "timeline.h"
#include "tls.h"
#include "upstream.h"
#include "workload.h"

static void client_close(struct client *cl, const char *why);

static const char *const client_state_names[] = {
#define X(s) #s,
	CLIENT_STATES(X)
#undef X
};

/* ---- small helpers ---- */

static void format_addr(const struct sockaddr *sa, char *out, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const void *)sa;
		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		snprintf(out, len, "[%s]:%u", host, ntohs(s6->sin6_port));
	} else {
		const struct sockaddr_in *s4 = (const void *)sa;
		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		snprintf(out, len, "%s:%u", host, ntohs(s4->sin_port));
	}
}

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
	[CL_WAIT] = CL_BIT(IDLE) | CL_BIT(LINGER) | CL_BIT(CLOSED),
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
	cl->state = st;
}

/* Request ids: 128 bits from a random seed and a counter, mixed so that ids
 * look random yet never repeat within a process. */
static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void request_id_generate(struct proxy *px, char *out, size_t len)
{
	uint64_t hi = mix64(px->id_seed + ++px->id_counter);
	snprintf(out, len, "%016llx%016llx", (unsigned long long)hi, (unsigned long long)mix64(hi ^ px->id_seed));
}

/* A client-supplied id is kept only when it is safe to log and forward. */
static bool request_id_acceptable(const char *s, size_t len)
{
	if (len == 0 || len > REQUEST_ID_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\')
			return false;
	}
	return true;
}

/* ---- request objects ---- */

static struct request *request_new(struct client *cl)
{
	const struct config *cfg = pcfg(cl->px);
	const struct reqparse_limits lim = { cfg->max_header_size, cfg->max_headers, cfg->max_body_size };
	struct request *req = calloc(1, sizeof(*req));

	if (!req)
		return NULL;
	req->cl = cl;
	req->seq = ++cl->nrequests;
	int head_ok = reqhead_init(&req->head, &lim);
	req->up_pending = evbuffer_new();
	req->timer = evtimer_new(cl->px->base, on_exchange_timer, req);
	if (head_ok == -1 || !req->up_pending || !req->timer) {
		reqhead_free(&req->head);
		if (req->up_pending)
			evbuffer_free(req->up_pending);
		if (req->timer)
			event_free(req->timer);
		free(req);
		return NULL;
	}
	req->rec.usage = USAGE_UNKNOWN;
	req->rec.stream = -1;
	req->rec.itl_keep = cl->px->alog != NULL;
	req->rt = cl->px->router;
	router_ref(req->rt);
	req->rec.at[TL_ARRIVE] = cl->last_read_ns ? cl->last_read_ns : clock_now_ns();
	exchange_request_init(req);
	return req;
}

static void request_free(struct request *req)
{
	if (!req)
		return;
	request_drop_upstream(req, false);
	if (req->mirror)
		mirror_detach(req->mirror, req->body_done);
	meter_free(&req->meter);
	workload_req_free(req->rec.wl);
	record_release(&req->rec);
	if (req->up_pending)
		evbuffer_free(req->up_pending);
	if (req->replay)
		evbuffer_free(req->replay);
	if (req->timer)
		event_free(req->timer);
	reqhead_free(&req->head);
	free(req->body_prefix);
	router_unref(req->rt);
	free(req);
}

/* Each request is logged and counted once, when its outcome is known
 * (meter_finish). */
static void request_log(struct request *req)
{
	request_meter_label(req);
	meter_finish(&req->meter, req->up);
}

/* ---- error answers ---- */

/* Answers the current request with a JSON error and closes the connection
 * (with a lingering read so the client sees the answer). When the response
 * already started, the only honest signal left is closing mid-stream. */
void client_fail(struct client *cl, int status, enum req_error kind, const char *type, const char *msg)
{
	struct request *req = cl->req;

	if (client_ending(cl))
		return;
	if (req) {
		req->rec.error = kind;
		request_drop_upstream(req, false);
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
	evbuffer_add_printf(out,
			    "HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %zu\r\n"
			    "connection: close\r\n",
			    status, status_reason(status), tlen);
	if (req && req->rec.id[0])
		evbuffer_add_printf(out, "x-request-id: %s\r\n", req->rec.id);
	evbuffer_add(out, "\r\n", 2);
	evbuffer_add(out, text ? text : "", tlen);
	free(text);
	log_conn(status >= 500 ? LOG_WARN : LOG_INFO, cl->id, "%d %s%s%s", status, msg, req ? " request " : "",
		 req ? req->rec.id : "");
	if (req)
		request_log(req);
	cl->close_after = true;
	client_set_state(cl, CL_LINGER);
	/* The answer goes out from the write callback; then linger. */
	bufferevent_setwatermark(cl->bev, EV_WRITE, 0, 0);
	bufferevent_enable(cl->bev, EV_WRITE);
	client_reading(cl, true);
	loop_timer_arm(cl->timer, LINGER_MS);
}

/* ---- the request parser's hooks (reqparse.h decides, these act) ---- */

/* What the record takes from a parsed head: method, path, API, id and the
 * default stream flag. Runs once per request, when the head has parsed,
 * whether it is then dispatched or refused (a refused request is logged
 * with them). */
static void request_note_head(struct request *req)
{
	struct client *cl = req->cl;
	const struct reqhead *rh = &req->head;
	const char *method = llhttp_method_name(rh->method);
	const char *url = rh->buf + rh->url_off;
	const struct hdr *h;
	size_t plen = 0;

	if (req->rec.at[TL_REQ_HEADERS])
		return;
	timeline_mark(&req->rec, TL_REQ_HEADERS, clock_now_ns());
	evtimer_del(cl->timer);
	copy_trunc(req->rec.method, sizeof(req->rec.method), method, strlen(method));
	while (plen < rh->url_len && url[plen] != '?' && url[plen] != '#')
		plen++;
	copy_trunc(req->rec.path, sizeof(req->rec.path), url, plen);
	req->rec.api = classify_api(url, plen);
	h = reqhead_header(rh, "x-request-id");
	if (h && request_id_acceptable(rh->buf + h->val_off, h->val_len))
		copy_trunc(req->rec.id, sizeof(req->rec.id), rh->buf + h->val_off, h->val_len);
	else
		request_id_generate(cl->px, req->rec.id, sizeof(req->rec.id));
	if (req->rec.api == API_OLLAMA_CHAT || req->rec.api == API_OLLAMA_GENERATE)
		req->rec.stream = 1; /* Ollama streams unless told not to */
	else
		req->rec.stream = 0;
}

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
	uint64_t ms = pcfg(cl->px)->idle_timeout_ms;

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
		loop_timer_arm(cl->timer, ms);
	else
		evtimer_del(cl->timer);
}

void client_upload_blocked(struct client *cl, bool blocked)
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

static struct reqhead *on_req_begin(void *arg)
{
	struct client *cl = arg;

	if (!cl->req) {
		cl->req = request_new(cl);
		if (!cl->req)
			return NULL;
	}
	client_set_state(cl, CL_HEAD);
	loop_timer_arm(cl->timer, pcfg(cl->px)->header_timeout_ms);
	return &cl->req->head;
}

static int on_req_head(void *arg, struct reqhead *h)
{
	struct client *cl = arg;
	struct request *req = cl->req;
	const struct config *cfg = pcfg(cl->px);

	request_note_head(req);
	if (h->send_continue)
		bufferevent_write(cl->bev, "HTTP/1.1 100 Continue\r\n\r\n", 25);
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
	 * bytes (or its end); they wait in up_pending meanwhile. A chunked body
	 * waits at least for its first chunk line to parse, so a request whose
	 * framing is broken reaches no upstream. */
	if (req->rt->needs_body && (h->chunked || h->content_length > 0))
		exchange_set_state(req, XS_AWAIT_BODY);
	else if (h->chunked)
		exchange_set_state(req, XS_AWAIT_CHUNK);
	else
		request_route(req);
	return client_ending(cl) ? -1 : 0;
}

static int on_req_chunk(void *arg)
{
	struct client *cl = arg;
	struct request *req = cl->req;

	if (req->xstate == XS_AWAIT_CHUNK)
		request_route(req);
	return client_ending(cl) ? -1 : 0;
}

/* Reads the model, stream flag and any sticky field from the body prefix;
 * then routes the request if routing was waiting for them. The sticky field
 * is the one of the route the request matches, which may depend on the
 * model: so the model first, then the route, then (a second read of the
 * prefix) that route's field. */
static void request_learn_body(struct request *req, bool complete)
{
	struct reqinfo info;

	if (req->reqinfo_done)
		return;
	req->reqinfo_done = true;
	if (req->body_prefix_len && reqinfo_parse(req->body_prefix, req->body_prefix_len, complete, &info) == 0) {
		copy_trunc(req->rec.model, sizeof(req->rec.model), info.model, strlen(info.model));
		if (info.stream >= 0)
			req->rec.stream = info.stream;
		const struct route *r = request_match(req);
		if (r && r->conf->sticky == STICKY_JSON_FIELD &&
		    reqinfo_parse_field(req->body_prefix, req->body_prefix_len, complete, r->conf->sticky_key, &info) ==
			    0)
			copy_trunc(req->sticky_value, sizeof(req->sticky_value), info.field_value,
				   strlen(info.field_value));
	}
	free(req->body_prefix);
	req->body_prefix = NULL;
	if (req->xstate == XS_AWAIT_BODY)
		request_route(req);
}

/* Body bytes for the upstream (and the mirror, if any), re-framed when the
 * client sent them chunked: chunk boundaries are tokentap's own. */
static void request_body_bytes(struct request *req, const char *at, size_t len)
{
	char size_line[24];
	int n = 0;

	if (req->head.chunked)
		n = snprintf(size_line, sizeof(size_line), "%zx\r\n", len);
	evbuffer_add(req->up_pending, size_line, (size_t)n);
	evbuffer_add(req->up_pending, at, len);
	if (req->head.chunked)
		evbuffer_add(req->up_pending, "\r\n", 2);
	if (req->mirror && n)
		mirror_feed(req->mirror, size_line, (size_t)n);
	if (req->mirror)
		mirror_feed(req->mirror, at, len);
	if (req->mirror && req->head.chunked)
		mirror_feed(req->mirror, "\r\n", 2);
	workload_feed(&req->rec.wl, at, len);
}

static void on_req_body(void *arg, const char *at, size_t len)
{
	struct client *cl = arg;
	struct request *req = cl->req;
	const struct config *cfg = pcfg(cl->px);

	if (!req->reqinfo_done) {
		size_t room = cfg->body_inspect_max - req->body_prefix_len;
		size_t take = len < room ? len : room;
		if (!req->body_prefix)
			req->body_prefix = malloc(cfg->body_inspect_max);
		if (req->body_prefix) {
			memcpy(req->body_prefix + req->body_prefix_len, at, take);
			req->body_prefix_len += take;
		}
		if (!req->body_prefix || req->body_prefix_len == cfg->body_inspect_max)
			request_learn_body(req, false);
	}
	request_body_bytes(req, at, len);
}

static void on_req_complete(void *arg)
{
	struct client *cl = arg;
	struct request *req = cl->req;

	if (req->head.chunked) {
		evbuffer_add(req->up_pending, "0\r\n\r\n", 5);
		if (req->mirror)
			mirror_feed(req->mirror, "0\r\n\r\n", 5);
	}
	req->body_done = true;
	if (req->mirror)
		mirror_body_done(req->mirror);
	request_learn_body(req, true);
	/* Routing on the body may have refused it: the answer is going out
	 * (LINGER), and the linger timer runs. */
	if (client_ending(cl))
		return;
	evtimer_del(cl->timer);
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
	struct proxy *px = cl->px;

	LIST_REMOVE(cl, link);
	px->nclients--;
	atomic_fetch_sub(px->clients_all, 1);
	request_free(cl->req);
	if (cl->rev)
		event_free(cl->rev);
	if (cl->bev)
		bufferevent_free(cl->bev);
	if (cl->timer)
		event_free(cl->timer);
	free(cl);
	if (px->draining && LIST_EMPTY(&px->clients) && px->drained) {
		void (*done)(void *) = px->drained;
		px->drained = NULL;
		done(px->drained_arg);
	}
}

static void on_deferred_free(evutil_socket_t fd, short what, void *arg)
{
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
		if (req->xstate != XS_DONE || evbuffer_get_length(bufferevent_get_output(cl->bev))) {
			if (req->rec.error == REQ_ERR_NONE)
				req->rec.error = REQ_ERR_CLIENT_ABORTED;
		}
		request_drop_upstream(req, false);
		if (req->rec.at[TL_REQ_HEADERS] || req->rec.status)
			request_log(req);
		request_free(req);
		cl->req = NULL;
	}
	log_conn(LOG_DEBUG, cl->id, "closed: %s", why);
	if (cl->rev)
		event_del(cl->rev); /* freed with the client: this may be its callback */
	if (cl->bev) {
		bufferevent_free(cl->bev);
		cl->bev = NULL;
	}
	evtimer_del(cl->timer);
	struct timeval zero = { 0, 0 };
	event_base_once(cl->px->base, -1, EV_TIMEOUT, on_deferred_free, cl, &zero);
}

/* The response is fully written: log it, then either close or take the next
 * (possibly already buffered) request. */
void request_finish(struct request *req)
{
	struct client *cl = req->cl;

	timeline_mark(&req->rec, TL_CLIENT_DONE, clock_now_ns());
	request_log(req);
	request_free(req);
	cl->req = NULL;
	cl->reading_blocked = false;
	cl->blocked_since_ns = 0;
	cl->body_deadline_ns = 0;
	if (cl->close_after || cl->px->draining) {
		client_close(cl, cl->px->draining ? "draining" : "response done, connection: close");
		return;
	}
	client_set_state(cl, CL_IDLE);
	reqparse_resume(&cl->rp);
	bufferevent_setwatermark(cl->bev, EV_WRITE, 0, 0);
	client_reading(cl, true);
	loop_timer_arm(cl->timer, pcfg(cl->px)->keepalive_timeout_ms);
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
		cl->req = req = request_new(cl);
		if (!req) {
			client_close(cl, "out of memory");
			return;
		}
	}
	status = reqparse_refusal(&cl->rp, msg, sizeof(msg));
	if (req->head.parsed)
		request_note_head(req);
	if (!req->rec.id[0])
		request_id_generate(cl->px, req->rec.id, sizeof(req->rec.id));
	client_fail(cl, status, REQ_ERR_BAD_REQUEST, "invalid_request", msg);
}

/* Feeds buffered client bytes to the request parser, one request at a time. */
void client_parse(struct client *cl)
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
		cl->parsing = true;
		enum reqparse_status rs = reqparse_feed(&cl->rp, v.iov_base, v.iov_len, &used);
		cl->parsing = false;
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
			request_flush_upstream(cl->req);
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
		request_check_sent(cl->req);
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
void client_reading(struct client *cl, bool on)
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
 * arrives an event per read would hold stream_buffer's worth of bytes in
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
 * Sends the first n bytes of `src` to the client. Over plain TCP, when
 * nothing is queued before them, they are written to the socket here and
 * now: a bufferevent would only arm its write event and write on the next
 * loop turn (two epoll_ctl calls and a wake-up per chunk, and the token that
 * much later). Whatever the socket does not take, and everything over TLS,
 * is queued (client_queue) on the bufferevent's output, which writes it as
 * the socket drains and reports errors. A failed write leaves the bytes for
 * the bufferevent too, so errors have one path.
 */
void client_forward(struct client *cl, struct evbuffer *src, size_t n)
{
	struct evbuffer *out = bufferevent_get_output(cl->bev);

	if (cl->rev && evbuffer_get_length(out) == 0) {
		int w = evbuffer_write_atmost(src, bufferevent_getfd(cl->bev), (ev_ssize_t)n);
		if (w > 0)
			n -= (size_t)w;
	}
	if (n)
		client_queue(out, src, n);
}

/* client_forward for `n` bytes in memory the caller keeps: those the socket
 * does not take now are copied onto the output. Returns false when they
 * could not be (no memory): the client has been closed, the stream being
 * cut. */
bool client_forward_mem(struct client *cl, const char *p, size_t n)
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
	}
	if (n && evbuffer_add(out, p, n) == -1) {
		client_close(cl, "no memory for the response's bytes");
		return false;
	}
	return true;
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
	if (cl->state == CL_BODY)
		client_body_timer(cl); /* the idle stall re-armed; the deadline stays */
	client_parse(cl);
}

#define CLIENT_READ_MAX (16u << 10) /* bytes asked of one recvmsg() */

static void on_client_readable(evutil_socket_t fd, short what, void *arg)
{
	uint64_t now = clock_now_ns(); /* first: the fallback stamp */
	struct client *cl = arg;
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
	cl->last_read_ns = rxstamp_of(&cl->px->rxclock, &msg, now);
	client_input(cl);
}

/* TLS: the bufferevent reads (and decrypts). */
static void on_client_read(struct bufferevent *bev, void *arg)
{
	struct client *cl = arg;

	(void)bev;
	cl->last_read_ns = clock_now_ns();
	client_input(cl);
}

static void on_client_write(struct bufferevent *bev, void *arg)
{
	struct client *cl = arg;
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
	if (req->xstate == XS_PAUSED && req->uc) {
		uint64_t seq = req->seq;
		exchange_resume(req);
		if (!client_runs(cl, seq))
			return; /* it ended there: `req` is gone */
	}
	if (req->xstate == XS_DONE && evbuffer_get_length(out) == 0)
		request_finish(req);
}

static void on_client_event(struct bufferevent *bev, short what, void *arg)
{
	struct client *cl = arg;

	if (what & BEV_EVENT_CONNECTED)
		return; /* a TLS handshake finished: nothing to do */

	if (cl->state == CL_LINGER && cl->req && cl->req->xstate == XS_DONE) {
		client_close(cl, "closed after error answer");
		return;
	}
	client_close(cl, (what & BEV_EVENT_EOF) ? "client closed the connection" : "client connection error");
}

static void on_client_timer(evutil_socket_t fd, short what, void *arg)
{
	struct client *cl = arg;
	char msg[120];

	switch (cl->state) {
	case CL_IDLE: client_close(cl, "keep-alive timeout"); break;
	case CL_HEAD:
		snprintf(msg, sizeof(msg), "request headers not received within %llu ms",
			 (unsigned long long)pcfg(cl->px)->header_timeout_ms);
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
				 (unsigned long long)pcfg(cl->px)->idle_timeout_ms);
		client_fail(cl, 408, REQ_ERR_CLIENT_ABORTED, "request_timeout", msg);
		break;
	case CL_LINGER: client_close(cl, "linger done"); break;
	case CL_WAIT:
	case CL_CLOSED: break;
	}
}

static void on_accept(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	struct listener *l = arg;
	struct proxy *px = l->px;
	struct client *cl = calloc(1, sizeof(*cl));
	void *tls = l->index < px->router->nlisteners ? px->router->tls_listen[l->index] : NULL;
	int one = 1;

	if (!cl || px->draining) {
		free(cl);
		evutil_closesocket(fd);
		return;
	}
	/* counted from here; client_free uncounts */
	if (atomic_fetch_add(px->clients_all, 1) >= pcfg(px)->max_connections) {
		atomic_fetch_sub(px->clients_all, 1);
		/* at the cap: a short answer and close, never touching the
		 * connections (and streams) already running */
		static const char busy[] =
			"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
			"content-length: 92\r\nconnection: close\r\n\r\n"
			"{\"error\":{\"message\":\"too many connections; try again later\","
			"\"type\":\"overloaded\",\"code\":503}}";
		ssize_t w = send(fd, busy, sizeof(busy) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		(void)w;
		free(cl);
		evutil_closesocket(fd);
		if (!px->cap_warned) {
			px->cap_warned = true;
			log_warn("connection cap of %u reached: new connections get 503", pcfg(px)->max_connections);
		}
		return;
	}
	px->cap_warned = false;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	cl->px = px;
	cl->id = ++px->next_client_id;
	cl->bev = tls ? tls_bev_accept(px->base, tls, fd) : bufferevent_socket_new(px->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!tls) {
		(void)rxstamp_enable(fd);
		cl->rev = event_new(px->base, fd, EV_READ | EV_PERSIST, on_client_readable, cl);
	}
	cl->timer = evtimer_new(px->base, on_client_timer, cl);
	if (!cl->bev || !cl->timer || (!tls && !cl->rev)) {
		if (cl->rev)
			event_free(cl->rev);
		if (cl->bev)
			bufferevent_free(cl->bev);
		else
			evutil_closesocket(fd);
		if (cl->timer)
			event_free(cl->timer);
		free(cl);
		atomic_fetch_sub(px->clients_all, 1);
		return;
	}
	format_addr(sa, cl->peer, sizeof(cl->peer));
	reqparse_init(&cl->rp, &client_hooks, cl);
	LIST_INSERT_HEAD(&px->clients, cl, link);
	px->nclients++;
	bufferevent_setcb(cl->bev, on_client_read, on_client_write, on_client_event, cl);
	bufferevent_setwatermark(cl->bev, EV_READ, 0, CLIENT_INPUT_MAX);
	bufferevent_enable(cl->bev, EV_WRITE);
	client_reading(cl, true);
	loop_timer_arm(cl->timer, pcfg(px)->keepalive_timeout_ms);
	log_conn(LOG_DEBUG, cl->id, "accepted from %s", cl->peer);
}

/* The pause after a failed accept is over: listen again (unless draining
 * closed the listeners meanwhile). Should descriptors still be short, the
 * next failure pauses again. */
static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	struct proxy *px = arg;

	for (unsigned i = 0; i < px->nlisteners; i++)
		if (px->listeners[i].lev)
			evconnlistener_enable(px->listeners[i].lev);
}

/* accept() failed with an error that retrying at once would not cure
 * (libevent retries EINTR, EAGAIN and ECONNABORTED itself): most often out
 * of descriptors. The listener is level-triggered, so it would report the
 * same error on every pass of the loop; every listener of this worker
 * pauses instead, and the connections wait in the kernel's backlog. */
static void on_accept_error(struct evconnlistener *lev, void *arg)
{
	struct listener *l = arg;
	struct proxy *px = l->px;
	int err = EVUTIL_SOCKET_ERROR();

	fdlimit_accept_failed("proxy", err);
	for (unsigned i = 0; i < px->nlisteners; i++)
		if (px->listeners[i].lev)
			evconnlistener_disable(px->listeners[i].lev);
	loop_timer_arm(px->accept_timer, ACCEPT_PAUSE_MS);
}

struct proxy *proxy_new(struct event_base *base, struct router *router, const struct proxy_env *env, char *err,
			size_t errlen)
{
	const struct proxy *first = env->first;
	const struct config *cfg = &router->cfg;
	struct listener_conf ls[LISTENERS_MAX];
	unsigned nls = config_listeners(cfg, ls);
	struct proxy *px;

	px = calloc(1, sizeof(*px));
	if (!px) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	px->base = base;
	px->router = router;
	px->alog = env->alog;
	px->stats = env->stats;
	px->recent = env->recent;
	px->clients_all = env->clients ? env->clients : &px->clients_own;
	px->tail = evbuffer_new();
	px->accept_timer = evtimer_new(base, on_accept_resume, px);
	if (!px->tail || !px->accept_timer) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	LIST_INIT(&px->clients);
	if (getrandom(&px->id_seed, sizeof(px->id_seed), 0) != sizeof(px->id_seed))
		px->id_seed = (uint64_t)clock_now_ns() ^ (uint64_t)getpid();

	for (unsigned i = 0; i < nls; i++) {
		struct sockaddr_storage ss;
		unsigned sslen;
		struct listener *l = &px->listeners[i];
		char addr[64];
		unsigned flags = LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC;

		if (first && i < first->nlisteners) {
			ss = first->listeners[i].bound;
			sslen = (unsigned)first->listeners[i].boundlen;
		} else if (config_parse_listen(ls[i].address, &ss, &sslen) == -1) {
			snprintf(err, errlen, "listen address %s: expected a numeric ADDR:PORT, e.g. 127.0.0.1:8080",
				 ls[i].address);
			goto fail;
		}
		if (env->reuseport)
			flags |= LEV_OPT_REUSEABLE_PORT;
		l->px = px;
		l->index = i;
		l->lev = evconnlistener_new_bind(base, on_accept, l, flags, 1024, (struct sockaddr *)&ss, (int)sslen);
		if (!l->lev) {
			snprintf(err, errlen, "cannot listen on %s: %s", ls[i].address, strerror(errno));
			goto fail;
		}
		px->nlisteners++;
		evconnlistener_set_error_cb(l->lev, on_accept_error);
		/* Stamping on the listener keeps the kernel stamping every packet
		 * for as long as tokentap runs: it turns stamping on lazily (a
		 * deferred switch) when the first socket asks, so a request that
		 * arrived before its connection was accepted, after a quiet spell
		 * with no stamped socket open, would have none. Accepted sockets
		 * inherit the option. */
		(void)rxstamp_enable(evconnlistener_get_fd(l->lev));
		l->boundlen = sizeof(l->bound);
		getsockname(evconnlistener_get_fd(l->lev), (struct sockaddr *)&l->bound, &l->boundlen);
		format_addr((struct sockaddr *)&l->bound, addr, sizeof(addr));
		size_t n = strlen(px->listen_addr);
		snprintf(px->listen_addr + n, sizeof(px->listen_addr) - n, "%s%s%s", n ? ", " : "", addr,
			 ls[i].tls_cert ? " (tls)" : "");
	}
	return px;
fail:
	for (unsigned i = 0; i < px->nlisteners; i++)
		evconnlistener_free(px->listeners[i].lev);
	if (px->accept_timer)
		event_free(px->accept_timer);
	if (px->tail)
		evbuffer_free(px->tail);
	free(px);
	return NULL;
}

const char *proxy_listen_addr(const struct proxy *px)
{
	return px->listen_addr;
}

void proxy_free(struct proxy *px)
{
	struct client *cl;

	if (!px)
		return;
	for (unsigned i = 0; i < px->nlisteners; i++)
		if (px->listeners[i].lev)
			evconnlistener_free(px->listeners[i].lev);
	while ((cl = LIST_FIRST(&px->clients)))
		client_free(cl);
	mirror_abort_all(&px->mirrors);
	if (px->drain_timer)
		event_free(px->drain_timer);
	if (px->accept_timer)
		event_free(px->accept_timer);
	router_unref(px->router);
	evbuffer_free(px->tail);
	free(px);
}

void proxy_set_router(struct proxy *px, struct router *router)
{
	struct router *old = px->router;

	px->router = router; /* new requests; running ones keep theirs */
	router_unref(old);
}

struct router *proxy_router(const struct proxy *px)
{
	return px->router;
}

static void on_drain_timer(evutil_socket_t fd, short what, void *arg)
{
	struct proxy *px = arg;
	struct client *cl, *next;
	unsigned cut = 0;

	for (cl = LIST_FIRST(&px->clients); cl; cl = next) {
		next = LIST_NEXT(cl, link);
		if (cl->state != CL_CLOSED) {
			cut++;
			client_close(cl, "shutdown grace period over");
		}
	}
	log_warn("shutdown: grace period over; %u connection(s) cut", cut);
}

void proxy_drain(struct proxy *px, uint64_t grace_ms, void (*done)(void *arg), void *arg)
{
	struct client *cl, *next;
	unsigned busy = 0;

	px->draining = true;
	px->drained = done;
	px->drained_arg = arg;
	/* Closed, not just paused: a paused listener still completes handshakes
	 * into its backlog, and those clients would hang until the exit. */
	for (unsigned i = 0; i < px->nlisteners; i++) {
		if (px->listeners[i].lev)
			evconnlistener_free(px->listeners[i].lev);
		px->listeners[i].lev = NULL;
	}
	for (cl = LIST_FIRST(&px->clients); cl; cl = next) {
		next = LIST_NEXT(cl, link);
		if (cl->state == CL_CLOSED)
			continue;
		if (cl->state == CL_IDLE && !cl->req && evbuffer_get_length(bufferevent_get_input(cl->bev)) == 0)
			client_close(cl, "draining: idle");
		else
			busy++;
	}
	log_info("shutdown: no longer accepting; waiting for %u running request(s), at most %llu ms", busy,
		 (unsigned long long)grace_ms);
	px->drain_timer = evtimer_new(px->base, on_drain_timer, px);
	if (px->drain_timer)
		loop_timer_arm(px->drain_timer, grace_ms);
	if (LIST_EMPTY(&px->clients) && px->drained) {
		px->drained = NULL;
		done(arg);
	}
}
