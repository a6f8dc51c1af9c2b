/*
 * exchange.c — a request's life on the upstream side: choosing the route
 * and the upstream, waiting for an admission slot, connecting (with
 * failover when a connection is refused before any byte reached the
 * upstream), writing the request, and reading the response: its bytes are
 * moved to the client as they arrive while the parser hands them to the
 * request's meter (meter.c), which measures them. One function reads
 * (exchange_read), whether the bytes are in the connection's input buffer
 * or were read straight from its socket (upconn_set_direct).
 *
 * The exchange's states (EXCHANGE_STATES, proxy_int.h), the usual way:
 *
 *   NEW ─▶ [AWAIT_BODY | AWAIT_CHUNK] ─▶ ROUTING ─▶ [QUEUED] ─▶ CONNECTING ─▶ SENDING
 *          ─▶ AWAIT_HEAD ─▶ STREAMING ⇄ PAUSED ─▶ DONE
 *
 * and back: CONNECTING ─▶ ROUTING on failover, SENDING or AWAIT_HEAD ─▶
 * CONNECTING on a replay; any state ─▶ DONE on an error or abort. The state
 * decides the timer (exchange_set_state) and what on_exchange_timer does.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "check.h"
#include "log.h"
#include "loop.h"
#include "meter.h"
#include "mirror.h"
#include "proxy.h"
#include "proxy_int.h"
#include "respparse.h"
#include "strutil.h"
#include "tls.h"

static bool request_failover(struct request *req);
static void on_up_write(struct bufferevent *bev, void *arg);
static void on_up_event(struct bufferevent *bev, short what, void *arg);
static void request_upstream_closed(struct request *req, short what);
static void on_up_read(struct bufferevent *bev, void *arg);
/*
 * The bytes of one read from the upstream: in the connection's input buffer
 * (TLS, a head not yet parsed, bytes that came while the client was behind,
 * the rest at a close), or in the per-thread scratch buffer of a direct
 * read (upconn_set_direct: `mem`, `len`), which must be done with when
 * exchange_read returns.
 */
struct xsrc {
	struct evbuffer *buf; /* NULL for a direct read */
	const char *mem;
	size_t len;
};
static void exchange_read(struct request *req, const struct xsrc *src);
static void exchange_end(struct request *req, const struct xsrc *last, size_t n, bool past_end);
static const struct upconn_direct up_direct;

/* ---- the exchange's states ---- */

static const char *const xstate_names[XS__COUNT] = {
#define X(s, t) #s,
	EXCHANGE_STATES(X)
#undef X
};

static const enum xtimer xstate_timer[XS__COUNT] = {
#define X(s, t) t,
	EXCHANGE_STATES(X)
#undef X
};

#define XS_BIT(s) (1u << XS_##s)
/*
 * For each state, the states it may change to (docs/dev/pipeline-plan.md
 * 3.2). CONNECTING -> ROUTING is a failover (the upstream refused or did not
 * accept in time); SENDING or AWAIT_HEAD -> CONNECTING a replay on a fresh
 * connection (request_replay); SENDING -> STREAMING an upstream that answers
 * before the request is all written. Every state but DONE may end in DONE.
 */
static const uint16_t xstate_legal[XS__COUNT] = {
	[XS_NEW] = XS_BIT(AWAIT_BODY) | XS_BIT(AWAIT_CHUNK) | XS_BIT(ROUTING) | XS_BIT(DONE),
	[XS_AWAIT_BODY] = XS_BIT(ROUTING) | XS_BIT(DONE),
	[XS_AWAIT_CHUNK] = XS_BIT(ROUTING) | XS_BIT(DONE),
	[XS_ROUTING] = XS_BIT(QUEUED) | XS_BIT(CONNECTING) | XS_BIT(DONE),
	[XS_QUEUED] = XS_BIT(CONNECTING) | XS_BIT(DONE),
	[XS_CONNECTING] = XS_BIT(SENDING) | XS_BIT(ROUTING) | XS_BIT(DONE),
	[XS_SENDING] = XS_BIT(AWAIT_HEAD) | XS_BIT(STREAMING) | XS_BIT(CONNECTING) | XS_BIT(DONE),
	[XS_AWAIT_HEAD] = XS_BIT(STREAMING) | XS_BIT(CONNECTING) | XS_BIT(DONE),
	[XS_STREAMING] = XS_BIT(PAUSED) | XS_BIT(DONE),
	[XS_PAUSED] = XS_BIT(STREAMING) | XS_BIT(DONE),
	[XS_DONE] = 0,
};
_Static_assert(XS__COUNT <= 16, "xstate_legal holds a bit per state");

bool exchange_transition_legal(enum xstate from, enum xstate to)
{
	if ((unsigned)from >= XS__COUNT || (unsigned)to >= XS__COUNT)
		return false;
	return (xstate_legal[from] >> to) & 1u;
}

enum xtimer exchange_state_timer(enum xstate s)
{
	return (unsigned)s < XS__COUNT ? xstate_timer[s] : XT_NONE;
}

const char *exchange_state_name(enum xstate s)
{
	return (unsigned)s < XS__COUNT ? xstate_names[s] : "?";
}

static uint64_t xtimer_ms(const struct request *req, enum xtimer t)
{
	switch (t) {
	case XT_QUEUE: return req->up->conf.queue_timeout_ms;
	case XT_CONNECT: return req->up->connect_timeout_ms;
	case XT_FIRST_BYTE: return req->up->first_byte_timeout_ms;
	case XT_IDLE: return req->up->idle_timeout_ms;
	case XT_NONE: break;
	}
	return 0;
}

