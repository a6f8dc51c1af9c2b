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
 * The exchange reaches its owner (the request's client, client.c, or a
 * shadow copy's mirror, mirror.c) only through struct exchange_hooks
 * (exchange.h): bytes forwarded, backlog, upload flow, and the two terminal
 * hooks, fail and done, after which it returns at once (XR_ENDED). A
 * shadow runs the same states from ROUTING on, without a queue or failover
 * (exchange_shadow_start).
 *
 * The exchange's states (EXCHANGE_STATES, exchange.h), the usual way:
 *
 *   NEW ─▶ [AWAIT_BODY | AWAIT_CHUNK] ─▶ ROUTING ─▶ [QUEUED] ─▶ CONNECTING ─▶ SENDING
 *          ─▶ AWAIT_HEAD ─▶ STREAMING ⇄ PAUSED ─▶ DONE
 *
 * and back: CONNECTING ─▶ ROUTING on failover (and SENDING, AWAIT_HEAD or
 * STREAMING ─▶ ROUTING on a missed ttft_deadline), SENDING or AWAIT_HEAD ─▶
 * CONNECTING on a replay; any state ─▶ DONE on an error or abort. The state
 * decides the timer (exchange_set_state) and what on_exchange_timer does.
 */
#include <errno.h>
#include <math.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exchange.h"

#include "bevio.h"
#include "check.h"
#include "config.h"
#include "log.h"
#include "loop.h"
#include "meter.h"
#include "respparse.h"
#include "router.h"
#include "strutil.h"
#include "tls.h"
#include "workload.h"

/* Why a request leaves its upstream for another target of its route. */
enum failover_why {
	FO_REFUSED,  /* the connection was refused or not accepted in time: nothing reached it */
	FO_DEADLINE, /* no token within the route's ttft_deadline: cancelled (on_deadline) */
};
static bool request_failover(struct exchange *x, enum failover_why why);
static void on_up_write(struct bufferevent *bev, void *arg);
static void on_up_event(struct bufferevent *bev, short what, void *arg);
static enum xr request_upstream_closed(struct exchange *x, short what);
static void on_up_read(struct bufferevent *bev, void *arg);
static enum xr exchange_read(struct exchange *x, const struct xsrc *src);
static enum xr exchange_end(struct exchange *x, const struct xsrc *last, size_t n, bool past_end);
static void on_exchange_timer(evutil_socket_t fd, short what, void *arg);
static void on_deadline(evutil_socket_t fd, short what, void *arg);
static const struct upconn_direct up_direct;
static const struct respparse_hooks resp_hooks;

const struct xfail_info exchange_fails[XF__COUNT] = {
#define X(e, status, kind, type, shadow) [XF_##e] = { status, REQ_ERR_##kind, type, REQ_ERR_##shadow },
	EXCHANGE_FAILS(X)
#undef X
};

/* The proxy's current configuration, not the request's generation: the
 * settings read through it are LIVE ones (limits.max_event_size), which a
 * reload applies to requests already running. */
static const struct config *xcfg(const struct exchange *x)
{
	return &(*x->env->current)->cfg;
}

/* The exchange failed: the owner's fail hook, last. */
static enum xr exchange_fail(struct exchange *x, enum xfail why, const char *msg)
{
	x->hooks->fail(x->owner, why, msg);
	return XR_ENDED;
}

/* How the exchange with x->up went, for cold tracking (a primary's only:
 * a shadow's traffic is not the upstream's own, exchange.h). */
static void exchange_note_result(struct exchange *x, bool responded, uint64_t now)
{
	if (!x->shadow) {
		upstream_note_result(x->up, responded, now);
		if (!responded) /* a failed connect: towards ejection */
			upstream_outlier_note(x->up, false, now);
	}
}

/* What the choice of x->up made the request hold there: its prompt
 * tokens until its first token, and the upstream's probe. Safe twice. */
static void exchange_unhold(struct exchange *x)
{
	if (x->prefill_held) {
		/* a whole answer without token events (not streamed): its end is
		 * its first token */
		uint64_t from = x->rec->at[TL_DISPATCH], now = clock_now_ns();
		if (x->resp.done && x->resp.status < 500 && from && now >= from)
			upstream_ttft_note(x->up, x->tokens_ahead, x->prefill_tok, x->rec->pick_pred_ms,
					   (double)(now - from) / 1e6, now);
		upstream_prefill_sub(x->up, (uint64_t)x->prefill_tok);
		x->prefill_held = false;
	}
	if (x->probe) {
		upstream_probe_done(x->up);
		x->probe = false;
	}
}

/* x->up was chosen (`o` says how): recorded, and its hold taken. */
static void exchange_took(struct exchange *x, const struct pick_out *o)
{
	struct up_balance b;

	x->rec->pick = pick_reason_name(o->reason);
	x->rec->pick_pred_ms = isnan(o->pred_ms) ? -1 : o->pred_ms;
	x->rec->pick_blocks = o->reason == PICK_PREFIX || o->reason == PICK_SATURATED_RELEASE ? x->pick.prefix_blocks
			      : o->held_blocks						      ? o->held_blocks
											      : 0;
	x->probe = o->probe;
	/* what it must prefill: the prompt less what it is expected to hold */
	x->prefill_tok = x->pick.tokens - (double)o->held_blocks * PREFIX_BLOCK_TOKENS;
	if (x->prefill_tok < 0)
		x->prefill_tok = 0;
	x->prefill_tok = (double)(uint64_t)x->prefill_tok;
	upstream_balance_pick(x->up, &b, 0);
	x->tokens_ahead = (double)b.prefill_tokens + x->prefill_tok;
	upstream_prefill_add(x->up, (uint64_t)x->prefill_tok);
	x->prefill_held = true;
	if (x->pick.nchain) /* it holds them now */
		upstream_held_note(x->up, x->pick.chain, x->pick.nchain);
}

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
 * For each state, the states it may change to. CONNECTING -> ROUTING is a failover (the upstream refused or did not
 * accept in time), and so are SENDING, AWAIT_HEAD and STREAMING -> ROUTING
 * (no token within the route's ttft_deadline, the response held from the
 * client: on_deadline); SENDING or AWAIT_HEAD -> CONNECTING a replay on a fresh
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
	[XS_SENDING] = XS_BIT(AWAIT_HEAD) | XS_BIT(STREAMING) | XS_BIT(CONNECTING) | XS_BIT(ROUTING) | XS_BIT(DONE),
	[XS_AWAIT_HEAD] = XS_BIT(STREAMING) | XS_BIT(CONNECTING) | XS_BIT(ROUTING) | XS_BIT(DONE),
	[XS_STREAMING] = XS_BIT(PAUSED) | XS_BIT(ROUTING) | XS_BIT(TUNNEL) | XS_BIT(DONE),
	[XS_PAUSED] = XS_BIT(STREAMING) | XS_BIT(DONE),
	[XS_TUNNEL] = XS_BIT(DONE),
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

static uint64_t xtimer_ms(const struct exchange *x, enum xtimer t)
{
	switch (t) {
	case XT_QUEUE: return x->up->conf.queue_timeout_ms;
	case XT_CONNECT: return x->up->connect_timeout_ms;
	case XT_FIRST_BYTE: return x->up->first_byte_timeout_ms;
	case XT_IDLE: return x->up->idle_timeout_ms;
	case XT_NONE: break;
	}
	return 0;
}

void exchange_set_state(struct exchange *x, enum xstate to)
{
	enum xstate from = x->xstate;

	if (from == to)
		return;
	if (log_enabled(LOG_DEBUG))
		log_conn(LOG_DEBUG, x->log_id, "exchange %s -> %s", exchange_state_name(from), exchange_state_name(to));
	CHECK(exchange_transition_legal(from, to));
	x->xstate = to;
	bool close_pending = x->up_closed != 0;
	if (to == XS_DONE)
		x->up_closed = 0; /* a pending close has nothing left to decide */
	if (x->up_closed)
		return; /* it holds the timer until on_exchange_timer acts on it */
	enum xtimer t = xstate_timer[to];
	if (t == xstate_timer[from] && !close_pending)
		return; /* STREAMING <-> PAUSED: the idle clock runs on (request_idle_rearm) */
	if (t == XT_NONE)
		loop_deadline_clear(&x->timer);
	else
		loop_deadline_set(&x->timer, xtimer_ms(x, t));
}

/* Leaves the upstream: a queued waiter cancelled, the connection back, the
 * state `next` (ROUTING for a failover, DONE otherwise), then the slot an
 * admitted state held given back. */
static void exchange_leave(struct exchange *x, bool reusable, enum xstate next)
{
	bool held = exchange_admitted(x->xstate);

	exchange_unhold(x);
	if (x->xstate == XS_QUEUED)
		upstream_cancel(x->up, &x->waiter);
	if (x->uc) {
		upstream_release(x->uc, reusable);
		x->uc = NULL;
	}
	if (x->deadline)
		evtimer_del(x->deadline); /* armed again at the next dispatch */
	exchange_set_state(x, next);
	if (held)
		upstream_leave(x->up); /* may admit a waiter: nothing after this touches it */
}

void exchange_release(struct exchange *x, bool reusable)
{
	exchange_leave(x, reusable, XS_DONE);
}

/* ---- upstream exchange ---- */

/*
 * The idle timeout of STREAMING and PAUSED runs from x->idle_from.
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
static bool request_idle_rearm(struct exchange *x)
{
	uint64_t now = clock_now_ns(), limit = x->up->idle_timeout_ms * 1000000ull;

	if (x->xstate == XS_PAUSED) {
		size_t waiting = x->hooks->backlog(x->owner, true);
		if (waiting < x->paused_waiting) {
			x->paused_waiting = waiting;
			x->idle_from = now;
		}
	}
	uint64_t silent = now - x->idle_from;
	if (silent >= limit)
		return false;
	loop_deadline_set(&x->timer, (limit - silent + 999999) / 1000000);
	return true;
}

/* The state's timer fired (exchange_set_state armed it), or a TLS
 * upstream's close waits to be acted on. */
static void on_exchange_timer(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *x = arg;
	CHECK_OBJ(x, EXCHANGE_MAGIC);
	enum xfail why;
	char msg[200];

	if (!loop_deadline_due(&x->timer))
		return; /* moved later, or cleared, since the event was armed */
	if (x->up_closed) {
		short how = x->up_closed;
		x->up_closed = 0; /* from here the states' timers run again */
		(void)request_upstream_closed(x, how);
		return;
	}
	CHECK(xstate_timer[x->xstate] != XT_NONE); /* a state without a timer deleted it */
	switch (x->xstate) {
	case XS_QUEUED:
		snprintf(msg, sizeof(msg), "upstream %s is at its concurrency limit and no slot freed within %llu ms",
			 x->up->name, (unsigned long long)x->up->conf.queue_timeout_ms);
		x->up->rejected++;
		exchange_fail(x, XF_QUEUE_TIMEOUT, msg);
		return;
	case XS_CONNECTING:
		snprintf(msg, sizeof(msg), "upstream %s did not accept the connection within %llu ms", x->up->name,
			 (unsigned long long)x->up->connect_timeout_ms);
		exchange_note_result(x, false, clock_now_ns());
		if (request_failover(x, FO_REFUSED)) /* nothing reached it: safe to send elsewhere */
			return;
		why = XF_CONNECT_TIMEOUT;
		break;
	case XS_AWAIT_HEAD:
		snprintf(msg, sizeof(msg), "upstream %s sent no response headers within %llu ms", x->up->name,
			 (unsigned long long)x->up->first_byte_timeout_ms);
		why = XF_FIRST_BYTE;
		break;
	case XS_STREAMING:
	case XS_PAUSED:
		if (request_idle_rearm(x))
			return;
		if (x->xstate == XS_PAUSED) {
			/* The client's stall, not the upstream's: counted as the
			 * client's, and the upstream's slot is freed. */
			snprintf(msg, sizeof(msg), "client read none of %zu waiting bytes for %llu ms",
				 x->paused_waiting, (unsigned long long)x->up->idle_timeout_ms);
			exchange_fail(x, XF_CLIENT_STALLED, msg);
			return;
		}
		snprintf(msg, sizeof(msg), "upstream %s went silent for %llu ms", x->up->name,
			 (unsigned long long)x->up->idle_timeout_ms);
		why = XF_IDLE;
		break;
	default: return;
	}
	exchange_fail(x, why, msg);
}

/*
 * The route's ttft_deadline passed with no token from x->up (the response
 * still held: request_hold_check stops the timer when one comes). Counted
 * against the upstream; the request goes to another target of the route
 * when one is left and every byte sent was kept (request_failover), and
 * the client, which has seen nothing, gets that one's answer alone.
 * Otherwise this upstream answers, late: the hold ends here and what it
 * sent so far goes to the client (the deadline has only been recorded),
 * its first-byte and idle timeouts still bounding it.
 */
static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct exchange *x = arg;
	CHECK_OBJ(x, EXCHANGE_MAGIC);

	if (!x->resp.hold || !exchange_admitted(x->xstate))
		return;
	/* libevent's timer can fire before the deadline as clock_now_ns reads
	 * it (2.2 ms early seen on a loaded machine): the upstream gets its
	 * whole deadline all the same */
	uint64_t now = clock_now_ns();
	if (now < x->deadline_at) {
		loop_timer_arm(x->deadline, (x->deadline_at - now + 999999u) / 1000000u);
		return;
	}
	upstream_count(x->up, UPC_DEADLINE_MISSED);
	x->rec->deadline_missed++;
	if (request_failover(x, FO_DEADLINE))
		return; /* the exchange may be gone (request_failover) */
	log_conn(LOG_INFO, x->log_id,
		 "request %s: upstream %s produced no token within the route's ttft_deadline of %llu ms; %s",
		 x->rec->id, x->up->name, (unsigned long long)x->rec->deadline_ms,
		 x->replay ? "no other upstream is left, it answers" : "not kept whole to send again, it answers");
	x->resp.hold = false;
	if (x->uc && exchange_streaming(x))
		(void)exchange_read(x, &(struct xsrc){ .buf = bufferevent_get_input(x->uc->bev) });
}