void exchange_set_state(struct request *req, enum xstate to)
{
	enum xstate from = req->xstate;

	if (from == to)
		return;
	if (log_enabled(LOG_DEBUG))
		log_conn(LOG_DEBUG, req->cl->id, "exchange %s -> %s", exchange_state_name(from),
			 exchange_state_name(to));
	CHECK(exchange_transition_legal(from, to));
	req->xstate = to;
	bool close_pending = req->up_closed != 0;
	if (to == XS_DONE)
		req->up_closed = 0; /* a pending close has nothing left to decide */
	if (req->up_closed)
		return; /* it holds the timer until on_exchange_timer acts on it */
	enum xtimer t = xstate_timer[to];
	if (t == xstate_timer[from] && !close_pending)
		return; /* STREAMING <-> PAUSED: the idle clock runs on (request_idle_rearm) */
	if (t == XT_NONE)
		evtimer_del(req->timer);
	else
		loop_timer_arm(req->timer, xtimer_ms(req, t));
}

/* Leaves the upstream: a queued waiter cancelled, the connection back, the
 * state `next` (ROUTING for a failover, DONE otherwise), then the slot an
 * admitted state held given back. */
static void exchange_release(struct request *req, bool reusable, enum xstate next)
{
	bool held = exchange_admitted(req->xstate);

	if (req->xstate == XS_QUEUED)
		upstream_cancel(req->up, &req->waiter);
	if (req->uc) {
		upstream_release(req->uc, reusable);
		req->uc = NULL;
	}
	exchange_set_state(req, next);
	if (held)
		upstream_leave(req->up); /* may admit a waiter: nothing after this touches it */
}

void request_drop_upstream(struct request *req, bool reusable)
{
	exchange_release(req, reusable, XS_DONE);
}

/* ---- upstream exchange ---- */

/* Bytes on their way to the client: its output buffer, and the socket's send
 * queue, which a large send buffer lets hold seconds of a slow reader's
 * stream while the output buffer does not move. */
static size_t client_backlog(struct client *cl)
{
	size_t n = evbuffer_get_length(bufferevent_get_output(cl->bev));
	int queued = 0;

	if (ioctl(bufferevent_getfd(cl->bev), SIOCOUTQ, &queued) == 0 && queued > 0)
		n += (size_t)queued;
	return n;
}

/*
 * The idle timeout of STREAMING and PAUSED runs from req->idle_from.
 * Streaming reads come at the token rate, so the timer is not moved on each
 * one: a read only notes its time, and a timer that fires before the
 * upstream has been silent for the whole timeout is armed again for what is
 * left, here.
 *
 * The idle timer fired: true when the side being waited on moved since it
 * was set, and the timer now runs for the rest of the timeout from then.
 * That side is the upstream, except while its reading is paused for a slow
 * client: then it is the client, which moves when the bytes on their way to
 * it shrink (a reader too slow to reach the low watermark within the timeout
 * is still reading, and is not cut).
 */
static bool request_idle_rearm(struct request *req)
{
	uint64_t now = clock_now_ns(), limit = req->up->idle_timeout_ms * 1000000ull;

	if (req->xstate == XS_PAUSED) {
		size_t waiting = client_backlog(req->cl);
		if (waiting < req->paused_waiting) {
			req->paused_waiting = waiting;
			req->idle_from = now;
		}
	}
	uint64_t silent = now - req->idle_from;
	if (silent >= limit)
		return false;
	loop_timer_arm(req->timer, (limit - silent + 999999) / 1000000);
	return true;
}

/* The state's timer fired (exchange_set_state armed it), or a TLS
 * upstream's close waits to be acted on. */
void on_exchange_timer(evutil_socket_t fd, short what, void *arg)
{
	struct request *req = arg;
	struct client *cl = req->cl;
	char msg[200];

	if (req->up_closed) {
		short how = req->up_closed;
		req->up_closed = 0; /* from here the states' timers run again */
		request_upstream_closed(req, how);
		return;
	}
	CHECK(xstate_timer[req->xstate] != XT_NONE); /* a state without a timer deleted it */
	switch (req->xstate) {
	case XS_QUEUED:
		snprintf(msg, sizeof(msg), "upstream %s is at its concurrency limit and no slot freed within %llu ms",
			 req->up->name, (unsigned long long)req->up->conf.queue_timeout_ms);
		req->up->rejected++;
		client_fail(cl, 503, REQ_ERR_TIMEOUT, "upstream_busy", msg);
		return;
	case XS_CONNECTING:
		snprintf(msg, sizeof(msg), "upstream %s did not accept the connection within %llu ms", req->up->name,
			 (unsigned long long)req->up->connect_timeout_ms);
		upstream_note_result(req->up, false, clock_now_ns());
		if (request_failover(req)) /* nothing reached it: safe to send elsewhere */
			return;
		break;
	case XS_AWAIT_HEAD:
		snprintf(msg, sizeof(msg), "upstream %s sent no response headers within %llu ms", req->up->name,
			 (unsigned long long)req->up->first_byte_timeout_ms);
		break;
	case XS_STREAMING:
	case XS_PAUSED:
		if (request_idle_rearm(req))
			return;
		if (req->xstate == XS_PAUSED) {
			/* The client's stall, not the upstream's: counted as the
			 * client's, and the upstream's slot is freed. */
			snprintf(msg, sizeof(msg), "client read none of %zu waiting bytes for %llu ms",
				 req->paused_waiting, (unsigned long long)req->up->idle_timeout_ms);
			client_fail(cl, 504, REQ_ERR_CLIENT_ABORTED, "client_timeout", msg);
			return;
		}
		snprintf(msg, sizeof(msg), "upstream %s went silent for %llu ms", req->up->name,
			 (unsigned long long)req->up->idle_timeout_ms);
		break;
	default: return;
	}
	client_fail(cl, 504, REQ_ERR_TIMEOUT, "upstream_timeout", msg);
}

/* The head an upstream gets: same method, target and end-to-end headers,
 * HTTP/1.1 framing of tokentap's choosing, and exactly one x-request-id,
 * the request's own (the client's when usable, else a generated one), so
 * the upstream and the access log always name a request alike. */
static void head_write(const struct request *req, const struct upstream *up, struct evbuffer *out)
{
	bool has_host = false;

	evbuffer_add_printf(out, "%s ", req->rec.method);
	evbuffer_add(out, req->head.buf + req->head.url_off, req->head.url_len);
	evbuffer_add_printf(out, " HTTP/1.%d\r\n", req->head.http10 ? 0 : 1);
	for (unsigned i = 0; i < req->head.nhdr; i++) {
		const struct hdr *h = &req->head.hdrs[i];
		const char *name = req->head.buf + h->name_off;
		if (reqhead_hop_by_hop(&req->head, name, h->name_len))
			continue;
		if (name_eq(name, h->name_len, "x-request-id"))
			continue; /* written once below: the id the log has */
		if (name_eq(name, h->name_len, "host"))
			has_host = true;
		evbuffer_add(out, name, h->name_len);
		evbuffer_add(out, ": ", 2);
		evbuffer_add(out, req->head.buf + h->val_off, h->val_len);
		evbuffer_add(out, "\r\n", 2);
	}
	if (!has_host)
		evbuffer_add_printf(out, "host: %s\r\n", up->name);
	evbuffer_add_printf(out, "x-request-id: %s\r\n", req->rec.id);
	if (req->head.chunked)
		evbuffer_add_printf(out, "transfer-encoding: chunked\r\n");
	if (req->head.http10)
		evbuffer_add_printf(out, "connection: close\r\n");
	evbuffer_add(out, "\r\n", 2);
}

/* The primary's head goes in front of whatever body bytes already wait in
 * up_pending, once the upstream is chosen (a failover writes it again). */
static void request_write_head(struct request *req)
{
	struct evbuffer *out = evbuffer_new();

	if (!out)
		return;
	head_write(req, req->up, out);
	req->head_len = evbuffer_get_length(out);
	evbuffer_prepend_buffer(req->up_pending, out);
	evbuffer_free(out);
}

/* `uc`'s reads, writes and events are the request's from now on. */
static void request_bind(struct request *req, struct upconn *uc)
{
	bufferevent_setcb(uc->bev, on_up_read, on_up_write, on_up_event, req);
	upconn_set_direct(uc, &up_direct, req);
	bufferevent_setwatermark(uc->bev, EV_WRITE, 0, 0);
}

/* A slot on req->up is ours: take a connection and send. CONNECTING is
 * entered first, so that the slot is given back should the connection not
 * open. */
static void request_connect(struct request *req)
{
	struct client *cl = req->cl;
	bool reused = false;
	char msg[200];

	exchange_set_state(req, XS_CONNECTING);
	uint64_t now = clock_now_ns();
	req->rec.at[TL_DISPATCH] = now; /* again after a failover: queue ends at the last dispatch */
	req->rec.at[TL_UP_CONNECTED] = 0;
	req->rec.upstream = req->up->name;
	req->rp.head_request = req->head.method == HTTP_HEAD;
	request_write_head(req);
	req->uc = upstream_acquire(req->up, &reused);
	if (!req->uc) {
		snprintf(msg, sizeof(msg), "cannot open a connection to upstream %s: %s", req->up->name,
			 strerror(errno));
		client_fail(cl, 502, REQ_ERR_CONNECT_FAILED, "upstream_unreachable", msg);
		return;
	}
	req->cold = upstream_dispatch_cold(req->up, reused, now);
	request_bind(req, req->uc);
	req->reused = reused;
	if (reused) {
		exchange_set_state(req, XS_SENDING); /* connected already: the connect timer off again */
		/* A pooled connection may have been closed by the server a moment
		 * ago (its keep-alive timeout racing this request): keep a copy to
		 * replay, when the whole request is here and small. */
		if (!req->retried)
			req->replay = evbuffer_new(); /* filled as bytes go out: request_flush_upstream */
		req->rec.at[TL_UP_CONNECTED] = now;
		upconn_writing(req->uc);
		upconn_reading(req->uc, true, 0);
		/* Inside client_parse, the bytes parsed after this head (usually the
		 * whole body) go out with it once the parse pass ends: one write. */
		if (!req->cl->parsing)
			request_flush_upstream(req);
	}
}

static void on_admitted(struct up_waiter *w)
{
	struct request *req = (struct request *)((char *)w - offsetof(struct request, waiter));

	request_connect(req);
}