/* The head an upstream gets: same method, target and end-to-end headers,
 * HTTP/1.1 framing of tokentap's choosing, and exactly one x-request-id,
 * the request's own (the client's when usable, else a generated one), so
 * the upstream and the access log always name a request alike. Likewise at
 * most one traceparent, the request's trace with tokentap's span as the
 * parent (the same on every attempt: one span per request), and the
 * client's tracestate only beside it (request.c, request_trace). */
/* Whether the client's header i goes to the upstream as it came; sets
 * *host when it is the Host header. */
static bool head_keeps(const struct reqhead *head, const struct req_record *rec, unsigned i, bool *host)
{
	const struct hdr *h = &head->hdrs[i];
	if (reqhead_field_hop_by_hop(head, i))
		return false;
	if (h->kind == HDR_X_REQUEST_ID)
		return false; /* written once below: the id the log has */
	if (h->kind == HDR_TRACEPARENT)
		return false; /* written below: tokentap's span as the parent */
	if (h->kind == HDR_TRACESTATE && !rec->trace_state)
		return false; /* invalid, too long, or without its traceparent */
	if (h->kind == HDR_HOST)
		*host = true;
	return true;
}

static char *put(char *p, const void *src, size_t len)
{
	memcpy(p, src, len);
	return p + len;
}

#define PUT_LIT(p, lit) put((p), (lit), sizeof(lit) - 1)

/* The whole head is measured first, then written into one reservation of
 * `out` (one evbuffer_add's worth of work, not one per piece). */
int exchange_head_write(const struct reqhead *head, const struct req_record *rec, const struct upstream *up,
			struct evbuffer *out)
{
	static const char host_pre[] = "host: ", id_pre[] = "x-request-id: ", tp_pre[] = "traceparent: ";
	static const char te_line[] = "transfer-encoding: chunked\r\n", close_line[] = "connection: close\r\n";
	static const char ws_lines[] = "connection: upgrade\r\nupgrade: websocket\r\n";
	enum { MAX_KEPT = 256 };
	uint8_t kept_small[MAX_KEPT / 8] = { 0 }; /* which headers are kept, when they are few */
	bool has_host = false;
	size_t mlen = strlen(rec->method), idlen = strlen(rec->id), hostlen = 0;
	size_t total = mlen + 1 + head->url_len + sizeof(" HTTP/1.1\r\n") - 1;

	for (unsigned i = 0; i < head->nhdr; i++) {
		if (!head_keeps(head, rec, i, &has_host))
			continue;
		if (i < MAX_KEPT)
			kept_small[i / 8] |= (uint8_t)(1u << (i % 8));
		total += head->hdrs[i].name_len + head->hdrs[i].val_len + 4;
	}
	if (!has_host) {
		hostlen = strlen(up->name);
		total += sizeof(host_pre) - 1 + hostlen + 2;
	}
	total += sizeof(id_pre) - 1 + idlen + 2;
	if (rec->traced)
		total += sizeof(tp_pre) - 1 + TRACEPARENT_LEN + 2;
	if (head->chunked)
		total += sizeof(te_line) - 1;
	if (head->http10)
		total += sizeof(close_line) - 1;
	if (head->websocket)
		total += sizeof(ws_lines) - 1;
	total += 2;

	struct evbuffer_iovec vec;
	if (evbuffer_reserve_space(out, (ev_ssize_t)total, &vec, 1) != 1 || vec.iov_len < total)
		return -1;
	char *p = vec.iov_base;
	p = put(p, rec->method, mlen);
	*p++ = ' ';
	p = put(p, head->buf + head->url_off, head->url_len);
	p = head->http10 ? PUT_LIT(p, " HTTP/1.0\r\n") : PUT_LIT(p, " HTTP/1.1\r\n");
	for (unsigned i = 0; i < head->nhdr; i++) {
		bool unused = false;
		if (i < MAX_KEPT ? !(kept_small[i / 8] & (1u << (i % 8))) : !head_keeps(head, rec, i, &unused))
			continue;
		const struct hdr *h = &head->hdrs[i];
		p = put(p, head->buf + h->name_off, h->name_len);
		p = PUT_LIT(p, ": ");
		p = put(p, head->buf + h->val_off, h->val_len);
		p = PUT_LIT(p, "\r\n");
	}
	if (!has_host) {
		p = PUT_LIT(p, host_pre);
		p = put(p, up->name, hostlen);
		p = PUT_LIT(p, "\r\n");
	}
	p = PUT_LIT(p, id_pre);
	p = put(p, rec->id, idlen);
	p = PUT_LIT(p, "\r\n");
	if (rec->traced) {
		char tp[TRACEPARENT_LEN + 1];
		tracectx_format(&rec->trace, tp);
		p = PUT_LIT(p, tp_pre);
		p = put(p, tp, TRACEPARENT_LEN);
		p = PUT_LIT(p, "\r\n");
	}
	if (head->chunked)
		p = PUT_LIT(p, te_line);
	if (head->http10)
		p = PUT_LIT(p, close_line);
	if (head->websocket) /* a WebSocket handshake's own hop-by-hop pair (RFC 6455 4.1) */
		p = PUT_LIT(p, ws_lines);
	p = PUT_LIT(p, "\r\n");
	vec.iov_len = (size_t)(p - (char *)vec.iov_base);
	CHECK(vec.iov_len == total);
	return evbuffer_commit_space(out, &vec, 1) == 0 ? 0 : -1;
}

/* The copy of the request kept for a resend (x->replay) begun, in the
 * emptied buffer of the last one when there is one; NULL when out of memory
 * (no resend). */
static void replay_open(struct exchange *x)
{
	if (x->replay)
		return;
	x->replay = x->replay_spare ? x->replay_spare : evbuffer_new();
	x->replay_spare = NULL;
}

/* No resend from here: the copy dropped, its buffer emptied and kept. */
static void replay_drop(struct exchange *x)
{
	if (!x->replay)
		return;
	if (x->replay_spare) {
		evbuffer_free(x->replay);
	} else {
		evbuffer_drain(x->replay, evbuffer_get_length(x->replay));
		x->replay_spare = x->replay;
	}
	x->replay = NULL;
}

/* The primary's head goes in front of whatever body bytes already wait in
 * pending, once the upstream is chosen (a failover writes it again).
 * -1: out of memory (pending unchanged). */
static int request_write_head(struct exchange *x)
{
	size_t before = evbuffer_get_length(x->pending);

	/* Nothing of the body yet (the head is routed as it parses): written in
	 * place, committed whole or not at all. */
	if (before == 0) {
		if (exchange_head_write(x->head, x->rec, x->up, x->pending) == -1)
			return -1;
		x->head_len = evbuffer_get_length(x->pending);
		return 0;
	}
	struct evbuffer *out = evbuffer_new();
	int r = -1;

	if (!out)
		return -1;
	if (exchange_head_write(x->head, x->rec, x->up, out) == 0) {
		x->head_len = evbuffer_get_length(out);
		r = evbuffer_prepend_buffer(x->pending, out);
	}
	evbuffer_free(out);
	return r;
}

/* `uc`'s reads, writes and events are the request's from now on. */
static void request_bind(struct exchange *x, struct upconn *uc)
{
	bufferevent_setcb(uc->bev, on_up_read, on_up_write, on_up_event, x);
	upconn_set_direct(uc, &up_direct, x);
	bufferevent_setwatermark(uc->bev, EV_WRITE, 0, 0);
	if (x->shadow)
		upconn_priority(uc, LOOP_PRIO_STREAM); /* a shadow never goes before the primaries */
}

/*
 * The route's ttft_deadline, from each dispatch: the upstream's response is
 * held from the client (resp.hold) until its first token, and every byte
 * of the request that goes out is kept (x->replay, up to REPLAY_MAX) so
 * that another upstream can be sent it should this one have produced no
 * token in time (on_deadline). Counted from the dispatch, so each upstream
 * tried gets the whole deadline, and a wait in an admission queue is not
 * counted against the upstream that ends it. No timer (out of memory): no
 * hold, the request runs as on a route without a deadline.
 */