/* Asks req->up for a slot: now, after a wait in its queue, or 503. */
static void request_admit(struct request *req)
{
	char msg[200];

	/* The load this request meets, sampled as it is routed, before any
	 * wait: those running on the upstream and those queued for it, and
	 * itself. Sampled after the queue instead, every queued request would
	 * see max_concurrency at most. */
	req->inflight = upstream_inflight(req->up) + upstream_waiting(req->up) + 1;
	req->waiter.ready = on_admitted;
	switch (upstream_admit(req->up, &req->waiter)) {
	case ADMIT_NOW: request_connect(req); break;
	case ADMIT_QUEUED: exchange_set_state(req, XS_QUEUED); break;
	case ADMIT_FULL:
		snprintf(msg, sizeof(msg), "upstream %s is at its concurrency limit and its queue is full",
			 req->up->name);
		client_fail(req->cl, 503, REQ_ERR_QUEUE_FULL, "upstream_busy", msg);
		break;
	}
}

/* The sticky value of this request, when its route has one. */
static const char *request_sticky_key(struct request *req, size_t *len)
{
	const struct route_conf *rc = req->route->conf;

	if (rc->sticky == STICKY_HEADER) {
		const struct hdr *h = reqhead_header(&req->head, rc->sticky_key);
		if (h && h->val_len) {
			*len = h->val_len;
			return req->head.buf + h->val_off;
		}
	} else if (rc->sticky == STICKY_JSON_FIELD && req->sticky_value[0]) {
		*len = strlen(req->sticky_value);
		return req->sticky_value;
	}
	return NULL;
}

/* Starts the shadow copy: its own head, the body bytes so far, and from
 * now on every body byte the primary gets (see on_req_body). */
static void request_mirror(struct request *req)
{
	struct proxy *px = req->cl->px;
	struct evbuffer *bytes = evbuffer_new();
	struct mirror_env env = { px->base, px->stats, px->alog, pcfg(px)->max_event_size, &px->mirrors };

	if (!bytes)
		return;
	head_write(req, req->route->mirror, bytes);
	/* up_pending holds body bytes only here: the primary's head comes later */
	size_t n = evbuffer_get_length(req->up_pending);
	if (n) {
		void *copy = malloc(n);
		if (copy) {
			evbuffer_copyout(req->up_pending, copy, n);
			evbuffer_add(bytes, copy, n);
			free(copy);
		}
	}
	req->mirror = mirror_start(&env, req->route->mirror, req->route->name, req->route->conf->mirror_max_in_flight,
				   &req->meter, bytes, &req->mirror);
	evbuffer_free(bytes);
	if (req->mirror && req->body_done)
		mirror_body_done(req->mirror);
}

/* Picks the route and the upstream, then asks it for a slot. Called once
 * the head is parsed, or once the body prefix is, when routing needs it. */
struct route *request_match(const struct request *req)
{
	const struct hdr *host = reqhead_header(&req->head, "host");

	return router_match(req->rt, req->rec.method, req->rec.path, strlen(req->rec.path),
			    host ? req->head.buf + host->val_off : NULL, host ? host->val_len : 0,
			    req->rec.model[0] ? req->rec.model : NULL);
}

void request_route(struct request *req)
{
	struct client *cl = req->cl;
	const struct config *cfg = &req->rt->cfg;
	const char *method = req->rec.method;
	char msg[300];
	unsigned idx;

	exchange_set_state(req, XS_ROUTING);
	req->route = request_match(req);
	if (!req->route) {
		snprintf(msg, sizeof(msg), "no route matches %s %s", method, req->rec.path);
		client_fail(cl, 404, REQ_ERR_BAD_REQUEST, "no_route", msg);
		return;
	}
	if (cfg->override_header) {
		const struct hdr *h = reqhead_header(&req->head, cfg->override_header);
		if (h) {
			req->up = router_upstream(req->rt, req->head.buf + h->val_off, h->val_len);
			if (!req->up) {
				snprintf(msg, sizeof(msg), "%s names no configured upstream", cfg->override_header);
				client_fail(cl, 400, REQ_ERR_BAD_REQUEST, "invalid_request", msg);
				return;
			}
			int i = route_target_index(req->route, req->up);
			/* the route's own upstreams only: a shadow or a staging upstream
			 * is not for any client to reach, unless configured so */
			if (i < 0 && !cfg->override_any_upstream) {
				snprintf(msg, sizeof(msg), "%s names %s, not an upstream of route %s",
					 cfg->override_header, req->up->name, req->route->name);
				req->up = NULL;
				client_fail(cl, 400, REQ_ERR_BAD_REQUEST, "invalid_request", msg);
				return;
			}
			req->tried = i >= 0 ? ~(uint32_t)0 & ~(1u << i) : ~(uint32_t)0; /* pinned: no failover */
			request_admit(req);
			return;
		}
	}
	size_t klen = 0;
	const char *key = request_sticky_key(req, &klen);
	req->up = route_pick(req->route, key, klen, req->tried, &idx);
	if (!req->up) {
		snprintf(msg, sizeof(msg), "route %s has no upstream with a weight above 0", req->route->name);
		client_fail(cl, 503, REQ_ERR_CONNECT_FAILED, "upstream_unavailable", msg);
		return;
	}
	if (route_mirror_pick(req->route))
		request_mirror(req);
	request_admit(req);
}

/* The chosen upstream refused the connection before any byte reached it:
 * another target of the route gets the request, when the route allows. */
static bool request_failover(struct request *req)
{
	unsigned idx;
	int cur = route_target_index(req->route, req->up);

	if (!req->route->conf->failover || cur < 0)
		return false;
	req->tried |= 1u << cur;
	size_t klen = 0;
	const char *key = request_sticky_key(req, &klen);
	struct upstream *next = route_pick(req->route, key, klen, req->tried, &idx);
	if (!next)
		return false;
	log_conn(LOG_WARN, req->cl->id, "request %s: upstream %s refused; failing over to %s", req->rec.id,
		 req->up->name, next->name);
	exchange_release(req, false, XS_ROUTING);
	evbuffer_drain(req->up_pending, req->head_len); /* the head is rewritten for the next one */
	req->head_len = 0;
	req->up = next;
	request_admit(req);
	return true;
}

/* Moves `src` to the upstream connection: over plain TCP with nothing
 * queued before it, written to the socket here and now (a bufferevent would
 * write on the next loop turn, after every other ready event: in a burst of
 * arrivals that is the whole burst); the rest, and everything over TLS,
 * into the bufferevent's output, which also reports a failed write. */
static void upstream_send(struct upconn *uc, struct evbuffer *src)
{
	struct evbuffer *out = bufferevent_get_output(uc->bev);

	if (uc->rev && evbuffer_get_length(out) == 0)
		(void)evbuffer_write(src, bufferevent_getfd(uc->bev));
	if (evbuffer_get_length(src))
		evbuffer_add_buffer(out, src);
}

/* Moves pending request bytes to the upstream, and applies upload
 * backpressure to the client. */
void request_flush_upstream(struct request *req)
{
	struct client *cl = req->cl;
	size_t queued = evbuffer_get_length(req->up_pending);

	if (req->uc && req->uc->connected) {
		struct evbuffer *out = bufferevent_get_output(req->uc->bev);
		if (req->replay && queued) {
			/* keep what goes out, while the request stays small */
			size_t have = evbuffer_get_length(req->replay);
			char *copy = have + queued <= REPLAY_MAX ? malloc(queued) : NULL;
			if (copy) {
				evbuffer_copyout(req->up_pending, copy, queued);
				evbuffer_add(req->replay, copy, queued);
				free(copy);
			} else {
				evbuffer_free(req->replay);
				req->replay = NULL;
			}
		}
		if (queued)
			upstream_send(req->uc, req->up_pending);
		queued = evbuffer_get_length(out);
	}
	if (queued > pcfg(cl->px)->stream_buffer && !cl->reading_blocked)
		client_upload_blocked(cl, true);
	/* all of it may be out already: no write callback will say so */
	request_check_sent(req);
}

/* The whole request is on the wire once the body is complete and nothing
 * waits in either buffer; from then the first-byte clock runs. */
void request_check_sent(struct request *req)
{
	if (!req->body_done || !req->uc || !req->uc->connected || req->rec.at[TL_REQ_SENT])
		return;
	if (evbuffer_get_length(req->up_pending) || evbuffer_get_length(bufferevent_get_output(req->uc->bev)))
		return;
	timeline_mark(&req->rec, TL_REQ_SENT, clock_now_ns());
	if (req->xstate == XS_SENDING) /* else the response began already: STREAMING or PAUSED */
		exchange_set_state(req, XS_AWAIT_HEAD);
}

static void on_up_write(struct bufferevent *bev, void *arg)
{
	struct request *req = arg;
	struct client *cl = req->cl;

	if (cl->state == CL_CLOSED)
		return;
	if (cl->reading_blocked &&
	    evbuffer_get_length(bufferevent_get_output(bev)) <= pcfg(cl->px)->stream_buffer / 2) {
		uint64_t seq = req->seq;
		client_upload_blocked(cl, false);
		client_parse(cl);
		if (!client_runs(cl, seq))
			return;
	}
	request_check_sent(req);
}

/* RFC 9110 section 9.2.2: a request whose method is idempotent has the
 * same effect sent twice as once, and may be sent again after a failure. */
static bool method_idempotent(enum llhttp_method m)
{
	switch (m) {
	case HTTP_GET:
	case HTTP_HEAD:
	case HTTP_OPTIONS:
	case HTTP_TRACE:
	case HTTP_PUT:
	case HTTP_DELETE: return true;
	default: return false;
	}
}

/*
 * How long after the request was all written a failure still says that the
 * server closed the connection without having seen it: a close that the
 * server began before the request reached it arrives within one round trip
 * of the write. Two of the kernel's smoothed round trips on this connection
 * (it carried requests before: it has samples), plus REPLAY_WINDOW_MS for
 * the delays of a busy host in noticing it; at most a second.
 */
static uint64_t replay_window_ns(const struct upconn *uc)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	uint64_t rtt_ns = 0, window;

	if (getsockopt(bufferevent_getfd(uc->bev), IPPROTO_TCP, TCP_INFO, &ti, &len) == 0)
		rtt_ns = (uint64_t)ti.tcpi_rtt * 1000u;
	window = REPLAY_WINDOW_MS * 1000000ull + 2 * rtt_ns;
	return window < 1000000000ull ? window : 1000000000ull;
}

/*
 * A pooled connection failed before a single response byte: the server
 * closed it as idle just as the request went out. The request is sent once
 * more on a new connection when that is safe: it was kept whole (see
 * REPLAY_MAX), nothing of a response came back, it has not been replayed
 * before, and either its method is idempotent or the server cannot have
 * had it: the failure came while it was being written or at once after
 * (replay_window_ns). A failure later than that is a server that read the
 * request and failed on it (a crash or a reset mid-generation): a POST is
 * not run twice, the client gets the 502. Returns true when the replay is
 * under way; otherwise `why` says why a replay that was possible was not
 * made, or is left empty.
 */