static void request_deadline_arm(struct exchange *x)
{
	uint64_t ms = x->shadow ? 0 : x->route->conf->ttft_deadline_ms;

	x->rec->deadline_ms = ms;
	if (!ms)
		return;
	if (!x->deadline && !(x->deadline = evtimer_new(x->env->base, on_deadline, x)))
		return;
	x->resp.hold = true;
	replay_open(x); /* filled as bytes go out (exchange_flush); NULL: no resend */
	/* From now, not from the loop turn's cached clock, which may be some
	 * milliseconds old on a busy worker: the upstream gets the whole
	 * deadline. */
	event_base_update_cache_time(x->env->base);
	x->deadline_at = clock_now_ns() + ms * 1000000u;
	loop_timer_arm(x->deadline, ms);
}

/* The held response may go to its client: it is over, or not a success
 * (nothing to wait for), or its first token has parsed (a streamed one),
 * or its first body byte (one not streamed, which comes whole), or more
 * is held than one stream buffer (an upstream sending that much before any
 * token is not stalled; the deadline is given up rather than the memory
 * spent). The deadline stops there, and the copy of the request kept for
 * it is dropped. */
static void request_hold_check(struct exchange *x)
{
	const struct respparse *rp = &x->resp;

	if (!rp->head_done)
		return;
	if (rp->done || rp->status < 200 || rp->status >= 300 ||
	    (rp->kind != FRAMER_NONE ? x->rec->at[TL_FIRST_TOKEN] != 0 : x->body_seen) || rp->held > STREAM_BUFFER) {
		x->resp.hold = false;
		evtimer_del(x->deadline);
		/* the response has begun: neither this nor a replay on a pooled
		 * connection (request_replay) sends the request again */
		replay_drop(x);
	}
}

/* A slot on x->up is ours: take a connection and send. CONNECTING is
 * entered first, so that the slot is given back should the connection not
 * open. */
static enum xr request_connect(struct exchange *x)
{
	bool reused = false;
	char msg[200];

	exchange_set_state(x, XS_CONNECTING);
	uint64_t now = clock_now_ns();
	x->rec->at[TL_DISPATCH] = now; /* again after a failover: queue ends at the last dispatch */
	x->rec->at[TL_UP_CONNECTED] = 0;
	x->rec->upstream = x->up->name;
	x->rec->up_url = x->up->url;
	if (!x->shadow) /* the engine's queue as last scraped (scrape.h) */
		upstream_engine_note(x->up, &x->rec->engine, now);
	x->resp.head_request = x->method == HTTP_HEAD;
	x->resp.upgrade_ok = !x->shadow && x->head && x->head->websocket && x->hooks->upgraded;
	/* a shadow's head came with its bytes (exchange_shadow_start) */
	if (!x->shadow && request_write_head(x) == -1) {
		snprintf(msg, sizeof(msg), "out of memory writing the request head for upstream %s", x->up->name);
		return exchange_fail(x, XF_NO_MEMORY, msg);
	}
	x->uc = upstream_acquire(x->up, &reused);
	if (!x->uc) {
		snprintf(msg, sizeof(msg), "cannot open a connection to upstream %s: %s", x->up->name, strerror(errno));
		return exchange_fail(x, XF_NO_SOCKET, msg);
	}
	x->cold = !x->shadow && upstream_dispatch_cold(x->up, reused, now);
	request_bind(x, x->uc);
	x->reused = reused;
	request_deadline_arm(x);
	if (reused) {
		exchange_set_state(x, XS_SENDING); /* connected already: the connect timer off again */
		/* A pooled connection may have been closed by the server a moment
		 * ago (its keep-alive timeout racing this request): keep a copy to
		 * replay, when the whole request is here and small. */
		if (!x->retried)
			replay_open(x); /* filled as bytes go out: exchange_flush */
		x->rec->at[TL_UP_CONNECTED] = now;
		upconn_writing(x->uc);
		upconn_reading(x->uc, true, 0);
		/* Inside the owner's parse pass (corked), the bytes parsed after this
		 * head (usually the whole body) go out with it once the pass ends:
		 * one write. */
		if (!x->corked)
			return exchange_flush(x);
	}
	return XR_OK;
}

static void on_admitted(struct up_waiter *w)
{
	struct exchange *x = (struct exchange *)((char *)w - offsetof(struct exchange, waiter));
	CHECK_OBJ(x, EXCHANGE_MAGIC);

	(void)request_connect(x);
}

enum xr exchange_admit(struct exchange *x)
{
	char msg[200];

	/* The load this request meets, sampled as it is routed, before any
	 * wait: those running on the upstream and those queued for it, and
	 * itself. Sampled after the queue instead, every queued request would
	 * see max_concurrency at most. */
	x->load = upstream_inflight(x->up) + upstream_waiting(x->up) + 1;
	x->waiter.ready = on_admitted;
	switch (upstream_admit(x->up, &x->waiter)) {
	case ADMIT_NOW: return request_connect(x);
	case ADMIT_QUEUED: exchange_set_state(x, XS_QUEUED); break;
	case ADMIT_FULL:
		snprintf(msg, sizeof(msg), "upstream %s is at its concurrency limit and its queue is full",
			 x->up->name);
		return exchange_fail(x, XF_QUEUE_FULL, msg);
	}
	return XR_OK;
}

enum xr exchange_shadow_start(struct exchange *x, struct upstream *up, enum llhttp_method method, bool http10)
{
	CHECK(x->shadow && x->xstate == XS_NEW);
	x->up = up;
	x->method = method;
	x->http10 = http10;
	x->load = upstream_inflight(up);   /* admitted on arrival: this one included */
	exchange_set_state(x, XS_ROUTING); /* routed by its owner */
	return request_connect(x);
}

/* The sticky value of this request, when its route has one. */
static const char *request_sticky_key(struct exchange *x, size_t *len)
{
	const struct route_conf *rc = x->route->conf;

	if (rc->sticky == STICKY_HEADER) {
		const struct hdr *h = reqhead_header(x->head, rc->sticky_key);
		if (h && h->val_len) {
			*len = h->val_len;
			return x->head->buf + h->val_off;
		}
	} else if (rc->sticky == STICKY_JSON_FIELD && x->sticky_value[0]) {
		*len = strlen(x->sticky_value);
		return x->sticky_value;
	}
	return NULL;
}

struct route *exchange_match(const struct exchange *x)
{
	const struct hdr *host = reqhead_kind(x->head, HDR_HOST);

	return router_match(x->rt, x->rec->method, x->rec->path, strlen(x->rec->path),
			    host ? x->head->buf + host->val_off : NULL, host ? host->val_len : 0,
			    x->rec->model[0] ? x->rec->model : NULL);
}

/* Picks the route and the upstream. Called once the head is parsed, or
 * once the body prefix is, when routing needs it. */
enum xr exchange_pick(struct exchange *x, bool *pinned)
{
	const struct config *cfg = &x->rt->cfg;
	const char *method = x->rec->method;
	char msg[300];