static bool request_replay(struct request *req, char *why, size_t whylen)
{
	struct upconn *fresh;
	uint64_t sent = req->rec.at[TL_REQ_SENT], after = sent ? clock_now_ns() - sent : 0;
	char when[64] = "while the request was being written";

	if (!req->reused || req->retried || !req->replay || !req->body_done || req->rp.held || req->rp.head_done)
		return false;
	if (sent)
		snprintf(when, sizeof(when), "%llu us after the request was written",
			 (unsigned long long)(after / 1000u));
	if (sent && !method_idempotent(req->head.method) && after > replay_window_ns(req->uc)) {
		snprintf(why, whylen, " (%s): not sent again, %s is not idempotent", when, req->rec.method);
		return false;
	}
	fresh = upstream_connect_new(req->up);
	if (!fresh)
		return false;
	log_conn(LOG_INFO, req->cl->id,
		 "request %s: pooled connection to %s was closed by the server (%s); sending again", req->rec.id,
		 req->up->name, when);
	req->retried = true;
	upstream_release(req->uc, false);
	req->uc = fresh;
	req->reused = false;
	evbuffer_drain(req->up_pending, evbuffer_get_length(req->up_pending));
	evbuffer_add_buffer(req->up_pending, req->replay);
	evbuffer_free(req->replay);
	req->replay = NULL;
	req->rec.at[TL_UP_CONNECTED] = 0;
	req->rec.at[TL_REQ_SENT] = 0;
	request_bind(req, fresh);
	exchange_set_state(req, XS_CONNECTING); /* the slot stays: the same upstream */
	return true;
}

static void on_up_event(struct bufferevent *bev, short what, void *arg)
{
	struct request *req = arg;
	struct client *cl = req->cl;
	char msg[600];

	if (cl->state == CL_CLOSED)
		return;
	if (what & BEV_EVENT_CONNECTED) {
		req->uc->connected = true;
		timeline_mark(&req->rec, TL_UP_CONNECTED, clock_now_ns());
		exchange_set_state(req, XS_SENDING);
		bufferevent_enable(bev, EV_WRITE);
		upconn_reading(req->uc, true, 0);
		request_flush_upstream(req);
		return;
	}
	if (!req->uc->connected) {
		int err = EVUTIL_SOCKET_ERROR();
		char tlserr[256];
		upstream_note_result(req->up, false, clock_now_ns());
		if (*tls_bev_error(bev, tlserr, sizeof(tlserr))) {
			/* a certificate that does not verify is a hard error: no
			 * retry elsewhere that would hide it */
			snprintf(msg, sizeof(msg), "TLS with upstream %s failed: %s", req->up->name, tlserr);
			log_conn(LOG_WARN, cl->id, "request %s: %s", req->rec.id, msg);
			client_fail(cl, 502, REQ_ERR_CONNECT_FAILED, "upstream_tls", msg);
			return;
		}
		snprintf(msg, sizeof(msg), "upstream %s is unreachable: %s", req->up->name,
			 err ? evutil_socket_error_to_string(err) : "connection failed");
		if (request_failover(req))
			return;
		client_fail(cl, 502, REQ_ERR_CONNECT_FAILED, "upstream_unreachable", msg);
		return;
	}
	/*
	 * Over TLS the close is acted on at the next loop turn. libevent 2.1's
	 * OpenSSL bufferevent reads into up to two pieces of the input buffer
	 * in one pass, and when the second read meets the close it reports the
	 * event before it commits what the first one read: those bytes (the
	 * rest of a response head, the last events of a stream) reach the input
	 * buffer, and on_up_read, only once this callback has returned. On the
	 * next turn every byte that came before the close has been read.
	 */
	if (tls_bev_is_tls(bev)) {
		req->upstream_dirty = true; /* never back to the pool */
		req->up_closed = what;	    /* not 0: BEV_EVENT_EOF or _ERROR is in it */
		loop_timer_arm(req->timer, 0);
		return;
	}
	request_upstream_closed(req, what);
}

/*
 * The upstream closed its connection (BEV_EVENT_EOF) or it failed, after it
 * was established; every byte it sent before is in its input buffer. A
 * response the close delimits is complete with it; any other response not
 * yet complete was cut short: 502 before the head, the client's connection
 * closed after it (client_fail), unless a pooled connection can be replayed.
 */
static void request_upstream_closed(struct request *req, short what)
{
	struct client *cl = req->cl;
	char msg[600];

	if (!req->uc)
		return; /* dropped meanwhile (DONE also stops the timer) */
	struct bufferevent *bev = req->uc->bev;

	/* A response delimited by the close is complete now. */
	if ((what & BEV_EVENT_EOF) && exchange_streaming(req)) {
		uint64_t seq = req->seq;
		exchange_read(req, &(struct xsrc){ .buf = bufferevent_get_input(bev) }); /* anything still buffered */
		if (!client_runs(cl, seq) || req->xstate == XS_DONE)
			return;
		if (respparse_needs_eof(&req->rp)) {
			meter_read_begin(&req->meter, clock_now_ns());
			respparse_finish(&req->rp);
			req->upstream_dirty = true;
			if (req->rp.done) {
				exchange_end(req, NULL, 0, false); /* all was sent */
				return;
			}
		}
	}
	if (req->xstate == XS_DONE)
		return;
	char why[160] = "";
	if (request_replay(req, why, sizeof(why)))
		return;
	snprintf(msg, sizeof(msg), "upstream %s %s %s%s", req->up->name,
		 (what & BEV_EVENT_EOF) ? "closed the connection" : "connection failed",
		 req->rec.bytes_out ? "mid-response" : "before responding", why);
	client_fail(cl, 502, REQ_ERR_UPSTREAM_RESET, "upstream_reset", msg);
}

/* A read from the upstream is parsed: its ITL run goes to the series, and
 * when it carried the first token (`first_before`: the first token's stamp
 * before the read) the connection drops to the streams' priority, on the
 * read that carried it. */
static void request_read_end(struct request *req, uint64_t first_before)
{
	meter_read_end(&req->meter);
	if (!first_before && req->rec.at[TL_FIRST_TOKEN] && req->uc)
		upconn_priority(req->uc, LOOP_PRIO_STREAM); /* the first token is out */
}

/*
 * The response is complete and its last bytes are parsed but not yet sent.
 * The upstream's slot and connection go back before the client sees those
 * bytes: a client that sends its next request the moment this one ends (on
 * another connection, which another worker may serve) must not find this
 * one still counted in flight. `past_end`: the upstream sent bytes after
 * the response, so its connection is not reused.
 */
static void request_release_upstream(struct request *req, bool past_end)
{
	if (past_end)
		req->upstream_dirty = true;
	request_drop_upstream(req, req->rp.keep_alive && !req->upstream_dirty && !req->head.http10 && req->body_done &&
					   req->rec.at[TL_REQ_SENT]);
}

/* ... and once those bytes are on their way to the client. */
static void request_response_sent(struct request *req)
{
	struct client *cl = req->cl;

	/* The upstream answered before the client finished its body: the rest
	 * of that body cannot be told from a next request. */
	if (!req->body_done)
		cl->close_after = true;
	if (evbuffer_get_length(bufferevent_get_output(cl->bev)) == 0)
		request_finish(req);
}

static void request_bad_response(struct request *req)
{
	char msg[200];

	snprintf(msg, sizeof(msg), "upstream %s sent an invalid response: %s", req->up->name,
		 respparse_error(&req->rp));
	req->upstream_dirty = true;
	client_fail(req->cl, 502, REQ_ERR_UPSTREAM_PROTOCOL, "upstream_protocol", msg);
}

/* `n` response bytes are the client's: counted; from the first, the
 * response has begun (client_fail then can only cut it). */
static void request_count_out(struct request *req, size_t n)
{
	req->rec.bytes_out += n;
}

/* Response bytes are on their way: past the stream buffer, the upstream
 * waits for the client. */
static void request_check_backlog(struct request *req)
{
	struct client *cl = req->cl;
	const struct config *cfg = pcfg(cl->px);

	if (evbuffer_get_length(bufferevent_get_output(cl->bev)) > cfg->stream_buffer) {
		/* From here the idle clock, set at this read, times the client
		 * (on_exchange_timer). */
		exchange_set_state(req, XS_PAUSED);
		req->paused_waiting = client_backlog(cl);
		upconn_reading(req->uc, false, 0);
		bufferevent_setwatermark(cl->bev, EV_WRITE, cfg->stream_buffer / 2, 0);
	}
}

/* Feeds the parser what it has not seen of `src`. Returns false when the
 * response is invalid (the request has failed). `*past_end`: bytes came
 * after the response's end. */
static bool exchange_feed(struct request *req, const struct xsrc *src, bool *past_end)
{
	enum respparse_status st = RESPPARSE_MORE;
	size_t used = 0;

	if (src->mem) {
		st = respparse_feed(&req->rp, src->mem, src->len, &used);
		*past_end = used < src->len;
	} else {
		while (!req->rp.done && evbuffer_get_length(src->buf) > req->rp.held) {
			struct evbuffer_ptr pos;
			struct evbuffer_iovec v;

			if (evbuffer_ptr_set(src->buf, &pos, req->rp.held, EVBUFFER_PTR_SET) == -1 ||
			    evbuffer_peek(src->buf, -1, &pos, &v, 1) < 1)
				break;
			st = respparse_feed(&req->rp, v.iov_base, v.iov_len, &used);
			if (st != RESPPARSE_MORE)
				break;
		}
		/* what is past the end is known once the taken bytes are out */
		*past_end = false;
	}
	if (st == RESPPARSE_INVALID || st == RESPPARSE_SWITCHING) {
		request_bad_response(req);
		return false;
	}
	return true;
}

/* Sends the first `n` bytes of `src` on to the client. False: they could
 * not be queued, the client is closed. */
static bool exchange_forward(struct client *cl, const struct xsrc *src, size_t n)
{
	if (src->mem)
		return client_forward_mem(cl, src->mem, n);
	client_forward(cl, src->buf, n);
	return true;
}

/* The response is complete: its last `n` bytes, parsed, are at the front
 * of `last`. The upstream goes back before they go to the client
 * (request_release_upstream says why). */
static void exchange_end(struct request *req, const struct xsrc *last, size_t n, bool past_end)
{
	request_release_upstream(req, past_end);
	if (!n || exchange_forward(req->cl, last, n))
		request_response_sent(req);
}