	*pinned = false;
	x->method = x->head->method;
	x->http10 = x->head->http10;
	exchange_set_state(x, XS_ROUTING);
	x->route = exchange_match(x);
	if (!x->route) {
		snprintf(msg, sizeof(msg), "no route matches %s %s", method, x->rec->path);
		return exchange_fail(x, XF_NO_ROUTE, msg);
	}
	if (cfg->override_header) {
		const struct hdr *h = reqhead_header(x->head, cfg->override_header);
		if (h) {
			x->up = router_upstream(x->rt, x->head->buf + h->val_off, h->val_len);
			if (!x->up) {
				snprintf(msg, sizeof(msg), "%s names no configured upstream", cfg->override_header);
				return exchange_fail(x, XF_BAD_OVERRIDE, msg);
			}
			int i = route_target_index(x->route, x->up);
			/* the route's own upstreams only: a shadow or a staging upstream
			 * is not for any client to reach, unless configured so */
			if (i < 0 && !cfg->override_any_upstream) {
				snprintf(msg, sizeof(msg), "%s names %s, not an upstream of route %s",
					 cfg->override_header, x->up->name, x->route->name);
				x->up = NULL;
				return exchange_fail(x, XF_BAD_OVERRIDE, msg);
			}
			x->tried = i >= 0 ? ~(uint64_t)0 & ~(1ull << i) : ~(uint64_t)0; /* pinned: no failover */
			*pinned = true;
			x->rec->pick = pick_reason_name(PICK_PINNED);
			if (i >= 0)
				route_note_pick(x->route, (unsigned)i, PICK_PINNED);
			x->rec->pick_pred_ms = -1;
			return XR_OK;
		}
	}
	struct pick_out o;
	x->pick.key = request_sticky_key(x, &x->pick.klen);
	x->pick.failover = x->pick.deadline = false;
	if (!x->pick.tokens) /* the body's bytes, 4 to a token (workload.h's approximation) */
		x->pick.tokens = (double)(x->head->content_length > 0 ? (uint64_t)x->head->content_length : 0) /
				 WL_BYTES_PER_TOKEN;
	x->up = route_pick(x->route, &x->pick, x->tried, &o);
	if (x->up)
		exchange_took(x, &o);
	if (!x->up) {
		snprintf(msg, sizeof(msg), "route %s has no upstream with a weight above 0", x->route->name);
		return exchange_fail(x, XF_NO_TARGET, msg);
	}
	return XR_OK;
}

/*
 * The request is sent to another upstream, the response this one began
 * forgotten (it was held: the client saw none of it). `pending` gets every
 * byte that left it for this upstream (the replay copy, the head for this
 * upstream at its front as in pending before), then those still waiting.
 * -1: they could not be put back (nothing changed).
 */
static int request_rewind(struct exchange *x)
{
	CHECK(x->replay && x->rec->bytes_out == 0);
	if (evbuffer_prepend_buffer(x->pending, x->replay) == -1)
		return -1;
	replay_drop(x); /* made again at the next dispatch */
	x->wrote_at = 0;
	x->reused = x->retried = false;
	x->upstream_dirty = x->resp_close = x->body_seen = false;
	x->up_closed = 0; /* the connection it was about is closed with the rest */
	respparse_init(&x->resp, &resp_hooks, &x->meter);
	meter_restart(&x->meter);
	return 0;
}

/*
 * Another target of the route gets the request, when the route allows:
 * FO_REFUSED, the chosen upstream refused the connection before any byte
 * reached it (the route's `failover`); FO_DEADLINE, it produced no token
 * within the route's ttft_deadline and every byte sent to it was kept
 * (request_deadline_arm). Its connection is closed, never pooled, so that
 * the engine stops generating for a request nobody will read. False: no
 * other target is left, or the request cannot be sent again; nothing
 * changed.
 */
static bool request_failover(struct exchange *x, enum failover_why why)
{
	struct pick_out o;

	if (x->shadow)
		return false;
	int cur = route_target_index(x->route, x->up);
	if (cur < 0 || (why == FO_REFUSED ? !x->route->conf->failover : !x->replay))
		return false;
	x->tried |= 1ull << cur;
	x->pick.key = request_sticky_key(x, &x->pick.klen);
	x->pick.failover = true;
	x->pick.deadline = why == FO_DEADLINE;
	struct upstream *next = route_pick(x->route, &x->pick, x->tried, &o);
	if (!next)
		return false;
	if (why == FO_DEADLINE && request_rewind(x) == -1)
		return false;
	log_conn(LOG_WARN, x->log_id, "request %s: upstream %s %s; failing over to %s", x->rec->id, x->up->name,
		 why == FO_REFUSED ? "refused" : "produced no token within the route's ttft_deadline", next->name);
	if (why == FO_DEADLINE)
		x->rec->deadline_failovers++;
	exchange_leave(x, false, XS_ROUTING);
	evbuffer_drain(x->pending, x->head_len); /* the head is rewritten for the next one */
	x->head_len = 0;
	x->up = next;
	exchange_took(x, &o);
	(void)exchange_admit(x); /* its failure is the owner's: either way the exchange is no longer ours */
	return true;
}

/* Moves `src` to the upstream connection: with nothing queued before it,
 * written to the socket here and now, over plain TCP with writev, over TLS
 * (handshake done) with SSL_write (tls_bev_send: a record per 16 KiB); a
 * bufferevent would write on the next loop turn, after every other ready
 * event (in a burst of arrivals that is the whole burst), and enable and
 * disable its write event around it. The rest into the bufferevent's
 * output, which also reports a failed write. `now` false (a shadow's
 * bytes, which never go before a primary's): all of it to the bufferevent.
 * Returns the clock read just before the write that took all of `src`, 0
 * when some of it was left to the bufferevent (over TLS, a record the
 * socket took only part of too); UINT64_MAX when that could not be queued
 * (out of memory). */
static uint64_t upstream_send(struct upconn *uc, struct evbuffer *src, bool now)
{
	struct evbuffer *out = bufferevent_get_output(uc->bev);
	uint64_t at = 0;

	if (now && uc->rev && evbuffer_get_length(out) == 0) {
		at = clock_now_ns();
		if (!uc->ssl) {
			(void)evbuffer_write(src, bufferevent_getfd(uc->bev));
		} else {
			(void)tls_bev_send(uc->bev, src);
			if (evbuffer_get_length(out))
				at = 0; /* the last record goes on from there */
		}
	}
	if (evbuffer_get_length(src)) {
		if (evbuffer_add_buffer(out, src) == -1)
			return UINT64_MAX;
		at = 0;
	}
	return at;
}

enum xr exchange_flush(struct exchange *x)
{
	size_t queued = evbuffer_get_length(x->pending);

	if (x->uc && x->uc->connected) {
		struct evbuffer *out = bufferevent_get_output(x->uc->bev);
		if (x->replay && queued) {
			/* keep what goes out, while the request stays small */
			size_t have = evbuffer_get_length(x->replay);
			if (have + queued > REPLAY_MAX || bevio_copy(x->replay, x->pending) == -1) {
				replay_drop(x); /* too big, or out of memory: no replay */
			}
		}
		if (queued)
			x->wrote_at = upstream_send(x->uc, x->pending, !x->shadow);
		if (x->wrote_at == UINT64_MAX) {
			x->wrote_at = 0;
			return exchange_fail(x, XF_NO_MEMORY, "out of memory queueing the request for its upstream");
		}
		queued = evbuffer_get_length(out);
	}
	if (queued > STREAM_BUFFER) {
		x->upload_stopped = true;
		(void)x->hooks->upload(x->owner, false); /* stopping ends nothing */
	} else if (x->upload_stopped && queued <= STREAM_BUFFER / 2 && x->uc && x->uc->connected) {
		/* Stopped while the bytes waited for a connection or an
		 * admission slot, and written now in this call: the bufferevent
		 * wrote none of them, so no write callback (on_up_write) would
		 * resume the owner. */
		x->upload_stopped = false;
		if (x->hooks->upload(x->owner, true) == XR_ENDED)
			return XR_ENDED;
	}
	/* all of it may be out already: no write callback will say so */
	exchange_check_sent(x);
	return XR_OK;
}

size_t exchange_upload_waiting(const struct exchange *x)
{
	size_t n = evbuffer_get_length(x->pending);

	return x->uc ? n + evbuffer_get_length(bufferevent_get_output(x->uc->bev)) : n;
}

/* The whole request is on the wire once the body is complete and nothing
 * waits in either buffer; from then the first-byte clock runs. */
void exchange_check_sent(struct exchange *x)
{
	if (!x->body_done || !x->uc || !x->uc->connected || x->rec->at[TL_REQ_SENT])
		return;
	if (exchange_upload_waiting(x))
		return;
	/* When the last bytes went out in a write of ours, the request was
	 * sent as that write began: the server may be reading it (and starting
	 * its own clocks) before the write returns, on a busy host long before.
	 * Bytes the bufferevent wrote are seen here just after its write. */
	timeline_mark(x->rec, TL_REQ_SENT, x->wrote_at ? x->wrote_at : clock_now_ns());
	if (x->xstate == XS_SENDING) /* else the response began already: STREAMING or PAUSED */
		exchange_set_state(x, XS_AWAIT_HEAD);
}

static void on_up_write(struct bufferevent *bev, void *arg)
{
	struct exchange *x = arg;
	CHECK_OBJ(x, EXCHANGE_MAGIC);

	/* under half the stream buffer: the owner reads its client again, if
	 * it had stopped */
	if (evbuffer_get_length(bufferevent_get_output(bev)) <= STREAM_BUFFER / 2) {
		x->upload_stopped = false;
		if (x->hooks->upload(x->owner, true) == XR_ENDED)
			return;
	}
	exchange_check_sent(x);
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
 * more on a new connection when that is safe: every byte of it that went
 * out was kept (see REPLAY_MAX), nothing of a response came back, it has
 * not been replayed before, and either its method is idempotent or the
 * server cannot have had it: the failure came while it was being written
 * (its body may still be arriving: what went out goes again, in front of
 * what has not, and the rest follows as it comes) or at once after
 * (replay_window_ns). A failure later than that is a server that read the
 * request and failed on it (a crash or a reset mid-generation): a POST is
 * not run twice, the client gets the 502. Returns true when the replay is
 * under way; otherwise `why` says why a replay that was possible was not
 * made, or is left empty.
 */
static bool request_replay(struct exchange *x, char *why, size_t whylen)
{
	struct upconn *fresh;
	uint64_t sent = x->rec->at[TL_REQ_SENT], after = sent ? clock_now_ns() - sent : 0;
	char when[64] = "while the request was being written";

	if (!x->reused || x->retried || !x->replay || x->resp.held || x->resp.head_done)
		return false;
	if (sent)
		snprintf(when, sizeof(when), "%llu us after the request was written",
			 (unsigned long long)(after / 1000u));
	if (sent && !method_idempotent(x->method) && after > replay_window_ns(x->uc)) {
		snprintf(why, whylen, " (%s): not sent again, %s is not idempotent", when, x->rec->method);
		return false;
	}
	/* what went out goes again, in front of what has not (a body still
	 * arriving): failing from here on, the request fails as it would */
	if (evbuffer_prepend_buffer(x->pending, x->replay) == -1)
		return false;
	fresh = upstream_connect_new(x->up);
	if (!fresh)
		return false;
	log_conn(LOG_INFO, x->log_id,
		 "request %s: pooled connection to %s was closed by the server (%s); sending again", x->rec->id,
		 x->up->name, when);
	x->retried = true;
	upstream_release(x->uc, false);
	x->uc = fresh;
	x->reused = false;
	replay_drop(x);
	/* a route's ttft_deadline keeps what goes out again, for another upstream */
	if (x->resp.hold)
		replay_open(x);
	x->rec->at[TL_UP_CONNECTED] = 0;
	x->rec->at[TL_REQ_SENT] = 0;
	x->wrote_at = 0;
	request_bind(x, fresh);
	exchange_set_state(x, XS_CONNECTING); /* the slot stays: the same upstream */
	return true;
}

static void on_up_event(struct bufferevent *bev, short what, void *arg)
{
	struct exchange *x = arg;
	CHECK_OBJ(x, EXCHANGE_MAGIC);
	char msg[600];

	if (what & BEV_EVENT_CONNECTED) {
		x->uc->connected = true;
		timeline_mark(x->rec, TL_UP_CONNECTED, clock_now_ns());
		exchange_set_state(x, XS_SENDING);
		bufferevent_enable(bev, EV_WRITE);
		upconn_reading(x->uc, true, 0);
		(void)exchange_flush(x);
		return;
	}
	if (!x->uc->connected) {
		int err = EVUTIL_SOCKET_ERROR();
		char tlserr[256];
		exchange_note_result(x, false, clock_now_ns());
		if (*tls_bev_error(bev, tlserr, sizeof(tlserr))) {
			/* a certificate that does not verify is a hard error: no
			 * retry elsewhere that would hide it */
			snprintf(msg, sizeof(msg), "TLS with upstream %s failed: %s", x->up->name, tlserr);
			log_conn(LOG_WARN, x->log_id, "request %s: %s", x->rec->id, msg);
			exchange_fail(x, XF_TLS, msg);
			return;
		}
		snprintf(msg, sizeof(msg), "upstream %s is unreachable: %s", x->up->name,
			 err ? evutil_socket_error_to_string(err) : "connection failed");
		if (request_failover(x, FO_REFUSED))
			return;
		exchange_fail(x, XF_UNREACHABLE, msg);
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
		x->upstream_dirty = true; /* never back to the pool */
		x->up_closed = what;	  /* not 0: BEV_EVENT_EOF or _ERROR is in it */
		loop_deadline_set(&x->timer, 0);
		return;
	}
	(void)request_upstream_closed(x, what);
}

/*
 * The upstream closed its connection (BEV_EVENT_EOF) or it failed, after it
 * was established; every byte it sent before is in its input buffer. A
 * response the close delimits is complete with it; any other response not
 * yet complete was cut short: 502 before the head, the client's connection
 * closed after it (client_fail), unless a pooled connection can be replayed.
 */
static enum xr request_upstream_closed(struct exchange *x, short what)
{
	char msg[600];

	if (!x->uc)
		return XR_OK; /* dropped meanwhile (DONE also stops the timer) */
	struct bufferevent *bev = x->uc->bev;

	/* A response delimited by the close is complete now. */
	if ((what & BEV_EVENT_EOF) && exchange_streaming(x)) {
		/* anything still buffered */
		if (exchange_read(x, &(struct xsrc){ .buf = bufferevent_get_input(bev) }) == XR_ENDED ||
		    x->xstate == XS_DONE)
			return XR_ENDED;
		if (respparse_needs_eof(&x->resp)) {
			meter_read_begin(&x->meter, clock_now_ns());
			respparse_finish(&x->resp);
			x->upstream_dirty = true;
			if (x->resp.done)
				return exchange_end(x, NULL, 0, false); /* all was sent */
		}
	}
	if (x->xstate == XS_DONE)
		return XR_OK;
	char why[160] = "";
	if (request_replay(x, why, sizeof(why)))
		return XR_OK;
	snprintf(msg, sizeof(msg), "upstream %s %s %s%s", x->up->name,
		 (what & BEV_EVENT_EOF) ? "closed the connection" : "connection failed",
		 x->rec->bytes_out ? "mid-response" : "before responding", why);
	return exchange_fail(x, XF_RESET, msg);
}

/* A read from the upstream is parsed: its ITL run goes to the series, and
 * when it carried the first token (`first_before`: the first token's stamp
 * before the read) the connection drops to the streams' priority, on the
 * read that carried it. */
static void request_read_end(struct exchange *x, uint64_t first_before)
{
	meter_read_end(&x->meter);
	if (!first_before && x->rec->at[TL_FIRST_TOKEN]) {
		if (x->uc)
			upconn_priority(x->uc, LOOP_PRIO_STREAM); /* the first token is out */
		if (x->prefill_held && !x->shadow) {
			uint64_t at = x->rec->at[TL_FIRST_TOKEN], from = x->rec->at[TL_DISPATCH];
			if (from && at >= from)
				upstream_ttft_note(x->up, x->tokens_ahead, x->prefill_tok, x->rec->pick_pred_ms,
						   (double)(at - from) / 1e6, at);
			upstream_prefill_sub(x->up, (uint64_t)x->prefill_tok);
			x->prefill_held = false;
		}
	}
}

/*
 * The response is complete and its last bytes are parsed but not yet sent.
 * The upstream's slot and connection go back before the client sees those
 * bytes: a client that sends its next request the moment this one ends (on
 * another connection, which another worker may serve) must not find this
 * one still counted in flight. `past_end`: the upstream sent bytes after
 * the response, so its connection is not reused.
 */
static void request_release_upstream(struct exchange *x, bool past_end)
{
	if (past_end)
		x->upstream_dirty = true;
	exchange_release(x, x->resp.keep_alive && !x->upstream_dirty && !x->http10 && x->body_done &&
				    x->rec->at[TL_REQ_SENT]);
}

/* ... and once those bytes are on their way to the client: the owner's
 * done hook (the client finishes the request once they are written). */
static enum xr request_response_sent(struct exchange *x)
{
	x->hooks->done(x->owner);
	return XR_ENDED;
}

static enum xr request_bad_response(struct exchange *x)
{
	char msg[200];

	snprintf(msg, sizeof(msg), "upstream %s sent an invalid response: %s", x->up->name, respparse_error(&x->resp));
	x->upstream_dirty = true;
	return exchange_fail(x, XF_BAD_RESPONSE, msg);
}

/* `n` response bytes are the client's: counted; from the first, the
 * response has begun (client_fail then can only cut it). */
static void request_count_out(struct exchange *x, size_t n)
{
	x->rec->bytes_out += n;
}

/* Response bytes are on their way: past the stream buffer, the upstream
 * waits for the client. */
static void request_check_backlog(struct exchange *x)
{
	size_t sb = STREAM_BUFFER;

	if (x->hooks->backlog(x->owner, false) > sb) {
		/* From here the idle clock, set at this read, times the client
		 * (on_exchange_timer). */
		exchange_set_state(x, XS_PAUSED);
		x->paused_waiting = x->hooks->backlog(x->owner, true);
		upconn_reading(x->uc, false, 0);
		x->hooks->want_drain(x->owner, sb / 2);
	}
}

/* Feeds the parser what it has not seen of `src`. Returns false when the
 * response is invalid (the request has failed). `*past_end`: bytes came
 * after the response's end. */
static bool exchange_feed(struct exchange *x, const struct xsrc *src, bool *past_end)
{
	enum respparse_status st = RESPPARSE_MORE;
	size_t used = 0;

	if (src->mem) {
		st = respparse_feed(&x->resp, src->mem, src->len, &used);
		*past_end = used < src->len;
	} else {
		while (!x->resp.done && evbuffer_get_length(src->buf) > x->resp.held) {
			struct evbuffer_ptr pos;
			struct evbuffer_iovec v;

			if (evbuffer_ptr_set(src->buf, &pos, x->resp.held, EVBUFFER_PTR_SET) == -1 ||
			    evbuffer_peek(src->buf, -1, &pos, &v, 1) < 1)
				break;
			st = respparse_feed(&x->resp, v.iov_base, v.iov_len, &used);
			if (st != RESPPARSE_MORE)
				break;
		}
		/* what is past the end is known once the taken bytes are out */
		*past_end = false;
	}
	if (st == RESPPARSE_INVALID || st == RESPPARSE_SWITCHING) {
		(void)request_bad_response(x);
		return false;
	}
	return true;
}

/* Sends the first `n` bytes of `src` on to the client (the forward hook).
 * XR_ENDED: they could not be queued, the client is closed. */
static enum xr exchange_forward(struct exchange *x, const struct xsrc *src, size_t n)
{
	return x->hooks->forward(x->owner, src, n);
}

/* The response is complete: its last `n` bytes, parsed, are at the front
 * of `last`. The upstream goes back before they go to the client
 * (request_release_upstream says why). */
static enum xr exchange_end(struct exchange *x, const struct xsrc *last, size_t n, bool past_end)
{
	request_release_upstream(x, past_end);
	if (n && exchange_forward(x, last, n) == XR_ENDED)
		return XR_ENDED;
	return request_response_sent(x);
}

/*
 * One read from the upstream, whatever the transport: the clock and the
 * idle timer, the parser (which hands the bytes to the meter), the read's
 * ITL run and the first token's priority drop, then the parsed bytes go to
 * the client. At the response's end the upstream is given back before its
 * last bytes go (request_release_upstream says why). XR_ENDED: the
 * exchange ended there (and may be freed).
 */
static enum xr exchange_read(struct exchange *x, const struct xsrc *src)
{
	bool past_end;
	size_t n;

	CHECK(x->xstate == XS_SENDING || x->xstate == XS_AWAIT_HEAD || exchange_streaming(x));
	CHECK(!src->mem || exchange_streaming(x));
	meter_read_begin(&x->meter, clock_now_ns());
	if (exchange_streaming(x))
		x->idle_from = x->meter.now;
	uint64_t first_before = x->rec->at[TL_FIRST_TOKEN];
	if (!exchange_feed(x, src, &past_end))
		return XR_ENDED;
	request_read_end(x, first_before);
	if (x->resp.hold)
		request_hold_check(x);
	/* a direct read's head is done: all that was used is taken */
	if (respparse_take(&x->resp, &n) == RESPPARSE_HEAD_TOO_LARGE) {
		char msg[160];
		snprintf(msg, sizeof(msg), "upstream %s sent a response head over %u bytes", x->up->name,
			 RESP_HEAD_MAX);
		x->upstream_dirty = true;
		return exchange_fail(x, XF_HEAD_TOO_LARGE, msg);
	}
	request_count_out(x, n);
	if (x->resp.done && x->resp.switched) {
		/* the 101 goes out; the frames behind it stay in the input
		 * buffer, the tunnel's */
		if (n && exchange_forward(x, src, n) == XR_ENDED)
			return XR_ENDED;
		exchange_set_state(x, XS_TUNNEL);
		x->hooks->upgraded(x->owner);
		return XR_ENDED;
	}
	if (x->resp.done) {
		struct xsrc last = *src;
		if (src->buf) {
			/* a move: the input buffer belongs to the connection going back */
			last.buf = x->env->tail;
			evbuffer_remove_buffer(src->buf, last.buf, n);
			past_end = evbuffer_get_length(src->buf) != 0;
		}
		return exchange_end(x, &last, n, past_end);
	}
	if (n) {
		if (exchange_forward(x, src, n) == XR_ENDED)
			return XR_ENDED;
		request_check_backlog(x);
	}
	return XR_OK;
}

/* bufferevent read callback: bytes are in the connection's input buffer */
static void on_up_read(struct bufferevent *bev, void *arg)
{
	CHECK_OBJ((struct exchange *)arg, EXCHANGE_MAGIC);
	(void)exchange_read(arg, &(struct xsrc){ .buf = bufferevent_get_input(bev) });
}

/* upconn_direct: a streamed body, read straight from the socket */
static bool up_direct_ready(void *arg)
{
	const struct exchange *x = arg;

	CHECK_OBJ(x, EXCHANGE_MAGIC);
	return exchange_streaming(x) && !x->resp.held;
}

static void up_direct_data(void *arg, const char *buf, size_t len)
{
	CHECK_OBJ((struct exchange *)arg, EXCHANGE_MAGIC);
	(void)exchange_read(arg, &(struct xsrc){ .mem = buf, .len = len });
}

enum xr exchange_resume(struct exchange *x)
{
	CHECK(x->xstate == XS_PAUSED && x->uc);
	exchange_set_state(x, XS_STREAMING); /* the idle clock runs on */
	x->hooks->want_drain(x->owner, 0);
	upconn_reading(x->uc, true, 0);
	x->idle_from = clock_now_ns();
	/* bytes may have arrived while reading was off */
	struct evbuffer *in = bufferevent_get_input(x->uc->bev);
	if (evbuffer_get_length(in))
		return exchange_read(x, &(struct xsrc){ .buf = in });
	return XR_OK;
}

static const struct upconn_direct up_direct = { .ready = up_direct_ready, .data = up_direct_data };

/* ---- response parser hooks (respparse.h): the meter's, then ours ---- */

/* The hooks' `arg` is the request's meter. */
static struct exchange *meter_request(void *meter)
{
	return (struct exchange *)((char *)meter - offsetof(struct exchange, meter));
}

static void on_resp_head(void *arg, const struct respparse *rp)
{
	struct exchange *x = meter_request(arg);
	CHECK_OBJ(x, EXCHANGE_MAGIC);

	/* the framer's bound: the proxy's generation now (a reload applies it) */
	x->meter.max_event_size = xcfg(x)->max_event_size;
	if (!x->shadow)			 /* a shadow's owner labelled it when it began */
		exchange_meter_label(x); /* routed: the series may resolve from here on */
	meter_head(&x->meter, rp);
	x->idle_from = x->meter.now;
	if (!x->shadow) /* a 5xx counts towards ejection; any other answer ends the streak */
		upstream_outlier_note(x->up, rp->status < 500, x->meter.now);
	exchange_set_state(x, XS_STREAMING);
}

static void on_resp_body(void *arg, const char *at, size_t len)
{
	struct exchange *x = meter_request(arg);
	CHECK_OBJ(x, EXCHANGE_MAGIC);

	meter_body(&x->meter, at, len);
	x->body_seen = true;
}

static void on_resp_body_v(void *arg, const struct framer_slice *v, size_t n)
{
	struct exchange *x = meter_request(arg);
	CHECK_OBJ(x, EXCHANGE_MAGIC);

	meter_body_v(&x->meter, v, n);
	x->body_seen = true;
}

static void on_resp_complete(void *arg, bool keep_alive)
{
	struct exchange *x = meter_request(arg);
	CHECK_OBJ(x, EXCHANGE_MAGIC);

	meter_complete(&x->meter);
	/* The head went to the client as the upstream wrote it: a response
	 * that its close delimits, or that says the connection ends with it,
	 * ends the client's connection too (the client waits for that close).
	 * So does any answer to an HTTP/1.0 client: tokentap never adds the
	 * `Connection: keep-alive` that such a client needs to keep going, and
	 * asks the upstream to close besides (exchange_head_write). The owner
	 * reads resp_close when the response is done. */
	if (!keep_alive || x->http10)
		x->resp_close = true;
	exchange_note_result(x, true, x->meter.now);
	/* resp.done is set: the read path gives the upstream back, DONE, before
	 * the last bytes go to the client (request_release_upstream) */
}

static const struct respparse_hooks resp_hooks = {
	.head = on_resp_head,
	.body = on_resp_body,
	.body_v = on_resp_body_v,
	.complete = on_resp_complete,
};

int exchange_init(struct exchange *x, const struct exchange_env *env, const struct exchange_hooks *hooks, void *owner,
		  struct req_record *rec, const struct reqhead *head, struct router *rt, uint64_t log_id, bool shadow)
{
	OBJ_MAGIC_SET(x, EXCHANGE_MAGIC);
	x->env = env;
	x->hooks = hooks;
	x->owner = owner;
	x->rec = rec;
	x->head = head;
	x->rt = rt;
	x->log_id = log_id;
	x->shadow = shadow;
	x->corked = !shadow; /* a primary is made inside its owner's parse pass */
	if (!x->pending)     /* else kept from the owner's last request (exchange_recycle) */
		x->pending = evbuffer_new();
	if (!x->timer.ev)
		x->timer.ev = evtimer_new(env->base, on_exchange_timer, x);
	if (!x->pending || !x->timer.ev)
		return -1;
	respparse_init(&x->resp, &resp_hooks, &x->meter);
	meter_init(&x->meter, &env->meter, rec, &x->resp, xcfg(x)->max_event_size, shadow);
	return 0;
}

void exchange_free(struct exchange *x)
{
	if (x->pending || x->timer.ev)
		exchange_release(x, false);
	meter_free(&x->meter);
	if (x->pending)
		evbuffer_free(x->pending);
	if (x->replay)
		evbuffer_free(x->replay);
	if (x->replay_spare)
		evbuffer_free(x->replay_spare);
	if (x->timer.ev)
		event_free(x->timer.ev);
	if (x->deadline)
		event_free(x->deadline);
	x->pending = x->replay = x->replay_spare = NULL;
	x->timer = (struct loop_deadline){ 0 };
	x->deadline = NULL;
	OBJ_MAGIC_CLEAR(x);
}

void exchange_recycle(struct exchange *x)
{
	if (x->pending || x->timer.ev)
		exchange_release(x, false);
	meter_free(&x->meter);
	if (x->pending)
		evbuffer_drain(x->pending, evbuffer_get_length(x->pending));
	replay_drop(x);
	/* the timer's event may stay armed: it finds nothing due, or the next
	 * request's deadline, and its argument (x) stays this memory */
	loop_deadline_clear(&x->timer);
	if (x->deadline)
		evtimer_del(x->deadline);
}

void exchange_meter_label(struct exchange *x)
{
	meter_label(&x->meter, x->route ? x->route->name : NULL, x->up ? x->up->name : NULL, x->cold, x->load);
}