/*
 * One read from the upstream, whatever the transport: the clock and the
 * idle timer, the parser (which hands the bytes to the meter), the read's
 * ITL run and the first token's priority drop, then the parsed bytes go to
 * the client. At the response's end the upstream is given back before its
 * last bytes go (request_release_upstream says why). The request may have
 * ended when this returns.
 */
static void exchange_read(struct request *req, const struct xsrc *src)
{
	struct client *cl = req->cl;
	bool past_end;
	size_t n;

	if (cl->state == CL_CLOSED)
		return;
	CHECK(req->xstate == XS_SENDING || req->xstate == XS_AWAIT_HEAD || exchange_streaming(req));
	CHECK(!src->mem || exchange_streaming(req));
	meter_read_begin(&req->meter, clock_now_ns());
	if (exchange_streaming(req))
		req->idle_from = req->meter.now;
	uint64_t first_before = req->rec.at[TL_FIRST_TOKEN];
	if (!exchange_feed(req, src, &past_end) || cl->state == CL_CLOSED)
		return;
	request_read_end(req, first_before);
	/* a direct read's head is done: all that was used is taken */
	if (respparse_take(&req->rp, &n) == RESPPARSE_HEAD_TOO_LARGE) {
		char msg[160];
		snprintf(msg, sizeof(msg), "upstream %s sent a response head over %u bytes", req->up->name,
			 RESP_HEAD_MAX);
		req->upstream_dirty = true;
		client_fail(cl, 502, REQ_ERR_UPSTREAM_PROTOCOL, "upstream_protocol", msg);
		return;
	}
	request_count_out(req, n);
	if (req->rp.done) {
		struct xsrc last = *src;
		if (src->buf) {
			/* a move: the input buffer belongs to the connection going back */
			last.buf = cl->px->tail;
			evbuffer_remove_buffer(src->buf, last.buf, n);
			past_end = evbuffer_get_length(src->buf) != 0;
		}
		exchange_end(req, &last, n, past_end);
		return;
	}
	if (n && exchange_forward(cl, src, n))
		request_check_backlog(req);
}

/* bufferevent read callback: bytes are in the connection's input buffer */
static void on_up_read(struct bufferevent *bev, void *arg)
{
	exchange_read(arg, &(struct xsrc){ .buf = bufferevent_get_input(bev) });
}

/* upconn_direct: a streamed body, read straight from the socket */
static bool up_direct_ready(void *arg)
{
	const struct request *req = arg;

	return exchange_streaming(req) && !req->rp.held && req->cl->state != CL_CLOSED;
}

static void up_direct_data(void *arg, const char *buf, size_t len)
{
	exchange_read(arg, &(struct xsrc){ .mem = buf, .len = len });
}

void exchange_resume(struct request *req)
{
	struct client *cl = req->cl;

	CHECK(req->xstate == XS_PAUSED && req->uc);
	exchange_set_state(req, XS_STREAMING); /* the idle clock runs on */
	bufferevent_setwatermark(cl->bev, EV_WRITE, 0, 0);
	upconn_reading(req->uc, true, 0);
	req->idle_from = clock_now_ns();
	/* bytes may have arrived while reading was off */
	struct evbuffer *in = bufferevent_get_input(req->uc->bev);
	if (evbuffer_get_length(in))
		exchange_read(req, &(struct xsrc){ .buf = in });
}

static const struct upconn_direct up_direct = { .ready = up_direct_ready, .data = up_direct_data };

/* ---- response parser hooks (respparse.h): the meter's, then ours ---- */

/* The hooks' `arg` is the request's meter. */
static struct request *meter_request(void *meter)
{
	return (struct request *)((char *)meter - offsetof(struct request, meter));
}

static void on_resp_head(void *arg, const struct respparse *rp)
{
	struct request *req = meter_request(arg);

	/* the framer's bound: the proxy's generation now, as before */
	req->meter.max_event_size = pcfg(req->cl->px)->max_event_size;
	request_meter_label(req); /* routed: the series may resolve from here on */
	meter_head(&req->meter, rp);
	req->idle_from = req->meter.now;
	exchange_set_state(req, XS_STREAMING);
}

static void on_resp_complete(void *arg, bool keep_alive)
{
	struct request *req = meter_request(arg);

	meter_complete(&req->meter);
	/* The head went to the client as the upstream wrote it: a response
	 * that its close delimits, or that says the connection ends with it,
	 * ends the client's connection too (the client waits for that close).
	 * So does any answer to an HTTP/1.0 client: tokentap never adds the
	 * `Connection: keep-alive` that such a client needs to keep going, and
	 * asks the upstream to close besides (head_write). */
	if (!keep_alive || req->head.http10)
		req->cl->close_after = true;
	upstream_note_result(req->up, true, req->meter.now);
	/* rp.done is set: the read path gives the upstream back, DONE, before
	 * the last bytes go to the client (request_release_upstream) */
}

static const struct respparse_hooks resp_hooks = {
	.head = on_resp_head,
	.body = meter_resp_body,
	.complete = on_resp_complete,
};

void exchange_request_init(struct request *req)
{
	struct proxy *px = req->cl->px;
	const struct meter_env env = { px->stats, px->alog, px->recent };

	respparse_init(&req->rp, &resp_hooks, &req->meter);
	meter_init(&req->meter, &env, &req->rec, &req->rp, pcfg(px)->max_event_size, false);
}

void request_meter_label(struct request *req)
{
	meter_label(&req->meter, req->route ? req->route->name : NULL, req->up ? req->up->name : NULL, req->cold,
		    req->inflight);
}
